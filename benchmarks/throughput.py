"""Training throughput of the loop against the per-sample peer pipeline, side by side, one process.

    python benchmarks/throughput.py [--models cnn,resnet18] [--batch 128] [--threads 1]
        [--rounds 3] [--epochs-per-round 1] [--resnet-steps 3] [--json FILE]

Two pipelines train the same model, loss (SimCLR's NT-Xent), batch, optimiser and torch thread
count:

- loop: augtune's `Trainer.train_epoch` (the training set on the device, views made by whole
  batches);
- peer: what lightly and solo-learn do: a map-style `Dataset` whose `__getitem__` makes two views
  of one sample with torchvision.transforms.v2 (RandomResizedCrop, flip, ColorJitter with
  probability 0.8, RandomGrayscale, as the loop's view config), batched by
  `torch.utils.data.DataLoader` (shuffle, drop_last, `num_workers=0`: the views are made in the
  training process on the same thread budget, as the loop's are), then the very same step: the
  method's forward, backward, optimiser step, zero_grad, the method's `after_step`. The peer reads
  the tensors directly (no PIL decode), which flatters it.

Models: `cnn` is the main job's (examples/compare_digits.yaml: SmallCNN width 16 on scikit-learn's
8x8 digits, 1257 training images, crop 0.3-1, no flip); `resnet18` is the CIFAR-stem ResNet-18 on
CIFAR-shaped synthetic uint8 images (3x32x32, batch x `--resnet-steps` of them; no download).

Each round trains one epoch of each pipeline in turn (loop, peer, loop, peer, ...), so that both
see the same machine load; the first round is a warm-up and is dropped; reported are medians over
the others. Samples/s counts the samples of the full batches trained per second of the epoch's wall
time.

The step profile (ms per step, the loop's epochs only) times, with wrappers and hooks installed
here: `views` (`Trainer._views`: both views' parameters and pixels), `forward` (the method's
forward, augmentations' `transform` excluded), `hooks` (augmentations' `transform` and the method's
`after_step`: momentum updates, a method's own updates), `backward` (`Tensor.backward`),
`optimiser` (optimisers' `step`), and `other`: the rest of the step (the batch's gather and float
conversion, learning rate, zero_grad, the loss bookkeeping, Python). The wrappers cost a few
microseconds a step.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import defaultdict

import torch
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)

from augtune.config import from_dict
from gpu_check import synthetic  # the same synthetic data as the GPU check (benchmarks/)
from augtune.data import load_dataset
from augtune.data.batches import as_float
from augtune.methods import Batch, StepInfo
from augtune.trainables.loop import Trainer

PARTS = ("views", "forward", "hooks", "backward", "optimiser", "other")


def model_config(
    model: str, batch: int, threads: int, epochs: int, channels_last: bool = False
) -> dict:
    """The config of one benchmark model (module doc); evaluation off: only training is timed."""
    common = {
        "train": {
            "epochs": epochs,
            "batch_size": batch,
            "num_threads": threads,
            "device": "cpu",
            "precision": "fp32",
            "channels_last": channels_last,
        },
        "eval": {
            "every": 0,
            "metrics": [],
            "epoch_metrics": [],
            "references": False,
            "figures": [],
        },
    }
    if model == "cnn":
        return {
            **common,
            "dataset": {"name": "digits"},
            "model": {"backbone": "cnn", "width": 16},
            "view": {"crop_scale": [0.3, 1.0], "flip_p": 0.0},
        }
    return {**common, "dataset": {"name": "digits"}, "model": {"backbone": "resnet18"}}


synthetic_images = synthetic  # CIFAR's form without its download (gpu_check's)


class Clock:
    """Wall seconds per part, summed until `take` (parts nest: `forward` minus `hooks` is kept)."""

    def __init__(self) -> None:
        self.parts: dict[str, float] = defaultdict(float)
        self.started: dict[str, float] = {}
        self.on = False

    def start(self, part: str) -> None:
        if self.on:
            self.started[part] = time.perf_counter()

    def stop(self, part: str) -> None:
        if self.on and part in self.started:
            self.parts[part] += time.perf_counter() - self.started.pop(part)

    def wrap(self, part: str, fn):
        def timed(*a, **k):
            self.start(part)
            try:
                return fn(*a, **k)
            finally:
                self.stop(part)

        return timed

    def take(self) -> dict[str, float]:
        out, self.parts = dict(self.parts), defaultdict(float)
        return out


def instrument(trainer: Trainer, clock: Clock) -> None:
    """Times the parts of `trainer`'s steps (module doc) into `clock` while `clock.on`."""
    trainer._views = clock.wrap("views", trainer._views)
    trainer.method.register_forward_pre_hook(lambda m, a: clock.start("forward"))
    trainer.method.register_forward_hook(lambda m, a, out: clock.stop("forward"))
    for aug in trainer.method.augments:
        aug.transform = clock.wrap("hooks_in_forward", aug.transform)
    trainer.method.after_step = clock.wrap("hooks", trainer.method.after_step)
    torch.Tensor.backward = clock.wrap("backward", torch.Tensor.backward)
    register_optimizer_step_pre_hook(lambda o, a, k: clock.start("optimiser"))
    register_optimizer_step_post_hook(lambda o, a, k: clock.stop("optimiser"))


class PeerViews(torch.utils.data.Dataset):
    """Two torchvision v2 views of one sample per `__getitem__` (float32 in [0, 1], (C, H, W))."""

    def __init__(self, x: torch.Tensor, cfg) -> None:
        from torchvision.transforms import v2

        self.x, side = x, x.shape[-1]
        v = cfg.view
        steps = [v2.RandomResizedCrop(side, scale=tuple(v.crop_scale), antialias=True)]
        if v.flip_p > 0:
            steps.append(v2.RandomHorizontalFlip(v.flip_p))
        steps.append(
            v2.RandomApply([v2.ColorJitter(v.jitter, v.jitter, v.jitter, v.hue)], p=v.jitter_p)
        )
        if x.shape[1] == 3 and v.gray_p > 0:
            steps.append(v2.RandomGrayscale(v.gray_p))
        if x.dtype == torch.uint8:
            steps.append(v2.ToDtype(torch.float32, scale=True))
        self.transform = v2.Compose(steps)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        img = self.x[i]
        return self.transform(img), self.transform(img)


class Peer:
    """The peer pipeline's epochs: a DataLoader of per-sample views, then the loop's own step."""

    def __init__(self, trainer: Trainer) -> None:
        self.t = trainer
        x, _ = trainer.data.pretrain()
        g = torch.Generator().manual_seed(trainer.cfg.train.seed)
        self.loader = torch.utils.data.DataLoader(
            PeerViews(x, trainer.cfg),
            batch_size=trainer.cfg.train.batch_size,
            shuffle=True,
            drop_last=True,
            num_workers=0,
            generator=g,
        )

    def epoch(self) -> float:
        """One epoch; returns samples per second."""
        t, n = self.t, 0
        specs = [s for s in t.specs if not s.manual]
        active = [t.optimizers[s.name] for s in specs]
        params = [p for o in active for g in o.param_groups for p in g["params"]]
        t.method.train()
        start = time.perf_counter()
        for v1, v2 in self.loader:
            if t.memory_format is not None:  # train.channels_last: the batch as the loop's is
                v1 = v1.contiguous(memory_format=t.memory_format)
                v2 = v2.contiguous(memory_format=t.memory_format)
            batch = Batch(
                x=v1, views=(v1, v2), index=torch.arange(len(v1))
            )  # SimCLR never reads x
            t._set_lr()
            info = StepInfo(t.epoch, t.global_step, t.total_steps, "", lr=t._encoder_lr())
            loss, _, batch = t.method(batch, info)
            loss.backward()
            t._step(active, params)
            for opt in t.optimizers.values():
                opt.zero_grad(set_to_none=True)
            t.method.after_step(batch, info, t._update)
            t.global_step += 1
            n += len(v1)
        elapsed = time.perf_counter() - start
        t.epoch += 1
        return n / elapsed


def run_model(model: str, args) -> dict:
    torch.set_num_threads(args.threads)
    epochs = args.rounds * args.epochs_per_round + 2
    cfg = from_dict(model_config(model, args.batch, args.threads, epochs, args.channels_last))
    if model == "cnn":
        data = load_dataset(cfg.dataset)
    else:
        data = synthetic_images(args.batch * args.resnet_steps, (3, 32, 32))
    loop, peer_trainer = (
        Trainer(cfg, data, log=lambda s: None),
        Trainer(cfg, data, log=lambda s: None),
    )
    peer = Peer(peer_trainer)
    clock = Clock()
    instrument(loop, clock)
    ours, theirs, profiles = [], [], []
    for r in range(args.rounds + 1):
        for _ in range(args.epochs_per_round):
            clock.on = True
            start = time.perf_counter()
            m = loop.train_epoch()
            wall = time.perf_counter() - start
            clock.on = False
            parts = clock.take()
            steps = loop.steps_per_epoch
            parts["forward"] = parts.get("forward", 0.0) - parts.get("hooks_in_forward", 0.0)
            parts["hooks"] = parts.get("hooks", 0.0) + parts.pop("hooks_in_forward", 0.0)
            parts["other"] = wall - sum(parts.get(k, 0.0) for k in PARTS if k != "other")
            step_ms = {k: 1e3 * parts.get(k, 0.0) / steps for k in PARTS}
            step_ms["step"] = 1e3 * wall / steps
            peer_rate = peer.epoch()
            if r:  # round 0: warm-up
                ours.append(m["samples_per_s"])
                theirs.append(peer_rate)
                profiles.append(step_ms)
    profile = {k: statistics.median(p[k] for p in profiles) for k in (*PARTS, "step")}
    a, b = statistics.median(ours), statistics.median(theirs)
    return {
        "model": model,
        "data": "digits 1x8x8" if model == "cnn" else "synthetic 3x32x32 uint8",
        "batch": args.batch,
        "threads": args.threads,
        "steps_per_epoch": loop.steps_per_epoch,
        "loop_samples_per_s": a,
        "peer_samples_per_s": b,
        "ratio": a / b,
        "step_ms": profile,
        "rounds": args.rounds,
    }


def views_alone(model: str, args) -> dict:
    """The loop's views per step against the peer's views per batch, without the model (ms)."""
    torch.set_num_threads(args.threads)
    cfg = from_dict(model_config(model, args.batch, args.threads, 1, args.channels_last))
    data = (
        load_dataset(cfg.dataset) if model == "cnn" else synthetic_images(args.batch, (3, 32, 32))
    )
    t = Trainer(cfg, data, log=lambda s: None)
    x = as_float(t.x_train[: args.batch])
    peer = PeerViews(data.pretrain()[0][: args.batch], cfg)

    def median_ms(fn, repeats: int) -> float:
        fn()
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            times.append(1e3 * (time.perf_counter() - start))
        return statistics.median(times)

    ours = median_ms(lambda: t._views(x, args.batch, slice(0, args.batch)), 10)
    theirs = median_ms(lambda: [peer[i] for i in range(args.batch)], 3)
    return {"loop_views_ms": ours, "peer_views_ms": theirs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="cnn,resnet18")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3, help="measured rounds (one more warms up)")
    ap.add_argument("--epochs-per-round", type=int, default=1)
    ap.add_argument("--resnet-steps", type=int, default=3, help="steps per ResNet-18 epoch")
    ap.add_argument(
        "--channels-last",
        action="store_true",
        help="train.channels_last in both pipelines (NHWC batches and weights)",
    )
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    print(f"torch {torch.__version__}, {args.threads} thread(s), batch {args.batch}")
    results = []
    for model in args.models.split(","):
        r = run_model(model, args)
        r.update(views_alone(model, args))
        results.append(r)
        p = r["step_ms"]
        print(f"\n{model} ({r['data']}), ms per step (loop):")
        print("  " + "  ".join(f"{k} {p[k]:.1f}" for k in (*PARTS, "step")))
        print(
            f"  views alone: loop {r['loop_views_ms']:.1f} ms, "
            f"peer {r['peer_views_ms']:.1f} ms per batch"
        )
        print(
            f"  samples/s: loop {r['loop_samples_per_s']:.0f}, "
            f"peer {r['peer_samples_per_s']:.0f}, "
            f"ratio {r['ratio']:.2f}x"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
