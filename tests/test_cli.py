"""The real CLI on real offline data: `augtune train` and `augtune methods`."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def augtune(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "augtune.cli", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=900)


@pytest.mark.slow
def test_quickstart_trains_and_writes_its_record(tmp_path):
    out = tmp_path / "run"
    res = augtune("train", "examples/quickstart.yaml", "--set", "train.epochs=2", "--out", str(out))
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert any(line.startswith("epoch 1/2") for line in lines)
    assert any(line.startswith("epoch 2/2") and "knn_acc" in line for line in lines)
    record = json.loads((out / "record.json").read_text())
    assert record["status"] == "completed" and record["dataset"] == "digits"
    assert record["config"]["train"]["epochs"] == 2
    assert len(record["epochs"]) == 2
    final = record["final"]
    assert {"knn_acc", "sr_acc", "linear_acc", "kmeans_acc", "kmeans_nmi", "kmeans_ari"} <= set(final)
    assert all(0 <= v <= 1 for v in final.values())
    assert set(record["references"]) == {"raw", "random-init"}
    assert (out / "config.yaml").is_file()


@pytest.mark.slow
def test_resume_continues_an_interrupted_run(tmp_path):
    from augtune.config import load_config
    from augtune.data import load_dataset
    from augtune.trainables.run import train_run

    out = tmp_path / "run"
    overrides = ["train.epochs=2", "dataset.max_train=200", "dataset.max_test=100", "model.width=4",
                 "train.batch_size=50", "eval.metrics=[knn]", "eval.references=false"]
    cfg = load_config(ROOT / "examples/quickstart.yaml", overrides)
    train_run(cfg, load_dataset(cfg.dataset), out, log=lambda s: None, stop_after=1)  # "interrupted"
    res = augtune(
        "train", "examples/quickstart.yaml", *sum((["--set", o] for o in overrides), []), "--out", str(out)
    )
    assert res.returncode == 2 and "already holds a run" in res.stderr  # nothing overwritten
    res = augtune("train", "--resume", "--out", str(out))
    assert res.returncode == 0, res.stderr
    assert "after epoch 1" in res.stdout and "epoch 2/2" in res.stdout and "epoch 1/2" not in res.stdout
    record = json.loads((out / "record.json").read_text())
    assert record["status"] == "completed" and [e["epoch"] for e in record["epochs"]] == [1, 2]


@pytest.mark.parametrize(
    "args,message",
    [
        (["train", "examples/quickstart.yaml", "--set", "train.lr=-1"], "train.lr: expected a number > 0"),
        (
            ["train", "examples/quickstart.yaml", "--set", "method.base=simclrr"],
            "method.base: unknown base method",
        ),
        (["train", "examples/quickstart.yaml", "--set", "trian.lr=1"], "trian: unknown key"),
        (["train", "nope.yaml"], "config file not found"),
        (
            ["train", "--set", "dataset.name=fashion_mnist", "--set", "dataset.root=/nonexistent/fm"],
            "/nonexistent/fm",
        ),
        (
            ["train", "--set", "train.batch_size=5000"],
            "train.batch_size: 5000 is larger than the training set",
        ),
        (
            ["train", "--resume", "--out", "/nonexistent/run"],
            "--resume: /nonexistent/run holds no augtune run",
        ),
    ],
)
def test_bad_input_exits_2_with_one_line_and_writes_nothing(tmp_path, args, message):
    out = tmp_path / "run"
    if "--out" not in args:
        args = [*args, "--out", str(out)]
    res = augtune(*args)
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert message in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    assert not out.exists()


def test_methods_lists_bases_and_datasets():
    res = augtune("methods")
    assert res.returncode == 0
    for name in ("simclr", "byol", "moco", "simsiam", "digits", "fashion_mnist", "cifar10", "arrays"):
        assert name in res.stdout
    for line in res.stdout.splitlines():
        if line.startswith("  ") and "(none registered yet)" not in line:
            assert len(line.split(None, 1)) == 2, f"no description: {line!r}"  # every entry says what it is


def test_a_reader_that_stops_early_is_no_error():
    """`augtune status DIR | head -1`: the pipe closes before augtune has written; no traceback."""
    proc = subprocess.Popen([sys.executable, "-m", "augtune.cli", "methods"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # before the child has imported anything, let alone printed
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0 and "Traceback" not in err and "BrokenPipe" not in err, err
