"""Controls on real training: does the verdict separate entrants that are the same (it must not), and
entrants that differ (it should)?

Run:  python benchmarks/controls.py [--compares 20] [--seeds 6] [--data digits|fashion]
                                    [--handicap epochs|views|noviews|data]
                                    [--parts negative,positive] [--out controls.json]
      python benchmarks/controls.py --tiny        # every part, small, in about a minute (the suite)

Real: every number is a real training run (`augtune.trainables.train_run`, the main job's model:
`examples/compare_digits.yaml`, 6 epochs, k-NN scored on the test split), and every decision is the
verdict's own (`augtune.analysis.verdict.verdict`: the same paired t-tests over shared seeds, Holm's
correction and alpha as `augtune compare`'s table). Left out, and why: the search (both entrants run
one fixed configuration, the defaults, so the control measures the verdict's tests and nothing of
Optuna), Ray (in-process runs train the same numbers), and the race's sequential looks (the verdict
is taken once at n = 3 and at n = `--seeds`, the race's min and max seeds;
`benchmarks/race_calibration.py` checks the race's looks on simulated numbers).

A compare here is two entrants over n paired seeds: pair i shares its train/test split (split seed
i, as `compare.vary: [init, split]` gives each seed its own) and differs in the weights, views and
batch order (`train.seed`), drawn apart for each entrant and each compare.

- negative control: the same configuration entered twice (`a`, `b`), different `train.seed`; the
  false separation rate is how often the verdict separates them (goal <= alpha);
- positive control: the configuration against itself handicapped (`--handicap epochs`: a quarter of
  the epochs; `views`: no random crop; `noviews`: no augmentation at all, the issue's "views that lose
  the crop and colour jitter"; `data`: a quarter of the training images); its true gap is the mean
  paired difference over every run of the benchmark; power is how often the verdict names the better
  one separated.

It writes one JSON (`--out`) and prints a table.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from augtune.analysis.verdict import verdict  # noqa: E402
from augtune.config import load_config  # noqa: E402

ALPHA = 0.05


def configs(data: str, tiny: bool, handicap: str) -> tuple:
    """(the control's configuration, its handicapped twin)."""
    sets = ["eval.metrics=[knn]", "eval.references=false", "eval.figures=[]", "train.num_threads=1",
            "dataset.val_fraction=0"]
    if data == "fashion":
        sets += ["dataset.name=fashion_mnist", "dataset.max_train=3000", "dataset.max_test=1000"]
    if tiny:
        sets += ["dataset.max_train=256", "dataset.max_test=128", "model.width=4", "train.epochs=2",
                 "train.batch_size=64"]
    base = load_config(ROOT / "examples" / "compare_digits.yaml", sets)
    worse = load_config(ROOT / "examples" / "compare_digits.yaml", sets + handicap_sets(base, handicap))
    return base, worse


HANDICAPS = {
    "epochs": "a quarter of the epochs",
    "views": "no random crop",
    "noviews": "no augmentation: the views lose the random crop, the colour jitter and the grayscale "
               "(the main job's views never flip)",
    "data": "a quarter of the training images",
}


def handicap_sets(base, handicap: str) -> list[str]:
    """The overrides that handicap `base` (`HANDICAPS` says each in words)."""
    if handicap == "epochs":
        return [f"train.epochs={max(1, base.train.epochs // 4)}"]
    if handicap == "views":
        return ["view.crop_scale=[1.0,1.0]"]
    if handicap == "noviews":
        return ["view.crop_scale=[1.0,1.0]", "view.jitter_p=0", "view.gray_p=0", "view.flip_p=0"]
    if base.dataset.max_train is None:
        raise SystemExit("--handicap data: the control's data needs dataset.max_train")
    return [f"dataset.max_train={max(1, base.dataset.max_train // 4)}"]


_RUNS: dict[tuple, dict] = {}  # (config, pair, train_seed) -> record: the positive control's unhandicapped
# runs are the negative control's first entrant's, trained once


def run(cfg, pair: int, train_seed: int, folder: Path, name: str) -> dict:
    """One real training run: `cfg` on split `pair` with weights and views of `train_seed`."""
    from dataclasses import replace

    from augtune.data import load_dataset
    from augtune.trainables import train_run

    key = (cfg, pair, train_seed)  # a Config is a frozen dataclass: hashable, equal by value
    if key not in _RUNS:
        cfg = replace(cfg, train=replace(cfg.train, seed=train_seed),
                      dataset=replace(cfg.dataset, split_seed=pair, resplit=True))
        _RUNS[key] = train_run(cfg, load_dataset(cfg.dataset), folder / f"{name}-{pair}-{train_seed}",
                               log=lambda s: None)
    record = _RUNS[key]
    # the verdict pairs by seed: pair i's two runs share it, as a compare's seed i does
    return {**record, "entrant": name, "method": name, "seed": pair}


def decide(records: list[dict], n: int) -> dict:
    """The verdict over the first `n` pairs: who leads, whether it is separated, the p-value."""
    kept = [r for r in records if r["seed"] < n]
    v = verdict(kept, ("knn_acc",), alpha=ALPHA)
    d = v.decisions["knn_acc"]
    other = next(r for r in v.rows if r.entrant != d.leader)
    return {"leader": d.leader, "separated": bool(d.separated), "p_holm": other.cells["knn_acc"].p_holm,
            "detectable": d.detectable}


def control(kind: str, compares: int, seeds: int, cfgs: tuple, folder: Path, log) -> dict:
    """`compares` real compares of two entrants over `seeds` pairs; decisions at n = 3 and `seeds`."""
    first, second = (cfgs[0], cfgs[0]) if kind == "negative" else cfgs
    names = ("a", "b") if kind == "negative" else ("full", "handicapped")
    looks = sorted({min(3, seeds), seeds})
    out = {"looks": looks, "compares": [], "gaps": []}
    for c in range(compares):
        records = []
        for pair in range(seeds):
            for k, (cfg, name) in enumerate(zip((first, second), names)):
                records.append(run(cfg, pair, 1000 * c + 2 * pair + k + 1, folder, name))
        by = {(r["entrant"], r["seed"]): r["final"]["knn_acc"] for r in records}
        out["gaps"] += [by[(names[0], p)] - by[(names[1], p)] for p in range(seeds)]
        out["compares"].append({str(n): decide(records, n) for n in looks})
        log(f"{kind} {c + 1}/{compares}: " + ", ".join(
            f"n={n} {'separated' if d['separated'] else 'not separated'} (leader {d['leader']})"
            for n, d in ((n, out["compares"][-1][str(n)]) for n in looks)))
    for n in looks:
        ds = [cmp[str(n)] for cmp in out["compares"]]
        hits = sum(d["separated"] and (kind == "negative" or d["leader"] == names[0]) for d in ds)
        key = "false_separation" if kind == "negative" else "power"
        out[f"{key}_n{n}"] = hits / len(ds)
        out[f"{key}_n{n}_se"] = math.sqrt(hits * (len(ds) - hits) / len(ds) ** 3)  # binomial
        stated = sorted(d["detectable"] for d in ds if d["detectable"])  # a separated pair states none
        out[f"detectable_n{n}"] = stated[len(stated) // 2] if stated else None
    gaps = torch.tensor(out.pop("gaps"), dtype=torch.float64)
    out["true_gap"] = float(gaps.mean())  # every pair's difference over the whole run
    out["true_gap_se"] = float(gaps.std() / math.sqrt(len(gaps))) if len(gaps) > 1 else None
    return out


def table(result: dict) -> str:
    rows = ["| control | n | rate | goal | measured gap (points) | detectable (median, points) |",
            "| --- | ---: | ---: | --- | ---: | ---: |"]
    for kind, key, goal in (("negative", "false_separation", f"<= {ALPHA}"), ("positive", "power", ">= 0.8")):
        part = result.get(kind)
        if part is None:
            continue
        for n in part["looks"]:
            det = part.get(f"detectable_n{n}")
            rows.append(f"| {kind} | {n} | {part[f'{key}_n{n}']:.2f} ± {part[f'{key}_n{n}_se']:.2f} | {goal} "
                        f"| {100 * part['true_gap']:.2f} | {'' if det is None else f'{100 * det:.1f}'} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--compares", type=int, default=20, help="real compares per control")
    ap.add_argument("--seeds", type=int, default=6, help="paired seeds per compare (the race's max)")
    ap.add_argument("--data", choices=("digits", "fashion"), default="digits")
    ap.add_argument("--handicap", choices=tuple(HANDICAPS), default="epochs", help="; ".join(
        f"{k}: {v}" for k, v in HANDICAPS.items()))
    ap.add_argument("--tiny", action="store_true", help="2 compares of 3 seeds, tiny data and network")
    ap.add_argument("--parts", default="negative,positive", help="comma-separated controls to run")
    ap.add_argument("--out", help="the JSON file")
    args = ap.parse_args(argv)
    if args.tiny:
        args.compares, args.seeds = 2, 3
    torch.set_num_threads(1)
    cfgs = configs(args.data, args.tiny, args.handicap)
    t0 = time.monotonic()
    result = {"schema": 1, "command": " ".join(sys.argv), "data": args.data, "handicap": args.handicap,
              "handicap_words": HANDICAPS[args.handicap],
              "compares": args.compares, "seeds": args.seeds, "alpha": ALPHA, "tiny": args.tiny}
    with tempfile.TemporaryDirectory(prefix="augtune-controls-") as tmp:
        for kind in args.parts.split(","):
            result[kind] = control(kind, args.compares, args.seeds, cfgs, Path(tmp), print)
    result["wall_s"] = round(time.monotonic() - t0, 1)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    print(table(result))
    return result


if __name__ == "__main__":
    main()
