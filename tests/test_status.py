"""`augtune status` on hand-made experiment folders, without Ray: the metric Tune selects on (the last
value reported, not the best of progress.csv) and trials the scheduler stopped early."""
from __future__ import annotations

import json
from pathlib import Path

import yaml

from augtune.cli import main
from augtune.records import REPEAT_DIR, SEARCH_FILE
from augtune.search.status import last_value, read_trials


def trial(trial_id: str, status: str, params: dict, epochs: list[dict], record_status: str | None,
          error: str | None = None) -> dict:
    return {"id": trial_id, "status": status, "params": params, "epochs": epochs, "record": record_status,
            "error": error}


def hold_lock(exp: Path, pid: int | None = None) -> None:
    """The lock a driver holds while it runs the experiment (`augtune.search.experiment.Lock`): this
    process's by default, so that the experiment reads as running."""
    import os
    import socket
    import time

    from augtune.search.experiment import LOCK_FILE

    (exp / LOCK_FILE).write_text(json.dumps({"pid": os.getpid() if pid is None else pid,
                                             "host": socket.gethostname(), "started": time.time()}))


def write_experiment(exp: Path, trials: list[dict], metric: str = "knn_acc", mode: str = "max",
                     running: bool = True) -> Path:
    """An experiment folder as Tune and augtune leave it: the search file, Tune's state JSON (each trial a
    JSON document and a runtime JSON, both as strings, with Tune's `metric_analysis`), per trial its
    progress.csv and augtune's record; `running`: a driver (this process) holds its lock."""
    exp.mkdir(parents=True)
    if running:
        hold_lock(exp)
    search = {"metric": metric, "mode": mode, "repeat_best": {"top": 0, "seeds": [1], "per": None}}
    (exp / SEARCH_FILE).write_text(yaml.safe_dump({"config": {"search": search}, "base": {}, "name": exp.name,
                                                   "storage": str(exp.parent)}))
    data = []
    for t in trials:
        folder = f"tune_trial_{t['id']}"
        (exp / folder).mkdir()
        analysis: dict = {}
        for step, result in enumerate(t["epochs"], start=1):  # Tune's _TrainingRunMetadata.update_metric
            for k, v in result.items():
                a = analysis.setdefault(k, {"max": v, "min": v, "avg": v, "last": v})
                a.update(max=max(a["max"], v), min=min(a["min"], v), last=v,
                         avg=a["avg"] + (v - a["avg"]) / step)
        last = dict(t["epochs"][-1]) if t["epochs"] else {}
        doc = {"trial_id": t["id"], "status": t["status"], "relative_logdir": folder, "config": t["params"]}
        runtime = {"last_result": last, "metric_analysis": analysis, "num_failures": 0}
        data.append([json.dumps(doc), json.dumps(runtime)])
        keys = sorted({k for r in t["epochs"] for k in r})
        lines = [",".join(keys)] + [",".join(str(r.get(k, "")) for k in keys) for r in t["epochs"]]
        (exp / folder / "progress.csv").write_text("\n".join(lines) + "\n")
        if t["record"]:
            record = {"status": t["record"], "error": t["error"]}
            (exp / folder / "record.json").write_text(json.dumps(record))
        if t["error"] and t["status"] == "ERROR":
            trace = f"Traceback (most recent call last):\n  File \"x.py\"\n{t['error']}\n"
            (exp / folder / "error.txt").write_text(trace)
    (exp / "experiment_state-2026-01-01_00-00-00.json").write_text(json.dumps({"trial_data": data}))
    return exp


TRIALS = [
    # peaked at epoch 2 and fell back: Tune selects on 0.70, where it ended; progress.csv's best is 0.90
    trial("a_00000", "TERMINATED", {"train.lr": 0.1},
          [{"epoch": 1, "knn_acc": 0.5}, {"epoch": 2, "knn_acc": 0.9}, {"epoch": 3, "knn_acc": 0.7}],
          "completed"),
    # ASHA stopped it after epoch 1: TERMINATED to Tune, `stopped` in its record
    trial("a_00001", "TERMINATED", {"train.lr": 0.01}, [{"epoch": 1, "knn_acc": 0.4}], "stopped"),
    # its last epoch did not evaluate the metric: the last value reported is still the one Tune keeps
    trial("a_00002", "TERMINATED", {"train.lr": 0.001},
          [{"epoch": 1, "knn_acc": 0.6}, {"epoch": 2, "loss": 1.0}], "completed"),
    trial("a_00003", "ERROR", {"train.lr": 1.0}, [{"epoch": 1, "knn_acc": 0.1}], "failed",
          "NonFiniteLoss: loss became nan at epoch 2"),
    trial("a_00004", "RUNNING", {"train.lr": 0.5}, [], "running"),
]


def rows(out: str) -> dict[str, list[str]]:
    return {line.split()[0]: line.split() for line in out.splitlines() if line.startswith("  a_")}


def test_status_shows_the_last_value_tune_selects_on_and_marks_trials_stopped_early(tmp_path, capsys):
    exp = write_experiment(tmp_path / "exp", TRIALS)
    assert main(["status", str(exp)]) == 0
    out = capsys.readouterr().out
    assert f"search {exp}: 1 error, 1 running, 3 terminated (1 stopped early by the scheduler)" in out
    assert "last knn_acc" in out
    r = rows(out)
    assert r["a_00000"][1:4] == ["TERMINATED", "3", "0.7000"]  # not progress.csv's best, 0.9
    assert r["a_00001"][1:4] == ["STOPPED", "1", "0.4000"]
    assert r["a_00002"][1:4] == ["TERMINATED", "2", "0.6000"]
    assert r["a_00003"][1] == "ERROR" and "NonFiniteLoss: loss became nan" in " ".join(r["a_00003"])
    assert r["a_00004"][1:4] == ["RUNNING", "0", "-"]


def test_min_mode_and_the_repeat_runs_of_the_same_tune_run_read_the_same_way(tmp_path, capsys):
    """The repeat runs of a search's best are trials of its Tune run; their records are in `repeat_best/`."""
    exp = write_experiment(tmp_path / "exp", [
        trial("b_00000", "TERMINATED", {"train.lr": 0.1},
              [{"epoch": 1, "loss": 2.0}, {"epoch": 2, "loss": 3.0}], "completed"),
        trial("c_00000", "ERROR", {"_repeat": {"train.lr": 0.1, "train.seed": 1}},
              [{"epoch": 1, "loss": 1.5}], None)], metric="loss", mode="min")
    (exp / REPEAT_DIR / "tune_trial_c_00000").mkdir(parents=True)
    (exp / REPEAT_DIR / "tune_trial_c_00000" / "record.json").write_text(
        json.dumps({"status": "failed", "error": "NonFiniteLoss: loss became nan at epoch 2"}))
    assert main(["status", str(exp)]) == 0
    out = capsys.readouterr().out
    assert f"search {exp}: 1 terminated\n" in out
    assert f"repeat_best {exp}/{REPEAT_DIR}: 1 error" in out
    lines = {ln.split()[0]: ln.split() for ln in out.splitlines() if ln.startswith("  ") and "_0" in ln}
    assert lines["b_00000"][3] == "3.0000"  # the last loss, not the minimum (2.0)
    assert lines["c_00000"][3:5] == ["1.5000", "train.lr=0.1"]  # a repeat run shows its own parameters
    assert "NonFiniteLoss: loss became nan" in out  # from its record, in the repeat's folder


def test_an_augtune_0_2_search_whose_repeat_was_a_tune_run_of_its_own_still_shows(tmp_path, capsys):
    exp = write_experiment(tmp_path / "exp", [
        trial("b_00000", "TERMINATED", {"train.lr": 0.1}, [{"epoch": 1, "knn_acc": 0.5}], "completed")])
    write_experiment(exp / REPEAT_DIR, [
        trial("c_00000", "TERMINATED", {"_repeat": {"train.lr": 0.1, "train.seed": 1}},
              [{"epoch": 1, "knn_acc": 0.6}], "completed")])
    assert main(["status", str(exp)]) == 0
    out = capsys.readouterr().out
    assert f"search {exp}: 1 terminated" in out and f"repeat_best {exp}/{REPEAT_DIR}: 1 terminated" in out


def test_last_value_reads_tunes_metric_analysis_then_the_last_result():
    assert last_value({"metric_analysis": {"knn_acc": {"max": 0.9, "last": 0.7}}}, "knn_acc") == 0.7
    assert last_value({"last_result": {"knn_acc": 0.3}}, "knn_acc") == 0.3  # an older state without analysis
    assert last_value({"last_result": {"knn_acc": True}}, "knn_acc") is None
    assert last_value({}, "knn_acc") is None


def test_read_trials_of_a_folder_without_tune_state_is_empty(tmp_path):
    assert read_trials(tmp_path, "knn_acc") == []


def test_a_compare_shows_its_entrants_trials_and_an_entrant_folder_its_own(tmp_path, capsys):
    """A compare's entrants search in one Tune run (`search/`); each trial's record is in its entrant's
    folder. `status` of the compare shows every trial with its entrant (the stopped one from its record);
    `status` of an entrant folder, its own trials; `resume` of an entrant folder points to the compare."""
    from augtune.records import COMPARE_FILE

    exp = tmp_path / "cmp"
    write_experiment(exp / "search", [
        trial("s1", "TERMINATED", {"_entrant": "simclr", "train.lr": 0.1}, [{"epoch": 2, "knn_acc": 0.8}],
              None),
        trial("s2", "TERMINATED", {"_entrant": "simclr+pinda", "pinda.mu": "zero"},
              [{"epoch": 1, "knn_acc": 0.6}], None),
        trial("r1", "TERMINATED", {"_entrant": "simclr+pinda", "_repeat": {
            "method.base": "simclr", "method.augment": ["pinda"], "pinda.mu": "zero", "train.seed": 1}},
              [{"epoch": 2, "knn_acc": 0.7}], None),
    ])
    (exp / "repeat" / "tune_trial_r1").mkdir(parents=True)  # a repeat run's record: in the repeat's folder
    (exp / "repeat" / "tune_trial_r1" / "record.json").write_text(json.dumps({"status": "completed"}))
    (exp / "search" / SEARCH_FILE).unlink()  # a compare's search run has no search file of its own
    for name, folder, status in (("simclr", "tune_trial_s1", "completed"), ("simclr+pinda", "tune_trial_s2",
                                                                               "stopped")):
        (exp / name / folder).mkdir(parents=True)
        (exp / name / folder / "record.json").write_text(json.dumps({"status": status}))
        (exp / name / SEARCH_FILE).write_text("config: {}\n")
    (exp / COMPARE_FILE).write_text(yaml.safe_dump({"config": {"compare": {"metrics": ["knn_acc"]}},
                                                    "entrants": ["simclr", "simclr+pinda"]}))
    assert main(["status", str(exp)]) == 0
    out = capsys.readouterr().out
    assert f"search {exp.resolve()}/search: 2 terminated (1 stopped early by the scheduler)" in out
    rows = [line.split() for line in out.splitlines() if line.startswith("  s")]
    assert [r[:3] for r in rows] == [["s1", "simclr", "TERMINATED"], ["s2", "simclr+pinda", "STOPPED"]]
    assert f"repeat {exp.resolve()}/repeat: 1 terminated" in out
    (repeat,) = [line.split() for line in out.splitlines() if line.startswith("  r1")]
    assert repeat[1:5] == ["simclr+pinda", "TERMINATED", "2", "0.7000"]
    assert "_entrant" not in out and "_repeat" not in out
    assert main(["status", str(exp / "simclr+pinda")]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.startswith("  s")]
    assert [r[:2] for r in rows] == [["s2", "simclr+pinda"]]
    assert main(["resume", str(exp / "simclr")]) == 2
    assert f"continue it with: augtune resume {exp}" in capsys.readouterr().err


def test_status_loads_neither_torch_nor_ray(tmp_path):
    """`augtune status` reads files: it is quick on a laptop with a copied folder (0.7 s here; it took
    seconds while the trial-parameter names came from the trainables, which import torch)."""
    import subprocess
    import sys

    exp = write_experiment(tmp_path / "exp", TRIALS)
    code = ("import sys; from augtune.cli import main; assert main(['status', sys.argv[1]]) == 0; "
            "sys.exit(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'ray')) != [])")
    res = subprocess.run([sys.executable, "-c", code, str(exp)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]


def _dead_pid() -> int:
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_trials_left_running_by_a_driver_that_is_gone_show_as_interrupted(tmp_path, capsys):
    """After Ctrl-C, Tune's state still says RUNNING: with no driver holding the experiment's lock
    (none, or one left by a dead process) those trials are INTERRUPTED, with the command that
    continues them; a live driver's (this process's) or another host's keep Tune's RUNNING."""
    import socket

    from augtune.search.experiment import LOCK_FILE

    exp = write_experiment(tmp_path / "exp", TRIALS, running=False)
    for lock in (None, _dead_pid()):
        if lock is not None:
            hold_lock(exp, pid=lock)
        assert main(["status", str(exp)]) == 0
        out = capsys.readouterr().out
        assert f"search {exp}: 1 error, 1 interrupted, 3 terminated" in out
        assert rows(out)["a_00004"][1] == "INTERRUPTED"
        assert out.rstrip().endswith(f"continue them with: augtune resume {exp}")
    hold_lock(exp)  # this process: a driver that is alive
    assert main(["status", str(exp)]) == 0
    out = capsys.readouterr().out
    assert rows(out)["a_00004"][1] == "RUNNING" and "INTERRUPTED" not in out
    (exp / LOCK_FILE).write_text(json.dumps({"pid": 1, "host": socket.gethostname() + "-other"}))
    assert main(["status", str(exp)]) == 0  # another machine's driver: only it knows
    assert rows(capsys.readouterr().out)["a_00004"][1] == "RUNNING"


def test_a_state_file_cut_short_is_one_line_naming_it(tmp_path, capsys):
    """A full disk left Tune's state file cut short: one line naming the file and what is wrong,
    exit 2 (it said "Unterminated string starting at: line 1 column 2897" and named no file)."""
    exp = write_experiment(tmp_path / "exp", TRIALS)
    state = next(exp.glob("experiment_state-*.json"))
    state.write_text(state.read_text()[:300])
    assert main(["status", str(exp)]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and f"{state}: not valid JSON: Unterminated string" in err[0], err
    assert "cut short" in err[0]
    state.write_text(json.dumps({"trial_data": [["{not json", "{}"]]}))
    assert main(["status", str(exp)]) == 2
    assert f"{state}: trial 1 of trial_data cannot be read" in capsys.readouterr().err
