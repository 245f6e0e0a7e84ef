"""`augtune search` and `augtune resume` on Ray: connect, run, resume, repeat the best.

The plan (`augtune.search.plan`) has checked everything before this module starts Ray. Here:

- a local Ray runs with Ray's token authentication (a local search refuses RAY_AUTH_MODE=disabled),
  its dashboard and metrics exporter off unless asked (see `connect` for what still listens);
- one search per experiment folder at a time (a lock file with the owner's pid and host);
- a search and the repeat of its best are one Tune run (`augtune.search.repeat`), whose trial processes
  are reused across all its trials (`reuse_actors`; each trial resets the global state it could inherit:
  `trainables.ray_trainable.isolate_trial`): the repeat starts no process and no cluster again;
- Optuna keeps its study in the experiment folder (`optuna.journal`, Optuna's journal file), so
  optuna-dashboard and Optuna's plots open it, and a resumed search continues the same study;
- an interrupted search (Ctrl-C) stops with its trials checkpointed and never repeats the best of a
  partial search: `SearchInterrupted` says how to resume; a search whose every trial failed raises
  `SearchFailed` with the first trial's reason.
"""
from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Any, Callable, Optional

import yaml

from augtune.config import Config, ConfigError, to_dict
from augtune.records import REPEAT_DIR, SEARCH_FILE, process_started
from augtune.search.plan import SearchPlan, concurrency, trial_needs, trial_resources
from augtune.search.recovery import prepare_restore

LOCK_FILE = ".augtune.lock"
OPTUNA_FILE = "optuna.journal"  # Optuna's study: optuna.load_study(study_name="augtune", storage=...)
LOG_FILE = "augtune.log"  # Ray's and Tune's own messages (augtune -v shows them on the console)
FINISHED = ("TERMINATED", "ERROR")
TRAIN_POLL_ENV, TRAIN_POLL_S = "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.1"  # see `connect`


class SearchInterrupted(RuntimeError):
    """The search stopped before every trial finished (Ctrl-C); its state is saved."""

    def __init__(self, experiment: str):
        super().__init__(f"interrupted; finished trials are kept. Continue with: augtune resume {experiment}")
        self.experiment = experiment


class SearchFailed(RuntimeError):
    """Every trial of the search failed; the message is the first one's reason."""


# -- Ray ---------------------------------------------------------------------------------------------

def connect(plan_cfg: Config, address: str | None, dashboard: bool) -> dict[str, float]:
    """Start a local Ray (sized for at least one trial, on loopback) or join a cluster; its resources."""
    os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")
    os.environ.setdefault("TUNE_DISABLE_STRICT_METRIC_CHECKING", "1")  # the metric is reported where read
    # with verbose=0: no Tune tables, augtune's lines instead
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    import ray

    if ray.is_initialized():
        return ray.cluster_resources()
    import logging

    quiet = not os.environ.get("AUGTUNE_VERBOSE")
    # Ray's start-up messages stay off the console; its logger goes back to INFO afterwards, into the
    # experiment's log file (augtune.search.progress.quiet_ray)
    kwargs: dict[str, Any] = {"include_dashboard": dashboard, "log_to_driver": not quiet,
                              "logging_level": logging.ERROR if quiet else logging.INFO}
    if address:
        kwargs["address"] = address
        # Nodes that do not have augtune installed get this checkout's package.
        kwargs["runtime_env"] = {"py_modules": [str(Path(__file__).resolve().parents[1])]}
    else:
        # "local": a Ray of its own, never one that ray.init() would otherwise find on this machine
        # (another search's, or the one /tmp/ray/ray_current_cluster names); RAY_ADDRESS still wins.
        # Ray 2.60 cannot be held to loopback: it replaces a node address of 127.0.0.1 by the machine's
        # own (services.resolve_ip_for_localhost), and its gRPC servers listen on every interface. What
        # guards them is its token authentication (the default since 2.59), which a local search keeps
        # on; the metrics exporter, which answers without a token, is off.
        import math

        check_local_auth()
        kwargs["address"] = "local"
        kwargs["num_cpus"] = max(os.cpu_count() or 1, math.ceil(trial_needs(plan_cfg)["CPU"]))
        if not dashboard:
            kwargs["_system_config"] = {"enable_metrics_collection": False}
        os.environ.setdefault("RAY_ENABLE_RECORD_ACTOR_TASK_LOGGING", "0")
    env = train_env()
    os.environ.update(env)  # this machine's Ray processes inherit it; a cluster's get it below
    if address:
        kwargs["runtime_env"]["env_vars"] = env
    handlers = list(logging.getLogger("ray").handlers)
    ray.init(**kwargs)
    ray_logger = logging.getLogger("ray")
    ray_logger.setLevel(logging.INFO)
    for h in handlers:  # ray.init replaces the handlers: the log file's comes back
        if h not in ray_logger.handlers:
            ray_logger.addHandler(h)
    return ray.cluster_resources()


def train_env() -> dict[str, str]:
    """What Ray Train's processes get from a search: its controller takes a worker's report only when it
    polls, every health-check interval (Ray's default 2 s), and a worker's next report waits for it, so a
    DDP trial's epochs shorter than that took the whole interval each (20 digits epochs of 0.5 s: 58.7 s
    at 2 s, 33.6 s at 0.1 s; benchmarks/overhead.py). It polls every 0.1 s unless the environment says
    otherwise; a worker is still declared dead only after Train's own, longer, timeout."""
    return {TRAIN_POLL_ENV: os.environ.get(TRAIN_POLL_ENV, TRAIN_POLL_S)}


def check_local_auth() -> None:
    """A local search's Ray keeps token authentication: its servers listen on the machine's address."""
    mode = os.environ.get("RAY_AUTH_MODE", "token").lower()
    if mode != "token":
        raise ConfigError(f"RAY_AUTH_MODE={mode}: a local search runs Ray with token authentication (its "
                          "servers listen on this machine's address); unset it, or run `ray start` yourself "
                          "and pass --address")


def _trainable(plan: SearchPlan, on_completed: Optional[Callable] = None):
    """The trainable of a search's Tune run: its trials keep their records in the experiment folder (or
    URI), its repeat runs in `repeat_best/` of it; the repeat runs draw the end-of-run figures when there
    is a repeat phase, else the search's trials do (a figure per trial, NRCC's UMAP say, costs seconds to
    minutes each)."""
    from ray import tune

    from augtune.trainables.ray_trainable import tune_trial

    repeats = plan.cfg.search.repeat_best.top > 0
    trainable = tune.with_parameters(
        tune_trial, base=plan.base, experiment=plan.experiment, repeats=f"{plan.experiment}/{REPEAT_DIR}",
        on_completed=None if repeats else on_completed, on_repeat_completed=on_completed,
        tune_run=plan.experiment,
    )
    return tune.with_resources(trainable, trial_resources(plan.cfg))


def _run_config(cfg: Config, name: str, storage: str, callbacks: list, folders: Optional[dict] = None,
                repeats: Optional[str] = None):
    """`folders`, `repeats`: where the records of a Tune run's trials are when not in Tune's folder of them:
    a compare's entrants' searches, the repeat runs (`SettleRecords`). A compare's Tune run (`folders`
    given) is nested in its experiment, and logged as it."""
    from ray import tune

    from augtune.search.callbacks import SettleRecords
    from augtune.search.loggers import logger_callbacks

    return tune.RunConfig(
        name=name, storage_path=storage, verbose=0,  # augtune's own progress lines instead of Tune's tables
        failure_config=tune.FailureConfig(max_failures=cfg.search.max_failures),
        checkpoint_config=tune.CheckpointConfig(num_to_keep=cfg.search.keep_checkpoints),
        callbacks=[SettleRecords(folders, repeats),
                   *logger_callbacks(cfg, storage, name, nested=bool(folders)), *callbacks],
    )


def _optuna_storage(plan: SearchPlan):
    """Optuna's journal file in the experiment folder; in cloud storage, a local journal uploaded there
    after every write (`storage.UploadedJournal`), which `augtune resume URI` downloads on any machine."""
    if plan.cfg.search.algorithm == "grid":
        return None
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    from augtune.search.storage import UploadedJournal, is_uri

    if is_uri(plan.experiment):
        return JournalStorage(UploadedJournal(f"{plan.experiment}/{OPTUNA_FILE}"))
    return JournalStorage(JournalFileBackend(str(Path(plan.experiment) / OPTUNA_FILE)))


def _save_plan(plan: SearchPlan) -> None:
    data = {"config": to_dict(plan.cfg), "base": plan.base, "name": plan.name, "storage": plan.storage}
    text = yaml.safe_dump(data, sort_keys=False)
    if "://" in plan.storage:
        import pyarrow.fs

        fs, path = pyarrow.fs.FileSystem.from_uri(plan.experiment)
        fs.create_dir(path, recursive=True)
        with fs.open_output_stream(f"{path}/{SEARCH_FILE}") as f:
            f.write(text.encode())
    else:
        Path(plan.experiment).mkdir(parents=True, exist_ok=True)
        (Path(plan.experiment) / SEARCH_FILE).write_text(text)


# -- one search per folder ----------------------------------------------------------------------------

class Lock:
    """`<experiment>/.augtune.lock` holding the owner's pid and host, while a search runs there. A lock
    left by a process that is gone (same host, pid not alive) is taken over; any other is refused."""

    def __init__(self, experiment: str):
        self.path = None if "://" in experiment else Path(experiment) / LOCK_FILE

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
            return json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}

    def _stale(self) -> bool:
        owner = self._owner()
        if owner.get("host") != socket.gethostname():
            return False  # another machine's search: only its owner knows
        try:
            pid = int(owner.get("pid", -1))
            os.kill(pid, 0)
        except (ProcessLookupError, ValueError, TypeError, OverflowError):
            return True
        except PermissionError:
            return False
        started = process_started(pid)  # a live pid that began after the lock was taken is another process
        return started is not None and isinstance(owner.get("started"), (int, float)) \
            and started > owner["started"] + 1.0

    def __exit__(self, *exc) -> None:
        if self.path is not None and self._owner().get("pid") == os.getpid():
            self.path.unlink(missing_ok=True)


# -- running ----------------------------------------------------------------------------------------------

def _fit(tuner) -> tuple[Any, dict[str, str], Any]:
    """Run a Tuner (new or restored); its results, each trial's status as Tune's last step left it
    (`StepStatuses`: a restored run brings back the callbacks it was started with, or is given one), and
    its search algorithm (the object Tune ran, restored or not)."""
    from augtune.search.callbacks import StepStatuses

    run_config = tuner._local_tuner.get_run_config()
    algorithm = tuner._local_tuner._tune_config.search_alg
    stepped = next((c for c in run_config.callbacks or [] if isinstance(c, StepStatuses)), None)
    if stepped is None:
        stepped = StepStatuses()
        run_config.callbacks = [*(run_config.callbacks or []), stepped]
    for callback in run_config.callbacks:
        if hasattr(callback, "phases"):  # the progress line counts the repeat runs the algorithm chose
            callback.phases = algorithm
    return tuner.fit(), stepped.statuses, algorithm


def _check_finished(results, experiment: str, stepped: dict[str, str], algorithm) -> None:
    """Raise SearchInterrupted when trials are left unfinished as Tune's last step left them (`stepped`:
    an interrupted run's clean-up marks them ended) or the search algorithm has trials still to make,
    SearchFailed when all of them failed."""
    trials = list(results._experiment_analysis.trials)
    unfinished = [
        t for t in trials if t.status not in FINISHED or stepped.get(t.trial_id, t.status) not in FINISHED
    ]
    if unfinished or not algorithm.is_finished():
        raise SearchInterrupted(experiment)
    if trials and all(t.status == "ERROR" for t in trials):
        from augtune.search.status import error_line

        first = next((error_line(Path(t.error_file)) for t in trials if t.error_file), "") or "see error.txt"
        raise SearchFailed(f"every trial of {experiment} failed; the first: {first}")


def finish(tuner, experiment: str) -> None:
    """Run the Tuner of a search and its repeat (new or restored) to its end, or say why it did not end."""
    from augtune.search.repeat import SearchThenRepeat

    if not isinstance(tuner._local_tuner._tune_config.search_alg, SearchThenRepeat):
        raise ConfigError(f"{experiment}: started by an augtune older than 0.3, whose repeat phase was a "
                          "Tune run of its own; continue it with the augtune version that started it")
    results, stepped, algorithm = _fit(tuner)
    _check_finished(results, experiment, stepped, algorithm)


def search_algorithm(search, choose, conc: int, scheduler=None):
    """What Tune runs for a search and the repeat of its best (`repeat.SearchThenRepeat`), and the
    scheduler: the search's own for its trials (ASHA), never one that stops a repeat run early."""
    from augtune.search.multiplex import EntrantsScheduler
    from augtune.search.repeat import SearchThenRepeat

    if scheduler is not None and not isinstance(scheduler, EntrantsScheduler):
        scheduler = EntrantsScheduler({None: scheduler})
    return SearchThenRepeat(search, choose, conc), scheduler


def run_search(plan: SearchPlan, log: Callable[[str], None] = print, on_completed: Optional[Callable] = None,
               callbacks: Optional[list] = None) -> None:
    """Launch the search and, when asked, the repeat of its best configurations, in one Tune run
    (`on_completed`: what each completed trial runs in its folder, e.g. the CLI's end-of-run figures)."""
    from ray import tune

    from augtune.search.repeat import RepeatBest
    from augtune.search.searchers import restorable, scheduler, searcher
    from augtune.spaces import resolve_space

    with Lock(plan.experiment):  # before Ray starts: a folder in use is refused at once
        cluster = connect(plan.cfg, plan.address, plan.dashboard)
        conc = concurrency(plan.cfg, cluster)
        _save_plan(plan)
        cfg = plan.cfg
        algorithm, param_space = searcher(cfg, resolve_space(cfg.search), _optuna_storage(plan))
        rb = cfg.search.repeat_best
        log(f"search {plan.experiment}: {cfg.search.algorithm}, {cfg.search.num_samples} samples, "
            f"{conc} trial(s) at a time, optimising {cfg.search.metric} ({cfg.search.mode})"
            + (f"; then the best {rb.top}" + (f" of each {rb.per}" if rb.per else "")
               + f" on {len(rb.seeds)} seed(s)" if rb.top else ""))
        # the search algorithm holds the concurrency limit (and agrees with Tune's trials when restored)
        search_alg, sched = search_algorithm(restorable(algorithm, conc), RepeatBest(to_dict(cfg)), conc,
                                             scheduler(cfg))
        tuner = tune.Tuner(
            _trainable(plan, on_completed),
            param_space=param_space,
            tune_config=tune.TuneConfig(metric=cfg.search.metric, mode=cfg.search.mode, search_alg=search_alg,
                                        scheduler=sched, num_samples=cfg.search.num_samples,
                                        reuse_actors=True),
            run_config=_run_config(cfg, plan.name, plan.storage, callbacks or [],
                                   repeats=f"{plan.experiment}/{REPEAT_DIR}"),
        )
        finish(tuner, plan.experiment)


def check_trusted(experiment: str) -> None:
    """`resume` unpickles Tune's state (`tuner.pkl`, the searcher's): refuse a folder, or files in it, that
    someone else owns or may write (the search's own folder and every nested Tune experiment's).

    In cloud storage (s3://, gs://) there are no owner or mode bits to read: objects carry neither, and who
    may write them is the bucket's policy and IAM, which pyarrow cannot query. There the storage's access
    control is the boundary: whoever may write the experiment's prefix can run code in `augtune resume`
    (as in Tune's own `Tuner.restore`), so keep it in a bucket only you can write to (README)."""
    if "://" in experiment:
        return
    folder = Path(experiment)
    state = [p for pattern in ("*.pkl", "*/*.pkl", "*.json") for p in folder.glob(pattern)]
    for path in [folder, folder / SEARCH_FILE, *(p.parent for p in state), *state]:
        if not path.exists():
            continue
        st = path.stat()
        if st.st_uid != os.getuid():
            raise ConfigError(f"{path}: owned by another user (uid {st.st_uid}); resume loads pickled state "
                              "from this folder, so it must be yours")
        if st.st_mode & 0o022:
            raise ConfigError(f"{path}: writable by others; resume loads pickled state from this folder, so "
                              f"it must be yours alone (chmod go-w {path})")


def resume_search(plan: SearchPlan, restart_errored: bool = False, log: Callable[[str], None] = print,
                  on_completed: Optional[Callable] = None, callbacks: Optional[list] = None) -> None:
    """Finish the search, then (in the same Tune run, and only then) the repeat of the whole search's best."""
    from ray import tune

    from augtune.search.loggers import only_chosen_loggers

    check_trusted(plan.experiment)
    only_chosen_loggers()  # the restored run brings back the logger callbacks it was started with
    if not tune.Tuner.can_restore(plan.experiment):  # killed before Tune saved anything: start again
        with Lock(plan.experiment):  # a search running there right now keeps its study
            _clear_lost_start(plan)
        log("no Tune state was saved yet: starting the search from the beginning")
        return run_search(plan, log, on_completed, callbacks)
    with Lock(plan.experiment):
        prepare_restore(plan.experiment)
        connect(plan.cfg, plan.address, plan.dashboard)
        log(f"resuming {plan.experiment}")
        tuner = tune.Tuner.restore(plan.experiment, trainable=_trainable(plan, on_completed),
                                   resume_unfinished=True, resume_errored=not restart_errored,
                                   restart_errored=restart_errored)
        finish(tuner, plan.experiment)


def _clear_lost_start(plan: SearchPlan) -> None:
    """A driver killed right after it started left augtune's files but no Tune state: clear the study."""
    from augtune.search.storage import delete, names

    for name in names(plan.experiment):  # only augtune's own files can be here: Tune wrote none
        if name not in (SEARCH_FILE, LOCK_FILE, OPTUNA_FILE, LOG_FILE):
            raise ConfigError(f"{plan.experiment}: Tune's state is missing but {name} is there; move the "
                              "folder aside and start the search again")
    delete(plan.experiment, OPTUNA_FILE)
