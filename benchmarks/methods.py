"""Epoch-time ratios of augmentation methods over their base, side by side in one process.

Run:  python benchmarks/methods.py [--pairs pinda,nrcc] [--epochs 3]

Each pair builds two Trainers on the same data and config except `method.augment`, then trains them
epoch by epoch, alternating (base, method, base, method, ...), so that both see the same machine
load; the first epoch of each is a warm-up and is dropped. Printed: median epoch seconds and the
ratio method / base.

- pinda: SimCLR + PiNDA (MLP generator, mu = 0, Alg. 1) over SimCLR on Fashion-MNIST as vectors
  (784-d, the MLP backbone of B.2; 4096 samples). The paper pays +35 % on HAR; the goal is <= 1.25x.
- nrcc: BYOL + NRCC (one SGHMC step through the target branch) over BYOL on digits images, small
  CNN. The paper reports 1.43x; the goal is <= 1.30x. With eq. 18's order and one step no
  gradient is needed (s1 = s0 + delta2 r0), so only x^c's target pass is extra; `nrcc_grad`
  measures the momentum-first order, which pays one forward + backward through the target.
"""
from __future__ import annotations

import argparse
import statistics

import torch

from augtune.config import from_dict
from augtune.data import load_dataset
from augtune.trainables.loop import Trainer

PAIRS = {
    "pinda": ({"dataset": {"name": "fashion_mnist", "as_vectors": True, "max_train": 4096, "max_test": 512},
               "view": {"name": "identity"}, "train": {"batch_size": 256}},
              {"method": {"augment": ["pinda"]}}),
    "nrcc": ({"dataset": {"name": "digits"}, "model": {"backbone": "cnn", "width": 32},
              "view": {"crop_scale": [0.3, 1.0], "flip_p": 0.0}, "method": {"base": "byol"},
              "train": {"batch_size": 128}},
             {"method": {"base": "byol", "augment": ["nrcc"]}}),
    # the same with SGHMC's gradient used (momentum_first: one gradient through the target per step)
    "nrcc_grad": ({"dataset": {"name": "digits"}, "model": {"backbone": "cnn", "width": 32},
                   "view": {"crop_scale": [0.3, 1.0], "flip_p": 0.0}, "method": {"base": "byol"},
                   "train": {"batch_size": 128}},
                  {"method": {"base": "byol", "augment": ["nrcc"]}, "nrcc": {"order": "momentum_first"}}),
}


def merged(base: dict, extra: dict) -> dict:
    out = {k: dict(v) for k, v in base.items()}
    for k, v in extra.items():
        out.setdefault(k, {}).update(v)
    return out


def epoch_times(pair: str, epochs: int) -> tuple[float, float]:
    base_cfg, extra = PAIRS[pair]
    common = {"eval": {"metrics": [], "epoch_metrics": [], "references": False, "every": 0},
              "train": {"epochs": epochs + 1}}
    cfgs = [from_dict(merged(merged(base_cfg, common), e)) for e in ({}, extra)]
    data = load_dataset(cfgs[0].dataset)
    trainers = [Trainer(c, data, log=lambda s: None) for c in cfgs]
    times: list[list[float]] = [[], []]
    for _ in range(epochs + 1):
        for k, t in enumerate(trainers):
            times[k].append(t.train_epoch()["epoch_time_s"])
    return statistics.median(times[0][1:]), statistics.median(times[1][1:])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", default=",".join(PAIRS))
    p.add_argument("--epochs", type=int, default=3)
    args = p.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"{'pair':<8}{'base s/epoch':>14}{'method s/epoch':>16}{'ratio':>8}")
    for pair in args.pairs.split(","):
        base, method = epoch_times(pair, args.epochs)
        print(f"{pair:<8}{base:>14.2f}{method:>16.2f}{method / base:>8.2f}")


if __name__ == "__main__":
    main()
