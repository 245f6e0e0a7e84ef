"""DDP over two CPU processes (gloo) trains exactly as one process on the same global batch.

Each base objective is trained twice on a tiny digits config: once in this process (world size 1)
and once by two spawned processes that each take half of every global batch. With `model.norm=none`
(BatchNorm statistics would be per rank) the two trajectories can only agree if gradients are
all-reduced, SimCLR's negatives are gathered across ranks and MoCo's queue receives every rank's
keys in rank order. Two negative controls (no gradient all-reduce; SimCLR without the gather of
negatives) show the comparison can fail.

Everything runs in float64. In float32 the two runs agree only to ~1e-5 relative in the gradients of
the last layers (the rows of a gradient cancel, so reduction-order rounding is magnified), and Adam
turns near-zero gradients' rounding into full-size steps: SimCLR's weights then differ by ~4e-5
after 8 steps, too close to any tolerance that would still catch a real bug. In float64 the same
comparison agrees to ~1e-14, so the tolerance below is tight and still has a wide margin.
"""
from __future__ import annotations

import contextlib
import copy
import datetime
import math
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from augtune.config import from_dict
from augtune.data import load_dataset
from augtune.methods.losses import nt_xent
from augtune.trainables.loop import Trainer

pytestmark = pytest.mark.slow

BASES = ["simclr", "byol", "moco", "simsiam"]
WORLD = 2
RTOL, ATOL = 1e-7, 1e-9  # weights, float64; float32 rounding alone would be ~1e-5 (see above)
LOSS_RTOL = 1e-6  # the loop sums epoch losses in float32: DDP's mean of rank means differs by an ulp
# The spawned runs: (name, base, what to break). One spawn does them all (start-up dominates).
RUNS = [(base, base, None) for base in BASES] + [("simclr-no-allreduce", "simclr", "allreduce"),
                                                  ("simclr-no-gather", "simclr", "gather")]
# Augmentations draw their own randomness per rank (PiNDA's slots, NRCC's seeds, DiffAug's replacements,
# CoCor's labelled batch), so they are not one big batch; but every update, their own included, is
# averaged over the ranks, so the ranks must stay in lockstep.
AUGMENTED = ["simclr+pinda", "byol+nrcc", "moco+cocor", "simclr+diffaug"]
RUNS += [(name, name, None) for name in AUGMENTED]
AUGMENT_SETTINGS = {
    "pinda": {"generator": "unet", "width": 4},
    "cocor": {"label_fraction": 0.1, "meta_batch": 16},
    "diffaug": {"schedule": "A:1,B:1", "steps": 20, "sample_steps": 5, "gen_width": 4, "gen_steps": 2},
}


def ddp_cfg(name: str):
    base, *augment = name.split("+")
    return from_dict({**{k: AUGMENT_SETTINGS.get(k, {}) for k in augment},
        "dataset": {"name": "digits", "max_train": 256, "max_test": 64},
        "model": {"backbone": "cnn", "width": 4, "norm": "none",
                  "proj_hidden_dim": 16, "proj_dim": 8, "pred_hidden_dim": 16},
        "method": {"base": base, "augment": augment, "queue_size": 128},
        "train": {"epochs": 2, "batch_size": 64, "lr": 1e-3, "device": "cpu", "precision": "fp32",
                  "num_threads": 1},
        "eval": {"every": 0, "metrics": ["knn"], "references": False},
    })


def float64(data):
    """`data` with float64 inputs (set after construction: DataSplit checks for float32)."""
    data = copy.copy(data)
    object.__setattr__(data, "x_train", data.x_train.double())
    object.__setattr__(data, "x_test", data.x_test.double())
    return data


def float32(data):
    data = copy.copy(data)
    object.__setattr__(data, "x_train", data.x_train.float())
    object.__setattr__(data, "x_test", data.x_test.float())
    return data


@contextlib.contextmanager
def default_float64():
    dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.set_default_dtype(dtype)


def make_trainer(base: str, data, **ranks) -> Trainer:
    """A float64 Trainer: weights and MoCo's queue are made float64; views follow the data's dtype.

    Only construction runs under the float64 default: evaluation (kNN) expects float32 defaults.
    """
    with default_float64():
        return Trainer(ddp_cfg(base), data, log=lambda s: None, **ranks)


def _worker(rank: int, init_file: str, out_dir: str, data, runs) -> None:
    """One DDP rank: trains every run in `runs` in turn and saves its weights and history.

    mp.spawn re-raises an exception here in the parent, with this process's traceback.
    """
    import torch.distributed as dist

    import augtune.methods.losses as losses
    import augtune.trainables.loop as loop

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=120))
    real_allreduce, real_gather, real_wrap = (
        loop.allreduce_gradients,
        losses.gather_with_grad,
        loop.Trainer._wrap_ddp,
    )
    try:
        for name, base, broken in runs:
            # All are looked up at call time (train_epoch, nt_xent, Trainer.__init__).
            loop.allreduce_gradients = real_allreduce
            losses.gather_with_grad = real_gather
            loop.Trainer._wrap_ddp = real_wrap
            if broken == "allreduce":  # neither DDP's bucketed reduction nor the flat one
                loop.allreduce_gradients = lambda params, world_size: None
                loop.Trainer._wrap_ddp = lambda self: self.method
            elif broken == "gather":
                losses.gather_with_grad = lambda x: (x, 0)  # negatives from this rank only
            if "+" in name:  # lockstep needs no float64 (ranks must agree exactly, in any precision)
                trainer = Trainer(
                    ddp_cfg(name), float32(data), log=lambda s: None, rank=rank, world_size=WORLD
                )
            else:
                trainer = make_trainer(base, data, rank=rank, world_size=WORLD)
            trainer.fit()
            torch.save({"state": trainer.method.state_dict(), "history": trainer.history},
                       Path(out_dir) / f"{name}.rank{rank}.pt")
            dist.barrier()
    finally:
        loop.allreduce_gradients, losses.gather_with_grad = real_allreduce, real_gather
        loop.Trainer._wrap_ddp = real_wrap
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def digits():
    return float64(load_dataset(ddp_cfg("simclr").dataset))


@pytest.fixture(scope="module")
def ddp_runs(tmp_path_factory, digits) -> Path:
    """Two spawned gloo ranks train every run of RUNS; returns the folder of their saved results."""
    out = tmp_path_factory.mktemp("ddp")
    mp.start_processes(_worker, args=(str(out / "pg_init"), str(out), digits, RUNS), nprocs=WORLD,
                       join=True, start_method="spawn")  # joins both; a child's exception re-raised
    return out


@pytest.fixture
def one_thread():
    """This process with one thread, as each rank runs; restored afterwards."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def single_process(base: str, data) -> dict:
    trainer = make_trainer(base, data)
    trainer.fit()
    return {"state": trainer.method.state_dict(), "history": trainer.history}


def float_diffs(a: dict, b: dict) -> dict[str, float]:
    """Max |a - b| of every floating tensor of two state dicts (same keys, same shapes)."""
    assert a.keys() == b.keys()
    out = {}
    for k in a:
        assert a[k].shape == b[k].shape, k
        if a[k].is_floating_point():
            out[k] = (a[k] - b[k]).abs().max().item()
        else:
            assert torch.equal(a[k], b[k]), k  # e.g. MoCo's queue pointer
    return out


def mismatched(a: dict, b: dict) -> list[str]:
    return [k for k in a if a[k].is_floating_point() and not torch.allclose(a[k], b[k], rtol=RTOL, atol=ATOL)]


def load(out: Path, name: str, rank: int) -> dict:
    return torch.load(out / f"{name}.rank{rank}.pt", weights_only=True)


@pytest.mark.parametrize("base", BASES)
def test_two_processes_train_as_one(ddp_runs, digits, one_thread, base):
    one = single_process(base, digits)
    r0, r1 = load(ddp_runs, base, 0), load(ddp_runs, base, 1)

    assert r0["state"]["objective.projector.0.weight"].dtype == torch.float64
    # the ranks stay in lockstep: identical all-reduced gradients give identical weights
    assert max(float_diffs(r0["state"], r1["state"]).values()) == 0.0

    diffs = float_diffs(one["state"], r0["state"])
    print(f"{base}: max |single - ddp| over {len(diffs)} tensors = {max(diffs.values()):.3g}")
    assert not mismatched(one["state"], r0["state"]), (base, diffs)

    assert len(one["history"]) == len(r0["history"]) == 2
    print(f"{base}: max |loss difference| = "
          f"{max(abs(h1['loss'] - h2['loss']) for h1, h2 in zip(one['history'], r0['history'])):.3g}")
    for h1, h2 in zip(one["history"], r0["history"]):
        assert h2["loss"] == pytest.approx(h1["loss"], rel=LOSS_RTOL), (base, h1, h2)


@pytest.mark.parametrize("broken", ["allreduce", "gather"])
def test_broken_ddp_diverges_from_one_process(ddp_runs, digits, one_thread, broken):
    """Negative controls: the comparison above fails without the gradient all-reduce, or when
    SimCLR takes its negatives from its own rank only."""
    one = single_process("simclr", digits)
    r0, r1 = load(ddp_runs, f"simclr-no-{broken}", 0), load(ddp_runs, f"simclr-no-{broken}", 1)
    diffs = float_diffs(one["state"], r0["state"])
    print(f"simclr without {broken}: max |single - ddp| = {max(diffs.values()):.3g}")
    assert max(diffs.values()) > 1e-4  # far beyond even float32's rounding
    assert mismatched(one["state"], r0["state"])
    if broken == "allreduce":
        assert mismatched(r0["state"], r1["state"])  # each rank followed its own half of the data
    else:
        assert max(float_diffs(r0["state"], r1["state"]).values()) == 0.0  # still in lockstep


def test_nt_xent_gather_is_identity_without_process_group():
    import torch.distributed as dist

    assert not (dist.is_available() and dist.is_initialized())
    g = torch.Generator().manual_seed(0)
    z1 = torch.randn(16, 8, generator=g, requires_grad=True)
    z2 = torch.randn(16, 8, generator=g, requires_grad=True)
    gathered = nt_xent(z1, z2, 0.1, gather=True)
    grads = torch.autograd.grad(gathered, (z1, z2))
    local = nt_xent(z1, z2, 0.1, gather=False)
    grads_local = torch.autograd.grad(local, (z1, z2))
    assert torch.equal(gathered, local)
    for a, b in zip(grads, grads_local):
        assert torch.equal(a, b)


@pytest.mark.parametrize("name", AUGMENTED)
def test_augmented_ranks_stay_in_lockstep(ddp_runs, name):
    """Every update of an augmentation (PiNDA's generator with the encoder, CoCor's MMNN step, DiffAug's
    generator phase and extra steps) is averaged over the ranks: their weights stay identical."""
    r0, r1 = load(ddp_runs, name, 0), load(ddp_runs, name, 1)
    diffs = float_diffs(r0["state"], r1["state"])
    assert max(diffs.values()) == 0.0, {k: v for k, v in diffs.items() if v}
    assert all(math.isfinite(h["loss"]) for h in r0["history"])
