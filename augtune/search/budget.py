"""A compare under a time budget (`compare.time_budget: 20m`): trials, epochs and seeds sized to fit.

Before Ray starts, each entrant trains in this process on the search's data with its first
configuration (the papers' defaults), one epoch (one of each phase of a phase schedule: `measure`),
timed: set-up and the final evaluation (measured for the first entrant: every entrant has the same
backbone, data and metrics) are one run's fixed cost, the epoch its cost per epoch. The compare's wall
time is then estimated as

    start + sum over entrants of (trials + finalists x seeds) x (epochs x epoch_s + fixed_s + run) / slots

(`slots`: the trials that run at once; `start` (the measuring itself, Ray's start, the trial processes'
imports, the verdict, report and importances at the end) and `run` (what Tune spends on each run
besides training it), constants taken from the main job on two CPU cores). ASHA stops some search
trials early, which the estimate ignores.

The config's `compare.trials`, `train.epochs` and `compare.seeds` (a race's `max_seeds`, with its
`finalists` runs a seed) are the most the compare runs. When
their estimate passes the budget, trials and epochs shrink by one factor together (epochs never below
what every entrant needs: a phase schedule such as DiffAug's keeps each of its phases at least one
epoch; trials never below `compare.min_trials`), the largest factor that fits; only when the smallest
of both does not fit do the seeds shrink, down to two (the fewest a paired test can use). Shorter still
is refused before anything starts, naming the smallest budget that fits. The floor on trials is the
point: a search of one trial is no search (the verdict would compare the entrants' defaults, and no
importance can be computed), so a budget too short to search is refused rather than spent on
defaults; fewer epochs still rank configurations, which is what the search is for. Every entrant gets
the same trials, epochs and seeds: the equal budget holds. How close the estimate comes is measured on
the results page ("time budget").
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Sequence

from augtune.config import Config, ConfigError
from augtune.phases import segments

# what the main job spends beside its runs' own set-up, epochs and evaluation on two CPU cores (results
# page, "time budget"): once, Ray's start, the trial processes' imports, the verdict, report and
# importances; per run, Tune's start of it in a reused process, its records, checkpoints and references
START_S = 30.0
RUN_S = 1.0
MIN_SEEDS = 2  # the fewest seeds a paired test can use


@dataclass(frozen=True)
class Cost:
    """One entrant's measured cost: seconds per training epoch, and per run besides its epochs."""

    entrant: str
    epoch_s: float
    fixed_s: float  # set-up and the final evaluation
    min_epochs: int = 1
    evaluate_s: float = 0.0  # the final evaluation's part of fixed_s


@dataclass(frozen=True)
class Allocation:
    trials: int
    epochs: int
    seeds: int
    estimate_s: float
    budget_s: float

    def describe(self, asked: tuple[int, int, int]) -> str:
        """`time budget 20 min: 3 trials, 6 epochs, 3 seeds per entrant (asked: ...), estimated 14 min`"""
        got = (self.trials, self.epochs, self.seeds)
        was = "" if got == asked else f" (asked: {asked[0]} trials, {asked[1]} epochs, {asked[2]} seeds)"
        return (f"time budget {_minutes(self.budget_s)}: {self.trials} trial(s), {self.epochs} epoch(s), "
                f"{self.seeds} seed(s) per entrant{was}; estimated {_minutes(self.estimate_s)} from the "
                "entrants' measured epochs")


def _minutes(s: float) -> str:
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.0f} min"


def _ceil_minutes(s: float) -> str:
    """A budget to ask for that covers `s` seconds, as `compare.time_budget` takes it: 90s, 21m (the
    refusal asks for a tenth more than its estimate: the next run measures the entrants again)."""
    return f"{math.ceil(s)}s" if s < 120 else f"{math.ceil(s / 60)}m"


def wall_s(costs: Sequence[Cost], trials: int, epochs: int, seeds: int, slots: int,
           start_s: float = START_S, per_seed: int = 1) -> float:
    """The estimated wall time of a compare of these entrants (see the module doc); `per_seed`: repeat
    runs per seed of an entrant (a race's finalists)."""
    work = sum((trials + per_seed * seeds) * (epochs * c.epoch_s + c.fixed_s + RUN_S) for c in costs)
    return start_s + work / max(1, slots)


def check_floor(budget_s: float, entrants: int, trials: int, per_seed: int, slots: int) -> None:
    """Refuse, before anything is timed, a budget under what the compare spends whatever its entrants
    cost: its start (START_S) and each run's own overhead (RUN_S) of the smallest design (`trials` search
    trials and MIN_SEEDS seeds of `per_seed` repeat runs per entrant), at no training time at all."""
    runs = entrants * (max(1, trials) + per_seed * MIN_SEEDS)
    floor = START_S + runs * RUN_S / max(1, slots)
    if budget_s < floor:
        raise ConfigError(f"compare.time_budget: {_minutes(budget_s)} is less than a compare of {entrants} "
                          f"entrant(s) spends before any training ({_minutes(floor)}: Ray's start and "
                          f"{runs} runs' own set-up); give more: the entrants' training comes on top")


def allocate(costs: Sequence[Cost], budget_s: float, *, trials: int, epochs: int, seeds: int, slots: int,
             start_s: float = START_S, per_seed: int = 1, min_trials: int = 1) -> Allocation:
    """The trials, epochs and seeds that fit `budget_s` (the module doc's rule); ConfigError when even
    the smallest design does not. `per_seed`: repeat runs per seed of an entrant (a race's finalists:
    its seeds are then its `max_seeds`, the most it can run); `min_trials`: the fewest search trials an
    entrant may get (`compare.min_trials`; the asked trials when fewer)."""
    floor_e = min(epochs, max((c.min_epochs for c in costs), default=1))
    floor_t = max(1, min(trials, min_trials))

    def fits(t: int, e: int, s: int) -> bool:
        return wall_s(costs, t, e, s, slots, start_s, per_seed) <= budget_s

    def shrunk(k: float) -> tuple[int, int]:
        return max(floor_t, math.floor(trials * k)), max(floor_e, math.floor(epochs * k))

    s = seeds
    while not fits(*shrunk(0.0), s) and s > min(MIN_SEEDS, seeds):
        s -= 1
    t, e = shrunk(0.0)
    if not fits(t, e, s):
        need = wall_s(costs, t, e, s, slots, start_s, per_seed)
        fewer = " (or lower compare.min_trials)" if t > 1 else ""
        raise ConfigError(f"compare.time_budget: {_minutes(budget_s)} is too short for these entrants: even "
                          f"{t} trial{'s' if t > 1 else ''}, {e} epoch(s) and {s} seeds each take about "
                          f"{_minutes(need)} here; give at least {_ceil_minutes(1.1 * need)}{fewer}")
    if s == seeds:  # the largest factor of trials and epochs that fits, to 1/1000
        lo, hi = 0.0, 1.0
        if fits(*shrunk(1.0), s):
            lo = 1.0
        else:
            for _ in range(10):
                mid = (lo + hi) / 2
                lo, hi = (mid, hi) if fits(*shrunk(mid), s) else (lo, mid)
        t, e = shrunk(lo)
    return Allocation(t, e, s, wall_s(costs, t, e, s, slots, start_s, per_seed), budget_s)


def min_epochs(schedule: str, most: int = 10_000) -> int:
    """The fewest epochs in which every segment of a phase schedule (`A:200,B:400,A:800`) keeps at least
    one epoch (`phases.parse_phases` scales it to the run's epochs, where a short run can lose one)."""
    if not schedule or not schedule.strip():
        return 1
    for e in range(len(schedule.split(",")), most + 1):
        if all(n > 0 for _, n in segments(schedule, e)):
            return e
    return most


def measure(cfg: Config, data, log=lambda s: None, evaluate_s: float | None = None) -> Cost:
    """One entrant's cost, measured in this process: set-up, an epoch, the final evaluation. A method
    with a phase schedule trains one epoch of each of its segments (DiffAug's A-epoch before any
    generator step, its B-epoch, its A-epoch that samples every positive), and its epoch cost is their
    mean weighted by each segment's share of the run's `train.epochs`. `evaluate_s`: the evaluation's
    time when another entrant measured it (the same backbone, data and metrics: the same cost)."""
    from dataclasses import replace

    import torch

    from augtune.trainables.loop import Trainer

    threads = torch.get_num_threads()
    torch.set_num_threads(cfg.train.num_threads or max(1, int(cfg.resources.cpus_per_worker)))
    try:
        t0 = time.perf_counter()
        trainer = Trainer(cfg, data, log=log)
        set_up = time.perf_counter() - t0
        schedule = cfg.train.phases or trainer.method.default_phases()
        floor = min_epochs(schedule)
        if floor > 1:  # one epoch of each segment: the schedule scaled to its fewest epochs
            trainer = Trainer(replace(cfg, train=replace(cfg.train, epochs=floor)), data, log=log)
        epochs = []
        for _ in range(floor):
            t0 = time.perf_counter()
            trainer.train_epoch()
            epochs.append(time.perf_counter() - t0)
        if evaluate_s is None:
            t0 = time.perf_counter()
            trainer.evaluate(cfg.eval.metrics)
            evaluate_s = time.perf_counter() - t0
    finally:
        torch.set_num_threads(threads)
    shares = [n for _, n in segments(schedule, cfg.train.epochs)] if floor > 1 else [cfg.train.epochs]
    epoch = sum(t * n for t, n in zip(epochs, shares)) / max(1, sum(shares))
    return Cost("+".join((cfg.method.base, *cfg.method.augment)), epoch, set_up + evaluate_s, floor,
                evaluate_s)
