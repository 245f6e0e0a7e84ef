"""augtune.scratch: a process's scratch folders are gone when it is, however it ends: at a
normal exit by itself, after SIGKILL by the next process that asks for scratch; a live process's and
another host's are left alone."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

from augtune import scratch

CHILD = textwrap.dedent("""
    import os, signal, sys
    from augtune import scratch
    folder = scratch.scratch_dir("ckpt-")
    (folder / "checkpoint.pt").write_bytes(b"x" * 1000)
    with scratch.temporary("copy-") as tmp:
        print(folder, tmp, flush=True)
        if sys.argv[1] == "kill":
            os.kill(os.getpid(), signal.SIGKILL)  # as Tune ends a trial inside `report`
""")


def child(tmp_path: Path, how: str) -> tuple[subprocess.CompletedProcess, list[Path]]:
    env = dict(os.environ, TMPDIR=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", CHILD, how], env=env, capture_output=True, text=True,
                          timeout=60)
    return done, [Path(p) for p in done.stdout.split()]


def test_a_process_that_exits_removes_its_scratch(tmp_path):
    done, (folder, tmp) = child(tmp_path, "exit")
    assert done.returncode == 0, done.stderr
    assert folder.parent.parent == tmp_path / f"augtune-scratch-{os.getuid()}"
    assert not folder.parent.exists()  # the whole of its scratch


def test_a_forked_child_that_exits_leaves_its_parents_scratch(tmp_path):
    code = CHILD.split("with scratch")[0] + textwrap.dedent("""
        pid = os.fork()
        if pid == 0:
            scratch.scratch_dir("child-")  # its own scratch, then a normal exit (exit handlers run)
            sys.exit(0)
        os.waitpid(pid, 0)
        print(folder, folder.exists(), flush=True)
    """)
    env = dict(os.environ, TMPDIR=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[1] == "True"  # the parent's scratch outlived its child
    assert not Path(done.stdout.split()[0]).parent.exists()  # and went with the parent


def test_a_killed_processs_scratch_is_removed_by_the_next_process_and_no_other(tmp_path, monkeypatch):
    done, (folder, tmp) = child(tmp_path, "kill")
    assert done.returncode == -signal.SIGKILL
    assert (folder / "checkpoint.pt").exists() and Path(tmp).exists()  # what SIGKILL leaves
    base = folder.parent.parent
    host = socket.gethostname()
    live = base / f"{host}-{os.getppid()}"  # a process that runs (pytest's parent)
    elsewhere = base / "another-host-999999"  # a process of another machine: not ours to judge
    for kept in (live, elsewhere):
        kept.mkdir()
    monkeypatch.setattr(scratch.tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(scratch, "_OWN", None)  # this process's first scratch: it sweeps
    mine = scratch.scratch_dir("optuna-")
    assert not folder.parent.exists()
    assert live.exists() and elsewhere.exists()
    assert mine.parent == base / f"{host}-{os.getpid()}"


def test_a_temporary_folder_is_gone_on_leaving_its_block(tmp_path, monkeypatch):
    monkeypatch.setattr(scratch.tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(scratch, "_OWN", None)
    with scratch.temporary("ckpt-") as folder:
        (Path(folder) / "checkpoint.pt").write_bytes(b"x")
    assert not Path(folder).exists() and Path(folder).parent.exists()
