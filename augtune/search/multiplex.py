"""Several searches in one Tune run: a compare's entrants share trial processes (imports Ray).

A trial process costs seconds of CPU to start and to set up its first trial, and next to nothing for a
trial after that (results page, "Where a search's CPU goes"): every entrant's search runs in one Tune run
(`<experiment>/search/`), and a process that ends one entrant's trial takes the next trial of any
entrant.

What makes each search its own is kept apart: its space and its Optuna study (`<experiment>/<entrant>/
optuna.journal`), its budget of trials, its concurrency limit, its scheduler (ASHA's rungs compare an
entrant's trials with its own only) and its records (`<experiment>/<entrant>/<trial>/record.json`, where
the analysis reads them). A trial carries its entrant in its parameters (`ENTRANT`); Tune's folder of the
trial holds only Tune's files.

`EntrantsSearch` hands out the entrants' trials in turn (each entrant's next one when its own searcher
has one) and routes results to the entrant's searcher (`searchers.Continuing`, which a resume gives the
entrant's records). `EntrantsScheduler` routes each trial to its entrant's scheduler.
"""
from __future__ import annotations

import copy
from typing import Iterable, Optional

from ray.tune.schedulers import FIFOScheduler, PopulationBasedTraining, TrialScheduler
from ray.tune.search import SearchAlgorithm

from augtune.records import ENTRANT, REPEAT
from augtune.search.adapters import experiment_of, resume_pbt_clock
from augtune.search.resume import RESUME


def entrant_of(trial_or_result) -> Optional[str]:
    """The entrant of a Tune trial (its config) or of a flattened result (`config/_entrant`)."""
    config = getattr(trial_or_result, "config", None)
    if isinstance(config, dict):
        return config.get(ENTRANT)
    if isinstance(trial_or_result, dict):
        return trial_or_result.get(f"config/{ENTRANT}")
    return None


class EntrantsSearch(SearchAlgorithm):
    """The search algorithms of several entrants (`name -> (search algorithm, constants, trials)`: an
    algorithm as `searchers.Continuing` makes it, the constants of its space, its budget; a search of its
    own is the one entrant None, whose trials name no entrant) as one, at most
    `max_concurrent` trials at a time in all (0: no limit of its own), besides the trials of the entrants in
    `populations` (PBT's: a population is live whole, `schedulers.PBT.live_trials`; Tune's slots still
    hold how many run at once)."""

    def __init__(self, entrants: dict[str, tuple], max_concurrent: int = 0, populations: Iterable[str] = ()):
        self._subs = {name: alg for name, (alg, _, _) in entrants.items()}
        self._constants = {name: dict(constants) for name, (_, constants, _) in entrants.items()}
        self._budgets = {name: int(trials) for name, (_, _, trials) in entrants.items()}
        self._owner: dict[str, str] = {}  # trial id -> entrant
        self._live: set[str] = set()
        self.max_concurrent = max_concurrent
        self._populations = set(populations)
        self._turn = 0

    # -- what Tune asks -----------------------------------------------------------------------------------

    def set_search_properties(self, metric: Optional[str], mode: Optional[str], config: dict, **spec) -> bool:
        for sub in self._subs.values():
            sub.set_search_properties(metric, mode, config, **spec)
        return True

    @property
    def total_samples(self) -> int:
        return sum(self._budgets.values())

    def add_configurations(self, experiments) -> None:
        """Tune's one experiment becomes one per entrant: its constants and its name in the config, its
        budget of trials."""
        experiment = experiment_of(experiments)
        for name, sub in self._subs.items():
            spec = dict(experiment.spec)
            config = {**(spec.get("config") or {}), **self._constants[name]}
            if name is not None:  # a search of its own (entrant None) names none
                config[ENTRANT] = name
            spec["config"] = copy.deepcopy(config)
            spec["num_samples"] = self._budgets[name]
            own = copy.copy(experiment)
            own.spec = spec
            sub.add_configurations([own])

    def next_trial(self):
        """The next entrant in turn that has a trial to give (its searcher and its limit allow one)."""
        populations = self._populations
        limited = [t for t in self._live if self._owner.get(t) not in populations]
        full = bool(self.max_concurrent) and len(limited) >= self.max_concurrent
        names = list(self._subs)
        for _ in range(len(names)):
            name = names[self._turn % len(names)]
            self._turn += 1
            sub = self._subs[name]
            if sub.is_finished() or (full and name not in populations):
                continue
            trial = sub.next_trial()
            if trial is not None:
                self._owner[trial.trial_id] = name
                self._live.add(trial.trial_id)
                return trial
        return None

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        sub = self._sub(trial_id, result)
        if sub is not None:
            sub.on_trial_result(trial_id, result)

    def on_trial_complete(self, trial_id: str, result: Optional[dict] = None, error: bool = False) -> None:
        self._live.discard(trial_id)
        sub = self._sub(trial_id, result)
        if sub is not None:
            sub.on_trial_complete(trial_id, result=result, error=error)

    def is_finished(self) -> bool:
        return all(sub.is_finished() for sub in self._subs.values())

    def set_finished(self) -> None:
        for sub in self._subs.values():
            sub.set_finished()

    def _sub(self, trial_id: str, result: Optional[dict]):
        name = self._owner.get(trial_id) or entrant_of(result or {})
        if name is not None:
            self._owner.setdefault(trial_id, name)
        return self._subs.get(name)


class EntrantsScheduler(FIFOScheduler):
    """Each trial goes to its entrant's scheduler (`name -> TrialScheduler`, e.g. ASHA; a search of its
    own is the entrant None); trials run in the order they were made (FIFO), as ASHA runs them. A repeat
    run (`augtune.search.repeat`) is never stopped early: it runs to the end whatever its entrant."""

    def __init__(self, schedulers: dict[str, TrialScheduler]):
        super().__init__()
        self._schedulers = schedulers
        self._fifo = FIFOScheduler()  # an entrant without a scheduler of its own: its trials run to the end

    def set_search_properties(self, metric: Optional[str], mode: Optional[str], **spec) -> bool:
        ok = [s.set_search_properties(metric, mode, **spec) for s in self._schedulers.values()]
        return super().set_search_properties(metric, mode, **spec) and all(ok)

    def _of(self, trial) -> TrialScheduler:
        if REPEAT in (getattr(trial, "config", None) or {}):
            return self._fifo
        return self._schedulers.get(entrant_of(trial)) or self._fifo

    def choose_trial_to_run(self, tune_controller):
        """A pending trial first, in the order they were made; then the paused trial least far along (by
        the epoch of its last result; PBT pauses trials to share the slots). PBT's own rule ranks a trial
        that just copied a paused donor as far along as the donor, and Tune's order then runs the copy
        again and again, each time copying the same stale checkpoint, while the donor waits."""
        from ray.tune.experiment import Trial

        trials = tune_controller.get_trials()
        pending = next((t for t in trials if t.status == Trial.PENDING), None)
        if pending is not None:
            return pending
        paused = [t for t in trials if t.status == Trial.PAUSED]
        return min(paused, key=lambda t: (t.last_result or {}).get("epoch", 0)) if paused else None

    def on_trial_add(self, tune_controller, trial) -> None:
        scheduler = self._of(trial)
        scheduler.on_trial_add(tune_controller, trial)
        again = (getattr(trial, "config", None) or {}).get(RESUME)
        if again and isinstance(scheduler, PopulationBasedTraining):  # PB2 too: a resumed trial's clock
            resume_pbt_clock(scheduler, trial, again.get("epoch") or 0)

    def on_trial_error(self, tune_controller, trial) -> None:
        self._of(trial).on_trial_error(tune_controller, trial)

    def on_trial_result(self, tune_controller, trial, result: dict) -> str:
        return self._of(trial).on_trial_result(tune_controller, trial, result)

    def on_trial_complete(self, tune_controller, trial, result: dict) -> None:
        self._of(trial).on_trial_complete(tune_controller, trial, result)

    def on_trial_remove(self, tune_controller, trial) -> None:
        self._of(trial).on_trial_remove(tune_controller, trial)

    def debug_string(self) -> str:
        return "; ".join(f"{name or 'search'}: {s.debug_string()}" for name, s in self._schedulers.items())
