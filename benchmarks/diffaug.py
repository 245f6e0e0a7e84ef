"""What DiffAug costs over SimCLR: per epoch of each phase, and per 1k generated samples.

Run:  python benchmarks/diffaug.py [--data vectors|images] [--epochs 3] [--threads 1]

Trains the digits example (`examples/diffaug_digits_vectors.yaml`; with `--data images` the 8x8
digits with a small CNN and the U-Net generator) twice on the same data: SimCLR alone, and
SimCLR + DiffAug with the schedule A:1,B:1,A:1 scaled to `--epochs`. Prints

- the mean epoch time of SimCLR, of DiffAug's A-epochs before the first B-step (soft contrastive
  loss, ordinary views), of its B-epochs (diffusion loss), of its A-epochs with generated positives,
  and the per-epoch refresh of the generated-positive buffer (the whole train set, strided sampler),
  each with its ratio to SimCLR's epoch;
- the time to generate 1000 samples with the trained EMA generator, ancestral over all T steps and
  strided over `diffaug.sample_steps`.
"""
from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]


def config(data: str, epochs: int, with_diffaug: bool) -> dict:
    cfg = yaml.safe_load((ROOT / "examples" / "diffaug_digits_vectors.yaml").read_text())
    if data == "images":
        cfg["dataset"] = {"name": "digits"}
        cfg["model"] = {"backbone": "cnn", "width": 16, "proj_dim": 80}
        cfg["view"] = {"crop_scale": [0.3, 1.0], "flip_p": 0.0}
        cfg["diffaug"].update({"denoiser": "unet", "gen_width": 16})
        cfg["diffaug"].pop("gen_hidden")
    cfg["train"]["epochs"] = epochs
    cfg["eval"] = {"every": 0, "metrics": [], "epoch_metrics": [], "references": False, "figures": []}
    if with_diffaug:
        n = max(1, epochs // 3)
        cfg["diffaug"]["schedule"] = f"A:{n},B:{n},A:{epochs - 2 * n}"
    else:
        cfg["method"]["augment"] = []
    return cfg


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", choices=["vectors", "images"], default="vectors")
    ap.add_argument("--epochs", type=int, default=3, help="per run; DiffAug's schedule is A:1,B:1,A:1 scaled")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from augtune.config import from_dict
    from augtune.data import load_dataset
    from augtune.trainables.loop import Trainer

    simclr_cfg = from_dict(config(args.data, args.epochs, False))
    data = load_dataset(simclr_cfg.dataset)
    simclr = Trainer(simclr_cfg, data, log=lambda s: None)
    simclr.fit()
    base = sum(h["epoch_time_s"] for h in simclr.history) / len(simclr.history)

    cfg = from_dict(config(args.data, args.epochs, True))
    trainer = Trainer(cfg, data, log=lambda s: None)
    aug = trainer.method.augments[0]
    refresh: list[float] = []
    start_epoch = aug.on_epoch_start

    def timed(method, info):
        sync = trainer.device.type == "cuda"
        t0 = time.perf_counter()
        start_epoch(method, info)
        if sync:
            torch.cuda.synchronize()
        if aug.positives is not None:
            refresh.append(time.perf_counter() - t0)

    aug.on_epoch_start = timed
    trainer.fit()
    rows = {"SimCLR epoch": [base]}
    for h in trainer.history:
        key = "B epoch (diffusion loss)" if h["phase"] == "B" else (
            "A epoch, generated positives" if "diffaug_replaced" in h else "A epoch, before the first B")
        rows.setdefault(key, []).append(h["epoch_time_s"])
    if refresh:
        rows["buffer refresh (per A epoch)"] = refresh

    n_train = len(data.x_train)
    print(
        f"device {trainer.device}, {torch.get_num_threads()} threads, {args.data}: {n_train} train samples, "
        f"batch {cfg.train.batch_size}, T = {cfg.diffaug.steps}, sample_steps = {cfg.diffaug.sample_steps}"
    )
    print(f"{'per epoch':34s} {'seconds':>9s} {'x SimCLR':>9s}")
    for k, v in rows.items():
        mean = sum(v) / len(v)
        print(f"{k:34s} {mean:9.3f} {mean / base:9.2f}")

    x = data.x_train[:1000].to(trainer.device)
    reps = max(1, -(-1000 // len(x)))
    print(f"{'generation of 1000 samples':34s} {'seconds':>9s}")
    strided = cfg.diffaug.sample_steps
    for name, steps in (("ancestral, T steps", None), (f"strided, {strided} steps", strided)):
        t0 = time.perf_counter()
        aug.d = dataclasses.replace(cfg.diffaug, sample_steps=steps)  # generate() samples as the config says
        for _ in range(reps):
            aug.generate(trainer.method, x)
        if trainer.device.type == "cuda":
            torch.cuda.synchronize()
        print(f"{name:34s} {(time.perf_counter() - t0) * 1000 / (reps * len(x)):9.3f}")


if __name__ == "__main__":
    main()
