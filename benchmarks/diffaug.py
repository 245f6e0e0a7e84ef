"""What DiffAug costs over SimCLR: per epoch of each phase, and per 1k generated samples.

Run:  python benchmarks/diffaug.py [--data vectors|images] [--epochs 3] [--threads 1]

Trains the digits example (`examples/diffaug_digits_vectors.yaml`; with `--data images` the 8x8
digits with a small CNN and the U-Net generator) twice on the same data: SimCLR alone, and
SimCLR + DiffAug with the schedule A:1,B:1,A:1 scaled to `--epochs`. Prints

- the mean epoch time of SimCLR, of DiffAug's A-epochs before the first B-step (soft contrastive
  loss, ordinary views), of its B-epochs (diffusion loss), of its A-epochs with generated positives,
  and the per-epoch refresh of the generated positives (the ~lambda N samples the epoch replaces,
  strided sampler), each with its ratio to SimCLR's epoch, and an A-epoch with its refresh (the sum);
- the time to generate 1000 samples with the trained EMA generator, ancestral over all T steps and
  strided over `diffaug.sample_steps`;
- the per-epoch refresh as it is (positives for the ~lambda N samples the epoch replaces) beside the
  full refresh it replaced (a positive for every sample), timed in the same process.

With `--updates 50,100,200,400,800` it instead trains the main job's DiffAug entrant
(`examples/compare_digits.yaml`: 8x8 digit images, small CNN, U-Net generator, 6 epochs) with
`diffaug.gen_steps` set to give its B-phase about that many generator updates in all, over `--seeds`
seeds, and prints per target: the updates, the run's B-phase and total seconds, `gen_std_ratio`, how
often a generated positive keeps its anchor's class (a 5-NN on the test split's pixels labels it;
the same classifier labels the anchors themselves as the ceiling), and the encoder's k-NN accuracy.
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
    ap.add_argument("--updates", help="comma-separated generator-update totals: the sweep instead")
    ap.add_argument("--seeds", type=int, default=3, help="per target of --updates")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.updates:
        updates_sweep([int(u) for u in args.updates.split(",")], args.seeds)
        return

    from augtune.config import from_dict
    from augtune.data import load_dataset
    from augtune.methods import StepInfo
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
    if refresh:  # the measure: an encoder epoch with generated positives, its refresh included
        a_epochs = rows["A epoch, generated positives"]
        both = sum(a_epochs) / len(a_epochs) + sum(refresh) / len(refresh)
        print(f"{'A epoch with its refresh':34s} {both:9.3f} {both / base:9.2f}")

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

    aug.d = cfg.diffaug
    x_all = data.x_train.to(trainer.device)
    info = StepInfo(trainer.epoch, trainer.global_step, trainer.total_steps, "A",
                    visits=trainer.visits(trainer.epoch))  # as the loop calls it
    chosen, full = [], []
    for _ in range(3):
        t0 = time.perf_counter()
        trainer.method.on_epoch_start(info)  # the refresh as it is: the epoch's chosen samples only
        chosen.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        aug.generate(trainer.method, x_all)  # the full refresh it replaced: every sample
        full.append(time.perf_counter() - t0)
    c, f = min(chosen), min(full)
    print(f"refresh, lambda = {cfg.diffaug.lam}: {len(aug.positives)} of {len(x_all)} samples generated in "
          f"{c:.3f} s; a positive for every sample: {f:.3f} s ({f / c:.1f}x)")


def updates_sweep(targets: list[int], seeds: int) -> None:
    """The main job's DiffAug at several generator-update totals (the module doc)."""
    import math

    from sklearn.neighbors import KNeighborsClassifier

    from augtune.config import from_dict
    from augtune.data import load_dataset
    from augtune.phases import parse_phases
    from augtune.trainables.loop import Trainer

    raw = yaml.safe_load((ROOT / "examples" / "compare_digits.yaml").read_text())
    for k in ("compare", "pinda"):
        raw.pop(k)
    raw["method"] = {"base": "simclr", "augment": ["diffaug"]}
    raw["eval"] = {"every": 0, "metrics": ["knn"], "epoch_metrics": [], "references": False, "figures": []}
    data = load_dataset(from_dict(raw).dataset)
    pixels = KNeighborsClassifier(5).fit(data.x_test.flatten(1).numpy(), data.y_test.numpy())
    print(f"{'target':>6s} {'updates':>7s} {'B s':>6s} {'run s':>6s} {'std ratio':>9s} "
          f"{'keeps class':>11s} {'anchors':>7s} {'knn':>6s}  (mean +- sd over {seeds} seeds)")
    for target in targets:
        rows = []
        for seed in range(seeds):
            cfg = from_dict({**raw, "train": {**raw["train"], "seed": seed}})
            b_steps = parse_phases(cfg.diffaug.schedule, cfg.train.epochs).count("B") * max(
                1, len(data.x_train) // cfg.train.batch_size)
            gen_steps = min(32, max(1, math.ceil(target / b_steps)))
            cfg = from_dict({**raw, "train": {**raw["train"], "seed": seed},
                             "diffaug": {**raw["diffaug"], "gen_steps": gen_steps}})
            trainer = Trainer(cfg, data, log=lambda s: None)
            t0 = time.perf_counter()
            final = trainer.fit()
            run_s = time.perf_counter() - t0
            aug = trainer.method.augments[0]
            x, y = data.x_train[:500], data.y_train[:500].numpy()
            pos = aug.generate(trainer.method, x.to(trainer.device)).cpu()
            rows.append([int(aug.updates),
                         sum(e["epoch_time_s"] for e in trainer.history if e.get("phase") == "B"), run_s,
                         float(pos.std() / x.std()),
                         float((pixels.predict(pos.flatten(1).numpy()) == y).mean()),
                         float((pixels.predict(x.flatten(1).numpy()) == y).mean()), final["knn_acc"]])
        t = torch.tensor(rows, dtype=torch.float64)
        m, sd = t.mean(0), t.std(0) if seeds > 1 else torch.zeros(t.shape[1])
        print(f"{target:6d} {m[0]:7.0f} {m[1]:6.1f} {m[2]:6.1f} {m[3]:5.2f}+-{sd[3]:.2f} "
              f"{m[4]:7.3f}+-{sd[4]:.3f} {m[5]:7.3f} {m[6]:6.3f}+-{sd[6]:.3f}", flush=True)


if __name__ == "__main__":
    main()
