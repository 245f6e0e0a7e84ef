"""Planning a search: everything that can be wrong with the input is found here, before Ray starts or
anything is written — the config and its names, the space (every point and one sample make valid
configs), the metric (some trial reports it), the data, the paths (made absolute: trials run in
folders of their own), the storage, the name and the resources.

The plan also fixes what every trial starts from (`base`): the search metric evaluated where the
scheduler reads it (ASHA's rung epochs and the last one), the reference rows cached beside the
experiments, a trial's checkpoints by wall time.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Collection, Optional

from augtune.checks import check_against_data, check_config
from augtune.config import Config, ConfigError, dotted_keys, from_dict, load_config, set_values, to_dict
from augtune.records import LOWER_IS_BETTER, SEARCH_FILE, read_search_file
from augtune.search.experiment import check_name, data_subject, default_name
from augtune.search.experiment import check_name_free as name_is_free
from augtune.search.loggers import check_loggers
from augtune.search.schedulers import scheduling
from augtune.storage import StorageError, filesystem, is_uri, read_text, split

DRIVER_CPU = 0.01  # a DDP trial's Tune function only waits on its workers
ALWAYS_REPORTED = ("loss", "epoch_time_s", "samples_per_s", "epoch")
REFERENCE_CACHE = ".augtune/references"  # under the storage folder: `raw` and `random-init`, computed once


@dataclass(frozen=True)
class SearchPlan:
    cfg: Config  # the user's resolved config
    base: dict  # what every trial starts from (see `trial_base`)
    storage: str  # absolute folder or URI
    name: str
    address: Optional[str] = None
    dashboard: bool = False
    modality: Optional[str] = None  # the data's (image, vector): what the space may sample depends on it
    rows: str = ""  # how many rows are labelled and unlabelled (`describe_rows`), when the data was loaded

    @property
    def experiment(self) -> str:
        return f"{self.storage.rstrip('/')}/{self.name}"

    @property
    def plans(self) -> tuple:
        """A search is a compare of one entrant, itself (`ComparePlan.plans`; `tune_run.tune_run`)."""
        return (self,)


def reported_metrics(cfg: Config) -> set[str]:
    from augtune.eval import OUTPUTS

    out = set(ALWAYS_REPORTED)
    for family in (*cfg.eval.metrics, *cfg.eval.epoch_metrics):
        out |= set(OUTPUTS[family])
    return out


def rung_epochs(cfg: Config) -> tuple[int, ...]:
    """The epochs at which the scheduler compares trials (`augtune.search.schedulers`): ASHA's
    grace_period * reduction_factor^k below train.epochs; PBT's every `search.pbt.interval` epochs."""
    return scheduling(cfg).rung_epochs(cfg)


def trial_base(cfg: Config, storage: str) -> dict:
    """The config every trial starts from. The search metric is evaluated where someone reads it:
    the scheduler's rungs and the last epoch (no scheduler: the last epoch only), plus the epochs of the
    user's own `eval.every` when it is set; `raw` and `random-init` are cached beside the experiments."""
    from augtune.eval import OUTPUTS

    family = next((f for f, names in OUTPUTS.items() if cfg.search.metric in names), None)
    ev, train = cfg.eval, cfg.train
    own = scheduling(cfg)
    if own.checkpoint_every(cfg) is not None:  # PBT's: a checkpoint where it may copy the trial
        train = replace(train, checkpoint_every=own.checkpoint_every(cfg))
    # the knobs the scheduler changes during a trial, recorded per epoch (a PBT trial's lineage)
    train = replace(train, track=tuple(dict.fromkeys((*train.track, *own.tracked(cfg)))))
    if family is not None and family not in ev.epoch_metrics:
        ev = replace(ev, epoch_metrics=(*ev.epoch_metrics, family))
    ev = replace(ev, at=tuple(sorted(set(ev.at) | set(rung_epochs(cfg)))),
                 every=0 if ev.every is None else ev.every)
    if ev.reference_cache is None and not is_uri(storage):
        ev = replace(ev, reference_cache=str(Path(storage) / REFERENCE_CACHE))
    return to_dict(replace(cfg, eval=ev, train=train))


def check_metric(cfg: Config) -> None:
    reported = reported_metrics(cfg)
    if cfg.search.metric not in reported:
        raise ConfigError(f"search.metric: no trial reports {cfg.search.metric!r} with these eval.metrics "
                          f"(reported: {', '.join(sorted(reported))})")
    if cfg.search.metric in LOWER_IS_BETTER and cfg.search.mode == "max":
        raise ConfigError(f"search.mode: max would choose the worst {cfg.search.metric} (lower is better): "
                          f"set search.mode: min")


SAMPLES_CHECKED = 16  # seeded samples of a space checked at planning, beside its points


def fit_size(data, val_fraction: float = 0.0) -> int:
    """The samples a method trains on: the training split, less the validation split `val_fraction` of it
    that a search's trials hold out (scikit-learn's rounding), and any unlabelled rows (STL-10's)."""
    n = len(data.y_train)
    return n - math.ceil(n * val_fraction) + (0 if data.x_unlabeled is None else len(data.x_unlabeled))


def selecting(cfg: Config) -> Config:
    """`cfg` as a search's trials run it: scored on the validation split when `dataset.val_fraction`
    carves one, so that choosing a configuration never reads the test split (its repeat runs are scored
    on the test split: `trainables.ray_trainable.repeat_params`)."""
    on = "val" if cfg.dataset.val_fraction > 0 else "test"
    return replace(cfg, dataset=replace(cfg.dataset, evaluate_on=on))


def check_trials(base: dict, space, figure_kinds: Optional[Collection[str]] = None,
                 modality: Optional[str] = None, n_train: Optional[int] = None) -> None:
    """Every point to evaluate, SAMPLES_CHECKED seeded samples of the space and every key's domain edges
    (`searchers.edges`, each in the first sample) give a valid config (names included), for data of
    `modality` and `n_train` training samples when known: a value only a sample can draw is found here,
    not inside a trial, and a domain reaching past a key's bounds is refused even where no sample lands."""
    from augtune.methods import check_modality
    from augtune.search.searchers import edges, sample_values

    first = sample_values(space, 0)
    candidates = [*(("point", i + 1, p) for i, p in enumerate(space.points_to_evaluate)),
                  *(("sample", i + 1, sample_values(space, i)) for i in range(SAMPLES_CHECKED)),
                  *((f"{key} = {v!r}, {which}", None, {**first, key: v}) for key, v, which in edges(space))]
    for what, i, values in candidates:
        what = what if i is None else f"{what} {i}"
        try:
            cfg = check_config(from_dict(set_values(base, values)), figure_kinds)
            if modality is not None:
                check_modality(cfg, modality)
            if n_train is not None and cfg.train.batch_size > n_train:  # the loop would refuse it
                held = (f" left after dataset.val_fraction's validation split "
                        f"({cfg.dataset.val_fraction:g})" if cfg.dataset.evaluate_on == "val" else "")
                raise ConfigError(f"train.batch_size: {cfg.train.batch_size} is larger than the training "
                                  f"set ({n_train} samples{held})")
        except ConfigError as e:
            raise ConfigError(f"search.space ({what}): {e}") from None
        if cfg.search.metric not in reported_metrics(cfg):
            raise ConfigError(f"search.metric: {what} of the space reports no {cfg.search.metric!r}")


def absolute_paths(cfg: Config) -> Config:
    """`dataset.path` and `dataset.root` as absolute paths: a trial runs in its own folder, where a
    relative path would name nothing."""
    d = cfg.dataset
    fixed = {k: str(Path(v).expanduser().resolve()) for k, v in (("path", d.path), ("root", d.root))
             if v and not is_uri(v)}
    return replace(cfg, dataset=replace(d, **fixed)) if fixed else cfg


def resolve_storage(storage: str | None) -> str:
    """An absolute folder (Ray needs one) or a URI Ray's pyarrow filesystem understands."""
    if storage and is_uri(storage):
        try:
            filesystem(storage)  # credentials and endpoints: from the environment, which Ray's processes read
        except StorageError as e:
            raise ConfigError(f"--storage: cannot use {e}") from None
        return storage.rstrip("/")
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
    """What the Tune function of a trial holds itself (a DDP trial's workers hold the rest)."""
    from augtune.trainables.ray_trainable import runs_in_process

    return {"cpu": cfg.resources.cpus_per_worker if runs_in_process(cfg) else DRIVER_CPU}


def trial_needs(cfg: Config) -> dict[str, float]:
    """Everything one trial holds while it runs: its own share plus its Train workers'."""
    from augtune.trainables.ray_trainable import runs_in_process

    r = cfg.resources
    if runs_in_process(cfg):
        return {"CPU": r.cpus_per_worker}
    need = {"CPU": DRIVER_CPU + r.num_workers * r.cpus_per_worker}
    if r.use_gpu:
        need["GPU"] = r.num_workers * (r.gpus_per_worker or 1.0)
    return need


def concurrency(cfg: Config, cluster: dict[str, float]) -> int:
    need = trial_needs(cfg)
    fits = min(math.floor(cluster.get(k, 0.0) / v + 1e-9) for k, v in need.items() if v > 0)
    if fits < 1:
        have = ", ".join(f"{k} {cluster.get(k, 0):g}" for k in need)
        raise ConfigError(f"resources: one trial needs {', '.join(f'{k} {v:g}' for k, v in need.items())}; "
                          f"the cluster has {have}")
    return min(fits, cfg.search.max_concurrent or fits)


def plan_search(config: str | Path, overrides: list[str], *, storage: str | None = None,
                name: str | None = None, address: str | None = None, dashboard: bool = False,
                figure_kinds: Optional[Collection[str]] = None) -> SearchPlan:
    """Validate everything about a search without starting Ray or writing a file (`figure_kinds`: the
    plots' registry, which `eval.figures` is checked against)."""
    cfg = check_config(load_config(config, overrides), figure_kinds)
    label = cfg.search.space if isinstance(cfg.search.space, str) else "search"
    storage = resolve_storage(storage)
    name = name or default_name(label, data_subject(cfg), storage)
    return plan_config(cfg, storage=storage, name=name, address=address, dashboard=dashboard,
                       figure_kinds=figure_kinds)


def plan_config(cfg: Config, *, storage: str, name: str, address: str | None = None, dashboard: bool = False,
                figure_kinds: Optional[Collection[str]] = None, check_name_free: bool = True,
                check_data: bool = True, modality: Optional[str] = None,
                n_train: Optional[int] = None) -> SearchPlan:
    """`plan_search` for a resolved config and an absolute storage (compare plans its entrants here, with
    the `modality` of the data it loaded once; a search loads its data here to learn it)."""
    from augtune.data import DataError, load_dataset
    from augtune.search.searchers import check_algorithm
    from augtune.spaces import resolve_space

    cfg = selecting(absolute_paths(cfg))
    if cfg.search.space is None:
        raise ConfigError("search.space: a search needs a space: a registered name (simclr, byol, moco, "
                          "simsiam, ...) or an inline mapping {dotted key: domain}")
    check_metric(cfg)
    check_loggers(cfg)  # a logger's missing package, before Ray starts
    per = cfg.search.repeat_best.per
    if per is not None and per not in dotted_keys():
        raise ConfigError(f"search.repeat_best.per: {per!r} is not a config key")
    rows = ""
    if check_data:
        try:
            data = load_dataset(cfg.dataset)
        except DataError as e:
            raise ConfigError(str(e)) from None
        modality, n_train = data.modality, fit_size(data)
        check_against_data(cfg, data)  # knn_k below the samples; the networks within memory
        from augtune.data.datasets import describe_rows

        rows = describe_rows(data)
    space = resolve_space(cfg.search, modality)
    check_algorithm(cfg.search, space)
    cfg = scheduling(cfg).check(cfg, space, to_dict(cfg))  # e.g. search.pbt.mutate resolved and checked
    base = trial_base(cfg, storage)
    check_trials(base, space, figure_kinds, modality, n_train)
    if not address and cfg.resources.use_gpu:
        import torch

        if not torch.cuda.is_available():
            raise ConfigError(
                "resources.use_gpu: true, but this machine has no GPU (use --address for a cluster)"
            )
    plan = SearchPlan(cfg, base, storage, check_name(name), address, dashboard, modality, rows)
    if check_name_free:
        name_is_free(plan.experiment)
    return plan


def load_plan(exp_dir: str, address: str | None = None, dashboard: bool = False) -> SearchPlan:
    """The plan an experiment folder (or URI: s3://...) was started with (`augtune resume`), read without
    unpickling; a logger whose package is missing here is refused before Ray starts."""
    try:
        storage, name = split(exp_dir)
        data = _read_search_file(exp_dir)
        cfg = from_dict(data["config"])
    except (ValueError, KeyError, TypeError) as e:  # StorageError is a ValueError
        raise ConfigError(str(e).splitlines()[0]) from None
    check_loggers(cfg)
    modality = data.get("modality") if data.get("modality") in ("image", "vector") else None
    return SearchPlan(cfg, data["base"], storage, name, address, dashboard, modality)


def _read_search_file(location: str) -> dict:
    """`records.read_search_file` of a local folder, or of a URI (its messages name the URI)."""
    if not is_uri(location):
        return read_search_file(Path(location).expanduser().resolve())
    text = read_text(location, SEARCH_FILE)
    if text is None:
        raise ValueError(f"{location}: not an augtune search folder (no {SEARCH_FILE})")
    return read_search_file(location, text)


def trials_of(plan: SearchPlan) -> int:
    """How many search trials `plan` runs: `num_samples`, times the grid's size for a grid (or a random
    search's grid entries), as Tune counts them."""
    from augtune.search.searchers import grid_params
    from augtune.spaces import resolve_space
    from augtune.spaces.grammar import is_grid

    s = plan.cfg.search
    space = resolve_space(s, plan.modality)
    if s.algorithm == "optuna" or space.define_by_run is not None:
        return s.num_samples
    params = grid_params(space) if s.algorithm == "grid" else space.params
    size = math.prod(len(v["grid_search"]) for v in params.values() if is_grid(v))
    return s.num_samples * size


def describe(plan: SearchPlan, repeat_runs: Optional[int] = None) -> list[str]:
    """What `plan` would run, a line each (`augtune search --plan`): its space, algorithm, scheduler,
    trials, epochs, resources and repeat. `repeat_runs`: the repeat's runs, when decided elsewhere (a
    compare's)."""
    from augtune.spaces import resolve_space, searched

    cfg, s = plan.cfg, plan.cfg.search
    space = resolve_space(s, plan.modality)
    keys = sorted(searched(space)) if space.define_by_run is None else ["(define-by-run)"]
    trials, rb = trials_of(plan), s.repeat_best
    sched = scheduling(cfg).describe(cfg)
    repeats = repeat_runs if repeat_runs is not None else rb.top * len(rb.seeds)
    need = ", ".join(f"{k} {v:g}" for k, v in trial_needs(cfg).items())
    label = "+".join((cfg.method.base, *cfg.method.augment))
    return [
        f"{plan.name}: {label} on {cfg.dataset.name}"
        + (f" ({plan.modality})" if plan.modality else ""),
        f"  space: {space.name} ({len(keys)} searched: {', '.join(keys) or 'none'})",
        f"  algorithm: {s.algorithm}, {trials} trial(s), optimising {s.metric} ({s.mode}); "
        f"scheduler: {sched}",
        f"  each trial: {cfg.train.epochs} epochs, needs {need}",
        ("  scored on a validation split (dataset.val_fraction "
         f"{cfg.dataset.val_fraction:g} of the training split); the repeat on the test split"
         if cfg.dataset.evaluate_on == "val" else
         "  scored on the test split (dataset.val_fraction: 0): selection reads the split it is judged on"),
        f"  repeat: {repeats} run(s)" + (f" (best {rb.top}" + (f" of each {rb.per}" if rb.per else "")
                                        + f" on seeds {list(rb.seeds)})" if repeat_runs is None and
                                        rb.top else ""),
        f"  at most {(trials + repeats) * cfg.train.epochs} epochs in {trials + repeats} run(s)",
    ]
