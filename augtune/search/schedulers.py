"""The schedulers a search may run (`search.scheduler`), each said once: what it checks at planning, the
Tune scheduler it builds, the epochs at which it compares trials (where every trial must report the
metric), how often a trial must checkpoint, how many trials are live at once, how many checkpoints a
trial keeps, the knobs a trial records per epoch for it, and its line in `--plan`.

Every other module asks `scheduling(cfg)` (or, of a record, `records.searched_schedule`) and never
spells a scheduler's name: a new scheduler is one entry here.

- `none`: every trial runs every epoch.
- `asha`: Tune's ASHA stops trials early at its rungs, `grace_period * reduction_factor^k` epochs below
  `train.epochs` (Li et al., 2020).
- `pbt`, `pb2`: a population whose trials copy each other's checkpoints every `search.pbt.interval`
  epochs and continue under perturbed values (`augtune.search.pbt`): its trials are live whole, keep a
  checkpoint at every interval (a donor's must outlive its copy) and record the mutated knobs per epoch.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

from augtune.config import Config

if TYPE_CHECKING:
    from augtune.spaces import Space

# checkpoints kept per trial under PBT: a donor's checkpoint must outlive its copy (Tune warns at <= 2)
PBT_CHECKPOINTS = 4


@dataclass(frozen=True)
class Scheduling:
    """`none`: no scheduler; the base of the others."""

    name: str = "none"
    population: bool = False  # trials copy each other (PBT): searched values are a schedule, not constants

    def check(self, cfg: Config, space: Space, base: dict) -> Config:
        """`cfg` with the scheduler's settings resolved, or a ConfigError naming the key."""
        return cfg

    def build(self, cfg: Config, space: Optional[Space]) -> Any:
        """Tune's scheduler for a planned `cfg` (None: Tune's FIFO)."""
        return None

    def rung_epochs(self, cfg: Config) -> tuple[int, ...]:
        """The epochs at which the scheduler compares trials: each reports the metric there."""
        return ()

    def checkpoint_every(self, cfg: Config) -> Optional[int]:
        """The checkpoint cadence a trial must keep (epochs), or None: the trial's own."""
        return None

    def live_trials(self, cfg: Config, slots: int) -> int:
        """How many of a search's trials its algorithm hands Tune at once: `slots` (a TPE trial learns from
        the ones that ended)."""
        return slots

    def checkpoints_kept(self, cfg: Config) -> int:
        return cfg.search.keep_checkpoints

    def tracked(self, cfg: Config) -> tuple[str, ...]:
        """The knobs a trial records per epoch for the scheduler (written into its `train.track`)."""
        return ()

    def describe(self, cfg: Config) -> str:
        return "none (every trial runs every epoch)"


@dataclass(frozen=True)
class ASHA(Scheduling):
    name: str = "asha"

    def build(self, cfg: Config, space: Optional[Space]) -> Any:
        from ray.tune.schedulers import ASHAScheduler

        # `epoch` rather than Tune's training_iteration: that one restarts after a restore.
        return ASHAScheduler(time_attr="epoch", max_t=cfg.train.epochs, grace_period=cfg.search.grace_period,
                             reduction_factor=cfg.search.reduction_factor)

    def rung_epochs(self, cfg: Config) -> tuple[int, ...]:
        """ASHA's milestones, grace_period * reduction_factor^k below train.epochs."""
        s, out, r = cfg.search, [], float(cfg.search.grace_period)
        while r < cfg.train.epochs and len(out) < 64:
            out.append(math.ceil(r - 1e-9))  # ASHA takes the first result at or past a milestone
            r *= s.reduction_factor
        return tuple(sorted(set(out)))

    def describe(self, cfg: Config) -> str:
        s = cfg.search
        return f"ASHA (grace {s.grace_period}, reduction {s.reduction_factor}: stops trials early)"


@dataclass(frozen=True)
class PBT(Scheduling):
    name: str = "pbt"
    population: bool = True

    def check(self, cfg: Config, space: Space, base: dict) -> Config:
        from augtune.search.pbt import check_pbt

        return check_pbt(cfg, space, base)

    def build(self, cfg: Config, space: Optional[Space]) -> Any:
        from augtune.search.pbt import pbt_scheduler

        return pbt_scheduler(cfg, space)

    def rung_epochs(self, cfg: Config) -> tuple[int, ...]:
        """Every `interval` epochs, below the last: where trials are compared and copied."""
        return tuple(range(cfg.search.pbt.interval, cfg.train.epochs, cfg.search.pbt.interval))

    def checkpoint_every(self, cfg: Config) -> Optional[int]:
        return cfg.search.pbt.interval  # a checkpoint where PBT may copy the trial

    def live_trials(self, cfg: Config, slots: int) -> int:
        """The population whole: PBT compares only trials that have not finished, and one handed out
        `slots` at a time ran through its epochs before the next began, so it was never a population (it
        made hardly an exploit). Tune runs `slots` of them at once; PBT pauses a running one
        at each perturbation while others wait, so all progress together."""
        return max(cfg.search.num_samples, slots)

    def checkpoints_kept(self, cfg: Config) -> int:
        return max(cfg.search.keep_checkpoints, PBT_CHECKPOINTS)

    def tracked(self, cfg: Config) -> tuple[str, ...]:
        return tuple(cfg.search.pbt.mutate)  # resolved by the plan (`check`)

    def describe(self, cfg: Config) -> str:
        from augtune.search.pbt import describe_pbt

        return describe_pbt(cfg)


@dataclass(frozen=True)
class PB2(PBT):
    name: str = "pb2"


SCHEDULERS: dict[str, Scheduling] = {s.name: s for s in (Scheduling(), ASHA(), PBT(), PB2())}


def scheduling(cfg: Config) -> Scheduling:
    """The scheduler `cfg.search.scheduler` names."""
    return SCHEDULERS[cfg.search.scheduler]
