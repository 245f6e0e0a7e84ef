"""A reused trial process gives bitwise what fresh processes give: each trial resets the global state
another trial could leave behind (threads, default dtype, every random generator)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch
import yaml

from augtune.config import from_dict, to_dict
from augtune.trainables.ray_trainable import TrialFolder, isolate_trial, run_loop

ROOT = Path(__file__).resolve().parents[1]


def trial_cfg(augment: str, seed: int) -> dict:
    return {
        "dataset": {"name": "digits", "as_vectors": True, "max_train": 128, "max_test": 64},
        "model": {
            "backbone": "mlp",
            "hidden_dim": 16,
            "num_layers": 2,
            "embed_dim": 8,
            "proj_hidden_dim": 8,
            "proj_dim": 4,
            "pred_hidden_dim": 8,
        },
        "method": {"base": "byol", "augment": [augment]},
        "train": {"epochs": 2, "batch_size": 32, "seed": seed, "num_threads": 1},
        "eval": {
            "every": 1,
            "epoch_metrics": ["knn"],
            "metrics": ["knn"],
            "references": False,
            "figures": [],
        },
    }


class _NoCheckpoint:
    @staticmethod
    def from_directory(path):
        return None


def _trial_in_this_process(cfg: dict, folder: Path) -> dict:
    c = from_dict(cfg)
    isolate_trial(c)
    run_loop(c, rank=0, world_size=1, get_checkpoint=lambda: None, report=lambda *a, **k: None,
             Checkpoint=_NoCheckpoint, folder=TrialFolder(str(folder.parent), folder.name))
    return json.loads((folder / "record.json").read_text())


def test_two_trials_in_one_process_equal_fresh_processes(tmp_path, monkeypatch):
    import ray

    monkeypatch.setattr(
        ray, "get_runtime_context", lambda: type("C", (), {"get_node_id": lambda self: "n"})()
    )
    torch.set_num_threads(2)
    torch.set_default_dtype(torch.float64)  # what a careless earlier trial might leave behind
    torch.manual_seed(999)
    try:
        first = tmp_path / "first"
        first.mkdir()
        _trial_in_this_process(trial_cfg("pinda", 1), first)
        second = tmp_path / "second"
        second.mkdir()
        reused = _trial_in_this_process(trial_cfg("nrcc", 2), second)
    finally:
        torch.set_default_dtype(torch.float32)
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(to_dict(from_dict(trial_cfg("nrcc", 2)))))
    fresh = subprocess.run(
        [sys.executable, "-m", "augtune.cli", "train", str(config), "--out", str(tmp_path / "f")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert fresh.returncode == 0, fresh.stderr[-2000:]
    alone = json.loads((tmp_path / "f" / "record.json").read_text())
    assert reused["final"] == alone["final"]
    assert [e["loss"] for e in reused["epochs"]] == [e["loss"] for e in alone["epochs"]]
