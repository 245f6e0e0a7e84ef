"""A search and the repeat of its best configurations in one Tune run (imports Ray).

The repeat phase re-runs the best configurations of a search on new seeds, in the search's own Tune run
(no trial process starts again: results page, "A trial process's start"): `SearchThenRepeat`
hands out the search algorithm's trials until the search has made all of them and every one has ended,
then asks `choose` for the repeat runs (from the ended trials' records) and hands those out, as trials of
the same run, which the trial processes the search started take in turn (`reuse_actors`).

A repeat trial's config is its whole parameter set under `REPEAT` (and, in a compare, its entrant):
what trains reads nothing of the search's space. Its record goes to the repeat folder (`repeat_best/`,
a compare's `repeat/`), Tune's files of it to the run's own folder. The scheduler never stops a repeat
trial early (`multiplex.EntrantsScheduler` routes it to FIFO).

The repeat runs are its chooser's (`augtune.search.choosers`: one shape, `choose(ended repeat trials) ->
(the runs due, finished)`, reading the search trials from their records). A chooser that has not
finished (a compare's race) is asked again each time a repeat trial has ended. A resume
(`augtune.search.resume`) gives it the repeat runs the records hold: as a chooser's answer is a function
of the records and the ended repeat runs alone, the repeat is chosen as before and continues where it
stopped: an ended run is never made again, a run left unfinished is made again from its checkpoint, and
only what is missing is made anew.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Optional, Protocol

from ray.tune.search import SearchAlgorithm

from augtune.records import REPEAT
from augtune.search.adapters import experiment_of, trial_from_spec
from augtune.search.searchers import Wrapping


class Chooser(Protocol):
    """What the repeat runs: `(ended repeat trials) -> (the runs due, finished)` (`augtune.search.choosers`;
    the search trials it reads from their records)."""

    def __call__(self, repeats: list[Ended]) -> tuple[list[dict], bool]: ...


@dataclass(frozen=True)
class Ended:
    """A repeat run that ended, as a race decides from it (the shape of Tune's `Result`)."""

    trial_id: str
    config: dict  # the run's Tune config (`{REPEAT: parameters}`, ...)
    metrics: dict  # its last result
    error: Optional[str] = None  # why it failed; None when it ended well (completed, or stopped early)


class SearchThenRepeat(Wrapping):
    """`search` (a Tune search algorithm that `searchers.Continuing` or `multiplex.EntrantsSearch`
    makes), then the repeat runs `choose` returns (each a trial config: `{REPEAT: params}`; see the module
    docstring), at most `max_concurrent` repeat trials at a time (0: no limit). `records`: what a resume
    holds (`resume.Records`; its search's unfinished trials are `search`'s to make again), with
    `restart_errored` a failed repeat run made again from scratch."""

    def __init__(self, search: SearchAlgorithm, choose: Chooser, max_concurrent: int = 0, records=None,
                 restart_errored: bool = False):
        self.search, self.choose, self.max_concurrent = search, choose, max_concurrent
        self._experiment = None  # Tune's experiment: a repeat trial is made from its spec
        self._search_live: set[str] = set()
        self.runs: Optional[list[dict]] = None  # the repeat trials' configs, once chosen
        self._made: dict[int, str] = {}  # index in runs -> trial id
        self._repeat_configs: dict[str, dict] = {}  # every repeat trial Tune holds -> its run
        self._repeat_live: set[str] = set()
        # the indices in `runs` the chooser's next decision waits for, whether it has finished, and the
        # repeat trials that ended, which it decides from
        self._wanted: list[int] = []
        self._chosen_all = False
        self._repeat_ended: dict[str, Ended] = {}
        self._stale = False  # a repeat trial has ended since `choose` was last asked
        self._again: list = []  # the repeat runs a resume makes again (`resume.Held`)
        self.held = {"search": 0, "repeat": 0}  # the runs of each phase a resume's records hold ended
        self._restart_errored = restart_errored
        if records is not None:
            self._resume(records)

    def _resume(self, records) -> None:
        """Start from the repeat runs the records hold (the chooser reads the search trials' records
        itself): the repeat, once begun, is chosen again. `held`: how many of each phase's runs had ended
        (the progress line counts them done)."""
        for h in records.repeats:
            if h.ended:
                self._repeat_ended[h.name] = Ended(h.name, dict(h.config), dict(h.metrics))
            else:
                self._again.append(h)
        ended = sum(h.ended for held in records.search.values() for h in held)
        self.held = {"search": ended, "repeat": len(self._repeat_ended)}

    # -- where it stands -------------------------------------------------------------------------------

    @property
    def phase(self) -> str:
        return "search" if self.runs is None else "repeat"

    # -- what Tune asks ----------------------------------------------------------------------------------

    @property
    def inner(self) -> SearchAlgorithm:
        """The search's algorithm (`searchers.Wrapping`): its metric, and its trials as Tune's start-up
        reports them; the repeat's are known once chosen."""
        return self.search

    def add_configurations(self, experiments) -> None:
        self._experiment = experiment_of(experiments)
        self.search.add_configurations(experiments)

    def next_trial(self):
        if self.runs is None:
            if not self.search.is_finished():
                trial = self.search.next_trial()
                if trial is not None:
                    self._search_live.add(trial.trial_id)
                    return trial
            if self._search_live or not self.search.is_finished():  # a search trial has yet to end
                return None
            self._choose()
        elif self._stale and not self._chosen_all:
            self._choose()
        return self._next_repeat()

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        if trial_id not in self._repeat_configs:
            self.search.on_trial_result(trial_id, result)

    def on_trial_complete(self, trial_id: str, result: Optional[dict] = None, error: bool = False) -> None:
        """`result`: the trial's last result, flattened by Tune (`config/<key>` entries)."""
        if trial_id in self._repeat_configs:
            self._repeat_live.discard(trial_id)
            self._repeat_ended[trial_id] = Ended(trial_id, self._repeat_configs[trial_id], dict(result or {}),
                                                 "the trial errored" if error else None)
            self._stale = True  # a repeat in rounds that has not finished decides again
            return
        self._search_live.discard(trial_id)
        self.search.on_trial_complete(trial_id, result=result, error=error)

    def is_finished(self) -> bool:
        return self.runs is not None and self._chosen_all and all(i in self._made for i in self._wanted)

    # -- the repeat's trials ------------------------------------------------------------------------------

    def _choose(self) -> None:
        """Ask `choose` for the repeat runs its next decision waits for, keeping every run it asked for before
        in `runs` (their indices are what `_made` knows)."""
        self._stale = False
        due, finished = self.choose(list(self._repeat_ended.values()))
        self.runs = list(self.runs or [])
        self.runs += [run for run in due if run not in self.runs]
        self._wanted = [self.runs.index(run) for run in due]
        self._chosen_all = bool(finished)
        for name, ended in self._repeat_ended.items():  # a run the records hold ended: never made again
            index = next((i for i, run in enumerate(self.runs)
                          if i not in self._made and run == ended.config), None)
            if index is not None and name not in self._made.values():
                self._made[index] = name

    def _next_repeat(self):
        if self.max_concurrent and len(self._repeat_live) >= self.max_concurrent:
            return None
        index = next((i for i in self._wanted if i not in self._made), None)
        if index is None:
            return None
        trial = self._make(index)
        self._made[index] = trial.trial_id
        self._repeat_live.add(trial.trial_id)
        self._repeat_configs[trial.trial_id] = copy.deepcopy(self.runs[index])  # without RESUME
        return trial

    def _make(self, index: int):
        """A Tune trial of the repeat run `runs[index]`, from the experiment's spec; its config is the run's
        alone (the search's space, whose domains it would carry, is nothing it reads)."""
        config = copy.deepcopy(self.runs[index])
        held = next((h for h in self._again if h.config == config), None)
        if held is not None:  # a run a resume makes again, in its folder, from its checkpoint
            self._again.remove(held)
            config = held.again(self._restart_errored)
        seed = config[REPEAT].get("train.seed", "?")
        return trial_from_spec(self._experiment.spec, config, f"{index + 1}_repeat_seed={seed}")

