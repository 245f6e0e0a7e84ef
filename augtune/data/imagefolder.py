"""`imagefolder`: a class-per-folder tree of JPEG/PNG files (ImageNet-100, Tiny-ImageNet, a user's photos).

``dataset.path`` is either a folder of class folders (split into train/test by ``test_fraction`` and
``split_seed``, stratified) or a folder holding ``train/`` and ``val/`` (or ``test/``) of class folders;
a class folder's images may sit in sub-folders (Tiny-ImageNet's ``train/<wnid>/images/``), and a
``val/`` of loose images with a ``val_annotations.txt`` (Tiny-ImageNet's) is read through that file.
Classes are the training class folders' names, sorted; hidden files and other suffixes are skipped.

Every image is decoded the same way in both modes: converted to RGB (grey, palette, CMYK and RGBA
alike, alpha dropped, as torchvision's ImageFolder), its shorter side resized to ``dataset.image_size``
(bilinear, antialiased) and centre-cropped to a square — the evaluation input; training views are
random resized crops of that square at the same size, made by whole batches on the device
(:class:`augtune.data.views.SimCLRView`), so the two modes train and evaluate on identical pixels:

- ``dataset.cache: memory``: decoded once, in ``dataset.workers`` processes, into uint8 (N, 3, S, S)
  (with ``dataset.shared``: one memory-mapped copy per node, decoded by the first trial);
- ``dataset.cache: none``: streamed, each batch decoded in ``torch.utils.data.DataLoader`` workers
  ahead of the step that needs it, for sets larger than memory.

The per-channel mean and std come from a seeded sample of at most :data:`STATS_SAMPLE` training images
(exact over that sample), the same in both modes.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

import numpy as np
import torch

from augtune.config import DatasetConfig
from augtune.data.batches import as_float
from augtune.data.datasets import (
    DataSplit,
    pixel_stats,
    refuse_lone_labels,
    register,
    stratified_indices,
    subsample_index,
)
from augtune.data.formats import DataError, check_fits

# torchvision's list
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
STATS_SAMPLE = 5000  # images the normalisation statistics are taken from: the mean to ~1e-3
_DECODE_BATCH = 64  # images per task of the one-time decode (`cache: memory`)


def decode(path: str | Path, size: int) -> np.ndarray:
    """The image at `path` as uint8 (3, size, size): RGB, shorter side resized to `size`, centre-cropped."""
    from PIL import Image, ImageOps

    try:
        with Image.open(path) as im:
            # JPEG: let libjpeg decode at 1/2..1/8 scale where the photo is that much larger than needed
            # (as PIL's thumbnail does): a 12-megapixel photo to 64 px costs a fraction of a full decode
            im.draft("RGB", (size, size))
            rgb = im.convert("RGB")
        out = ImageOps.fit(rgb, (size, size), Image.Resampling.BILINEAR)  # crop to square, then one resample
    except Exception as e:  # PIL raises OSError, SyntaxError, ValueError, DecompressionBombError, ...
        text = (str(e).strip().splitlines() or [""])[0][:160]
        raise DataError(f"{path}: cannot decode the image ({type(e).__name__}: {text})") from None
    return np.asarray(out).transpose(2, 0, 1)  # (H, W, 3) -> (3, H, W)


class _Decoder(torch.utils.data.Dataset):
    """A DataLoader dataset whose item is a whole batch: a list of rows -> (uint8 (B, 3, S, S), error).
    A bad file comes back as its one-line message, not as an exception (a worker's exception reaches the
    main process wrapped in its traceback text)."""

    def __init__(self, files: Sequence[str], size: int):
        self.files, self.size = files, size

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, rows: list[int]) -> tuple[torch.Tensor, str]:
        out = np.empty((len(rows), 3, self.size, self.size), dtype=np.uint8)
        for j, i in enumerate(rows):
            try:
                out[j] = decode(self.files[i], self.size)
            except DataError as e:
                return torch.empty(0, dtype=torch.uint8), str(e)
        return torch.from_numpy(out), ""


class ImageFiles:
    """The images of one split as files, decoded when asked: the streamed source of ``cache: none``.
    Indexing (``files[idx]``) decodes in this process (a figure's few samples, CoCor's labelled subset);
    :meth:`batches` decodes ahead in DataLoader workers (training steps, feature extraction)."""

    dtype = torch.uint8

    def __init__(self, files: Sequence[str | Path], size: int):
        self.files = tuple(str(f) for f in files)
        self.size = size

    def __len__(self) -> int:
        return len(self.files)

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (len(self.files), 3, self.size, self.size)

    def __repr__(self) -> str:
        return f"ImageFiles({len(self.files)} files, {self.size}x{self.size})"

    def _rows(self, index: Any) -> list[int]:
        if isinstance(index, slice):
            return list(range(len(self.files)))[index]
        rows = torch.as_tensor(index).reshape(-1).tolist()
        return [r + len(self.files) if r < 0 else r for r in rows]

    def __getitem__(self, index: Any) -> torch.Tensor:
        """uint8 (B, 3, S, S) of the rows `index` (a slice, a list or an integer tensor)."""
        x, err = _Decoder(self.files, self.size)[self._rows(index)]
        if err:
            raise DataError(err)
        return x

    def read(
        self, index: Iterable[torch.Tensor], workers: int = 0, pin: bool = False
    ) -> Iterator[torch.Tensor]:
        """uint8 (B, 3, S, S) for each index batch in turn, decoded ahead by `workers` processes."""
        from torch.utils.data import DataLoader

        # generator: DataLoader seeds its workers from it; without one it draws from the global torch RNG,
        # which the views draw from, and streaming would train differently from memory
        loader = DataLoader(
            _Decoder(self.files, self.size),
            sampler=[i.tolist() for i in index],
            batch_size=None,
            num_workers=workers,
            pin_memory=pin,
            generator=torch.Generator(),
        )
        for x, err in loader:
            if err:
                raise DataError(err)
            yield x

    def batches(
        self, index: Iterable[torch.Tensor], device: torch.device, workers: int = 0
    ) -> Iterator[torch.Tensor]:
        """float32 (B, 3, S, S) in [0, 1] on `device` (see :func:`augtune.data.batches.batches`)."""
        for x in self.read(index, workers, pin=device.type == "cuda"):
            yield as_float(x.to(device, non_blocking=True))

    def load(self, workers: int = 0) -> torch.Tensor:
        """Every image decoded into one uint8 (N, 3, S, S) tensor (``cache: memory``)."""
        out = torch.empty(self.shape, dtype=torch.uint8)
        order = torch.arange(len(self))
        chunks = [order[i:i + _DECODE_BATCH] for i in range(0, len(self), _DECODE_BATCH)]
        for rows, x in zip(chunks, self.read(chunks, workers)):
            out[rows[0]:rows[0] + len(rows)] = x
        return out


# ---------------------------------------------------------------------------------------------
# The tree

def _images_under(folder: Path) -> list[Path]:
    """Image files anywhere below `folder` (symbolic links followed: subsets are often link trees), sorted."""
    found = []
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=True):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        found += [Path(dirpath) / f for f in filenames
                  if not f.startswith(".") and f.lower().endswith(IMAGE_SUFFIXES)]
    return sorted(found)


UNLABELED = "unlabeled"  # the folder beside the class folders whose images have no label (not a class)


def _class_folders(folder: Path, unlabeled: Path | None = None) -> list[Path]:
    """The class folders of a split: its sub-folders, less hidden ones, `unlabeled/` and the folder of
    unlabelled images (`dataset.unlabeled_dir`, when it sits among them)."""
    skip = unlabeled.resolve() if unlabeled is not None else None
    return sorted(p for p in folder.iterdir()
                  if p.is_dir() and not p.name.startswith(".") and p.name != UNLABELED
                  and (skip is None or p.resolve() != skip))


def unlabeled_folder(cfg: DatasetConfig) -> Path | None:
    """The folder of unlabelled images: `dataset.unlabeled_dir` (relative to dataset.path), else the
    training folder's unlabeled/ where there is one; None: none."""
    root = _root(cfg)
    if cfg.unlabeled_dir is not None:
        folder = root / Path(cfg.unlabeled_dir).expanduser()
        if not folder.is_dir():
            raise DataError(f"dataset.unlabeled_dir: {folder} is not a folder")
        return folder
    folder = _split_dirs(root)[0] / UNLABELED
    return folder if folder.is_dir() else None


def unlabeled_files(folder: Path | None) -> list[Path]:
    """The images of the unlabelled `folder` (`unlabeled_folder`), at any depth, sorted (none: [])."""
    if folder is None:
        return []
    found = _images_under(folder)
    if not found:
        raise DataError(f"{folder}: the folder of unlabelled images holds no images "
                        f"({', '.join(IMAGE_SUFFIXES)})")
    return found


def _split_dirs(root: Path) -> tuple[Path, Path | None]:
    """(train folder, test folder or None): train/ with val/ or test/, or the root itself."""
    if not (root / "train").is_dir():
        return root, None
    test = next((root / d for d in ("val", "test") if (root / d).is_dir()), None)
    return root / "train", test


def _list_classes(folder: Path, classes: Sequence[str] | None, unlabeled: Path | None = None
                  ) -> tuple[list[Path], list[int], list[str]]:
    """Files and labels of a class-per-folder split; `classes` None: this split defines them."""
    dirs = _class_folders(folder, unlabeled)
    if classes is None:
        classes = [d.name for d in dirs]
    index = {c: i for i, c in enumerate(classes)}
    files: list[Path] = []
    labels: list[int] = []
    for d in dirs:
        if d.name not in index:
            raise DataError(
                f"{d}: class {d.name!r} is not among the training classes (train has {len(classes)})"
            )
        found = _images_under(d)
        if not found:
            raise DataError(f"{d}: class folder holds no images ({', '.join(IMAGE_SUFFIXES)})")
        files += found
        labels += [index[d.name]] * len(found)
    return files, labels, list(classes)


def _list_annotated(folder: Path, classes: Sequence[str]) -> tuple[list[Path], list[int]]:
    """Tiny-ImageNet's val/: images/ of loose files and val_annotations.txt ("file<TAB>wnid<TAB>box...")."""
    notes = folder / "val_annotations.txt"
    index = {c: i for i, c in enumerate(classes)}
    files, labels = [], []
    for n, line in enumerate(notes.read_text(encoding="utf-8", errors="replace").splitlines()):
        parts = line.split("\t")
        if not line.strip():
            continue
        if len(parts) < 2 or parts[1] not in index:
            raise DataError(f"{notes}: line {n + 1}: expected <file>\t<training class>, got {line[:80]!r}")
        path = folder / "images" / parts[0]
        if not path.is_file():
            raise DataError(f"{notes}: line {n + 1}: {path} not found")
        files.append(path)
        labels.append(index[parts[1]])
    return files, labels


def list_tree(root: Path, unlabeled: Path | None = None
              ) -> tuple[list[Path], list[int], list[Path] | None, list[int] | None, list[str]]:
    """(train files, labels, test files or None, labels or None, class names) of an image tree;
    `unlabeled`: its folder of unlabelled images (no class; with it, no class folder at all is a data set
    without labels)."""
    train_dir, test_dir = _split_dirs(root)
    files, labels, classes = _list_classes(train_dir, None, unlabeled)
    if not files and unlabeled is not None and test_dir is None:
        return [], [], [], [], []
    if not files:
        raise DataError(f"{train_dir}: no class folders of images (expected <class>/<image>.jpg|png ...)")
    if len(classes) < 2:  # before one image is decoded: every metric would score 1.0
        raise DataError(f"{train_dir}: one class folder only ({classes[0]!r}); the evaluation "
                        f"needs at least two classes (one folder of images per class)")
    if test_dir is None:
        return files, labels, None, None, classes
    if (test_dir / "val_annotations.txt").is_file() and not _class_folders(test_dir)[1:]:
        test_files, test_labels = _list_annotated(test_dir, classes)
    else:
        test_files, test_labels, _ = _list_classes(test_dir, classes, unlabeled)
    if not test_files:
        raise DataError(f"{test_dir}: no images (expected <class>/<image>.jpg|png ... as in {train_dir})")
    return files, labels, test_files, test_labels, classes


def tree_files(cfg: DatasetConfig) -> list[Path] | None:
    """Every file the split is read from (what a shared copy's key is computed over)."""
    root = _root(cfg)
    folder = unlabeled_folder(cfg)
    unlabeled = unlabeled_files(folder)
    train, _, test, *_ = list_tree(root, folder)
    return train + (test or []) + unlabeled + sorted(root.glob("*/val_annotations.txt"))


def _root(cfg: DatasetConfig) -> Path:
    if not cfg.path:
        raise DataError("dataset.path: the `imagefolder` dataset needs the folder of images "
                        "(class folders, or train/ and val/ of class folders)")
    root = Path(cfg.path).expanduser()
    if not root.is_dir():
        raise DataError(f"dataset.path: {root} is not a folder (expected class folders, or train/ and val/)")
    return root


# ---------------------------------------------------------------------------------------------
# The loader

def _pick(
    files: list[Path], labels: list[int], n: int | None, seed: int, what: str
) -> tuple[list[Path], np.ndarray]:
    """`max_train`/`max_test` applied to the file list, before anything is decoded."""
    y = np.asarray(labels, dtype=np.int64)
    idx = subsample_index(y, n, seed, what)
    if idx is None:
        return files, y
    return [files[i] for i in idx.tolist()], y[idx.numpy()]


def _stats(
    x: torch.Tensor | ImageFiles, seed: int, workers: int
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean/std of a seeded sample of at most STATS_SAMPLE training images (both modes alike)."""
    n = len(x)
    rows = torch.arange(n)
    if n > STATS_SAMPLE:
        rows = torch.from_numpy(np.sort(np.random.default_rng(seed).choice(n, STATS_SAMPLE, replace=False)))
    if isinstance(x, ImageFiles):
        chunks = [rows[i:i + _DECODE_BATCH] for i in range(0, len(rows), _DECODE_BATCH)]
        return pixel_stats(torch.cat(list(x.read(chunks, workers))))
    return pixel_stats(x[rows])


@register("imagefolder", sources=tree_files)
def load_imagefolder(cfg: DatasetConfig) -> DataSplit:
    """A class-per-folder tree of images at ``dataset.path`` (see the module doc)."""
    root = _root(cfg)
    folder = unlabeled_folder(cfg)
    unlabeled = unlabeled_files(folder)
    files, labels, test_files, test_labels, classes = list_tree(root, folder)
    if test_files is None:
        refuse_lone_labels(np.asarray(labels), tuple(classes), str(root))
        tr, te = stratified_indices(np.asarray(labels), test_size=cfg.test_fraction, seed=cfg.split_seed,
                                    what=f"dataset.test_fraction ({root})")
        test_files, test_labels = [files[i] for i in te.tolist()], [labels[i] for i in te.tolist()]
        files, labels = [files[i] for i in tr.tolist()], [labels[i] for i in tr.tolist()]
    files, y_train = _pick(files, labels, cfg.max_train, cfg.split_seed, "dataset.max_train")
    test_files, y_test = _pick(test_files, test_labels, cfg.max_test, cfg.split_seed, "dataset.max_test")
    size = cfg.image_size
    # the training images, then the unlabelled ones: one block, so that the rows trained on are a view
    x_fit: torch.Tensor | ImageFiles = ImageFiles([*files, *unlabeled], size)
    x_test: torch.Tensor | ImageFiles = ImageFiles(test_files, size)
    if cfg.cache == "memory":
        n = len(x_fit) + len(test_files)
        check_fits(root, n * 3 * size * size,
                   f"{n} images at {size} px in memory (dataset.cache: memory; `none` streams them)")
        x_fit, x_test = x_fit.load(cfg.workers), x_test.load(cfg.workers)
    mean, std = _stats(x_fit, cfg.split_seed, cfg.workers)
    if isinstance(x_fit, ImageFiles):  # streamed: each part its own list of files
        x_train, x_unlabeled = ImageFiles(files, size), (ImageFiles(unlabeled, size) if unlabeled else None)
    else:
        x_train, x_unlabeled = x_fit[:len(files)], (x_fit[len(files):] if unlabeled else None)
    return DataSplit(
        "imagefolder",
        "image",
        (3, size, size),
        len(classes),
        x_train,
        torch.from_numpy(y_train),
        x_test,
        torch.from_numpy(y_test),
        mean,
        std,
        tuple(classes),
        x_unlabeled,
    )
