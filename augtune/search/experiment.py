"""An experiment folder (or URI): its names, its lock, its plan file, Optuna's journal.

A search's folder holds `augtune_search.yaml` (its plan: what `augtune resume` needs, read without
unpickling), `optuna.journal` (Optuna's study: `optuna.load_study(study_name="augtune", storage=...)`
opens it, and so does optuna-dashboard), `augtune.log` (Ray's and Tune's own messages),
`.augtune.lock` while a driver runs there, Tune's state and one folder per trial. A compare's folder
holds `augtune_compare.yaml` and one such search folder per entrant (`augtune.search.compare`).

Imports neither Ray nor Optuna at module level: `augtune status` and `--plan` use it too.
"""
from __future__ import annotations

import datetime as dt
import json
import os
import re
import socket
import time
from pathlib import Path
from typing import Optional

import yaml

from augtune.config import ConfigError, to_dict
from augtune.records import SEARCH_FILE, parse_json, process_started, read_json
from augtune.storage import exists, is_uri, write_bytes

LOCK_FILE = ".augtune.lock"
OPTUNA_FILE = "optuna.journal"  # Optuna's study: optuna.load_study(study_name="augtune", storage=...)
LOG_FILE = "augtune.log"  # Ray's and Tune's own messages (augtune -v shows them on the console)
FINISHED_FILE = "augtune_finished.json"  # written when every trial and repeat run ended well
STUDY_NAME = "augtune"
MAX_NAME = 200  # bytes of an experiment name (a folder name; 255 is the usual file-system limit)
# an experiment name is a folder name on every file system and object store, and a word in a shell
NAME_CHARS = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+=@-]*")


class SearchInterrupted(RuntimeError):
    """The search stopped before every trial finished (Ctrl-C); its state is saved."""

    def __init__(self, experiment: str):
        super().__init__(f"interrupted; finished trials are kept. Continue with: augtune resume {experiment}")
        self.experiment = experiment


class SearchFailed(RuntimeError):
    """Every trial of the search failed; the message is the first one's reason."""


# -- names --------------------------------------------------------------------------------------------------

def check_name(name: str) -> str:
    """An experiment's name: a plain folder name of safe characters (letters, digits, `._+=@-`), not
    hidden, at most MAX_NAME bytes."""
    if not NAME_CHARS.fullmatch(name or ""):
        bad = next((c for c in name if not re.fullmatch(r"[A-Za-z0-9._+=@-]", c)), None) if name else None
        why = f"character {bad!r} is not allowed" if bad else "it must not start with . or a symbol"
        raise ConfigError(
            f"--name: {name[:60]!r}: {why} (use letters, digits and . _ + = @ -)" if name
            else "--name: the name is empty"
        )
    if len(name.encode()) > MAX_NAME:
        raise ConfigError(f"--name: {name[:40]}... is longer than {MAX_NAME} bytes")
    return name


def default_name(kind: str, subject: str, storage: str) -> str:
    """`<kind>-<subject>-<time>` (`compare-breast_cancer-20261127-081500`), unique in `storage`: a second
    start in the same second gets `-2`, `-3`, ... (`subject`: the data file's stem or the data set)."""
    subject = re.sub(r"[^A-Za-z0-9._+=@-]+", "_", subject).strip("._-") or "data"
    stem = f"{kind}-{subject}-{dt.datetime.now():%Y%m%d-%H%M%S}"
    name, n = stem, 1
    while exists(f"{storage.rstrip('/')}/{name}"):
        n += 1
        name = f"{stem}-{n}"
    return check_name(name[:MAX_NAME])


def data_subject(cfg) -> str:
    """What a default name calls the data: a file's or folder's stem, else the data set's name."""
    d = cfg.dataset
    location = d.path or (d.root if d.name in ("imagefolder",) else None)
    if location:
        return Path(str(location).rstrip("/")).stem or d.name
    return d.name


def check_name_free(experiment: str) -> None:
    if not is_uri(experiment) and Path(experiment).exists():
        raise ConfigError(f"--name: {experiment} already exists; continue it with `augtune resume "
                          f"{experiment}` or choose another name")


# -- files -----------------------------------------------------------------------------------------------

def save_plan(plan) -> None:
    """A search's plan file (`SearchPlan`), written whole."""
    data = {"config": to_dict(plan.cfg), "base": plan.base, "name": plan.name, "storage": plan.storage}
    if getattr(plan, "modality", None):
        data["modality"] = plan.modality
    write_bytes(plan.experiment, SEARCH_FILE, yaml.safe_dump(data, sort_keys=False).encode())


def optuna_storage(plan):
    """Optuna's journal file in the experiment folder; in cloud storage, a local journal uploaded there
    after every write (`storage.UploadedJournal`), which `augtune resume URI` downloads on any machine.
    None for a grid search (no study)."""
    if plan.cfg.search.algorithm == "grid":
        return None
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    from augtune.storage import UploadedJournal

    if is_uri(plan.experiment):
        return JournalStorage(UploadedJournal(f"{plan.experiment}/{OPTUNA_FILE}"))
    return JournalStorage(JournalFileBackend(str(Path(plan.experiment) / OPTUNA_FILE)))


def mark_finished(experiment: str) -> None:
    """Say that the experiment ran to its end with no trial failed: `augtune resume` then reprints its
    answer from the records instead of starting Ray to find nothing to do."""
    write_bytes(experiment, FINISHED_FILE, json.dumps({"finished": time.time()}).encode())


def is_finished(experiment: str) -> bool:
    return exists(experiment, FINISHED_FILE)


# -- one driver per folder -----------------------------------------------------------------------------------

def holder_alive(folder: Path) -> Optional[bool]:
    """Whether a driver (`augtune search`, `compare`, `resume`) runs the experiment in `folder` now, by
    the lock it holds meanwhile: False when there is no lock or its owner is gone (this host, its pid
    dead or reused since); None when it cannot be told (another host's lock, or one being written)."""
    try:
        owner = parse_json((Path(folder) / LOCK_FILE).read_bytes(), Path(folder) / LOCK_FILE)
    except FileNotFoundError:
        return False
    except (OSError, ValueError):  # being written, or not a lock augtune wrote
        return None
    if not isinstance(owner, dict) or owner.get("host") != socket.gethostname():
        return None
    pid = owner.get("pid")
    if type(pid) is not int or pid <= 0:  # os.kill(0 or -1, 0) would ask about a group of processes
        return False
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):
        return False
    except PermissionError:  # alive, another user's
        return True
    started = process_started(pid)  # a pid that began after the lock was taken: another process
    return not (started is not None and isinstance(owner.get("started"), (int, float))
                and started > owner["started"] + 1.0)


class Lock:
    """`<experiment>/.augtune.lock` holding the owner's pid and host, while a search runs there. A lock
    left by a process that is gone (same host, pid not alive) is taken over; any other is refused."""

    def __init__(self, experiment: str):
        self.path = None if is_uri(experiment) else Path(experiment) / LOCK_FILE

    def __enter__(self) -> "Lock":
        if self.path is None:
            return self
        self.path.parent.mkdir(parents=True, exist_ok=True)
        me = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()}
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                if not self._stale():
                    owner = self._owner()
                    raise ConfigError(
                        f"{self.path.parent}: another search is running there (pid "
                        f"{owner.get('pid')} on {owner.get('host')}); wait for it or use another "
                        "--name"
                    ) from None
                self.path.unlink(missing_ok=True)
                continue
            with os.fdopen(fd, "w") as f:
                json.dump(me, f)
            return self
        raise ConfigError(f"{self.path}: cannot take the lock")

    def _owner(self) -> dict:
        try:
            return read_json(self.path)
        except (OSError, ValueError):
            return {}

    def _stale(self) -> bool:
        return holder_alive(self.path.parent) is False  # another machine's lock: only its owner knows

    def __exit__(self, *exc) -> None:
        if self.path is not None and self._owner().get("pid") == os.getpid():
            self.path.unlink(missing_ok=True)
