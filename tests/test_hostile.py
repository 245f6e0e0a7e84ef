"""Hostile input, the front door's promise: every bad config, CLI use, data file, checkpoint or
experiment folder gets one line naming the culprit, exit code 2 (bad input) or 1 (environment),
no traceback, and nothing already on disk is changed or added.

Each case builds its files in a fresh folder, runs `augtune.cli.main` in this process (no Ray is
started: every case is refused before that) and compares the folder before and after.
"""
from __future__ import annotations

import gzip
import hashlib
import os
import shutil
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
import torch
import yaml

from augtune.cli import main

TINY = {
    "dataset": {"name": "digits", "as_vectors": True, "max_train": 128, "max_test": 64},
    "model": {"backbone": "mlp", "hidden_dim": 16, "num_layers": 1, "embed_dim": 8, "proj_hidden_dim": 8,
              "proj_dim": 4},
    "train": {"epochs": 1, "batch_size": 32, "num_threads": 1},
    "eval": {"every": 0, "epoch_metrics": [], "metrics": ["knn"], "references": False, "figures": []},
}


def write_yaml(path: Path, data) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """A completed one-epoch run (record, config, checkpoint) that cases copy and attack."""
    root = tmp_path_factory.mktemp("finished")
    cfg = write_yaml(root / "tiny.yaml", TINY)
    assert main(["train", str(cfg), "--out", str(root / "run")]) == 0
    return root / "run"


@dataclass
class Case:
    name: str
    args: Callable[[Path], list[str]]  # the CLI words, given the case's folder
    make: Callable[[Path], None] = lambda d: None  # files the case starts from
    code: int = 2
    says: str = ""  # a piece of the one line
    needs_run: bool = False  # starts from a copy of `finished_run` at d/run


def _cfg(d: Path, **sections) -> Path:
    data = {k: dict(v) for k, v in TINY.items()}
    for k, v in sections.items():
        data.setdefault(k, {}).update(v)
    return write_yaml(d / "c.yaml", data)


def _bytes(name: str, data: bytes) -> Callable[[Path], None]:
    return lambda d: (d / name).write_bytes(data)


def _bomb() -> bytes:
    lines = ['a0: &a0 ["x","x","x","x","x","x","x","x","x"]']
    for i in range(1, 9):
        lines.append(f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]")
    return ("\n".join(lines) + "\ntrain: *a8\n").encode()


def _train(*extra: str, cfg: str = "c.yaml") -> Callable[[Path], list[str]]:
    return lambda d: ["train", str(d / cfg), "--out", str(d / "out"), *extra]


def _train_on(name: str, key: str, file: str) -> Callable[[Path], list[str]]:
    """`augtune train` on data set `name` whose `dataset.<key>` is the test's own `file`."""
    return lambda d: ["train", str(d / "c.yaml"), "--set", f"dataset.name={name}", "--set",
                      f"dataset.{key}={d / file}", "--out", str(d / "out")]


def _resume(*extra: str) -> Callable[[Path], list[str]]:
    return lambda d: ["train", "--resume", "--out", str(d / "run"), *extra]


def _ckpt(d: Path, what) -> None:
    path = d / "run" / "checkpoint.pt"
    if what == "truncated":
        path.write_bytes(path.read_bytes()[:1000])
    elif what == "garbage":
        path.write_bytes(b"not a checkpoint at all")
    else:
        torch.save(what, path)


def _ckpt_epoch(d: Path, epoch: int) -> None:
    """The run's own checkpoint, claiming `epoch` epochs done."""
    path = d / "run" / "checkpoint.pt"
    state = torch.load(path, weights_only=True)
    state["epoch"] = epoch
    torch.save(state, path)


def _edit_record(d: Path, edit: Callable[[dict], None]) -> None:
    import json

    path = d / "run" / "record.json"
    record = json.loads(path.read_text())
    edit(record)
    path.write_text(json.dumps(record))


def _nested_record(d: Path) -> None:
    """The run's record with a value nested 100,000 lists deep (Python's JSON parser recurses)."""
    path = d / "run" / "record.json"
    text = path.read_text().rstrip()
    path.write_text(text[:-1] + ', "x": ' + "[" * 100_000 + "]" * 100_000 + "}")


def _corrupt_compare(d: Path) -> None:
    """A compare's folder whose plan file is not YAML (hand-edited)."""
    (d / "exp").mkdir()
    (d / "exp" / "augtune_compare.yaml").write_text("config: [unclosed\n")


def _idx_bomb(d: Path) -> None:
    """Fashion-MNIST's IDX layout whose header claims 10^6 images of 10^4 x 10^4 pixels."""
    root = d / "fm"
    root.mkdir()
    for split, n in (("train", 10**6), ("t10k", 10**6)):
        with gzip.open(root / f"{split}-images-idx3-ubyte.gz", "wb") as f:
            f.write(struct.pack(">IIII", 2051, n, 10**4, 10**4))
            f.write(b"\0" * (1 << 20))
        with gzip.open(root / f"{split}-labels-idx1-ubyte.gz", "wb") as f:
            f.write(struct.pack(">II", 2049, n) + b"\0" * 1000)


def _idx_true_bomb(d: Path) -> None:
    """An 8 MiB gzip IDX that inflates to 8 GiB: a plausible header (20 images), then zeros in 128 gzip
    members of 64 MiB each (gzip readers join members; one compressed member, written 128 times)."""
    root = d / "fm"
    _idx_bomb(d)  # the label files and the test split; the train images are replaced
    zeros = gzip.compress(b"\0" * (64 << 20), compresslevel=9)
    with open(root / "train-images-idx3-ubyte.gz", "wb") as f:
        f.write(gzip.compress(struct.pack(">IIII", 2051, 20, 28, 28) + b"\0" * (20 * 28 * 28)))
        for _ in range(128):
            f.write(zeros)


def _npz_claims(d: Path) -> None:
    """A 1 KiB .npz whose x.npy header claims (2^24, 1024) float32: 64 GiB."""
    import io
    import zipfile

    head = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        head, {"descr": "<f4", "fortran_order": False, "shape": (2**24, 1024)}
    )
    with zipfile.ZipFile(d / "x.npz", "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("x.npy", head.getvalue() + b"\0" * 1024)
        z.writestr("y.npy", _npy(np.zeros(4, dtype=np.int64)))


def _npy(a: np.ndarray) -> bytes:
    import io

    buf = io.BytesIO()
    np.save(buf, a)
    return buf.getvalue()


def _image_tree(d: Path, damage: str) -> None:
    """A class-per-folder tree of PNGs with one damage: a corrupt file, an empty class folder, no images."""
    from PIL import Image

    for c in range(1 if damage == "one class" else 3):
        (d / "imgs" / f"c{c}").mkdir(parents=True)
        if damage != "no images":
            for i in range(4):
                Image.fromarray(np.full((8, 8), 60 * c + i, np.uint8)).save(d / "imgs" / f"c{c}" / f"{i}.png")
    if damage == "corrupt":
        (d / "imgs" / "c1" / "2.png").write_bytes(b"\x89PNG\r\n\x1a\n but then nothing")
    elif damage == "empty class":
        (d / "imgs" / "c3").mkdir()


def _images(damage: str) -> Callable[[Path], None]:
    return lambda d: (_cfg(d, dataset={"name": "imagefolder", "path": str(d / "imgs"), "as_vectors": False,
                                       "image_size": 8, "workers": 0}), _image_tree(d, damage))


def _stl_without_unlabeled(folder: Path) -> None:
    folder.mkdir()
    for part in ("train", "test"):  # one black image labelled 1, and no unlabeled_X.bin
        (folder / f"{part}_X.bin").write_bytes(b"\0" * 3 * 96 * 96)
        (folder / f"{part}_y.bin").write_bytes(b"\1")


def _search_folder(d: Path, text: str) -> None:
    (d / "exp").mkdir()
    (d / "exp" / "augtune_search.yaml").write_text(text)


CASES = [
    # configs
    Case("config missing", lambda d: ["train", str(d / "nope.yaml")], says="config file not found"),
    Case("config is a folder", lambda d: ["train", str(d)], says="not a file"),
    Case(
        "latin-1 config",
        _train(),
        _bytes("c.yaml", "train:\n  lr: 0.1  # caf\xe9\n".encode("latin-1")),
        says="not UTF-8",
    ),
    Case(
        "duplicate keys",
        _train(),
        _bytes("c.yaml", b"train:\n  lr: 0.1\n  lr: 0.2\n"),
        says="duplicate key 'lr'",
    ),
    Case("anchor bomb", _train(), _bytes("c.yaml", _bomb()), says="expands to more than"),
    Case(
        "config nested 100,000 deep",
        _train(),
        _bytes("c.yaml", b"train: " + b"[" * 100_000 + b"]" * 100_000 + b"\n"),
        says="c.yaml: nested too deep to read",
    ),
    Case("not YAML", _train(), _bytes("c.yaml", b"train: [unclosed\n"), says="not valid YAML"),
    Case("top-level list", _train(), _bytes("c.yaml", b"- 1\n- 2\n"), says="expected a mapping of sections"),
    Case("unknown key", _train(), lambda d: _cfg(d, trian={"lr": 1}), says="trian: unknown key"),
    Case(
        "warmup inf",
        _train(),
        lambda d: _cfg(d, train={"warmup_epochs": float("inf")}),
        says="train.warmup_epochs: expected a finite number",
    ),
    Case(
        "temperature inf",
        _train(),
        lambda d: _cfg(d, train={"temperature": float("inf")}),
        says="train.temperature: expected a finite number",
    ),
    Case(
        "lr 1e308",
        _train(),
        lambda d: _cfg(d, train={"lr": 1e308}),
        says="train.lr: expected a number <= 100",
    ),
    Case(
        "lr NaN", _train(), lambda d: _cfg(d, train={"lr": float("nan")}), says="train.lr: expected a finite"
    ),
    Case(
        "cpus inf",
        _train(),
        lambda d: _cfg(d, resources={"cpus_per_worker": float("inf")}),
        says="resources.cpus_per_worker: expected a finite number",
    ),
    Case(
        "cpus 1e9",
        _train(),
        lambda d: _cfg(d, resources={"cpus_per_worker": 1e9}),
        says="resources.cpus_per_worker: expected a number <= 1024",
    ),
    Case(
        "huge integer",
        _train(),
        _bytes("c.yaml", b"train:\n  lr: 1" + b"0" * 400 + b"\n"),
        says="train.lr: expected a number",
    ),
    Case(
        "method twice",
        _train("--set", "method.augment=[pinda, pinda]"),
        lambda d: _cfg(d),
        says="method.augment: lists a method twice",
    ),
    Case(
        "bad --set", _train("--set", "train.lr=[1,"), lambda d: _cfg(d), says="train.lr: could not read value"
    ),
    Case("--set without =", _train("--set", "train.lr"), lambda d: _cfg(d), says="expected KEY=VALUE"),
    Case(
        "figure unknown",
        _train("--set", "eval.figures=[nope]"),
        lambda d: _cfg(d),
        says="eval.figures[0]: unknown figure 'nope'",
    ),
    Case(
        "batch larger than data",
        _train("--set", "train.batch_size=4096"),
        lambda d: _cfg(d),
        says="train.batch_size: 4096 is larger than the training set",
    ),
    # run folders
    Case(
        "seed of 71 digits",
        _train("--set", "train.seed=2" + "0" * 70),
        lambda d: _cfg(d),
        says="train.seed: expected a number <= 4294967295, got 2000",
    ),
    Case(
        "seed of 71 digits in the file",
        _train(),
        lambda d: _cfg(d, train={"seed": 2 * 10**70}),
        says="train.seed: expected a number <= 4294967295",
    ),
    Case(
        "negative split seed",
        _train("--set", "dataset.split_seed=-1"),
        lambda d: _cfg(d),
        says="dataset.split_seed: expected a number >= 0, got -1",
    ),
    Case(
        "a number of 5000 digits",
        _train(),
        _bytes("c.yaml", b"train:\n  seed: 1" + b"0" * 5000 + b"\n"),
        says="c.yaml: a number at line 2 has thousands of digits",
    ),
    Case(
        "width 1e12",
        _train("--set", "model.backbone=cnn", "--set", "dataset.as_vectors=false", "--set",
               "model.width=1000000000000"),
        lambda d: _cfg(d),
        says="model.width: 1e+12 makes a model that needs at least",
    ),
    Case(
        "hidden_dim 1e12",
        _train("--set", "model.num_layers=2", "--set", "model.hidden_dim=1000000000000"),
        lambda d: _cfg(d),
        says="model.hidden_dim: 1e+12 makes a model that needs at least",
    ),
    Case(
        "diffusion steps 1e12",
        _train("--set", "method.augment=[diffaug]", "--set", "diffaug.steps=1000000000000"),
        lambda d: _cfg(d),
        says="diffaug.steps: 1e+12 makes networks that need more than a tensor can index",
    ),
    Case(
        "knn_k beyond the data",
        _train("--set", "eval.knn_k=100000"),
        lambda d: _cfg(d),
        says="eval.knn_k: 100,000 is not below the 128 training samples",
    ),
    Case(
        "knn_k beyond the per-epoch subsample",
        _train("--set", "eval.knn_k=30", "--set", "eval.epoch_metrics=[knn]", "--set",
               "eval.monitor_size=20"),
        lambda d: _cfg(d),
        says="eval.knn_k: 30 is not below eval.monitor_size (20)",
    ),
    Case(
        "--out is a file",
        lambda d: ["train", str(d / "c.yaml"), "--out", str(d / "c.yaml")],
        lambda d: _cfg(d),
        says="is a file, not a folder",
    ),
    Case(
        "--out under a file",
        lambda d: ["train", str(d / "c.yaml"), "--out", str(d / "c.yaml" / "run")],
        lambda d: _cfg(d),
        says="is a file, not a folder",
    ),
    Case(
        "--out name too long",
        lambda d: ["train", str(d / "c.yaml"), "--out", str(d / ("x" * 300))],
        lambda d: _cfg(d),
        says="longer than 255 bytes",
    ),
    Case(
        "--out holds the user's files",
        lambda d: ["train", str(d / "c.yaml"), "--out", str(d)],
        lambda d: _cfg(d),
        says="holds other files and no augtune run",
    ),
    Case(
        "--out holds a run",
        lambda d: ["train", str(d / "run" / "config.yaml"), "--out", str(d / "run")],
        needs_run=True,
        says="already holds a run",
    ),
    Case("resume a completed run", _resume(), needs_run=True, says="has completed all 1 epochs"),
    Case(
        "resume with another config",
        _resume("--set", "train.lr=0.5", "--set", "train.epochs=3"),
        needs_run=True,
        says="differs from the run's own in train.lr",
    ),
    Case(
        "resume with fewer epochs",
        _resume("--set", "train.epochs=0"),
        needs_run=True,
        says="train.epochs: expected a number >= 1",
    ),
    Case(
        "resume nothing",
        lambda d: ["train", "--resume", "--out", str(d / "empty")],
        says="holds no augtune run",
    ),
    Case(
        "resume truncated checkpoint",
        _resume("--set", "train.epochs=2"),
        lambda d: _ckpt(d, "truncated"),
        needs_run=True,
        says="not a readable checkpoint",
    ),
    Case(
        "resume garbage checkpoint",
        _resume("--set", "train.epochs=2"),
        lambda d: _ckpt(d, "garbage"),
        needs_run=True,
        says="not a readable checkpoint",
    ),
    Case(
        "resume foreign checkpoint",
        _resume("--set", "train.epochs=2"),
        lambda d: _ckpt(d, {"weights": [1, 2]}),
        needs_run=True,
        says="not an augtune checkpoint",
    ),
    Case(
        "plot a truncated checkpoint",
        lambda d: ["plot", "umap", str(d / "run"), "--out", str(d / "figs")],
        lambda d: _ckpt(d, "truncated"),
        needs_run=True,
        says="checkpoint",
    ),
    Case(
        "resume a checkpoint claiming epoch 99 of 3",
        _resume("--set", "train.epochs=3"),
        lambda d: _ckpt_epoch(d, 99),
        needs_run=True,
        says="checkpoint.pt: claims epoch 99 of a run of 3 (train.epochs)",
    ),
    Case(
        "resume a checkpoint whose history disagrees",
        _resume("--set", "train.epochs=3"),
        lambda d: _ckpt_epoch(d, 2),
        needs_run=True,
        says="checkpoint.pt: claims epoch 2 but holds the history of 1",
    ),
    Case(
        "plot a run whose recorded config is invalid",
        lambda d: ["plot", "umap", str(d / "run"), "--out", str(d / "figs")],
        lambda d: _edit_record(d, lambda r: r["config"]["train"].update(lr=-1)),
        needs_run=True,
        says="record.json: the recorded config is not valid: train.lr: expected a number > 0",
    ),
    Case(
        "plot a run whose recorded base is unknown",
        lambda d: ["plot", "umap", str(d / "run"), "--out", str(d / "figs")],
        lambda d: _edit_record(d, lambda r: r["config"]["method"].update(base="nope")),
        needs_run=True,
        says="the recorded config is not valid: method.base: unknown base method 'nope'",
    ),
    Case(
        "export a record nested 100,000 deep",
        lambda d: ["export", str(d / "run")],
        _nested_record,
        needs_run=True,
        says="record.json: nested more than 64 deep",
    ),
    Case(
        "plot a record nested 100,000 deep",
        lambda d: ["plot", "umap", str(d / "run"), "--out", str(d / "figs")],
        _nested_record,
        needs_run=True,
        says="record.json: nested more than 64 deep",
    ),
    Case("plot nothing", lambda d: ["plot", "umap", str(d / "none")], says="no such file or folder"),
    Case("plot unknown kind", lambda d: ["plot", "nope", str(d)], says="unknown figure 'nope'"),
    # data
    Case(
        "arrays without path",
        _train("--set", "dataset.name=arrays"),
        lambda d: _cfg(d),
        says="dataset.path: the `arrays` dataset needs",
    ),
    Case(
        "arrays missing file",
        _train("--set", "dataset.name=arrays", "--set", "dataset.path=/nonexistent/x.npz"),
        lambda d: _cfg(d),
        says="/nonexistent/x.npz",
    ),
    Case(
        "empty csv",
        _train_on("arrays", "path", "x.csv"),
        lambda d: (_cfg(d), (d / "x.csv").write_text("")),
        says="x.csv",
    ),
    Case(
        "csv without label",
        _train_on("arrays", "path", "x.csv"),
        lambda d: (_cfg(d), (d / "x.csv").write_text("a,b\n1,2\n3,4\n")),
        says="x.csv",
    ),
    Case(
        "npz without y",
        _train_on("arrays", "path", "x.npz"),
        lambda d: (_cfg(d), np.savez(d / "x.npz", x=np.zeros((10, 3)))),
        says="x.npz",
    ),
    Case(
        "idx gzip bomb",
        _train_on("fashion_mnist", "root", "fm"),
        lambda d: (_cfg(d), _idx_bomb(d)),
        says="fm",
    ),
    Case(
        "idx gzip bomb of zeros",
        _train_on("fashion_mnist", "root", "fm"),
        lambda d: (_cfg(d), _idx_true_bomb(d)),
        says="train-images-idx3-ubyte.gz: IDX size mismatch",
    ),
    Case(
        "npz header claims 64 GiB",
        _train("--set", "dataset.name=arrays"),
        lambda d: (_cfg(d, dataset={"path": str(d / "x.npz")}), _npz_claims(d)),
        says="x.npz: array 'x': header says float32 (16777216, 1024)",
    ),
    Case(
        "empty npz",
        _train("--set", "dataset.name=arrays"),
        lambda d: (_cfg(d, dataset={"path": str(d / "x.npz")}), (d / "x.npz").write_bytes(b"")),
        says="x.npz: not a readable .npz file",
    ),
    Case(
        "npz of no samples",
        _train("--set", "dataset.name=arrays"),
        lambda d: (_cfg(d, dataset={"path": str(d / "x.npz")}),
                   np.savez(d / "x.npz", x=np.zeros((0, 3)), y=np.zeros(0, dtype=np.int64))),
        says="x.npz: x holds no samples (shape (0, 3))",
    ),
    Case(
        "npz of no features",
        _train("--set", "dataset.name=arrays"),
        lambda d: (_cfg(d, dataset={"path": str(d / "x.npz")}),
                   np.savez(d / "x.npz", x=np.zeros((10, 0)), y=np.arange(10) % 2)),
        says="x.npz: x holds samples of no features",
    ),
    Case(
        "npz of one class",
        _train("--set", "dataset.name=arrays"),
        lambda d: (_cfg(d, dataset={"path": str(d / "x.npz")}),
                   np.savez(d / "x.npz", x=np.random.default_rng(0).normal(size=(100, 5)),
                            y=np.zeros(100, dtype=np.int64))),
        says="x.npz: the training data holds one class only ('0', 70 samples)",
    ),
    Case(
        "csv with two label columns",
        _train_on("arrays", "path", "x.csv"),
        lambda d: (_cfg(d), (d / "x.csv").write_text(
            "a,label,label\n" + "".join(f"{i},{i % 2},{i % 3}\n" for i in range(60)))),
        says="x.csv: 2 columns are named 'label' (columns 2, 3)",
    ),
    Case(
        "csv with label and y",
        _train_on("arrays", "path", "x.csv"),
        lambda d: (_cfg(d), (d / "x.csv").write_text(
            "a,label,y\n" + "".join(f"{i},{i % 2},{i % 3}\n" for i in range(60)))),
        says="x.csv: both a 'label' (column 2) and a 'y' column (column 3)",
    ),
    Case(
        "npz of objects",
        _train("--set", "dataset.name=arrays"),
        lambda d: (
            _cfg(d, dataset={"path": str(d / "x.npz")}),
            np.savez(d / "x.npz", x=np.array([None] * 4, dtype=object), y=np.arange(4)),
        ),
        says="holds Python objects",
    ),
    Case("imagefolder corrupt image", _train(), _images("corrupt"), says="c1/2.png: cannot decode the image"),
    Case(
        "imagefolder empty class", _train(), _images("empty class"), says="c3: class folder holds no images"
    ),
    Case(
        "imagefolder without images", _train(), _images("no images"), says="c0: class folder holds no images"
    ),
    Case(
        "imagefolder of one class",
        _train(),
        _images("one class"),
        says="imgs: one class folder only ('c0')",
    ),
    Case(
        "imagefolder without path",
        _train("--set", "dataset.name=imagefolder", "--set", "dataset.as_vectors=false"),
        lambda d: _cfg(d),
        says="dataset.path: the `imagefolder` dataset needs the folder",
    ),
    Case(
        "streaming a data set in memory",
        _train("--set", "dataset.cache=none"),
        lambda d: _cfg(d),
        says="dataset.cache: none (streaming from files) is for imagefolder",
    ),
    Case(
        "stl10 unlabeled without the file",
        _train(
            "--set",
            "dataset.name=stl10",
            "--set",
            "dataset.unlabeled=true",
            "--set",
            "dataset.as_vectors=false",
        ),
        lambda d: (_cfg(d, dataset={"root": str(d / "stl")}), _stl_without_unlabeled(d / "stl")),
        says="dataset.unlabeled: ",
    ),
    # search folders
    Case(
        "status of a corrupt search folder",
        lambda d: ["status", str(d / "exp")],
        lambda d: _search_folder(d, "config: [unclosed\n"),
        says="augtune_search.yaml",
    ),
    Case("status of no search", lambda d: ["status", str(d)], says="not an augtune search folder"),
    Case(
        "status of a corrupt compare folder",
        lambda d: ["status", str(d / "exp")],
        _corrupt_compare,
        says="augtune_compare.yaml: cannot be read",
    ),
]


def snapshot(root: Path) -> dict[str, tuple[int, str]]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in filenames + dirnames:
            p = Path(dirpath) / name
            if p.is_file():
                out[str(p.relative_to(root))] = (
                    p.stat().st_mtime_ns,
                    hashlib.sha1(p.read_bytes()).hexdigest(),
                )
            else:
                out[str(p.relative_to(root))] = (0, "dir")
    return out


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_hostile_input_is_one_line_and_changes_nothing(case: Case, tmp_path, finished_run, capsys):
    d = tmp_path / "case"
    d.mkdir()
    if case.needs_run:
        shutil.copytree(finished_run, d / "run")
    case.make(d)
    before = snapshot(d)
    capsys.readouterr()
    code = main(case.args(d))  # an exception here is a traceback the user would see: the test fails
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == case.code, (code, err[-2000:])
    assert len(lines) == 1, err[-2000:]
    assert "Traceback" not in err and "Traceback" not in out
    assert case.says in lines[0], lines[0]
    assert snapshot(d) == before  # nothing written, nothing changed


def test_there_are_at_least_forty_hostile_cases():
    assert len(CASES) >= 40


def test_networks_bigger_than_the_memory_left_are_refused_unbuilt(tmp_path, capsys, monkeypatch):
    """With the data loaded, every network of the method (here DiffAug's denoiser) is counted on
    PyTorch's meta device and held against the memory left: one line naming the key that makes it
    too big."""
    import augtune.data.formats

    monkeypatch.setattr(augtune.data.formats, "available_memory", lambda: 100 << 20)
    cfg = _cfg(tmp_path, train={"device": "cpu"})
    before = snapshot(tmp_path)
    code = main(["train", str(cfg), "--set", "method.augment=[diffaug]", "--set",
                 "diffaug.gen_hidden=20000", "--out", str(tmp_path / "out")])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1, lines
    assert "diffaug.gen_hidden: 20,000 makes networks that need at least" in lines[0], lines[0]
    assert "only 100.0 MiB of memory is available" in lines[0], lines[0]
    assert snapshot(tmp_path) == before


def test_a_run_whose_last_checkpoint_outlived_its_record_completes(finished_run, tmp_path):
    """The last epoch's checkpoint is written before the record that completes the run: a run killed
    between the two resumes into a completed record (it used to stay `running`, with exit 0)."""
    import json

    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    _edit_record(tmp_path, lambda r: r.update(status="running", final={}, finished=None))
    assert main(["train", "--resume", "--out", str(run)]) == 0
    record = json.loads((run / "record.json").read_text())
    assert record["status"] == "completed" and "knn_acc" in record["final"]
