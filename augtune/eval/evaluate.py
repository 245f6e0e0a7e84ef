"""The one evaluation entry point: named metrics from a registry, parameters from `EvalConfig`.

Each registry entry takes ``(train_x, train_y, test_x, test_y, num_classes, cfg, seed)`` and returns
a flat dict of the metric names of docs/contributing.md (Naming) it produces. Adding a metric (e.g.
``cluster`` for UMAP + GridShift) is one function and an entry in each of ``METRICS``, ``OUTPUTS`` and
``DESCRIPTIONS`` here.
"""
from __future__ import annotations

from typing import Callable

from augtune.config import EvalConfig
from augtune.eval.clustering import cluster_scores, kmeans_scores
from augtune.eval.knn import knn_accuracy
from augtune.eval.label_free import label_free_scores
from augtune.eval.probes import linear_probe_accuracy, softmax_regression_accuracy

Metric = Callable[..., dict[str, float]]


def _knn(train_x, train_y, test_x, test_y, num_classes: int, cfg: EvalConfig, seed: int) -> dict[str, float]:
    return {
        "knn_acc": knn_accuracy(
            train_x, train_y, test_x, test_y, k=cfg.knn_k, batch_size=cfg.batch_size or 1024
        )
    }


def _sr(train_x, train_y, test_x, test_y, num_classes: int, cfg: EvalConfig, seed: int) -> dict[str, float]:
    return {
        "sr_acc": softmax_regression_accuracy(
            train_x,
            train_y,
            test_x,
            test_y,
            num_classes,
            epochs=cfg.sr_epochs,
            lr=cfg.sr_lr,
            batch_size=cfg.sr_batch_size,
            seed=seed,
        )
    }


def _linear(
    train_x, train_y, test_x, test_y, num_classes: int, cfg: EvalConfig, seed: int
) -> dict[str, float]:
    return {"linear_acc": linear_probe_accuracy(train_x, train_y, test_x, test_y,
                                                val_fraction=cfg.linear_val_fraction, seed=seed)}


def _kmeans(
    train_x, train_y, test_x, test_y, num_classes: int, cfg: EvalConfig, seed: int
) -> dict[str, float]:
    # Clustering scores are computed on the TEST features: they measure the held-out data's
    # structure, and the test split is the smaller one (k-means cost grows with N).
    return kmeans_scores(test_x, test_y, k=num_classes, seed=seed)


def _cluster(
    train_x, train_y, test_x, test_y, num_classes: int, cfg: EvalConfig, seed: int
) -> dict[str, float]:
    # UMAP + GridShift on the test features, k not given (NRCC 3.6.2); eval.cluster switches the algorithm
    return cluster_scores(test_x, test_y, cfg.cluster, k=num_classes, components=cfg.umap_components,
                          neighbors=cfg.umap_neighbors, min_dist=cfg.umap_min_dist, metric=cfg.umap_metric,
                          bandwidth=cfg.cluster_bandwidth, quantile=cfg.cluster_quantile, seed=seed)


def _label_free(name: str) -> Metric:
    # on the held-out features (the test or validation split, or the unlabelled rows of data without
    # labels), never their labels: a fixed subsample of them (augtune.eval.label_free)
    def score(train_x, train_y, test_x, test_y, num_classes: int, cfg: EvalConfig, seed: int,
              pairs=None) -> dict[str, float]:
        return label_free_scores((name,), test_x, samples=cfg.label_free_samples, pairs=pairs)
    return score


METRICS: dict[str, Metric] = {  # what each produces: OUTPUTS; what it measures: DESCRIPTIONS
    "knn": _knn,
    "sr": _sr,
    "linear": _linear,
    "kmeans": _kmeans,
    "cluster": _cluster,
    "rankme": _label_free("rankme"),
    "uniformity": _label_free("uniformity"),
    "alignment": _label_free("alignment"),
}


# The metric names each entry produces: what a search may optimise (checked before Ray starts).
OUTPUTS: dict[str, tuple[str, ...]] = {
    "knn": ("knn_acc",),
    "sr": ("sr_acc",),
    "linear": ("linear_acc",),
    "kmeans": ("kmeans_acc", "kmeans_nmi", "kmeans_ari"),
    "cluster": ("cluster_acc", "cluster_nmi", "cluster_ari", "cluster_k"),
    "rankme": ("rankme",),
    "uniformity": ("uniformity",),
    "alignment": ("alignment",),
}

# What each entry measures, said once: the docs hook (docs/hooks/tables.py) writes the metrics table of
# docs/reference/evaluation.md from this, `OUTPUTS` and the names of `METRICS`, and stops the build when
# the three name different entries. Markdown; the settings named are in the config reference.
DESCRIPTIONS: dict[str, str] = {
    "knn": "k-NN accuracy (k = `eval.knn_k`, cosine, the train split as memory)",
    "sr": "softmax regression: one linear layer trained with Adam (`eval.sr_lr`, `eval.sr_epochs`, "
          "`eval.sr_batch_size`: PiNDA B.3's settings by default)",
    "linear": "L2 logistic regression, C chosen on a stratified validation part of train "
              "(`eval.linear_val_fraction`)",
    "kmeans": "k-means with k = the number of classes, on the test features; accuracy by Hungarian matching "
              "on the rectangular confusion matrix",
    "cluster": "clustering *without* k, as NRCC §3.6.2 (UMAP, then `eval.cluster`: GridShift by default); "
               "`cluster_k` is how many clusters it found",
    "rankme": "effective rank of the held-out features (RankMe); no label read",
    "uniformity": "Wang & Isola's uniformity of the held-out features; lower is better; no label read",
    "alignment": "Wang & Isola's alignment of two training views of each held-out row; lower is better; "
                 "no label read",
}


def evaluate(train_x, train_y, test_x, test_y, num_classes: int, cfg: EvalConfig, metrics: tuple[str, ...],
             seed: int = 0, pairs=None) -> dict[str, float]:
    """Run the named ``metrics`` (keys of :data:`METRICS`) and return one flat ``{name: float}``.

    Features are float (N, D) and labels int (N,), torch tensors (any device) or numpy arrays.
    Clustering metrics use the test split only, the label-free ones its features only (``pairs(rows)``:
    the features of two views of those rows, for ``alignment``). ``seed`` seeds each metric's own
    generator; the global torch / numpy RNG state is never consumed.
    """
    unknown = [m for m in metrics if m not in METRICS]
    if unknown:
        raise KeyError(f"unknown metric(s) {unknown} (known: {', '.join(METRICS)})")
    out: dict[str, float] = {}
    for name in dict.fromkeys(metrics):  # in order, once each
        extra = {"pairs": pairs} if name == "alignment" else {}
        out.update(METRICS[name](train_x, train_y, test_x, test_y, num_classes, cfg, seed, **extra))
    return out
