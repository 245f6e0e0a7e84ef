"""GridShift (Kumar et al., CVPR 2022): mode-seeking clustering on a grid, linear in N for fixed d.

Points are binned into cells of side h by floor. Every occupied cell carries its point count and
the mean of its points. Each iteration, every cell moves to the count-weighted mean of the points
in its 3^d neighbouring cells (itself included); cells whose new position falls in the same bin
merge (counts add, positions are count-weighted); every cell moves at once (simultaneous
relabelling). It stops when no cell moves to another bin. Points belong to the cell their own cell
merged into. Everything is numpy array work: one sort of the N points, then per iteration a
3^d-fold lookup in the sorted keys of the M << N occupied cells.
"""
from __future__ import annotations

import itertools

import numpy as np

# 3^6 = 729 lookups per iteration; GridShift is for a few dimensions (NRCC: UMAP to 2-3)
_NEIGHBOURS_LIMIT = 6


def auto_bandwidth(x: np.ndarray, quantile: float = 0.05, n_samples: int = 2000, seed: int = 0) -> float:
    """scikit-learn's MeanShift rule (`estimate_bandwidth`): the mean distance of a point to its
    `quantile * n`-th nearest neighbour, on a seeded subsample of at most `n_samples` points
    (O(n_samples^2), not O(N^2)). The quantile should be below the smallest cluster's share of the
    points: scikit-learn's 0.3 merges 10 equal classes; 0.05 suits up to ~20."""
    from sklearn.cluster import estimate_bandwidth

    x = np.asarray(x, dtype=np.float64)
    if len(x) < 2:
        return 1.0  # one point is one cluster at any side
    h = estimate_bandwidth(x, quantile=quantile, n_samples=min(len(x), n_samples), random_state=seed)
    return float(h) if h > 0 else 1.0  # all points equal: any side puts them in one cell


def _encode(cells: np.ndarray, lo: np.ndarray, span: np.ndarray) -> np.ndarray:
    """(M, d) integer cells -> (M,) int64 keys, one per cell, order-preserving per dimension."""
    shifted = cells - lo  # >= 0
    key = np.zeros(len(cells), dtype=np.int64)
    for j in range(cells.shape[1]):
        key = key * span[j] + shifted[:, j]
    return key


def gridshift(x, bandwidth: float | None = None, max_iter: int = 300,
              quantile: float = 0.05) -> tuple[np.ndarray, np.ndarray]:
    """Cluster (N, d) points; returns (labels (N,) contiguous from 0, centres (K, d)).

    `bandwidth`: the cell side h; None: :func:`auto_bandwidth` at `quantile`. Labels are numbered by the
    order of their centres' bins, so they do not depend on the order of the points.
    """
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2 or len(x) == 0:
        raise ValueError(f"gridshift: expected (N, d) points with N >= 1, got shape {x.shape}")
    n, d = x.shape
    if d > _NEIGHBOURS_LIMIT:
        raise ValueError(f"gridshift: {d} dimensions means 3^{d} neighbour cells per cell; reduce to "
                         f"<= {_NEIGHBOURS_LIMIT} first (NRCC: UMAP to 2-3)")
    h = auto_bandwidth(x, quantile) if bandwidth is None else float(bandwidth)
    if not h > 0:
        raise ValueError(f"gridshift: bandwidth must be > 0, got {bandwidth}")
    offsets = np.array(list(itertools.product((-1, 0, 1), repeat=d)), dtype=np.int64)  # (3^d, d)

    cells = np.floor(x / h).astype(np.int64)  # (N, d)
    lo = cells.min(0) - 2  # room for neighbours and a little drift
    span = cells.max(0) - lo + 3
    _, point_cell, counts = np.unique(_encode(cells, lo, span), return_inverse=True, return_counts=True)
    m = len(counts)
    sums = np.zeros((m, d))
    np.add.at(sums, point_cell, x)
    pos = sums / counts[:, None]  # (M, d) each cell's mean position
    owner = np.arange(m)  # original cell -> current cell

    for _ in range(max_iter):
        cur = np.floor(pos / h).astype(np.int64)  # (M, d) the bins the cells are in
        lo = np.minimum(lo, cur.min(0) - 2)
        span = np.maximum(span, cur.max(0) - lo + 3)
        keys = _encode(cur, lo, span)
        order = np.argsort(keys)
        sorted_keys = keys[order]
        w_sum = np.zeros((len(pos), d))
        w_count = np.zeros(len(pos))
        mass = pos * counts[:, None]  # (M, d) sum of the points each cell holds
        for off in offsets:
            nb = _encode(cur + off, lo, span)  # the neighbour bin of every cell
            at = np.searchsorted(sorted_keys, nb)
            at = np.minimum(at, len(sorted_keys) - 1)
            hit = sorted_keys[at] == nb
            src = order[at[hit]]  # the cell occupying that neighbour bin
            w_sum[hit] += mass[src]
            w_count[hit] += counts[src]
        new_pos = w_sum / w_count[:, None]  # count-weighted mean of the 3^d neighbourhood
        new_cells = np.floor(new_pos / h).astype(np.int64)
        moved = (new_cells != cur).any(axis=1)
        # merge cells that now share a bin (simultaneous: all moves above used the old positions)
        lo = np.minimum(lo, new_cells.min(0) - 2)
        span = np.maximum(span, new_cells.max(0) - lo + 3)
        _, merged, new_counts = np.unique(_encode(new_cells, lo, span), return_inverse=True,
                                          return_counts=True)
        new_counts = np.bincount(merged, weights=counts).astype(np.int64)
        mass_new = np.zeros((len(new_counts), d))
        np.add.at(mass_new, merged, new_pos * counts[:, None])
        owner = merged[owner]
        pos, counts = mass_new / new_counts[:, None], new_counts
        if not moved.any():
            break

    # labels by the order of the final bins' keys (np.unique sorted them): independent of point order
    return owner[point_cell], pos
