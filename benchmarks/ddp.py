"""Where a DDP training step's time goes, one process against two gloo processes, before and after.

    python benchmarks/ddp.py [--before 899dad4] [--rounds 5] [--epochs 2] [--dataset fashion_mnist]

Trains SimCLR with a small CNN (Fashion-MNIST 28x28 images, 2048 of them, width 8, global batch 256, one
torch thread per process, the real `Trainer.train_epoch`) in processes started by torch.multiprocessing,
as tests/test_ddp.py does, for two versions of the loop side by side:

- before (`--before`, checked out in a temporary git worktree and imported from there): every rank made
  the views of the whole global batch and kept its slice; one flat all-reduce of the gradients after the
  backward pass (`allreduce_gradients`);
- after (this checkout): each rank draws the views' random parameters for the whole global batch and
  makes its own rows' pixels only; DistributedDataParallel averages gradients in buckets while the
  backward pass runs.

Each is run with 1 process (the whole global batch) and with 2 (half each); "after" also with 1 process on
half the global batch ("after-half": one rank's share, so that what a second rank costs per sample can be
told from what a smaller batch costs per sample: a view op's fixed cost per call is spread over fewer
samples), and with 2 processes under DDP's `no_sync` (`require_backward_grad_sync = False`: no gradient
averaging), so that the exposed all-reduce time of DDP is backward(synced) - backward(no_sync) at the same
world size and per-rank batch; "before"'s all-reduce is timed directly around `allreduce_gradients`. The
parts, timed with time.perf_counter by wrappers and hooks installed here (the library has no timing code for
this), are the view pipeline, the method's forward (DDP's wrapper included: SimCLR's gather of negatives
across ranks is in it), `Tensor.backward`, the all-reduce, the optimisers' `step`, and the rest of the step
(batch gather, zero_grad, learning rate, loss bookkeeping). Times are rank 0's, milliseconds per step,
medians over every measured epoch of `--rounds` rounds, each round running every variant once in turn
(interleaved, so a machine shared with other jobs slows them alike); the first epoch of each run is a
warm-up and not counted.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch
import torch.multiprocessing as mp
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("views", "forward", "backward", "allreduce", "optimiser")


def config(args) -> dict:
    return {
        "dataset": {"name": args.dataset, "max_train": args.max_train, "max_test": 256},
        "model": {"backbone": "cnn", "width": args.width},
        "method": {"base": "simclr"},
        "train": {"epochs": args.epochs + 1, "batch_size": args.batch, "lr": 1e-3, "device": "cpu",
                  "precision": "fp32", "num_threads": 1, "warmup_epochs": 0},
        "eval": {"every": 0, "metrics": ["knn"], "references": False},
    }


class Clock:
    """Wall seconds per named part, accumulated over one epoch, and the CPU seconds of this thread in it
    as `<part>_cpu` (one torch thread: what the part cost, however busy the machine's cores were)."""

    def __init__(self):
        self.parts: dict[str, float] = defaultdict(float)
        self.started: dict[str, tuple[float, float]] = {}

    def start(self, part: str) -> None:
        self.started[part] = time.perf_counter(), time.thread_time()

    def stop(self, part: str) -> None:
        wall, cpu = self.started.pop(part)
        self.parts[part] += time.perf_counter() - wall
        self.parts[f"{part}_cpu"] += time.thread_time() - cpu

    def wrap(self, part: str, fn):
        def timed(*a, **k):
            self.start(part)
            try:
                return fn(*a, **k)
            finally:
                self.stop(part)
        return timed


def instrument(trainer, loop, clock: Clock) -> None:
    """Times every part of `trainer`'s steps into `clock`, whichever version of the loop `loop` is."""
    if hasattr(trainer, "_views"):  # after: parameters for the global batch, pixels for this rank's rows
        trainer._views = clock.wrap("views", trainer._views)
    else:  # before: `self.view(x)` twice on the whole global batch
        trainer.view = clock.wrap("views", trainer.view)
    model = getattr(trainer, "forward", trainer.method)  # after: the DDP wrapper when world > 1
    model.register_forward_pre_hook(lambda m, a: clock.start("forward"))
    model.register_forward_hook(lambda m, a, out: clock.stop("forward"))
    torch.Tensor.backward = clock.wrap("backward", torch.Tensor.backward)  # DDP's bucketed reduce is in it
    loop.allreduce_gradients = clock.wrap("allreduce", loop.allreduce_gradients)  # looked up at call time
    register_optimizer_step_pre_hook(lambda o, a, k: clock.start("optimiser"))
    register_optimizer_step_post_hook(lambda o, a, k: clock.stop("optimiser"))


def _rank(rank: int, tree: str, world: int, no_sync: bool, cfg: dict, init_file: str, out: str) -> None:
    """One process of one run: trains `cfg` with the augtune found in `tree` and writes its epochs' parts."""
    sys.path.insert(0, tree)  # before anything imports augtune: this process's version of the loop
    import warnings

    import torch.distributed as dist

    warnings.filterwarnings("ignore", category=FutureWarning)  # torch's all_gather deprecation, every step

    import augtune
    import augtune.trainables.loop as loop
    from augtune.config import from_dict
    from augtune.data import load_dataset

    assert Path(augtune.__file__).resolve().is_relative_to(Path(tree).resolve()), augtune.__file__
    torch.set_num_threads(1)
    if world > 1:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=300))
    try:
        c = from_dict(cfg)
        trainer = loop.Trainer(c, load_dataset(c.dataset), rank=rank, world_size=world, log=lambda s: None)
        if no_sync:  # what DDP's no_sync() context sets: its backward averages nothing
            trainer.forward.require_backward_grad_sync = False
        clock = Clock()
        instrument(trainer, loop, clock)
        epochs = []
        for _ in range(c.train.epochs):
            clock.parts.clear()
            metrics = trainer.train_epoch()
            steps = trainer.steps_per_epoch
            epochs.append(
                {"step": metrics["epoch_time_s"] / steps, **{k: v / steps for k, v in clock.parts.items()}}
            )
        Path(out).with_suffix(f".rank{rank}.json").write_text(json.dumps(epochs[1:]))  # first: warm-up
        if world > 1:
            dist.barrier()  # no rank tears its connections down while the other still uses them
    finally:
        if world > 1:
            dist.destroy_process_group()


def run(tree: Path, world: int, no_sync: bool, cfg: dict, tmp: Path, name: str) -> list[dict]:
    init = tmp / f"{name}.init"
    init.unlink(missing_ok=True)
    try:
        mp.start_processes(_rank, args=(str(tree), world, no_sync, cfg, str(init), str(tmp / name)),
                           nprocs=world, join=True, start_method="spawn")
    except mp.ProcessExitedException as e:
        # Under `no_sync`, a gloo rank sometimes aborts in the interpreter's shutdown, after every line of
        # Python has run ("terminate called without an active exception", no Python frame: a C++ thread
        # torn down at exit; 1 run in ~6 on this machine). Its epochs are written by then: keep them.
        if not all((tmp / f"{name}.rank{r}.json").exists() for r in range(world)):
            raise
        print(f"{name}: a rank aborted at exit after writing its results ({e}); kept", file=sys.stderr)
    return json.loads((tmp / f"{name}.rank0.json").read_text())


def worktree(rev: str, where: Path) -> Path:
    path = where / f"checkout-{rev}"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(path), rev], check=True,
                   capture_output=True)
    return path


def own_samples(variant: str, world: int, batch: int) -> int:
    """A rank's samples per step: its share of the global batch (after-half: half of it, in one process)."""
    return batch // 2 if variant == "after-half" else batch // world


def table(results: dict[tuple, list[dict]], batch: int) -> str:
    """The markdown table: milliseconds per step (medians), and the views' microseconds per own sample."""
    med = {key: {k: statistics.median(e.get(k, 0.0) for e in eps) for k in ("step", "views_cpu", *PARTS)}
           for key, eps in results.items()}
    head = ("| loop | processes | views | forward | backward | all-reduce | optimiser | other | step "
            "| views µs/sample: wall, CPU | samples/s |\n|" + " --- |" * 2 + " ---: |" * 9)
    rows = [head]
    for (variant, world, no_sync), m in med.items():
        if no_sync:
            continue
        allreduce = m["allreduce"]
        if variant == "after" and world > 1:  # DDP: the part of its backward that no_sync does not pay
            allreduce = m["backward"] - med[(variant, world, True)]["backward"]
        backward = m["backward"] - (allreduce if variant == "after" and world > 1 else 0.0)
        other = m["step"] - sum(m[k] for k in PARTS)
        own = own_samples(variant, world, batch)
        per_sample = f"{m['views'] / own * 1e6:.0f}, {m['views_cpu'] / own * 1e6:.0f}"
        cells = [m["views"], m["forward"], backward, allreduce, m["optimiser"], other, m["step"]]
        rows.append(f"| {variant} | {world} | " + " | ".join(f"{v * 1e3:.1f}" for v in cells)
                    + f" | {per_sample} | {own * world / m['step']:.0f} |")
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", default="899dad4", help="the revision of the 'before' loop")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--epochs", type=int, default=2, help="measured epochs per run (after one warm-up)")
    ap.add_argument("--dataset", default="fashion_mnist", choices=["fashion_mnist", "digits"])
    ap.add_argument("--max-train", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=256, help="the global batch")
    ap.add_argument("--width", type=int, default=8, help="CNN width")
    args = ap.parse_args()
    cfg = config(args)
    variants = [("before", 1, False), ("before", 2, False), ("after", 1, False), ("after-half", 1, False),
                ("after", 2, False), ("after", 2, True)]
    half = config(argparse.Namespace(**{**vars(args), "batch": args.batch // 2}))
    results: dict[tuple, list[dict]] = {v: [] for v in variants}
    with tempfile.TemporaryDirectory(prefix="augtune-ddp-") as d:
        tmp = Path(d)
        trees = {"before": worktree(args.before, tmp), "after": ROOT, "after-half": ROOT}
        try:
            for r in range(args.rounds):
                for variant, world, no_sync in variants:
                    name = f"{variant}-{world}{'-nosync' if no_sync else ''}-{r}"
                    run_cfg = half if variant == "after-half" else cfg
                    out = run(trees[variant], world, no_sync, run_cfg, tmp, name)
                    results[(variant, world, no_sync)] += out
                print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(trees["before"])],
                           capture_output=True)
    print(
        f"SimCLR, {args.dataset} ({args.max_train} images), CNN width {args.width}, "
        f"global batch {args.batch}, "
        f"1 thread per process, gloo, {os.cpu_count()} CPUs; before = {args.before}; ms per step of rank 0, "
        f"medians over {args.rounds} interleaved rounds x {args.epochs} epochs"
    )
    print(table(results, args.batch))
    for variant in ("before", "after"):
        ratio = [
            statistics.median(e[k] for e in results[(variant, 2, False)])
            / statistics.median(e[k] for e in results[(variant, 1, False)])
            * 2
            for k in ("views", "views_cpu")
        ]
        print(
            f"{variant}: views per own sample, 2 processes / 1 process: "
            f"{ratio[0]:.2f} wall, {ratio[1]:.2f} CPU"
        )
    two, half_one = results[("after", 2, False)], results[("after-half", 1, False)]
    ratio = [statistics.median(e[k] for e in two) / statistics.median(e[k] for e in half_one)
             for k in ("views", "views_cpu")]
    print(f"after: views per own sample, 2 processes / 1 process on one rank's share of the batch: "
          f"{ratio[0]:.2f} wall, {ratio[1]:.2f} CPU")


if __name__ == "__main__":
    main()
