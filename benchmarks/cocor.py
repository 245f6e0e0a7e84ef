"""What CoCor costs: MoCo+CoCor over MoCo epoch time, both trained side by side in one process.

Run:  python benchmarks/cocor.py [--dataset digits] [--epochs 4] [--width 32] [--batch-size 256]
                                 [--lengths 1,2,3] [--meta forward_mode] [--device auto]

The two trainers alternate epochs (MoCo, CoCor, MoCo, ...) so that both see the same machine
state; the first epoch of each is a warm-up and is dropped. It prints the median epoch time of each
and their ratio (the paper reports 1.38x on ImageNet, App. I; augtune aims at <= 1.30x with
lengths [1, 2, 3]), and the mean time per step of the MMNN + classifier update (the bi-level step).
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from augtune.config import from_dict
from augtune.data import load_dataset
from augtune.trainables.loop import Trainer


def config(args, augment: list[str]) -> dict:
    return {
        "dataset": {"name": args.dataset},
        "method": {"base": "moco", "augment": augment, "queue_size": 4096},
        "model": {"backbone": "cnn", "width": args.width},
        "train": {"epochs": args.epochs, "batch_size": args.batch_size, "lr": 1e-3, "warmup_epochs": 0,
                  "device": args.device, "num_threads": args.threads or None},
        "eval": {"every": 0, "metrics": [], "references": False},
        "cocor": {"lengths": [int(l) for l in args.lengths.split(",")], "meta": args.meta,
                  "meta_every": args.meta_every, "view_fraction": args.view_fraction},
    }


def time_mmnn_update(trainer: Trainer) -> list[float]:
    """Wall seconds of each of CoCor's MMNN + classifier updates (its `after_step`), appended as it runs."""
    aug, out = trainer.method.augments[0], []
    after_step = aug.after_step

    def timed(*args):
        if trainer.device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        after_step(*args)
        if trainer.device.type == "cuda":
            torch.cuda.synchronize()
        if aug.mmnn is not None:
            out.append(time.perf_counter() - t0)

    aug.after_step = timed
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", default="digits")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--width", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--lengths", default="1,2,3")
    p.add_argument("--meta", default="forward_mode", choices=["forward_mode", "exact"])
    p.add_argument("--meta-every", type=int, default=1)
    p.add_argument("--view-fraction", type=float, default=1.0)
    p.add_argument("--device", default="auto")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    args = p.parse_args()
    base_cfg, cocor_cfg = from_dict(config(args, [])), from_dict(config(args, ["cocor"]))
    data = load_dataset(base_cfg.dataset)
    trainers = {"moco": Trainer(base_cfg, data, log=lambda s: None),
                "moco+cocor": Trainer(cocor_cfg, data, log=lambda s: None)}
    times: dict[str, list[float]] = {k: [] for k in trainers}
    meta = time_mmnn_update(trainers["moco+cocor"])
    for _ in range(args.epochs):
        for name, t in trainers.items():
            times[name].append(t.train_epoch()["epoch_time_s"])
            if t.device.type == "cuda":
                torch.cuda.synchronize()
    med = {k: statistics.median(v[1:] if len(v) > 1 else v) for k, v in times.items()}
    dev = trainers["moco"].device
    print(f"{args.dataset}, CNN width {args.width}, batch {args.batch_size}, lengths [{args.lengths}], "
          f"meta {args.meta} every {args.meta_every}, view fraction {args.view_fraction}, device {dev}"
          + (f" ({torch.cuda.get_device_name(dev)})" if dev.type == "cuda" else ""))
    print(f"{'method':<14}{'median epoch s':>16}")
    for k, v in med.items():
        print(f"{k:<14}{v:>16.3f}")
    print(f"ratio moco+cocor / moco: {med['moco+cocor'] / med['moco']:.2f}")
    if meta:  # the bi-level step alone (after_step; every meta_every-th step updates), first epoch dropped
        kept = meta[trainers["moco+cocor"].steps_per_epoch:] or meta
        step = statistics.mean(kept)
        moco_step = med["moco"] / trainers["moco"].steps_per_epoch
        print(
            f"MMNN update (after_step), mean per training step: {step:.3f} s = "
            f"{step / moco_step:.0%} of a MoCo step"
        )


if __name__ == "__main__":
    main()
