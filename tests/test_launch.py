"""What `augtune.search.launch` decides before Ray starts: the lock, whose folder may be resumed, auth."""
from __future__ import annotations

import json
import os
import socket
import time

import pytest

from augtune.config import ConfigError
from augtune.search.experiment import LOCK_FILE, Lock
from augtune.search.launch import check_local_auth, train_env


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


def test_a_local_ray_is_held_to_loopback_unless_a_cluster_is_joined(monkeypatch):
    from augtune.search.launch import LOOPBACK_ENV, hold_to_loopback

    monkeypatch.delenv(LOOPBACK_ENV, raising=False)
    assert not hold_to_loopback("auto") and LOOPBACK_ENV not in os.environ  # a cluster must reach us
    assert hold_to_loopback(None) and os.environ[LOOPBACK_ENV] == "0"
    monkeypatch.setenv(LOOPBACK_ENV, "1")  # the user's own choice stands
    assert not hold_to_loopback(None) and os.environ[LOOPBACK_ENV] == "1"


LOOPBACK = ("127.0.0.1", "::1", "::ffff:127.0.0.1")


@pytest.mark.ray
@pytest.mark.slow
def test_every_socket_of_a_local_search_listens_on_loopback(tmp_path):
    """The whole process tree of a running `augtune search` (driver, GCS, raylet, agents, workers, the
    trial): every listening socket is on a loopback address."""
    import subprocess
    import sys
    from pathlib import Path

    import psutil
    import yaml

    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({
        "dataset": {"name": "digits", "as_vectors": True, "max_train": 200, "max_test": 100},
        "model": {"backbone": "mlp", "hidden_dim": 16, "num_layers": 2, "embed_dim": 8,
                  "proj_hidden_dim": 8, "proj_dim": 8},
        # an epoch takes milliseconds: the trial must outlast the look (it ends with the Ctrl-C below)
        "train": {"epochs": 100_000, "batch_size": 64, "num_threads": 1},
        "eval": {"metrics": ["knn"]},
        "search": {"space": {"train.lr": "loguniform(1e-4, 1e-2)"}, "algorithm": "random",
                   "num_samples": 1, "scheduler": "none", "metric": "knn_acc"},
    }))
    env = {k: v for k, v in os.environ.items() if k != "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"}
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.Popen([sys.executable, "-m", "augtune.cli", "search", str(config), "--storage",
                             str(tmp_path / "res"), "--name", "exp"], cwd=root, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.time() + 300
        while time.time() < deadline and proc.poll() is None \
                and not any((tmp_path / "res" / "exp").glob("*/record.json")):
            time.sleep(0.5)
        time.sleep(3)  # the trial trains: every server is up
        assert proc.poll() is None, proc.communicate()[1][-3000:]  # the search still runs: its Ray is up
        tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
        listening = []
        for p in tree:
            try:
                listening += [(p.name(), c.laddr.ip, c.laddr.port) for c in p.net_connections("inet")
                              if c.status == psutil.CONN_LISTEN]
            except psutil.NoSuchProcess:
                continue
        assert len(tree) > 3 and len(listening) > 3, (tree, listening)  # Ray's servers were seen
        assert proc.poll() is None  # ... and were the running search's
        assert [s for s in listening if s[1] not in LOOPBACK] == [], listening
    finally:
        import signal

        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the driver stops its own Ray
        try:
            proc.communicate(timeout=180)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate(timeout=60)


def test_ray_failing_to_start_leaves_a_folder_resume_takes(tmp_path, monkeypatch, capsys):
    """No dead end: Ray's start is tried twice (its agent given longer the second time), then one line
    names the cause and the log; the folder holds the plan, so `augtune resume` starts it later."""
    import ray
    import yaml

    from augtune.cli import main
    from augtune.search.launch import AGENT_TIMEOUT_ENV

    tries = []

    def init(**kwargs):
        tries.append(os.environ.get(AGENT_TIMEOUT_ENV))
        raise RuntimeError("Failed to start the raylet.\nThe agent did not register in time")

    monkeypatch.setattr(ray, "init", init)
    monkeypatch.delenv(AGENT_TIMEOUT_ENV, raising=False)
    # Ray's loggers and Python's warnings stay as they are for the tests after this one
    monkeypatch.setattr("augtune.search.progress.quiet_ray", lambda *args, **kwargs: None)
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({
        "dataset": {"name": "digits", "as_vectors": True, "max_test": 100},
        "search": {"space": "simclr", "algorithm": "random", "num_samples": 1, "metric": "knn_acc"}}))
    exp = tmp_path / "res" / "exp"
    assert main(["search", str(config), "--storage", str(tmp_path / "res"), "--name", "exp"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Ray did not start, twice" in err and "agent did not register" in err
    assert f"augtune resume {exp}" in err and str(exp / "augtune.log") in err
    assert tries == [None, "60000"]
    assert (exp / "augtune_search.yaml").is_file() and not (exp / ".augtune.lock").exists()
    assert main(["resume", str(exp)]) == 1  # taken, and the same line: Ray still does not start
    assert "Ray did not start" in capsys.readouterr().err
    assert main(["search", str(config), "--storage", str(tmp_path / "res"), "--name", "exp"]) == 2
    assert f"augtune resume {exp}" in capsys.readouterr().err
