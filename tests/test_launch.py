"""What `augtune.search.launch` decides before Ray starts: the lock, whose folder may be resumed, auth."""
from __future__ import annotations

import json
import os
import socket
import time

import pytest

from augtune.config import ConfigError
from augtune.search.launch import LOCK_FILE, Lock, check_local_auth, check_trusted, train_env


def test_a_lock_whose_pid_now_names_another_process_is_stale(tmp_path):
    # the lock was taken a day before this process (its pid) began: the pid was reused since
    from augtune.records import process_started

    (tmp_path / LOCK_FILE).write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                                  "started": process_started(os.getpid()) - 86400}))
    with Lock(str(tmp_path)):
        assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == os.getpid()
    (tmp_path / LOCK_FILE).write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                                  "started": time.time()}))
    with pytest.raises(ConfigError, match="another search is running there"):
        Lock(str(tmp_path)).__enter__()  # the owner is alive and the same process


def test_resume_refuses_state_that_others_may_write_or_own(tmp_path, monkeypatch):
    exp = tmp_path / "exp"
    (exp / "repeat").mkdir(parents=True)
    (exp / "tuner.pkl").write_bytes(b"x")
    (exp / "repeat" / "tuner.pkl").write_bytes(b"x")
    for p in (exp, exp / "repeat", exp / "tuner.pkl", exp / "repeat" / "tuner.pkl"):
        p.chmod(0o755 if p.is_dir() else 0o644)
    check_trusted(str(exp))
    (exp / "repeat" / "tuner.pkl").chmod(0o666)  # a nested experiment's state counts too
    with pytest.raises(ConfigError, match="writable by others"):
        check_trusted(str(exp))
    (exp / "repeat" / "tuner.pkl").chmod(0o644)
    monkeypatch.setattr(os, "getuid", lambda: os.stat(exp).st_uid + 1)  # as if another user ran resume
    with pytest.raises(ConfigError, match="owned by another user"):
        check_trusted(str(exp))


@pytest.mark.parametrize("mode", ["disabled", "DISABLED", "none"])
def test_a_local_search_refuses_ray_without_token_auth(monkeypatch, mode):
    monkeypatch.setenv("RAY_AUTH_MODE", mode)
    with pytest.raises(ConfigError, match="RAY_AUTH_MODE"):
        check_local_auth()
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    check_local_auth()
    monkeypatch.delenv("RAY_AUTH_MODE")
    check_local_auth()  # Ray's default


def test_ray_train_polls_its_workers_often_unless_told_otherwise(monkeypatch):
    """Train's controller takes a worker's report only when it polls (Ray's default: every 2 s), and the
    worker waits for it: a search's DDP trials poll every 0.1 s, and a value in the environment wins."""
    monkeypatch.delenv("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", raising=False)
    assert train_env() == {"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.1"}
    monkeypatch.setenv("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.5")
    assert train_env() == {"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.5"}
