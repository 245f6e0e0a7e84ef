"""Dataset registry: name -> loader -> :class:`DataSplit`, with one shared post-processing step.

A loader reads its files and returns images as uint8 pixel counts (or float32 in [0, 1], or a streamed
source of files) and vectors in whatever real dtype they are stored, with its own labels;
:func:`load_dataset` then, in this order: takes the stratified ``max_train``/``max_test`` subsamples
(before anything is converted: a 2k subset of a 60k set never holds the 60k as floats), remaps labels
that are not 0..C-1, flattens images when ``as_vectors``, makes vectors float32 and z-scores them when
``standardize`` (statistics accumulated in float64 chunk by chunk), and computes the per-channel image
mean/std of the training images (uint8: exact, from a histogram of the pixel values).

Images stay uint8 in memory, 4x smaller than float32, and become float32 in [0, 1] per batch on the
training device (:func:`augtune.data.batches.as_float`: the very numbers the float32 copy held).
With ``dataset.shared`` (the default) the result is kept in a memory-mapped cache per node
(:mod:`augtune.data.cache`): concurrent trials on one node map one read-only copy instead of
each holding its own, and the second trial does not read or decode the files again.

Nothing here touches the network unless ``dataset.download`` is true. Where the files are looked for
when ``dataset.root`` is not set:

- ``digits``: inside scikit-learn (1797 real 8x8 digits).
- ``fashion_mnist``: ``/usr/share/datasets/fashion-mnist`` (Debian ``dataset-fashion-mnist``),
  then ``<cache>/FashionMNIST/raw``.
- ``cifar10``, ``cifar100``, ``stl10``: ``<cache>`` in torchvision's layout.
- ``imagefolder``, ``arrays``: ``dataset.path`` (:mod:`augtune.data.imagefolder`).

``<cache>`` is :func:`default_root`: ``$XDG_CACHE_HOME/augtune/data``, i.e. usually
``~/.cache/augtune/data``; ``download: true`` fetches into ``dataset.root`` or there.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import torch

from augtune.config import DatasetConfig, to_dict
from augtune.data import cache, formats
from augtune.data.batches import as_float, is_streamed
from augtune.data.formats import DataError


@dataclass(frozen=True)
class DataSplit:
    name: str
    modality: str  # "image" or "vector"
    shape: tuple[int, ...]  # per sample: (C, H, W) for images, (D,) for vectors
    num_classes: int
    # (N, *shape). Images: uint8 pixel counts (as_float -> [0, 1]), float32 as given, or a streamed source
    # of files (imagefolder, cache: none); vectors: float32 (a loader may return any real dtype: load_dataset
    # converts after subsampling)
    x_train: Any
    y_train: torch.Tensor  # int64 (N,), labels 0..num_classes-1
    x_test: Any
    y_test: torch.Tensor
    # images: per-channel mean of the training images in [0, 1]; None for vectors
    mean: tuple[float, ...] | None
    std: tuple[float, ...] | None
    classes: tuple[str, ...]  # one name per class
    # (U, *shape) images without labels, for pre-training only (STL-10's unlabelled split); None: none.
    # Held right after x_train in one block where possible, so that `pretrain` is a view, not a copy
    x_unlabeled: Any = None
    # `dataset.evaluate_on: both`: the validation part carved from the training split, scored beside the
    # test split (a race's repeat runs choose on it, report on the test split); None otherwise
    x_val: Any = None
    y_val: torch.Tensor | None = None

    def __post_init__(self) -> None:
        # cheap consistency checks only (no pass over the data): they catch a loader's mistakes
        if self.modality not in ("image", "vector"):
            raise ValueError(f"{self.name}: modality must be 'image' or 'vector', got {self.modality!r}")
        if len(self.shape) != (3 if self.modality == "image" else 1):
            raise ValueError(f"{self.name}: {self.modality} shape {self.shape} should be (C, H, W) or (D,)")
        for part in ("train", "test", "unlabeled", "val"):
            x, y = getattr(self, f"x_{part}"), getattr(self, f"y_{part}", None)
            if x is None and part in ("unlabeled", "val"):
                continue
            ok = (
                x.dtype == torch.uint8
                or x.dtype.is_floating_point
                or (self.modality == "vector" and _real(x))
            )
            if not ok or tuple(x.shape[1:]) != self.shape:
                raise ValueError(f"{self.name}: x_{part} should be uint8 or float (N, *{self.shape}), "
                                 f"got {x.dtype} {tuple(x.shape)}")
            if y is not None and (y.dtype != torch.int64 or y.shape != (x.shape[0],)):
                raise ValueError(f"{self.name}: y_{part} should be int64 ({x.shape[0]},), "
                                 f"got {y.dtype} {tuple(y.shape)}")
        if len(self.classes) != self.num_classes:
            raise ValueError(f"{self.name}: {len(self.classes)} class names for {self.num_classes} classes")

    def pretrain(self) -> tuple[Any, torch.Tensor]:
        """(x, y) of the rows a method trains on: x_train, then x_unlabeled's rows (label -1)."""
        if self.x_unlabeled is None:
            return self.x_train, self.y_train
        y = torch.cat([self.y_train, torch.full((len(self.x_unlabeled),), -1, dtype=torch.int64)])
        return _joined(self.x_train, self.x_unlabeled), y


def describe_rows(data: DataSplit) -> str:
    """How many rows are labelled and unlabelled, and where each goes: the line a run starts with."""
    parts = [f"{len(data.y_train)} train", f"{len(data.y_test)} test"]
    if data.y_val is not None:
        parts.append(f"{len(data.y_val)} validation")
    labelled = len(data.y_train) + len(data.y_test) + (0 if data.y_val is None else len(data.y_val))
    u = 0 if data.x_unlabeled is None else len(data.x_unlabeled)
    if u == 0:
        return f"{labelled} labelled rows ({', '.join(parts)})"
    if labelled == 0:
        return (f"no labels: {u} unlabelled rows, trained on; scored by label-free scores only "
                f"(rankme, alignment, uniformity)")
    return (f"{labelled} labelled rows ({', '.join(parts)}) and {u} unlabelled "
            f"({100 * u / (u + labelled):.0f}%: trained on, never scored)")


def _real(x: Any) -> bool:
    return x.dtype in (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


def _joined(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a and b as one tensor: a view when b's rows follow a's in one storage (as loaders make them); two
    streamed sources of files as one."""
    if is_streamed(a) and is_streamed(b):
        return type(a)([*a.files, *b.files], a.size)
    storage = a.untyped_storage()
    follows = (a.is_contiguous() and b.is_contiguous() and a.dtype == b.dtype
               and b.untyped_storage().data_ptr() == storage.data_ptr()
               and b.storage_offset() == a.storage_offset() + a.numel())
    if not follows:
        return torch.cat([a, b])
    return a.new_empty(0).set_(storage, a.storage_offset(), (len(a) + len(b), *a.shape[1:]))


Loader = Callable[[DatasetConfig], DataSplit]
Sources = Callable[[DatasetConfig], Optional[list[Path]]]
DATASETS: dict[str, Loader] = {}
# name -> the files a loader reads for a config (None: not found yet). Only a loader that names them is
# kept in the shared per-node copy: its key is computed over their paths, sizes and modification times
SOURCES: dict[str, Sources] = {}
# source files smaller than this in all are read by each process: a copy on disk buys nothing for them
# (digits' 57 KB file, a small .npz) and would leave a cache entry per file behind
SHARED_MIN_BYTES = 1 << 20


def register(name: str, sources: Sources | None = None) -> Callable[[Loader], Loader]:
    """Decorator: ``@register("mydata")`` adds a loader under ``dataset.name: mydata``; with
    ``sources=fn`` (fn(cfg) -> the files it reads) its data is shared between trials on a node."""
    def add(loader: Loader) -> Loader:
        if name in DATASETS and DATASETS[name] is not loader:
            raise ValueError(f"dataset {name!r} is already registered")
        DATASETS[name] = loader
        if sources is not None:
            SOURCES[name] = sources
        return loader
    return add


def load_dataset(cfg: DatasetConfig) -> DataSplit:
    """The loader named by ``cfg.name``, then the shared post-processing (see the module doc); from the
    node's shared copy when there is one (``dataset.shared``)."""
    if cfg.name not in DATASETS:
        raise DataError(f"dataset.name: unknown dataset {cfg.name!r} (known: {', '.join(sorted(DATASETS))})")
    sources = SOURCES.get(cfg.name) if cfg.shared and cfg.cache == "memory" else None
    files = sources(cfg) if sources is not None else None
    if files is None or sum(os.stat(f).st_size for f in files) < SHARED_MIN_BYTES:
        return _prepare(cfg)
    folder = Path(cfg.shared_dir).expanduser() if cfg.shared_dir else default_root().parent / "shared"
    arrays, meta = cache.load_or_build(folder, _shared_key(cfg, files), lambda: _to_arrays(_prepare(cfg)))
    return _from_arrays(arrays, meta)


def default_root() -> Path:
    """Where downloaded data sets live when ``dataset.root`` is not set."""
    return Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser() / "augtune" / "data"


def _prepare(cfg: DatasetConfig) -> DataSplit:
    split = DATASETS[cfg.name](cfg)
    _check_classes(split, cfg)
    if cfg.resplit:
        split = _resplit(split, cfg.split_seed)
    split = _subsample(split, cfg.max_train, cfg.max_test, cfg.split_seed)
    if cfg.evaluate_on == "val":  # from here on the test split is gone: nothing below can read it
        split = _validation(split, cfg.val_fraction, cfg.split_seed)
    elif cfg.evaluate_on == "both":  # the same validation part, held beside the test split
        split = _validation(split, cfg.val_fraction, cfg.split_seed, keep_test=True)
    if cfg.labels_per_class is not None:  # after the validation part is carved: it keeps its labels
        split = _few_labels(split, cfg.labels_per_class, cfg.split_seed)
    split = _contiguous_labels(split)
    if split.modality == "image" and cfg.as_vectors:
        if is_streamed(split.x_train):
            raise DataError("dataset.as_vectors: needs the images in memory (dataset.cache: memory)")
        split = _vectors(split, lambda x: as_float(x).flatten(1), cfg.standardize)  # uint8: pixels in [0, 1]
    elif split.modality == "vector":
        split = _vectors(split, lambda x: x.to(torch.float32), cfg.standardize)
    else:
        split = _map_x(
            split, lambda x: x if x.dtype == torch.uint8 or is_streamed(x) else x.to(torch.float32)
        )
        if split.mean is None:
            split = dataclasses.replace(
                split, **dict(zip(("mean", "std"), _image_stats(split.pretrain()[0])))
            )
    return split


def _check_classes(split: DataSplit, cfg: DatasetConfig) -> None:
    """Training data of one class is refused: every sample's neighbours, cluster and probe agree on
    it, so each metric scores 1.0 and says nothing."""
    labels = torch.unique(split.y_train)
    if len(labels) >= 2:
        return
    where = cfg.path or cfg.root or f"dataset.name: {cfg.name}"
    if len(labels) == 0 and split.x_unlabeled is not None and len(split.x_unlabeled) > 0:
        return  # no label at all: only the label-free scores (checks.check_against_data says so)
    if len(labels) == 0:
        raise DataError(f"{where}: the training data holds no samples")
    c = int(labels[0])
    name = split.classes[c] if 0 <= c < len(split.classes) else str(c)
    raise DataError(f"{where}: the training data holds one class only ({name!r}, "
                    f"{len(split.y_train)} samples); the evaluation needs at least two (every "
                    f"metric would score 1.0)")


# ---------------------------------------------------------------------------------------------
# Shared post-processing

def _map_x(split: DataSplit, fn: Callable[[Any], Any], **changes: Any) -> DataSplit:
    """`fn` applied to the training images (x_train and x_unlabeled as one block: one result) and x_test,
    with the other `changes` made at the same time."""
    if is_streamed(split.x_train):  # files: each part on its own (slicing one would decode it)
        return dataclasses.replace(
            split, x_train=fn(split.x_train), x_test=fn(split.x_test),
            x_unlabeled=None if split.x_unlabeled is None else fn(split.x_unlabeled),
            x_val=None if split.x_val is None else fn(split.x_val), **changes)
    x = fn(split.pretrain()[0])
    n = len(split.x_train)
    unlabeled = x[n:] if split.x_unlabeled is not None else None
    return dataclasses.replace(split, x_train=x[:n] if unlabeled is not None else x, x_unlabeled=unlabeled,
                               x_test=fn(split.x_test),
                               x_val=None if split.x_val is None else fn(split.x_val), **changes)


def _contiguous_labels(split: DataSplit) -> DataSplit:
    """Labels outside 0..num_classes-1 (a user's {3, 7, 9}) become their rank among the labels seen.

    Labels already inside the range are kept even when a class is absent, so that a small subset
    of CIFAR-10 keeps CIFAR-10's label numbering.
    """
    y = torch.cat([split.y_train, split.y_test, *([] if split.y_val is None else [split.y_val])])
    if y.numel() == 0 or (y.min() >= 0 and y.max() < split.num_classes):
        return split
    values = torch.unique(y)  # sorted
    names = split.classes if len(split.classes) == len(values) else tuple(str(v) for v in values.tolist())
    return dataclasses.replace(split, num_classes=len(values), classes=names,
                               y_train=torch.searchsorted(values, split.y_train),
                               y_test=torch.searchsorted(values, split.y_test),
                               y_val=None if split.y_val is None else torch.searchsorted(values, split.y_val))


def subsample_index(y: np.ndarray, n: int | None, seed: int, what: str) -> torch.Tensor | None:
    """The sorted rows of a stratified, seeded subsample of `n` of the labels `y`; None: keep them all.
    Loaders that can skip reading rows (STL-10's memory map, an image tree) apply it themselves."""
    if n is None or n >= len(y):
        return None
    return stratified_indices(y, train_size=n, seed=seed, what=what)[0]


def _subsample(split: DataSplit, max_train: int | None, max_test: int | None, seed: int) -> DataSplit:
    changes: dict[str, Any] = {}
    for part, n in (("train", max_train), ("test", max_test)):
        y = getattr(split, f"y_{part}")
        idx = subsample_index(y.numpy(), n, seed, f"dataset.max_{part}")
        if idx is not None:
            changes[f"x_{part}"] = getattr(split, f"x_{part}")[idx]
            changes[f"y_{part}"] = y[idx]
    return dataclasses.replace(split, **changes) if changes else split


def _resplit(split: DataSplit, seed: int) -> DataSplit:
    """Training and test samples pooled and split again, stratified, with the test split's size (a
    compare's `vary: [init, split]`: each seed's split)."""
    if len(split.y_train) == 0:  # no labelled rows: no test split to draw again
        return split
    if is_streamed(split.x_train) or is_streamed(split.x_test):
        raise DataError("dataset.resplit: needs the images in memory (dataset.cache: memory)")
    x, y = torch.cat([split.x_train, split.x_test]), torch.cat([split.y_train, split.y_test])
    tr, te = stratified_indices(y.numpy(), seed=seed, what="dataset.resplit", test_size=len(split.y_test))
    return dataclasses.replace(split, x_train=x[tr], y_train=y[tr], x_test=x[te], y_test=y[te])


def _validation(split: DataSplit, fraction: float, seed: int, keep_test: bool = False) -> DataSplit:
    """The training split's rest as the training data, its validation part (stratified, seeded) as the
    held-out data: what a search's trial trains and is scored on; the test split is dropped. `keep_test`
    (`evaluate_on: both`): the same parts, the validation part as x_val beside the test split."""
    if len(split.y_train) == 0:  # no labelled rows: the label-free scores read the unlabelled ones
        return split
    refuse_lone_labels(split.y_train.numpy(), split.classes, "dataset.val_fraction")
    tr, va = stratified_indices(split.y_train.numpy(), seed=seed, what="dataset.val_fraction",
                                test_size=fraction)
    x, y = split.x_train, split.y_train
    if keep_test:
        return dataclasses.replace(split, x_train=x[tr], y_train=y[tr], x_val=x[va], y_val=y[va])
    return dataclasses.replace(split, x_train=x[tr], y_train=y[tr], x_test=x[va], y_test=y[va])


def few_label_rows(y: np.ndarray, per_class: int, seed: int) -> np.ndarray:
    """The sorted rows of `per_class` labels of each class of `y` (all of a class that has fewer), drawn
    uniformly within each class from a generator seeded by `seed` alone."""
    rng = np.random.default_rng([seed, 0x1ABE1])
    kept = [rng.permutation(np.flatnonzero(y == c))[:per_class] for c in np.unique(y)]
    return np.sort(np.concatenate(kept))


def _few_labels(split: DataSplit, per_class: int, seed: int) -> DataSplit:
    """`dataset.labels_per_class`: `per_class` labelled training rows of each class kept (seeded; all of a
    class that has fewer), the other training rows moved to the unlabelled rows, ahead of any already
    there (they keep training)."""
    y = split.y_train.numpy()
    if len(y) == 0:
        return split
    keep = few_label_rows(y, per_class, seed)
    if len(keep) == len(y):
        return split
    if is_streamed(split.x_train):
        raise DataError("dataset.labels_per_class: needs the images in memory (dataset.cache: memory)")
    rest = np.setdiff1d(np.arange(len(y)), keep)
    keep_t, rest_t = torch.from_numpy(keep), torch.from_numpy(rest)
    moved = split.x_train[rest_t]
    unlabeled = moved if split.x_unlabeled is None else torch.cat([moved, split.x_unlabeled])
    return dataclasses.replace(split, x_train=split.x_train[keep_t], y_train=split.y_train[keep_t],
                               x_unlabeled=unlabeled)


def stratified_indices(y: np.ndarray, *, seed: int, what: str, train_size: int | None = None,
                       test_size: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Seeded, stratified split of ``range(len(y))``; each part sorted, so order follows the file."""
    from sklearn.model_selection import train_test_split  # here: a trial whose data is cached never needs it

    try:
        a, b = train_test_split(np.arange(len(y)), train_size=train_size, test_size=test_size,
                                stratify=y, random_state=seed)
    except ValueError as e:  # e.g. fewer samples asked for than there are classes
        raise DataError(f"{what}: cannot make a stratified split of {len(y)} samples ({e})") from None
    return torch.from_numpy(np.sort(a)), torch.from_numpy(np.sort(b))


_CHUNK = 4096  # rows per step of the chunked passes below (memory, not results)
# bytes of float64 per step of the vector passes: small enough that the C allocator hands the temporaries
# back (glibc keeps freed blocks below its mmap threshold, which grows to 32 MiB, in the heap)
_CHUNK_BYTES = 2 << 20


def _rows_per_chunk(dim: int) -> int:
    return max(1, _CHUNK_BYTES // (8 * max(1, dim)))


Convert = Callable[[torch.Tensor], torch.Tensor]


def _feature_stats(x: torch.Tensor, convert: Convert) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 (D,) mean and std (1 for a constant feature) of the float32 vectors `convert(x)`, accumulated
    in float64 a chunk of rows at a time: neither the vectors nor a float64 copy are ever whole (two passes:
    the mean, then squared deviations from it)."""
    n, step = len(x), _rows_per_chunk(int(np.prod(x.shape[1:])))
    total = lo = hi = None
    for i in range(0, n, step):
        c = convert(x[i:i + step])
        total = c.double().sum(0) if total is None else total + c.double().sum(0)
        lo = c.amin(0) if lo is None else torch.minimum(lo, c.amin(0))
        hi = c.amax(0) if hi is None else torch.maximum(hi, c.amax(0))
    mean = total / n
    sq = torch.zeros_like(total)
    for i in range(0, n, step):
        sq += (convert(x[i:i + step]).double() - mean).square_().sum(0)
    var = sq / n
    constant = hi == lo  # exact test: var may be 1e-34, not 0
    std = torch.where(constant | (var == 0), torch.ones_like(var), var.sqrt())
    return mean.float(), std.float()


def _vectors(split: DataSplit, convert: Convert, standardize: bool) -> DataSplit:
    """float32 (N, D) vectors `convert(x)`, z-scored with train statistics when `standardize` (PiNDA B.2
    "rescale the input"), written chunk by chunk into one new tensor: the input and the result are all
    that is ever held (no whole intermediate float or float64 copy)."""
    x, _ = split.pretrain()
    mean, std = _feature_stats(x, convert) if standardize else (None, None)
    dim = convert(x[:1]).shape[1]

    def finish(t: torch.Tensor) -> torch.Tensor:
        if mean is None and t.dtype == torch.float32 and t.dim() == 2:
            return t  # nothing to convert
        out = torch.empty((len(t), dim), dtype=torch.float32)
        step = _rows_per_chunk(dim)
        for i in range(0, len(t), step):
            c = convert(t[i:i + step])
            out[i:i + step] = c if mean is None else (c - mean) / std
        return out

    return _map_x(split, finish, modality="vector", shape=(dim,), mean=None, std=None)


def pixel_stats(x: torch.Tensor) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and std (population) of uint8 images (N, C, H, W) as float32 values in [0, 1]:
    exact up to float64 rounding, from a histogram of the 256 pixel values per channel (no float copy)."""
    channels = x.shape[1]
    counts = np.zeros((channels, 256), dtype=np.int64)
    for i in range(0, len(x), _CHUNK // 4):
        block = x[i:i + _CHUNK // 4].numpy()
        for c in range(channels):
            counts[c] += np.bincount(block[:, c].ravel(), minlength=256)
    values = (np.arange(256, dtype=np.float32) / np.float32(255)).astype(np.float64)  # as as_float gives them
    n = counts.sum(1)
    mean = (counts * values).sum(1) / n
    var = (counts * (values - mean[:, None]) ** 2).sum(1) / n
    # float32, as the mean of the float32 images used to be reported
    return tuple(float(np.float32(m)) for m in mean), tuple(float(np.float32(s)) for s in np.sqrt(var))


def _image_stats(x: torch.Tensor) -> tuple[tuple[float, ...], tuple[float, ...]]:
    if x.dtype == torch.uint8:
        return pixel_stats(x)
    return tuple(x.mean(dim=(0, 2, 3)).tolist()), tuple(x.std(dim=(0, 2, 3), correction=0).tolist())


# ---------------------------------------------------------------------------------------------
# The shared per-node copy (see augtune.data.cache)

# Keys that do not change the data: where the copy lives, decoding processes, whether to fetch
_NOT_CONTENT = ("shared", "shared_dir", "workers", "download", "cache")


def _shared_key(cfg: DatasetConfig, files: list[Path]) -> str:
    """`<name>-<hash>` of everything the data depends on: the config's content keys, the source files'
    paths, sizes and modification times, and the package's version and cache format."""
    from augtune.version import __version__

    h = hashlib.sha256()
    settings = {k: v for k, v in to_dict(cfg).items() if k not in _NOT_CONTENT}
    h.update(json.dumps([cache.FORMAT, __version__, settings], sort_keys=True, default=str).encode())
    for f in files:
        st = os.stat(f)
        h.update(f"\n{os.path.abspath(f)}\t{st.st_size}\t{st.st_mtime_ns}".encode())
    return f"{cfg.name}-{h.hexdigest()[:24]}"


def _to_arrays(split: DataSplit) -> tuple[dict[str, np.ndarray], dict]:
    x, _ = split.pretrain()
    arrays = {"x_train": x.numpy(), "y_train": split.y_train.numpy(), "x_test": split.x_test.numpy(),
              "y_test": split.y_test.numpy()}
    if split.x_val is not None:
        arrays.update(x_val=split.x_val.numpy(), y_val=split.y_val.numpy())
    meta = {"name": split.name, "modality": split.modality, "shape": list(split.shape),
            "num_classes": split.num_classes, "mean": split.mean, "std": split.std,
            "classes": list(split.classes), "labeled": len(split.x_train)}
    return arrays, meta


def _from_arrays(arrays: dict[str, np.ndarray], meta: dict) -> DataSplit:
    t = {k: torch.from_numpy(v) for k, v in arrays.items()}
    n = meta["labeled"]
    x_train, unlabeled = t["x_train"][:n], (t["x_train"][n:] if len(t["x_train"]) > n else None)
    tup = (lambda v: None if v is None else tuple(v))
    return DataSplit(meta["name"], meta["modality"], tuple(meta["shape"]), meta["num_classes"], x_train,
                     t["y_train"], t["x_test"], t["y_test"], tup(meta["mean"]), tup(meta["std"]),
                     tuple(meta["classes"]), unlabeled, t.get("x_val"), t.get("y_val"))


# ---------------------------------------------------------------------------------------------
# Helpers for loaders

def _pixels(x: np.ndarray) -> torch.Tensor:
    """uint8 (N, C, H, W) pixel counts as a C-contiguous tensor (a copy only where x is a strided view)."""
    return torch.from_numpy(np.ascontiguousarray(x, dtype=np.uint8))


def _labels(y: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.array(y, dtype=np.int64))


def _check_labels(y: np.ndarray, num_classes: int, where: Path) -> None:
    if y.size and (y.min() < 0 or y.max() >= num_classes):
        raise DataError(f"{where}: labels should be 0..{num_classes - 1}, found {y.min()}..{y.max()}")


def _download(title: str, root: Path, fetch: Callable[[Any, str], Any]) -> None:
    """Let torchvision fetch a data set into ``root`` (only ever called with ``download: true``)."""
    try:
        import torchvision.datasets as tvd
    except ImportError:
        raise DataError(
            f"dataset.download: fetching {title} needs torchvision (pip install torchvision)"
        ) from None
    try:
        fetch(tvd, str(root))
    except Exception as e:  # network, disk, checksum: report, do not hide
        raise DataError(
            f"dataset.download: fetching {title} into {root} failed ({type(e).__name__}: {e})"
        ) from None


def _root(cfg: DatasetConfig) -> Path:
    return Path(cfg.root).expanduser() if cfg.root else default_root()


# ---------------------------------------------------------------------------------------------
# Loaders

def _digits_file(cfg: DatasetConfig) -> list[Path] | None:
    import importlib.util  # found without importing scikit-learn (a second of a trial process's start)

    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        return None
    found = Path(spec.submodule_search_locations[0]) / "datasets" / "data" / "digits.csv.gz"
    return [found] if found.is_file() else None


@functools.cache
def _sk_digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits, parsed once per process (20 ms of CSV each time otherwise, at every start
    of a trial: a PBT exploit restarts one); read-only, the loader copies them."""
    from sklearn.datasets import load_digits as sk_digits

    d = sk_digits()
    # float32 k/16 (exact), not uint8: as_float's table is v/255, and the set is 0.5 MB
    images, target = (d.images / 16.0).astype(np.float32), d.target
    images.setflags(write=False)
    target.setflags(write=False)
    return images, target


@register("digits", sources=_digits_file)
def load_digits(cfg: DatasetConfig) -> DataSplit:
    """scikit-learn's 1797 8x8 digits (pixel counts 0..16), stratified seeded train/test split."""
    images, target = _sk_digits()
    x = torch.from_numpy(images.copy()).unsqueeze(1)  # (1797, 1, 8, 8)
    y = _labels(target)
    tr, te = stratified_indices(target, test_size=cfg.test_fraction, seed=cfg.split_seed,
                                what="dataset.test_fraction")
    return DataSplit("digits", "image", (1, 8, 8), 10, x[tr], y[tr], x[te], y[te], None, None,
                     tuple(str(i) for i in range(10)))


FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")  # Debian: dataset-fashion-mnist
FASHION_MNIST_CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                         "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot")
_FASHION_MNIST_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                        "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


def _idx_files(folder: Path) -> list[Path] | None:
    """The four IDX files in ``folder``, each ``.gz`` or uncompressed; None if one is missing."""
    found = []
    for stem in _FASHION_MNIST_FILES:
        hit = next((p for p in (folder / f"{stem}.gz", folder / stem) if p.is_file()), None)
        if hit is None:
            return None
        found.append(hit)
    return found


def _fashion_folders(cfg: DatasetConfig) -> list[Path]:
    # dataset.root may be a flat folder of the four files, or torchvision's <root>/FashionMNIST/raw
    base = _root(cfg)
    return (
        [base, base / "FashionMNIST" / "raw"]
        if cfg.root
        else [FASHION_MNIST_DIR, base / "FashionMNIST" / "raw"]
    )


def _fashion_files(cfg: DatasetConfig) -> list[Path] | None:
    return next((f for f in map(_idx_files, _fashion_folders(cfg)) if f), None)


@register("fashion_mnist", sources=_fashion_files)
def load_fashion_mnist(cfg: DatasetConfig) -> DataSplit:
    """The original IDX files: 60k train / 10k test, 1x28x28."""
    base, folders = _root(cfg), _fashion_folders(cfg)
    files = _fashion_files(cfg)
    if files is None and cfg.download:
        _download("Fashion-MNIST", base, lambda tvd, r: tvd.FashionMNIST(r, train=True, download=True))
        files = _idx_files(base / "FashionMNIST" / "raw")
    if files is None:
        looked = " or ".join(str(f / f"{_FASHION_MNIST_FILES[0]}.gz") for f in folders)
        raise DataError(
            f"fashion_mnist: no IDX files found (looked for {looked}); apt-get install -y "
            f"dataset-fashion-mnist, or set dataset.root: a folder with the four *-ubyte[.gz] files, "
            f"or dataset.download: true to let torchvision fetch Fashion-MNIST into {base}"
        )
    xs, ys = [], []
    for images, labels in (files[:2], files[2:]):
        x = formats.read_idx(images, ndim=3, shape=(None, 28, 28))  # (N, 28, 28) uint8
        y = formats.read_idx(labels, ndim=1)  # (N,) uint8
        if x.dtype != np.uint8 or y.shape != (x.shape[0],):
            raise DataError(f"{images}: expected uint8 (N, 28, 28) with N labels in {labels.name}, "
                            f"got {x.dtype} {x.shape} and {y.shape[0]} labels")
        _check_labels(y, 10, labels)
        xs.append(_pixels(x[:, None]))  # (N, 1, 28, 28)
        ys.append(_labels(y))
    return DataSplit("fashion_mnist", "image", (1, 28, 28), 10, xs[0], ys[0], xs[1], ys[1], None, None,
                     FASHION_MNIST_CLASSES)


def _cifar_dir(cfg: DatasetConfig, folder: str, first: str) -> Path:
    # dataset.root is the folder holding `folder`; accept `folder` itself too
    root = _root(cfg)
    return root if (root / first).is_file() and not (root / folder).is_dir() else root / folder


def _cifar_sources(folder: str, files: list[str], meta: str) -> Sources:
    def sources(cfg: DatasetConfig) -> list[Path] | None:
        data_dir = _cifar_dir(cfg, folder, files[0])
        found = [data_dir / f for f in files]
        if not all(f.is_file() for f in found):
            return None
        return found + ([data_dir / meta] if (data_dir / meta).is_file() else [])
    return sources


def _load_cifar(cfg: DatasetConfig, name: str, title: str, folder: str, train: list[str], test: str,
                label_key: str, meta: str, names_key: str, num_classes: int, tv_class: str) -> DataSplit:
    """CIFAR in torchvision's layout, read without torchvision (whose md5 checks refuse subsets)."""
    root = _root(cfg)
    data_dir = _cifar_dir(cfg, folder, train[0])
    if not (data_dir / train[0]).is_file() and cfg.download:
        _download(title, root, lambda tvd, r: getattr(tvd, tv_class)(r, train=True, download=True))
    if not (data_dir / train[0]).is_file():
        raise DataError(
            f"{name}: {data_dir / train[0]} not found; set dataset.download: true to let torchvision "
            f"fetch {title} into {root}, or dataset.root: the folder holding {folder}/"
        )
    names = formats.read_cifar_names(data_dir / meta, names_key) or tuple(str(i) for i in range(num_classes))
    if len(names) != num_classes:
        raise DataError(f"{data_dir / meta}: {len(names)} class names, {title} has {num_classes}")
    parts = []
    for files in (train, [test]):
        batches = [formats.read_cifar_batch(data_dir / f, label_key) for f in files]
        for f, (_, y) in zip(files, batches):
            _check_labels(y, num_classes, data_dir / f)
        x = np.concatenate([b[0] for b in batches])  # (N, 3, 32, 32) uint8
        y = np.concatenate([b[1] for b in batches])
        parts += [_pixels(x), _labels(y)]
    return DataSplit(name, "image", (3, 32, 32), num_classes, *parts, None, None, names)


_CIFAR10 = ("cifar-10-batches-py", [f"data_batch_{i}" for i in range(1, 6)], "test_batch", "batches.meta")
_CIFAR100 = ("cifar-100-python", ["train"], "test", "meta")


@register("cifar10", sources=_cifar_sources(_CIFAR10[0], _CIFAR10[1] + [_CIFAR10[2]], _CIFAR10[3]))
def load_cifar10(cfg: DatasetConfig) -> DataSplit:
    """CIFAR-10 in torchvision's layout under dataset.root: 50k train / 10k test, 3x32x32."""
    return _load_cifar(cfg, "cifar10", "CIFAR-10", _CIFAR10[0], _CIFAR10[1], _CIFAR10[2], "labels",
                       _CIFAR10[3], "label_names", 10, "CIFAR10")


@register("cifar100", sources=_cifar_sources(_CIFAR100[0], _CIFAR100[1] + [_CIFAR100[2]], _CIFAR100[3]))
def load_cifar100(cfg: DatasetConfig) -> DataSplit:
    """CIFAR-100 (fine labels) in torchvision's layout under dataset.root: 50k / 10k, 3x32x32."""
    # the 100 fine labels; the 20 coarse superclasses are not exposed
    return _load_cifar(cfg, "cifar100", "CIFAR-100", _CIFAR100[0], _CIFAR100[1], _CIFAR100[2], "fine_labels",
                       _CIFAR100[3], "fine_label_names", 100, "CIFAR100")


def _stl_dir(cfg: DatasetConfig) -> Path:
    root = _root(cfg)
    return root if (root / "train_X.bin").is_file() else root / "stl10_binary"


def _stl_sources(cfg: DatasetConfig) -> list[Path] | None:
    d = _stl_dir(cfg)
    parts = ["train_X.bin", "train_y.bin", "test_X.bin", "test_y.bin"] + (
        ["unlabeled_X.bin"] if cfg.unlabeled else []
    )
    found = [d / f for f in parts]
    if not all(f.is_file() for f in found):
        return None
    return found + ([d / "class_names.txt"] if (d / "class_names.txt").is_file() else [])


@register("stl10", sources=_stl_sources)
def load_stl10(cfg: DatasetConfig) -> DataSplit:
    """STL-10: labelled splits 5k train / 8k test, 3x96x96; with ``dataset.unlabeled: true`` the 100k
    unlabelled images join the training images for pre-training (evaluation stays on the labelled splits,
    as the papers do). Rows are copied out of memory maps, only those kept (``max_train`` applies to the
    unlabelled split too: a seeded sample of at most that many)."""
    root, data_dir = _root(cfg), _stl_dir(cfg)
    if not (data_dir / "train_X.bin").is_file() and cfg.download:
        _download("STL-10", root, lambda tvd, r: tvd.STL10(r, split="train", download=True))
    if not (data_dir / "train_X.bin").is_file():
        raise DataError(
            f"stl10: {data_dir / 'train_X.bin'} not found; set dataset.download: true to let "
            f"torchvision fetch STL-10 into {root}, or dataset.root: the folder holding stl10_binary/"
        )
    parts, rows = [], []
    for part, n in (("train", cfg.max_train), ("test", cfg.max_test)):
        x = formats.read_stl_images(data_dir / f"{part}_X.bin")  # (N, 3, 96, 96) uint8, memory-mapped
        y = formats.read_stl_labels(data_dir / f"{part}_y.bin")
        if len(y) != len(x):
            raise DataError(
                f"{data_dir / f'{part}_y.bin'}: {len(y)} labels for {len(x)} images in {part}_X.bin"
            )
        idx = subsample_index(y, n, cfg.split_seed, f"dataset.max_{part}")
        keep = np.arange(len(y)) if idx is None else idx.numpy()
        parts.append((x, y[keep]))
        rows.append(keep)
    (x_tr, y_tr), (x_te, y_te) = parts
    unlabeled, u_rows = _stl_unlabeled(cfg, data_dir) if cfg.unlabeled else (None, np.arange(0))
    n_tr = len(rows[0])
    formats.check_fits(data_dir, (n_tr + len(u_rows) + len(rows[1])) * x_tr[0].size, "STL-10's images")
    pool = np.empty((n_tr + len(u_rows), 3, 96, 96), dtype=np.uint8)  # train, then unlabelled: one block
    _copy_rows(pool[:n_tr], x_tr, rows[0])
    if unlabeled is not None:
        _copy_rows(pool[n_tr:], unlabeled, u_rows)
    test = np.empty((len(rows[1]), 3, 96, 96), dtype=np.uint8)
    _copy_rows(test, x_te, rows[1])
    names_file = data_dir / "class_names.txt"
    names = (
        tuple(n.strip() for n in names_file.read_text().splitlines() if n.strip())
        if names_file.is_file()
        else ()
    )
    if len(names) != 10:
        names = tuple(str(i) for i in range(10))
    block = torch.from_numpy(pool)
    return DataSplit("stl10", "image", (3, 96, 96), 10, block[:n_tr], _labels(y_tr), torch.from_numpy(test),
                     _labels(y_te), None, None, names, block[n_tr:] if unlabeled is not None else None)


def _stl_unlabeled(cfg: DatasetConfig, data_dir: Path) -> tuple[np.ndarray, np.ndarray]:
    """The memory-mapped unlabelled images and the rows kept: all, or a seeded `max_train` of them."""
    path = data_dir / "unlabeled_X.bin"
    if not path.is_file():
        raise DataError(f"dataset.unlabeled: {path} not found (STL-10's 100k unlabelled images, "
                        f"unlabeled_X.bin of stl10_binary)")
    unlabeled = formats.read_stl_images(path)
    rows = np.arange(len(unlabeled))
    if cfg.max_train is not None and cfg.max_train < len(rows):
        rows = np.sort(np.random.default_rng(cfg.split_seed).choice(len(rows), cfg.max_train, replace=False))
    return unlabeled, rows


def _copy_rows(out: np.ndarray, x: np.ndarray, rows: np.ndarray, chunk: int = 1024) -> None:
    """out[j] = x[rows[j]], a chunk at a time: a memory map's pages are read once, for the rows kept."""
    for i in range(0, len(rows), chunk):
        out[i:i + chunk] = x[rows[i:i + chunk]]


# ---------------------------------------------------------------------------------------------
# A user's own arrays: .npz (x, y[, x_test, y_test]) or .csv (label|y column[, split column])

def _arrays_file(cfg: DatasetConfig) -> list[Path] | None:
    path = Path(cfg.path).expanduser() if cfg.path else None
    return [path] if path is not None and path.is_file() else None


@register("arrays", sources=_arrays_file)
def load_arrays(cfg: DatasetConfig) -> DataSplit:
    """Your own features: dataset.path to an .npz (x, y[, x_test, y_test]) or a .csv (label column)."""
    if not cfg.path:
        raise DataError(
            "dataset.path: the `arrays` dataset needs the .npz or .csv file of features and labels"
        )
    path = Path(cfg.path).expanduser()
    if not path.is_file():
        raise DataError(
            f"dataset.path: {path} not found (expected a .npz with x, y or a .csv with a label column)"
        )
    if path.suffix == ".npz":
        x, y, x_test, y_test, x_unl = _read_npz_arrays(path)
    elif path.suffix == ".csv":
        x, y, x_test, y_test, x_unl = _read_csv_arrays(path)
    else:
        raise DataError(f"dataset.path: {path}: expected a .npz or .csv file")

    unlabelled_only = _check_arrays(path, x, y, x_test, y_test, x_unl)
    codes, classes = _encode_labels(np.concatenate([y, y_test]) if y_test is not None else y, path)
    if x.ndim == 3:  # (N, H, W) grey images: add the channel axis
        x, x_test = x[:, None], (x_test[:, None] if x_test is not None else None)
        x_unl = x_unl[:, None] if x_unl is not None else None
    xt = _as_tensor(x)
    yt = torch.from_numpy(codes)
    if x_test is not None:
        n = len(x)
        x_tr, y_tr, x_te, y_te = xt, yt[:n], _as_tensor(x_test), yt[n:]
    elif unlabelled_only:  # no label at all: nothing to split, nothing to score but the label-free scores
        x_tr, y_tr, x_te, y_te = xt, yt, xt, yt
    else:
        refuse_lone_labels(codes, classes, str(path))
        tr, te = stratified_indices(codes, test_size=cfg.test_fraction, seed=cfg.split_seed,
                                    what=f"dataset.test_fraction ({path})")
        x_tr, y_tr, x_te, y_te = xt[tr], yt[tr], xt[te], yt[te]
    modality = "vector" if x.ndim == 2 else "image"
    unlabeled = _as_tensor(x_unl) if x_unl is not None and len(x_unl) else None
    if unlabeled is not None and unlabeled.dtype != x_tr.dtype:
        unlabeled = unlabeled.to(x_tr.dtype)
    return DataSplit("arrays", modality, tuple(x.shape[1:]), len(classes), x_tr, y_tr, x_te, y_te,
                     None, None, classes, unlabeled)


def _check_arrays(path: Path, x: np.ndarray, y: np.ndarray, x_test: Optional[np.ndarray],
                  y_test: Optional[np.ndarray], x_unl: Optional[np.ndarray]) -> bool:
    """Refuse, in one line naming the array, what cannot be trained on; True: no labelled row at all."""
    for xs, kx in ((x, "x"), (x_unl, "x_unlabeled")):
        if xs is not None and not (np.issubdtype(xs.dtype, np.integer) or np.issubdtype(xs.dtype, np.floating)
                                   or xs.dtype == np.bool_):
            raise DataError(f"{path}: features must be numeric (real numbers), got dtype {xs.dtype} ({kx})")
    if x.ndim not in (2, 3, 4):
        raise DataError(
            f"{path}: x should be (N, D) vectors or (N, H, W) / (N, C, H, W) images, got shape {x.shape}"
        )
    unlabelled_only = len(x) == 0 and x_unl is not None and len(x_unl) > 0
    _check_not_empty(path, x if not unlabelled_only else None, x_test)
    for xs, kx in ((x_test, "x_test"), (x_unl, "x_unlabeled")):
        if xs is not None and xs.shape[1:] != x.shape[1:]:
            raise DataError(f"{path}: {kx} has samples of shape {xs.shape[1:]}, x has {x.shape[1:]}")
    parts = ((x, y, "x", "y"), (x_test, y_test, "x_test", "y_test"), (x_unl, None, "x_unlabeled", ""))
    for xs, ys, kx, ky in parts:
        if xs is None:
            continue
        if ys is not None and (ys.ndim != 1 or len(ys) != len(xs)):
            raise DataError(f"{path}: {ky} should be ({len(xs)},) to match {kx}, got shape {ys.shape}")
        bad = _first_nonfinite(xs)
        if bad is not None:
            raise DataError(f"{path}: {kx} has NaN or infinite values (first in sample {bad})")

    return unlabelled_only


def refuse_lone_labels(y: np.ndarray, classes: tuple[str, ...], where: str) -> None:
    """A class with fewer than 2 labelled rows cannot be split (stratified) nor scored: refused, named."""
    counts = np.bincount(np.asarray(y, dtype=np.int64), minlength=len(classes)) if len(y) else np.zeros(0)
    lone = [i for i, c in enumerate(counts.tolist()) if c == 1]
    if lone:
        names = ", ".join(repr(classes[i]) if i < len(classes) else str(i) for i in lone[:3])
        more = f" and {len(lone) - 3} more" if len(lone) > 3 else ""
        raise DataError(f"{where}: class {names}{more} has a single labelled row; a class needs at least 2 "
                        f"(one to split off for scoring): label more rows, or leave its label empty")


def _check_not_empty(path: Path, x: np.ndarray, x_test: np.ndarray | None) -> None:
    """No samples, or samples of no features: one line (it was a reshape's traceback)."""
    for xs, kx in ((x, "x"), (x_test, "x_test")):
        if xs is not None and (len(xs) == 0 or 0 in xs.shape[1:]):
            what = "no samples" if len(xs) == 0 else "samples of no features"
            raise DataError(f"{path}: {kx} holds {what} (shape {xs.shape})")


_TORCH_DTYPES = (np.uint8, np.int8, np.int16, np.int32, np.int64, np.float32, np.float64)


def _as_tensor(x: np.ndarray) -> torch.Tensor:
    """The array as a tensor in its own dtype where torch has it (uint8 images stay pixel counts 0..255;
    the rest becomes float32 after subsampling, in load_dataset); bool, float16, uint16.. as float32."""
    if x.dtype.type not in _TORCH_DTYPES:
        x = x.astype(np.float32)
    return torch.from_numpy(np.ascontiguousarray(x))


def _first_nonfinite(x: np.ndarray) -> int | None:
    """The first sample holding a NaN or an infinity, checked a chunk of rows at a time (integers: none)."""
    if not np.issubdtype(x.dtype, np.floating) or x.size == 0:
        return None
    flat = x.reshape(len(x), -1)
    for i in range(0, len(x), _CHUNK):
        bad = ~np.isfinite(flat[i:i + _CHUNK]).all(axis=1)
        if bad.any():
            return i + int(np.argmax(bad))
    return None


def _encode_labels(y: np.ndarray, path: Path) -> tuple[np.ndarray, tuple[str, ...]]:
    """Integer labels stay as they are (load_dataset remaps them); strings become sorted codes."""
    if y.dtype.kind in "US":
        values, codes = np.unique(y, return_inverse=True)
        return codes.astype(np.int64), tuple(str(v) for v in values)
    if y.dtype.kind == "f":
        if not np.isfinite(y).all() or (y != np.round(y)).any():
            raise DataError(f"{path}: labels must be integers or strings, found non-integer values such as "
                            f"{y[~np.isfinite(y) | (y != np.round(y))][0]}")
        y = y.astype(np.int64)
    if y.dtype.kind not in "iub":
        raise DataError(f"{path}: labels must be integers or strings, got dtype {y.dtype}")
    y = y.astype(np.int64)
    return y, tuple(str(v) for v in np.unique(y).tolist())


Arrays = tuple[np.ndarray, np.ndarray, Optional[np.ndarray], Optional[np.ndarray], Optional[np.ndarray]]


def _read_npz_arrays(path: Path) -> Arrays:
    """x, y, x_test, y_test and x_unlabeled (rows for training only) of an .npz; absent ones None."""
    z = formats.read_npz(path)
    for key in ("x", "y"):
        if key not in z:
            raise DataError(f"{path}: no {key!r} array (has: {', '.join(sorted(z)) or 'none'}); "
                            f"expected x (N, D) and y (N,), optionally x_test and y_test")
    if ("x_test" in z) != ("y_test" in z):
        raise DataError(f"{path}: has {'x_test' if 'x_test' in z else 'y_test'} without "
                        f"{'y_test' if 'x_test' in z else 'x_test'}; give both or neither")
    return z["x"], z["y"], z.get("x_test"), z.get("y_test"), z.get("x_unlabeled")


def _check_label_columns(path: Path, header: list[str]) -> None:
    """Which column holds the labels (and the split) must be plain: a name given twice, or both
    `label` and `y`, is refused naming the columns rather than one of them picked silently."""
    for name in ("label", "y", "split"):
        at = [str(i + 1) for i, c in enumerate(header) if c == name]
        if len(at) > 1:
            what = "split" if name == "split" else "labels"
            raise DataError(f"{path}: {len(at)} columns are named {name!r} (columns "
                            f"{', '.join(at)}); which one holds the {what} is ambiguous: rename "
                            f"the others")
    if "label" in header and "y" in header:
        raise DataError(f"{path}: both a 'label' (column {header.index('label') + 1}) and a 'y' "
                        f"column (column {header.index('y') + 1}); which one holds the labels is "
                        f"ambiguous: rename the other")


# label cells that mean "no label": the row trains unlabelled (case does not matter)
MISSING_LABELS = ("", "na", "n/a", "nan")


def _read_csv_arrays(path: Path) -> Arrays:
    """x, y, x_test, y_test (with a `split` column) and x_unlabeled (the rows whose label is empty or NA)."""
    header, rows = formats.read_csv(path)
    _check_label_columns(path, header)
    label_col = next((c for c in ("label", "y") if c in header), None)
    if label_col is None:
        raise DataError(f"{path}: no 'label' (or 'y') column; columns: {', '.join(header)}")
    if not rows:
        raise DataError(f"{path}: no data rows")
    special = {label_col, "split"}
    feature_cols = [i for i, c in enumerate(header) if c not in special]
    if not feature_cols:
        raise DataError(f"{path}: no feature columns besides {label_col!r}")
    cells = np.array(rows, dtype=str)  # (N, columns)
    try:
        x = cells[:, feature_cols].astype(np.float64)
    except ValueError:
        _name_bad_cell(path, header, cells, feature_cols)
        raise
    raw = np.char.strip(cells[:, header.index(label_col)])
    labelled = ~np.isin(np.char.lower(raw), MISSING_LABELS)
    y = _label_values(raw[labelled], np.flatnonzero(labelled), path, label_col)
    if "split" not in header:
        return x[labelled], y, None, None, (x[~labelled] if not labelled.all() else None)
    split = np.char.lower(np.char.strip(cells[:, header.index("split")]))
    unknown = set(split.tolist()) - {"train", "test"}
    if unknown:
        raise DataError(f"{path}: column 'split' should hold train or test, found {sorted(unknown)[0]!r}")
    unlabelled_test = np.flatnonzero(~labelled & (split == "test"))
    if len(unlabelled_test):
        raise DataError(f"{path}: data row {unlabelled_test[0] + 1} is a test row without a label (a test "
                        f"row is scored: give it a label, or make it a train row)")
    train, test = split[labelled] == "train", split[labelled] == "test"
    if not train.any() or not test.any():
        raise DataError(f"{path}: column 'split' has no labelled {'train' if not train.any() else 'test'} "
                        f"rows")
    xl = x[labelled]
    return xl[train], y[train], xl[test], y[test], (x[~labelled] if not labelled.all() else None)


def _name_bad_cell(path: Path, header: list[str], cells: np.ndarray, columns: list[int]) -> None:
    """Raise the DataError that names the first feature cell that is not a number (or the empty column)."""
    for i in columns:
        if not np.char.strip(cells[:, i]).astype(bool).any():
            raise DataError(f"{path}: column {header[i]!r} is empty in every row (drop it, or fill it)")
    for r, row in enumerate(cells):
        for i in columns:
            try:
                float(row[i])
            except ValueError:
                raise DataError(f"{path}: column {header[i]!r} is not numeric (data row {r + 1}: "
                                f"{str(row[i])!r})") from None


def _label_values(raw: np.ndarray, rows: np.ndarray, path: Path, column: str) -> np.ndarray:
    """The labels of the labelled rows: integers when every one is a number, strings when none is; a
    column mostly of numbers with a few words (a typo, a stray note) is refused naming the first."""
    if len(raw) == 0:
        return raw.astype(np.int64)
    numeric = np.array([_is_number(v) for v in raw.tolist()])
    if numeric.all():
        values = raw.astype(np.float64)
        whole = np.isfinite(values) & (values == np.round(values))
        if not whole.all():
            r = int(np.argmin(whole))
            raise DataError(f"{path}: column {column!r} holds non-integer labels such as {str(raw[r])!r} "
                            f"(data row "
                            f"{rows[r] + 1}); labels must be integers or names")
        return values.astype(np.int64)
    if numeric.mean() >= 0.5:  # mostly numbers: the words are mistakes, not classes
        r = int(np.argmin(numeric))
        raise DataError(f"{path}: column {column!r} holds numbers but data row {rows[r] + 1} holds "
                        f"{str(raw[r])!r}; "
                        f"an empty cell or NA marks a row without a label")
    return raw  # names: classes are the sorted strings


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
