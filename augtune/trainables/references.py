"""The reference rows, computed once: `raw` per data set, `random-init` per data set, model and seed.

Every run reports what its metrics give on the input itself (`raw`) and on the untrained backbone
(`random-init`); they do not depend on the method or its hyperparameters, so a search of many trials
computes each once and keeps it in `eval.reference_cache` (a search puts it beside its experiments),
keyed by a hash of everything it depends on. Two trials computing the same key at once both write
the same numbers (atomically), so no lock is needed.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Callable

from augtune.config import Config, to_dict
from augtune.records import versions, write_json_atomic

_EVAL_KEYS = ("metrics", "knn_k", "sr_epochs", "sr_lr", "sr_batch_size", "linear_val_fraction", "cluster",
              "umap_components", "umap_neighbors", "umap_min_dist", "umap_metric", "cluster_bandwidth",
              "cluster_quantile")


def reference_key(cfg: Config, kind: str) -> str:
    """What `kind` (raw, random-init) depends on, hashed: data set and evaluation; for random-init also
    the model, the seed (its weights) and the views' input normalisation (part of the data set)."""
    ev = to_dict(cfg.eval)
    parts = {"kind": kind, "dataset": to_dict(cfg.dataset), "eval": {k: ev[k] for k in _EVAL_KEYS},
             "augtune": versions().get("augtune")}
    if kind == "random-init":
        parts.update(model=to_dict(cfg.model), seed=cfg.train.seed)
    text = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def cached(cfg: Config, kind: str, compute: Callable[[], dict]) -> dict:
    """`compute()`, or what an earlier run with the same key stored in `eval.reference_cache`."""
    folder = cfg.eval.reference_cache
    if not folder:
        return compute()
    path = Path(folder) / f"{kind}-{reference_key(cfg, kind)}.json"
    try:
        return dict(json.loads(path.read_text())["metrics"])
    except (OSError, ValueError, KeyError, TypeError):
        pass  # not there yet, or unreadable: compute it again
    metrics = compute()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, {"kind": kind, "metrics": metrics})
    except OSError:
        pass  # a read-only or full cache costs only the time to compute it next time
    return metrics
