"""The one driver of `augtune search`, `augtune compare` and `augtune resume`: Ray, then start or resume.

An experiment is one Tune run (`augtune.search.tune_run.TuneRun`, built there): a search's trials and the
repeat of its best, or every entrant's search of a compare and the repeat of each entrant's best. `drive`
runs it, new or resumed, through the same steps: the folder's lock, Ray, a new Tuner (a resumed one
continuing from the trials' records: `augtune.search.resume`; nothing of Tune's saved state is read), and
`finish`. The plan (`augtune.search.plan`) has checked everything before this module starts Ray. Here:

- a local Ray listens on loopback only (`hold_to_loopback`) and runs with Ray's token authentication (a
  local search refuses RAY_AUTH_MODE=disabled), its dashboard and metrics exporter off unless asked;
  failing to start, it is tried once more, then `RayStartFailed` says why in one line;
- a run whose every trial ended well is marked finished (`experiment.mark_finished`);
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

import logging
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from augtune.config import Config, ConfigError
from augtune.search.experiment import Lock, SearchFailed, SearchInterrupted, mark_finished
from augtune.search.plan import concurrency, trial_needs
from augtune.search.resume import complete_logs
from augtune.storage import is_uri

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
__all__ = ["RayStartFailed", "SearchFailed", "SearchInterrupted", "connect", "drive", "hold_to_loopback"]


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
        check_local_auth()
        kwargs["address"] = "local"
        kwargs["num_cpus"] = max(os.cpu_count() or 1, math.ceil(trial_needs(plan_cfg)["CPU"]))
        if not dashboard:
            kwargs["_system_config"] = {"enable_metrics_collection": False}
        os.environ.setdefault("RAY_ENABLE_RECORD_ACTOR_TASK_LOGGING", "0")
        # no idle workers started ahead for the driver: a trial is an actor, which takes a process of its
        # own (a one-trial search: two fewer processes, a CPU second less; benchmarks/search_overhead.py)
        os.environ.setdefault("RAY_prestart_worker_first_driver", "0")
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
    DDP trial's epochs shorter than that took the whole interval each (results page, "What a Ray trial
    costs"). It polls every 0.1 s unless the environment says otherwise; a worker is still declared dead
    only after Train's own, longer, timeout."""
    return {TRAIN_POLL_ENV: os.environ.get(TRAIN_POLL_ENV, TRAIN_POLL_S)}


def check_local_auth() -> None:
    """A local search's Ray keeps token authentication: every local user can reach loopback."""
    mode = os.environ.get("RAY_AUTH_MODE", "token").lower()
    if mode != "token":
        raise ConfigError(f"RAY_AUTH_MODE={mode}: a local search runs Ray with token authentication (any "
                          "user of this machine can reach its loopback ports); unset it, or run `ray start` "
                          "yourself and pass --address")


# -- running ----------------------------------------------------------------------------------------------

def check_finished(results, experiment: str, stepped: dict[str, str], algorithm,
                   ended_before: int = 0) -> None:
    """Raise SearchInterrupted when trials are left unfinished (Tune's `ResultGrid`), or were at Tune's
    last step (`stepped`: an interrupted run's clean-up marks them ended), or the search algorithm has
    trials still to make; SearchFailed when all of them failed and no trial a resume continued from had
    ended well (`ended_before`)."""
    ended = results.num_terminated + results.num_errors
    if ended < len(results) or any(s not in FINISHED for s in stepped.values()) \
            or not algorithm.is_finished():
        raise SearchInterrupted(experiment)
    if len(results) and results.num_errors == len(results) and not ended_before:
        from augtune.search.callbacks import error_line

        first = next((error_line(Path(r.path) / "error.txt") for r in results
                      if r.path and not is_uri(r.path)), "")
        first = first or next((str(e).strip().splitlines()[-1] for e in results.errors if str(e).strip()),
                              "see error.txt")
        raise SearchFailed(f"every trial of {experiment} failed; the first: {first}")


def drive(run: TuneRun, log: Callable[[str], None] = print, restart_errored: bool = False) -> None:
    """Run `run` to its end, new or resumed (the same steps for search, compare and resume): lock the
    folder, read the records a resume continues from, start or join Ray, run a new Tuner, and mark the
    experiment finished when every trial ended well."""
    with Lock(run.experiment):  # before Ray starts: a folder in use is refused at once
        records = run.read() if run.resuming else None
        if records is None:
            run.prepare()
        else:
            complete_logs(run.path, records.trials())
        conc = concurrency(run.cfg, connect(run.cfg, run.address, run.dashboard))
        if records is not None:
            left = sum(not h.ended for h in records.trials())
            log(f"resuming {run.experiment}: {len(records.trials()) - left} run(s) ended, {left} to continue")
        tuner, algorithm, stepped = run.start(conc, log, records, restart_errored)
        results = tuner.fit()
        ended = sum(h.ended for h in records.trials()) if records is not None else 0
        check_finished(results, run.experiment, stepped.statuses, algorithm, ended)
        if results.num_errors == 0:  # a failed trial may still be resumed
            mark_finished(run.experiment)
