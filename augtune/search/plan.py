"""Planning a search: everything that can be wrong with the input is found here, before Ray starts or
anything is written — the config and its names, the space (every point and one sample make valid
configs), the metric (some trial reports it), the data, the paths (made absolute: trials run in
folders of their own), the storage, the name and the resources.

The plan also fixes what every trial starts from (`base`): the search metric evaluated where the
scheduler reads it (ASHA's rung epochs and the last one), the reference rows cached beside the
experiments, a trial's checkpoints by wall time.
"""
from __future__ import annotations

import datetime as _dt
import math
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Collection, Optional

from augtune.checks import check_config
from augtune.config import Config, ConfigError, from_dict, load_config, set_values, to_dict
from augtune.records import read_search_file

DRIVER_CPU = 0.01  # a DDP trial's Tune function only waits on its workers
ALWAYS_REPORTED = ("loss", "epoch_time_s", "samples_per_s", "epoch")
REFERENCE_CACHE = ".augtune/references"  # under the storage folder: `raw` and `random-init`, computed once
MAX_NAME = 200  # bytes of an experiment name (a folder name; 255 is the usual file-system limit)


@dataclass(frozen=True)
class SearchPlan:
    cfg: Config  # the user's resolved config
    base: dict  # what every trial starts from (see `trial_base`)
    storage: str  # absolute folder or URI
    name: str
    address: Optional[str] = None
    dashboard: bool = False

    @property
    def experiment(self) -> str:
        return f"{self.storage.rstrip('/')}/{self.name}"


def reported_metrics(cfg: Config) -> set[str]:
    from augtune.eval import OUTPUTS

    out = set(ALWAYS_REPORTED)
    for family in (*cfg.eval.metrics, *cfg.eval.epoch_metrics):
        out |= set(OUTPUTS[family])
    return out


def rung_epochs(cfg: Config) -> tuple[int, ...]:
    """The epochs at which ASHA compares trials: grace_period * reduction_factor^k below train.epochs."""
    s, epochs = cfg.search, cfg.train.epochs
    if s.scheduler != "asha":
        return ()
    out, r = [], float(s.grace_period)
    while r < epochs and len(out) < 64:
        out.append(math.ceil(r - 1e-9))  # ASHA takes the first result at or past a milestone
        r *= s.reduction_factor
    return tuple(sorted(set(out)))


def trial_base(cfg: Config, storage: str) -> dict:
    """The config every trial starts from. The search metric is evaluated where someone reads it:
    the scheduler's rungs and the last epoch (no scheduler: the last epoch only), plus the epochs of the
    user's own `eval.every` when it is set; `raw` and `random-init` are cached beside the experiments."""
    from augtune.eval import OUTPUTS

    family = next((f for f, names in OUTPUTS.items() if cfg.search.metric in names), None)
    ev = cfg.eval
    if family is not None and family not in ev.epoch_metrics:
        ev = replace(ev, epoch_metrics=(*ev.epoch_metrics, family))
    ev = replace(ev, at=tuple(sorted(set(ev.at) | set(rung_epochs(cfg)))),
                 every=0 if ev.every is None else ev.every)
    if ev.reference_cache is None and "://" not in storage:
        ev = replace(ev, reference_cache=str(Path(storage) / REFERENCE_CACHE))
    return to_dict(replace(cfg, eval=ev))


def check_metric(cfg: Config) -> None:
    reported = reported_metrics(cfg)
    if cfg.search.metric not in reported:
        raise ConfigError(f"search.metric: no trial reports {cfg.search.metric!r} with these eval.metrics "
                          f"(reported: {', '.join(sorted(reported))})")


def check_trials(base: dict, space, figure_kinds: Optional[Collection[str]] = None) -> None:
    """Every point to evaluate and one sample of the space give a valid config (names included)."""
    from augtune.search.searchers import sample_values

    candidates = [*(("point", i + 1, p) for i, p in enumerate(space.points_to_evaluate)),
                  ("sample", 1, sample_values(space, 0))]
    for what, i, values in candidates:
        try:
            cfg = check_config(from_dict(set_values(base, values)), figure_kinds)
        except ConfigError as e:
            raise ConfigError(f"search.space ({what} {i}): {e}") from None
        if cfg.search.metric not in reported_metrics(cfg):
            raise ConfigError(f"search.metric: {what} {i} of the space reports no {cfg.search.metric!r}")


def absolute_paths(cfg: Config) -> Config:
    """`dataset.path` and `dataset.root` as absolute paths: a trial runs in its own folder, where a
    relative path would name nothing."""
    d = cfg.dataset
    fixed = {k: str(Path(v).expanduser().resolve()) for k, v in (("path", d.path), ("root", d.root))
             if v and "://" not in v}
    return replace(cfg, dataset=replace(d, **fixed)) if fixed else cfg


def resolve_storage(storage: str | None) -> str:
    """An absolute folder (Ray needs one) or a URI Ray's pyarrow filesystem understands."""
    if storage and "://" in storage:
        from augtune.search.storage import StorageError, filesystem

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


def check_name(name: str) -> str:
    if not name.strip() or "/" in name or "\\" in name or name in (".", "..") or name.startswith("."):
        raise ConfigError(
            f"--name: {name[:60]!r} must be a plain folder name (no /, not . or .., not hidden)"
        )
    if len(name.encode()) > MAX_NAME:
        raise ConfigError(f"--name: {name[:40]}... is longer than {MAX_NAME} bytes")
    return name


def trial_resources(cfg: Config) -> dict[str, float]:
    from augtune.trainables.ray_trainable import runs_in_process

    if runs_in_process(cfg):
        return {"cpu": cfg.resources.cpus_per_worker}
    return {"cpu": DRIVER_CPU}


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
    label = cfg.search.space if isinstance(cfg.search.space, str) else "inline"
    name = name or f"{label}-{cfg.dataset.name}-{_dt.datetime.now():%Y%m%d-%H%M%S}"
    return plan_config(cfg, storage=resolve_storage(storage), name=name, address=address, dashboard=dashboard,
                       figure_kinds=figure_kinds)


def plan_config(cfg: Config, *, storage: str, name: str, address: str | None = None, dashboard: bool = False,
                figure_kinds: Optional[Collection[str]] = None, check_name_free: bool = True,
                check_data: bool = True) -> SearchPlan:
    """`plan_search` for a resolved config and an absolute storage (compare plans its entrants here)."""
    from augtune.data import DataError, load_dataset
    from augtune.search.searchers import check_algorithm
    from augtune.spaces import resolve_space

    cfg = absolute_paths(cfg)
    if cfg.search.space is None:
        raise ConfigError("search.space: a search needs a space: a registered name (simclr, byol, moco, "
                          "simsiam, ...) or an inline mapping {dotted key: domain}")
    check_metric(cfg)
    from augtune.search.loggers import check_loggers

    check_loggers(cfg)  # a logger's missing package, before Ray starts
    per = cfg.search.repeat_best.per
    if per is not None:
        from augtune.config import dotted_keys

        if per not in dotted_keys():
            raise ConfigError(f"search.repeat_best.per: {per!r} is not a config key")
    space = resolve_space(cfg.search)
    check_algorithm(cfg.search, space)
    base = trial_base(cfg, storage)
    check_trials(base, space, figure_kinds)
    if check_data:
        try:
            load_dataset(cfg.dataset)
        except DataError as e:
            raise ConfigError(str(e)) from None
    if not address and cfg.resources.use_gpu:
        import torch

        if not torch.cuda.is_available():
            raise ConfigError(
                "resources.use_gpu: true, but this machine has no GPU (use --address for a cluster)"
            )
    plan = SearchPlan(cfg, base, storage, check_name(name), address, dashboard)
    if check_name_free and "://" not in storage and Path(plan.experiment).exists():
        raise ConfigError(f"--name: {plan.experiment} already exists; continue it with `augtune resume "
                          f"{plan.experiment}` or choose another name")
    return plan


def load_plan(exp_dir: str, address: str | None = None, dashboard: bool = False) -> SearchPlan:
    """The plan an experiment folder (or URI: s3://...) was started with (`augtune resume`), read without
    unpickling; a logger whose package is missing here is refused before Ray starts."""
    from augtune.search.loggers import check_loggers
    from augtune.search.storage import split

    try:
        storage, name = split(exp_dir)
        data = _read_search_file(exp_dir)
        cfg = from_dict(data["config"])
    except (ValueError, KeyError, TypeError) as e:  # StorageError is a ValueError
        raise ConfigError(str(e).splitlines()[0]) from None
    check_loggers(cfg)
    return SearchPlan(cfg, data["base"], storage, name, address, dashboard)


def _read_search_file(location: str) -> dict:
    """`records.read_search_file` of a local folder, or of a URI's copy (its messages name the URI)."""
    import tempfile

    from augtune.records import SEARCH_FILE
    from augtune.search.storage import is_uri, read_text

    if not is_uri(location):
        return read_search_file(Path(location).expanduser().resolve())
    text = read_text(location, SEARCH_FILE)
    if text is None:
        raise ValueError(f"{location}: not an augtune search folder (no {SEARCH_FILE})")
    with tempfile.TemporaryDirectory(prefix="augtune-plan-") as tmp:
        (Path(tmp) / SEARCH_FILE).write_text(text, encoding="utf-8")
        try:
            return read_search_file(Path(tmp))
        except ValueError as e:
            raise ValueError(str(e).replace(tmp, location)) from None
