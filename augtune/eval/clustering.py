"""Clustering scores of frozen features: k-means with k = number of classes, and the Hungarian
cluster accuracy that every `*_acc` clustering score uses.

A clustering metric is one function ``(x, y, ...) -> {"<prefix>_acc", "<prefix>_nmi", ...}`` here
plus one entry in :data:`augtune.eval.evaluate.METRICS`.
"""
from __future__ import annotations

import numpy as np

# scipy and scikit-learn are imported where a score is computed: a trial that never clusters (most
# searches' per-epoch metrics) does not pay their ~1 s of imports in every process.


def _numpy(a) -> np.ndarray:
    """torch tensor (any device) or array-like -> numpy array."""
    if hasattr(a, "detach"):
        a = a.detach().cpu().numpy()
    return np.asarray(a)


def cluster_accuracy(y_true, y_pred) -> float:
    """Fraction of points whose cluster is matched to their class by the best one-to-one matching.

    The matching is the Hungarian assignment on the rectangular (clusters x classes) contingency
    matrix, so it is defined for any number of clusters and classes and for any label values
    (e.g. classes {2, 5, 9}, clusters {0, 7}). Each cluster is matched to at most one class and
    vice versa; points in unmatched clusters count as wrong. One cluster holding everything scores
    the majority-class fraction.
    """
    y_true, y_pred = _numpy(y_true).ravel(), _numpy(y_pred).ravel()
    if y_true.shape != y_pred.shape:
        raise ValueError(f"cluster_accuracy: {len(y_true)} labels but {len(y_pred)} cluster assignments")
    if len(y_true) == 0:
        raise ValueError("cluster_accuracy: no points")
    _, cls = np.unique(y_true, return_inverse=True)
    _, clu = np.unique(y_pred, return_inverse=True)
    counts = np.zeros((clu.max() + 1, cls.max() + 1), dtype=np.int64)  # (clusters, classes)
    np.add.at(counts, (clu, cls), 1)
    from scipy.optimize import linear_sum_assignment

    rows, cols = linear_sum_assignment(counts, maximize=True)
    return float(counts[rows, cols].sum() / len(y_true))


def kmeans_scores(x, y, k: int, seed: int = 0) -> dict[str, float]:
    """k-means (k clusters, 10 k-means++ restarts, ``random_state=seed``) on L2-normalised features.

    L2-normalised, not standardised: the contrastive objectives compare features by cosine
    similarity, so direction carries the information and the norm is free to vary; this is also
    the geometry k-NN uses (:func:`augtune.eval.knn.knn_accuracy`). Returns ``kmeans_acc``
    (Hungarian, :func:`cluster_accuracy`), ``kmeans_nmi`` and ``kmeans_ari``.
    """
    x = _numpy(x).astype(np.float64)  # (N, D)
    y = _numpy(y).ravel()
    x = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
    return _label_scores("kmeans", y, _kmeans(x, k, seed))


def _kmeans(x: np.ndarray, k: int, seed: int) -> np.ndarray:
    """scikit-learn's k-means (10 k-means++ restarts, seeded): the cluster of each row."""
    from sklearn.cluster import KMeans

    return KMeans(n_clusters=k, n_init=10, random_state=seed).fit_predict(x)


def _label_scores(prefix: str, y: np.ndarray, pred: np.ndarray) -> dict[str, float]:
    """``<prefix>_acc`` (Hungarian), ``_nmi`` and ``_ari`` (scikit-learn's) of clusters `pred` against `y`."""
    from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score

    return {
        f"{prefix}_acc": cluster_accuracy(y, pred),
        f"{prefix}_nmi": float(normalized_mutual_info_score(y, pred)),
        f"{prefix}_ari": float(adjusted_rand_score(y, pred)),
    }


def _umap():
    """umap-learn, with numba's on-disk cache switched on for its kernels and pynndescent's.

    umap-learn compiles ~130 numba kernels on first use without caching them (pynndescent caches about
    half of its own): ~9.5 CPU s in every process that runs UMAP, each trial process of a search that
    clusters and each figure. Cached (in $NUMBA_CACHE_DIR, which a trial sets, or numba's default place),
    a later process loads them instead: the same machine code, UMAP's fit 9.5 -> 0.9 CPU s for 540 points
    here. A kernel numba cannot cache is compiled as before."""
    import sys

    import umap
    from numba.core.registry import CPUDispatcher

    if not getattr(umap, "_augtune_cached", False):
        for name, module in list(sys.modules.items()):
            if module is None or not name.startswith(("umap", "pynndescent")):
                continue
            for kernel in list(vars(module).values()):
                if isinstance(kernel, CPUDispatcher) and type(kernel._cache).__name__ == "NullCache":
                    kernel.enable_caching()
        umap._augtune_cached = True
    return umap


def umap_embed(x, components: int = 2, neighbors: int = 30, min_dist: float = 0.0, metric: str = "cosine",
               seed: int = 0) -> np.ndarray:
    """(N, components) UMAP embedding of (N, D) features, seeded (umap-learn, single-threaded then)."""
    import warnings

    umap = _umap()
    x = _numpy(x).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "n_jobs overridden by setting random_state": wanted
        reducer = umap.UMAP(n_components=components, n_neighbors=min(neighbors, len(x) - 1),
                            min_dist=min_dist, metric=metric, random_state=seed)
        return reducer.fit_transform(x)


def cluster_scores(x, y, algorithm: str = "gridshift", *, k: int | None = None, components: int = 2,
                   neighbors: int = 30, min_dist: float = 0.0, metric: str = "cosine",
                   bandwidth: float | None = None, quantile: float = 0.05, seed: int = 0) -> dict[str, float]:
    """UMAP, then clustering without k (NRCC 3.6.2): ``cluster_acc``/``_nmi``/``_ari`` and ``cluster_k``
    (how many clusters were found). `algorithm`: gridshift (augtune.eval.gridshift, cell side h),
    meanshift (scikit-learn's flat kernel with bin seeding, radius 1.5 h: the half-width of GridShift's
    3-cell window, so that both average over the same neighbourhood) or kmeans (k given: the ablation
    row)."""
    from augtune.eval.gridshift import auto_bandwidth, gridshift

    y = _numpy(y).ravel()
    emb = umap_embed(x, components, neighbors, min_dist, metric, seed).astype(np.float64)
    if algorithm == "kmeans":
        pred = _kmeans(emb, k, seed)
    else:
        h = bandwidth if bandwidth is not None else auto_bandwidth(emb, quantile, seed=seed)
        if algorithm == "gridshift":
            pred = gridshift(emb, h)[0]
        elif algorithm == "meanshift":
            from sklearn.cluster import MeanShift

            pred = MeanShift(bandwidth=1.5 * h, bin_seeding=True).fit_predict(emb)
        else:
            raise ValueError(f"eval.cluster: unknown algorithm {algorithm!r}")
    return {**_label_scores("cluster", y, pred), "cluster_k": float(len(np.unique(pred)))}
