"""DiffAug: originals beside three generated positives (Fig. 3/6), and the lambda curve of a sweep (3.6).

Images are drawn as a grid (rows: test samples; columns: Ori, Aug1-3). Vectors as the paper's violin
plots: one panel per test sample, the distribution of its feature values in the original and in
each generated positive. With runs at several `diffaug.lam` on a data set, another figure plots the
final metrics (mean +- std over the runs at each lambda) against lambda.
"""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np

from augtune.data.batches import as_float
from augtune.plots import PlotError, save

_SHOW = 6  # test samples shown per run
_POSITIVES = 3  # Aug1..Aug3
_CURVE_METRICS = ("knn_acc", "linear_acc", "sr_acc", "kmeans_nmi")


def _pick(y, n: int) -> list[int]:
    """The first test sample of each class, then the next ones: n positions."""
    y = np.asarray(y)
    first = [int(np.flatnonzero(y == c)[0]) for c in np.unique(y)]
    taken = set(first)
    rest = [i for i in range(min(len(y), n + len(first))) if i not in taken]
    return (first + rest)[:n]


def _samples_figure(run) -> tuple[str, object]:
    import matplotlib.pyplot as plt
    import torch

    aug = run.augmentation("diffaug")
    data = run.data
    idx = _pick(data.y_test, _SHOW)
    x = as_float(data.x_test[idx].to(run.device))  # (S, *shape)
    torch.manual_seed(run.cfg.train.seed)
    gens = [aug.generate(run.method, x).cpu() for _ in range(_POSITIVES)]  # the run's own sampler
    x = x.cpu()
    cols = ["Ori"] + [f"Aug{k + 1}" for k in range(_POSITIVES)]
    note = "" if int(aug.updates) else " (generator never trained)"
    lam = run.cfg.diffaug.lam
    if data.modality == "image":
        fig, axes = plt.subplots(
            len(idx), len(cols), figsize=(1.6 * len(cols), 1.6 * len(idx)), squeeze=False
        )
        for r in range(len(idx)):
            for c, img in enumerate([x[r]] + [g[r] for g in gens]):
                ax = axes[r, c]
                arr = img.clamp(0, 1).permute(1, 2, 0).numpy()
                ax.imshow(
                    arr[..., 0] if arr.shape[-1] == 1 else arr,
                    cmap="gray" if arr.shape[-1] == 1 else None,
                    vmin=0,
                    vmax=1,
                )
                ax.set_xticks([])
                ax.set_yticks([])
                if r == 0:
                    ax.set_title(cols[c], fontsize=9)
            axes[r, 0].set_ylabel(data.classes[int(data.y_test[idx[r]])], fontsize=8)
    else:
        fig, axes = plt.subplots(1, len(idx), figsize=(2.6 * len(idx), 3), squeeze=False)
        for r, ax in enumerate(axes[0]):
            values = [x[r].flatten().numpy()] + [g[r].flatten().numpy() for g in gens]
            ax.violinplot(values, showmedians=True)
            ax.set_xticks(range(1, len(cols) + 1), cols, fontsize=8)
            ax.set_title(f"class {data.classes[int(data.y_test[idx[r]])]}", fontsize=9)
        axes[0, 0].set_ylabel("feature value")
    fig.suptitle(f"{run.label}: test samples and generated positives, lambda={lam}{note}", fontsize=10)
    return f"diffaug_samples_{run.cfg.dataset.name}_lam{lam}_seed{run.cfg.train.seed}", fig


def _lambda_curve(runs, dataset: str) -> tuple[str, object] | None:
    import matplotlib.pyplot as plt

    by_lam: dict[float, list[dict]] = defaultdict(list)
    for run in runs:
        by_lam[run.cfg.diffaug.lam].append(run.record.get("final") or {})
    if len(by_lam) < 2:
        return None
    lams = sorted(by_lam)
    metrics = [m for m in _CURVE_METRICS if any(m in f for fs in by_lam.values() for f in fs)]
    if not metrics:
        return None
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for m in metrics:
        mean = [np.mean([f[m] for f in by_lam[lam] if m in f]) if any(m in f for f in by_lam[lam]) else np.nan
                for lam in lams]
        std = [np.std([f[m] for f in by_lam[lam] if m in f]) if any(m in f for f in by_lam[lam]) else np.nan
               for lam in lams]
        ax.errorbar(lams, mean, yerr=std, marker="o", capsize=3, label=m)
    ax.set_xlabel("lambda (diffaug.lam)")
    ax.set_ylabel("final metric")
    n = sum(len(v) for v in by_lam.values())
    ax.set_title(f"DiffAug lambda sweep on {dataset} ({n} runs, mean +- std)", fontsize=10)
    ax.legend(fontsize=8)
    return f"diffaug_lambda_{dataset}", fig


def plot(runs, out: Path) -> list[Path]:
    """Originals beside generated positives; the lambda curve of a sweep (DiffAug 3.6)."""
    return [save(fig, out / f"{name}.png") for name, fig in figures(runs).items()]


def figures(runs) -> dict:
    """The samples figure of each data set and lambda, and each data set's lambda curve, by name."""
    runs = [r for r in runs if "diffaug" in r.cfg.method.augment]
    if not runs:
        raise PlotError("no run with diffaug in method.augment among these")
    drawn = {}
    seen: set[tuple] = set()
    for run in runs:  # one sample figure per data set and lambda (a sweep's seeds look alike)
        key = (run.cfg.dataset.name, run.cfg.diffaug.lam)
        if key not in seen:
            seen.add(key)
            name, fig = _samples_figure(run)
            drawn[name] = fig
    for dataset in dict.fromkeys(r.cfg.dataset.name for r in runs):  # a lambda curve per data set
        curve = _lambda_curve([r for r in runs if r.cfg.dataset.name == dataset], dataset)
        if curve is not None:
            drawn[curve[0]] = curve[1]
    return drawn
