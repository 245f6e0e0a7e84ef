"""The repeat's choosers: which runs of the best configurations a Tune run repeats on new seeds.

Every chooser has one shape (`repeat.Chooser`): `choose(ended repeat trials)` returns (the runs its next
decision waits for, whether it has finished), each run a trial config (`{REPEAT: parameters}`, with its
entrant in a compare). Each reads the search trials from their records on disk, ranked one way (`top_of`):
a fixed repeat (`RepeatBest`, a search's; `BestOfEach`, a compare's) answers all its runs and finished at
once; a repeat in rounds (a compare's race, `RaceOfFinalists`) is asked again each time a repeat trial has
ended, until it says it has finished. Its answer is a function of the records and the ended repeat trials
alone, so a resumed run asks it with the trials the records hold and continues where it stopped
(`repeat.SearchThenRepeat`). Plain data, no Ray: Tune keeps a copy of each in its run.
"""
from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Optional

from augtune.config import from_dict, run_signature, to_dict
from augtune.records import CANDIDATE, ENTRANT, REPEAT, ROUND, knob_schedule, last_reported, searched_schedule
from augtune.search.resume import ENDED, numbers, records_in
from augtune.storage import write_bytes

if TYPE_CHECKING:
    from augtune.search.compare import ComparePlan
    from augtune.search.repeat import Ended

__all__ = ["BestOfEach", "FirstSeedFigures", "RaceOfFinalists", "RepeatBest", "ranked", "repeat_runs",
           "top_of"]


def ranked(scored: list[tuple[float, dict]], mode: str, top: int, signature: Callable[[dict], Any],
           group: Callable[[dict], Any] = lambda params: None) -> list[dict]:
    """The one ranking of search trials, by the last value of the search metric each reported (an
    ASHA-stopped trial's at its last rung), as Tune ranks them: the parameter sets of `scored` ((value,
    parameters) in the order the trials were made: ties go to the first), best first (`mode`), each
    configuration once (`signature`: what its run reads, so two sets that differ only in keys the run never
    reads, `pinda.mu` of a CLAE run, are one), at most `top` of each `group`."""
    out: list[dict] = []
    seen: list = []
    taken: dict = {}
    for _, params in sorted(scored, key=lambda vp: vp[0], reverse=mode == "max"):  # stable
        read, kind = signature(params), group(params)
        if read in seen or taken.get(kind, 0) == top:
            continue
        seen.append(read)
        out.append(params)
        taken[kind] = taken.get(kind, 0) + 1
    return out


@dataclass(frozen=True)
class RepeatBest:
    """The repeat runs of a search (`search.repeat_best`): its `top` best configurations (of each value of
    `per`, when given: the best learning rate of every method, say), from the records of its trials in
    `folder` (`top_of`), once per seed. Plain data."""

    folder: str  # where the search's trials keep their records
    cfg: dict  # the search's config, as a dict

    def __call__(self, repeats: list[Ended] = ()) -> tuple[list[dict], bool]:
        """(every repeat run, True): a fixed repeat is chosen once, from the search trials alone."""
        cfg = from_dict(self.cfg)
        s, rb = cfg.search, cfg.search.repeat_best

        def method(params: dict) -> str:  # the method a trial ran (a search may vary it)
            return "+".join([params.get("method.base", cfg.method.base),
                             *params.get("method.augment", cfg.method.augment)])

        best = top_of(self.folder, s.metric, s.mode, rb.top, method, rb.per) if rb.top else []
        return [{REPEAT: {**params, "train.seed": seed}} for params in best for seed in rb.seeds], True


# -- the search trials' records, ranked; what a compare repeats -----------------------------------

def top_of(folder: str, metric: str, mode: str, k: int, label: Any = None, per: Optional[str] = None) \
        -> list[dict]:
    """The parameters of the `k` best search trials (of each value of the key `per`, when given), best
    first, from their records in `folder` (a local folder or a URI): the last value of `metric` each trial
    that ended reported (an ASHA-stopped trial's at its last rung), as Tune ranks them; ties go to the
    first record (by folder name). With `label` (the method: its label, or a function of the parameters
    where a search varies it), two trials that differ only in keys that method never reads are one
    configuration, taken once; so are two PBT trials with the same schedule (whatever values they ended
    with: the schedule sets them from epoch 1). The seed is the repeat's own to set."""
    scored = []
    for _, record in records_in(str(folder)):  # ties keep the folders' order
        value = last_reported(record, metric)
        if record.get("status") in ENDED and value is not None:
            scored.append((value, {k: v for k, v in replayed(record).items() if k != "train.seed"}))

    def signature(params: dict):
        # a schedule's first step sets its keys from epoch 1 on: a PBT trial's values at the end do not
        # change its replay (a trial that copied its donor at the last epoch is the donor's run again)
        steps = params.get("schedule") or [{}]
        ignore = set(steps[0].get("set", {})) if steps[0].get("epoch") == 1 else set()
        method = label(params) if callable(label) else label
        return (run_signature(params, method, ignore) if method
                else {k: v for k, v in params.items() if k not in ignore})

    return ranked(scored, mode, k, signature, (lambda params: repr(params.get(per))) if per else
                  (lambda params: None))


def replayed(record: dict) -> dict:
    """A search trial's parameters as the repeat runs them: a PBT trial's (its values at the end) with the
    `schedule:` of the values its epochs trained under, donors' epochs included (PBA's replay, from
    scratch on each new seed); two trials are one configuration only with the same schedule."""
    params = dict(record.get("params") or {})
    if searched_schedule(record.get("config")):
        params["schedule"] = knob_schedule(record.get("epochs") or [])
    return params


def epoch_seconds(folder: str) -> float:
    """The mean training time of an epoch over a search's trials (0 when none has reported one). The mean,
    not the median: DiffAug's generator trains in some epochs only, and the median put it among the
    cheapest entrants, though its runs took the longest."""
    times = [e["epoch_time_s"] for _, record in records_in(str(folder)) for e in record.get("epochs") or []
             if isinstance(e, dict) and isinstance(e.get("epoch_time_s"), (int, float))]
    return statistics.fmean(times) if times else 0.0


def repeat_runs(entrants, metric: str, mode: str, seeds, log: Callable[[str], None]) -> list[dict]:
    """Every entrant's best parameters once per seed, as repeat trials' configs (`{REPEAT: parameters,
    ENTRANT: name}`), the costliest entrants first (by their search's epochs): the last runs to start are
    then short ones, and no slot idles through a long one at the end (longest processing time first).
    `entrants`: (name, records folder, base, augment) of each."""
    runs = []
    for name, folder, base, augment in sorted(entrants, key=lambda e: -epoch_seconds(e[1])):
        best = next(iter(top_of(folder, metric, mode, 1)), None)
        if best is None:
            log(f"{name}: no finished search trial; it is left out of the repeat")
            continue
        method = {"method.base": base, "method.augment": list(augment)}
        runs += [{REPEAT: {**best, **method, "train.seed": s}, ENTRANT: name} for s in seeds]
    return runs


def entrants_of(plan: ComparePlan) -> tuple:
    """(name, records folder, base, augment) of each entrant of `plan`: what its choosers read."""
    return tuple((p.name, p.experiment, p.cfg.method.base, tuple(p.cfg.method.augment)) for p in plan.plans)


@dataclass(frozen=True)
class BestOfEach:
    """The repeat of a compare (`repeat.SearchThenRepeat`'s `choose`): every entrant's best search trial,
    from the records on disk, once per shared seed. Plain data."""

    entrants: tuple  # (name, records folder, base, augment) of each
    metric: str
    mode: str
    seeds: tuple

    @classmethod
    def of(cls, plan: ComparePlan) -> BestOfEach:
        s = plan.plans[0].cfg.search
        return cls(entrants_of(plan), s.metric, s.mode, tuple(s.repeat_best.seeds))

    def __call__(self, repeats: list = ()) -> tuple[list[dict], bool]:
        """(every repeat run, True): chosen once, from the records of the search trials."""
        return repeat_runs(self.entrants, self.metric, self.mode, self.seeds, _say), True


@dataclass(frozen=True)
class RaceOfFinalists:
    """The repeat of a compare as a race (`compare.race`; `repeat.SearchThenRepeat` asks it again each time
    a repeat run has ended, until it says it has finished): the candidates are every entrant's
    `finalists` best distinct search trials, from the records on disk (`top_of`: the same in a resumed
    driver); which runs come next and when the race stops is `augtune.analysis.race`'s to decide, from the
    ended repeat runs alone (`replay`): so a resumed run, given the runs its records hold, continues the race
    where it stopped. Each run's config names its candidate (`CANDIDATE`) and round (`ROUND`), which its
    record keeps. Plain data."""

    entrants: tuple  # (name, records folder, base, augment) of each
    metric: str
    mode: str
    compare: dict  # the compare section, as a dict (`race.race_settings` reads it)
    train_seed: int
    experiment: str  # where `race.json` (a snapshot for people, never read back) is written
    said: dict = field(default_factory=dict, compare=False, repr=False)  # rounds already logged

    @classmethod
    def of(cls, plan: ComparePlan) -> RaceOfFinalists:
        s = plan.plans[0].cfg.search
        return cls(entrants_of(plan), s.metric, s.mode, to_dict(plan.cfg)["compare"], plan.cfg.train.seed,
                   plan.experiment)

    def candidates(self) -> list[tuple[str, str, dict]]:
        """(id, entrant, parameters) of every finalist, in the entrants' order, best first."""
        from augtune.analysis.race import candidate_id

        out = []
        for name, folder, base, augment in self.entrants:
            method = {"method.base": base, "method.augment": list(augment)}
            top = top_of(folder, self.metric, self.mode, int(self.compare["race"]["finalists"]), name)
            if not top:
                self._once(f"{name}: no finished search trial; it is left out of the race")
            out += [(candidate_id(name, rank), name, {**params, **method})
                    for rank, params in enumerate(top, 1)]
        return out

    def state(self, repeats: list):
        """The race as the ended repeat trials (`repeat.Ended`) have it (`race.replay`): a run that errored,
        or reported no finite value of the metric, withdraws its candidate, and so does one whose own
        diagnostics say it did not train (`verdict.did_not_train`), as the analysis of the records does."""
        from augtune.analysis.race import failed_candidates, race_settings, replay
        from augtune.analysis.verdict import flagged_candidates

        settings = race_settings(from_dict({"compare": self.compare}).compare, self.train_seed, self.metric)
        records = [race_record(e, settings.metric) for e in repeats]  # on the validation split
        out = {**failed_candidates(records), **flagged_candidates(records)}
        return replay(settings, records, out, self.candidates())

    def __call__(self, repeats: list = ()) -> tuple[list[dict], bool]:
        """(the runs the race's next decision waits for, whether it has stopped), the costliest entrants'
        runs first (`repeat_runs`' reason)."""
        from augtune.analysis.race import due

        state = self.state(list(repeats))
        pending = due(state)
        if state.stopped == "alone" and not state.rounds:  # one entrant: no race, its round 1 all the same
            first = state.settings.seeds[:state.settings.min_seeds]
            pending = [(c.id, s) for c in state.racing for s in first]
        ran = {(e.config.get(CANDIDATE), e.config[REPEAT].get("train.seed")) for e in repeats}
        pending = [cs for cs in pending if cs not in ran]  # a run that ended (or failed) is never asked again
        cost = {name: epoch_seconds(folder) for name, folder, _, _ in self.entrants}
        pending.sort(key=lambda cs: -cost.get(state.candidate(cs[0]).entrant, 0.0))  # stable
        self._report(state)
        seeds = state.settings.seeds
        runs = [{REPEAT: {**state.candidate(cid).params, "train.seed": seed},
                 ENTRANT: state.candidate(cid).entrant, CANDIDATE: cid,
                 ROUND: max(1, seeds.index(seed) - state.settings.min_seeds + 2)} for cid, seed in pending]
        return runs, state.stopped is not None and not pending

    def _report(self, state) -> None:
        """Each round decided since the last call, a line on the console; the state in `race.json`."""
        from augtune.analysis.race import RACE_FILE, history

        lines = history(state)
        for line in lines[self.said.get("lines", 0):]:
            _say(f"race: {line}")
        self.said["lines"] = len(lines)
        try:
            write_bytes(self.experiment, RACE_FILE, json.dumps(state.to_dict(), indent=1).encode())
        except OSError:
            pass  # a snapshot for people: the race is in the records

    def _once(self, line: str) -> None:
        if line not in self.said.setdefault("once", []):
            self.said["once"].append(line)
            _say(line)


def race_record(ended, metric: str) -> dict:
    """An ended repeat trial (`repeat.Ended`: its config, its last result) as the part of its record the
    race reads: entrant, candidate, seed, status and final metrics (a trial that errored, or whose result
    holds no finite value of `metric`, as `failed`)."""
    run, final = ended.config, numbers(ended.metrics or {})
    ok = ended.error is None and math.isfinite(final.get(metric, math.nan))
    return {"entrant": run.get(ENTRANT), "candidate": run.get(CANDIDATE),
            "seed": run[REPEAT].get("train.seed"), "status": "completed" if ok else "failed",
            "final": final, "params": run[REPEAT]}


def _say(line: str) -> None:
    print(line, flush=True)


class FirstSeedFigures:
    """The end-of-run hook of a compare's repeat runs, for the run of the first seed only: the report
    shows one run's figures per entrant, and drawing them for every seed slowed the main job markedly
    (NRCC's UMAP compiles in each process that draws it). `augtune plot` draws any other run's figures
    from its folder."""
    def __init__(self, hook: Callable, seed: int):
        self.hook, self.seed = hook, seed

    def __call__(self, trainer, run_dir, record: dict, log):
        # in a race, the first seed's run of each entrant's best configuration only
        if record.get("seed") == self.seed and str(record.get("candidate") or "#1").endswith("#1"):
            return self.hook(trainer, run_dir, record, log)
        return None
