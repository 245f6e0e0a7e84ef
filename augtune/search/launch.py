"""The one driver of `augtune search`, `augtune compare` and `augtune resume`: Ray, then start or resume.

An experiment is one Tune run (`augtune.search.tune_run.TuneRun`, built there): a search's trials and the
repeat of its best, or every entrant's search of a compare and the repeat of each entrant's best. `drive`
runs it, new or restored, through the same steps: the folder's lock, Ray, then `Tuner.restore` when
Tune saved a state there (`augtune resume`, or a compare started again) or a new Tuner, and `finish`.
The plan (`augtune.search.plan`) has checked everything before this module starts Ray. Here:

- a local Ray listens on loopback only (`hold_to_loopback`) and runs with Ray's token authentication (a
  local search refuses RAY_AUTH_MODE=disabled), its dashboard and metrics exporter off unless asked;
  failing to start, it is tried once more, then `RayStartFailed` says why in one line;
- a restored run's pickled state is verified first (`augtune.search.trust`), runs Tune never saved are
  settled (`recovery.settle_lost_records`), and a finished one is marked (`experiment.mark_finished`);
- one driver per experiment folder at a time (`experiment.Lock`);
- a search and the repeat of its best are one Tune run (`augtune.search.repeat`), whose trial processes
  are reused across all its trials (`reuse_actors`; each trial resets the global state it could inherit:
  `trainables.ray_trainable.isolate_trial`): the repeat starts no process and no cluster again;
- Optuna keeps its study in the experiment folder (`experiment.optuna_storage`), so optuna-dashboard
  and Optuna's plots open it, and a resumed search continues the same study;
- an interrupted search (Ctrl-C) stops with its trials checkpointed and never repeats the best of a
  partial search: `SearchInterrupted` says how to resume; a search whose every trial failed raises
  `SearchFailed` with the first trial's reason.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from augtune.config import Config, ConfigError
from augtune.search.experiment import (Lock, SearchFailed, SearchInterrupted, check_trusted,
                                       mark_finished)
from augtune.search.plan import concurrency, trial_needs
from augtune.search.recovery import finish_interrupted_copy, prepare_restore, settle_lost_records
from augtune.search.storage import is_uri

if TYPE_CHECKING:
    from augtune.search.tune_run import TuneRun

FINISHED = ("TERMINATED", "ERROR")
# Ray's node address is 127.0.0.1 when this is 0 (ray_constants reads it when Ray is imported): every
# server of a local Ray (GCS, raylets, workers, driver, agents, metrics) then listens on loopback only
LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
# how long a raylet waits for its agent to register (Ray's default 15 s; a busy machine's agent can take
# longer, and the raylet then aborts): the second try at starting a local Ray waits a minute
AGENT_TIMEOUT_ENV, AGENT_TIMEOUT_MS = "RAY_agent_register_timeout_ms", "60000"
TRAIN_POLL_ENV, TRAIN_POLL_S = "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.1"  # see `connect`
__all__ = ["RayStartFailed", "SearchFailed", "SearchInterrupted", "connect", "drive", "finish",
           "hold_to_loopback"]


class RayStartFailed(RuntimeError):
    """A local Ray did not start (twice), or a cluster could not be joined: one line saying why."""


# -- Ray ---------------------------------------------------------------------------------------------

def hold_to_loopback(address: str | None) -> bool:
    """Keep a local Ray on 127.0.0.1 (call before Ray is first imported): with no cluster to join and
    the variable unset, Ray's cluster mode goes off (LOOPBACK_ENV=0), in which its node address is the
    loopback one and nothing listens on another interface. Never with `--address`: a cluster's nodes
    must reach this driver. Whether it was set here."""
    if address or LOOPBACK_ENV in os.environ:
        return False
    os.environ[LOOPBACK_ENV] = "0"
    return True


def connect(plan_cfg: Config, address: str | None, dashboard: bool) -> dict[str, float]:
    """Start a local Ray (sized for at least one trial, on loopback) or join a cluster; its resources."""
    os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")
    os.environ.setdefault("TUNE_DISABLE_STRICT_METRIC_CHECKING", "1")  # the metric is reported where read
    # with verbose=0: no Tune tables, augtune's lines instead
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    hold_to_loopback(address)  # too late if Ray is imported already: the CLI calls it first thing
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
        # It listens on loopback only (`hold_to_loopback`) and keeps token authentication (the default
        # since 2.59) on; the metrics exporter, which answers without a token, is off.
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
    start_ray(ray, kwargs, address)
    ray_logger = logging.getLogger("ray")
    ray_logger.setLevel(logging.INFO)
    for h in handlers:  # ray.init replaces the handlers: the log file's comes back
        if h not in ray_logger.handlers:
            ray_logger.addHandler(h)
    return ray.cluster_resources()


def start_ray(ray, kwargs: dict, address: str | None) -> None:
    """`ray.init(**kwargs)`; a local Ray that fails to start is tried once more with its agent given a
    minute to register (a busy machine), then RayStartFailed says why in one line."""
    def why(e: BaseException) -> str:
        lines = [line.strip() for line in str(e).splitlines() if line.strip()]
        return f"{type(e).__name__}: {lines[-1] if lines else ''}"[:300]

    try:
        ray.init(**kwargs)
        return
    except Exception as e:  # Ray raises several kinds when a process of it does not come up
        if address:
            raise RayStartFailed(f"cannot join the Ray cluster at {address} ({why(e)})") from None
        first = why(e)
    ray.shutdown()
    os.environ.setdefault(AGENT_TIMEOUT_ENV, AGENT_TIMEOUT_MS)
    try:
        ray.init(**kwargs)
    except Exception as e:
        ray.shutdown()
        raise RayStartFailed(f"Ray did not start, twice ({first}; then {why(e)})") from None


def train_env() -> dict[str, str]:
    """What Ray Train's processes get from a search: its controller takes a worker's report only when it
    polls, every health-check interval (Ray's default 2 s), and a worker's next report waits for it, so a
    DDP trial's epochs shorter than that took the whole interval each (20 digits epochs of 0.5 s: 58.7 s
    at 2 s, 33.6 s at 0.1 s; benchmarks/overhead.py). It polls every 0.1 s unless the environment says
    otherwise; a worker is still declared dead only after Train's own, longer, timeout."""
    return {TRAIN_POLL_ENV: os.environ.get(TRAIN_POLL_ENV, TRAIN_POLL_S)}


def check_local_auth() -> None:
    """A local search's Ray keeps token authentication: every local user can reach loopback."""
    mode = os.environ.get("RAY_AUTH_MODE", "token").lower()
    if mode != "token":
        raise ConfigError(f"RAY_AUTH_MODE={mode}: a local search runs Ray with token authentication (any "
                          "user of this machine can reach its loopback ports); unset it, or run `ray start` "
                          "yourself and pass --address")


# -- running ----------------------------------------------------------------------------------------------

def _fit(tuner) -> tuple[Any, dict[str, str], Any]:
    """Run a Tuner (new or restored); its results, each trial's status as Tune's last step left it
    (`StepStatuses`: a restored run brings back the callbacks it was started with, or is given one), and
    its search algorithm (the object Tune ran, restored or not)."""
    from augtune.search.callbacks import StepStatuses
    from augtune.search.adapters import run_config_of, search_algorithm_of

    config = run_config_of(tuner)
    algorithm = search_algorithm_of(tuner)
    stepped = next((c for c in config.callbacks or [] if isinstance(c, StepStatuses)), None)
    if stepped is None:
        stepped = StepStatuses()
        config.callbacks = [*(config.callbacks or []), stepped]
    for callback in config.callbacks:
        if hasattr(callback, "phases"):  # the progress line counts the repeat runs the algorithm chose
            callback.phases = algorithm
    return tuner.fit(), stepped.statuses, algorithm


def check_finished(results, experiment: str, stepped: dict[str, str], algorithm) -> None:
    """Raise SearchInterrupted when trials are left unfinished (Tune's `ResultGrid`), or were at Tune's
    last step (`stepped`: an interrupted run's clean-up marks them ended), or the search algorithm has
    trials still to make; SearchFailed when all of them failed."""
    ended = results.num_terminated + results.num_errors
    if ended < len(results) or any(s not in FINISHED for s in stepped.values()) \
            or not algorithm.is_finished():
        raise SearchInterrupted(experiment)
    if len(results) and results.num_errors == len(results):
        from augtune.search.status import error_line

        first = next((error_line(Path(r.path) / "error.txt") for r in results
                      if r.path and not is_uri(r.path)), "")
        first = first or next((str(e).strip().splitlines()[-1] for e in results.errors if str(e).strip()),
                              "see error.txt")
        raise SearchFailed(f"every trial of {experiment} failed; the first: {first}")


def finish(tuner, experiment: str) -> Any:
    """Run the Tuner of a search and its repeat (new or restored) to its end, or say why it did not end;
    its results (Tune's `ResultGrid`)."""
    from augtune.search.repeat import SearchThenRepeat
    from augtune.search.adapters import search_algorithm_of

    if not isinstance(search_algorithm_of(tuner), SearchThenRepeat):
        raise ConfigError(f"{experiment}: started by an augtune older than 0.3, whose repeat phase was a "
                          "Tune run of its own; continue it with the augtune version that started it")
    results, stepped, algorithm = _fit(tuner)
    check_finished(results, experiment, stepped, algorithm)
    return results


def drive(run: TuneRun, log: Callable[[str], None] = print, restart_errored: bool = False,
          trust: bool = False) -> None:
    """Run `run` to its end, new or restored (the same steps for search, compare and resume): lock the
    folder, start or join Ray, restore Tune's saved state when there is one (signed by this user's
    augtune, `augtune.search.trust`, unless `trust`) or start anew, finish."""
    from ray import tune

    from augtune.search.trust import TUNER_SIGNATURES, sign, verify
    from augtune.search.adapters import hold_copies_while_saving

    hold_copies_while_saving()  # each copy of Tune's state to the folder starts from signed files
    with Lock(run.experiment):  # before Ray starts: a folder in use is refused at once
        restore = tune.Tuner.can_restore(run.path)
        if restore:
            from augtune.search.loggers import only_chosen_loggers

            check_trusted(run.experiment)
            # a copy of Tune's state cut short (a full disk, a killed driver) is finished from the staging
            # copy first: bytes only, nothing unpickled; the signatures are then checked on what is there
            finish_interrupted_copy(run.path)
            if not trust:
                verify(run.path, run.experiment)  # before anything of it is unpickled
            only_chosen_loggers()  # the restored run brings back the logger callbacks it was started with
            prepare_restore(run.path)
            sign(run.path)  # what it refilled, and what `trust` vouched for
            settle_lost_records(run.path, list(run.records))  # runs Tune never saved: made again
        else:
            run.prepare()
        conc = concurrency(run.cfg, connect(run.cfg, run.address, run.dashboard))
        if restore:
            log(f"resuming {run.experiment}")
            tuner = tune.Tuner.restore(run.path, trainable=run.trainable, resume_unfinished=True,
                                       resume_errored=not restart_errored, restart_errored=restart_errored)
        else:
            tuner = run.start(conc, log)
            sign(run.path, only=["tuner.pkl"], file=TUNER_SIGNATURES)  # Tune wrote it just now
        if finish(tuner, run.experiment).num_errors == 0:  # a failed trial may still be resumed
            mark_finished(run.experiment)


