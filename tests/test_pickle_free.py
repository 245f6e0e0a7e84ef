"""No command loads a pickle from an experiment folder (issue 40: a resume rebuilds from the records).

A malicious pickle is planted at every state-file name Tune or augtune ever wrote there, and every command
that reads a folder is run on it: `status`, `export`, `importance`, `plot`, the API's `load(...)`, and
`resume` (up to where it would start Ray here; `test_a_real_search_resumes_past_planted_pickles` runs it to
its end on Ray). Nothing runs: the pickle's file is never written."""
from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
import yaml

from augtune.cli import main
from augtune.config import load_config, to_dict

STAMP = "2026-01-01_00-00-00"
# every name Tune (2.x) or augtune (up to 0.4) saved state under, pickled or holding pickles
STATE_NAMES = ("tuner.pkl", f"basic-variant-state-{STAMP}.json", f"search_gen_state-{STAMP}.json",
               f"searcher-state-{STAMP}.pkl", f"callback-states-{STAMP}.pkl",
               f"entrants-search-state-{STAMP}.pkl", f"search-then-repeat-state-{STAMP}.pkl")
TRIAL_NAMES = ("params.pkl", "error.pkl")  # in a trial's folder


class Pwn:
    """A pickle that runs code when loaded: it writes a file."""

    def __init__(self, target: Path):
        self.target = str(target)

    def __reduce__(self):
        return (exec, (f"open({self.target!r}, 'w').write('PWNED')",))


class Started(Exception):
    """A resume got past everything it reads: it would start Ray now."""


@pytest.fixture(autouse=True)
def loggers_left_alone(monkeypatch):
    """`resume` in-process would hand Ray's loggers and Python's warnings to the experiment's log file
    for the rest of the session."""
    import sys

    import augtune.search.progress  # noqa: F401

    monkeypatch.setattr(sys.modules["augtune.search.progress"], "quiet_ray", lambda *args, **kwargs: None)


def plant(exp: Path, pwned: Path) -> list[Path]:
    """A malicious pickle at every state-file name in `exp` and in each of its trial folders, and in
    Tune's experiment state's pickled field; the files planted."""
    evil = pickle.dumps(Pwn(pwned))
    planted = []
    for name in STATE_NAMES:
        (exp / name).write_bytes(evil)
        planted.append(exp / name)
    for trial in (p for p in exp.iterdir() if p.is_dir()):
        for name in TRIAL_NAMES:
            (trial / name).write_bytes(evil)
            planted.append(trial / name)
    state = exp / f"experiment_state-{STAMP}.json"
    state.write_text(json.dumps({"trial_data": [], "runner_data": {"_type": "CLOUDPICKLE_FALLBACK",
                                                                   "value": evil.hex()}}))
    return [*planted, state]


def _search_folder(tmp_path: Path) -> Path:
    """A search's folder as a run leaves it: its plan and two trials' records (one completed, one that was
    running when its driver died)."""
    exp = tmp_path / "res" / "exp"
    exp.mkdir(parents=True)
    cfg = load_config(None, ["search.space=simclr", "dataset.as_vectors=true"])
    plan = {"config": to_dict(cfg), "base": to_dict(cfg), "name": "exp", "storage": str(exp.parent)}
    (exp / "augtune_search.yaml").write_text(yaml.safe_dump(plan))
    for name, status in (("tune_trial_a", "completed"), ("tune_trial_b", "running")):
        (exp / name).mkdir()
        (exp / name / "record.json").write_text(json.dumps({
            "format": "augtune.record/1", "status": status, "method": "simclr", "dataset": "digits",
            "seed": 0, "phase": "search", "params": {"train.lr": 0.1}, "config": to_dict(cfg),
            "epochs": [{"epoch": 1, "knn_acc": 0.5}],
            "final": {"knn_acc": 0.5} if status == "completed" else {},
        }))
    return exp


def test_no_command_unpickles_anything_planted_in_a_search_folder(tmp_path, monkeypatch, capsys):
    from augtune.search import launch

    pwned = tmp_path / "PWNED"
    exp = _search_folder(tmp_path)
    plant(exp, pwned)

    def connect(*args, **kwargs):
        raise Started

    monkeypatch.setattr(launch, "connect", connect)
    main(["status", str(exp)])
    main(["export", str(exp), "--out", str(tmp_path / "t.csv")])
    main(["importance", str(exp)])
    main(["plot", "search", str(exp), "--out", str(tmp_path / "plots")])
    import augtune

    loaded = augtune.load(exp)
    loaded.trials()
    with pytest.raises(Started):  # the records read, the checkpoints looked for, the plan loaded
        augtune.resume(exp)
    capsys.readouterr()
    assert not pwned.exists()


@pytest.mark.ray
@pytest.mark.slow
def test_a_real_search_resumes_past_planted_pickles(tmp_path, shared_ray, capsys):
    """A real search, one of its trials unfinished as a killed driver leaves it, with a malicious pickle at
    every state-file name: `augtune resume` finishes it from the records and runs none of them."""
    import subprocess
    import sys

    from conftest import TINY_CNN

    root = Path(__file__).resolve().parents[1]
    (tmp_path / "s.yaml").write_text(yaml.safe_dump({
        "dataset": {"name": "digits", "max_train": 128, "max_test": 64}, "model": TINY_CNN,
        "train": {"epochs": 2, "batch_size": 32}, "eval": {"metrics": ["knn"], "references": False},
        "search": {"space": {"train.lr": "grid([0.001, 0.002])"}, "algorithm": "grid", "num_samples": 1},
    }))
    cli = [sys.executable, "-m", "augtune.cli"]
    run = subprocess.run([*cli, "search", "s.yaml", "--storage", "res", "--name", "exp", "--address",
                          shared_ray], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    exp = tmp_path / "res" / "exp"
    trial = sorted(p for p in exp.iterdir() if p.is_dir() and (p / "record.json").exists())[0]
    record = json.loads((trial / "record.json").read_text())
    record.update(status="running", epochs=record["epochs"][:1], final={})  # as a killed driver leaves it
    (trial / "record.json").write_text(json.dumps(record))
    (exp / "augtune_finished.json").unlink()
    pwned = tmp_path / "PWNED"
    plant(exp, pwned)
    resumed = subprocess.run([*cli, "resume", str(exp), "--address", shared_ray], cwd=root,
                             capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-3000:]
    assert not pwned.exists()
    after = json.loads((trial / "record.json").read_text())
    assert after["status"] == "completed" and [e["epoch"] for e in after["epochs"]] == [1, 2]
    assert main(["status", str(exp)]) == 0
    assert main(["export", str(exp), "--out", str(tmp_path / "t.csv")]) == 0
    capsys.readouterr()
    assert not pwned.exists()
