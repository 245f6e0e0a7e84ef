"""`search.loggers`: Ray Tune's own TensorBoard, W&B and MLflow callbacks, runs named by method and phase;
a logger whose package is missing is refused before Ray starts. W&B runs offline (its files under the
experiment) and MLflow writes a local store: no network."""
from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from augtune.cli import main
from augtune.config import ConfigError, load_config
from augtune.records import REPEAT_DIR
from augtune.search.resume import tune_id
from conftest import TINY_CNN

ROOT = Path(__file__).resolve().parents[1]

TINY = {
    "dataset": {"name": "digits", "max_train": 256, "max_test": 128},
    "model": TINY_CNN,
    "train": {"epochs": 2, "batch_size": 64},
    "eval": {"metrics": ["knn"], "references": False},
}


def write(tmp_path: Path, search: dict) -> Path:
    path = tmp_path / "search.yaml"
    path.write_text(yaml.safe_dump({**TINY, "search": search}))
    return path


def test_loggers_are_validated_naming_the_key():
    assert load_config(None, []).search.loggers == ("tensorboard",)  # Tune's own default
    assert load_config(None, ["search.loggers=[]"]).search.loggers == ()
    with pytest.raises(ConfigError, match=r"search.loggers\[1\]: expected one of 'tensorboard', 'wandb'"):
        load_config(None, ["search.loggers=[wandb, neptune]"])


@pytest.mark.parametrize("logger,extra", [("wandb", "augtune[wandb]"), ("mlflow", "augtune[mlflow]")])
def test_a_logger_whose_package_is_missing_is_refused_before_ray(tmp_path, capsys, monkeypatch, logger,
                                                                   extra):
    import ray

    monkeypatch.setitem(sys.modules, logger, None)  # as if not installed: find_spec and import both fail
    config = write(tmp_path, {"space": {"train.lr": "choice([0.01, 0.1])"}, "num_samples": 1,
                              "loggers": ["tensorboard", logger]})
    assert main(["search", str(config), "--storage", str(tmp_path / "s"), "--name", "exp"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"augtune: error: search.loggers: {logger} needs the {logger} package; install it with "
                   f"pip install '{extra}'"]
    assert not ray.is_initialized() and not (tmp_path / "s").exists()


def test_trials_are_named_by_entrant_and_phase():
    from augtune.search.loggers.labels import trial_label

    cfg = load_config(None, ["method.base=byol"])
    assert trial_label({"method.augment": ["pinda"], "train.lr": 0.1}, cfg, "a_00001") == (
        "byol+pinda", "search", "byol+pinda search (a_00001)")
    assert trial_label({"method.base": "simclr", "train.lr": 0.1}, cfg, "a_00002")[0] == "simclr"
    repeat = {"_repeat": {"method.base": "simclr", "method.augment": "nrcc", "train.seed": 2}}
    assert trial_label(repeat, cfg, "b_00000") == (
        "simclr+nrcc", "repeat", "simclr+nrcc repeat seed=2 (b_00000)")


def test_tune_gets_only_the_loggers_asked_for(monkeypatch):
    from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback, TBXLoggerCallback

    from augtune.search.loggers import logger_callbacks

    monkeypatch.delenv("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", raising=False)
    kinds = [type(c) for c in logger_callbacks(load_config(None, []), "/tmp/s", "exp")]
    assert kinds == [CSVLoggerCallback, JsonLoggerCallback, TBXLoggerCallback]
    none = logger_callbacks(load_config(None, ["search.loggers=[]"]), "/tmp/s", "exp")
    assert [type(c) for c in none] == [CSVLoggerCallback, JsonLoggerCallback]
    assert os.environ["TUNE_DISABLE_AUTO_CALLBACK_LOGGERS"] == "1"  # Tune adds no TensorBoard of its own


def read_scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    """Scalars of the TensorBoard event files in `folder`, read with tensorboardX's protobufs (TFRecord
    framing: length, its CRC, the Event, its CRC)."""
    from tensorboardX.proto.event_pb2 import Event

    out: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(folder.glob("events.out.tfevents*")):
        data, pos = path.read_bytes(), 0
        while pos + 12 <= len(data):
            (length,) = struct.unpack("<Q", data[pos:pos + 8])
            event = Event.FromString(data[pos + 12:pos + 12 + length])
            pos += 12 + length + 4
            for value in event.summary.value:
                out.setdefault(value.tag, []).append((event.step, value.simple_value))
    return out


def search(tmp_path: Path, config: Path, env: dict) -> Path:
    run = subprocess.run([sys.executable, "-m", "augtune.cli", "search", str(config), "--storage",
                          str(tmp_path / "s"), "--name", "exp"], cwd=ROOT, capture_output=True, text=True,
                         timeout=900, env=env)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return tmp_path / "s" / "exp"


def trial_dirs(exp: Path) -> list[Path]:
    return sorted(p for p in exp.iterdir() if p.is_dir() and p.name.startswith("tune_trial"))


def installed(name: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except ValueError:  # in sys.modules as None: as if not installed
        return False


@pytest.fixture(scope="module")
def logged_search(tmp_path_factory) -> Path:
    """The one search of the logger tests, each reading its own logger's files of it: a grid of two bases,
    then a repeat of each one's best, logged to TensorBoard and, where installed, to W&B (offline, its
    files under the experiment) and MLflow (a local store)."""
    tmp = tmp_path_factory.mktemp("loggers")
    loggers = ["tensorboard", *(name for name in ("wandb", "mlflow") if installed(name))]
    config = write(tmp, {"space": {"method.base": "grid([simclr, byol])"}, "algorithm": "grid",
                         "num_samples": 1, "max_concurrent": 2, "loggers": loggers,
                         "repeat_best": {"top": 1, "per": "method.base", "seeds": [3]}})
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "MLFLOW_"))}
    env.update(WANDB_MODE="offline", WANDB_SILENT="true")
    return search(tmp, config, env)


@pytest.mark.ray
@pytest.mark.slow
def test_tensorboard_event_files_hold_what_each_trial_reported(logged_search):
    exp = logged_search
    dirs = trial_dirs(exp)  # Tune's folders of its trials: the search's two, then the repeat's two runs
    assert len(dirs) == 4 and len([d for d in dirs if (d / "record.json").is_file()]) == 2
    for d in dirs:
        where = d if (d / "record.json").is_file() else exp / REPEAT_DIR / d.name  # a repeat run's record
        record = json.loads((where / "record.json").read_text())
        scalars = read_scalars(d)
        # Tune's TBXLoggerCallback: `ray/tune/<metric>` at step = training_iteration (the epoch here), each
        # metric where it was reported (the search metric where it is read: here the last epoch)
        for metric in ("loss", "knn_acc"):
            reported = [(e["epoch"], e[metric]) for e in record["epochs"] if metric in e]
            assert [s for s, _ in scalars[f"ray/tune/{metric}"]] == [epoch for epoch, _ in reported]
            assert [v for _, v in scalars[f"ray/tune/{metric}"]] == pytest.approx([v for _, v in reported])
        assert [s for s, _ in scalars["ray/tune/loss"]] == [1, 2]


def wandb_runs(exp: Path) -> list[dict]:
    """The run records of the offline W&B runs under `exp/wandb`, read with W&B's own reader
    (`wandb leet inspect --json`), each with the metrics it logged."""
    runs = []
    for file in sorted(exp.glob("wandb/offline-run-*/run-*.wandb")):
        wandb = [sys.executable, "-m", "wandb"]
        out = subprocess.run([*wandb, "leet", "inspect", "--json", str(file)], capture_output=True, text=True,
                             timeout=300)
        if out.returncode != 0:  # older W&B: the same reader under `beta`
            out = subprocess.run([*wandb, "beta", "leet", "inspect", "--json", str(file)],
                                 capture_output=True, text=True, timeout=300, check=True)
        records = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
        run = next(r["run"] for r in records if "run" in r)
        run["history"] = [r["history"]["item"] for r in records if "history" in r]
        runs.append(run)
    return runs


@pytest.mark.ray
@pytest.mark.slow
def test_wandb_offline_and_mlflow_runs_are_named_by_method_and_phase(logged_search):
    pytest.importorskip("wandb", reason="wandb is not installed (pip install 'augtune[wandb]')")
    pytest.importorskip("mlflow", reason="mlflow is not installed (pip install 'augtune[mlflow]')")
    from mlflow.tracking import MlflowClient

    exp = logged_search  # logged to TensorBoard, W&B (offline) and MLflow
    # Tune's trials, search and repeat (one Tune run), by their ids: a grid trial's is Tune's `a1b2c_00001`,
    # a repeat run's the 8-digit hexadecimal id Tune gives the trials a search algorithm makes
    expected = set()
    for path in [*exp.glob("*/record.json"), *(exp / REPEAT_DIR).glob("*/record.json")]:
        phase = "repeat seed=3" if path.parent.parent.name == REPEAT_DIR else "search"
        method = json.loads(path.read_text())["method"]
        expected.add(f"{method} {phase} ({tune_id(path.parent.name)})")
    assert len(expected) == 4 and len(list((exp / REPEAT_DIR).glob("*/record.json"))) == 2

    runs = wandb_runs(exp)  # offline: every run's files are under the experiment, for `wandb sync` later
    assert {r["display_name"] for r in runs} == expected
    for r in runs:
        entrant, phase = r["display_name"].split()[:2]
        assert (r["run_group"], r["job_type"], r["tags"]) == ("exp", phase, [entrant, phase])
        assert [h["knn_acc"] for h in r["history"] if "knn_acc" in h], r["display_name"]

    client = MlflowClient(f"sqlite:///{exp / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("exp")
    mruns = client.search_runs([experiment.experiment_id])
    assert {r.info.run_name for r in mruns} == expected
    for r in mruns:
        entrant, phase = r.info.run_name.split()[:2]
        assert (r.data.tags["augtune.entrant"], r.data.tags["augtune.phase"]) == (entrant, phase)
        assert r.info.status == "FINISHED"
        assert [m.step for m in client.get_metric_history(r.info.run_id, "loss")] == [1, 2]
        assert client.get_metric_history(r.info.run_id, "knn_acc")
    assert all(read_scalars(d)["ray/tune/knn_acc"] for d in trial_dirs(exp))  # TensorBoard as well
