"""The method seam's contract, over every augmentation method x every base objective: it trains with a
finite loss, stopping and continuing is bitwise the uninterrupted run, and the record carries the
method's diagnostics. A new augmentation defined here, through the public seam alone, passes too."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from augtune.config import from_dict
from augtune.data import load_dataset
from augtune.methods import AUGMENTATIONS, BASES, Augmentation, Batch, StepInfo
from augtune.methods.base import Outputs
from augtune.trainables import train_run
from conftest import TINY_MLP


class FeatureDropout(Augmentation):
    """Views with a random fifth of the input features zeroed, and a small term pulling each anchor
    towards its own target: what a user's new method looks like (one class, the public seam)."""

    name = "feature_dropout"

    def transform(self, batch: Batch, method, info: StepInfo) -> Batch:
        keep = [(torch.rand_like(v) > 0.2).to(v.dtype) for v in batch.views]
        self.meter.add("kept", torch.stack([k.mean() for k in keep]).mean())
        return batch.with_views([v * k for v, k in zip(batch.views, keep)])

    def loss_terms(self, batch: Batch, out: Outputs, method, info: StepInfo) -> dict[str, torch.Tensor]:
        (a1, a2), (t1, t2) = out.anchors, out.targets
        align = 2 - F.cosine_similarity(a1, t2.detach()).mean() - F.cosine_similarity(a2, t1.detach()).mean()
        return {"feature_dropout": 0.1 * align}


def contract_cfg(base: str, augment: str):
    return from_dict(
        {
            "dataset": {"name": "digits", "as_vectors": True, "max_train": 128, "max_test": 64},
            "model": TINY_MLP,
            "method": {"base": base, "augment": [augment], "queue_size": 64},
            "train": {"epochs": 3, "batch_size": 32, "lr": 1e-3, "seed": 1, "num_threads": 1},
            "eval": {"every": 0, "epoch_metrics": [], "metrics": ["knn"], "references": False, "figures": []},
            "pinda": {"generator": "mlp"},
            "cocor": {"label_fraction": 0.2, "meta_batch": 16},
            "diffaug": {"schedule": "A:1,B:1,A:1", "steps": 20, "sample_steps": 5, "gen_hidden": 32},
        }
    )


@pytest.fixture(scope="module")
def vectors():
    return load_dataset(contract_cfg("simclr", "pinda").dataset)


@pytest.fixture(autouse=True)
def register_feature_dropout(monkeypatch):
    monkeypatch.setitem(AUGMENTATIONS, "feature_dropout", FeatureDropout)


AUGMENTS = sorted(AUGMENTATIONS) + ["feature_dropout"]


@pytest.mark.parametrize("base", sorted(BASES))
@pytest.mark.parametrize("augment", AUGMENTS)
def test_every_augmentation_on_every_base_trains_continues_bitwise_and_reports(
    tmp_path, vectors, base, augment
):
    cfg = contract_cfg(base, augment)
    quiet = dict(log=lambda s: None)
    straight = train_run(cfg, vectors, tmp_path / "straight", **quiet)
    assert straight["status"] == "completed"
    assert all(math.isfinite(e["loss"]) for e in straight["epochs"])

    train_run(cfg, vectors, tmp_path / "halves", stop_after=1, **quiet)
    torch.manual_seed(12345)  # the process's RNG moves on; the checkpoint must restore it
    resumed = train_run(cfg, vectors, tmp_path / "halves", resume=True, **quiet)
    a = torch.load(tmp_path / "straight" / "checkpoint.pt", weights_only=True)["method"]
    b = torch.load(tmp_path / "halves" / "checkpoint.pt", weights_only=True)["method"]
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a), [k for k in a if not torch.equal(a[k], b[k])]
    assert [e["loss"] for e in straight["epochs"]] == [e["loss"] for e in resumed["epochs"]]
    assert straight["final"] == resumed["final"]

    # the method's diagnostics are in every epoch's entry and in the final metrics
    own = {k for k in straight["final"] if k.startswith(f"{augment}_")}
    if augment in ("pinda", "nrcc", "cocor", "diffaug", "feature_dropout"):
        assert own, f"{augment} reports no diagnostics"
    for k in own:
        assert k in straight["epochs"][-1] and math.isfinite(straight["final"][k])


def test_nrcc_reports_how_much_of_the_hard_negatives_move_the_gradient_made(tmp_path, vectors):
    cfg = contract_cfg("byol", "nrcc")
    share = train_run(cfg, vectors, tmp_path / "run", log=lambda s: None)["final"]["nrcc_grad_share"]
    assert 0 < share < 1
    # eq. 18 as printed: one step, no gradient
    literal = from_dict({**_dict(cfg), "nrcc": {"order": "paper"}})
    assert (
        train_run(literal, vectors, tmp_path / "paper", log=lambda s: None)["final"]["nrcc_grad_share"] == 0
    )


def _dict(cfg) -> dict:
    from augtune.config import to_dict

    return to_dict(cfg)
