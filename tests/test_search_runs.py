"""Searches that lose nothing and never report a wrong answer, run for real (a local Ray per test):
a relative data path, a quiet console, Optuna's study on disk, Ctrl-C and resume, a search whose
every trial fails, and a folder already in use."""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "augtune.cli"]

TINY = {
    # relative: trials run in folders of their own
    "dataset": {"name": "arrays", "path": "data/features.csv"},
    "model": {"backbone": "mlp", "hidden_dim": 32, "num_layers": 2, "embed_dim": 16, "proj_hidden_dim": 16,
              "proj_dim": 8},
    "train": {"epochs": 4, "batch_size": 32, "num_threads": 1},
    "eval": {"metrics": ["knn"], "references": True},
    "search": {"space": {"train.lr": "loguniform(1e-4, 1e-2)", "method.base": "choice([simclr, byol])"},
               "num_samples": 4, "scheduler": "asha", "repeat_best": {"top": 1, "seeds": [1, 2]}},
}


def _csv(folder: Path) -> None:
    """A user's CSV of features: 3 classes of 12-d Gaussian blobs, 240 rows."""
    rng = np.random.default_rng(0)
    y = np.repeat([0, 1, 2], 80)
    x = rng.normal(size=(240, 12)) + 2.0 * np.eye(3, 12)[y]
    (folder / "data").mkdir()
    lines = [",".join([f"f{i}" for i in range(12)] + ["label"])]
    lines += [",".join([f"{v:.5f}" for v in row] + [str(c)]) for row, c in zip(x, y)]
    (folder / "data" / "features.csv").write_text("\n".join(lines) + "\n")


def _config(folder: Path, **changes) -> Path:
    data = json.loads(json.dumps(TINY))
    for section, values in changes.items():
        data.setdefault(section, {}).update(values)
    _csv(folder)
    path = folder / "c.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _run(args: list[str], cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout)


@pytest.mark.ray
@pytest.mark.slow
def test_search_with_a_relative_path_a_quiet_console_and_its_study_on_disk(tmp_path):
    config = _config(tmp_path)
    run = _run(["search", config.name, "--storage", "res", "--name", "exp"], tmp_path)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    lines = run.stdout.splitlines()
    assert len(lines) <= 60, len(lines)
    assert not [line for line in lines + run.stderr.splitlines() if re.search(r"warn|traceback", line, re.I)]
    assert "\x1b" not in run.stdout  # no colour or cursor codes when the output is not a terminal
    assert run.stderr.strip() == ""
    assert any(line.startswith("search: 4/4 done") for line in lines)
    exp = tmp_path / "res" / "exp"
    records = [json.loads(p.read_text()) for p in exp.glob("*/record.json")]
    assert len(records) == 4 and all(r["status"] in ("completed", "stopped") for r in records)
    assert all(Path(r["config"]["dataset"]["path"]).is_absolute() for r in records)
    assert (exp / "augtune.log").is_file()  # Ray's own messages are there

    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    study = optuna.load_study(
        study_name="augtune", storage=JournalStorage(JournalFileBackend(str(exp / "optuna.journal")))
    )
    assert len(study.trials) == 4
    assert {"train.lr", "method.base"} <= set(study.trials[0].params)


@pytest.mark.ray
@pytest.mark.slow
def test_ctrl_c_stops_cleanly_and_resume_finishes_before_repeating(tmp_path):
    # enough epochs that the first trial still trains when Ctrl-C comes (a tenth of a second after its
    # first report); the resumed search trains all four and the repeat, one at a time
    config = _config(tmp_path, train={"epochs": 40, "checkpoint_every": 10},
                     search={"num_samples": 4, "scheduler": "none", "max_concurrent": 1})
    proc = subprocess.Popen([*CLI, "search", str(config), "--storage", "res", "--name", "exp"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    exp = tmp_path / "res" / "exp"
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None and not any(exp.glob("*/progress.csv")):
        time.sleep(0.2)  # the first trial has reported: it is training, three more wait
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C reaches the whole foreground group, as in a terminal
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, out[-2000:] + err[-2000:]
    assert f"augtune resume {exp}" in err
    assert not (exp / "repeat_best").exists()  # no repeat of a partial search's "best"

    resumed = _run(["resume", str(exp)], tmp_path, timeout=900)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    records = [json.loads(p.read_text()) for p in exp.glob("*/record.json")]
    assert len(records) == 4 and all(r["status"] == "completed" for r in records)
    best = max(r["final"]["knn_acc"] for r in records)  # k-NN on a small split ties often: any of the best
    tied = {r["params"]["train.lr"] for r in records if r["final"]["knn_acc"] == best}
    repeats = [json.loads(p.read_text()) for p in (exp / "repeat_best").glob("*/record.json")]
    assert len(repeats) == 2
    assert len({r["params"]["train.lr"] for r in repeats}) == 1 and repeats[0]["params"]["train.lr"] in tied
    # the resumed search continued the same Optuna study on disk: four trials told, none twice
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    storage = JournalStorage(JournalFileBackend(str(exp / "optuna.journal")))
    study = optuna.load_study(study_name="augtune", storage=storage)
    assert len(study.trials) == 4 and all(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials)
    told = sorted(t.params["train.lr"] for t in study.trials)
    assert told == sorted(r["params"]["train.lr"] for r in records)


@pytest.mark.ray
@pytest.mark.slow
def test_ctrl_c_in_a_grid_search_is_an_interruption_not_a_finish(tmp_path):
    """A grid creates every trial up front, and Tune's clean-up after Ctrl-C marks the running and pending
    ones TERMINATED: augtune still says interrupted (exit 130), counts none of them done, prints no table."""
    config = _config(tmp_path, train={"epochs": 150, "checkpoint_every": 10},
                     search={"algorithm": "grid", "space": {"train.lr": "grid([0.001, 0.002, 0.003])"},
                             "num_samples": 1, "scheduler": "none", "max_concurrent": 1})
    proc = subprocess.Popen([*CLI, "search", str(config), "--storage", "res", "--name", "exp"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    exp = tmp_path / "res" / "exp"
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None and not any(exp.glob("*/progress.csv")):
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, out[-2000:] + err[-2000:]
    assert f"augtune resume {exp}" in err and "| simclr" not in out
    assert not [line for line in out.splitlines() if line.startswith("search: 3/3 done")], out
    assert not (exp / "repeat_best").exists()


@pytest.mark.ray
@pytest.mark.slow
def test_a_search_whose_every_trial_fails_exits_1_with_the_first_reason(tmp_path, shared_ray):
    # a temperature below float32's range makes 1/tau infinite: every trial's loss is NaN at its first
    # step (a batch larger than the data, which failed every trial before, is refused when planned now)
    config = _config(tmp_path, train={"temperature": 1.0e-45},
                     search={"num_samples": 2, "max_failures": 0,
                             "space": {"train.lr": "loguniform(1e-4, 1e-2)"}})
    run = _run(["search", str(config), "--storage", "res", "--name", "exp", "--address", shared_ray],
               tmp_path)
    assert run.returncode == 1, run.stdout[-2000:] + run.stderr[-2000:]
    err = [line for line in run.stderr.splitlines() if line.strip()]
    assert len(err) == 1 and "every trial" in err[0] and "loss became" in err[0], err


def test_a_folder_in_use_is_refused_before_ray_starts(tmp_path):
    config = _config(tmp_path)
    exp = tmp_path / "res" / "exp"
    exp.mkdir(parents=True)
    (exp / ".augtune.lock").write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname()}))
    from augtune.search import plan_config, run_search
    from augtune.config import ConfigError, load_config

    cfg = load_config(config, [f"dataset.path={tmp_path / 'data' / 'features.csv'}"])
    plan = plan_config(cfg, storage=str(tmp_path / "res"), name="exp", check_name_free=False)
    with pytest.raises(ConfigError, match="another search is running there"):
        run_search(plan)
    import ray

    assert not ray.is_initialized()
    (exp / ".augtune.lock").write_text(json.dumps({"pid": 2**22 + 17, "host": socket.gethostname()}))
    from augtune.search.experiment import Lock

    with Lock(str(exp)):  # a dead owner's lock is taken over
        assert json.loads((exp / ".augtune.lock").read_text())["pid"] == os.getpid()
    assert not (exp / ".augtune.lock").exists()
