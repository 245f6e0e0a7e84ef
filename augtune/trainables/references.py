"""The reference rows, computed once: `raw` per data set, `random-init` per data set, model and seed.

Every run reports what its metrics give on the input itself (`raw`) and on the untrained backbone
(`random-init`); they do not depend on the method or its hyperparameters, so a search of many trials
computes each once and keeps it in `eval.reference_cache` (a search puts it beside its experiments),
keyed by a hash of everything it depends on; trials that start together compute each key once, under a
lock (`cached`).
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Callable

from augtune.config import Config, to_dict
from augtune.records import read_json, versions, write_json_atomic

_EVAL_KEYS = ("metrics", "knn_k", "sr_epochs", "sr_lr", "sr_batch_size", "linear_val_fraction", "cluster",
              "umap_components", "umap_neighbors", "umap_min_dist", "umap_metric", "cluster_bandwidth",
              "cluster_quantile", "label_free_samples")


def reference_key(cfg: Config, kind: str) -> str:
    """What `kind` (raw, random-init) depends on, hashed: data set and evaluation; for random-init also
    the model, the seed (its weights) and the views' input normalisation (part of the data set)."""
    ev = to_dict(cfg.eval)
    parts = {"kind": kind, "dataset": to_dict(cfg.dataset), "eval": {k: ev[k] for k in _EVAL_KEYS},
             "augtune": versions().get("augtune")}
    if kind == "random-init":
        parts.update(model=to_dict(cfg.model), seed=cfg.train.seed)
    if "alignment" in cfg.eval.metrics:  # scored on two views of each sample: the views matter
        parts.update(view=to_dict(cfg.view))
    text = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def cached(cfg: Config, computes: dict[str, Callable[[], dict]]) -> dict[str, dict]:
    """`{kind: compute()}` for each reference kind, or what an earlier run with the same key stored in
    `eval.reference_cache`.

    Trials that start together find the cache empty together: each kind is computed under a lock (one
    file per key, `fcntl.flock`, released when its holder ends, however it ends), so that one process
    computes it and the others read it. A process that finds one kind being computed computes another
    meanwhile, and waits only when every kind left is another's (on Fashion-MNIST the first two trials of
    a search computed both rows each, 260 CPU s apiece)."""
    folder = cfg.eval.reference_cache
    if not folder:
        return {kind: compute() for kind, compute in computes.items()}
    out: dict[str, dict] = {}
    pending = list(computes)
    while pending:
        for kind in list(pending):
            got = _cached(cfg, kind, computes[kind], wait=False)
            if got is not None:
                out[kind] = got
                pending.remove(kind)
        if pending:  # every kind left is being computed elsewhere: wait for the first
            kind = pending.pop(0)
            out[kind] = _cached(cfg, kind, computes[kind], wait=True)
    return {kind: out[kind] for kind in computes}


def _cached(cfg: Config, kind: str, compute: Callable[[], dict], wait: bool) -> dict | None:
    """The stored metrics of `kind`, else computed under its lock; None when another process holds the
    lock and not `wait`."""
    path = Path(cfg.eval.reference_cache) / f"{kind}-{reference_key(cfg, kind)}.json"
    stored = _read(path)
    if stored is not None:
        return stored
    try:
        import fcntl

        lock_path = path.parent / LOCKS / f"{path.stem}.lock"
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        lock = open(lock_path, "a")
    except (ImportError, OSError):  # no locks here (a read-only cache, another platform): compute
        return _store(path, kind, compute())
    with lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            return None
        try:
            stored = _read(path)  # its holder may have just finished it
            return stored if stored is not None else _store(path, kind, compute())
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


LOCKS = "locks"  # in the cache folder: one lock file per key, kept (unlinking one would race its waiters)


def _read(path: Path) -> dict | None:
    try:
        return dict(read_json(path)["metrics"])
    except (OSError, ValueError, KeyError, TypeError):
        return None  # not there yet, or unreadable: compute it again


def _store(path: Path, kind: str, metrics: dict) -> dict:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, {"kind": kind, "metrics": metrics})
    except OSError:
        pass  # a read-only or full cache costs only the time to compute it next time
    return metrics
