"""Dataset registry: name -> loader -> :class:`DataSplit`, with one shared post-processing step.

A loader reads its files and returns images scaled to [0, 1] (or vectors as given) with its own
labels; :func:`load_dataset` then, in this order: remaps labels that are not 0..C-1, takes the
stratified ``max_train``/``max_test`` subsamples, flattens images when ``as_vectors``, z-scores
vectors when ``standardize``, and computes the per-channel image mean/std of the train split.

Nothing here touches the network unless ``dataset.download`` is true, and nothing is cached on
disk. Where the files are looked for when ``dataset.root`` is not set:

- ``digits``: inside scikit-learn (1797 real 8x8 digits).
- ``fashion_mnist``: ``/usr/share/datasets/fashion-mnist`` (Debian ``dataset-fashion-mnist``),
  then ``<cache>/FashionMNIST/raw``.
- ``cifar10``, ``cifar100``, ``stl10``: ``<cache>`` in torchvision's layout.

``<cache>`` is :func:`default_root`: ``$XDG_CACHE_HOME/augtune/data``, i.e. usually
``~/.cache/augtune/data``; ``download: true`` fetches into ``dataset.root`` or there.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from sklearn.model_selection import train_test_split

from augtune.config import DatasetConfig
from augtune.data import formats
from augtune.data.formats import DataError


@dataclass(frozen=True)
class DataSplit:
    name: str
    modality: str  # "image" or "vector"
    shape: tuple[int, ...]  # per sample: (C, H, W) for images, (D,) for vectors
    num_classes: int
    x_train: torch.Tensor  # float32 (N, *shape); images in [0, 1]
    y_train: torch.Tensor  # int64 (N,), labels 0..num_classes-1
    x_test: torch.Tensor
    y_test: torch.Tensor
    mean: tuple[float, ...] | None  # images: per-channel mean of x_train; None for vectors
    std: tuple[float, ...] | None
    classes: tuple[str, ...]  # one name per class

    def __post_init__(self) -> None:
        # cheap consistency checks only (no pass over the data): they catch a loader's mistakes
        if self.modality not in ("image", "vector"):
            raise ValueError(f"{self.name}: modality must be 'image' or 'vector', got {self.modality!r}")
        if len(self.shape) != (3 if self.modality == "image" else 1):
            raise ValueError(f"{self.name}: {self.modality} shape {self.shape} should be (C, H, W) or (D,)")
        for part in ("train", "test"):
            x, y = getattr(self, f"x_{part}"), getattr(self, f"y_{part}")
            if x.dtype != torch.float32 or tuple(x.shape[1:]) != self.shape:
                raise ValueError(f"{self.name}: x_{part} should be float32 (N, *{self.shape}), "
                                 f"got {x.dtype} {tuple(x.shape)}")
            if y.dtype != torch.int64 or y.shape != (x.shape[0],):
                raise ValueError(f"{self.name}: y_{part} should be int64 ({x.shape[0]},), "
                                 f"got {y.dtype} {tuple(y.shape)}")
        if len(self.classes) != self.num_classes:
            raise ValueError(f"{self.name}: {len(self.classes)} class names for {self.num_classes} classes")


Loader = Callable[[DatasetConfig], DataSplit]
DATASETS: dict[str, Loader] = {}


def register(name: str) -> Callable[[Loader], Loader]:
    """Decorator: ``@register("mydata")`` adds a loader under ``dataset.name: mydata``."""
    def add(loader: Loader) -> Loader:
        if name in DATASETS and DATASETS[name] is not loader:
            raise ValueError(f"dataset {name!r} is already registered")
        DATASETS[name] = loader
        return loader
    return add


def load_dataset(cfg: DatasetConfig) -> DataSplit:
    """The loader named by ``cfg.name``, then the shared post-processing (see the module doc)."""
    if cfg.name not in DATASETS:
        raise DataError(f"dataset.name: unknown dataset {cfg.name!r} (known: {', '.join(sorted(DATASETS))})")
    split = DATASETS[cfg.name](cfg)
    split = _contiguous_labels(split)
    split = _subsample(split, cfg.max_train, cfg.max_test, cfg.split_seed)
    if split.modality == "image" and cfg.as_vectors:
        split = dataclasses.replace(split, modality="vector", shape=(int(np.prod(split.shape)),),
                                    x_train=split.x_train.flatten(1), x_test=split.x_test.flatten(1))
    if split.modality == "vector":
        split = dataclasses.replace(split, mean=None, std=None)
        if cfg.standardize:
            split = _standardize(split)
    else:
        x = split.x_train  # (N, C, H, W)
        split = dataclasses.replace(split, mean=tuple(x.mean(dim=(0, 2, 3)).tolist()),
                                    std=tuple(x.std(dim=(0, 2, 3), correction=0).tolist()))
    return split


def default_root() -> Path:
    """Where downloaded data sets live when ``dataset.root`` is not set."""
    return Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser() / "augtune" / "data"


# ---------------------------------------------------------------------------------------------
# Shared post-processing

def _contiguous_labels(split: DataSplit) -> DataSplit:
    """Labels outside 0..num_classes-1 (a user's {3, 7, 9}) become their rank among the labels seen.

    Labels already inside the range are kept even when a class is absent, so that a small subset
    of CIFAR-10 keeps CIFAR-10's label numbering.
    """
    y = torch.cat([split.y_train, split.y_test])
    if y.numel() == 0 or (y.min() >= 0 and y.max() < split.num_classes):
        return split
    values = torch.unique(y)  # sorted
    names = split.classes if len(split.classes) == len(values) else tuple(str(v) for v in values.tolist())
    return dataclasses.replace(split, num_classes=len(values), classes=names,
                               y_train=torch.searchsorted(values, split.y_train),
                               y_test=torch.searchsorted(values, split.y_test))


def _subsample(split: DataSplit, max_train: int | None, max_test: int | None, seed: int) -> DataSplit:
    changes: dict[str, torch.Tensor] = {}
    for part, n in (("train", max_train), ("test", max_test)):
        y = getattr(split, f"y_{part}")
        if n is None or n >= len(y):
            continue
        idx = _stratified_indices(y.numpy(), train_size=n, seed=seed, what=f"dataset.max_{part}")[0]
        changes[f"x_{part}"] = getattr(split, f"x_{part}")[idx]
        changes[f"y_{part}"] = y[idx]
    return dataclasses.replace(split, **changes) if changes else split


def _stratified_indices(y: np.ndarray, *, seed: int, what: str, train_size: int | None = None,
                        test_size: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Seeded, stratified split of ``range(len(y))``; each part sorted, so order follows the file."""
    try:
        a, b = train_test_split(np.arange(len(y)), train_size=train_size, test_size=test_size,
                                stratify=y, random_state=seed)
    except ValueError as e:  # e.g. fewer samples asked for than there are classes
        raise DataError(f"{what}: cannot make a stratified split of {len(y)} samples ({e})") from None
    return torch.from_numpy(np.sort(a)), torch.from_numpy(np.sort(b))


def _standardize(split: DataSplit) -> DataSplit:
    """z-score each feature with train statistics (PiNDA B.2 "rescale the input")."""
    # statistics in float64 so that large offsets do not eat the variance; applied in float32
    var, mean = torch.var_mean(split.x_train.double(), dim=0, correction=0)  # (D,)
    constant = split.x_train.amax(0) == split.x_train.amin(0)  # exact test: var may be 1e-34, not 0
    std = torch.where(constant | (var == 0), torch.ones_like(var), var.sqrt())
    mean, std = mean.float(), std.float()

    def scale(t: torch.Tensor) -> torch.Tensor:
        return (t - mean) / std

    return dataclasses.replace(split, x_train=scale(split.x_train), x_test=scale(split.x_test))


# ---------------------------------------------------------------------------------------------
# Helpers for loaders

def _images(x: np.ndarray, scale: float = 255.0) -> torch.Tensor:
    """uint8 (N, C, H, W) pixel counts -> float32 in [0, 1] (correctly rounded division)."""
    out = x.astype(np.float32, order="C")  # a fresh, writable, C-contiguous copy (STL's is a transposed view)
    np.divide(out, np.float32(scale), out=out)
    return torch.from_numpy(out)


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
        raise DataError(f"dataset.download: fetching {title} needs torchvision (pip install torchvision)") from None
    try:
        fetch(tvd, str(root))
    except Exception as e:  # network, disk, checksum: report, do not hide
        raise DataError(f"dataset.download: fetching {title} into {root} failed ({type(e).__name__}: {e})") from None


def _root(cfg: DatasetConfig) -> Path:
    return Path(cfg.root).expanduser() if cfg.root else default_root()


# ---------------------------------------------------------------------------------------------
# Loaders

@register("digits")
def load_digits(cfg: DatasetConfig) -> DataSplit:
    """scikit-learn's 1797 8x8 digits (pixel counts 0..16), stratified seeded train/test split."""
    from sklearn.datasets import load_digits as sk_digits

    d = sk_digits()
    x = torch.from_numpy((d.images / 16.0).astype(np.float32)).unsqueeze(1)  # (1797, 1, 8, 8)
    y = _labels(d.target)
    tr, te = _stratified_indices(d.target, test_size=cfg.test_fraction, seed=cfg.split_seed,
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


@register("fashion_mnist")
def load_fashion_mnist(cfg: DatasetConfig) -> DataSplit:
    """The original IDX files: 60k train / 10k test, 1x28x28."""
    base = _root(cfg)
    # dataset.root may be a flat folder of the four files, or torchvision's <root>/FashionMNIST/raw
    folders = [base, base / "FashionMNIST" / "raw"] if cfg.root else [FASHION_MNIST_DIR, base / "FashionMNIST" / "raw"]
    files = next((f for f in map(_idx_files, folders) if f), None)
    if files is None and cfg.download:
        _download("Fashion-MNIST", base, lambda tvd, r: tvd.FashionMNIST(r, train=True, download=True))
        files = _idx_files(base / "FashionMNIST" / "raw")
    if files is None:
        looked = " or ".join(str(f / f"{_FASHION_MNIST_FILES[0]}.gz") for f in folders)
        raise DataError(f"fashion_mnist: no IDX files found (looked for {looked}); apt-get install -y "
                        f"dataset-fashion-mnist, or set dataset.root: a folder with the four *-ubyte[.gz] files, "
                        f"or dataset.download: true to let torchvision fetch Fashion-MNIST into {base}")
    xs, ys = [], []
    for images, labels in (files[:2], files[2:]):
        x = formats.read_idx(images, ndim=3)  # (N, 28, 28) uint8
        y = formats.read_idx(labels, ndim=1)  # (N,) uint8
        if x.dtype != np.uint8 or x.shape[1:] != (28, 28) or y.shape != (x.shape[0],):
            raise DataError(f"{images}: expected uint8 (N, 28, 28) with N labels in {labels.name}, "
                            f"got {x.dtype} {x.shape} and {y.shape[0]} labels")
        _check_labels(y, 10, labels)
        xs.append(_images(x[:, None]))  # (N, 1, 28, 28)
        ys.append(_labels(y))
    return DataSplit("fashion_mnist", "image", (1, 28, 28), 10, xs[0], ys[0], xs[1], ys[1], None, None,
                     FASHION_MNIST_CLASSES)


def _load_cifar(cfg: DatasetConfig, name: str, title: str, folder: str, train: list[str], test: str,
                label_key: str, meta: str, names_key: str, num_classes: int, tv_class: str) -> DataSplit:
    """CIFAR in torchvision's layout, read without torchvision (whose md5 checks refuse subsets)."""
    root = _root(cfg)
    # dataset.root is the folder holding `folder`; accept `folder` itself too
    data_dir = root if (root / train[0]).is_file() and not (root / folder).is_dir() else root / folder
    if not (data_dir / train[0]).is_file() and cfg.download:
        _download(title, root, lambda tvd, r: getattr(tvd, tv_class)(r, train=True, download=True))
    if not (data_dir / train[0]).is_file():
        raise DataError(f"{name}: {data_dir / train[0]} not found; set dataset.download: true to let torchvision "
                        f"fetch {title} into {root}, or dataset.root: the folder holding {folder}/")
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
        parts += [_images(x), _labels(y)]
    return DataSplit(name, "image", (3, 32, 32), num_classes, *parts, None, None, names)


@register("cifar10")
def load_cifar10(cfg: DatasetConfig) -> DataSplit:
    """CIFAR-10 in torchvision's layout under dataset.root: 50k train / 10k test, 3x32x32."""
    return _load_cifar(cfg, "cifar10", "CIFAR-10", "cifar-10-batches-py",
                       [f"data_batch_{i}" for i in range(1, 6)], "test_batch", "labels",
                       "batches.meta", "label_names", 10, "CIFAR10")


@register("cifar100")
def load_cifar100(cfg: DatasetConfig) -> DataSplit:
    """CIFAR-100 (fine labels) in torchvision's layout under dataset.root: 50k / 10k, 3x32x32."""
    # the 100 fine labels; the 20 coarse superclasses are not exposed
    return _load_cifar(cfg, "cifar100", "CIFAR-100", "cifar-100-python", ["train"], "test", "fine_labels",
                       "meta", "fine_label_names", 100, "CIFAR100")


@register("stl10")
def load_stl10(cfg: DatasetConfig) -> DataSplit:
    """STL-10's labelled splits (5k train / 8k test, 3x96x96); the 100k unlabelled split is not loaded."""
    root = _root(cfg)
    data_dir = root if (root / "train_X.bin").is_file() else root / "stl10_binary"
    if not (data_dir / "train_X.bin").is_file() and cfg.download:
        _download("STL-10", root, lambda tvd, r: tvd.STL10(r, split="train", download=True))
    if not (data_dir / "train_X.bin").is_file():
        raise DataError(f"stl10: {data_dir / 'train_X.bin'} not found; set dataset.download: true to let "
                        f"torchvision fetch STL-10 into {root}, or dataset.root: the folder holding stl10_binary/")
    parts = []
    for part in ("train", "test"):
        x = formats.read_stl_images(data_dir / f"{part}_X.bin")  # (N, 3, 96, 96) uint8
        y = formats.read_stl_labels(data_dir / f"{part}_y.bin")
        if len(y) != len(x):
            raise DataError(f"{data_dir / f'{part}_y.bin'}: {len(y)} labels for {len(x)} images in {part}_X.bin")
        parts += [_images(x), _labels(y)]
    names_file = data_dir / "class_names.txt"
    names = tuple(n.strip() for n in names_file.read_text().splitlines() if n.strip()) if names_file.is_file() else ()
    if len(names) != 10:
        names = tuple(str(i) for i in range(10))
    return DataSplit("stl10", "image", (3, 96, 96), 10, *parts, None, None, names)


# ---------------------------------------------------------------------------------------------
# A user's own arrays: .npz (x, y[, x_test, y_test]) or .csv (label|y column[, split column])

@register("arrays")
def load_arrays(cfg: DatasetConfig) -> DataSplit:
    """Your own features: dataset.path to an .npz (x, y[, x_test, y_test]) or a .csv (label column)."""
    if not cfg.path:
        raise DataError("dataset.path: the `arrays` dataset needs the .npz or .csv file of features and labels")
    path = Path(cfg.path).expanduser()
    if not path.is_file():
        raise DataError(f"dataset.path: {path} not found (expected a .npz with x, y or a .csv with a label column)")
    if path.suffix == ".npz":
        x, y, x_test, y_test = _read_npz_arrays(path)
    elif path.suffix == ".csv":
        x, y, x_test, y_test = _read_csv_arrays(path)
    else:
        raise DataError(f"dataset.path: {path}: expected a .npz or .csv file")

    if not np.issubdtype(x.dtype, np.number) and x.dtype != np.bool_:
        raise DataError(f"{path}: features must be numeric, got dtype {x.dtype}")
    if x.ndim not in (2, 3, 4):
        raise DataError(f"{path}: x should be (N, D) vectors or (N, H, W) / (N, C, H, W) images, got shape {x.shape}")
    if x_test is not None and x_test.shape[1:] != x.shape[1:]:
        raise DataError(f"{path}: x_test has samples of shape {x_test.shape[1:]}, x has {x.shape[1:]}")
    for xs, ys, kx, ky in ((x, y, "x", "y"), (x_test, y_test, "x_test", "y_test")):
        if xs is None:
            continue
        if ys.ndim != 1 or len(ys) != len(xs):
            raise DataError(f"{path}: {ky} should be ({len(xs)},) to match {kx}, got shape {ys.shape}")
        bad = ~np.isfinite(xs.reshape(len(xs), -1).astype(np.float64)).all(axis=1)
        if bad.any():
            raise DataError(f"{path}: {kx} has NaN or infinite values (first in sample {int(np.argmax(bad))})")

    codes, classes = _encode_labels(np.concatenate([y, y_test]) if y_test is not None else y, path)
    if x.ndim == 3:  # (N, H, W) grey images: add the channel axis
        x, x_test = x[:, None], (x_test[:, None] if x_test is not None else None)
    xt = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
    yt = torch.from_numpy(codes)
    if x_test is not None:
        n = len(x)
        x_tr, y_tr, x_te, y_te = xt, yt[:n], torch.from_numpy(np.ascontiguousarray(x_test, dtype=np.float32)), yt[n:]
    else:
        tr, te = _stratified_indices(codes, test_size=cfg.test_fraction, seed=cfg.split_seed,
                                     what=f"dataset.test_fraction ({path})")
        x_tr, y_tr, x_te, y_te = xt[tr], yt[tr], xt[te], yt[te]
    modality = "vector" if x.ndim == 2 else "image"
    return DataSplit("arrays", modality, tuple(x.shape[1:]), len(classes), x_tr, y_tr, x_te, y_te,
                     None, None, classes)


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


def _read_npz_arrays(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]:
    z = formats.read_npz(path)
    for key in ("x", "y"):
        if key not in z:
            raise DataError(f"{path}: no {key!r} array (has: {', '.join(sorted(z)) or 'none'}); "
                            f"expected x (N, D) and y (N,), optionally x_test and y_test")
    if ("x_test" in z) != ("y_test" in z):
        raise DataError(f"{path}: has {'x_test' if 'x_test' in z else 'y_test'} without "
                        f"{'y_test' if 'x_test' in z else 'x_test'}; give both or neither")
    return z["x"], z["y"], z.get("x_test"), z.get("y_test")


def _read_csv_arrays(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]:
    header, rows = formats.read_csv(path)
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
        for r, row in enumerate(rows):  # find the first offending cell to name it
            for i in feature_cols:
                try:
                    float(row[i])
                except ValueError:
                    raise DataError(f"{path}: column {header[i]!r} is not numeric (data row {r + 1}: "
                                    f"{row[i]!r})") from None
        raise
    raw = np.char.strip(cells[:, header.index(label_col)])
    try:
        y = raw.astype(np.int64)
    except ValueError:
        y = raw  # string labels: classes are the sorted strings
    if "split" not in header:
        return x, y, None, None
    split = np.char.lower(np.char.strip(cells[:, header.index("split")]))
    unknown = set(split.tolist()) - {"train", "test"}
    if unknown:
        raise DataError(f"{path}: column 'split' should hold train or test, found {sorted(unknown)[0]!r}")
    train, test = split == "train", split == "test"
    if not train.any() or not test.any():
        raise DataError(f"{path}: column 'split' has no {'train' if not train.any() else 'test'} rows")
    return x[train], y[train], x[test], y[test]
