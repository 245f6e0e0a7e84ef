"""Readers for the raw files the data sets ship as: IDX, CIFAR pickles, STL-10 binaries, .npz, .csv.

Each reader returns numpy arrays exactly as stored (no scaling, no float conversion) and raises
:class:`DataError` with a one-line message naming the file when the file is missing or does not
have the format it claims. Scaling and tensors are :mod:`augtune.data.datasets`' business.

Headers come first: an IDX file's dims and every .npy header of an .npz are read and checked — the
size they claim against the memory left (:func:`check_fits`) and against what the file holds — before
one byte of data is decompressed, so that a gzip or zip bomb or a lying header is one line, not a
MemoryError; STL-10's binaries are memory-mapped, never read whole.
"""
from __future__ import annotations

import csv
import gzip
import io
import pickle
import zipfile
import zlib
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


def available_memory() -> int | None:
    """Bytes this process may still allocate: the kernel's MemAvailable, lowered to what the cgroup
    (a container, a Ray worker's limit) leaves; None where neither can be read (no check then)."""
    found = []
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append(int(line.split()[1]) * 1024)  # the file says kB
    except (OSError, ValueError, IndexError):
        pass
    try:  # cgroup v2: "max" when unlimited
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            found.append(int(limit) - int(Path("/sys/fs/cgroup/memory.current").read_text()))
    except (OSError, ValueError):
        pass
    return max(0, min(found)) if found else None


def check_fits(path: Path, nbytes: int, what: str) -> None:
    """Refuse, before reading, an array that its header says is bigger than the memory left."""
    free = available_memory()
    if free is not None and nbytes > free:
        raise DataError(
            f"{path}: {what} would need {_size(nbytes)} of memory, only {_size(free)} is available"
        )


def _size(n: int) -> str:
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


def _open_idx(path: Path) -> Any:
    """A binary stream of the IDX bytes: decompressed as it is read for ``.gz`` (never all at once)."""
    try:
        return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")
    except FileNotFoundError:
        raise DataError(f"{path}: file not found") from None
    except OSError as e:
        raise DataError(f"{path}: cannot read ({e})") from None


def _idx_header(f: Any, path: Path, ndim: int | None,
                shape: tuple[int | None, ...] | None) -> tuple[tuple[int, ...], np.dtype]:
    """(shape, dtype) from the magic number and dims at the start of the stream `f`, checked."""
    head = f.read(4)
    if len(head) < 4 or head[0] != 0 or head[1] != 0 or head[2] not in _IDX_TYPES:
        magic = int.from_bytes(head, "big") if len(head) == 4 else None
        raise DataError(f"{path}: not an IDX file (magic number {magic!r}; expected 0x08nn for uint8 data)")
    dims = head[3]
    if ndim is not None and dims != ndim:
        raise DataError(f"{path}: IDX file has {dims} dims, expected {ndim}")
    raw_dims = f.read(4 * dims)
    if len(raw_dims) < 4 * dims:
        raise DataError(f"{path}: IDX header truncated")
    dims_shape = tuple(int(d) for d in np.frombuffer(raw_dims, dtype=">u4"))
    if shape is not None and any(w is not None and w != d for w, d in zip(shape, dims_shape)):
        want = "x".join("N" if w is None else str(w) for w in shape)
        raise DataError(f"{path}: IDX header says shape {dims_shape}, expected {want}")
    return dims_shape, np.dtype(_IDX_TYPES[head[2]])


def read_idx(path: Path, ndim: int | None = None, shape: tuple[int | None, ...] | None = None) -> np.ndarray:
    """The array in an IDX file, ``.gz`` or not; ``ndim`` checks the number of dims, ``shape`` the dims
    (None: any). The header is read and checked first — the claimed size against the memory left —
    and only then exactly that many bytes are decompressed: a gzip bomb or a lying header costs
    nothing, and a file that holds more or fewer bytes than its header says is refused."""
    with _open_idx(path) as f:
        try:
            dims_shape, dtype = _idx_header(f, path, ndim, shape)
            nbytes = int(np.prod(dims_shape, dtype=object)) * dtype.itemsize  # object: no int64 overflow
            check_fits(path, nbytes, f"the IDX array {dims_shape}")
            data = bytearray(nbytes)  # filled in place: one copy of the data, never the whole file twice
            got = f.readinto(data)
            extra = len(f.read(1)) if got == nbytes else 0
        except (OSError, EOFError, zlib.error) as e:  # gzip.BadGzipFile is an OSError
            raise DataError(f"{path}: cannot read ({e})") from None
        except MemoryError:
            raise DataError(f"{path}: not enough memory to read {dims_shape}") from None
    if got != nbytes or extra:
        header = 4 + 4 * len(dims_shape)
        held = f"{header + got} bytes" if got != nbytes else "more bytes than that"
        raise DataError(f"{path}: IDX size mismatch: header says {dims_shape} ({header + nbytes} bytes), "
                        f"the file holds {held}")
    # frombuffer shares the bytes read: no copy; native byte order for torch afterwards
    return np.frombuffer(data, dtype=dtype).reshape(dims_shape).astype(dtype.newbyteorder("="), copy=False)


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
            raise DataError(
                f"{self._path}: refusing to unpickle {module}.{name}: not a CIFAR data file"
            ) from None


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
    """uint8 (N, 3, 96, 96) in row-major (C, H, W): a transposed view of a read-only memory map, so that
    the caller copies only the rows it keeps (the unlabelled split is 2.8 GB)."""
    per_image = 3 * STL_SIDE * STL_SIDE
    try:
        size = path.stat().st_size
        if size == 0 or size % per_image:
            raise DataError(f"{path}: {size} bytes is not a whole number of 3x96x96 images")
        x = np.memmap(path, dtype=np.uint8, mode="r").reshape(-1, 3, STL_SIDE, STL_SIDE)  # (N, C, W, H)
    except FileNotFoundError:
        raise DataError(f"{path}: file not found") from None
    except OSError as e:
        raise DataError(f"{path}: cannot read ({e})") from None
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
    """All arrays of an .npz. Every member's .npy header is read first: object arrays are refused (they
    would need pickle), a header that disagrees with the member's size is a corrupt file, and arrays
    bigger in all than the memory left are refused before one byte of them is decompressed."""
    _refuse_npy(path)
    try:
        with zipfile.ZipFile(path) as z:
            members = {info.filename[:-4]: info for info in z.infolist() if info.filename.endswith(".npy")}
            headers = {key: _npy_header(path, z, info) for key, info in members.items()}
            total = sum(nbytes for _, _, nbytes in headers.values())
            shapes = ", ".join(f"{k} {shape}" for k, (shape, _, _) in headers.items())
            check_fits(path, total, f"its arrays ({shapes})")
            out = {}
            for key, info in members.items():
                with z.open(info) as f:
                    out[key] = np.lib.format.read_array(f, allow_pickle=False)
            return out
    except FileNotFoundError:
        raise DataError(f"{path}: file not found") from None
    except MemoryError:
        raise DataError(f"{path}: not enough memory to read its arrays") from None
    except ValueError as e:  # numpy: a header or data it cannot read (short member, bad dtype)
        raise DataError(
            f"{path}: cannot read ({_one_line(e)}); save plain numeric or string arrays"
        ) from None
    except (OSError, zipfile.BadZipFile, EOFError, zlib.error) as e:
        raise DataError(f"{path}: not a readable .npz file ({_one_line(e)})") from None


def _refuse_npy(path: Path) -> None:
    """A bare .npy under an .npz name gets its own message (np.save instead of np.savez)."""
    try:
        with open(path, "rb") as f:
            head = f.read(6)
    except FileNotFoundError:
        raise DataError(f"{path}: file not found") from None
    except OSError as e:
        raise DataError(f"{path}: cannot read ({e})") from None
    if head == b"\x93NUMPY":
        raise DataError(f"{path}: not an .npz archive; save with np.savez(path, x=..., y=...)")


def _npy_header(
    path: Path, z: zipfile.ZipFile, info: zipfile.ZipInfo
) -> tuple[tuple[int, ...], np.dtype, int]:
    """(shape, dtype, bytes) from one member's .npy header, checked against the member's size."""
    fmt = np.lib.format
    with z.open(info) as f:
        version = fmt.read_magic(f)
        read = {(1, 0): fmt.read_array_header_1_0, (2, 0): fmt.read_array_header_2_0}.get(version)
        if read is None:  # 3.0: utf-8 field names; numpy reads it only through a private helper
            read = lambda f: fmt._read_array_header(f, version)  # noqa: E731
        shape, _, dtype = read(f)
        header_len = f.tell()
    if dtype.hasobject:
        raise DataError(f"{path}: array {info.filename[:-4]!r} holds Python objects (it would need pickle); "
                        f"save plain numeric or string arrays")
    nbytes = int(np.prod(shape, dtype=object)) * dtype.itemsize  # object: no int64 overflow
    if header_len + nbytes != info.file_size:
        raise DataError(
            f"{path}: array {info.filename[:-4]!r}: header says {dtype} {shape} ({nbytes} bytes), "
            f"the archive holds {info.file_size - header_len}; the file is corrupt"
        )
    return shape, dtype, nbytes


def _one_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:200]


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
