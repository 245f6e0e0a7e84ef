"""A full disk: one line naming it, exit 1, what was written kept, and how to continue.

The disk is a small tmpfs the test mounts (root on Linux); elsewhere the tests skip with the reason."""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]

CONFIG = {
    "dataset": {"name": "digits", "max_train": 256, "max_test": 128},
    "model": {"backbone": "cnn", "width": 32, "proj_hidden_dim": 256, "proj_dim": 64},
    "train": {"epochs": 2, "batch_size": 64, "checkpoint_every": 1},
    "eval": {"metrics": ["knn"], "references": False, "figures": []},
}


def _mount_small_disk(where: Path, size_kb: int) -> str | None:
    """Mount a tmpfs of `size_kb` at `where`; the reason it cannot, or None."""
    if sys.platform != "linux" or os.geteuid() != 0:
        return "mounting a small file system needs root on Linux"
    where.mkdir(parents=True, exist_ok=True)
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kb}k", f"augtune-{uuid.uuid4().hex[:8]}",
                          str(where)], capture_output=True, text=True)
    return None if res.returncode == 0 else f"cannot mount a tmpfs here: {res.stderr.strip()[:120]}"


@contextlib.contextmanager
def small_disk(size_kb: int):
    where = Path(tempfile.mkdtemp(prefix="augtune-disk-"))
    reason = _mount_small_disk(where, size_kb)
    if reason:
        pytest.skip(reason)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)
        with contextlib.suppress(OSError):
            where.rmdir()


@pytest.mark.slow  # waits out a real retry (the fast tier: docs/contributing.md)
def test_train_on_a_full_disk_says_so_in_one_line_and_keeps_what_it_wrote(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(CONFIG))
    with small_disk(160) as disk:  # the config and the record fit, a checkpoint (~1 MB) does not
        out = disk / "run"
        res = subprocess.run([sys.executable, "-m", "augtune.cli", "train", str(config), "--out", str(out)],
                             cwd=ROOT, capture_output=True, text=True, timeout=600)
        err = [line for line in res.stderr.splitlines() if line.strip()]
        assert res.returncode == 1, res.stderr[-2000:]
        assert len(err) == 1 and "no space left on device" in err[0], err
        assert f"augtune train --resume --out {out}" in err[0]
        assert "Traceback" not in res.stderr + res.stdout
        assert yaml.safe_load((out / "config.yaml").read_text())["train"]["epochs"] == 2  # still whole
        record = json.loads((out / "record.json").read_text())  # never half written
        assert record["status"] == "running" and not list(out.glob("*.tmp*"))
        # "when that is fixed": the disk grows, and the command it named finishes the run
        subprocess.run(["mount", "-o", "remount,size=16m", str(disk)], check=True)
        res = subprocess.run(
            err[0].split("continue with: ")[1].split(),
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=600,
            env={**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"},
        )
        assert res.returncode == 0, res.stderr[-2000:]
        assert json.loads((out / "record.json").read_text())["status"] == "completed"


@pytest.mark.ray
@pytest.mark.slow
def test_search_on_a_full_disk_says_so_in_one_line_and_can_be_resumed(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({**CONFIG, "search": {"space": {"train.lr": "grid([0.001])"},
                                                           "algorithm": "grid", "max_failures": 0,
                                                           "num_samples": 4}}))
    with small_disk(400) as disk:  # Tune's state fits, a trial's checkpoint (~1 MB) does not
        res = subprocess.run(
            [
                sys.executable,
                "-m",
                "augtune.cli",
                "search",
                str(config),
                "--storage",
                str(disk),
                "--name",
                "exp",
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=600,
        )
        err = [line for line in res.stderr.splitlines() if line.strip()]
        assert res.returncode == 1, res.stdout[-2000:] + res.stderr[-2000:]
        assert len(err) == 1 and "no space left on device" in err[0].lower(), err
        assert "Traceback" not in res.stdout + res.stderr
        assert (disk / "exp" / "augtune_search.yaml").is_file()
        subprocess.run(["mount", "-o", "remount,size=64m", str(disk)], check=True)
        res = subprocess.run(
            [sys.executable, "-m", "augtune.cli", *err[0].split("continue with: augtune ")[1].split()],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
        records = [json.loads(p.read_text()) for p in (disk / "exp").glob("*/record.json")]
        assert len(records) == 4 and all(r["status"] == "completed" for r in records), [
            (r["trial"], r["status"], r.get("error"), len(r["epochs"]), len(r["nodes"])) for r in records]
