"""`augtune search` and `augtune resume`: Ray Tune + Optuna over augtune trials.

Everything that can be wrong with the input is found by :func:`plan_search` before Ray starts or
anything is written: the config, the space (every point and one sample must make a valid config),
the metric (some trial must report it), the data, the storage and the resources.

Resources: a trial with one CPU worker runs the loop inside the Tune trial and takes
``resources.cpus_per_worker`` CPUs. A DDP trial is a driver taking 0.01 CPU plus
``num_workers x cpus_per_worker`` CPUs (and GPUs) for its Ray Train workers. A local Ray gets
``max(cores, one trial's CPUs rounded up)`` logical CPUs, so a two-worker trial also runs on a
two-core laptop; concurrency is how many trials the cluster's resources hold at once (capped by
``search.max_concurrent``).
"""
from __future__ import annotations

import datetime as _dt
import math
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Optional

import yaml

from augtune.config import Config, ConfigError, check_names, from_dict, key_applies, load_config, set_values, to_dict

SEARCH_FILE = "augtune_search.yaml"  # in the experiment folder: what `augtune resume` needs
REPEAT_DIR = "repeat_best"  # the repeat-best experiment, nested in the search's folder
DRIVER_CPU = 0.01  # a DDP trial's Tune function only waits on its workers
ALWAYS_REPORTED = ("loss", "epoch_time_s", "samples_per_s", "epoch")


@dataclass(frozen=True)
class SearchPlan:
    cfg: Config  # the user's resolved config
    base: dict  # what every trial starts from (the search metric evaluated every epoch)
    storage: str  # absolute folder or URI
    name: str
    address: Optional[str] = None
    dashboard: bool = False

    @property
    def experiment(self) -> str:
        return f"{self.storage.rstrip('/')}/{self.name}"


# -- validation, before Ray -------------------------------------------------------------------------

def reported_metrics(cfg: Config) -> set[str]:
    from augtune.eval import OUTPUTS

    out = set(ALWAYS_REPORTED)
    for family in (*cfg.eval.metrics, *cfg.eval.epoch_metrics):
        out |= set(OUTPUTS[family])
    return out


def trial_base(cfg: Config) -> dict:
    """The config every trial starts from: the search metric is evaluated every epoch, so that
    schedulers (ASHA) and Tune's result checks see it in every report."""
    from augtune.eval import OUTPUTS

    family = next((f for f, names in OUTPUTS.items() if cfg.search.metric in names), None)
    ev = cfg.eval
    if family is not None:
        epoch_metrics = ev.epoch_metrics if family in ev.epoch_metrics else (*ev.epoch_metrics, family)
        ev = replace(ev, every=1, epoch_metrics=epoch_metrics)
    return to_dict(replace(cfg, eval=ev))


def check_metric(cfg: Config) -> None:
    reported = reported_metrics(cfg)
    if cfg.search.metric not in reported:
        raise ConfigError(f"search.metric: no trial reports {cfg.search.metric!r} with these eval.metrics "
                          f"(reported: {', '.join(sorted(reported))})")


def check_trials(base: dict, space) -> None:
    """Every point to evaluate and one sample of the space give a valid config (names included)."""
    from augtune.spaces import sample_values

    candidates = [*(("point", i + 1, p) for i, p in enumerate(space.points_to_evaluate)),
                  ("sample", 1, sample_values(space, 0))]
    for what, i, values in candidates:
        try:
            cfg = from_dict(set_values(base, values))
            check_names(cfg)
        except ConfigError as e:
            raise ConfigError(f"search.space ({what} {i}): {e}") from None
        if cfg.search.metric not in reported_metrics(cfg):
            raise ConfigError(f"search.metric: {what} {i} of the space reports no {cfg.search.metric!r}")


def resolve_storage(storage: str | None) -> str:
    """An absolute folder (Ray needs one) or a URI Ray's pyarrow filesystem understands."""
    if storage and "://" in storage:
        import pyarrow.fs

        try:
            pyarrow.fs.FileSystem.from_uri(storage)
        except Exception as e:  # pyarrow raises several types; the message is what matters
            raise ConfigError(f"--storage: cannot use {storage}: {str(e).splitlines()[0]}") from None
        return storage
    path = Path(storage or "results").expanduser().resolve()
    existing = path
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigError(f"--storage: {existing} is a file, not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"--storage: {existing} is not writable")
    return str(path)


def trial_resources(cfg: Config) -> dict[str, float]:
    r = cfg.resources
    if r.num_workers == 1 and not r.use_gpu:
        return {"cpu": r.cpus_per_worker}
    return {"cpu": DRIVER_CPU}


def trial_needs(cfg: Config) -> dict[str, float]:
    """Everything one trial holds while it runs: its own share plus its Train workers'."""
    r = cfg.resources
    if r.num_workers == 1 and not r.use_gpu:
        return {"CPU": r.cpus_per_worker}
    need = {"CPU": DRIVER_CPU + r.num_workers * r.cpus_per_worker}
    if r.use_gpu:
        need["GPU"] = r.num_workers * (r.gpus_per_worker or 1.0)
    return need


def plan_search(config: str | Path, overrides: list[str], *, storage: str | None = None,
                name: str | None = None, address: str | None = None, dashboard: bool = False) -> SearchPlan:
    """Validate everything about a search without starting Ray or writing a file."""
    from augtune.data import DataError, load_dataset
    from augtune.spaces import resolve_space

    cfg = load_config(config, overrides)
    if cfg.search.space is None:
        raise ConfigError("search.space: a search needs a space: a registered name (simclr, byol, moco, "
                          "simsiam) or an inline mapping {dotted key: domain}")
    check_metric(cfg)
    per = cfg.search.repeat_best.per
    if per is not None:
        from augtune.config import dotted_keys

        if per not in dotted_keys():
            raise ConfigError(f"search.repeat_best.per: {per!r} is not a config key")
    space = resolve_space(cfg.search)
    base = trial_base(cfg)
    check_trials(base, space)
    try:
        load_dataset(cfg.dataset)
    except DataError as e:
        raise ConfigError(str(e)) from None
    if not address and cfg.resources.use_gpu:
        import torch

        if not torch.cuda.is_available():
            raise ConfigError("resources.use_gpu: true, but this machine has no GPU (use --address for a cluster)")
    storage = resolve_storage(storage)
    label = cfg.search.space if isinstance(cfg.search.space, str) else "inline"
    name = name or f"{label}-{cfg.dataset.name}-{_dt.datetime.now():%Y%m%d-%H%M%S}"
    if "/" in name or not name.strip():
        raise ConfigError(f"--name: {name!r} must be a plain folder name")
    plan = SearchPlan(cfg, base, storage, name, address, dashboard)
    if "://" not in storage and Path(plan.experiment).exists():
        raise ConfigError(f"--name: {plan.experiment} already exists; continue it with `augtune resume "
                          f"{plan.experiment}` or choose another name")
    return plan


# -- Ray ---------------------------------------------------------------------------------------------

def connect(plan_cfg: Config, address: str | None, dashboard: bool) -> dict[str, float]:
    """Start a local Ray (sized for at least one trial) or join a cluster; return its resources."""
    os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")
    import ray

    if ray.is_initialized():
        return ray.cluster_resources()
    kwargs: dict[str, Any] = {"include_dashboard": dashboard, "log_to_driver": True}
    if address:
        kwargs["address"] = address
        # Nodes that do not have augtune installed get this checkout's package.
        kwargs["runtime_env"] = {"py_modules": [str(Path(__file__).resolve().parents[1])]}
    else:
        # "local": a Ray of its own, never one that ray.init() would otherwise find on this machine
        # (another search's, or the one /tmp/ray/ray_current_cluster names); RAY_ADDRESS still wins.
        kwargs["address"] = "local"
        kwargs["num_cpus"] = max(os.cpu_count() or 1, math.ceil(trial_needs(plan_cfg)["CPU"]))
    ray.init(**kwargs)
    return ray.cluster_resources()


def concurrency(cfg: Config, cluster: dict[str, float]) -> int:
    need = trial_needs(cfg)
    fits = min(math.floor(cluster.get(k, 0.0) / v + 1e-9) for k, v in need.items() if v > 0)
    if fits < 1:
        have = ", ".join(f"{k} {cluster.get(k, 0):g}" for k in need)
        raise ConfigError(f"resources: one trial needs {', '.join(f'{k} {v:g}' for k, v in need.items())}; "
                          f"the cluster has {have}")
    return min(fits, cfg.search.max_concurrent or fits)


def _trainable(base: dict, cfg: Config):
    from ray import tune

    from augtune.trainables.ray_trainable import tune_trial

    return tune.with_resources(tune.with_parameters(tune_trial, base=base), trial_resources(cfg))


def _searcher(cfg: Config):
    """(search algorithm, param_space) for `search.algorithm` (see augtune.spaces for the rules)."""
    from ray.tune.search.basic_variant import BasicVariantGenerator

    from augtune.spaces import constants, grid_params, resolve_space, to_optuna_search_kwargs

    s = cfg.search
    space = resolve_space(s)
    if s.algorithm == "grid":
        return BasicVariantGenerator(), grid_params(space)
    if s.algorithm == "random" and space.define_by_run is None:
        return BasicVariantGenerator(points_to_evaluate=space.points_to_evaluate or None,
                                     random_state=s.seed), dict(space.params)
    import optuna
    from ray.tune.search.optuna import OptunaSearch

    sampler = (optuna.samplers.TPESampler(seed=s.seed) if s.algorithm == "optuna"
               else optuna.samplers.RandomSampler(seed=s.seed))
    return OptunaSearch(**to_optuna_search_kwargs(space), metric=s.metric, mode=s.mode, sampler=sampler), \
        constants(space)


def _scheduler(cfg: Config):
    if cfg.search.scheduler == "asha":
        from ray.tune.schedulers import ASHAScheduler

        # `epoch` rather than Tune's training_iteration: that one restarts after a restore.
        return ASHAScheduler(time_attr="epoch", max_t=cfg.train.epochs, grace_period=cfg.search.grace_period,
                             reduction_factor=cfg.search.reduction_factor)
    return None


def _run_config(cfg: Config, name: str, storage: str):
    from ray import tune

    from augtune.search.callbacks import SettleRecords

    return tune.RunConfig(
        name=name, storage_path=storage,
        failure_config=tune.FailureConfig(max_failures=cfg.search.max_failures),
        checkpoint_config=tune.CheckpointConfig(num_to_keep=2),
        callbacks=[SettleRecords()],
    )


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


def load_plan(exp_dir: str, address: str | None = None, dashboard: bool = False) -> SearchPlan:
    path = Path(exp_dir).expanduser().resolve()
    file = path / SEARCH_FILE
    if not file.is_file():
        raise ConfigError(f"{path}: not an augtune search folder (no {SEARCH_FILE})")
    data = yaml.safe_load(file.read_text())
    return SearchPlan(from_dict(data["config"]), data["base"], str(path.parent), path.name, address, dashboard)


def run_search(plan: SearchPlan, log: Callable[[str], None] = print) -> None:
    """Launch the search and, when asked, the repeat of its best configurations."""
    from ray import tune

    cluster = connect(plan.cfg, plan.address, plan.dashboard)
    conc = concurrency(plan.cfg, cluster)
    _save_plan(plan)
    cfg = plan.cfg
    search_alg, param_space = _searcher(cfg)
    log(f"search {plan.experiment}: {cfg.search.algorithm}, {cfg.search.num_samples} samples, "
        f"{conc} trial(s) at a time, optimising {cfg.search.metric} ({cfg.search.mode})")
    tuner = tune.Tuner(
        _trainable(plan.base, cfg),
        param_space=param_space,
        tune_config=tune.TuneConfig(metric=cfg.search.metric, mode=cfg.search.mode, search_alg=search_alg,
                                    scheduler=_scheduler(cfg), num_samples=cfg.search.num_samples,
                                    max_concurrent_trials=conc),
        run_config=_run_config(cfg, plan.name, plan.storage),
    )
    results = tuner.fit()
    repeat_best(plan, results, conc, log)


def resume_search(plan: SearchPlan, restart_errored: bool = False, log: Callable[[str], None] = print) -> None:
    from ray import tune

    cluster = connect(plan.cfg, plan.address, plan.dashboard)
    conc = concurrency(plan.cfg, cluster)
    trainable = _trainable(plan.base, plan.cfg)
    log(f"resuming {plan.experiment}")
    tuner = tune.Tuner.restore(plan.experiment, trainable=trainable, resume_unfinished=True,
                               resume_errored=not restart_errored, restart_errored=restart_errored)
    results = tuner.fit()
    repeat_best(plan, results, conc, log, restart_errored=restart_errored)


def best_configs(results, cfg: Config) -> list[dict]:
    """The `repeat_best.top` best distinct parameter sets of finished trials (of each value of
    `repeat_best.per`, when given: the best learning rate of every method, say)."""
    rb = cfg.search.repeat_best
    scored = [r for r in results if r.error is None and r.metrics and cfg.search.metric in r.metrics]
    scored.sort(key=lambda r: r.metrics[cfg.search.metric], reverse=cfg.search.mode == "max")
    out: list[dict] = []
    taken: dict[Any, int] = {}
    seen: list[dict] = []
    for r in scored:
        params = {k: v for k, v in r.config.items() if k != "train.seed"}
        group = repr(params.get(rb.per)) if rb.per else None
        # Two sets that differ only in keys the run never reads (`pinda.mu` of a CLAE run) are one
        # configuration: repeat it once.
        base = params.get("method.base", cfg.method.base)
        label = "+".join([base, *params.get("method.augment", cfg.method.augment)])
        read = {k: v for k, v in params.items() if key_applies(k, label)}
        if read in seen or taken.get(group, 0) == rb.top:
            continue
        seen.append(read)
        out.append(params)
        taken[group] = taken.get(group, 0) + 1
    return out


def repeat_best(plan: SearchPlan, results, conc: int, log: Callable[[str], None],
                restart_errored: bool = False) -> None:
    """Re-run the best configurations once per seed (a nested experiment, `repeat_best/`)."""
    from ray import tune

    rb = plan.cfg.search.repeat_best
    if rb.top == 0:
        return
    storage = plan.experiment
    trainable = _trainable(plan.base, plan.cfg)
    if "://" not in storage and (Path(storage) / REPEAT_DIR).exists():
        tuner = tune.Tuner.restore(f"{storage}/{REPEAT_DIR}", trainable=trainable, resume_unfinished=True,
                                   resume_errored=not restart_errored, restart_errored=restart_errored)
    else:
        best = best_configs(results, plan.cfg)
        if not best:
            log("repeat_best: no finished trial to repeat")
            return
        runs = [{**params, "train.seed": seed} for params in best for seed in rb.seeds]
        log(f"repeat_best: {len(best)} configuration(s) x {len(rb.seeds)} seeds")
        tuner = tune.Tuner(trainable, param_space={"_repeat": tune.grid_search(runs)},
                           tune_config=tune.TuneConfig(max_concurrent_trials=conc),
                           run_config=_run_config(plan.cfg, REPEAT_DIR, storage))
    tuner.fit()
