"""Dataset registry and loaders: real digits and Fashion-MNIST, and small files written in each data
set's exact on-disk format (IDX, CIFAR pickles, STL-10 binaries, .npz, .csv); compact data (uint8 images,
float per batch), the shared per-node copy, and headers read before data. No network."""
from __future__ import annotations

import gzip
import os
import pickle
import socket
import struct
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from augtune.config import DatasetConfig
from augtune.data import DATASETS, DataError, DataSplit, as_float, load_dataset, register
from augtune.data import datasets as ds

FMNIST_DIR = Path("/usr/share/datasets/fashion-mnist")


class NetworkUsed(RuntimeError):
    pass


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    def refuse(*args, **kwargs):
        raise NetworkUsed("a dataset test tried to use the network")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


@pytest.fixture(autouse=True)
def cache_in_tmp(monkeypatch, tmp_path):
    # default_root() must never point at a real cache during tests
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


@pytest.fixture(autouse=True)
def share_small_files(monkeypatch):
    # the tests' files are small; below SHARED_MIN_BYTES a data set is not shared (tested on its own)
    monkeypatch.setattr(ds, "SHARED_MIN_BYTES", 0)


def test_network_is_refused_in_these_tests():
    with pytest.raises(NetworkUsed):
        socket.create_connection(("127.0.0.1", 9))


def load(**kw) -> DataSplit:
    return load_dataset(DatasetConfig(**kw))


def check_split(s: DataSplit) -> None:
    """What every DataSplit promises, whatever the loader."""
    for x, y in ((s.x_train, s.y_train), (s.x_test, s.y_test)):
        # images: uint8 pixel counts (float per batch) or float32; vectors: float32
        dtypes = (torch.uint8, torch.float32) if s.modality == "image" else (torch.float32,)
        assert x.dtype in dtypes and tuple(x.shape[1:]) == s.shape and x.is_contiguous()
        assert y.dtype == torch.int64 and y.shape == (len(x),)
        assert int(y.min()) >= 0 and int(y.max()) < s.num_classes
    assert len(s.classes) == s.num_classes
    if s.modality == "image":
        assert len(s.shape) == 3 and len(s.mean) == len(s.std) == s.shape[0]
    else:
        assert len(s.shape) == 1 and s.mean is None and s.std is None


def test_every_registered_dataset_is_tested():
    assert set(DATASETS) == {
        "digits",
        "fashion_mnist",
        "cifar10",
        "cifar100",
        "stl10",
        "arrays",
        "imagefolder",
    }
    # imagefolder: tests/test_imagefolder.py


# ---------------------------------------------------------------------------------------------
# digits (the embedded default)

def test_digits_shapes_and_stratified_split():
    s = load()
    check_split(s)
    assert (s.name, s.modality, s.shape, s.num_classes) == ("digits", "image", (1, 8, 8), 10)
    assert len(s.x_train) + len(s.x_test) == 1797
    assert len(s.x_test) == pytest.approx(0.3 * 1797, abs=1)
    assert float(s.x_train.min()) == 0.0 and float(s.x_train.max()) == 1.0  # pixel counts 0..16 / 16
    # stratified: each class keeps the 30% test share to within one sample
    n_tr, n_te = torch.bincount(s.y_train, minlength=10), torch.bincount(s.y_test, minlength=10)
    assert torch.all((n_te - 0.3 * (n_tr + n_te)).abs() <= 1)
    assert s.mean[0] == pytest.approx(float(s.x_train.mean()), abs=1e-6)


def test_digits_split_is_seeded():
    a, b, c = load(), load(), load(split_seed=1)
    assert torch.equal(a.x_train, b.x_train) and torch.equal(a.y_test, b.y_test)
    assert not torch.equal(a.y_train, c.y_train)
    assert len(load(test_fraction=0.5).y_test) == pytest.approx(1797 / 2, abs=1)


def test_digits_as_vectors_are_standardised():
    s = load(as_vectors=True)
    check_split(s)
    assert (s.modality, s.shape) == ("vector", (64,))
    x = s.x_train
    varies = x.std(0) > 0
    assert torch.allclose(x.mean(0), torch.zeros(64), atol=1e-5)
    assert torch.allclose(x[:, varies].std(0, correction=0), torch.ones(int(varies.sum())), atol=1e-4)
    assert varies.sum() < 64  # some corner pixels are always 0: left centred (0), not divided by 0
    assert torch.isfinite(s.x_test).all()
    raw = load(as_vectors=True, standardize=False)
    assert float(raw.x_train.min()) == 0.0 and float(raw.x_train.max()) == 1.0


def test_max_train_and_max_test_are_stratified_and_seeded():
    s = load(max_train=200, max_test=100)
    check_split(s)
    assert len(s.y_train) == 200 and len(s.y_test) == 100
    counts = torch.bincount(s.y_train, minlength=10)
    assert counts.min() >= 19 and counts.max() <= 21  # ~125 per class, scaled to 200 in all
    assert torch.equal(s.x_train, load(max_train=200, max_test=100).x_train)
    assert not torch.equal(s.y_train, load(max_train=200, split_seed=3).y_train)
    assert len(load(max_train=10**6).y_train) == len(load().y_train)  # larger than the data: all of it
    with pytest.raises(DataError, match="dataset.max_train"):
        load(max_train=5)  # fewer than the 10 classes


def test_unknown_dataset_name():
    with pytest.raises(DataError, match="unknown dataset 'nope'"):
        load(name="nope")


def test_register_a_loader_and_remap_its_labels(monkeypatch):
    monkeypatch.setattr(ds, "DATASETS", dict(DATASETS))

    @ds.register("pm_one")
    def pm_one(cfg):
        x = torch.arange(8, dtype=torch.float32).reshape(4, 2)
        y = torch.tensor([-1, 1, -1, 1])
        return DataSplit("pm_one", "vector", (2,), 2, x, y, x[:2], y[:2], None, None, ("neg", "pos"))

    s = load(name="pm_one", standardize=False)
    check_split(s)
    assert s.y_train.tolist() == [0, 1, 0, 1] and s.classes == ("neg", "pos")
    with pytest.raises(ValueError, match="already registered"):
        ds.register("pm_one")(lambda cfg: None)
    assert register is ds.register


# ---------------------------------------------------------------------------------------------
# Fashion-MNIST: the real files, and small IDX files in both accepted layouts

def write_idx(path: Path, arr: np.ndarray, magic: int | None = None) -> None:
    """IDX as the originals: 0, 0, type 0x08 (uint8), ndim; big-endian uint32 dims; the bytes."""
    arr = np.ascontiguousarray(arr, dtype=np.uint8)
    magic = (0x08 << 8 | arr.ndim) if magic is None else magic
    raw = struct.pack(">I", magic) + struct.pack(f">{arr.ndim}I", *arr.shape) + arr.tobytes()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(raw) if path.suffix == ".gz" else raw)


def write_fashion(folder: Path, gz: bool = True, n_train: int = 20, n_test: int = 10, seed: int = 0):
    rng = np.random.default_rng(seed)
    out = {}
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        x = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
        y = np.arange(n, dtype=np.uint8) % 10
        sfx = ".gz" if gz else ""
        write_idx(folder / f"{prefix}-images-idx3-ubyte{sfx}", x)
        write_idx(folder / f"{prefix}-labels-idx1-ubyte{sfx}", y)
        out[prefix] = (x, y)
    return out


@pytest.fixture(scope="module")
def real_fashion():
    if not (FMNIST_DIR / "train-images-idx3-ubyte.gz").is_file():
        pytest.skip(f"{FMNIST_DIR} absent (apt-get install -y dataset-fashion-mnist)")
    return load_dataset(DatasetConfig(name="fashion_mnist"))


def test_fashion_mnist_real(real_fashion):
    s = real_fashion
    check_split(s)
    assert (s.shape, s.num_classes, len(s.y_train), len(s.y_test)) == ((1, 28, 28), 10, 60000, 10000)
    assert torch.bincount(s.y_train).tolist() == [6000] * 10
    assert s.x_train.dtype == torch.uint8 and (int(s.x_train.min()), int(s.x_train.max())) == (0, 255)
    assert s.mean[0] == pytest.approx(0.2860, abs=1e-3) and s.std[0] == pytest.approx(0.3530, abs=1e-3)
    assert s.classes[0] == "T-shirt/top" and s.classes[9] == "Ankle boot"


@pytest.mark.parametrize("layout", ["flat_gz", "torchvision_raw"])
def test_fashion_mnist_small_files(tmp_path, layout):
    # flat: like /usr/share/datasets/fashion-mnist; torchvision: <root>/FashionMNIST/raw, uncompressed
    folder = tmp_path if layout == "flat_gz" else tmp_path / "FashionMNIST" / "raw"
    written = write_fashion(folder, gz=layout == "flat_gz")
    s = load(name="fashion_mnist", root=str(tmp_path))
    check_split(s)
    assert (len(s.y_train), len(s.y_test)) == (20, 10)
    x, y = written["train"]
    assert s.x_train.dtype == torch.uint8 and torch.equal(s.x_train[:, 0], torch.from_numpy(x))
    assert s.y_train.tolist() == y.tolist()


def test_fashion_mnist_corrupt_files(tmp_path):
    write_fashion(tmp_path)
    write_idx(tmp_path / "train-images-idx3-ubyte.gz", np.zeros((20, 28, 28)), magic=0x12345678)
    with pytest.raises(DataError, match="not an IDX file"):
        load(name="fashion_mnist", root=str(tmp_path))

    write_fashion(tmp_path)
    raw = gzip.decompress((tmp_path / "t10k-images-idx3-ubyte.gz").read_bytes())
    (tmp_path / "t10k-images-idx3-ubyte.gz").write_bytes(gzip.compress(raw[:-100]))  # truncated
    with pytest.raises(DataError, match="size mismatch"):
        load(name="fashion_mnist", root=str(tmp_path))

    write_fashion(tmp_path)
    write_idx(tmp_path / "train-labels-idx1-ubyte.gz", np.zeros(19, dtype=np.uint8))  # 19 labels, 20 images
    with pytest.raises(DataError, match="train-images"):
        load(name="fashion_mnist", root=str(tmp_path))


def test_fashion_mnist_missing_files(tmp_path, monkeypatch):
    with pytest.raises(DataError) as e:
        load(name="fashion_mnist", root=str(tmp_path / "empty"))
    assert str(tmp_path / "empty" / "train-images-idx3-ubyte.gz") in str(e.value)
    assert "\n" not in str(e.value)
    # no root and no Debian package: says how to get it
    monkeypatch.setattr(ds, "FASHION_MNIST_DIR", tmp_path / "nowhere")
    with pytest.raises(DataError, match="apt-get install -y dataset-fashion-mnist") as e:
        load(name="fashion_mnist")
    assert str(tmp_path / "nowhere" / "train-images-idx3-ubyte.gz") in str(e.value)


# ---------------------------------------------------------------------------------------------
# CIFAR-10/100: pickled dicts as in cifar-10-batches-py / cifar-100-python

class Py2Pickler(pickle._Pickler):
    """Pickles as Python 2's cPickle wrote the CIFAR files: protocol 2, every str and bytes as a
    Python 2 byte string (SHORT_BINSTRING/BINSTRING), numpy's reconstructor as numpy.core.multiarray."""
    dispatch = dict(pickle._Pickler.dispatch)

    def _save_py2_str(self, obj):
        raw = obj.encode("latin1") if isinstance(obj, str) else obj
        if len(raw) < 256:
            self.write(pickle.SHORT_BINSTRING + bytes([len(raw)]) + raw)
        else:
            self.write(pickle.BINSTRING + struct.pack("<i", len(raw)) + raw)
        self.memoize(obj)

    dispatch[str] = _save_py2_str
    dispatch[bytes] = _save_py2_str

    def save_global(self, obj, name=None):
        module = getattr(obj, "__module__", None) or ""
        if module.startswith("numpy._core"):  # numpy 2's private name; the files say numpy.core
            module = module.replace("numpy._core", "numpy.core")
            self.write(pickle.GLOBAL + f"{module}\n{name or obj.__name__}\n".encode())
            self.memoize(obj)
        else:
            super().save_global(obj, name)


def write_pickle(path: Path, obj, py2: bool = True) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        if py2:
            Py2Pickler(f, protocol=2).dump(obj)
        else:
            pickle.dump(obj, f)  # a Python 3 re-pickle, default protocol


def write_cifar10(root: Path, per_batch: int = 4, n_test: int = 10, key=str, seed: int = 0) -> np.ndarray:
    """5 train batches of `per_batch` images and a test batch; returns the train rows (N, 3072)."""
    rng = np.random.default_rng(seed)
    folder = root / "cifar-10-batches-py"
    py2 = key is str
    rows = []
    for i in range(1, 6):
        data = rng.integers(0, 256, size=(per_batch, 3072), dtype=np.uint8)
        labels = [int(v) for v in rng.integers(0, 10, per_batch)]
        write_pickle(
            folder / f"data_batch_{i}",
            {
                key("batch_label"): f"training batch {i} of 5",
                key("labels"): labels,
                key("data"): data,
                key("filenames"): [f"img{j}.png" for j in range(per_batch)],
            },
            py2,
        )
        rows.append(data)
    test = rng.integers(0, 256, size=(n_test, 3072), dtype=np.uint8)
    write_pickle(folder / "test_batch", {key("batch_label"): "testing batch 1 of 1", key("data"): test,
                                         key("labels"): [int(v) for v in rng.integers(0, 10, n_test)]}, py2)
    names = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
    write_pickle(folder / "batches.meta", {key("num_cases_per_batch"): 10000, key("label_names"): names,
                                           key("num_vis"): 3072}, py2)
    return np.concatenate(rows)


@pytest.mark.parametrize("key", [str, str.encode], ids=["python2_pickle", "python3_bytes_keys"])
def test_cifar10_small_files(tmp_path, key):
    rows = write_cifar10(tmp_path, key=key)
    s = load(name="cifar10", root=str(tmp_path))
    check_split(s)
    assert (s.shape, s.num_classes, len(s.y_train), len(s.y_test)) == ((3, 32, 32), 10, 20, 10)
    assert s.classes[1] == "automobile"
    back = s.x_train  # (N, 3, 32, 32) uint8
    # row layout: 1024 red then green then blue, each 32 rows of 32
    assert back[0, 0, 0, 1] == rows[0, 1]
    assert back[3, 1, 2, 5] == rows[3, 1024 + 2 * 32 + 5]
    assert back[19, 2, 31, 31] == rows[19, 3071]
    assert torch.equal(back.reshape(20, -1), torch.from_numpy(rows))


def test_cifar10_download_goes_through_torchvision(tmp_path, monkeypatch):
    calls = []

    class FakeCIFAR10:  # stands in for the network: writes the files where torchvision would
        def __init__(self, root, train=True, download=False):
            calls.append((root, download))
            write_cifar10(Path(root))

    # a stand-in torchvision (importing the real one takes seconds)
    tv, tvd = types.ModuleType("torchvision"), types.ModuleType("torchvision.datasets")
    tv.datasets, tvd.CIFAR10 = tvd, FakeCIFAR10
    monkeypatch.setitem(sys.modules, "torchvision", tv)
    monkeypatch.setitem(sys.modules, "torchvision.datasets", tvd)
    with pytest.raises(DataError):
        load(name="cifar10", root=str(tmp_path))  # download is off: never called
    assert calls == []
    s = load(name="cifar10", root=str(tmp_path), download=True)
    assert calls == [(str(tmp_path), True)] and len(s.y_train) == 20


def test_cifar100_small_files(tmp_path):
    rng = np.random.default_rng(1)
    folder = tmp_path / "cifar-100-python"
    data = {}
    for part, n in (("train", 20), ("test", 10)):
        data[part] = rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)
        fine = [int(v) for v in rng.integers(0, 100, n)]
        write_pickle(folder / part, {"filenames": ["x.png"] * n, "batch_label": part, "fine_labels": fine,
                                     "coarse_labels": [f // 5 for f in fine], "data": data[part]})
    write_pickle(folder / "meta", {"fine_label_names": [f"class{i}" for i in range(100)],
                                   "coarse_label_names": [f"super{i}" for i in range(20)]})
    s = load(name="cifar100", root=str(folder))  # root may also be the data folder itself
    check_split(s)
    assert (s.num_classes, len(s.y_train), len(s.y_test), s.classes[42]) == (100, 20, 10, "class42")
    back = s.x_test.reshape(10, -1)
    assert torch.equal(back, torch.from_numpy(data["test"]))


def test_cifar_missing_and_unsafe_files(tmp_path):
    with pytest.raises(DataError, match="dataset.download: true") as e:
        load(name="cifar10", root=str(tmp_path))
    assert str(tmp_path / "cifar-10-batches-py" / "data_batch_1") in str(e.value)
    with pytest.raises(DataError) as e:
        load(name="cifar100", root=str(tmp_path))
    assert str(tmp_path / "cifar-100-python" / "train") in str(e.value)

    class Evil:
        def __reduce__(self):
            return (os.getcwd, ())  # harmless stand-in for os.system

    write_cifar10(tmp_path)
    write_pickle(tmp_path / "cifar-10-batches-py" / "data_batch_3", {"data": Evil(), "labels": []})
    with pytest.raises(DataError, match="refusing to unpickle posix.getcwd|refusing to unpickle os.getcwd"):
        load(name="cifar10", root=str(tmp_path))

    write_cifar10(tmp_path)
    (tmp_path / "cifar-10-batches-py" / "test_batch").write_bytes(b"not a pickle")
    with pytest.raises(DataError, match="test_batch"):
        load(name="cifar10", root=str(tmp_path))


# ---------------------------------------------------------------------------------------------
# STL-10: uint8 binaries, each channel stored column-major; labels 1..10

def test_stl10_small_files(tmp_path):
    folder = tmp_path / "stl10_binary"
    folder.mkdir()
    side, plane = 96, 96 * 96
    rng = np.random.default_rng(2)
    imgs = {}
    for part, n in (("train", 20), ("test", 10)):
        chw = rng.integers(0, 256, size=(n, 3, side, side), dtype=np.uint8)  # (N, C, H, W)
        chw[0] = 0
        chw[0, 2, 3, 7] = 255  # one bright pixel: channel 2, row 3, column 7
        # column-major per channel: byte index of (h, w) is w * 96 + h
        (folder / f"{part}_X.bin").write_bytes(np.ascontiguousarray(chw.transpose(0, 1, 3, 2)).tobytes())
        (folder / f"{part}_y.bin").write_bytes(bytes([1 + i % 10 for i in range(n)]))
        imgs[part] = chw
    (folder / "class_names.txt").write_text("\n".join(
        ["airplane", "bird", "car", "cat", "deer", "dog", "horse", "monkey", "ship", "truck"]) + "\n")
    raw = (folder / "train_X.bin").read_bytes()
    assert raw[2 * plane + 7 * side + 3] == 255  # the file really is column-major

    s = load(name="stl10", root=str(tmp_path))
    check_split(s)
    assert (s.shape, len(s.y_train), len(s.y_test), s.classes[7]) == ((3, 96, 96), 20, 10, "monkey")
    assert s.y_train[:11].tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0]
    assert float(as_float(s.x_train)[0, 2, 3, 7]) == 1.0 and float(as_float(s.x_train)[0].sum()) == 1.0
    assert torch.equal(s.x_test, torch.from_numpy(imgs["test"]))

    (folder / "test_y.bin").write_bytes(bytes([1] * 9))
    with pytest.raises(DataError, match="9 labels for 10 images"):
        load(name="stl10", root=str(tmp_path))
    with pytest.raises(DataError, match="dataset.download: true") as e:
        load(name="stl10", root=str(tmp_path / "none"))
    assert str(tmp_path / "none" / "stl10_binary" / "train_X.bin") in str(e.value)


# ---------------------------------------------------------------------------------------------
# arrays: a user's .npz or .csv

def blobs(n_per_class=20, d=5, labels=(0, 1, 2), seed=0):
    rng = np.random.default_rng(seed)
    y = np.repeat(np.array(labels), n_per_class)
    x = rng.normal(size=(len(y), d)) * 3 + 10 + y[:, None]  # offset and scale: standardising matters
    return x, y


def test_arrays_npz_without_split(tmp_path):
    x, y = blobs()
    np.savez(tmp_path / "d.npz", x=x, y=y)
    s = load(name="arrays", path=str(tmp_path / "d.npz"))
    check_split(s)
    assert (s.modality, s.shape, s.num_classes) == ("vector", (5,), 3)
    assert len(s.y_test) == 18 and torch.bincount(s.y_test).tolist() == [6, 6, 6]  # 30%, stratified
    assert torch.allclose(s.x_train.mean(0), torch.zeros(5), atol=1e-5)
    assert torch.allclose(s.x_train.std(0, correction=0), torch.ones(5), atol=1e-5)
    raw = load(name="arrays", path=str(tmp_path / "d.npz"), standardize=False)
    rows = {tuple(r) for r in x.astype(np.float32).tolist()}
    assert all(tuple(r) in rows for r in raw.x_train.tolist())  # values as given


def test_arrays_npz_with_split_and_noncontiguous_labels(tmp_path):
    x, y = blobs(labels=(3, 7, 9))
    xt, yt = blobs(n_per_class=4, labels=(3, 7, 9), seed=1)
    np.savez(tmp_path / "d.npz", x=x, y=y, x_test=xt, y_test=yt)
    s = load(name="arrays", path=str(tmp_path / "d.npz"), standardize=False)
    check_split(s)
    assert (len(s.y_train), len(s.y_test), s.num_classes, s.classes) == (60, 12, 3, ("3", "7", "9"))
    assert s.y_train.tolist() == (y // 3 - 1).tolist()  # 3, 7, 9 -> 0, 1, 2
    assert torch.equal(s.x_test, torch.from_numpy(xt.astype(np.float32)))


def test_arrays_npz_images(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, size=(30, 2, 4, 4)).astype(np.float32)  # (N, C, H, W), kept as given
    np.savez(tmp_path / "img.npz", x=x, y=np.arange(30) % 3)
    s = load(name="arrays", path=str(tmp_path / "img.npz"))
    check_split(s)
    assert (s.modality, s.shape) == ("image", (2, 4, 4))
    assert float(s.x_train.min()) < 0
    v = load(name="arrays", path=str(tmp_path / "img.npz"), as_vectors=True)
    assert (v.modality, v.shape) == ("vector", (32,))


def test_arrays_csv(tmp_path):
    (tmp_path / "a.csv").write_text(
        "f1,f2,label,split\n"
        + "".join(
            f"{i},{i * 0.5},{'cat' if i % 2 else 'dog'},{'test' if i >= 8 else 'train'}\n" for i in range(12)
        )
    )
    s = load(name="arrays", path=str(tmp_path / "a.csv"), standardize=False)
    check_split(s)
    assert (s.shape, s.classes, len(s.y_train), len(s.y_test)) == ((2,), ("cat", "dog"), 8, 4)
    assert s.x_test[:, 0].tolist() == [8, 9, 10, 11] and s.y_test.tolist() == [1, 0, 1, 0]

    # a `y` column of integers, no split column: stratified split with test_fraction
    (tmp_path / "b.csv").write_text("y,a,b\n" + "".join(f"{5 + 2 * (i % 2)},{i},{-i}\n" for i in range(20)))
    s = load(name="arrays", path=str(tmp_path / "b.csv"), test_fraction=0.5)
    check_split(s)
    assert (s.classes, len(s.y_test), torch.bincount(s.y_test).tolist()) == (("5", "7"), 10, [5, 5])


def test_arrays_errors(tmp_path):
    x, y = blobs()
    cases = {
        "nokey.npz": (dict(x=x, labels=y), "no 'y' array"),
        "half.npz": (dict(x=x, y=y, x_test=x), "without y_test"),
        "len.npz": (dict(x=x, y=y[:-1]), "should be \\(60,\\)"),
        "strx.npz": (dict(x=x.astype(str), y=y), "numeric"),
    }
    xn = x.copy()
    xn[7, 2] = np.nan
    cases["nan.npz"] = (dict(x=xn, y=y), "NaN or infinite values \\(first in sample 7\\)")
    for name, (arrays, msg) in cases.items():
        np.savez(tmp_path / name, **arrays)
        with pytest.raises(DataError, match=msg):
            load(name="arrays", path=str(tmp_path / name))
    with open(tmp_path / "npy.npz", "wb") as f:
        np.save(f, x)  # a bare .npy under an .npz name
    with pytest.raises(DataError, match="not an .npz archive"):
        load(name="arrays", path=str(tmp_path / "npy.npz"))

    (tmp_path / "text.csv").write_text("a,b,label\n1,2,0\n3,oops,1\n")
    with pytest.raises(DataError, match="column 'b' is not numeric \\(data row 2: 'oops'\\)"):
        load(name="arrays", path=str(tmp_path / "text.csv"))
    (tmp_path / "nolabel.csv").write_text("a,b\n1,2\n")
    with pytest.raises(DataError, match="no 'label' \\(or 'y'\\) column"):
        load(name="arrays", path=str(tmp_path / "nolabel.csv"))
    (tmp_path / "ragged.csv").write_text("a,label\n1,0\n2\n")
    with pytest.raises(DataError, match="data row 2 has 1 fields"):
        load(name="arrays", path=str(tmp_path / "ragged.csv"))

    with pytest.raises(DataError) as e:
        load(name="arrays", path=str(tmp_path / "missing.npz"))
    assert str(tmp_path / "missing.npz") in str(e.value)
    with pytest.raises(DataError, match="dataset.path"):
        load(name="arrays")


# ---------------------------------------------------------------------------------------------
# Compact data: uint8 images become float per batch, with the very numbers the float32 copy held

def test_as_float_is_exactly_the_old_float32_division():
    every = torch.arange(256, dtype=torch.uint8)
    old = torch.from_numpy(np.arange(256, dtype=np.float32) / np.float32(255))  # the old loaders' values
    assert torch.equal(as_float(every), old)  # bitwise, for each of the 256 values
    x = torch.randint(0, 256, (3, 2, 5, 5), dtype=torch.uint8)
    assert torch.equal(as_float(x), x.float() / 255) and as_float(x).dtype == torch.float32
    f = torch.rand(4, 3)
    assert as_float(f) is f and as_float(f.double()).dtype == torch.float64  # float data passes untouched


def test_pixel_statistics_are_exact():
    rng = np.random.default_rng(0)
    x = torch.from_numpy(rng.integers(0, 256, size=(300, 3, 7, 5), dtype=np.uint8))
    mean, std = ds.pixel_stats(x)
    ref = as_float(x).double()  # float64 reference over the same float32 values
    assert mean == pytest.approx(ref.mean(dim=(0, 2, 3)).tolist(), rel=1e-7, abs=0)
    assert std == pytest.approx(ref.std(dim=(0, 2, 3), correction=0).tolist(), rel=1e-7, abs=0)
    assert ds.pixel_stats(torch.full((4, 1, 2, 2), 255, dtype=torch.uint8)) == ((1.0,), (0.0,))


def test_feature_statistics_are_chunked_float64(monkeypatch):
    monkeypatch.setattr(ds, "_CHUNK_BYTES", 8 * 6 * 100)  # 100 rows a step: many chunks and a short last one
    # a large offset and a small spread: float32 accumulation would lose the variance
    rng = np.random.default_rng(1)
    x = torch.from_numpy((1e4 + rng.normal(size=(1017, 6))).astype(np.float32))
    x[:, 5] = 3.0  # a constant feature: std 1, never 0
    mean, std = ds._feature_stats(x, lambda c: c)
    var_ref, mean_ref = torch.var_mean(x.double(), dim=0, correction=0)
    assert torch.allclose(mean.double(), mean_ref, rtol=1e-7, atol=0)
    assert torch.allclose(std[:5].double(), var_ref[:5].sqrt(), rtol=1e-6, atol=0)
    assert std[5] == 1.0 and mean.dtype == std.dtype == torch.float32
    # and the vectors come out z-scored in float32, as (x - mean) / std of the whole would be
    split = DataSplit(
        "v",
        "vector",
        (6,),
        2,
        x,
        torch.arange(1017) % 2,
        x[:5],
        torch.zeros(5, dtype=torch.long),
        None,
        None,
        ("a", "b"),
    )
    z = ds._vectors(split, lambda c: c, standardize=True)
    assert torch.equal(z.x_train, (x - mean) / std) and torch.equal(z.x_test, (x[:5] - mean) / std)


def _peak_mib(code: str) -> float:
    """Peak resident memory (MiB) a fresh interpreter gains running `code` after its imports."""
    import subprocess

    script = ("import resource, torch, numpy, sklearn.model_selection\n"
              "from augtune.config import DatasetConfig\nfrom augtune.data import load_dataset\n"
              "base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
              f"{code}\n"
              "print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    return float(out.stdout.split()[-1])


@pytest.mark.slow
def test_a_subset_of_fashion_mnist_loads_compactly(real_fashion):
    # the old path held the whole 60k split as float32 (188 MiB) before subsampling (peak +248 MiB), and
    # z-scored vectors through a float64 copy (peak +596 MiB): the compact path holds the file's uint8 bytes
    # (55 MiB in all) and floats of the subset only (measured +90 and +283 MiB)
    subset = _peak_mib(
        "load_dataset(DatasetConfig(name='fashion_mnist', max_train=2000, max_test=1000, shared=False))"
    )
    assert subset < 110, subset
    vectors = _peak_mib("load_dataset(DatasetConfig(name='fashion_mnist', as_vectors=True, shared=False))")
    assert vectors < 340, vectors  # the uint8 set (55 MiB) and the float32 vectors (219 MiB), nothing more


# ---------------------------------------------------------------------------------------------
# One shared copy per node

def _mapped_files(t: torch.Tensor) -> set[tuple[str, str]]:
    """(device:inode, path) of the file mappings of this process that hold tensor t's first byte."""
    ptr, found = t.data_ptr(), set()
    for line in Path("/proc/self/maps").read_text().splitlines():
        parts = line.split()
        lo, hi = (int(v, 16) for v in parts[0].split("-"))
        if len(parts) >= 6 and parts[4] != "0" and lo <= ptr < hi:  # inode 0: anonymous memory, the heap
            found.add((f"{parts[3]}:{parts[4]}", parts[5]))
    return found


needs_proc = pytest.mark.skipif(not Path("/proc/self/maps").is_file(), reason="needs Linux's /proc/self/maps")


@needs_proc
def test_two_loads_map_one_shared_file(tmp_path, monkeypatch):
    write_fashion(tmp_path / "fm", n_train=40, n_test=20)
    calls = []
    real = DATASETS["fashion_mnist"]
    monkeypatch.setitem(DATASETS, "fashion_mnist", lambda cfg: calls.append(1) or real(cfg))
    cfg = dict(name="fashion_mnist", root=str(tmp_path / "fm"), shared_dir=str(tmp_path / "shared"))
    a, b = load(**cfg), load(**cfg)
    assert calls == [1]  # the second load read no source file
    maps_a, maps_b = _mapped_files(a.x_train), _mapped_files(b.x_train)
    assert len(maps_a) == 1 and maps_a == maps_b  # both views lie in a mapping of the same file
    assert maps_a.pop()[1].startswith(str(tmp_path / "shared")) and torch.equal(a.x_train, b.x_train)
    # a private copy holds the same numbers
    private = load(**cfg, shared=False)
    assert torch.equal(private.x_train, a.x_train) and private.mean == a.mean and calls == [1, 1]
    assert _mapped_files(private.x_train) == set()


@pytest.mark.slow  # three fresh interpreters importing torch
@needs_proc
def test_concurrent_processes_share_one_copy(tmp_path):
    import subprocess

    write_fashion(tmp_path / "fm", n_train=1500, n_test=20)  # 1.2 MB of random pixels: above SHARED_MIN_BYTES
    code = (
        "import sys; sys.path.insert(0, %r)\n"
        "from test_datasets import _mapped_files\n"
        "from augtune.config import DatasetConfig\nfrom augtune.data import load_dataset\n"
        "s = load_dataset(DatasetConfig(name='fashion_mnist', root=%r, shared_dir=%r))\n"
        "print(sorted(_mapped_files(s.x_train))[0][0])\n"
    ) % (str(Path(__file__).parent), str(tmp_path / "fm"), str(tmp_path / "shared"))
    procs = [
        subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True) for _ in range(3)
    ]
    inodes = {p.communicate(timeout=300)[0].strip() for p in procs}
    assert all(p.returncode == 0 for p in procs) and len(inodes) == 1  # three processes, one file
    assert len([d for d in (tmp_path / "shared").iterdir() if d.is_dir()]) == 1  # built once, no leftovers


@pytest.mark.parametrize("damage", ["truncated", "flipped byte", "no meta", "foreign meta"])
def test_a_damaged_shared_copy_is_rebuilt_not_trusted(tmp_path, damage):
    write_fashion(tmp_path / "fm", n_train=40, n_test=20)
    cfg = dict(name="fashion_mnist", root=str(tmp_path / "fm"), shared_dir=str(tmp_path / "shared"))
    good = load(**cfg, shared=False)
    load(**cfg)
    (copy,) = [d for d in (tmp_path / "shared").iterdir() if d.is_dir()]
    x = copy / "x_train.npy"
    raw = bytearray(x.read_bytes())
    if damage == "truncated":
        x.write_bytes(raw[:-1000])
    elif damage == "flipped byte":
        raw[len(raw) // 2] ^= 0xFF
        x.write_bytes(raw)
    elif damage == "no meta":
        (copy / "meta.json").unlink()  # as a copy written by hand, or half-deleted
    else:
        (copy / "meta.json").write_text('{"format": 1, "arrays": {"x_train": 3}}')
    with pytest.warns(UserWarning, match="not intact"):
        again = load(**cfg)
    assert torch.equal(again.x_train, good.x_train) and torch.equal(again.y_test, good.y_test)
    assert load(**cfg).mean == good.mean  # and the rebuilt copy is trusted again, silently


def test_a_changed_source_file_makes_a_new_copy(tmp_path):
    write_fashion(tmp_path / "fm", n_train=40, n_test=20, seed=0)
    cfg = dict(name="fashion_mnist", root=str(tmp_path / "fm"), shared_dir=str(tmp_path / "shared"))
    first = load(**cfg)
    written = write_fashion(tmp_path / "fm", n_train=40, n_test=20, seed=1)
    # even with an old mtime: size/mtime key
    os.utime(tmp_path / "fm" / "train-images-idx3-ubyte.gz", ns=(1, 1))
    second = load(**cfg)
    assert torch.equal(second.x_train[:, 0], torch.from_numpy(written["train"][0]))
    assert not torch.equal(first.x_train, second.x_train)
    assert load(**cfg, max_train=20).x_train.shape[0] == 20  # settings are part of the key too


def test_an_unusable_shared_folder_costs_only_the_sharing(tmp_path):
    write_fashion(tmp_path / "fm", n_train=40, n_test=20)
    (tmp_path / "file").write_text("not a folder")
    with pytest.warns(UserWarning, match="keeps its own copy"):
        s = load(
            name="fashion_mnist", root=str(tmp_path / "fm"), shared_dir=str(tmp_path / "file" / "shared")
        )
    assert len(s.y_train) == 40 and torch.equal(
        s.x_train, load(name="fashion_mnist", root=str(tmp_path / "fm"), shared=False).x_train
    )


def test_small_sources_are_not_shared_and_unused_copies_are_evicted(tmp_path, monkeypatch):
    from augtune.data import cache

    write_fashion(tmp_path / "fm", n_train=40, n_test=20)
    cfg = dict(name="fashion_mnist", root=str(tmp_path / "fm"), shared_dir=str(tmp_path / "shared"))
    monkeypatch.setattr(ds, "SHARED_MIN_BYTES", 1 << 20)
    load(**cfg)
    assert not (tmp_path / "shared").exists()  # 30 KB of files: each process reads its own
    monkeypatch.setattr(ds, "SHARED_MIN_BYTES", 0)
    load(**cfg)
    (old,) = [d for d in (tmp_path / "shared").iterdir() if d.is_dir()]
    os.utime(old / "meta.json", (1, 1))  # last opened in 1970
    load(**cfg, max_train=20)  # a new copy is built: the unused one goes, with its lock
    assert not old.exists() and not (tmp_path / "shared" / f"{old.name}.lock").exists()
    (new,) = [d for d in (tmp_path / "shared").iterdir() if d.is_dir()]
    load(**cfg)  # rebuilt; the copy opened just now stays
    assert new.exists() and len([d for d in (tmp_path / "shared").iterdir() if d.is_dir()]) == 2
    monkeypatch.setattr(cache, "KEEP_DAYS", 0)
    with open(tmp_path / "shared" / f"{new.name}.lock", "a") as f:  # in use by another process: kept
        import fcntl

        fcntl.flock(f, fcntl.LOCK_EX)
        load(**cfg, max_train=30)
        assert new.exists()


def test_shared_dir_must_be_absolute():
    from augtune.config import ConfigError, from_dict

    with pytest.raises(ConfigError, match="dataset.shared_dir: expected an absolute path"):
        from_dict({"dataset": {"shared_dir": "relative/cache"}})
    assert from_dict({"dataset": {"shared_dir": "~/cache"}}).dataset.shared_dir == "~/cache"


# ---------------------------------------------------------------------------------------------
# STL-10's unlabelled split

def write_stl(folder: Path, n_train=20, n_test=10, n_unlabeled=0, seed=2) -> dict[str, np.ndarray]:
    """STL-10's binaries: uint8, each image channel by channel, each channel column-major; labels 1..10."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    out = {}
    for part, n in (("train", n_train), ("test", n_test), ("unlabeled", n_unlabeled)):
        if not n:
            continue
        chw = rng.integers(0, 256, size=(n, 3, 96, 96), dtype=np.uint8)
        (folder / f"{part}_X.bin").write_bytes(np.ascontiguousarray(chw.transpose(0, 1, 3, 2)).tobytes())
        if part != "unlabeled":
            (folder / f"{part}_y.bin").write_bytes(bytes([1 + i % 10 for i in range(n)]))
        out[part] = chw
    return out


def test_stl10_unlabeled_joins_pretraining_only(tmp_path):
    imgs = write_stl(tmp_path / "stl10_binary", n_unlabeled=30)
    s = load(name="stl10", root=str(tmp_path), unlabeled=True, shared=False)
    check_split(s)
    # evaluation: the labelled splits
    assert (len(s.x_train), len(s.x_unlabeled), len(s.x_test)) == (20, 30, 10)
    assert torch.equal(s.x_unlabeled, torch.from_numpy(imgs["unlabeled"]))
    x, y = s.pretrain()
    assert x.data_ptr() == s.x_train.data_ptr() and len(x) == 50  # one block: a view, not a copy
    assert (
        torch.equal(x[20:], s.x_unlabeled)
        and y[:20].tolist() == s.y_train.tolist()
        and set(y[20:].tolist()) == {-1}
    )
    pooled = np.concatenate([imgs["train"], imgs["unlabeled"]]).astype(np.float64) / 255
    assert s.mean[1] == pytest.approx(pooled[:, 1].mean(), rel=1e-6)  # normalised over what it trains on
    # without the flag, as before: no unlabelled images
    plain = load(name="stl10", root=str(tmp_path), shared=False)
    assert plain.x_unlabeled is None and plain.pretrain()[0] is plain.x_train
    # max_train: a stratified 10 of the labelled and a seeded 10 of the unlabelled
    small = load(name="stl10", root=str(tmp_path), unlabeled=True, max_train=10, shared=False)
    assert (len(small.x_train), len(small.x_unlabeled)) == (10, 10)
    rows = [
        int(np.flatnonzero((imgs["unlabeled"] == r.numpy()).all(axis=(1, 2, 3)))[0])
        for r in small.x_unlabeled
    ]
    assert rows == sorted(rows) and len(set(rows)) == 10
    # the shared copy keeps the block
    shared = load(name="stl10", root=str(tmp_path), unlabeled=True, shared_dir=str(tmp_path / "sh"))
    assert (
        torch.equal(shared.pretrain()[0], x) and shared.pretrain()[0].data_ptr() == shared.x_train.data_ptr()
    )


@pytest.mark.slow
def test_stl10_unlabeled_trains_on_the_union(tmp_path):
    from augtune.config import from_dict
    from augtune.trainables.loop import Trainer

    write_stl(tmp_path / "stl10_binary", n_train=20, n_test=10, n_unlabeled=44)
    cfg = from_dict({"dataset": {"name": "stl10", "root": str(tmp_path), "unlabeled": True, "shared": False},
                     "model": {"backbone": "cnn", "width": 4}, "train": {"epochs": 1, "batch_size": 16},
                     "eval": {"metrics": ["knn"], "references": False}})
    t = Trainer(cfg, load_dataset(cfg.dataset), log=lambda s: None)
    assert t.steps_per_epoch == 64 // 16 and len(t.y_train) == 64
    metrics = t.train_epoch()
    assert np.isfinite(metrics["loss"]) and 0 <= t.evaluate(("knn",))["knn_acc"] <= 1


def test_stl10_unlabeled_errors(tmp_path):
    from augtune.config import ConfigError, from_dict

    write_stl(tmp_path / "stl10_binary")
    with pytest.raises(DataError, match="unlabeled_X.bin not found"):
        load(name="stl10", root=str(tmp_path), unlabeled=True)
    with pytest.raises(ConfigError, match="dataset.unlabeled: only stl10"):
        from_dict({"dataset": {"name": "cifar10", "unlabeled": True}})
    (tmp_path / "stl10_binary" / "unlabeled_X.bin").write_bytes(b"\0" * 1000)
    with pytest.raises(DataError, match="not a whole number of 3x96x96 images"):
        load(name="stl10", root=str(tmp_path), unlabeled=True)


# ---------------------------------------------------------------------------------------------
# Headers first: sizes are checked before data is read or decompressed

def test_idx_header_is_checked_before_decompressing(tmp_path, monkeypatch):
    from augtune.data import formats

    write_fashion(tmp_path)
    path = tmp_path / "train-images-idx3-ubyte.gz"
    with gzip.open(path, "wb") as f:  # claims 10^6 images of 10^4 x 10^4: 10^14 bytes
        f.write(struct.pack(">IIII", 2051, 10**6, 10**4, 10**4) + b"\0" * 100)
    with pytest.raises(DataError, match=r"would need 90\.9 TiB of memory") as e:
        formats.read_idx(path, ndim=3)
    assert str(path) in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(DataError, match=r"header says shape \(1000000, 10000, 10000\), expected Nx28x28"):
        formats.read_idx(path, ndim=3, shape=(None, 28, 28))
    # a true bomb: a plausible header, then far more zeros than it says (read: its size, plus one byte)
    with gzip.open(path, "wb", compresslevel=1) as f:
        f.write(struct.pack(">IIII", 2051, 20, 28, 28))
        for _ in range(64):
            f.write(b"\0" * (1 << 20))
    with pytest.raises(DataError, match="IDX size mismatch.*holds more bytes than that"):
        load(name="fashion_mnist", root=str(tmp_path))
    # what fits the header but not the memory left is refused before it is read
    write_fashion(tmp_path)
    monkeypatch.setattr(formats, "available_memory", lambda: 1000)
    with pytest.raises(DataError, match="only 1000 bytes is available"):
        load(name="fashion_mnist", root=str(tmp_path))


def _npz_with_header(path: Path, shape: tuple[int, ...], payload: bytes = b"") -> None:
    """An .npz whose x.npy header claims `shape` float32 but holds `payload` (and a plain y)."""
    import io
    import zipfile

    head = io.BytesIO()
    np.lib.format.write_array_header_1_0(head, {"descr": "<f4", "fortran_order": False, "shape": shape})
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("x.npy", head.getvalue() + payload)
        buf = io.BytesIO()
        np.save(buf, np.zeros(4, dtype=np.int64))
        z.writestr("y.npy", buf.getvalue())


def test_npz_headers_are_checked_before_loading(tmp_path, monkeypatch):
    from augtune.data import formats

    _npz_with_header(tmp_path / "claims.npz", (2**24, 1024), b"\0" * 1024)  # 64 GiB claimed, 1 KiB held
    with pytest.raises(DataError, match=r"header says float32 \(16777216, 1024\).*the file is corrupt"):
        load(name="arrays", path=str(tmp_path / "claims.npz"))
    x = np.zeros((4, 1000), dtype=np.float32)
    np.savez_compressed(tmp_path / "ok.npz", x=x, y=np.arange(4) % 2)
    monkeypatch.setattr(formats, "available_memory", lambda: 10_000)
    with pytest.raises(DataError, match=r"its arrays \(x \(4, 1000\), y \(4,\)\) would need 15\.7 KiB"):
        load(name="arrays", path=str(tmp_path / "ok.npz"))
    monkeypatch.setattr(formats, "available_memory", lambda: None)  # unknown: no check
    s = load(name="arrays", path=str(tmp_path / "ok.npz"), shared=False)
    assert len(s.y_train) + len(s.y_test) == 4
    np.savez(tmp_path / "obj.npz", x=np.array([{"a": 1}] * 4, dtype=object), y=np.arange(4))
    with pytest.raises(DataError, match="holds Python objects"):
        load(name="arrays", path=str(tmp_path / "obj.npz"))
    (tmp_path / "empty.npz").write_bytes(b"")
    with pytest.raises(DataError, match="not a readable .npz file"):
        load(name="arrays", path=str(tmp_path / "empty.npz"))


def test_npz_memory_error_is_one_line(tmp_path, monkeypatch):
    np.savez(tmp_path / "d.npz", x=np.zeros((10, 3)), y=np.arange(10) % 2)

    def no_memory(*args, **kwargs):
        raise MemoryError

    monkeypatch.setattr(np.lib.format, "read_array", no_memory)
    with pytest.raises(DataError, match="not enough memory to read its arrays") as e:
        load(name="arrays", path=str(tmp_path / "d.npz"))
    assert "\n" not in str(e.value)


def test_arrays_uint8_images_are_pixel_counts_and_nan_is_found_past_the_first_chunk(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, size=(30, 3, 4, 4), dtype=np.uint8)
    np.savez(tmp_path / "img.npz", x=x, y=np.arange(30) % 3)
    s = load(name="arrays", path=str(tmp_path / "img.npz"), shared=False)
    check_split(s)
    assert s.x_train.dtype == torch.uint8  # held compact; as_float gives [0, 1]
    assert float(as_float(s.x_train).max()) <= 1.0
    v = load(name="arrays", path=str(tmp_path / "img.npz"), as_vectors=True, standardize=False, shared=False)
    assert v.x_train.dtype == torch.float32 and float(v.x_train.max()) <= 1.0
    xv = np.zeros((ds._CHUNK + 50, 3), dtype=np.float64)
    xv[ds._CHUNK + 7, 1] = np.inf
    np.savez(tmp_path / "inf.npz", x=xv, y=np.arange(len(xv)) % 2)
    with pytest.raises(DataError, match=f"first in sample {ds._CHUNK + 7}"):
        load(name="arrays", path=str(tmp_path / "inf.npz"))
    # float64 vectors: subsampled first, then float32
    xs = rng.normal(size=(200, 4))
    np.savez(tmp_path / "vec.npz", x=xs, y=np.arange(200) % 2)
    sv = load(name="arrays", path=str(tmp_path / "vec.npz"), max_train=20, standardize=False, shared=False)
    assert sv.x_train.dtype == torch.float32 and len(sv.x_train) == 20
    assert {tuple(r) for r in sv.x_train.tolist()} <= {tuple(r) for r in xs.astype(np.float32).tolist()}
