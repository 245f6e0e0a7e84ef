"""`imagefolder`: a real tree of JPEG/PNG files written by the test from scikit-learn's digits (ImageNet-100's
train/val layout, one folder split by seed, Tiny-ImageNet's annotated val/), read in memory and streamed
through DataLoader workers: the same pixels, features and training either way. No network."""
from __future__ import annotations

import socket
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from augtune.config import ConfigError, DatasetConfig, from_dict
from augtune.data import DataError, as_float, load_dataset
from augtune.data import datasets as ds
from augtune.data import imagefolder as imf
from augtune.eval import extract_features

SIDE = 24  # digits' 8x8 upscaled 3x: JPEG blocks of real pixels


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    """Any connection off this machine fails. Unix sockets stay: DataLoader workers hand their batches'
    shared memory to the trial through one (torch.multiprocessing's file-descriptor sharing)."""
    connect = socket.socket.connect

    def refuse(sock, *args, **kwargs):
        if sock.family != socket.AF_UNIX:
            raise RuntimeError("an imagefolder test tried to use the network")
        return connect(sock, *args, **kwargs)

    def refuse_create(*args, **kwargs):
        raise RuntimeError("an imagefolder test tried to use the network")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse_create)


def test_network_is_refused_here():
    with pytest.raises(RuntimeError, match="tried to use the network"):
        socket.create_connection(("127.0.0.1", 9))
    with pytest.raises(RuntimeError, match="tried to use the network"):
        socket.socket(socket.AF_INET, socket.SOCK_STREAM).connect(("127.0.0.1", 9))


def digit_images(per_class: int, offset: int = 0) -> list[tuple[int, np.ndarray]]:
    """(label, uint8 SIDE x SIDE) real digits, `per_class` of each class starting at the class's
    `offset`-th."""
    from sklearn.datasets import load_digits

    d = load_digits()
    out = []
    for c in range(10):
        for i in np.flatnonzero(d.target == c)[offset:offset + per_class]:
            img = np.kron(d.images[i] * (255 / 16), np.ones((3, 3))).round().astype(np.uint8)
            out.append((c, img))
    return out


def write_split(folder: Path, per_class: int, offset: int = 0, suffix: str = ".jpg") -> None:
    for n, (c, img) in enumerate(digit_images(per_class, offset)):
        d = folder / f"digit{c}"
        d.mkdir(parents=True, exist_ok=True)
        Image.fromarray(img).convert("RGB").save(d / f"{n:04d}{suffix}")


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    """ImageNet-100's layout: train/<class>/*.jpg (30 a class) and val/<class>/*.jpg (8 a class)."""
    root = tmp_path_factory.mktemp("tree")
    write_split(root / "train", 30)
    write_split(root / "val", 8, offset=100)
    return root


def load(path, **kw):
    kw = {"image_size": SIDE, "shared": False, **kw}
    return load_dataset(DatasetConfig(name="imagefolder", path=str(path), **kw))


# ---------------------------------------------------------------------------------------------
# Layouts

def test_train_val_tree(tree):
    s = load(tree)
    assert (s.modality, s.shape, s.num_classes) == ("image", (3, SIDE, SIDE), 10)
    assert s.classes == tuple(f"digit{c}" for c in range(10))
    assert (len(s.y_train), len(s.y_test)) == (300, 80) and torch.bincount(s.y_test).tolist() == [8] * 10
    assert s.x_train.dtype == torch.uint8 and s.x_train.shape == (300, 3, SIDE, SIDE)
    assert torch.equal(s.x_train[:, 0], s.x_train[:, 2])  # grey digits saved as RGB: equal channels
    # a JPEG round trip of the real digit: close to the pixels written (8x8 blocks smooth it a little)
    first = torch.from_numpy(digit_images(1)[0][1]).float()
    assert (s.x_train[0, 0].float() - first).abs().mean() < 6
    ref = as_float(s.x_train).double()
    assert s.mean[0] == pytest.approx(float(ref[:, 0].mean()), rel=1e-6)  # exact over all (< STATS_SAMPLE)


def test_one_folder_is_split_by_seed(tree):
    s = load(tree / "train", test_fraction=0.2)
    assert (len(s.y_train), len(s.y_test)) == (240, 60) and torch.bincount(s.y_test).tolist() == [6] * 10
    again, other = (
        load(tree / "train", test_fraction=0.2),
        load(tree / "train", test_fraction=0.2, split_seed=1),
    )
    assert torch.equal(s.x_test, again.x_test) and not torch.equal(s.x_test, other.x_test)


def test_tiny_imagenet_layout(tmp_path):
    # train/<wnid>/images/<wnid>_<i>.JPEG and val/images/*.JPEG labelled by val/val_annotations.txt
    notes = []
    for n, (c, img) in enumerate(digit_images(4)):
        wnid = f"n0{c}"
        (tmp_path / "train" / wnid / "images").mkdir(parents=True, exist_ok=True)
        Image.fromarray(img).save(tmp_path / "train" / wnid / "images" / f"{wnid}_{n}.JPEG")
    (tmp_path / "train" / "n00" / "n00_boxes.txt").write_text("not an image\n")
    (tmp_path / "val" / "images").mkdir(parents=True)
    for n, (c, img) in enumerate(digit_images(2, offset=50)):
        Image.fromarray(img).save(tmp_path / "val" / "images" / f"val_{n}.JPEG")
        notes.append(f"val_{n}.JPEG\tn0{c}\t0\t0\t8\t8")
    (tmp_path / "val" / "val_annotations.txt").write_text("\n".join(notes) + "\n")
    (tmp_path / "test" / "images").mkdir(parents=True)  # Tiny-ImageNet's unlabelled test/: val/ comes first
    s = load(tmp_path)
    assert (len(s.y_train), len(s.y_test), s.classes[3]) == (40, 20, "n03")
    assert s.y_test.tolist() == [c for c in range(10) for _ in range(2)]
    (tmp_path / "val" / "val_annotations.txt").write_text("val_0.JPEG\tn99\n")
    with pytest.raises(DataError, match="val_annotations.txt: line 1: expected <file>\t<training class>"):
        load(tmp_path)


# ---------------------------------------------------------------------------------------------
# Memory and streaming: the same data

def _backbone(seed: int = 0) -> torch.nn.Module:
    from augtune.config import ModelConfig
    from augtune.models import build_backbone

    torch.manual_seed(seed)
    return build_backbone(ModelConfig(backbone="cnn", width=4), "image", (3, SIDE, SIDE)).eval()


@pytest.mark.parametrize("workers", [0, 2])
def test_streaming_gives_the_memory_features(tree, workers):
    mem, stream = load(tree, cache="memory"), load(tree, cache="none", workers=workers)
    assert isinstance(stream.x_train, imf.ImageFiles) and len(stream.x_train) == 300
    assert (stream.mean, stream.std) == (mem.mean, mem.std)
    assert torch.equal(stream.y_train, mem.y_train)
    net, cpu = _backbone(), torch.device("cpu")
    for part in ("x_train", "x_test"):
        a = extract_features(net, getattr(mem, part), 64, cpu)
        b = extract_features(net, getattr(stream, part), 64, cpu, workers=workers)
        assert torch.equal(a, b)
    rows = torch.tensor([299, 0, 17])  # indexing decodes in this process
    assert torch.equal(stream.x_train[rows], mem.x_train[rows])
    sub = extract_features(net, stream.x_test, 16, cpu, index=rows[1:], workers=workers)
    assert torch.equal(sub, extract_features(net, mem.x_test[rows[1:]], 16, cpu))


def _cfg(tree: Path, **dataset):
    return from_dict(
        {
            "dataset": {
                "name": "imagefolder",
                "path": str(tree),
                "image_size": SIDE,
                "shared": False,
                **dataset,
            },
            "model": {"backbone": "cnn", "width": 4},
            "train": {"epochs": 2, "batch_size": 32, "seed": 3},
            "eval": {"metrics": ["knn"], "epoch_metrics": ["knn"], "references": False},
        }
    )


@pytest.mark.slow  # two short trainings, DataLoader workers started per epoch and per evaluation
def test_streaming_trains_exactly_as_memory(tree):
    from augtune.trainables.loop import Trainer

    runs = {}
    for cache in ("memory", "none"):
        cfg = _cfg(tree, cache=cache, workers=2, max_train=96, max_test=40)
        t = Trainer(cfg, load_dataset(cfg.dataset), log=lambda s: None)
        runs[cache] = (t.fit(), [h["loss"] for h in t.history], torch.get_rng_state())
    assert runs["memory"][1] == runs["none"][1]  # every epoch's loss, bitwise
    assert runs["memory"][0] == runs["none"][0]  # the final k-NN on features extracted batch by batch
    assert torch.equal(runs["memory"][2], runs["none"][2])  # the DataLoader never drew from the views' RNG


# ---------------------------------------------------------------------------------------------
# Decoding

def test_resize_centre_crop_and_colour_modes(tmp_path):
    wide = np.zeros((20, 60, 3), dtype=np.uint8)  # (H, W): left third red, middle green, right third blue
    wide[:, :20, 0] = wide[:, 20:40, 1] = wide[:, 40:, 2] = 255
    Image.fromarray(wide).save(tmp_path / "wide.png")
    x = imf.decode(tmp_path / "wide.png", 10)
    assert x.shape == (3, 10, 10) and x.dtype == np.uint8
    # shorter side to 10, the centre 10 kept: green; the filter's support reaches past the crop at its edges
    assert (x[1, :, 1:-1] == 255).all() and (x[[0, 2], :, 1:-1] == 0).all()
    assert (x[1] > 200).all() and (x[[0, 2]] < 40).all()

    grey = np.arange(64, dtype=np.uint8).reshape(8, 8) * 4
    Image.fromarray(grey, "L").save(tmp_path / "grey.png")
    rgba = np.dstack([np.full((8, 8, 3), (10, 20, 30), np.uint8), np.zeros((8, 8), np.uint8)])
    Image.fromarray(rgba, "RGBA").save(tmp_path / "rgba.png")  # fully transparent: alpha dropped
    pal = Image.fromarray(grey, "L").convert("P")
    pal.putpalette([v for i in range(256) for v in (i, 255 - i, 7)])
    pal.save(tmp_path / "pal.png")
    assert (imf.decode(tmp_path / "grey.png", 8) == grey).all()  # three equal channels
    assert (imf.decode(tmp_path / "rgba.png", 8).reshape(3, -1).T == (10, 20, 30)).all()
    p = imf.decode(tmp_path / "pal.png", 8)
    assert (p[0] == grey).all() and (p[1] == 255 - grey).all() and (p[2] == 7).all()


def test_a_mixed_tree_of_png_and_jpeg_and_modes(tmp_path):
    write_split(tmp_path / "a", 3, suffix=".png")
    for c in range(10):
        Image.fromarray(np.full((SIDE, SIDE), 40 * (c % 6), np.uint8), "L").save(
            tmp_path / "a" / f"digit{c}" / "g.JPG"
        )
        (tmp_path / "a" / f"digit{c}" / ".hidden.jpg").write_bytes(b"macOS resource fork, not an image")
        (tmp_path / "a" / f"digit{c}" / "notes.txt").write_text("skipped")
    s = load(tmp_path / "a", test_fraction=0.25, max_train=20)  # max_train: stratified, before decoding
    assert len(s.y_train) == 20 and len(s.y_train) + len(s.y_test) == 30


def test_subsets_are_taken_before_decoding_and_the_shared_copy_decodes_once(tree, tmp_path, monkeypatch):
    decoded = []
    real = imf.decode
    monkeypatch.setattr(imf, "decode", lambda path, size: decoded.append(path) or real(path, size))
    kw = dict(max_train=40, max_test=20, workers=0)  # workers 0: decoded in this process, where we count
    s = load(tree, **kw)
    assert (len(s.y_train), len(s.y_test), len(decoded)) == (40, 20, 60)
    decoded.clear()
    monkeypatch.setattr(ds, "SHARED_MIN_BYTES", 0)  # the tree is 100 KB: shared all the same
    first = load(tree, shared=True, shared_dir=str(tmp_path / "shared"), **kw)
    second = load(tree, shared=True, shared_dir=str(tmp_path / "shared"), **kw)
    assert (
        len(decoded) == 60 and torch.equal(first.x_train, s.x_train) and torch.equal(second.x_test, s.x_test)
    )
    assert second.mean == s.mean and second.classes == s.classes


# ---------------------------------------------------------------------------------------------
# Errors: one line naming the file or the folder

def _one_line(e) -> str:
    text = str(e.value)
    assert "\n" not in text
    return text


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_a_bad_image_names_the_file_in_both_modes(tree, tmp_path, damage, monkeypatch):
    import shutil

    root = tmp_path / "t"
    shutil.copytree(tree, root)
    bad = sorted((root / "train" / "digit4").iterdir())[2]
    raw = bad.read_bytes()
    bad.write_bytes(b"this is not a JPEG at all" if damage == "garbage" else raw[:len(raw) // 2])
    with pytest.raises(DataError) as e:
        load(root, cache="memory", workers=2)
    assert _one_line(e).startswith(f"{bad}: cannot decode the image")
    monkeypatch.setattr(imf, "STATS_SAMPLE", 10)  # the statistics' 10 images leave the bad one out
    s = load(root, cache="none")  # streaming: found when a batch reaches the file
    with pytest.raises(DataError) as e:
        extract_features(_backbone(), s.x_train, 64, torch.device("cpu"), workers=2)
    assert _one_line(e).startswith(f"{bad}: cannot decode the image")


def test_tree_errors(tree, tmp_path):
    import shutil

    root = tmp_path / "t"
    shutil.copytree(tree, root)
    (root / "train" / "digit9b").mkdir()
    with pytest.raises(DataError) as e:
        load(root)
    assert _one_line(e) == f"{root / 'train' / 'digit9b'}: class folder holds no images " \
                           f"({', '.join(imf.IMAGE_SUFFIXES)})"
    (root / "train" / "digit9b").rmdir()
    (root / "val" / "digit7").rename(root / "val" / "seven")
    with pytest.raises(DataError, match=r"val/seven: class 'seven' is not among the training classes"):
        load(root)
    (tmp_path / "empty" / "train").mkdir(parents=True)
    with pytest.raises(DataError, match="no class folders of images"):
        load(tmp_path / "empty")
    with pytest.raises(DataError, match="is not a folder"):
        load(tmp_path / "nowhere")
    with pytest.raises(DataError, match="dataset.path: the `imagefolder` dataset needs the folder"):
        load_dataset(DatasetConfig(name="imagefolder"))


def test_config_keys_are_checked():
    for data, says in [
        (
            {"name": "digits", "cache": "none"},
            "dataset.cache: none (streaming from files) is for imagefolder",
        ),
        ({"name": "imagefolder", "cache": "none", "as_vectors": True}, "dataset.as_vectors: needs"),
        ({"name": "imagefolder", "image_size": 4}, "dataset.image_size: expected a number >= 8"),
        ({"name": "imagefolder", "cache": "disk"}, "dataset.cache: expected one of"),
        ({"name": "imagefolder", "workers": -1}, "dataset.workers: expected a number >= 0"),
    ]:
        with pytest.raises(ConfigError) as e:
            from_dict({"dataset": data})
        assert str(e.value).startswith(says), str(e.value)


def test_a_method_that_needs_memory_refuses_streaming(tree):
    from augtune.methods import build_method

    cfg = from_dict(
        {
            "dataset": {
                "name": "imagefolder",
                "path": str(tree),
                "image_size": SIDE,
                "cache": "none",
                "shared": False,
            },
            "model": {"backbone": "cnn", "width": 4},
            "method": {"augment": ["diffaug"]},
        }
    )
    with pytest.raises(
        ValueError, match=r"diffaug: needs the training images in memory \(dataset.cache: memory\)"
    ):
        build_method(cfg, load_dataset(cfg.dataset))


@pytest.mark.slow
def test_augtune_train_streams_a_tree_end_to_end(tree, tmp_path, capsys):
    import json
    import yaml

    from augtune.cli import main

    cfg = {
        "dataset": {
            "name": "imagefolder",
            "path": str(tree),
            "image_size": SIDE,
            "cache": "none",
            "workers": 2,
            "shared": False,
        },
        "model": {"backbone": "cnn", "width": 4},
        "train": {"epochs": 1, "batch_size": 64},
        "eval": {"metrics": ["knn", "sr"], "references": True, "figures": []},
    }
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    assert main(["train", str(tmp_path / "c.yaml"), "--out", str(tmp_path / "run")]) == 0
    record = json.loads((tmp_path / "run" / "record.json").read_text())
    assert 0.1 < record["final"]["knn_acc"] <= 1 and "raw" in record["references"]
