"""`augtune compare` for real, on digits with a tiny budget: the entrants' searches, one repeat
experiment, the verdict on the console and in `export`, the report, and what the plan refuses."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from augtune.config import ConfigError, load_config
from augtune.search.compare import Entrant, entrant_config, entrants

ROOT = Path(__file__).resolve().parents[1]


def test_entrants_follow_the_modality_and_the_subset():
    cfg = load_config(None)
    assert [e.label for e in entrants(cfg, "image")] == [
        "simclr",
        "simclr+pinda",
        "simclr+nrcc",
        "simclr+cocor",
        "simclr+diffaug",
    ]
    vec = [e.label for e in entrants(cfg, "vector")]
    assert vec[-3:] == ["simclr+random_noise", "simclr+simcl", "simclr+clae"]
    two = load_config(None, ["compare.methods=[base, nrcc]", "compare.bases=[byol, moco]"])
    assert [e.label for e in entrants(two, "image")] == ["byol", "byol+nrcc", "moco", "moco+nrcc"]
    with pytest.raises(ConfigError, match="compare.methods: clae applies to vector data; this data set"):
        entrants(load_config(None, ["compare.methods=[clae]"]), "image")


def test_every_entrant_searches_its_own_space_under_the_same_budget():
    cfg = load_config(None, ["compare.trials=5", "compare.seeds=2", "train.seed=10"])
    c = entrant_config(cfg, Entrant("byol", ("pinda",)))
    assert (c.method.base, c.method.augment, c.search.space) == ("byol", ("pinda",), "pinda")
    assert c.search.num_samples == 5 and c.search.algorithm == "optuna"
    assert {"method.base", "train.epochs", "train.batch_size"} <= set(c.search.hold)
    assert c.search.repeat_best.seeds == (11, 12)


def test_a_method_is_entered_once_per_scheduler_a_schedule_against_a_constant(tmp_path):
    cfg = load_config(None, ["compare.methods=[base, pinda]", "compare.scheduler=[asha, pbt]",
                             "compare.trials=3"])
    got = entrants(cfg, "vector")
    assert [e.label for e in got] == ["simclr", "simclr@pbt", "simclr+pinda", "simclr+pinda@pbt"]
    pbt = entrant_config(cfg, got[3])
    # TPE would credit a PBT trial's last score to its first values: the population is drawn at random
    assert (pbt.search.scheduler, pbt.search.algorithm, pbt.search.num_samples) == ("pbt", "random", 3)
    assert (entrant_config(cfg, got[2]).search.scheduler, entrant_config(cfg, got[2]).search.algorithm) == (
        "asha", "optuna")
    assert load_config(None, ["compare.scheduler=none"]).compare.scheduler == ("none",)  # one, as before
    # Tune keeps one number of checkpoints for the run: a PBT entrant's donors must outlive their copies
    from augtune.search.compare import plan_compare
    from augtune.search.tune_run import kept
    from augtune.search.schedulers import PBT_CHECKPOINTS

    vectors = load_config(None, ["compare.methods=[pinda]", "compare.scheduler=[asha, pbt]",
                                 "dataset.as_vectors=true", "train.epochs=4"])
    plan = plan_compare(vectors, "vector", storage=str(tmp_path), name="c")
    assert plan.labels == ("simclr+pinda", "simclr+pinda@pbt")
    assert kept(plan.plans[0].cfg, plan).search.keep_checkpoints == PBT_CHECKPOINTS
    plain = plan_compare(load_config(None, ["compare.methods=[pinda]", "dataset.as_vectors=true"]), "vector",
                         storage=str(tmp_path), name="d")
    assert kept(plain.plans[0].cfg, plain).search.keep_checkpoints == 1
    for bad, why in (("[asha, none]", "asha and none both search constants"),
                     ("[pbt, pbt]", "lists one twice"),
                     ("[]", "name at least one")):
        with pytest.raises(ConfigError, match=re.escape(f"compare.scheduler: {why}")):
            entrants(load_config(None, [f"compare.scheduler={bad}"]), "vector")


def test_a_pbt_entrants_finalists_are_schedules_and_two_schedules_are_two_configurations(tmp_path):
    """The repeat replays a PBT trial's schedule (donors' epochs included) from scratch; trials with the
    same values at the end but different schedules are different candidates."""
    from augtune.search.choosers import top_of

    def trial(name, lrs, knn, scheduler="pbt"):
        (tmp_path / name).mkdir()
        record = {"format": "augtune.record/1", "status": "completed",
                  "params": {"train.lr": lrs[-1], "pinda.mu": "zero"},
                  "config": {"search": {"scheduler": scheduler}},
                  "epochs": [{"epoch": i, "knn_acc": knn, "knobs": {"train.lr": lr}}
                             for i, lr in enumerate(lrs, 1)]}
        (tmp_path / name / "record.json").write_text(json.dumps(record))

    trial("a", [0.1, 0.1, 0.2, 0.2], 0.9)
    trial("b", [0.2, 0.2, 0.2, 0.2], 0.8)
    trial("c", [0.1, 0.1, 0.2, 0.2], 0.7)  # a's schedule again: one configuration
    top = top_of(tmp_path, "knn_acc", "max", 3, "simclr+pinda@pbt")
    assert top == [
        {"train.lr": 0.2, "pinda.mu": "zero",
         "schedule": [{"epoch": 1, "set": {"train.lr": 0.1}}, {"epoch": 3, "set": {"train.lr": 0.2}}]},
        {"train.lr": 0.2, "pinda.mu": "zero", "schedule": [{"epoch": 1, "set": {"train.lr": 0.2}}]},
    ]
    # a trial that copied b at b's last epoch: b's epochs and score, other values at the end (never
    # trained under): b's run again, not a second candidate
    trial("e", [0.2, 0.2, 0.2, 0.2], 0.8)
    record = json.loads((tmp_path / "e" / "record.json").read_text())
    (tmp_path / "e" / "record.json").write_text(json.dumps({**record, "params": {"train.lr": 0.24,
                                                                                 "pinda.mu": "zero"}}))
    assert top_of(tmp_path, "knn_acc", "max", 3, "simclr+pinda@pbt") == top
    assert len(top_of(tmp_path, "knn_acc", "max", 3)) == 2  # without a label too
    trial("d", [0.3, 0.3], 0.95, scheduler="asha")  # a constant's trial: its parameters alone
    assert top_of(tmp_path, "knn_acc", "max", 1, "simclr+pinda")[0] == {"train.lr": 0.3, "pinda.mu": "zero"}
    # what a repeat run of it trains: the schedule from epoch 1, on its own seed
    from augtune.config import from_dict, to_dict
    from augtune.trainables.ray_trainable import trial_config

    cfg = trial_config({**top[0], "train.seed": 7}, to_dict(from_dict({"train": {"epochs": 4}})))
    assert [(s.epoch, dict(s.set)) for s in cfg.schedule] == [(1, {"train.lr": 0.1}), (3, {"train.lr": 0.2})]


@pytest.mark.ray
@pytest.mark.slow
def test_a_real_compare_gives_its_verdict_and_report(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "dataset": {"name": "digits", "as_vectors": True, "max_train": 300, "max_test": 150},
                "model": {
                    "backbone": "mlp",
                    "hidden_dim": 32,
                    "num_layers": 2,
                    "embed_dim": 16,
                    "proj_hidden_dim": 16,
                    "proj_dim": 8,
                },
                "train": {"epochs": 3, "batch_size": 64, "num_threads": 1},
                "eval": {"metrics": ["knn", "kmeans"]},
                "compare": {
                    "methods": ["base", "nrcc", "random_noise"],
                    "trials": 2,
                    "seeds": 2,
                    "metrics": ["knn_acc", "kmeans_nmi"],
                },
            }
        )
    )
    run = subprocess.run([sys.executable, "-m", "augtune.cli", "compare", str(config), "--storage",
                          str(tmp_path / "res"), "--name", "cmp"], cwd=ROOT, capture_output=True, text=True,
                         timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    # the console a person reads: short, plain, no warning or traceback (Ray's own output is in the log)
    lines = run.stdout.splitlines() + run.stderr.splitlines()
    assert len(lines) <= 60, "\n".join(lines)
    assert not [line for line in lines if re.search(r"warn|traceback|error", line, re.I)], "\n".join(lines)
    assert "\x1b" not in run.stdout + run.stderr
    exp = tmp_path / "res" / "cmp"
    assert "| entrant | knn_acc | kmeans_nmi |" in run.stdout
    assert re.search(r"knn_acc: (\S+ is best|no entrant is separated)", run.stdout)
    assert "raw input" in run.stdout
    assert f"report: {exp / 'report.html'}" in run.stdout
    repeats = [json.loads(p.read_text()) for p in (exp / "repeat").glob("*/record.json")]
    assert len(repeats) == 6  # 3 entrants x 2 seeds, every record where it belongs
    # the methods' own figures: drawn for the first seed's run (the one the report shows), not for the rest
    assert [r["entrant"] for r in repeats if r["seed"] == 1 and r.get("figures")] == ["simclr+nrcc"]
    assert not [r for r in repeats if r["seed"] != 1 and r.get("figures")]
    # every entrant's search in one Tune run: its records in its own folder, its budget exactly, and
    # the trial processes shared by the entrants (two slots: at most two processes, not one set each)
    searched = {name: [json.loads(p.read_text()) for p in (exp / name).glob("*/record.json")]
                for name in ("simclr", "simclr+nrcc", "simclr+random_noise")}
    assert {name: len(rs) for name, rs in searched.items()} == {name: 2 for name in searched}
    assert all(r["entrant"] == name and "_entrant" not in r["params"] for name, rs in searched.items()
               for r in rs)
    assert len({r["process"] for rs in searched.values() for r in rs}) <= 2
    status = subprocess.run([sys.executable, "-m", "augtune.cli", "status", str(exp)], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert status.returncode == 0, status.stderr
    searched_line = next(line for line in status.stdout.splitlines() if line.startswith(f"search {exp}: "))
    assert sum(int(n) for n in re.findall(r"(\d+) (?:completed|stopped)", searched_line)) == 6, status.stdout
    assert "simclr+random_noise" in status.stdout
    page = (exp / "report.html").read_text()
    assert "<table>" in page and page.count("<img") >= 3
    export = subprocess.run([sys.executable, "-m", "augtune.cli", "export", str(exp), "--format", "latex"],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert export.returncode == 0 and export.stdout.startswith("% needs \\usepackage{booktabs}"), (
        export.stderr
    )
    # the Python API reads the same experiment: the verdict the CLI printed, the runs as a DataFrame
    import augtune

    loaded = augtune.load(exp)
    assert loaded.verdict().render("md", plainly=False) in run.stdout
    plainly = loaded.verdict().plainly()  # the answer in plain words, last, after the importances
    assert f"\n{plainly}\n\nreport: " in run.stdout
    assert run.stdout.index("which hyperparameters mattered") < run.stdout.index(plainly)
    numbers = loaded.table()  # the verdict's numbers, as `export --format csv` writes them
    best = loaded.verdict().winner("knn_acc") or loaded.verdict().best("knn_acc")
    line = numbers[(numbers["entrant"] == best.entrant) & (numbers["metric"] == "knn_acc")].iloc[0]
    assert (line["mean"], line["n"]) == (best.cells["knn_acc"].mean, 2)
    runs = loaded.runs(phase="repeat")
    assert set(runs["method"]) >= {"simclr", "simclr+nrcc", "simclr+random_noise"}
    imp = loaded.importance()  # a DataFrame; an entrant too few trials left unmeasured is in attrs
    assert len(loaded.records()) == 12 and set(imp["entrant"]) | set(imp.attrs["skipped"]) == set(searched)
    csv = subprocess.run([sys.executable, "-m", "augtune.cli", "export", str(exp), "--format", "csv"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert csv.returncode == 0 and csv.stdout.startswith("entrant,kind,metric,mean,std,n,"), csv.stderr
    # a finished compare resumed: its verdict again, from the records, without starting Ray
    again = subprocess.run([sys.executable, "-m", "augtune.cli", "resume", str(exp)], cwd=ROOT,
                           capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and "has finished" in again.stdout, again.stderr
    assert loaded.verdict().render("md", plainly=False) in again.stdout and "resuming" not in again.stdout
    assert f"\n{plainly}\n" in again.stdout


@pytest.mark.ray
@pytest.mark.slow
def test_a_compare_interrupted_in_its_search_resumes_every_entrant_once(tmp_path):
    """Ctrl-C while the entrants' searches run: exit 130 naming `augtune resume`, no repeat of a partial
    search; resumed, every entrant gets its budget of trials exactly, each trial in its study once."""
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({
        "dataset": {"name": "digits", "as_vectors": True, "max_train": 300, "max_test": 150},
        "model": {"backbone": "mlp", "hidden_dim": 32, "num_layers": 2, "embed_dim": 16,
                  "proj_hidden_dim": 16, "proj_dim": 8},
        "train": {"epochs": 60, "batch_size": 64, "num_threads": 1, "checkpoint_every": 5},
        "eval": {"metrics": ["knn"], "references": False},
        "compare": {"methods": ["base", "random_noise"], "trials": 2, "seeds": 1, "metrics": ["knn_acc"],
                    "scheduler": "none"},
    }))
    exp = tmp_path / "res" / "cmp"
    cli = [sys.executable, "-m", "augtune.cli"]
    proc = subprocess.Popen([*cli, "compare", str(config), "--storage", str(tmp_path / "res"), "--name",
                             "cmp"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None and not any(
        json.loads(p.read_text())["epochs"] for p in exp.glob("*/*/record.json")  # replaced whole, never torn
    ):
        time.sleep(0.2)  # a trial has trained an epoch (its own record says so at once): the searches are on
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C reaches the whole foreground group, as in a terminal
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, out[-2000:] + err[-2000:]
    assert f"augtune resume {exp}" in err
    assert not (exp / "repeat").exists()

    resumed = subprocess.run([*cli, "resume", str(exp)], cwd=ROOT, capture_output=True, text=True,
                             timeout=900)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    for name in ("simclr", "simclr+random_noise"):
        records = [json.loads(p.read_text()) for p in (exp / name).glob("*/record.json")]
        assert len(records) == 2 and all(r["status"] == "completed" for r in records), name
        assert all([e["epoch"] for e in r["epochs"]] == list(range(1, 61)) for r in records)
        journal = JournalStorage(JournalFileBackend(str(exp / name / "optuna.journal")))
        study = optuna.load_study(study_name="augtune", storage=journal)
        complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
        told = sorted(t.params["train.lr"] for t in complete)
        assert told == sorted(r["params"]["train.lr"] for r in records)
    assert len(list((exp / "repeat").glob("*/record.json"))) == 2  # 2 entrants x 1 seed


def test_only_the_first_seeds_repeat_run_draws_the_figures():
    from augtune.search.choosers import FirstSeedFigures

    drawn = []
    hook = FirstSeedFigures(lambda tr, run_dir, record, log: drawn.append(record["seed"]), seed=11)
    for seed in (11, 12, 13):
        hook(None, Path("."), {"seed": seed}, print)
    assert drawn == [11]


def test_the_repeat_starts_with_the_costliest_entrant(tmp_path):
    """Longest first: the runs left at the end are the short ones (a DiffAug run last would idle a slot)."""
    import json

    from ray import cloudpickle

    from augtune.search.choosers import BestOfEach, epoch_seconds, repeat_runs

    entrants = []
    for name, times, lr in (("cheap", [0.1, 0.2, 0.1], 0.1), ("dear", [3.0, 2.0], 0.2), ("unrun", [], 0.3)):
        (tmp_path / name / "t0").mkdir(parents=True)
        record = {"format": "augtune.record/1", "status": "completed", "params": {"train.lr": lr},
                  "epochs": [
            {"epoch": i + 1, "epoch_time_s": t, "knn_acc": 0.5} for i, t in enumerate(times)]}
        (tmp_path / name / "t0" / "record.json").write_text(json.dumps(record))
        entrants.append((name, str(tmp_path / name), "simclr", (name,)))
    assert epoch_seconds(tmp_path / "dear") == 2.5
    assert epoch_seconds(tmp_path / "cheap") == pytest.approx(0.4 / 3)
    assert epoch_seconds(tmp_path / "unrun") == 0.0 and epoch_seconds(tmp_path / "absent") == 0.0
    said = []
    runs = repeat_runs(entrants, "knn_acc", "max", (1, 2), said.append)
    shown = [(r["_entrant"], r["_repeat"]["method.augment"], r["_repeat"]["train.seed"],
              r["_repeat"]["train.lr"]) for r in runs]
    assert shown == [("dear", ["dear"], 1, 0.2), ("dear", ["dear"], 2, 0.2), ("cheap", ["cheap"], 1, 0.1),
                     ("cheap", ["cheap"], 2, 0.1)]
    assert said == ["unrun: no finished search trial; it is left out of the repeat"]
    # what Tune keeps of it: plain data, which unpickles (a Config's read-only mappings would not)
    choose = cloudpickle.loads(cloudpickle.dumps(BestOfEach(tuple(entrants), "knn_acc", "max", (1, 2))))
    assert choose([]) == (runs, True)  # a fixed repeat: every run at once, finished
