"""The one record format every run leaves behind (`record.json`), read by `augtune.analysis`.

A record holds the resolved config, seed, dataset, method label, package versions and git revision,
the metrics of every epoch, the final metrics, the reference rows (`raw`, `random-init`) and the
run's status (`running`, `completed`, `failed` with the reason). Only JSON: a results folder copied
to a laptop can be tabulated without torch or ray.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

FORMAT = "augtune.record/1"
RECORD_FILE = "record.json"
CONFIG_FILE = "config.yaml"
CHECKPOINT_FILE = "checkpoint.pt"


def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def versions() -> dict[str, str | None]:
    out = {"python": platform.python_version()}
    for dist in ("augtune", "torch", "torchvision", "numpy", "scikit-learn", "ray", "optuna"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    if out["augtune"] is None:  # running from a checkout that is not installed
        from augtune import __version__

        out["augtune"] = __version__
    return out


def git_revision() -> str | None:
    """Commit of the augtune checkout (with `+dirty` for uncommitted changes), or None."""
    here = Path(__file__).resolve().parent
    try:
        rev = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=10)
        if rev.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return rev.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def new_record(config: dict, *, method: str, dataset: str, seed: int) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "status": "running",
        "error": None,
        "method": method,
        "dataset": dataset,
        "seed": seed,
        "config": config,
        "versions": versions(),
        "git_revision": git_revision(),
        "host": platform.node(),
        "started": now(),
        "finished": None,
        "epochs": [],  # one dict of metrics per finished epoch, with "epoch" (1-based)
        "final": {},  # metrics at the end of the run
        "references": {},  # {"raw": {...}, "random-init": {...}}
    }


def write_json_atomic(path: Path, data: Any) -> None:
    """Write via a temporary file and rename, so a crash never leaves half a file."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=1, allow_nan=True) + "\n")
    os.replace(tmp, path)


def write_record(run_dir: Path, record: dict) -> None:
    write_json_atomic(Path(run_dir) / RECORD_FILE, record)


def read_record(path: Path) -> dict:
    """Read a record from a file or from a run folder."""
    path = Path(path)
    if path.is_dir():
        path = path / RECORD_FILE
    data = json.loads(path.read_text())
    if data.get("format") != FORMAT:
        raise ValueError(f"{path}: not an augtune record (format {data.get('format')!r}, expected {FORMAT!r})")
    return data
