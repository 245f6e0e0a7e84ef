"""Scratch folders that no process leaves behind, not even one killed by SIGKILL.

A trial stages each checkpoint in a folder before Tune takes it; a trial folder or an Optuna journal
kept in cloud storage has a local side; a resume downloads a copy. Each such folder lives under this
process's scratch, ``<tmp>/augtune-scratch-<uid>/<host>-<pid>/``, which the process removes when it
exits. A process killed outright (a trial whose driver died, a search stopped by the OOM killer or
SIGKILL) cannot, and Tune kills a running trial's process without unwinding it, so every process, the
first time it asks for a scratch folder, removes the scratch of this host's processes that no longer
run. Without that, each interrupted trial left its staged checkpoint in the temporary folder, and
every trial of an experiment in cloud storage its local side.

The host's name in each folder's name keeps a process from judging the processes of another machine that
shares the temporary folder; a process id that the system has reused only delays the removal. Two
containers that share both the temporary folder and the host's name, but not their process ids, would
judge each other's processes dead: give such containers a temporary folder (TMPDIR) each.
"""
from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import socket
import tempfile
from pathlib import Path
from typing import Iterator

_OWN: tuple[int, Path] | None = None  # (pid, folder): a forked child makes its own


def root() -> Path:
    """Where every augtune process of this user keeps its scratch."""
    return Path(tempfile.gettempdir()) / f"augtune-scratch-{os.getuid()}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's: alive
        return True
    return True


def sweep(base: Path | None = None) -> list[Path]:
    """Remove the scratch of this host's processes that no longer run; return what was removed."""
    base = root() if base is None else base
    host, removed = socket.gethostname(), []
    if not base.is_dir():
        return removed
    for folder in base.iterdir():
        owner, _, pid = folder.name.rpartition("-")
        if owner != host or not pid.isdigit() or int(pid) == os.getpid() or _alive(int(pid)):
            continue
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(folder)
    return removed


def _remove_if_mine(pid: int, folder: Path) -> None:
    """At exit: a forked child inherits its parent's exit handlers, and must not remove the parent's."""
    if os.getpid() == pid:
        shutil.rmtree(folder, ignore_errors=True)


def own() -> Path:
    """This process's scratch folder, made (after a sweep) on first use and removed at exit."""
    global _OWN
    if _OWN is None or _OWN[0] != os.getpid():
        base = root()
        base.mkdir(mode=0o700, parents=True, exist_ok=True)
        sweep(base)
        folder = base / f"{socket.gethostname()}-{os.getpid()}"
        folder.mkdir(mode=0o700, exist_ok=True)
        atexit.register(_remove_if_mine, os.getpid(), folder)
        _OWN = (os.getpid(), folder)
    return _OWN[1]


def scratch_dir(prefix: str) -> Path:
    """A new folder in this process's scratch (gone when the process is, however it ends)."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir=own()))


@contextlib.contextmanager
def temporary(prefix: str) -> Iterator[str]:
    """`tempfile.TemporaryDirectory` in this process's scratch: removed on leaving the block, or with
    the scratch when the process dies inside it."""
    with tempfile.TemporaryDirectory(prefix=prefix, dir=own()) as folder:
        yield folder
