"""`augtune status` on hand-made experiment folders, without Ray: a row per trial record (Tune's state is
never read), the last value reported of the search metric (what Tune selects on, not the best of the
epochs), trials the scheduler stopped early, and trials no driver runs any more."""
from __future__ import annotations

import json
from pathlib import Path

import yaml

from augtune.cli import main
from augtune.records import FORMAT, REPEAT_DIR, SEARCH_FILE


def trial(trial_id: str, params: dict, epochs: list[dict], status: str, error: str | None = None,
          **extra) -> dict:
    return {"id": trial_id, "params": params, "epochs": epochs, "status": status, "error": error, **extra}


def hold_lock(exp: Path, pid: int | None = None) -> None:
    """The lock a driver holds while it runs the experiment (`augtune.search.experiment.Lock`): this
    process's by default, so that the experiment reads as running."""
    import os
    import socket
    import time

    from augtune.search.experiment import LOCK_FILE

    (exp / LOCK_FILE).write_text(json.dumps({"pid": os.getpid() if pid is None else pid,
                                             "host": socket.gethostname(), "started": time.time()}))


def write_records(folder: Path, trials: list[dict]) -> None:
    """Each trial's folder as Tune names it (`tune_trial_<id>_<tag>_<time>`) with augtune's record in it,
    started in the order given."""
    for i, t in enumerate(trials):
        run = folder / f"tune_trial_{t['id']}_{i + 1}_lr=0.1_2026-01-01_00-00-0{i}"
        run.mkdir(parents=True)
        extra = {k: v for k, v in t.items() if k not in ("id", "params", "epochs", "status", "error")}
        record = {"format": FORMAT, "status": t["status"], "error": t["error"], "params": t["params"],
                  "epochs": t["epochs"], "started": f"2026-01-01T00:00:0{i}", "method": "simclr", **extra}
        (run / "record.json").write_text(json.dumps(record))


def write_experiment(exp: Path, trials: list[dict], metric: str = "knn_acc", mode: str = "max",
                     running: bool = True) -> Path:
    """A search's folder as augtune leaves it: its search file and a record per trial; `running`: a driver
    (this process) holds its lock."""
    exp.mkdir(parents=True)
    if running:
        hold_lock(exp)
    search = {"metric": metric, "mode": mode, "repeat_best": {"top": 0, "seeds": [1], "per": None}}
    (exp / SEARCH_FILE).write_text(yaml.safe_dump({"config": {"search": search}, "base": {}, "name": exp.name,
                                                   "storage": str(exp.parent)}))
    write_records(exp, trials)
    return exp


TRIALS = [
    # peaked at epoch 2 and fell back: Tune selects on 0.70, where it ended; the best epoch's is 0.90
    trial("a0000_00000", {"train.lr": 0.1},
          [{"epoch": 1, "knn_acc": 0.5}, {"epoch": 2, "knn_acc": 0.9}, {"epoch": 3, "knn_acc": 0.7}],
          "completed"),
    trial("a0000_00001", {"train.lr": 0.01}, [{"epoch": 1, "knn_acc": 0.4}], "stopped"),  # by ASHA
    # its last epoch did not evaluate the metric: the last value reported is still the one Tune keeps
    trial("a0000_00002", {"train.lr": 0.001},
          [{"epoch": 1, "knn_acc": 0.6}, {"epoch": 2, "loss": 1.0}], "completed"),
    trial("a0000_00003", {"train.lr": 1.0}, [{"epoch": 1, "knn_acc": 0.1}], "failed",
          "NonFiniteLoss: loss became nan at epoch 2"),
    trial("a0000_00004", {"train.lr": 0.5}, [], "running"),
]


def rows(out: str) -> dict[str, list[str]]:
    return {line.split()[0]: line.split() for line in out.splitlines() if line.startswith("  a0000_")}


def test_status_shows_the_last_value_tune_selects_on_and_marks_trials_stopped_early(tmp_path, capsys):
    exp = write_experiment(tmp_path / "exp", TRIALS)
    assert main(["status", str(exp)]) == 0
    out = capsys.readouterr().out
    assert f"search {exp}: 2 completed, 1 failed, 1 running, 1 stopped early by the scheduler" in out
    assert "last knn_acc" in out
    r = rows(out)
    assert list(r) == [f"a0000_0000{i}" for i in range(5)]  # in the order they started
    assert r["a0000_00000"][1:4] == ["completed", "3", "0.7000"]  # not the best epoch's, 0.9
    assert r["a0000_00001"][1:4] == ["stopped", "1", "0.4000"]
    assert r["a0000_00002"][1:4] == ["completed", "2", "0.6000"]
    assert r["a0000_00003"][1] == "failed" and "NonFiniteLoss: loss became nan" in " ".join(r["a0000_00003"])
    assert r["a0000_00004"][1:5] == ["running", "0", "-", "train.lr=0.5"]


def test_min_mode_and_the_repeat_runs_read_the_same_way(tmp_path, capsys):
    """The repeat runs of a search's best have their records in `repeat_best/`; a folder whose name is not
    Tune's is shown by its name, a record cut short as unreadable."""
    exp = write_experiment(tmp_path / "exp", [
        trial("b0000_00000", {"train.lr": 0.1}, [{"epoch": 1, "loss": 2.0}, {"epoch": 2, "loss": 3.0}],
              "completed")], metric="loss", mode="min")
    write_records(exp / REPEAT_DIR, [trial("c1d2e3f4", {"train.lr": 0.1, "train.seed": 1},
                                           [{"epoch": 1, "loss": 1.5}], "failed",
                                           "NonFiniteLoss: loss became nan at epoch 2")])
    (exp / REPEAT_DIR / "mine").mkdir()
    (exp / REPEAT_DIR / "mine" / "record.json").write_text('{"format": "augtune.rec')
    assert main(["status", str(exp)]) == 0
    out = capsys.readouterr().out
    assert f"search {exp}: 1 completed\n" in out
    assert f"repeat_best {exp}/{REPEAT_DIR}: 1 failed, 1 unreadable" in out
    lines = {ln.split()[0]: ln.split() for ln in out.splitlines()
             if ln.startswith("  ") and "epochs" not in ln}
    assert lines["b0000_00000"][3] == "3.0000"  # the last loss, not the minimum (2.0)
    assert lines["c1d2e3f4"][3:6] == ["1.5000", "train.lr=0.1", "train.seed=1"]  # its own parameters
    assert "NonFiniteLoss: loss became nan" in out
    assert lines["mine"][1] == "unreadable" and "record.json: not valid JSON" in out


def test_a_compare_shows_its_entrants_trials_and_an_entrant_folder_its_own(tmp_path, capsys):
    """A compare's trial records are in its entrants' folders, its repeat runs' in `repeat/`. `status` of
    the compare shows every trial with its entrant; `status` of an entrant folder, its own trials;
    `resume` of an entrant folder points to the compare."""
    from augtune.records import COMPARE_FILE

    exp = tmp_path / "cmp"
    write_records(exp / "simclr", [trial("5a5a5_00000", {"_entrant": "simclr", "train.lr": 0.1},
                                         [{"epoch": 1, "knn_acc": 0.8}], "completed", entrant="simclr")])
    write_records(exp / "simclr+pinda", [trial("5a5a5_00001", {"pinda.mu": "zero"},
                                               [{"epoch": 1, "knn_acc": 0.6}], "stopped",
                                               entrant="simclr+pinda")])
    write_records(exp / "repeat", [trial("9e9e9e9e", {"method.base": "simclr", "method.augment": ["pinda"],
                                                      "pinda.mu": "zero", "train.seed": 1},
                                         [{"epoch": 1, "loss": 3.0}, {"epoch": 2, "knn_acc": 0.7}],
                                         "completed", entrant="simclr+pinda")])
    (exp / "search").mkdir()  # the Tune run: only Tune's files, never read
    for name in ("simclr", "simclr+pinda"):
        (exp / name / SEARCH_FILE).write_text("config: {}\n")
    (exp / COMPARE_FILE).write_text(yaml.safe_dump({"config": {"compare": {"metrics": ["knn_acc"]}},
                                                    "entrants": ["simclr", "simclr+pinda"]}))
    hold_lock(exp)
    assert main(["status", str(exp)]) == 0
    out = capsys.readouterr().out
    assert f"search {exp.resolve()}: 1 completed, 1 stopped early by the scheduler" in out
    found = [line.split() for line in out.splitlines() if line.startswith("  5a5a5")]
    assert [r[:3] for r in found] == [["5a5a5_00000", "simclr", "completed"],
                                      ["5a5a5_00001", "simclr+pinda", "stopped"]]
    assert f"repeat {exp.resolve()}/repeat: 1 completed" in out
    (repeat,) = [line.split() for line in out.splitlines() if line.startswith("  9e9e9e9e")]
    assert repeat[1:6] == ["simclr+pinda", "completed", "2", "0.7000", "pinda.mu=zero"]
    assert "_entrant" not in out and "method.base" not in out
    assert main(["status", str(exp / "simclr+pinda")]) == 0
    out = capsys.readouterr().out
    assert [line.split()[:2] for line in out.splitlines() if line.startswith("  5a5a5")] == [
        ["5a5a5_00001", "simclr+pinda"]]
    assert "9e9e9e9e" in out  # its repeat run
    assert main(["resume", str(exp / "simclr")]) == 2
    assert f"continue it with: augtune resume {exp}" in capsys.readouterr().err


def test_status_counts_a_pbt_trials_exploits_from_its_record(tmp_path, capsys):
    pbt = {"search": {"scheduler": "pbt"}}
    exp = write_experiment(tmp_path / "exp", [
        trial("d0000_00000", {"train.lr": 0.1}, [{"epoch": 1, "knn_acc": 0.5}], "completed", config=pbt,
              exploits=3),
        trial("d0000_00001", {"train.lr": 0.2}, [{"epoch": 1, "knn_acc": 0.4}], "completed", config=pbt),
        trial("d0000_00002", {"train.lr": 0.3}, [{"epoch": 1, "knn_acc": 0.3}], "completed",
              config={"search": {"scheduler": "asha"}}, exploits=3)])
    assert main(["status", str(exp)]) == 0
    tails = [line.split("  ")[-1] for line in capsys.readouterr().out.splitlines() if "d0000_" in line]
    assert tails == ["[3 exploits] train.lr=0.1", "[0 exploits] train.lr=0.2", "train.lr=0.3"]


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
    """After Ctrl-C, the records of the trials that ran still say `running`: with no driver holding the
    experiment's lock (none, or one left by a dead process) those trials are `interrupted`, with the
    command that continues them; a live driver's (this process's) or another host's stay `running`."""
    import socket

    from augtune.search.experiment import LOCK_FILE

    exp = write_experiment(tmp_path / "exp", TRIALS, running=False)
    for lock in (None, _dead_pid()):
        if lock is not None:
            hold_lock(exp, pid=lock)
        assert main(["status", str(exp)]) == 0
        out = capsys.readouterr().out
        assert f"search {exp}: 2 completed, 1 failed, 1 interrupted, 1 stopped early" in out
        assert rows(out)["a0000_00004"][1] == "interrupted"
        assert out.rstrip().endswith(f"continue them with: augtune resume {exp}")
    hold_lock(exp)  # this process: a driver that is alive
    assert main(["status", str(exp)]) == 0
    out = capsys.readouterr().out
    assert rows(out)["a0000_00004"][1] == "running" and "interrupted" not in out
    (exp / LOCK_FILE).write_text(json.dumps({"pid": 1, "host": socket.gethostname() + "-other"}))
    assert main(["status", str(exp)]) == 0  # another machine's driver: only it knows
    assert rows(capsys.readouterr().out)["a0000_00004"][1] == "running"
    (exp / LOCK_FILE).write_text("[" * 100_000 + "]" * 100_000)  # no lock augtune wrote: nothing to tell
    assert main(["status", str(exp)]) == 0
    assert rows(capsys.readouterr().out)["a0000_00004"][1] == "running"
