"""UMAP of the test features coloured by true class and by the cluster found without k (NRCC Fig. 1).

One PNG per run, `umap_<label>.png`: two scatter panels of the same embedding (eval.umap_* settings,
the run's seed), left by class, right by the `eval.cluster` algorithm's clusters, with the scores in
the title. Works for any run: the features are those evaluation sees (`eval.encoder`).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from augtune.plots import Run, run_stem, save


def plot(runs: list[Run], out: Path) -> list[Path]:
    """UMAP scatter of each run's test features: by class and by cluster found (NRCC Fig. 1)."""
    return [save(fig, out / f"{name}.png") for name, fig in figures(runs).items()]


def figures(runs: list[Run]) -> dict:
    """Each run's UMAP figure, by name (`umap_<run>`)."""
    import matplotlib.pyplot as plt
    from sklearn.metrics import adjusted_rand_score

    from augtune.eval.clustering import cluster_accuracy, umap_embed
    from augtune.eval.gridshift import auto_bandwidth, gridshift

    drawn = {}
    for run in runs:
        e, seed = run.cfg.eval, run.cfg.train.seed
        y = run.data.y_test.numpy()
        emb = umap_embed(run.features("test"), 2, e.umap_neighbors, e.umap_min_dist, e.umap_metric, seed)
        h = e.cluster_bandwidth or auto_bandwidth(emb, e.cluster_quantile, seed=seed)
        found = gridshift(emb, h)[0]
        fig, axes = plt.subplots(1, 2, figsize=(10, 4.6))
        for ax, labels, title in ((axes[0], y, "true class"),
                                  (axes[1], found, f"GridShift: {len(np.unique(found))} clusters")):
            ax.scatter(emb[:, 0], emb[:, 1], c=labels, cmap="tab20", s=3, linewidths=0)
            ax.set_title(title, fontsize=10)
            ax.set_xticks([])
            ax.set_yticks([])
        handles, _ = axes[0].collections[0].legend_elements(num=None)  # one entry per class, sorted
        names = [run.data.classes[int(c)] if int(c) < len(run.data.classes) else str(c) for c in np.unique(y)]
        axes[0].legend(handles, names, title="class", fontsize=7, title_fontsize=8, loc="center right",
                       bbox_to_anchor=(-0.02, 0.5), frameon=False, markerscale=0.8)
        fig.suptitle(
            f"{run.label}: UMAP of {run.data.name} test features — cluster ACC "
            f"{cluster_accuracy(y, found):.3f}, ARI {adjusted_rand_score(y, found):.3f}",
            fontsize=10,
        )
        drawn[f"umap_{run_stem(run)}"] = fig
    return drawn
