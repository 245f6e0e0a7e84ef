"""The race of a compare's repeat phase: seeds go to the candidates still in contention, round by
round.

The candidates are the finalists of every entrant's search (`compare.race.finalists` best
configurations of each; a candidate's id is `<entrant>#<rank>`, rank 1 the search's best). Round 1
runs every candidate on the first `min_seeds` shared seeds; each later round gives one more seed to
every candidate still racing. After each round the candidate with the highest mean over the seeds
all racing candidates share is the current best, and every other racing candidate is tested against
it (paired t-test over those seeds, two-sided; see `augtune.analysis.stats` for why this test), the
p-values Holm-corrected over the candidates of the round; one significantly worse is eliminated and
runs no more seeds. The race stops:
- "separated": every candidate still racing is of one entrant (a sibling configuration is no rival:
  the question is which entrant is best);
- "equivalent": with a margin (`compare.margin`, in the metric's units), every pair of racing
  candidates of different entrants is shown equivalent within it (paired TOST);
- "max_seeds": after `max_seeds` seeds;
- "alone": withdrawals (below) left one entrant that no test separated.

A race looks at its data up to max_seeds - min_seeds + 1 times, and testing at `alpha` at every
look would name a false winner far more often than `alpha`. Every look therefore tests at one
constant level (`stats.sequential_level`, Pocock's boundary for the t-test): two equal candidates
are told apart at some look with probability `alpha`. The TOST uses the one-sided level of the same
kind.

A candidate whose run says it did not train (the verdict's SANITY rules: a generator that barely
trained, a collapsed noise) is withdrawn, not eliminated: it runs no more seeds and is never a
rival.

API for the search layer (pure functions on a JSON-able state; nothing here starts a run):

    settings = race_settings(cfg.compare, cfg.train.seed)              # None: no race configured
    finalists = [(candidate_id(entrant, rank), entrant, params), ...]  # rank 1..finalists of each
    flagged = verdict.flagged_candidates(repeat_records)               # runs that did not train
    state = replay(settings, repeat_records, flagged, finalists)       # new, or resumed
    while not state.stopped:
        for cid, seed in due(state):         # the runs the next decision waits for
            ...  a repeat trial of state.candidate(cid).params with train.seed = seed, whose
            ...  record carries "entrant", "candidate": cid and "params" (as repeat records do)
        ...  as they end: state = advance(state, {cid: {seed: record["final"][settings.metric]}})
        ...  a run that failed for good, or whose `verdict.did_not_train(record["final"])` says
        ...  why: state = withdraw(state, cid, reason)
    write_json_atomic(exp / RACE_FILE, state.to_dict())   # each round: for people, not resume

`advance` decides every round its results complete and returns a new state (the old one is left
as it was); `due` is empty once the race has stopped, and lists a round's runs until each has a
result, so the layer may launch them all at once (a round's runs are independent) and call
`advance` as each ends. The finalists must be chosen deterministically from the search records (as
`search.choosers.top_of` ranks an entrant's trials), so that a resumed driver finds the same ones.

Where the state lives: in the repeat records. Each carries its candidate (`candidate`), parameters
(`params`), seed and final metrics; the decisions are a deterministic function of the completed
results, so `replay(settings, records, candidates)` rebuilds the state the race had when its last
run ended, and `augtune resume` continues from there (`due` lists what is missing). Records from
before the race (no `candidate`) count as their entrant's rank-1 configuration. `state.to_dict()` /
`RaceState.from_dict()` round-trip through JSON: `race.json` beside the records is a snapshot
for people and tools, never needed to resume.
"""
from __future__ import annotations

import copy
import math
from dataclasses import asdict, dataclass, field
from typing import Iterable, Mapping, Optional, Sequence

import numpy as np

from augtune.analysis import stats
from augtune.config import CompareConfig
from augtune.records import FRACTION_SUFFIXES, VAL_PREFIX, mode_of

FORMAT = "augtune.race/1"
RACE_FILE = "race.json"  # in a compare experiment's folder: the latest snapshot of its race
STOPS = ("separated", "equivalent", "max_seeds", "alone")


def candidate_id(entrant: str, rank: int) -> str:
    return f"{entrant}#{rank}"


@dataclass(frozen=True)
class RaceSettings:
    metric: str
    seeds: tuple[int, ...]  # the shared seeds in the order they are given out; len = max_seeds
    min_seeds: int = 3
    alpha: float = 0.05
    margin: Optional[float] = None  # equivalence margin in the metric's units; None: no TOST stop
    mode: str = "max"

    def __post_init__(self):
        if not 2 <= self.min_seeds <= len(self.seeds):
            raise ValueError(f"race: min_seeds must be 2 .. max_seeds ({len(self.seeds)}), "
                             f"not {self.min_seeds}")
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError("race: the seeds must be distinct")
        if self.mode not in ("max", "min"):
            raise ValueError(f"race: mode must be max or min, not {self.mode!r}")

    @property
    def max_seeds(self) -> int:
        return len(self.seeds)

    @property
    def looks(self) -> int:
        return self.max_seeds - self.min_seeds + 1

    @property
    def level(self) -> float:
        """Each look's level, two-sided (the elimination tests)."""
        return stats.sequential_level(self.alpha, self.min_seeds, self.max_seeds)

    @property
    def tost_level(self) -> float:
        """Each look's level of each one-sided half of the TOST."""
        return stats.sequential_level(self.alpha, self.min_seeds, self.max_seeds, sides=1)


def race_settings(compare: CompareConfig, train_seed: int, metric: Optional[str] = None
                  ) -> Optional[RaceSettings]:
    """The race of a compare section (`compare.race`, `compare.margin`, `compare.alpha`; of a config as
    written, `from_dict(config).compare`), None when it has no race (`compare.race.enabled: false`, the
    default: a fixed repeat). Its seeds are train_seed + 1 .. + max_seeds, as a fixed repeat's. It
    decides on `metric` (the compare's first) scored on the validation split (`val_<metric>`: a race's
    runs train without it, `dataset.evaluate_on: both`), so the test split the verdict reports is never
    what chose."""
    race = compare.race
    if not race.enabled:
        return None
    first = metric or compare.metrics[0]
    return RaceSettings(VAL_PREFIX + first, tuple(int(train_seed) + i for i in range(1, race.max_seeds + 1)),
                        race.min_seeds, compare.alpha, compare.margin or None, mode_of(first))


@dataclass
class Candidate:
    id: str
    entrant: str
    params: dict = field(default_factory=dict)
    status: str = "racing"  # racing, eliminated, withdrawn
    out_round: Optional[int] = None  # the round that eliminated it
    reason: str = ""  # why withdrawn, or "p = ..." of its elimination


@dataclass
class Round:
    number: int
    n: int  # seeds every racing candidate had
    best: str
    p: dict[str, float]  # raw two-sided p of each tested candidate against the best
    p_holm: dict[str, float]
    eliminated: list[str]
    level: float
    tost: dict[str, float] = field(default_factory=dict)  # "a|b" -> TOST p, when a margin is set


@dataclass
class RaceState:
    settings: RaceSettings
    candidates: list[Candidate]
    # candidate -> seed -> value
    results: dict[str, dict[int, float]] = field(default_factory=dict)
    rounds: list[Round] = field(default_factory=list)
    stopped: Optional[str] = None  # one of STOPS once it has

    def candidate(self, cid: str) -> Candidate:
        for c in self.candidates:
            if c.id == cid:
                return c
        raise KeyError(f"race: no candidate {cid!r}")

    @property
    def racing(self) -> list[Candidate]:
        return [c for c in self.candidates if c.status == "racing"]

    @property
    def n(self) -> int:
        """Seeds decided on so far (0 before round 1)."""
        return self.rounds[-1].n if self.rounds else 0

    @property
    def next_n(self) -> int:
        return self.settings.min_seeds if not self.rounds else self.n + 1

    def runs(self) -> int:
        """Runs the race has had (every result it holds)."""
        return sum(len(v) for v in self.results.values())

    def to_dict(self) -> dict:
        out = {"format": FORMAT, "settings": asdict(self.settings),
               "candidates": [asdict(c) for c in self.candidates],
               "results": {c: {str(s): v for s, v in r.items()} for c, r in self.results.items()},
               "rounds": [asdict(r) for r in self.rounds], "stopped": self.stopped}
        out["settings"]["seeds"] = list(self.settings.seeds)
        return out

    @classmethod
    def from_dict(cls, data: Mapping) -> "RaceState":
        if data.get("format") != FORMAT:
            raise ValueError(f"not a race state (format {data.get('format')!r}, "
                             f"expected {FORMAT!r})")
        s = dict(data["settings"])
        s["seeds"] = tuple(int(x) for x in s["seeds"])
        return cls(RaceSettings(**s), [Candidate(**c) for c in data["candidates"]],
                   {c: {int(k): float(v) for k, v in r.items()}
                    for c, r in data["results"].items()},
                   [Round(**r) for r in data["rounds"]], data.get("stopped"))


# -- the pure steps -------------------------------------------------------------------------------

def _rank(cid: str) -> int:
    tail = cid.rsplit("#", 1)[-1]
    return int(tail) if "#" in cid and tail.isdigit() else 1


def start(settings: RaceSettings, candidates: Iterable[tuple[str, str, dict]]) -> RaceState:
    """A race of `candidates`: (id, entrant, parameters) each. They are kept in one order, by rank
    (`entrant#rank`), entrant and id, whatever order they come in: ties between means go to the
    first, and `replay` must break them as the live race did."""
    cands = [Candidate(cid, entrant, dict(params)) for cid, entrant, params in candidates]
    cands.sort(key=lambda c: (_rank(c.id), c.entrant, c.id))
    if len({c.id for c in cands}) != len(cands):
        raise ValueError("race: candidate ids must be distinct")
    state = RaceState(settings, cands)
    return _stop_if_alone(state)


def due(state: RaceState) -> list[tuple[str, int]]:
    """The runs the next decision waits for: (candidate id, seed), those without a result yet."""
    if state.stopped:
        return []
    seeds = state.settings.seeds[:state.next_n]
    return [(c.id, s) for c in state.racing for s in seeds if s not in state.results.get(c.id, {})]


def advance(state: RaceState, results: Mapping[str, Mapping[int, float]]) -> RaceState:
    """A new state with `results` ({candidate: {seed: value}}) added and every round they complete
    decided. A result for a candidate not in the race is an error; a non-finite value is an error
    too (a run that failed is `withdraw`n, or run again, by the caller)."""
    state = copy.deepcopy(state)
    for cid, by_seed in results.items():
        state.candidate(cid)  # a KeyError naming it when it is not in the race
        for seed, value in by_seed.items():
            if not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"race: {cid} seed {seed}: {value!r} is not a finite number")
            state.results.setdefault(cid, {})[int(seed)] = float(value)
    while not state.stopped and not due(state) and state.racing:
        _decide(state)
    return state


def withdraw(state: RaceState, cid: str, reason: str) -> RaceState:
    """A new state without candidate `cid` (its run cannot be used: it did not train, or
    failed)."""
    state = copy.deepcopy(state)
    c = state.candidate(cid)
    if c.status == "racing":
        c.status, c.reason = "withdrawn", reason
    state = _stop_if_alone(state)
    return advance(state, {})  # the round may be complete without it


def _stop_if_alone(state: RaceState) -> RaceState:
    if not state.stopped and len({c.entrant for c in state.racing}) <= 1:
        eliminated = any(c.status == "eliminated" for c in state.candidates)
        state.stopped = "separated" if eliminated else "alone"
    return state


def _decide(state: RaceState) -> None:
    """Decide the round at `next_n` seeds (every racing candidate has them), in place."""
    s = state.settings
    n = state.next_n
    seeds = s.seeds[:n]
    sign = 1.0 if s.mode == "max" else -1.0
    racing = state.racing
    x = {c.id: sign * np.array([state.results[c.id][k] for k in seeds]) for c in racing}
    best = max(racing, key=lambda c: x[c.id].mean())  # the first of equals: the search's order
    others = [c for c in racing if c is not best]
    p = dict(zip([c.id for c in others], stats.paired_ps(x[best.id], [x[c.id] for c in others])))
    q = dict(zip(p, stats.holm(list(p.values()))))
    out = [cid for cid in p if q[cid] < s.level]
    for cid in out:
        c = state.candidate(cid)
        c.status, c.out_round = "eliminated", len(state.rounds) + 1
        c.reason = f"Holm p = {q[cid]:.3g}"
    rnd = Round(len(state.rounds) + 1, n, best.id, p, q, out, s.level)
    state.rounds.append(rnd)
    left = state.racing
    if len({c.entrant for c in left}) <= 1:
        state.stopped = "separated"
        return
    if s.margin:
        rnd.tost = {f"{a.id}|{b.id}": stats.tost_p(x[a.id], x[b.id], s.margin)
                    for i, a in enumerate(left) for b in left[i + 1:] if a.entrant != b.entrant}
        if all(v < s.tost_level for v in rnd.tost.values()):
            state.stopped = "equivalent"
            return
    if n >= s.max_seeds:
        state.stopped = "max_seeds"


# -- from the records -----------------------------------------------------------------------------

def candidate_of(record: Mapping) -> str:
    """A repeat record's candidate (records from before the race: its entrant's one
    configuration)."""
    entrant = record.get("entrant") or record["method"]
    return str(record.get("candidate") or candidate_id(entrant, 1))


def failed_candidates(records: Sequence[Mapping]) -> dict[str, str]:
    """{candidate: why}: the candidates a run of which failed for good (status `failed`, a NaN loss
    say): the search layer withdraws them as their runs fail, so the records must too. A run lost with a
    killed driver (error "lost: ...", as earlier versions' resume wrote it) was made again, and a seed with
    a completed run of the candidate has its result: neither withdraws it."""
    done = {(candidate_of(r), r.get("seed")) for r in records if r.get("status") == "completed"}
    out: dict[str, str] = {}
    for r in records:
        lost = str(r.get("error") or "").startswith("lost:")
        if r.get("status") == "failed" and not lost and (candidate_of(r), r.get("seed")) not in done:
            out.setdefault(candidate_of(r), f"its run on seed {r.get('seed')} failed")
    return out


def replay(settings: RaceSettings, records: Sequence[Mapping],
           flagged: Optional[Mapping[str, str]] = None,
           candidates: Optional[Iterable[tuple[str, str, dict]]] = None) -> RaceState:
    """The race as the repeat runs' records on disk have it: its `candidates` ((id, entrant,
    parameters) each; None: those the records name), their results on `settings.metric`
    (completed runs), the candidates `flagged` ({id: reason}: did not train, see
    `verdict.flagged_candidates`) withdrawn, every round the results complete decided. The
    decisions only depend on the results, so this is the state the race had when its last run
    ended: the state to resume from (with no records: a new race)."""
    cands = {cid: (entrant, dict(params)) for cid, entrant, params in candidates or ()}
    results: dict[str, dict[int, float]] = {}
    for r in records:
        cid = candidate_of(r)
        if candidates is not None and cid not in cands:
            continue  # a run of another race (finalists chosen otherwise): decides nothing
        cands.setdefault(cid, (r.get("entrant") or r["method"], dict(r.get("params") or {})))
        v = (r.get("final") or {}).get(settings.metric)
        if r.get("status") == "completed" and isinstance(v, (int, float)) and math.isfinite(v):
            if int(r["seed"]) in settings.seeds:
                results.setdefault(cid, {})[int(r["seed"])] = float(v)
    state = start(settings, [(c, entrant, params) for c, (entrant, params) in cands.items()])
    for cid, reason in (flagged or {}).items():
        if cid in cands:
            state = withdraw(state, cid, reason)
    return _replay_rounds(state, results)


def _replay_rounds(state: RaceState, results: Mapping[str, Mapping[int, float]]) -> RaceState:
    """Feed the results one round at a time, so that a candidate eliminated in round r keeps only
    the results it had then (a run of it made after, by hand, decides nothing)."""
    state = copy.deepcopy(state)
    while not state.stopped and state.racing:
        seeds = state.settings.seeds[:state.next_n]
        batch = {c.id: {s: results[c.id][s] for s in seeds if s in results.get(c.id, {})}
                 for c in state.racing}
        before = len(state.rounds)
        state = advance(state, batch)
        if len(state.rounds) == before:
            break  # a run of this round is missing: the race resumes from here
    return state


def history(state: RaceState) -> list[str]:
    """The rounds in words, one line each (who was eliminated when)."""
    lines = []
    for r in state.rounds:
        out = ", ".join(f"{c} ({r.p_holm[c]:.2g})" for c in r.eliminated) or "nobody"
        lines.append(f"round {r.number} (n = {r.n}): best {r.best}; eliminated (Holm p): {out}")
    if state.stopped:
        lines.append(f"stopped: {describe_stop(state)}")
    return lines


def describe_stop(state: RaceState) -> str:
    s = state.settings
    return {"separated": "one entrant separated from every other",
            "equivalent": f"every remaining pair equivalent within ±{_pts(s.metric, s.margin)}",
            "max_seeds": f"at max_seeds ({s.max_seeds}) with no entrant separated",
            "alone": "only one entrant left (the others withdrawn)",
            }.get(state.stopped or "", "racing")


def _pts(metric: str, v: Optional[float]) -> str:
    if v is None:
        return "–"
    return f"{100 * v:.2g} points" if metric.endswith(FRACTION_SUFFIXES) else f"{v:.3g}"
