"""Is label-free selection any good here? RankMe, alignment and uniformity against the labels they stand in
for, over the trials of each entrant's search, and selection with few labels against full labels.

Run:  python benchmarks/label_free.py [--data digits,fashion_vectors,fashion_images,csv] [--trials 8]
                                      [--entrants simclr,pinda,nrcc] [--out label_free.json]
      python benchmarks/label_free.py --tiny      # every part, small, in well under a minute (the suite)

For each data set and entrant, `--trials` configurations of the entrant's registered search space (its
papers' defaults first, then seeded samples, as a search draws them) are each trained once, in this
process (`augtune.trainables.loop.Trainer`, the configuration a compare's trial would run, with
`dataset.evaluate_on: both`: trained on the training split less a stratified validation part). Every
trial is then scored on the validation split by
- k-NN (k = 5, on the training split's labels) and a linear probe: what a labelled search selects by;
- rankme, alignment, uniformity (augtune/eval/label_free.py) of the validation rows' features: no label;
- k-NN whose neighbours are only `labels_per_class` 1, 5, 25 labelled training rows per class (k = min(5, N),
  the same seeded rows as `dataset.labels_per_class`);
and on the test split by k-NN and the linear probe (what the chosen configuration is then worth).

Reported per data set and entrant: Spearman's rank correlation over the trials between each label-free
score (signed so that higher is better) and validation k-NN / linear accuracy, and the regret of each way
of choosing: the test k-NN accuracy of the configuration chosen by validation k-NN with all labels, less
that of the configuration each other score chooses (points; 0: the same choice or as good). Over
entrants and data sets: the mean and the worst regret.
"""
from __future__ import annotations

import argparse
import csv
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from augtune.config import from_dict, load_config, set_values, to_dict  # noqa: E402
from augtune.data import load_dataset  # noqa: E402
from augtune.data.datasets import few_label_rows  # noqa: E402
from augtune.eval import extract_features, knn_accuracy, linear_probe_accuracy  # noqa: E402
from augtune.eval.label_free import label_free_scores  # noqa: E402

FEW = (1, 5, 25)
FREE = ("rankme", "alignment", "uniformity")
SIGN = {"rankme": 1.0, "alignment": -1.0, "uniformity": -1.0}  # higher-is-better as signed


def data_config(name: str, tiny: bool, folder: Path) -> list[str]:
    """`--set` lines of each data set: the main job's model on digits, Fashion-MNIST as images and as
    vectors (a few thousand samples), and a CSV (scikit-learn's breast cancer features, 569 rows)."""
    small = ["dataset.max_train=300", "dataset.max_test=150"] if tiny else []
    if name == "digits":
        return ["dataset.name=digits", *small]
    if name == "fashion_images":
        return ["dataset.name=fashion_mnist", "dataset.max_train=3000", "dataset.max_test=1000", *small]
    if name == "fashion_vectors":
        return ["dataset.name=fashion_mnist", "dataset.max_train=3000", "dataset.max_test=1000",
                "dataset.as_vectors=true", "model.backbone=mlp", "model.hidden_dim=512",
                "model.embed_dim=128",
                "pinda.generator=mlp", *small]
    if name == "csv":
        from sklearn.datasets import load_breast_cancer

        x, y = load_breast_cancer(return_X_y=True)
        path = folder / "breast_cancer.csv"
        with open(path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow([f"f{i}" for i in range(x.shape[1])] + ["label"])
            w.writerows([[*(f"{v:g}" for v in row), int(c)] for row, c in zip(x, y)])
        return ["dataset.name=arrays", f"dataset.path={path}", "model.backbone=mlp", "model.hidden_dim=256",
                "model.embed_dim=64", "pinda.generator=mlp"]
    raise SystemExit(f"--data: unknown {name!r} (digits, fashion_images, fashion_vectors, csv)")


def trial_configs(base, entrant: str, trials: int, modality: str) -> list:
    """The entrant's search space's first `trials` configurations: its points to evaluate, then samples."""
    from augtune.search.searchers import sample_values
    from augtune.spaces import resolve_space

    cfg = from_dict(set_values(to_dict(base), {"method.augment": [] if entrant == "simclr" else [entrant],
                                               "search.space": "simclr" if entrant == "simclr" else entrant}))
    space = resolve_space(cfg.search, modality)
    held = {"train.epochs", "train.batch_size", "method.base", "method.augment", "train.seed"}
    points = [dict(p) for p in space.points_to_evaluate]
    values = points + [sample_values(space, i) for i in range(trials)]
    out = []
    for v in values[:trials]:
        v = {k: x for k, x in v.items() if k not in held}
        out.append((v, from_dict(set_values(to_dict(cfg), v))))
    return out


def score_trial(cfg, data) -> dict:
    """Train `cfg` on `data` (evaluate_on: both) and score it every way the benchmark compares."""
    from augtune.trainables.loop import Trainer

    trainer = Trainer(cfg, data, log=lambda s: None)
    trainer.fit()
    trainer.method.eval()
    fn = trainer.method.features
    feats = {part: extract_features(fn, getattr(data, f"x_{part}"), 256, trainer.device)
             for part in ("train", "val", "test")}
    y = {part: getattr(data, f"y_{part}") for part in ("train", "val", "test")}
    out = {"val_knn": knn_accuracy(feats["train"], y["train"], feats["val"], y["val"], k=5),
           "val_linear": linear_probe_accuracy(feats["train"], y["train"], feats["val"], y["val"], seed=0),
           "test_knn": knn_accuracy(feats["train"], y["train"], feats["test"], y["test"], k=5),
           "test_linear": linear_probe_accuracy(feats["train"], y["train"], feats["test"], y["test"], seed=0)}
    with torch.no_grad():
        out.update(label_free_scores(FREE, feats["val"], samples=cfg.eval.label_free_samples,
                                     pairs=trainer._view_pairs(fn, data.x_val, None)))
    for n in FEW:
        rows = torch.from_numpy(few_label_rows(y["train"].numpy(), n, cfg.dataset.split_seed))
        out[f"val_knn_{n}"] = knn_accuracy(feats["train"][rows], y["train"][rows], feats["val"], y["val"],
                                           k=min(5, n))
    return out


def spearman(a, b) -> float:
    from scipy.stats import spearmanr

    if len(set(a)) < 2 or len(set(b)) < 2:
        return float("nan")
    return float(spearmanr(a, b).statistic)


def summarise(trials: list[dict]) -> dict:
    """Rank correlations and regrets of one entrant's trials (see the module doc)."""
    chooser = {"val_knn (all labels)": "val_knn", **{f"{k} (no label)": k for k in FREE},
               **{f"val_knn, {n} labels/class": f"val_knn_{n}" for n in FEW}, "val_linear": "val_linear"}
    best = max(trials, key=lambda t: t["val_knn"])["test_knn"]
    regret = {}
    for name, key in chooser.items():
        sign = SIGN.get(key, 1.0)
        chosen = max(trials, key=lambda t: sign * t[key])
        regret[name] = 100 * (best - chosen["test_knn"])
    corr = {f"{k} ~ {acc}": spearman([SIGN[k] * t[k] for t in trials], [t[acc] for t in trials])
            for k in FREE for acc in ("val_knn", "val_linear")}
    spread = 100 * (max(t["test_knn"] for t in trials) - min(t["test_knn"] for t in trials))
    return {"spearman": corr, "regret_points": regret, "test_knn_spread_points": spread}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", default="digits,fashion_vectors,fashion_images,csv")
    p.add_argument("--entrants", default="simclr,pinda,nrcc")
    p.add_argument("--trials", type=int, default=8)
    p.add_argument("--epochs", type=int, default=None, help="default: the main job's 6 (the CSV: 20)")
    p.add_argument("--tiny", action="store_true", help="every part, small (the suite's smoke test)")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    if args.tiny:
        args.trials, args.data, args.entrants = 3, "digits,csv", "simclr,pinda"
    results: dict = {"trials": args.trials, "data": {}}
    start = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.data.split(","):
            sets = data_config(name, args.tiny, Path(tmp))
            epochs = args.epochs or (1 if args.tiny else 20 if name == "csv" else 6)
            base = load_config(ROOT / "examples" / "compare_digits.yaml",
                               [*sets, f"train.epochs={epochs}", "train.num_threads=1", "eval.figures=[]",
                                "eval.references=false", "eval.metrics=[knn]", "dataset.evaluate_on=both",
                                *(["train.batch_size=64", "model.width=4"] if args.tiny else [])])
            data = load_dataset(base.dataset)
            results["data"][name] = {}
            for entrant in args.entrants.split(","):
                trials = []
                for values, cfg in trial_configs(base, entrant, args.trials, data.modality):
                    t0 = time.time()
                    scores = score_trial(cfg, data)
                    trials.append({"params": values, **scores, "seconds": time.time() - t0})
                    print(f"{name} {entrant}: {json.dumps({k: round(v, 4) for k, v in scores.items()})}",
                          flush=True)
                results["data"][name][entrant] = {"trials": trials, **summarise(trials)}
    regrets: dict = {}
    for by_entrant in results["data"].values():
        for r in by_entrant.values():
            for k, v in r["regret_points"].items():
                regrets.setdefault(k, []).append(v)
    results["regret_over_searches"] = {k: {"mean": float(np.mean(v)), "worst": float(np.max(v)),
                                           "searches": len(v)} for k, v in regrets.items()}
    results["seconds"] = time.time() - start
    print(table(results))
    if args.out:
        args.out.write_text(json.dumps(results, indent=1, default=float))
    return results


def table(results: dict) -> str:
    lines = ["| chosen by | mean regret (points of test k-NN) | worst | searches |",
             "| :--- | ---: | ---: | ---: |"]
    for k, r in results["regret_over_searches"].items():
        lines.append(f"| {k} | {r['mean']:.2f} | {r['worst']:.2f} | {r['searches']} |")
    lines += ["", "| data | entrant | rankme ~ val k-NN | rankme ~ val linear | alignment ~ val k-NN | "
              "uniformity ~ val k-NN | test k-NN spread |",
              "| :--- | :--- | ---: | ---: | ---: | ---: | ---: |"]
    for data, by in results["data"].items():
        for entrant, r in by.items():
            s = r["spearman"]
            lines.append(f"| {data} | {entrant} | {s['rankme ~ val_knn']:.2f} | "
                         f"{s['rankme ~ val_linear']:.2f} | "
                         f"{s['alignment ~ val_knn']:.2f} | {s['uniformity ~ val_knn']:.2f} | "
                         f"{r['test_knn_spread_points']:.1f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
