"""Faults under a real Ray: a killed driver, a lost node, a NaN trial."""
from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import TINY_CNN, sigkill_driver

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.ray, pytest.mark.slow]

TINY = {
    "dataset": {"name": "digits", "max_train": 256, "max_test": 128},
    "model": TINY_CNN,
    "train": {"epochs": 2, "batch_size": 64},
    "eval": {"metrics": ["knn"], "references": False},
}


def write_config(tmp_path: Path, **sections) -> Path:
    cfg = json.loads(json.dumps(TINY))
    for k, v in sections.items():
        cfg.setdefault(k, {}).update(v)
    path = tmp_path / "search.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def env() -> dict:
    # Tune writes its experiment state every second, Train polls its workers often: a kill loses little.
    return {**os.environ, "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.5", "TUNE_GLOBAL_CHECKPOINT_S": "1"}


def augtune(*args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "augtune.cli", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, env=env())


def start_search(config: Path, storage: Path, log: Path) -> subprocess.Popen:
    """`augtune search CONFIG` as experiment `exp` in `storage`, in the background, its output in `log`."""
    with log.open("wb") as out:
        return subprocess.Popen([sys.executable, "-m", "augtune.cli", "search", str(config), "--storage",
                                 str(storage), "--name", "exp"], cwd=ROOT, env=env(), stdout=out,
                                stderr=subprocess.STDOUT)


def reported_epochs(trial_dir: Path) -> list[int]:
    """Epochs in Tune's result.json; Tune may be appending a line right now, so a torn last line
    (read mid-write) is left for the next look."""
    path = trial_dir / "result.json"
    text = path.read_text() if path.exists() else ""
    lines = text.splitlines() if text.endswith("\n") else text.splitlines()[:-1]
    return [json.loads(line)["epoch"] for line in lines if line.strip()]


def record_of(trial_dir: Path) -> dict | None:
    """The trial's record, or None while it has none. Records are replaced atomically; a read that still
    finds no complete JSON (another writer's half file) is retried before it counts as an error."""
    path = trial_dir / "record.json"
    for _ in range(20):
        try:
            return json.loads(path.read_text())
        except FileNotFoundError:
            return None
        except ValueError:
            time.sleep(0.1)
    return json.loads(path.read_text())


def status_of(trial_dir: Path) -> str | None:
    record = record_of(trial_dir)
    return record and record["status"]


def trial_dirs(exp: Path) -> list[Path]:
    return sorted(p for p in exp.iterdir() if p.is_dir() and p.name.startswith("tune_trial"))


def test_nan_trial_is_errored_with_its_reason_and_the_others_finish(tmp_path, shared_ray):
    # a temperature below float32's range makes 1/tau infinite: the loss is NaN at the first step
    config = write_config(tmp_path, search={"space": {"train.temperature": "grid([0.1, 1.0e-45])"},
                                            "algorithm": "grid", "num_samples": 1, "max_failures": 0})
    res = augtune("search", str(config), "--storage", str(tmp_path / "s"), "--name", "exp", "--address",
                  shared_ray)
    assert res.returncode == 0, res.stderr[-3000:]
    exp = tmp_path / "s" / "exp"
    records = {json.loads((d / "record.json").read_text())["config"]["train"]["temperature"]: json.loads(
        (d / "record.json").read_text()) for d in trial_dirs(exp)}
    assert records[0.1]["status"] == "completed"
    assert records[1e-45]["status"] == "failed" and "loss became" in records[1e-45]["error"]
    status = augtune("status", str(exp))
    assert "1 failed" in status.stdout and re.search(r"1 (completed|stopped early)", status.stdout)
    assert "NonFiniteLoss" in status.stdout or "loss became" in status.stdout

    # --restart-errored runs the errored trial again from scratch (it fails again: the NaN is
    # deterministic); the finished one is left alone.
    finished = next(d for d in trial_dirs(exp) if json.loads((d / "record.json").read_text())["status"]
                    == "completed")
    before = (finished / "result.json").read_text()
    res = augtune("resume", str(exp), "--restart-errored", "--address", shared_ray)
    assert res.returncode == 0, res.stderr[-3000:]
    assert (finished / "result.json").read_text() == before
    status = augtune("status", str(exp))
    assert "1 failed" in status.stdout and re.search(r"1 (completed|stopped early)", status.stdout)


def record_epochs(trial_dir: Path) -> int:
    """The last epoch the trial's own record holds (written after every epoch, straight to its folder)."""
    record = record_of(trial_dir)
    return len(record["epochs"]) if record else 0


def test_killed_driver_resumes_without_losing_or_rerunning_trials(tmp_path):
    # 0.07 s each on an idle 2-core machine, 0.5 s on a loaded one: enough of them that a trial still runs
    # well after the first has finished, so the kill lands in the middle of one, whatever the machine
    epochs = 60
    config = write_config(tmp_path, dataset={"max_train": None}, model={"width": 8},
                          train={"epochs": epochs, "checkpoint_every": 1},  # the test is about continuing
                          search={"space": {"train.lr": "grid([0.001, 0.002, 0.003, 0.004])"},
                                  "algorithm": "grid", "num_samples": 1, "max_concurrent": 2})
    exp = tmp_path / "s" / "exp"
    log = tmp_path / "driver.log"
    driver = start_search(config, tmp_path / "s", log)
    try:
        # Kill once a trial has finished (and Tune has saved its state since) while another is
        # part-way through: checkpointed, not done. What each look saw goes into a failure's message.
        deadline, first_done, seen = time.time() + 600, None, []
        while time.time() < deadline and driver.poll() is None:
            dirs = trial_dirs(exp) if exp.exists() else []
            at = {d.name[-20:]: (status_of(d), record_epochs(d)) for d in dirs}
            if not seen or seen[-1][1] != at:
                seen.append((round(time.time() - deadline + 600, 1), at))
            done = [name for name, (status, _) in at.items() if status == "completed"]
            partway = [name for name, (status, e) in at.items()
                       if status != "completed" and 2 <= e < epochs - 2]
            if done and first_done is None:
                first_done = time.time()
            if first_done and time.time() - first_done > 1.5 and partway:
                break
            time.sleep(0.2)
        else:
            pytest.fail(f"never saw a finished trial next to a part-way one (driver's exit code "
                        f"{driver.poll()}); seen: {seen}\ndriver's log ends: {log.read_text()[-3000:]}")
        driver.send_signal(signal.SIGKILL)
        driver.wait()
    finally:
        if driver.poll() is None:
            driver.kill()
    done = [d for d in trial_dirs(exp) if status_of(d) == "completed"]
    finished_before = {d.name: (d / "result.json").read_text() for d in done}
    with contextlib.suppress(ProcessLookupError):  # the dead driver's local Ray, and nothing else on
        os.killpg(driver.pid, signal.SIGKILL)       # this machine: Ray makes its driver a group leader

    res = augtune("resume", str(exp))
    assert res.returncode == 0, res.stderr[-3000:]
    dirs = trial_dirs(exp)
    assert len(dirs) == 4  # no trial lost, none added
    for d in dirs:
        record = record_of(d)
        assert record["status"] == "completed", d.name
        assert [e["epoch"] for e in record["epochs"]] == list(range(1, epochs + 1))
        seen = reported_epochs(d)
        assert seen.count(1) == 1, (d.name, seen)  # continued from its checkpoint, never restarted
    for name, before in finished_before.items():  # a finished trial is not run again: ...
        assert len(record_of(exp / name)["nodes"]) == 1  # ... never restarted, and its result log only ...
        # ... finished where the kill cut Tune's copy of it short (then it was empty or a prefix, whose
        # last line, cut short, is left out), from the trial's record (`resume.complete_logs`)
        assert (exp / name / "result.json").read_text().startswith(before[: before.rfind("\n") + 1])
        assert reported_epochs(exp / name) == list(range(1, epochs + 1))
    resumed = [d for d in dirs if len(record_of(d)["nodes"]) > 1]
    assert resumed  # at least one trial ran before and after the kill ...
    for d in resumed:  # ... and its epochs continued: reported before and after, each once
        seen = reported_epochs(d)
        assert sorted(set(seen)) == list(range(1, epochs + 1)) and seen[0] == 1, seen


@pytest.fixture(scope="module")
def cluster():
    """A local cluster of two one-CPU nodes, a head and a worker, shared by the tests that lose the worker
    mid-search: each removes it and adds a replacement (as an autoscaler would), the next one's worker."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    try:
        yield cluster
    finally:
        cluster.shutdown()


def worker_of(cluster):
    """The cluster's one worker node (made again if a test before left none, or more than one)."""
    while len(cluster.worker_nodes) > 1:
        cluster.remove_node(next(iter(cluster.worker_nodes)))
    if not cluster.worker_nodes:
        cluster.add_node(num_cpus=1)
    return next(iter(cluster.worker_nodes))


def mid_way_on(node, dirs: list[Path], epochs: int) -> bool:
    """The trial that `node` runs (its record names the node) is mid-way: past its first checkpoint, with
    epochs still to go, so that losing the node loses a running trial that a retry continues. Its record
    says so, not the other trial's, which may start seconds before or after it, or even finish first."""
    records = [r for r in map(record_of, dirs) if r and r.get("nodes")]
    return any(r["nodes"][-1] == node.node_id and 2 <= len(r["epochs"]) <= epochs // 2 for r in records)


def stop(driver) -> None:
    """A driver of the shared cluster that a failed test left running goes, before the next test."""
    if driver is not None and driver.poll() is None:
        driver.kill()
        driver.wait()


def test_two_node_cluster_spreads_trials_and_survives_losing_a_node(tmp_path, cluster):
    worker, driver = worker_of(cluster), None
    try:
        cluster.wait_for_nodes()
        # ~0.03-0.2 s each: the worker's trial spends seconds between its 2nd and its 50th, whatever the
        # machine, and the node goes then (`mid_way_on`)
        epochs = 100
        config = write_config(
            tmp_path,
            model={"width": 8},
            train={"epochs": epochs, "checkpoint_every": 1},  # the retry continues from it
            search={
                "space": {"train.lr": "grid([0.001, 0.002])"},
                "algorithm": "grid",
                "num_samples": 1,
                "max_failures": 3,
            },
        )
        exp = tmp_path / "s" / "exp"
        driver = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "augtune.cli",
                "search",
                str(config),
                "--storage",
                str(tmp_path / "s"),
                "--name",
                "exp",
                "--address",
                cluster.address,
            ],
            cwd=ROOT,
            env=env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        deadline = time.time() + 600
        while time.time() < deadline:
            # the trials' own records (written every epoch), not Tune's result logs: the driver copies those
            # to the experiment only now and then, and a whole trial can pass between two copies
            if mid_way_on(worker, trial_dirs(exp) if exp.exists() else [], epochs):
                break
            if driver.poll() is not None:
                pytest.fail(f"search ended early:\n{driver.stdout.read()[-3000:]}")
            time.sleep(0.2)
        else:
            pytest.fail(f"never saw the worker node's trial mid-way: {trial_dirs(exp)}")
        cluster.remove_node(worker)  # mid-trial: one trial loses its node
        cluster.add_node(num_cpus=1)  # a replacement, as an autoscaler would bring
        out, _ = driver.communicate(timeout=900)
        assert driver.returncode == 0, out[-3000:]
        nodes = set()
        for d in trial_dirs(exp):
            record = json.loads((d / "record.json").read_text())
            assert record["status"] == "completed"
            assert [e["epoch"] for e in record["epochs"]] == list(range(1, epochs + 1))
            nodes.update(record["nodes"][:1])
            seen = reported_epochs(d)
            assert seen.count(1) == 1, seen  # the retried trial continued from its checkpoint
        assert len(nodes) == 2  # the two trials started on different nodes
        retried = [
            d for d in trial_dirs(exp) if len(json.loads((d / "record.json").read_text())["nodes"]) > 1
        ]
        assert retried  # the trial on the removed node was retried elsewhere
    finally:
        stop(driver)


def test_a_compare_on_a_two_node_cluster_finishes_after_losing_a_node_mid_search(tmp_path, cluster):
    """Two entrants' search trials on two nodes; the worker node removed while its trial trains, a
    replacement added (as an autoscaler would): the lost trial is retried from its checkpoint on another
    node, the compare finishes with every search trial and repeat run complete, and its verdict is whole."""
    worker, driver = worker_of(cluster), None
    try:
        cluster.wait_for_nodes()
        epochs = 100  # as above
        cfg = json.loads(json.dumps(TINY))
        cfg["model"]["width"] = 8
        cfg["train"] = {"epochs": epochs, "batch_size": 64, "checkpoint_every": 1}
        cfg["search"] = {"max_failures": 3, "scheduler": "none"}
        cfg["compare"] = {"methods": ["base"], "bases": ["simclr", "byol"], "trials": 1, "seeds": 1,
                          "metrics": ["knn_acc"]}
        config = tmp_path / "compare.yaml"
        config.write_text(yaml.safe_dump(cfg))
        exp = tmp_path / "c" / "cmp"
        driver = subprocess.Popen([sys.executable, "-m", "augtune.cli", "compare", str(config), "--storage",
                                   str(tmp_path / "c"), "--name", "cmp", "--address", cluster.address],
                                  cwd=ROOT, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True)

        def search_trials() -> list[Path]:  # each entrant's folder holds its search trials' records
            if not exp.exists():
                return []
            return [d for d in exp.glob("*/tune_*trial_*")
                    if d.is_dir() and d.parent.name not in ("search", "repeat")]

        deadline = time.time() + 600
        while time.time() < deadline:
            if mid_way_on(worker, search_trials(), epochs):
                break
            if driver.poll() is not None:
                pytest.fail(f"compare ended early:\n{driver.stdout.read()[-3000:]}")
            time.sleep(0.2)
        else:
            pytest.fail(f"never saw the worker node's search trial mid-way: {search_trials()}")
        cluster.remove_node(worker)  # mid-trial: one entrant's trial loses its node
        cluster.add_node(num_cpus=1)
        out, _ = driver.communicate(timeout=900)
        assert driver.returncode == 0, out[-3000:]
        records = [json.loads((d / "record.json").read_text()) for d in search_trials()]
        assert len(records) == 2 and all(r["status"] == "completed" for r in records)
        assert all([e["epoch"] for e in r["epochs"]] == list(range(1, epochs + 1)) for r in records)
        assert len({r["nodes"][0] for r in records}) == 2  # the two entrants' trials started apart
        assert any(len(r["nodes"]) > 1 for r in records)  # the lost one was retried on another node
        repeats = [json.loads(p.read_text()) for p in (exp / "repeat").glob("*/record.json")]
        assert sorted(r["entrant"] for r in repeats if r["status"] == "completed") == ["byol", "simclr"]
        import augtune

        assert not augtune.load(exp).verdict().unfinished
    finally:
        stop(driver)


@pytest.mark.parametrize("moment", ["first repeat run starts", "a repeat run is part-way"])
def test_a_driver_killed_in_the_repeat_phase_resumes_with_no_orphan(tmp_path, moment):
    """SIGKILL while the best is repeated: after `augtune resume` every seed has one completed repeat
    run, and no record is left `running` (a run Tune never saved is marked failed and made again)."""
    epochs = 60  # ~0.03-0.2 s each: a repeat run is part-way for seconds
    config = write_config(tmp_path, model={"width": 8},
                          train={"epochs": epochs, "checkpoint_every": 1},
                          search={"space": {"train.lr": "grid([0.001, 0.002])"}, "algorithm": "grid",
                                  "num_samples": 1, "max_concurrent": 2, "scheduler": "none",
                                  "repeat_best": {"top": 1, "seeds": [1, 2]}})
    exp = tmp_path / "s" / "exp"
    repeats = exp / "repeat_best"
    log = tmp_path / "driver.log"
    driver = start_search(config, tmp_path / "s", log)
    try:
        deadline = time.time() + 900
        while time.time() < deadline and driver.poll() is None:
            runs = [record_of(d) for d in repeats.iterdir() if d.is_dir()] if repeats.exists() else []
            runs = [r for r in runs if r]
            if moment.startswith("first") and runs:
                break
            if moment.startswith("a repeat") and any(2 <= len(r["epochs"]) < epochs - 2 for r in runs):
                break
            time.sleep(0.1)
        else:
            pytest.fail(f"never saw the moment ({driver.poll()}): {log.read_text()[-3000:]}")
    finally:
        sigkill_driver(driver)

    res = augtune("resume", str(exp))
    assert res.returncode == 0, res.stderr[-3000:]
    records = [record_of(d) for d in repeats.iterdir() if d.is_dir()]
    assert [r["status"] for r in records if r["status"] not in ("completed", "failed")] == []
    assert sorted(r["seed"] for r in records if r["status"] == "completed") == [1, 2]
    assert all("driver was killed" in r["error"] for r in records if r["status"] == "failed")
    assert "unfinished" not in res.stdout


def test_a_trial_process_killed_as_the_oom_killer_would_is_retried_from_its_checkpoint(tmp_path):
    """SIGKILL to a running trial's process (what the kernel's OOM killer sends): Tune retries the trial
    from its last checkpoint (`search.max_failures`), it completes with every epoch once, and the
    search goes on to its end."""
    import psutil

    epochs = 40
    config = write_config(tmp_path, dataset={"max_train": None}, model={"width": 8},
                          train={"epochs": epochs, "checkpoint_every": 1},
                          search={"space": {"train.lr": "grid([0.001, 0.002])"}, "algorithm": "grid",
                                  "num_samples": 1, "max_concurrent": 1, "scheduler": "none",
                                  "max_failures": 2})
    exp = tmp_path / "s" / "exp"
    log = tmp_path / "driver.log"
    driver = start_search(config, tmp_path / "s", log)
    try:
        deadline, victim = time.time() + 600, None
        while time.time() < deadline and driver.poll() is None and victim is None:
            partway = [d for d in (trial_dirs(exp) if exp.exists() else [])
                       if 3 <= record_epochs(d) < epochs - 5]
            if partway:
                trials = [p for p in psutil.Process(driver.pid).children(recursive=True)
                          if "ImplicitFunc" in " ".join(p.cmdline()) or "ImplicitFunc" in p.name()]
                victim = trials[0] if trials else None
            time.sleep(0.2)
        assert victim is not None, f"no trial process seen part-way: {log.read_text()[-3000:]}"
        victim.kill()
        assert driver.wait(timeout=900) == 0, log.read_text()[-3000:]
    finally:
        if driver.poll() is None:
            driver.kill()
    for d in trial_dirs(exp):
        record = record_of(d)
        assert record["status"] == "completed", (d.name, record.get("error"))
        assert [e["epoch"] for e in record["epochs"]] == list(range(1, epochs + 1))
    retried = [d for d in trial_dirs(exp) if len(record_of(d)["nodes"]) > 1]
    assert retried  # the killed trial started again ...
    for d in retried:  # ... from its checkpoint: its first epochs were reported once
        assert reported_epochs(d).count(1) == 1
