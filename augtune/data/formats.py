"""Readers for the raw files the data sets ship as: IDX, CIFAR pickles, STL-10 binaries, .npz, .csv.

Each reader returns numpy arrays exactly as stored (no scaling, no float conversion) and raises
:class:`DataError` with a one-line message naming the file when the file is missing or does not
have the format it claims. Scaling and tensors are :mod:`augtune.data.datasets`' business.
"""
from __future__ import annotations

import csv
import gzip
import io
import pickle
import zipfile
from pathlib import Path
from typing import Any

import numpy as np


class DataError(ValueError):
    """A data set that cannot be loaded, phrased as one line that says where and what to do."""


# ---------------------------------------------------------------------------------------------
# IDX (MNIST / Fashion-MNIST): http://yann.lecun.com/exdb/mnist/ "FILE FORMATS"
#
# bytes 0-1: zero; byte 2: element type; byte 3: number of dims; then one big-endian uint32 per
# dim; then the elements, big-endian, row-major. Fashion-MNIST: magic 2051 (uint8, 3 dims) for
# images (N, 28, 28) and 2049 (uint8, 1 dim) for labels (N,).

_IDX_TYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def read_idx(path: Path, ndim: int | None = None) -> np.ndarray:
    """The array in an IDX file, ``.gz`` or not; ``ndim`` checks the number of dims."""
    try:
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    except FileNotFoundError:
        raise DataError(f"{path}: file not found") from None
    except (OSError, EOFError, gzip.BadGzipFile) as e:
        raise DataError(f"{path}: cannot read ({e})") from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_TYPES:
        magic = int.from_bytes(raw[:4], "big") if len(raw) >= 4 else None
        raise DataError(f"{path}: not an IDX file (magic number {magic!r}; expected 0x08nn for uint8 data)")
    dims = raw[3]
    if ndim is not None and dims != ndim:
        raise DataError(f"{path}: IDX file has {dims} dims, expected {ndim}")
    header = 4 + 4 * dims
    if len(raw) < header:
        raise DataError(f"{path}: IDX header truncated")
    shape = tuple(int(d) for d in np.frombuffer(raw, dtype=">u4", count=dims, offset=4))
    dtype = np.dtype(_IDX_TYPES[raw[2]])
    expected = header + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(raw) != expected:
        raise DataError(f"{path}: IDX size mismatch: header says {shape} ({expected} bytes), file has {len(raw)} bytes")
    # frombuffer shares the decompressed bytes: no copy; native byte order for torch afterwards
    return np.frombuffer(raw, dtype=dtype, offset=header).reshape(shape).astype(dtype.newbyteorder("="), copy=False)


# ---------------------------------------------------------------------------------------------
# CIFAR python pickles (https://www.cs.toronto.edu/~kriz/cifar.html): written by Python 2's
# cPickle, each a dict with "data" uint8 (N, 3072) = (N, 3, 32, 32) row-major, and "labels"
# (CIFAR-10) or "fine_labels"/"coarse_labels" (CIFAR-100) as lists of ints.
#
# Unpickling can run arbitrary code, so only the globals those files need are allowed: numpy's
# array and dtype reconstruction, bytes from Python 3 protocol-2 pickles, and plain containers.

def _numpy_global(private: str, public: str, name: str) -> Any:
    import importlib

    try:  # numpy 2 moved numpy.core to numpy._core; importing the old name warns
        return getattr(importlib.import_module(private), name)
    except ImportError:
        return getattr(importlib.import_module(public), name)


def _safe_globals() -> dict[tuple[str, str], Any]:
    import _codecs
    import builtins

    reconstruct = _numpy_global("numpy._core.multiarray", "numpy.core.multiarray", "_reconstruct")
    frombuffer = _numpy_global("numpy._core.numeric", "numpy.core.numeric", "_frombuffer")
    allowed = {
        ("numpy", "ndarray"): np.ndarray,
        ("numpy", "dtype"): np.dtype,
        ("_codecs", "encode"): _codecs.encode,  # how protocol <3 pickles store bytes
    }
    for module in ("numpy.core.multiarray", "numpy._core.multiarray"):
        allowed[(module, "_reconstruct")] = reconstruct  # protocol <5 arrays
    for module in ("numpy.core.numeric", "numpy._core.numeric"):
        allowed[(module, "_frombuffer")] = frombuffer  # protocol 5 arrays
    for module in ("builtins", "__builtin__"):  # __builtin__: Python 2's name
        for name in ("bytes", "bytearray", "list", "dict", "tuple", "set", "frozenset"):
            allowed[(module, name)] = getattr(builtins, name)
    return allowed


class _RestrictedUnpickler(pickle.Unpickler):
    def __init__(self, file: Any, path: Path) -> None:
        # latin1: how numpy says to read Python 2 pickles of arrays (and what torchvision uses)
        super().__init__(file, encoding="latin1")
        self._path = path
        self._allowed = _safe_globals()

    def find_class(self, module: str, name: str) -> Any:
        try:
            return self._allowed[(module, name)]
        except KeyError:
            raise DataError(f"{self._path}: refusing to unpickle {module}.{name}: not a CIFAR data file") from None


def read_pickle_dict(path: Path) -> dict[str, Any]:
    """A CIFAR-style pickled dict, keys as ``str`` whether they were stored as str or bytes."""
    try:
        with open(path, "rb") as f:
            obj = _RestrictedUnpickler(f, path).load()
    except FileNotFoundError:
        raise DataError(f"{path}: file not found") from None
    except DataError:
        raise
    except Exception as e:  # a truncated or foreign file: pickle raises many kinds
        raise DataError(f"{path}: not a readable pickle ({type(e).__name__}: {e})") from None
    if not isinstance(obj, dict):
        raise DataError(f"{path}: expected a pickled dict, got {type(obj).__name__}")
    return {(k.decode("latin1") if isinstance(k, bytes) else k): v for k, v in obj.items()}


def _as_str(value: Any) -> str:
    return value.decode("latin1") if isinstance(value, bytes) else str(value)


def read_cifar_batch(path: Path, label_key: str) -> tuple[np.ndarray, np.ndarray]:
    """Images uint8 (N, 3, 32, 32) and labels int64 (N,) of one CIFAR batch file."""
    d = read_pickle_dict(path)
    for key in ("data", label_key):
        if key not in d:
            raise DataError(f"{path}: no {key!r} entry (has: {', '.join(sorted(map(str, d)))})")
    data = np.asarray(d["data"])
    labels = np.asarray(d[label_key], dtype=np.int64)
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
        raise DataError(f"{path}: 'data' should be uint8 (N, 3072), got {data.dtype} {data.shape}")
    if labels.shape != (data.shape[0],):
        raise DataError(f"{path}: {data.shape[0]} images but {labels.size} labels")
    return data.reshape(-1, 3, 32, 32), labels  # each row: 1024 R, 1024 G, 1024 B, rows of 32


def read_cifar_names(path: Path, key: str) -> tuple[str, ...] | None:
    """Class names from a CIFAR meta file; None when the file is absent (names are optional)."""
    if not path.is_file():
        return None
    d = read_pickle_dict(path)
    if key not in d:
        raise DataError(f"{path}: no {key!r} entry")
    return tuple(_as_str(n) for n in d[key])


# ---------------------------------------------------------------------------------------------
# STL-10 binaries (https://cs.stanford.edu/~acoates/stl10/): *_X.bin is uint8 with each image
# stored channel by channel, each channel column-major (Matlab order); *_y.bin is uint8 labels
# 1..10.

STL_SIDE = 96


def read_stl_images(path: Path) -> np.ndarray:
    """uint8 (N, 3, 96, 96) in row-major (C, H, W)."""
    raw = _read_bytes(path)
    per_image = 3 * STL_SIDE * STL_SIDE
    if len(raw) == 0 or len(raw) % per_image:
        raise DataError(f"{path}: {len(raw)} bytes is not a whole number of 3x96x96 images")
    x = np.frombuffer(raw, dtype=np.uint8).reshape(-1, 3, STL_SIDE, STL_SIDE)  # (N, C, W, H)
    return x.transpose(0, 1, 3, 2)  # column-major -> (N, C, H, W); a view, copied by the caller


def read_stl_labels(path: Path) -> np.ndarray:
    """int64 (N,) labels 0..9 (the file stores 1..10)."""
    y = np.frombuffer(_read_bytes(path), dtype=np.uint8).astype(np.int64)
    if y.size and (y.min() < 1 or y.max() > 10):
        raise DataError(f"{path}: labels should be 1..10, found {y.min()}..{y.max()}")
    return y - 1


def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise DataError(f"{path}: file not found") from None
    except OSError as e:
        raise DataError(f"{path}: cannot read ({e})") from None


# ---------------------------------------------------------------------------------------------
# A user's own arrays

def read_npz(path: Path) -> dict[str, np.ndarray]:
    """All arrays of an .npz; object arrays are refused (they would need pickle)."""
    try:
        z = np.load(path, allow_pickle=False)
        if not isinstance(z, np.lib.npyio.NpzFile):  # a .npy under an .npz name
            raise DataError(f"{path}: not an .npz archive; save with np.savez(path, x=..., y=...)")
        with z:
            return {k: z[k] for k in z.files}
    except FileNotFoundError:
        raise DataError(f"{path}: file not found") from None
    except ValueError as e:  # numpy: "Object arrays cannot be loaded when allow_pickle=False"
        raise DataError(f"{path}: cannot read ({e}); save plain numeric or string arrays") from None
    except (OSError, zipfile.BadZipFile, EOFError) as e:
        raise DataError(f"{path}: not a readable .npz file ({e})") from None


def read_csv(path: Path) -> tuple[list[str], list[list[str]]]:
    """Header and rows of a CSV file, as strings; every row must have the header's length."""
    try:
        text = path.read_text(encoding="utf-8-sig")  # utf-8-sig: drop a spreadsheet's BOM
    except FileNotFoundError:
        raise DataError(f"{path}: file not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"{path}: cannot read ({e})") from None
    rows = [r for r in csv.reader(io.StringIO(text)) if r]  # skip blank lines
    if not rows:
        raise DataError(f"{path}: empty CSV file")
    header, body = [h.strip() for h in rows[0]], rows[1:]
    for i, r in enumerate(body):
        if len(r) != len(header):
            raise DataError(f"{path}: data row {i + 1} has {len(r)} fields, the header has {len(header)}")
    return header, body
