"""One record for both runners: the same config run in this process (`augtune train`) and as a
one-worker Ray trial (`augtune search`) leaves the same record: keys, status, final metrics."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]

CONFIG = {
    # scored on the validation split, as a search's trials are: both runners train and score the same rows
    "dataset": {"name": "digits", "as_vectors": True, "max_train": 256, "max_test": 128,
                "evaluate_on": "val"},
    "model": {"backbone": "mlp", "hidden_dim": 32, "num_layers": 2, "embed_dim": 16, "proj_hidden_dim": 16,
              "proj_dim": 8},
    "method": {"base": "simclr", "augment": ["nrcc"]},
    "train": {"epochs": 2, "batch_size": 64, "seed": 3, "num_threads": 1},
    "eval": {"every": 1, "epoch_metrics": ["knn"], "metrics": ["knn", "kmeans"], "figures": []},
    "search": {"space": {"train.lr": "grid([0.001])"}, "algorithm": "grid", "num_samples": 1},
}

RUN_ONLY = {"started", "finished", "host", "nodes", "git_revision", "process",  # where and when, not what
            "params", "variant", "phase",  # what the search knew of the trial: its sampled parameters (now
            # and as made), search or repeat
            "trial"}  # its Tune folder's name (whose run a checkpoint PBT copies holds)


@pytest.mark.ray
@pytest.mark.slow
def test_in_process_run_and_ray_trial_leave_the_same_record(tmp_path, shared_ray):
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(CONFIG))
    cli = [sys.executable, "-m", "augtune.cli"]
    train = subprocess.run([*cli, "train", str(config), "--out", str(tmp_path / "run")], cwd=ROOT,
                           capture_output=True, text=True, timeout=300)
    assert train.returncode == 0, train.stderr[-2000:]
    search = subprocess.run(
        [*cli, "search", str(config), "--storage", str(tmp_path / "res"), "--name", "exp", "--address",
         shared_ray],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert search.returncode == 0, search.stdout[-2000:] + search.stderr[-2000:]
    local = json.loads((tmp_path / "run" / "record.json").read_text())
    (trial,) = [json.loads(p.read_text()) for p in (tmp_path / "res" / "exp").glob("*/record.json")]

    assert set(local) - RUN_ONLY == set(trial) - RUN_ONLY
    assert local["status"] == trial["status"] == "completed"
    assert local["final"].keys() == trial["final"].keys()
    assert "nrcc_cos_c_b" in local["final"] and "knn_acc" in local["final"]
    assert local["final"] == trial["final"]  # same seed, one thread: the same numbers
    assert [e["loss"] for e in local["epochs"]] == [e["loss"] for e in trial["epochs"]]
    # where the time went, in both: the trial also says what its set-up and its process's start took
    assert {"references", "train", "eval", "checkpoint"} <= set(local["seconds"]) <= set(trial["seconds"])
    assert trial["seconds"]["setup"] > 0 and trial["seconds"]["start"] > 0 and trial["seconds"]["train"] > 0
    assert set(trial["cpu_seconds"]) == set(trial["seconds"]) and 0 < trial["cpu_seconds"]["train"]
    assert local["max_rss_mb"] > 0 and trial["max_rss_mb"] > 0


@pytest.mark.ray
@pytest.mark.slow
def test_a_two_worker_ddp_trial_through_ray_train_leaves_the_same_record(tmp_path):
    """The path a GPU cluster takes: a TorchTrainer (Ray Train V2, two gloo workers) inside the Tune
    trial; rank 0 reports every epoch and the trial's folder gets the run's record."""
    cfg = {**CONFIG, "resources": {"num_workers": 2, "cpus_per_worker": 1}, "method": {"base": "simclr"}}
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(cfg))
    cli = [sys.executable, "-m", "augtune.cli"]
    local = subprocess.run([*cli, "train", str(config), "--out", str(tmp_path / "run"),
                            "--set", "resources.num_workers=1"], cwd=ROOT, capture_output=True, text=True,
                           timeout=300)
    assert local.returncode == 0, local.stderr[-2000:]
    search = subprocess.run([*cli, "search", str(config), "--storage", str(tmp_path / "res"), "--name",
                             "exp"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert search.returncode == 0, search.stdout[-2000:] + search.stderr[-2000:]
    local = json.loads((tmp_path / "run" / "record.json").read_text())
    (folder,) = [p.parent for p in (tmp_path / "res" / "exp").glob("*/record.json")]
    trial = json.loads((folder / "record.json").read_text())
    assert set(local) - RUN_ONLY == set(trial) - RUN_ONLY
    assert trial["status"] == "completed" and trial["config"]["resources"]["num_workers"] == 2
    assert local["final"].keys() == trial["final"].keys()
    assert [e["epoch"] for e in trial["epochs"]] == [1, 2]
    reported = [json.loads(line)["epoch"] for line in (folder / "result.json").read_text().splitlines()]
    assert reported == [1, 2]  # every epoch reached Tune, once
    # (the losses differ from one process's by ~1 %: each rank's BatchNorm sees its half of the batch)
    assert all(0 < e["loss"] < 20 for e in trial["epochs"]) and trial["final"]["knn_acc"] > 0.5


class _Checkpoint:
    """What run_loop reads of a Ray checkpoint: a folder."""

    def __init__(self, folder: Path):
        self.folder = folder

    def as_directory(self):
        import contextlib

        return contextlib.nullcontext(str(self.folder))


def test_a_trial_restored_from_its_last_checkpoint_completes_its_record(tmp_path, monkeypatch):
    """A driver killed after a trial's last checkpoint but before Tune copied its record left the record one
    epoch behind; the restored trial trains no epoch, so it must write its completed record at once."""
    import ray

    from augtune.config import from_dict
    from augtune.data import load_dataset
    from augtune.records import CHECKPOINT_FILE, RECORD_FILE
    from augtune.trainables import train_run
    from augtune.trainables.ray_trainable import TrialFolder, run_loop

    cfg = from_dict({k: v for k, v in CONFIG.items() if k != "search"})
    done = train_run(cfg, load_dataset(cfg.dataset), tmp_path / "ckpt", log=lambda s: None)
    assert done["status"] == "completed"
    folder = TrialFolder(str(tmp_path / "exp"), name="trial_0")
    stale = {**done, "status": "running", "final": {}, "epochs": done["epochs"][:1]}
    (folder.local / RECORD_FILE).write_text(json.dumps(stale))

    class Context:
        @staticmethod
        def get_node_id():
            return "node-b"

    monkeypatch.setattr(ray, "get_runtime_context", lambda: Context)
    reports = []
    run_loop(cfg, rank=0, world_size=1, get_checkpoint=lambda: _Checkpoint(tmp_path / "ckpt"),
             report=lambda *a, **k: reports.append(a), Checkpoint=None, folder=folder)
    record = json.loads((folder.local / RECORD_FILE).read_text())
    assert record["status"] == "completed" and record["final"] == done["final"]
    assert record["epochs"] == done["epochs"] and record["nodes"][-1] == "node-b"
    assert reports == []  # nothing trained, nothing reported twice
    assert (tmp_path / "ckpt" / CHECKPOINT_FILE).exists()


def test_a_trial_restored_mid_run_is_running_again_and_trains_on(tmp_path, monkeypatch):
    import ray

    from augtune.config import from_dict
    from augtune.data import load_dataset
    from augtune.records import RECORD_FILE
    from augtune.trainables import train_run
    from augtune.trainables.ray_trainable import TrialFolder, run_loop

    cfg = from_dict({k: v for k, v in CONFIG.items() if k != "search"})
    train_run(cfg, load_dataset(cfg.dataset), tmp_path / "ckpt", log=lambda s: None, stop_after=1)
    full = train_run(cfg, load_dataset(cfg.dataset), tmp_path / "full", log=lambda s: None)
    folder = TrialFolder(str(tmp_path / "exp"), name="trial_0")

    class Context:
        @staticmethod
        def get_node_id():
            return "node-b"

    monkeypatch.setattr(ray, "get_runtime_context", lambda: Context)
    reports = []
    run_loop(cfg, rank=0, world_size=1, get_checkpoint=lambda: _Checkpoint(tmp_path / "ckpt"),
             report=lambda metrics, **k: reports.append(metrics["epoch"]),
             Checkpoint=type("C", (), {"from_directory": staticmethod(lambda d: d)}), folder=folder)
    record = json.loads((folder.local / RECORD_FILE).read_text())
    assert reports == [2]  # only the epoch that was left
    assert record["status"] == "completed" and record["final"] == full["final"]


def test_a_trial_whose_folder_says_it_completed_is_not_trained_again_from_an_older_checkpoint(
        tmp_path, monkeypatch):
    """The record completes before the last epoch's report reaches Tune: a driver that died (or lost the
    store) between the two is restored with the trial at an older checkpoint. The trial then reports its
    last epoch again, from its folder's record, and trains and writes nothing."""
    import ray

    from augtune.config import from_dict
    from augtune.data import load_dataset
    from augtune.records import RECORD_FILE
    from augtune.trainables import train_run
    from augtune.trainables.loop import Trainer
    from augtune.trainables.ray_trainable import TrialFolder, finished_in_folder, run_loop

    cfg = from_dict({k: v for k, v in CONFIG.items() if k != "search"})
    train_run(cfg, load_dataset(cfg.dataset), tmp_path / "ckpt", log=lambda s: None, stop_after=1)
    full = train_run(cfg, load_dataset(cfg.dataset), tmp_path / "full", log=lambda s: None)
    folder = TrialFolder(str(tmp_path / "exp"), name="trial_0")
    (folder.local / RECORD_FILE).write_text(json.dumps({**full, "trial": "trial_0"}))
    before = (folder.local / RECORD_FILE).read_text()

    class Context:
        @staticmethod
        def get_node_id():
            return "node-b"

    monkeypatch.setattr(ray, "get_runtime_context", lambda: Context)
    monkeypatch.setattr(Trainer, "fit", lambda *a, **k: pytest.fail("trained again"))
    reports = []
    run_loop(cfg, rank=0, world_size=1, get_checkpoint=lambda: _Checkpoint(tmp_path / "ckpt"),
             report=lambda metrics, **k: reports.append((metrics, k)), Checkpoint=None, folder=folder)
    assert len(reports) == 1 and reports[0][1] == {}  # its last result, with no checkpoint
    assert reports[0][0]["epoch"] == 2 and reports[0][0]["knn_acc"] == full["epochs"][-1]["knn_acc"]
    assert (folder.local / RECORD_FILE).read_text() == before

    # a record of another trial (a PBT copy's donor) or of fewer epochs is not this trial's end
    for other in ({**full, "trial": "trial_9"}, {**full, "epochs": full["epochs"][:1]}):
        (folder.local / RECORD_FILE).write_text(json.dumps(other))
        assert finished_in_folder(folder, cfg) is None
