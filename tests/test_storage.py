"""Experiments kept in cloud storage, against a real S3-compatible server on loopback (moto's server
mode): reading, listing and copying an experiment's records, Optuna's study uploaded beside it, and
`augtune search` into a bucket, killed, resumed from the URI in a fresh folder, its status and table."""
from __future__ import annotations

import contextlib
import json
import os
import pickle
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml

from augtune.cli import main
from augtune.config import ConfigError
from augtune.records import SEARCH_FILE
from augtune import storage
from augtune.search.plan import load_plan, resolve_storage

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def s3_server():
    """moto's S3 server on 127.0.0.1 (a free port), and the environment that points pyarrow, boto3 and
    every process started with it (Ray's trial processes too) at it, with fake credentials."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    yield s3_env(*server.get_host_and_port())
    server.stop()


def s3_env(host: str, port: int) -> dict[str, str]:
    """The environment that points pyarrow, boto3 and every process started with it at moto's server."""
    return {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": f"http://{host}:{port}",
            "AWS_EC2_METADATA_DISABLED": "true",
            "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}


@pytest.fixture
def bucket(s3_server, monkeypatch) -> str:
    """A new, empty bucket; this process's environment points at the server."""
    import boto3

    for k, v in s3_server.items():
        monkeypatch.setenv(k, v)
    for k in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
        monkeypatch.delenv(k, raising=False)
    name = f"augtune-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=s3_server["AWS_ENDPOINT_URL"]).create_bucket(Bucket=name)
    return name


def put(uri: str, text: str | bytes) -> None:
    fs, path = storage.filesystem(uri)
    with fs.open_output_stream(path) as f:
        f.write(text.encode() if isinstance(text, str) else text)


def test_read_list_and_copy_an_experiment_without_its_checkpoints(bucket, tmp_path):
    exp = f"s3://{bucket}/searches/exp"
    put(f"{exp}/{SEARCH_FILE}", "config: {}\n")
    put(f"{exp}/experiment_state-2026-01-01_00-00-00.json", "{}")
    put(f"{exp}/tuner.pkl", b"\x80")
    put(f"{exp}/t1/record.json", '{"status": "completed"}')
    put(f"{exp}/t1/error.txt", "ValueError: x")
    put(f"{exp}/t1/checkpoint_000001/record.json", "{}")  # a checkpoint's copy: never downloaded
    put(f"{exp}/t1/checkpoint_000001/checkpoint.pt", b"\0" * 1000)
    put(f"{exp}/repeat_best/t2/record.json", '{"status": "running"}')

    assert storage.exists(exp) and storage.exists(exp, SEARCH_FILE) and not storage.exists(exp, "nope")
    assert storage.read_text(exp, "t1/error.txt") == "ValueError: x" and storage.read_text(exp, "x") is None
    state = "experiment_state-2026-01-01_00-00-00.json"
    assert storage.names(exp) == [SEARCH_FILE, state, "repeat_best", "t1", "tuner.pkl"]
    assert storage.names(f"s3://{bucket}/nothing") == []
    copied = storage.download(exp, tmp_path / "all")
    assert "t1/checkpoint_000001/checkpoint.pt" not in copied and "tuner.pkl" in copied
    with storage.local_copy(exp) as local:
        assert local.name == "exp"  # tables label runs by their experiment's folder name
        files = sorted(str(p.relative_to(local)) for p in local.rglob("*") if p.is_file())
        assert files == [SEARCH_FILE, "repeat_best/t2/record.json", "t1/record.json"]  # no Tune state
    assert not local.exists()
    storage.delete(exp, "tuner.pkl")
    assert not storage.exists(exp, "tuner.pkl")
    with pytest.raises(storage.StorageError, match="no such experiment"):
        with storage.local_copy(f"s3://{bucket}/searches/none"):
            pass


def test_locations_from_the_command_line():
    # argparse's type=Path folds a URI's `//`; the location comes back as typed
    assert storage.argument(Path("s3://bucket/searches/exp")) == "s3://bucket/searches/exp"
    assert storage.argument(Path("gs://b/e")) == "gs://b/e"
    assert storage.argument("results/exp") == "results/exp"
    assert storage.argument(Path("/abs/s3:/x")) == "/abs/s3:/x"
    assert storage.split("s3://b/searches/exp/") == ("s3://b/searches", "exp")
    with pytest.raises(storage.StorageError, match="not a bucket"):
        storage.split("s3://bucket")


def test_a_uri_with_options_in_its_query_is_refused_with_one_line(bucket):
    # augtune joins names onto the location: they would land inside the query
    with pytest.raises(ConfigError, match="--storage: cannot use .*query.*AWS_ENDPOINT_URL"):
        resolve_storage(f"s3://{bucket}?endpoint_override=127.0.0.1:9&scheme=http")
    assert resolve_storage(f"s3://{bucket}/searches/") == f"s3://{bucket}/searches"


def test_resume_status_and_export_of_a_uri_that_holds_no_search_exit_2(bucket, capsys):
    uri = f"s3://{bucket}/searches/none"
    with pytest.raises(ConfigError, match=f"{uri}: not an augtune search folder"):
        load_plan(uri)
    assert main(["resume", uri]) == 2
    assert main(["status", uri]) == 2
    assert main(["export", uri]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(uri in line for line in err), err
    put(f"{uri}/{SEARCH_FILE}", "config: [")  # a corrupt search file: named by its URI, not a copy's path
    assert main(["status", uri]) == 2
    assert f"{uri}/{SEARCH_FILE}: cannot be read" in capsys.readouterr().err


def test_status_of_an_experiment_in_a_bucket(bucket, tmp_path, capsys):
    import pyarrow.fs

    from test_status import TRIALS, write_experiment  # the hand-made folder of the status tests

    exp = write_experiment(tmp_path / "exp", TRIALS)
    fs, path = storage.filesystem(f"s3://{bucket}/searches/exp")
    pyarrow.fs.copy_files(str(exp), path, source_filesystem=pyarrow.fs.LocalFileSystem(),
                          destination_filesystem=fs)
    assert main(["status", f"s3://{bucket}/searches/exp"]) == 0
    out = capsys.readouterr().out
    assert f"search s3://{bucket}/searches/exp: 2 completed, 1 failed, 1 running, 1 stopped early" in out
    assert " stopped " in out and "NonFiniteLoss" in out and "augtune-copy" not in out


def test_optuna_study_uploaded_after_every_write_continues_on_another_machine(bucket):
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    uri = f"s3://{bucket}/searches/exp/optuna.journal"
    study = optuna.create_study(study_name="augtune", storage=JournalStorage(storage.UploadedJournal(uri)),
                                sampler=optuna.samplers.TPESampler(seed=0))
    study.optimize(lambda t: (t.suggest_float("x", -1, 1) - 0.3) ** 2, n_trials=3)
    saved = pickle.dumps(study._storage)  # what Tune's searcher state holds: the URI, not a local path
    assert b"augtune-optuna-" not in saved and uri.encode() in saved

    storage._LOCAL_JOURNALS.clear()  # another machine: no local copy yet
    elsewhere = pickle.loads(saved)
    again = optuna.load_study(study_name="augtune", storage=elsewhere)
    assert len(again.trials) == 3
    again.optimize(lambda t: (t.suggest_float("x", -1, 1) - 0.3) ** 2, n_trials=2)

    storage._LOCAL_JOURNALS.clear()
    copy = Path(storage.UploadedJournal(uri).local)  # a fresh download of what is in the bucket
    opened = optuna.load_study(study_name="augtune", storage=JournalStorage(JournalFileBackend(str(copy))))
    assert [t.number for t in opened.trials] == [0, 1, 2, 3, 4]
    assert opened.best_value == min(t.value for t in opened.trials)


def test_records_tune_ended_are_settled_in_the_bucket(bucket):
    """SettleRecords reads and writes a trial's record through `storage`: in a bucket, a trial the scheduler
    stopped says `stopped`, an errored one `failed`; a completed record is left alone."""
    from types import SimpleNamespace

    from augtune.search.callbacks import SettleRecords

    exp = f"s3://{bucket}/searches/exp"
    fs, path = storage.filesystem(exp)

    def trial(name: str, status: str):
        put(f"{exp}/{name}/record.json", json.dumps({"status": status, "error": None}))
        return SimpleNamespace(storage=SimpleNamespace(storage_filesystem=fs), path=f"{path}/{name}",
                               error_file=None)

    settle = SettleRecords({None: exp}, f"{exp}/repeat_best")
    settle.on_trial_complete(0, [], trial("stopped_early", "running"))
    settle.on_trial_error(0, [], trial("errored", "running"))
    settle.on_trial_complete(0, [], trial("finished", "completed"))
    read = {name: json.loads(storage.read_text(exp, f"{name}/record.json"))
            for name in ("stopped_early", "errored", "finished")}
    assert read["stopped_early"]["status"] == "stopped" and read["stopped_early"]["finished"]
    assert read["errored"]["status"] == "failed" and "error.txt" in read["errored"]["error"]
    assert read["finished"] == {"status": "completed", "error": None}


# -- an object store that goes away for a while -----------------------------------------------------

class Clock:
    """A fake clock that `sleep` moves on, and the pauses taken."""

    def __init__(self):
        self.now, self.pauses = 0.0, []

    def sleep(self, s: float) -> None:
        self.pauses.append(s)
        self.now += s


def test_patiently_retries_an_unreachable_store_with_growing_pauses_until_it_answers():
    from augtune.trainables.ray_trainable import patiently

    clock, calls, said = Clock(), [], []

    def upload():
        calls.append(clock.now)
        if len(calls) < 5:
            raise OSError("AWS Error NETWORK_CONNECTION during PutObject: Couldn't connect to server\nmore")
        return "done"

    assert patiently(upload, "uploading x", 100, sleep=clock.sleep, clock=lambda: clock.now,
                     log=said.append) == "done"
    assert clock.pauses == [1, 2, 4, 8]
    assert said[0] == ("augtune: uploading x: the store is unreachable (AWS Error NETWORK_CONNECTION during "
                       "PutObject: Couldn't connect to server); trying again in 1 s")


def test_patiently_gives_up_with_the_stores_error_once_its_patience_is_spent():
    from augtune.trainables.ray_trainable import patiently

    clock = Clock()

    def never():
        raise OSError("Couldn't connect to server")

    with pytest.raises(OSError, match="Couldn't connect"):
        patiently(never, "x", 100, sleep=clock.sleep, clock=lambda: clock.now, log=lambda s: None)
    assert clock.pauses == [1, 2, 4, 8, 16, 30, 30, 9]  # capped at 30 s; the last one ends at the deadline
    assert clock.now == 100


def test_patiently_does_not_retry_what_is_not_the_store_being_away():
    from augtune.trainables.ray_trainable import patiently

    calls = []

    def broken():
        calls.append(1)
        raise ValueError("a bug, not an outage")

    with pytest.raises(ValueError):
        patiently(broken, "x", 100, sleep=lambda s: pytest.fail("slept"), log=lambda s: None)
    assert calls == [1]


@pytest.mark.slow  # waits out a real retry (the fast tier: docs/contributing.md)
def test_a_trials_upload_waits_out_the_store_being_away_and_then_lands(tmp_path, monkeypatch, capsys):
    """moto's server stopped, an upload of a trial's folder started, the server back on the same port once
    the upload has said that it waits (pyarrow's own retries give up on a refused connection after about
    6 s; augtune's then pause and try again): the upload lands, after saying that it waits."""
    import threading

    from moto.server import ThreadedMotoServer

    import boto3

    from augtune.trainables import ray_trainable

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    for k, v in s3_env(host, port).items():
        monkeypatch.setenv(k, v)
    name = f"augtune-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=f"http://{host}:{port}").create_bucket(Bucket=name)
    folder = ray_trainable.TrialFolder(f"s3://{name}/exp", name="tune_trial_1")
    (folder.local / "record.json").write_text('{"status": "running"}')
    monkeypatch.setattr(ray_trainable, "STORE_PATIENCE_S", 60.0)
    waiting = threading.Event()  # the upload said that it waits: the store comes back then, not at a guess
    patiently = ray_trainable.patiently

    def saying(fn, what, patience_s=None, **kw):
        def log(line: str) -> None:
            print(line)
            waiting.set()
        return patiently(fn, what, patience_s, **{**kw, "log": log})

    monkeypatch.setattr(ray_trainable, "patiently", saying)
    server.stop()
    again = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)  # moto's buckets live in
    back = threading.Thread(target=lambda: (waiting.wait(60), again.start()))  # this process: the same
    try:  # ones come back
        back.start()
        folder.publish()
        said = capsys.readouterr().out
        assert "augtune: uploading s3://" in said and "the store is unreachable" in said, said
        assert storage.read_text(f"s3://{name}/exp/tune_trial_1", "record.json") == '{"status": "running"}'
    finally:
        waiting.set()
        back.join()
        again.stop()


# -- a real search in a bucket ----------------------------------------------------------------------

TINY = {
    "dataset": {"name": "digits"},
    "model": {"backbone": "cnn", "width": 8, "proj_hidden_dim": 16, "proj_dim": 8, "pred_hidden_dim": 16},
    "train": {"epochs": 10, "batch_size": 64, "checkpoint_every": 1},  # ~0.5 s an epoch: killed mid-trial
    # every epoch: Ray's OptunaSearch reads the metric from every result it is given
    "eval": {"metrics": ["knn"], "references": False, "every": 1},
    "search": {"space": {"train.lr": "uniform(0.001, 0.004)"}, "algorithm": "optuna",
               "num_samples": 4, "max_concurrent": 2, "loggers": []},
}


def augtune(env: dict, cwd: Path, *args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "augtune.cli", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, env=env)


def records(uri: str) -> dict[str, dict]:
    """Trial folder -> its record, read from the bucket (a record being replaced reads as absent)."""
    import pyarrow.fs

    fs, path = storage.filesystem(uri)
    out = {}
    for info in fs.get_file_info(pyarrow.fs.FileSelector(path, recursive=True, allow_not_found=True)):
        rel = info.path[len(path):].lstrip("/").split("/")
        if len(rel) == 2 and rel[1] == "record.json" and rel[0].startswith("tune_trial"):
            with contextlib.suppress(OSError, ValueError):
                with fs.open_input_stream(info.path) as f:
                    out[rel[0]] = json.loads(f.read())
    return out


@pytest.mark.ray
@pytest.mark.slow
def test_search_into_a_bucket_killed_then_resumed_from_the_uri_elsewhere(s3_server, bucket, tmp_path):
    # Tune saves its state every second, Train polls its workers often: a kill loses little
    env = {**os.environ, **s3_server, "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.5",
           "TUNE_GLOBAL_CHECKPOINT_S": "1"}
    config = tmp_path / "search.yaml"
    config.write_text(yaml.safe_dump(TINY))
    exp = f"s3://{bucket}/searches/exp"
    first = tmp_path / "first"
    first.mkdir()
    driver = subprocess.Popen([sys.executable, "-m", "augtune.cli", "search", str(config), "--storage",
                               f"s3://{bucket}/searches", "--name", "exp"], cwd=first, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:  # kill once a trial has completed and another is part-way, its record uploaded epoch by epoch
        deadline = time.time() + 600
        while time.time() < deadline:
            recs = records(exp)
            done = [r for r in recs.values() if r["status"] == "completed"]
            partway = [r for r in recs.values() if r["status"] == "running" and 2 <= len(r["epochs"]) < 8]
            if done and partway:
                time.sleep(1.5)  # Tune's state (saved every second) and the checkpoint catch up
                break
            assert driver.poll() is None, "the search ended before it could be killed"
            time.sleep(0.3)
        else:
            pytest.fail("never saw a finished trial next to a part-way one")
        driver.send_signal(signal.SIGKILL)
        driver.wait()
    finally:
        if driver.poll() is None:
            driver.kill()
        with contextlib.suppress(ProcessLookupError):  # the dead driver's local Ray, and nothing else:
            os.killpg(driver.pid, signal.SIGKILL)       # Ray makes its driver a group leader
    before = {name: r for name, r in records(exp).items() if r["status"] == "completed"}
    assert before and not (first / "results").exists()  # nothing of the search was written locally

    elsewhere = tmp_path / "elsewhere"  # a fresh working folder: everything comes from the bucket
    elsewhere.mkdir()
    res = augtune(env, elsewhere, "resume", exp)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "| simclr (train.lr=" in res.stdout  # the table at the end, from a copy of the bucket's records
    after = records(exp)
    error_files = storage.download(exp, tmp_path / "errors", lambda rel: rel.endswith("error.txt"))
    errors = {rel: storage.read_text(exp, rel) for rel in error_files}
    statuses = {name: r["status"] for name, r in after.items()}
    assert len(after) == 4 and all(s == "completed" for s in statuses.values()), "\n".join(
        [*errors.values(), str(statuses)]
    )
    for name, r in after.items():
        assert [e["epoch"] for e in r["epochs"]] == list(range(1, 11)), name
    for name, r in before.items():
        assert after[name]["epochs"] == r["epochs"]  # a finished trial is not run again
    assert any(len(r["nodes"]) > 1 for r in after.values())  # a trial continued after the kill
    copied = storage.download(exp, tmp_path / "everything")  # search.loggers: [] -> no TensorBoard files
    assert copied and not [p for p in copied if "tfevents" in p]

    # Optuna's study was uploaded beside the experiment: the same study, 4 trials, all told
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    journal = tmp_path / "optuna.journal"
    journal.write_text(storage.read_text(exp, "optuna.journal"))
    study = optuna.load_study(study_name="augtune", storage=JournalStorage(JournalFileBackend(str(journal))))
    assert len(study.trials) == 4 and all(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials)

    status = augtune(env, elsewhere, "status", exp, timeout=120)
    assert status.returncode == 0, status.stderr
    assert f"search {exp}: 4 completed" in status.stdout, status.stdout
    table = augtune(env, elsewhere, "export", exp, "--metric", "knn_acc", "--pool", "train.lr", timeout=120)
    assert table.returncode == 0, table.stderr
    assert "| simclr |" in table.stdout and "(4)" in table.stdout, table.stdout
    assert "augtune-copy" not in table.stdout + table.stderr
    assert sorted(p.name for p in elsewhere.iterdir()) == []  # status and export leave nothing behind


@pytest.mark.ray
@pytest.mark.slow
def test_a_search_outlives_the_object_store_being_unreachable_for_a_while(tmp_path):
    """moto's server stopped mid-search (a trial finished, another part-way) and started again on the
    same port 15 s later: the search either waits it out or ends with one line saying how to resume;
    resumed, every trial has all its epochs and the trials that had finished are not run again."""
    from moto.server import ThreadedMotoServer

    import boto3

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    s3 = s3_env(host, port)
    env = {**os.environ, **s3, "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.5", "TUNE_GLOBAL_CHECKPOINT_S": "1"}
    bucket = f"augtune-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=s3["AWS_ENDPOINT_URL"], region_name="us-east-1",
                 aws_access_key_id="testing", aws_secret_access_key="testing").create_bucket(Bucket=bucket)
    saved = {k: os.environ.get(k) for k in s3}
    os.environ.update(s3)  # `records` reads the bucket from this process
    config = tmp_path / "search.yaml"
    config.write_text(yaml.safe_dump(TINY))
    exp = f"s3://{bucket}/searches/exp"
    driver = subprocess.Popen([sys.executable, "-m", "augtune.cli", "search", str(config), "--storage",
                               f"s3://{bucket}/searches", "--name", "exp"], cwd=tmp_path, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              start_new_session=True)
    try:
        deadline = time.time() + 600
        while time.time() < deadline:
            recs = records(exp)
            if any(r["status"] == "completed" for r in recs.values()) and any(
                    r["status"] == "running" and len(r["epochs"]) >= 2 for r in recs.values()):
                break
            assert driver.poll() is None, "the search ended before the outage"
            time.sleep(0.3)
        else:
            pytest.fail("never saw a finished trial next to a part-way one")
        before = {n: r for n, r in records(exp).items() if r["status"] == "completed"}
        server.stop()
        time.sleep(15)
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)  # moto's buckets
        server.start()  # live in this process: the same ones come back
        out, err = driver.communicate(timeout=600)
        if driver.returncode != 0:  # it gave up: in one line, saying how to continue
            last = err.strip().splitlines()[-1]
            assert last.startswith("augtune:") and f"augtune resume {exp}" in last, err[-2000:]
            res = augtune(env, tmp_path, "resume", exp)
            assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        after = records(exp)
        assert len(after) == 4 and all(r["status"] == "completed" for r in after.values()), {
            n: r["status"] for n, r in after.items()}
        for name, r in after.items():
            assert [e["epoch"] for e in r["epochs"]] == list(range(1, 11)), name
        for name, r in before.items():
            assert after[name]["epochs"] == r["epochs"]  # finished before the outage: not run again
    finally:
        if driver.poll() is None:
            driver.kill()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(driver.pid, signal.SIGKILL)  # its local Ray, and nothing else
        server.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
