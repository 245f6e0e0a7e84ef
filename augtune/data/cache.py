"""One read-only copy of a prepared data set per node, shared by every trial that runs there.

The first process to need a data set prepares it (reads, subsamples, converts) and writes its arrays as
``.npy`` files into ``<folder>/<key>/``, where the key hashes everything the data depends on; every
process, the first included, then maps those files with ``np.load(mmap_mode="c")``. The pages of a
mapped file live once in the kernel's page cache whatever the number of processes mapping it, so four
concurrent trials hold one copy (their PSS, the proportional share, splits it four ways), and the
second trial neither reads the source files nor decodes images again.

Why a memory-mapped file rather than Ray's object store (``ray.put`` once, zero-copy ``ray.get``):
the data layer stays free of Ray (``augtune train`` in one process, a laptop, a test), the copy
survives the driver, a crashed search and the next search on the same node, and the same code serves
the DDP workers of one trial and the trials of a search. The object store would need the driver to
load every data set up front and would hold it in shared memory that cannot be paged out.

Writing is atomic (a temporary folder renamed into place) under an exclusive ``flock`` on
``<key>.lock``: concurrent first trials wait for one to build, then map its copy. A copy is trusted
only when its ``meta.json`` is complete and every file's size, ``.npy`` header and SHA-256 digest
(checked on every open: ~0.8 GB/s, 0.07 s for Fashion-MNIST) match what was written; anything else —
a partial, truncated or altered copy — is removed and rebuilt. Copy-on-write mappings (``"c"``) let a
process modify its view without touching the file or the other processes' data. A folder that cannot
be written (read-only, disk full) costs only the sharing: the process keeps its own copy, with a warning.
Every open marks a copy as used (its ``meta.json``'s modification time); building a new copy removes
the copies no process has opened for :data:`KEEP_DAYS` days (those whose lock is free: a process that
has one mapped keeps its pages). Remove the folder to reclaim the space at once.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import warnings
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

FORMAT = 1  # bump when what a loader or the post-processing produces changes: old copies are not reused
_DIGEST_CHUNK = 16 << 20  # bytes hashed per read
KEEP_DAYS = 30  # a copy unused this long is removed when another is built

Arrays = dict[str, np.ndarray]


def load_or_build(folder: Path, key: str, build: Callable[[], tuple[Arrays, dict]]) -> tuple[Arrays, dict]:
    """The arrays (memory-mapped, read-only on disk) and meta of copy `key` in `folder`, built first by
    `build()` when there is none or it is not intact. Falls back to `build()`'s own arrays, unshared,
    when `folder` cannot be used."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        handle = open(folder / f"{key}.lock", "a")
    except OSError as e:
        warnings.warn(f"dataset.shared_dir: {folder} cannot be used ({e}); this process keeps its own copy",
                      stacklevel=2)
        return build()
    with handle, _locked(handle):
        found = open_copy(folder / key)
        if found is not None:
            return found
        arrays, meta = build()
        try:
            write_copy(folder / key, arrays, meta)
        except OSError as e:  # disk full, read-only: the data is built, only the sharing is lost
            warnings.warn(f"dataset.shared_dir: cannot write the shared copy into {folder} ({e}); "
                          f"this process keeps its own", stacklevel=2)
            return arrays, meta
        found = open_copy(folder / key)
        if found is None:
            raise OSError(f"{folder / key}: the shared copy just written does not read back")
        _evict_unused(folder, keep=key)
        return found


def _evict_unused(folder: Path, keep: str, days: float | None = None) -> None:
    """Remove copies (and their locks) not opened for `days` (default KEEP_DAYS) whose lock is free now."""
    import time

    cutoff = time.time() - 86400 * (KEEP_DAYS if days is None else days)
    for meta in folder.glob("*/meta.json"):
        key = meta.parent.name
        try:
            if key == keep or meta.stat().st_mtime > cutoff:
                continue
            with open(folder / f"{key}.lock", "a") as f:
                if not _try_lock(f):
                    continue  # being opened or built right now
                shutil.rmtree(meta.parent, ignore_errors=True)
                (folder / f"{key}.lock").unlink(missing_ok=True)
        except OSError:
            continue  # another process removed it first


def _try_lock(f) -> bool:
    try:
        import fcntl
    except ImportError:
        return False  # without locks, never remove what another process may be reading
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError:
        return False


@contextlib.contextmanager
def _locked(f) -> Iterator[None]:
    """An exclusive lock on the open file `f` while the copy is checked or built; the kernel releases
    it if the process dies (no stale lock to clean up)."""
    try:
        import fcntl
    except ImportError:  # not POSIX: concurrent builders write the same bytes, each renamed atomically
        yield
        return
    fcntl.flock(f, fcntl.LOCK_EX)
    try:
        yield
    finally:
        fcntl.flock(f, fcntl.LOCK_UN)


def write_copy(target: Path, arrays: Arrays, meta: dict) -> None:
    """Write `arrays` and `meta` as the copy at `target`, atomically (call under the key's lock)."""
    # a builder that died: under the lock, no one else
    for stale in target.parent.glob(f".{target.name}.tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)
    tmp = target.parent / f".{target.name}.tmp-{os.getpid()}"
    tmp.mkdir()
    try:
        entries = {}
        for name, a in arrays.items():
            path = tmp / f"{name}.npy"
            np.save(path, np.ascontiguousarray(a), allow_pickle=False)
            entries[name] = {"shape": list(a.shape), "dtype": a.dtype.str, "bytes": path.stat().st_size,
                             "sha256": _digest(path)}
        (tmp / "meta.json").write_text(json.dumps({"format": FORMAT, "arrays": entries, "meta": meta}))
        if target.exists():  # a corrupt copy open_copy refused (it is removed there; a race left one)
            shutil.rmtree(target, ignore_errors=True)
        os.rename(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def open_copy(target: Path) -> tuple[Arrays, dict] | None:
    """The memory-mapped arrays and meta of the copy at `target`; None (and the copy removed) when it is
    absent, partial or altered."""
    if not target.is_dir():
        return None
    try:
        info = json.loads((target / "meta.json").read_text())
        if info.get("format") != FORMAT:
            raise ValueError(f"format {info.get('format')!r}, expected {FORMAT}")
        arrays = {}
        for name, entry in info["arrays"].items():
            path = target / f"{name}.npy"
            if path.stat().st_size != entry["bytes"] or _digest(path) != entry["sha256"]:
                raise ValueError(f"{path.name} differs from what was written")
            # mmap cannot map zero bytes: an empty array is read (it is only its header)
            mode = "c" if np.prod(entry["shape"]) else None
            a = np.load(path, mmap_mode=mode, allow_pickle=False)
            if list(a.shape) != entry["shape"] or a.dtype.str != entry["dtype"]:
                raise ValueError(f"{path.name} holds {a.dtype} {a.shape}")
            arrays[name] = a
        os.utime(target / "meta.json")  # last used: what eviction goes by
        return arrays, info["meta"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        warnings.warn(f"{target}: shared data copy is not intact ({e}); rebuilding it", stacklevel=3)
        shutil.rmtree(target, ignore_errors=True)
        return None


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_DIGEST_CHUNK):
            h.update(block)
    return h.hexdigest()
