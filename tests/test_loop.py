"""The training loop: exact continuation from checkpoints, phases, extra optimisers, failures."""
from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from augtune.config import from_dict
from augtune.data import load_dataset
from augtune.methods import AUGMENTATIONS, Augmentation, OptimizerSpec
from augtune.trainables.loop import NonFiniteLoss, Trainer, lr_factor
from augtune.trainables.run import train_run


def digits_cfg(**sections):
    data = {
        "dataset": {"name": "digits", "max_train": 256, "max_test": 128},
        "model": {"backbone": "cnn", "width": 4, "proj_hidden_dim": 16, "proj_dim": 8, "pred_hidden_dim": 16},
        "method": {"queue_size": 128},
        "train": {"epochs": 3, "batch_size": 64, "lr": 1e-3, "warmup_epochs": 1},
        "eval": {"every": 1, "epoch_metrics": ["knn"], "metrics": ["knn"], "references": False},
    }
    for k, v in sections.items():
        data.setdefault(k, {}).update(v)
    return from_dict(data)


@pytest.fixture(scope="module")
def digits():
    return load_dataset(digits_cfg().dataset)


def weights(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in trainer.method.state_dict().items()}


@pytest.mark.parametrize("base", ["simclr", "byol", "moco", "simsiam"])
def test_stop_and_continue_from_checkpoint_is_bitwise_identical(tmp_path, digits, base):
    cfg = digits_cfg(method={"base": base}, train={"optimizer": "sgd", "lr": 0.05} if base == "simsiam" else {})
    straight = Trainer(cfg, digits)
    straight.fit()

    first = Trainer(cfg, digits)
    first.fit(tmp_path / "ckpt.pt", stop_after=2)
    torch.manual_seed(12345)  # the process's RNG moves on; the checkpoint must restore it
    second = Trainer(cfg, digits)
    second.load_checkpoint(tmp_path / "ckpt.pt")
    assert second.epoch == 2
    second.fit(tmp_path / "ckpt.pt")

    a, b = weights(straight), weights(second)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert [h["loss"] for h in straight.history] == [h["loss"] for h in second.history]


def test_lr_schedule_warms_up_then_decays():
    f = [lr_factor(s, 100, 10, 0.0, "cosine") for s in range(100)]
    assert f[0] == pytest.approx(0.1) and f[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(f[10:], f[11:]))
    assert lr_factor(100, 100, 10, 0.1, "cosine") == pytest.approx(0.1)
    assert lr_factor(50, 100, 0, 0.0, "constant") == 1.0


class TwoPhaseToy(Augmentation):
    """A test-only augmentation: its own network trained by its own optimiser in phase B only."""

    name = "toy"
    encoder_phases = ("A",)

    def __init__(self, cfg, data):
        super().__init__(cfg, data)
        self.net = nn.Linear(4, 1)
        self.phase_log: list[str] = []

    def default_phases(self) -> str:
        return "A:1,B:1,A:1"

    def transform(self, batch, method, info):
        self.phase_log.append(info.phase)
        return batch

    def phase_loss(self, batch, method, info):
        if info.phase != "B":
            return None
        return {"toy": self.net(torch.ones(2, 4)).pow(2).mean()}

    def optimizer_specs(self):
        return [OptimizerSpec("toy", list(self.net.parameters()), lr=0.1, kind="sgd", phases=("B",))]


def test_phases_switch_optimisers_and_losses(monkeypatch, digits):
    monkeypatch.setitem(AUGMENTATIONS, "toy", TwoPhaseToy)
    cfg = digits_cfg(method={"augment": ["toy"]})
    trainer = Trainer(cfg, digits)
    toy = trainer.method.augments[0]
    enc0 = [p.clone() for p in trainer.method.objective.encoder.parameters()]
    net0 = toy.net.weight.clone()

    trainer.fit(stop_after=1)  # phase A: the encoder moves, the toy network does not
    assert torch.equal(toy.net.weight, net0)
    enc1 = [p.clone() for p in trainer.method.objective.encoder.parameters()]
    assert any(not torch.equal(a, b) for a, b in zip(enc0, enc1))

    trainer.fit(stop_after=2)  # phase B: the reverse
    assert not torch.equal(toy.net.weight, net0)
    assert all(torch.equal(a, b) for a, b in zip(enc1, trainer.method.objective.encoder.parameters()))
    assert [h["phase"] for h in trainer.history] == ["A", "B"]
    assert "loss_toy" in trainer.history[1]
    assert set(toy.phase_log) == {"A", "B"}


def test_unknown_phase_name_is_refused(monkeypatch, digits):
    monkeypatch.setitem(AUGMENTATIONS, "toy", TwoPhaseToy)
    with pytest.raises(ValueError, match=r"train.phases: .*\['C'\]"):
        Trainer(digits_cfg(method={"augment": ["toy"]}, train={"phases": "A:1,C:1"}), digits)


def test_nan_loss_stops_the_run_and_the_record_says_why(tmp_path, digits):
    cfg = digits_cfg(train={"lr": 1e30, "optimizer": "sgd", "warmup_epochs": 0})
    with pytest.raises(NonFiniteLoss, match=r"at epoch \d+, step \d+"):
        train_run(cfg, digits, tmp_path / "run", log=lambda s: None)
    record = json.loads((tmp_path / "run" / "record.json").read_text())
    assert record["status"] == "failed" and "epoch" in record["error"]


def test_record_holds_provenance_and_per_epoch_metrics(tmp_path, digits):
    cfg = digits_cfg(eval={"references": True, "metrics": ["knn", "kmeans"]})
    lines: list[str] = []
    record = train_run(cfg, digits, tmp_path / "run", log=lines.append)
    assert record["status"] == "completed" and record["method"] == "simclr" and record["dataset"] == "digits"
    assert record["config"]["train"]["epochs"] == 3 and record["seed"] == 0
    assert record["versions"]["torch"].split("+")[0] == torch.__version__.split("+")[0]
    assert "git_revision" in record and record["versions"]["python"]
    assert [e["epoch"] for e in record["epochs"]] == [1, 2, 3]
    assert all("knn_acc" in e and "epoch_time_s" in e and "samples_per_s" in e for e in record["epochs"])
    assert set(record["final"]) == {"knn_acc", "kmeans_acc", "kmeans_nmi", "kmeans_ari"}
    assert set(record["references"]) == {"raw", "random-init"}
    assert (tmp_path / "run" / "config.yaml").is_file() and (tmp_path / "run" / "checkpoint.pt").is_file()
    assert len(lines) == 3 and lines[0].startswith("epoch 1/3")


def test_checkpoint_loads_with_weights_only(tmp_path, digits):
    trainer = Trainer(digits_cfg(method={"base": "moco"}), digits)
    trainer.fit(tmp_path / "c.pt", stop_after=1)
    state = torch.load(tmp_path / "c.pt", weights_only=True)
    assert {"method", "optimizers", "rng_cpu", "epoch", "history"} <= set(state)
    assert "objective.queue" in state["method"]  # MoCo's queue travels with the weights
