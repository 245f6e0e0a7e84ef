"""`augtune compare`: the methods head to head on one data set, under one budget.

Every entrant (a base alone, or a base with one augmentation method) is an ordinary augtune search: its
own registered space (the papers' defaults first), the same number of trials (`compare.trials`, Optuna
TPE, ASHA unless `compare.scheduler: none`; or a PBT population, whose best trial's schedule the repeat
replays), then its best configuration re-run on the same new seeds as every other entrant. A method
entered under a constant and a schedule scheduler (`compare.scheduler: [asha, pbt]`) is two entrants,
`simclr+pinda` and `simclr+pinda@pbt`. What the protocol holds equal is taken out of every space
(`search.hold`): the data, split, backbone, epochs, batch size, evaluation and seeds. The verdict, its
tests and the importances are made by `augtune.analysis` from the records on disk.

The experiment folder holds `augtune_compare.yaml` (what `augtune resume` needs); one folder per entrant,
named by its label (`simclr+pinda`), with its plan, its Optuna study and its trials' records; `search/`:
the one Ray experiment of every entrant's search (`augtune.search.multiplex`: each entrant keeps its
study, budget, limit and scheduler; they share the trial processes) and then of the repeat of every
entrant's best configuration on the shared seeds (`augtune.search.repeat`), whose records are in
`repeat/`; with `compare.race`, the repeat is a race of each entrant's best configurations, round by
round (`choosers.RaceOfFinalists`, deciding by `augtune.analysis.race`). Resuming finishes the searches,
then the repeat (a race where it stopped). This module plans; `tune_run` builds the run.
"""
from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional

import yaml

from augtune.checks import check_against_data
from augtune.config import (SPLIT_VARIES_BELOW, Config, ConfigError, from_dict, parse_duration, safe_load,
                            set_values, to_dict)
from augtune.records import COMPARE_FILE, LABEL_FREE, SEARCH_FILE, mode_of
from augtune.search import budget as b
from augtune.search.plan import concurrency, describe, fit_size, load_plan, plan_config, selecting, trials_of
from augtune.search.schedulers import SCHEDULERS
from augtune.storage import write_bytes

SEED_MAX = 2**32 - 1  # numpy's and scikit-learn's largest seed (config.py bounds train.seed so)
# keys the protocol holds equal for every entrant: no space may vary them
HELD = ("method.base", "method.augment", "train.epochs", "train.batch_size", "train.seed")


@dataclass(frozen=True)
class Entrant:
    base: str
    augment: tuple[str, ...]
    scheduler: str = "asha"  # how its search runs (`compare.scheduler`)

    @property
    def label(self) -> str:
        """`simclr+pinda`; searched by PBT (a schedule, not a constant), `simclr+pinda@pbt`."""
        method = "+".join((self.base, *self.augment))
        return f"{method}@{self.scheduler}" if SCHEDULERS[self.scheduler].population else method

    @property
    def space(self) -> str:
        """The registered space the entrant searches: its augmentation's own, else its base's."""
        from augtune.spaces import SPACES

        if self.augment and self.augment[0] in SPACES:
            return self.augment[0]
        return self.base


def applicable(modality: str) -> tuple[str, ...]:
    """The registered augmentations that apply to data of `modality`, in the registry's order."""
    from augtune.methods import AUGMENTATIONS, modalities

    return tuple(name for name in AUGMENTATIONS if modality in modalities(name))


def entrants(cfg: Config, modality: str) -> list[Entrant]:
    """The entrants of `cfg.compare` on data of `modality` (`image` or `vector`), bases first: every
    registered augmentation that applies to it unless `compare.methods` names some, each once under every
    `compare.scheduler` (a method searched for a constant and for a schedule is two entrants)."""
    from augtune.methods import AUGMENTATIONS, modalities

    c = cfg.compare
    check_schedulers(c.scheduler)
    bases = c.bases or (cfg.method.base,)
    wanted = c.methods or ("base", *applicable(modality))
    for m in wanted:
        if m != "base" and m not in AUGMENTATIONS:
            raise ConfigError(f"compare.methods: unknown {m!r} (known: base, {', '.join(AUGMENTATIONS)})")
        if m != "base" and modality not in modalities(m):
            raise ConfigError(f"compare.methods: {m} applies to {' and '.join(modalities(m))} data; this "
                              f"data set gives {modality}s")
    return [Entrant(b, () if m == "base" else (m,), sched) for b in bases for m in wanted
            for sched in c.scheduler]


def check_schedulers(schedulers: tuple) -> None:
    """`compare.scheduler`: at least one, each once, at most one that searches constants."""
    if not schedulers:
        raise ConfigError("compare.scheduler: name at least one (asha, none, pbt or pb2)")
    if len(set(schedulers)) != len(schedulers):
        raise ConfigError(f"compare.scheduler: lists one twice: {list(schedulers)}")
    constant = [s for s in schedulers if not SCHEDULERS[s].population]
    if len(constant) > 1:
        raise ConfigError(f"compare.scheduler: {' and '.join(constant)} both search constants; one method "
                          "entered twice would be two entrants of one label (name one of them)")


def entrant_config(cfg: Config, entrant: Entrant) -> Config:
    """The search config of one entrant: its base and method, its own space, the shared budget, the
    held keys out of the space, the best configuration repeated on the shared seeds."""
    c = cfg.compare
    seeds = [cfg.train.seed + i for i in range(1, repeat_seeds(c) + 1)]
    values = {
        "method.base": entrant.base, "method.augment": list(entrant.augment),
        "search.space": entrant.space, "search.hold": list(dict.fromkeys([*HELD, *cfg.search.hold])),
        # TPE would credit a PBT trial's last score to its first values: a population starts at random
        "search.algorithm": "random" if SCHEDULERS[entrant.scheduler].population else "optuna",
        "search.num_samples": c.trials, "search.metric": c.metrics[0],
        "search.mode": mode_of(c.metrics[0]),
        "search.scheduler": entrant.scheduler,
        "search.repeat_best": {"top": 0, "seeds": seeds, "per": None},  # one repeat for all: tune_run
    }
    return from_dict(set_values(to_dict(cfg), values))


def repeat_seeds(c) -> int:
    """The most seeds a run of the repeat takes (`compare.seeds`; a race's `max_seeds`)."""
    return c.race.max_seeds if c.race.enabled else c.seeds


@dataclass(frozen=True)
class ComparePlan:
    cfg: Config  # the user's resolved config, with its compare section
    experiment: str  # the experiment folder
    plans: tuple  # one SearchPlan per entrant, in order
    labels: tuple[str, ...]
    modality: Optional[str] = None
    budget: str = ""  # how `compare.time_budget` sized the compare, when it is set
    budget_began: Optional[float] = None  # when its measuring began (time.monotonic): the budget's start
    # `compare.equal: compute`: each entrant's train.epochs (its label -> epochs); None: train.epochs each
    epochs: Optional[dict] = None
    rows: str = ""  # the labelled and unlabelled rows (`describe_rows`), and what selects without labels

    def save(self) -> None:
        data = {"config": to_dict(self.cfg), "entrants": list(self.labels), "modality": self.modality,
                **({"epochs": dict(self.epochs)} if self.epochs else {})}
        write_bytes(self.experiment, COMPARE_FILE, yaml.safe_dump(data, sort_keys=False).encode())


def plan_compare(cfg: Config, modality: str, *, storage: str, name: str, address: Optional[str] = None,
                 dashboard: bool = False, figure_kinds=None, data=None,
                 epochs: Optional[dict] = None) -> ComparePlan:
    """Every entrant's search planned (and so checked) before Ray starts or anything is written. The data
    set is the caller's to check (it has loaded it to learn its `modality`): every entrant's is the same,
    so it is not loaded again for each. `epochs`: each entrant's epochs under `compare.equal: compute`
    when an earlier plan measured them (a resume); measured here otherwise."""
    cfg = checked_compare(cfg, data)
    budget, began, costs = "", None, None
    if data is not None and cfg.compare.time_budget is not None:
        began = time.monotonic()
        cfg, budget, costs = fit_time_budget(cfg, modality, address)
    if cfg.compare.equal == "compute" and epochs is None and data is not None:
        costs = costs or measure_costs(cfg, modality)
        epochs = dict(zip((e.label for e in entrants(cfg, modality)), equal_compute(costs, cfg.train.epochs)))
    experiment = f"{storage.rstrip('/')}/{name}"
    plans = [entrant_plan(cfg, e, experiment, modality, data, epochs, address=address, dashboard=dashboard,
                          figure_kinds=figure_kinds) for e in entrants(cfg, modality)]
    rows = ""
    if data is not None:
        from augtune.data.datasets import describe_rows

        rows = describe_rows(data) + (f"; selecting on {cfg.compare.metrics[0]}" if len(data.y_train) == 0
                                      else "")
    return ComparePlan(cfg, experiment, tuple(plans), tuple(p.name for p in plans), modality, budget, began,
                       epochs if cfg.compare.equal == "compute" else None, rows)


def checked_compare(cfg: Config, data=None) -> Config:
    """`cfg`'s compare section checked against itself and the data: a metric to search, seeds in range,
    the label-free columns of data without labels, and what `vary` defaults to for the test split's size."""
    if len(cfg.compare.metrics) == 0:
        raise ConfigError("compare.metrics: name at least one metric (the first is the one searched)")
    if data is not None and len(data.y_train) == 0:
        cfg = label_free(cfg)
    if cfg.train.seed + repeat_seeds(cfg.compare) > SEED_MAX:
        key = "compare.race.max_seeds" if cfg.compare.race.enabled else "compare.seeds"
        raise ConfigError(f"train.seed: {cfg.train.seed} + {key} ({repeat_seeds(cfg.compare)}) passes "
                          f"{SEED_MAX}, the largest seed: the repeat runs on seeds train.seed + 1, + 2, ...")
    if data is not None and cfg.compare.vary is None:
        cfg = replace(cfg, compare=replace(cfg.compare, vary=default_vary(len(data.y_test))))
    return cfg


def entrant_plan(cfg: Config, e: Entrant, experiment: str, modality: str, data, epochs: Optional[dict],
                 **where):
    """One entrant's search, planned (`plan.plan_config`) in the compare's folder: its epochs under
    `compare.equal: compute`, its networks and knn_k checked against the data."""
    entrant = entrant_config(cfg, e)
    if epochs and e.label in epochs:  # compare.equal: compute
        entrant = replace(entrant, train=replace(entrant.train, epochs=int(epochs[e.label])))
    if data is not None:  # each entrant's networks within memory, its knn_k below the samples
        check_against_data(entrant, data)
    n_train = None if data is None else fit_size(data, cfg.dataset.val_fraction)
    return plan_config(entrant, storage=experiment, name=e.label, check_name_free=False, check_data=False,
                       modality=modality, n_train=n_train, **where)


def equal_compute(costs, epochs: int) -> list[int]:
    """`compare.equal: compute`: each entrant's epochs, so that its training costs about what the cheapest
    entrant's `epochs` cost (never more: rounded down; never fewer than its phase schedule needs)."""
    cheapest = min(c.epoch_s for c in costs)
    return [max(c.min_epochs, min(epochs, math.floor(epochs * cheapest / c.epoch_s + 1e-9))) for c in costs]


def label_free(cfg: Config) -> Config:
    """A compare of data without labels: its columns are the label-free ones it names, else `rankme`
    (it selects and races on the first); every run evaluates those only (RankMe, Garrido et al. 2023:
    choosing by it lost little against a labelled probe on ImageNet; benchmarks/label_free.py)."""
    metrics = tuple(m for m in cfg.compare.metrics if m in LABEL_FREE) or ("rankme",)
    # CoCor's MMNN reads labels: with none, its constant targets (App. F), in every trial
    hold = tuple(dict.fromkeys([*cfg.search.hold, "cocor.mmnn"]))
    return replace(cfg, compare=replace(cfg.compare, metrics=metrics),
                   eval=replace(cfg.eval, metrics=metrics, epoch_metrics=()),
                   cocor=replace(cfg.cocor, mmnn=False), search=replace(cfg.search, hold=hold))


def fit_time_budget(cfg: Config, modality: str, address: Optional[str] = None) -> tuple[Config, str, list]:
    """`cfg` with `compare.trials`, `train.epochs` and `compare.seeds` sized to `compare.time_budget`
    from each entrant's first epoch, measured here (`augtune.search.budget`), the line that says so, and
    the costs measured. The measuring is part of the budget. Under `compare.equal: compute` the epochs
    sized are the cheapest entrant's, and each other entrant's run costs about as much as its."""
    start = time.monotonic()
    total = parse_duration(cfg.compare.time_budget)
    c = cfg.compare
    if address:  # a cluster's size is known once Ray is connected: its concurrency limit, else one
        slots = cfg.search.max_concurrent or 1
    else:  # a local Ray takes this machine's CPUs
        first = entrant_config(cfg, entrants(cfg, modality)[0])
        slots = concurrency(first, {"CPU": float(os.cpu_count() or 1)})
    # before the timing probe (which takes seconds to minutes): a budget that no cost of the entrants could
    # fit, the compare's start and its smallest design's runs at no training time at all
    b.check_floor(total, len(entrants(cfg, modality)), min(c.trials, c.min_trials),
                  c.race.finalists if c.race.enabled else 1, slots)
    measured = measure_costs(cfg, modality)
    costs = measured
    if cfg.compare.equal == "compute":  # every entrant's epochs cost the cheapest one's
        cheapest = min(x.epoch_s for x in measured)
        costs = [replace(x, epoch_s=cheapest) for x in measured]
    spent = time.monotonic() - start  # the measuring: part of the budget, as Ray's start is
    race = c.race
    # a race's most repeat runs: finalists x max_seeds per entrant (its seeds shrink as max_seeds)
    got = b.allocate(costs, total, trials=c.trials, epochs=cfg.train.epochs, seeds=repeat_seeds(c),
                     slots=slots, start_s=b.START_S + spent, per_seed=race.finalists if race.enabled else 1,
                     min_trials=c.min_trials)
    if race.enabled:
        race = replace(race, max_seeds=got.seeds, min_seeds=min(race.min_seeds, got.seeds))
    seeds = c.seeds if c.race.enabled else got.seeds  # a race's are its max_seeds
    fitted = replace(cfg, compare=replace(c, trials=got.trials, seeds=seeds, race=race),
                     train=replace(cfg.train, epochs=got.epochs))
    return fitted, got.describe((c.trials, cfg.train.epochs, repeat_seeds(c))), measured


def measure_costs(cfg: Config, modality: str) -> list:
    """Each entrant's cost (`budget.measure`: an epoch of its first configuration, timed in this process
    on the search's data), in `entrants` order."""
    from augtune.data import load_dataset
    from augtune.spaces import resolve_space

    data = load_dataset(selecting(cfg).dataset)  # what a search trial trains and is scored on
    costs: list = []
    for e in entrants(cfg, modality):
        entrant = entrant_config(cfg, e)
        space = resolve_space(entrant.search, modality)
        first = space.points_to_evaluate[0] if space.points_to_evaluate else {}
        costs.append(b.measure(selecting(from_dict(set_values(to_dict(entrant), first))), data,
                               evaluate_s=costs[0].evaluate_s if costs else None))
    return costs


def default_vary(n_test: int) -> tuple[str, ...]:
    """`compare.vary`'s default for a test split of `n_test` samples: the split varies too below
    `SPLIT_VARIES_BELOW` (on a few hundred test samples which ones land there moves accuracy by about as
    much as a method does, so a verdict over fixed-split seeds would be more certain than the user's next
    run); above it the split stays (often a published one, which results are then reported on)."""
    return ("init", "split") if n_test < SPLIT_VARIES_BELOW else ("init",)


def describe_compare(plan: ComparePlan) -> list[str]:
    """What a compare would run, a line each (`augtune compare --plan`): its entrants (each a search, as
    `plan.describe` says), the shared seeds and the totals."""
    c = plan.cfg.compare
    seeds = list(plan.plans[0].cfg.search.repeat_best.seeds)
    race = c.race
    if race.enabled:
        then = (f"then a race of each entrant's best {race.finalists} configuration(s) on seeds {seeds[0]}.."
                f"{seeds[race.min_seeds - 1]}, one more seed a round to those not shown worse, up to seed "
                f"{seeds[-1]} (decided on the validation split, reported on the test split)")
        each = race.finalists * len(seeds)
    else:
        then, each = f"then each entrant's best on seeds {seeds}", len(seeds)
    lines = [f"{len(plan.labels)} entrants on {plan.modality or 'the'} data: {', '.join(plan.labels)}; "
             f"{c.trials} trials each, {then}; metrics {', '.join(c.metrics)}"]
    if plan.epochs:
        lines.append("equal compute (compare.equal: compute): epochs per entrant, each about the cost of the "
                     "cheapest one's: " + ", ".join(f"{k} {v}" for k, v in plan.epochs.items()))
    trials = most = 0
    for p in plan.plans:
        lines += describe(p, repeat_runs=each)
        trials += trials_of(p)
        most += (trials_of(p) + each) * p.cfg.train.epochs
    least = f"{race.finalists * race.min_seeds * len(plan.plans)} to " if race.enabled else ""
    lines.append(f"in all: {trials} search trials and {least}{each * len(plan.plans)} repeat runs, at most "
                 f"{most} epochs")
    return lines + ([plan.budget] if plan.budget else [])


def load_compare(exp_dir: str, address: Optional[str] = None) -> ComparePlan:
    """The plan of an experiment folder that `augtune compare` wrote (for `augtune resume`)."""
    folder = Path(exp_dir).expanduser().resolve()
    file = folder / COMPARE_FILE
    try:
        data = safe_load(file.read_text(encoding="utf-8"), str(file))
        cfg = from_dict(data["config"])
        labels = tuple(str(x) for x in data["entrants"])
        modality = data.get("modality") if data.get("modality") in ("image", "vector") else None
        epochs = {str(k): int(v) for k, v in data["epochs"].items()} if data.get("epochs") else None
    except (OSError, KeyError, TypeError, ValueError, AttributeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{file}: cannot be read ({type(e).__name__})") from None
    plans = []
    for label in labels:
        sub = folder / label
        plans.append(
            load_plan(str(sub), address=address) if (sub / SEARCH_FILE).is_file() else None
        )
    if any(p is None for p in plans):  # an entrant never started: plan it again from the saved config
        from augtune.data import load_dataset

        modality = modality or load_dataset(cfg.dataset).modality
        fresh = plan_compare(cfg, modality, storage=str(folder.parent), name=folder.name, address=address,
                             epochs=epochs)
        plans = [p if p is not None else f for p, f in zip(plans, fresh.plans)]
    return ComparePlan(cfg, str(folder), tuple(plans), labels, modality, epochs=epochs)


