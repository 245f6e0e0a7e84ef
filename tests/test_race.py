"""The race of a compare's repeat phase, on fabricated results: its elimination and stopping rules,
its error rate under the null over many seeds, and its state through JSON and through the records
(what `augtune resume` continues from)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from augtune.analysis import race, stats
from augtune.analysis.race import RaceSettings, advance, due, replay, start, withdraw

SEEDS = tuple(range(11, 21))  # train.seed 10, max_seeds 10


def settings(**kw) -> RaceSettings:
    return RaceSettings("knn_acc", kw.pop("seeds", SEEDS), **{"min_seeds": 3, **kw})


def run(state, values: dict[str, np.ndarray], log=None):
    """Race to the end: every due run gets values[candidate][index of its seed]."""
    index = {s: i for i, s in enumerate(state.settings.seeds)}
    while not state.stopped:
        runs = due(state)
        assert runs, "a race that has not stopped always waits for some run"
        if log is not None:
            log.append(runs)
        got: dict[str, dict[int, float]] = {}
        for cid, seed in runs:
            got.setdefault(cid, {})[seed] = float(values[cid][index[seed]])
        state = advance(state, got)
    return state


def draw(rng, means: dict[str, float], sd: float = 0.01, shared: float = 0.005,
         n: int = len(SEEDS)) -> dict[str, np.ndarray]:
    """Per-seed results: the candidate's mean, a seed effect every candidate shares, own noise."""
    seed_effect = shared * rng.standard_normal(n)
    return {c: mu + seed_effect + sd * rng.standard_normal(n) for c, mu in means.items()}


def three(**kw):
    return start(
        settings(**kw), [("a#1", "a", {"train.lr": 0.1}), ("b#1", "b", {}), ("c#1", "c", {})]
    )


def test_round_one_runs_min_seeds_then_one_more_seed_per_round():
    s = three()
    assert due(s) == [(c, k) for c in ("a#1", "b#1", "c#1") for k in SEEDS[:3]]
    s = advance(s, {"a#1": {11: 0.9, 12: 0.91}})
    assert s.rounds == [] and len(due(s)) == 7  # nothing is decided on part of a round
    rng = np.random.default_rng(0)
    equal = draw(rng, {"a#1": 0.9, "b#1": 0.9, "c#1": 0.9})
    s = advance(s, {c: {k: equal[c][SEEDS.index(k)] for _, k in due(s) if _ == c} for c in equal})
    assert len(s.rounds) == 1 and s.rounds[0].n == 3
    assert sorted(due(s)) == sorted((c.id, 14) for c in s.racing)


def test_a_clear_winner_is_separated_in_few_rounds_over_many_seeds():
    for seed in range(40):
        rng = np.random.default_rng(seed)
        s = run(three(), draw(rng, {"a#1": 0.95, "b#1": 0.80, "c#1": 0.70}, sd=0.005))
        assert s.stopped == "separated" and [c.id for c in s.racing] == ["a#1"]
        assert len(s.rounds) <= 3, (seed, race.history(s))
        assert s.runs() < 3 * len(SEEDS) / 2  # far fewer runs than every candidate on every seed


def test_an_eliminated_candidate_gets_no_more_seeds():
    rng = np.random.default_rng(3)
    values = draw(rng, {"a#1": 0.95, "b#1": 0.945, "c#1": 0.60}, sd=0.01)
    log: list = []
    s = run(three(), values, log)
    c = s.candidate("c#1")
    assert c.status == "eliminated" and c.out_round == 1
    assert len(s.results["c#1"]) == 3  # its round-1 seeds only
    assert all(cid != "c#1" for runs in log[1:] for cid, _ in runs)
    assert "c#1" in s.rounds[0].eliminated and s.rounds[0].p_holm["c#1"] < s.settings.level


def test_equal_candidates_run_to_max_seeds_without_a_margin():
    ends = []
    for seed in range(60):
        rng = np.random.default_rng(100 + seed)
        s = run(three(), draw(rng, {"a#1": 0.9, "b#1": 0.9, "c#1": 0.9}))
        ends.append(s.stopped)
        if s.stopped == "max_seeds":
            assert s.n == len(SEEDS) and all(len(s.results[c.id]) == len(SEEDS) for c in s.racing)
    assert ends.count("max_seeds") >= 54  # a false winner at most ~alpha of the time


def test_equal_candidates_are_shown_equivalent_within_a_wide_margin():
    for seed in range(20):
        rng = np.random.default_rng(200 + seed)
        s = run(three(margin=0.05), draw(rng, {"a#1": 0.9, "b#1": 0.9, "c#1": 0.9}, sd=0.004))
        assert s.stopped == "equivalent", race.history(s)
        assert s.n < len(SEEDS)  # they stop early: no more seeds are needed to say so
        assert all(p < s.settings.tost_level for p in s.rounds[-1].tost.values())


def test_siblings_are_no_rivals_the_race_stops_when_one_entrant_is_left():
    s = start(settings(), [("a#1", "a", {}), ("a#2", "a", {}), ("b#1", "b", {})])
    rng = np.random.default_rng(7)
    s = run(s, draw(rng, {"a#1": 0.95, "a#2": 0.95, "b#1": 0.70}, sd=0.005))
    assert s.stopped == "separated" and {c.entrant for c in s.racing} == {"a"}
    assert len(s.rounds) <= 3  # the two equal configurations of `a` do not have to be told apart


def test_the_false_winner_rate_under_the_null_is_at_most_alpha():
    """Two equal candidates, the worst case (one rejection names a winner): tested at alpha at
    every look the race would name one far more often; at the sequential level it stays near
    alpha."""
    named, naive = 0, 0
    trials = 600
    for seed in range(trials):
        rng = np.random.default_rng(1000 + seed)
        values = draw(rng, {"a#1": 0.9, "b#1": 0.9})
        s = run(start(settings(), [("a#1", "a", {}), ("b#1", "b", {})]), values)
        named += s.stopped == "separated"
        naive += any(stats.paired_p(values["a#1"][:n], values["b#1"][:n]) < 0.05
                     for n in range(3, len(SEEDS) + 1))
    sd = np.sqrt(0.05 * 0.95 / trials)
    assert named / trials < 0.05 + 3 * sd
    assert naive / trials > 0.05 + 3 * sd  # why the level is not alpha at each look


def test_the_sequential_level_holds_alpha_on_fresh_null_races():
    level = stats.sequential_level(0.05, 3, 10)
    assert 0.005 < level < 0.05  # stricter than alpha, far looser than Bonferroni over 8 looks ...
    assert level > 0.05 / 8
    from scipy import stats as sps

    rng = np.random.default_rng(12345)  # ... and right: other draws than those it was found on
    d = rng.standard_normal((40000, 10))  # the paired differences of null races
    p = np.stack([sps.ttest_1samp(d[:, :n], 0, axis=1).pvalue for n in range(3, 11)], axis=1)
    rate = (p.min(axis=1) < level).mean()
    assert abs(rate - 0.05) < 3 * np.sqrt(0.05 * 0.95 / len(p))
    assert stats.sequential_level(0.05, 5, 5) == 0.05  # one look: alpha itself


def test_the_state_round_trips_through_json_and_continues_the_same():
    rng = np.random.default_rng(11)
    values = draw(rng, {"a#1": 0.92, "b#1": 0.91, "c#1": 0.80})
    s = three(margin=0.002)
    for _ in range(2):  # two rounds, then save
        s = advance(s, _results(due(s), values))
    text = json.dumps(s.to_dict())
    back = race.RaceState.from_dict(json.loads(text))
    assert back.to_dict() == s.to_dict()
    assert run(back, values).to_dict() == run(s, values).to_dict()
    with pytest.raises(ValueError, match="not a race state"):
        race.RaceState.from_dict({"format": "other"})


def _results(runs, values):
    index = {k: i for i, k in enumerate(SEEDS)}
    got: dict = {}
    for cid, k in runs:
        got.setdefault(cid, {})[k] = float(values[cid][index[k]])
    return got


def records_of(state, values, extra=()) -> list[dict]:
    """The repeat records a race leaves: one per run it made."""
    index = {k: i for i, k in enumerate(state.settings.seeds)}
    out = []
    for c in state.candidates:
        for k in state.results.get(c.id, {}):
            out.append({"status": "completed", "method": c.entrant, "entrant": c.entrant,
                        "candidate": c.id, "seed": k, "params": c.params,
                        "final": {"knn_acc": float(values[c.id][index[k]])}})
    return out + list(extra)


def test_replay_from_the_records_resumes_where_the_race_stopped():
    rng = np.random.default_rng(5)
    values = draw(rng, {"a#1": 0.93, "b#1": 0.925, "c#1": 0.85})
    s = three()
    for _ in range(3):  # three rounds, then the driver dies
        s = advance(s, _results(due(s), values))
    s = advance(s, _results(due(s)[:1], values))  # one run of round 4 had finished
    records = records_of(s, values)
    records.append(
        {"status": "failed", "entrant": "b", "candidate": "b#1", "seed": 99, "final": {}}
    )
    back = replay(s.settings, records)
    assert back.to_dict() == s.to_dict()  # the same decisions, results and candidates' parameters
    assert due(back) == due(s) and len(due(back)) == len(s.racing) - 1
    assert run(back, values).to_dict() == run(s, values).to_dict()


def test_replay_ignores_runs_made_after_an_elimination():
    rng = np.random.default_rng(3)
    values = draw(rng, {"a#1": 0.95, "b#1": 0.945, "c#1": 0.60}, sd=0.01)
    s = run(three(), values)
    late = {"status": "completed", "entrant": "c", "candidate": "c#1", "seed": SEEDS[5],
            "final": {"knn_acc": 0.99}}  # a run of an eliminated candidate, made by hand
    assert replay(s.settings, records_of(s, values, [late])).rounds == s.rounds


def test_withdrawn_candidates_run_no_more_and_leave_the_race():
    s = withdraw(three(), "c#1", "generator barely trained: 12 updates")
    assert all(cid != "c#1" for cid, _ in due(s))
    s = withdraw(s, "b#1", "failed")
    assert s.stopped == "alone" and due(s) == []  # one entrant left, and no test separated it
    flagged = replay(settings(), [{"status": "completed", "entrant": e, "candidate": f"{e}#1",
                                   "seed": 11, "final": {"knn_acc": 0.9}} for e in "abc"],
                     {"c#1": "pi-noise collapsed"})
    assert flagged.candidate("c#1").status == "withdrawn"


def test_settings_from_the_compare_section():
    from augtune.config import from_dict

    def compare(section):
        return from_dict({"compare": section}).compare

    assert race.race_settings(compare({"metrics": ["knn_acc"]}), 10) is None  # the config's default: off
    # a race section that does not say `enabled` is off too: the analysis and the config agree
    assert race.race_settings(compare({"race": {"min_seeds": 3, "max_seeds": 10}}), 10) is None
    on = {"enabled": True, "min_seeds": 3, "max_seeds": 10, "finalists": 2}
    s = race.race_settings(compare({"race": on, "margin": 0.005, "alpha": 0.01,
                                    "metrics": ["sr_acc", "knn_acc"]}), 10)
    assert s.seeds == SEEDS and s.min_seeds == 3 and s.margin == 0.005 and s.alpha == 0.01
    assert s.metric == "val_sr_acc"  # the first metric, on the validation split: the race never reads test
    with pytest.raises(ValueError, match="min_seeds"):
        RaceSettings("knn_acc", SEEDS, min_seeds=1)
    with pytest.raises(KeyError, match="zz"):
        advance(three(), {"zz": {11: 0.5}})
    with pytest.raises(ValueError, match="finite"):
        advance(three(), {"a#1": {11: float("nan")}})


def test_replay_with_the_finalists_given_starts_or_resumes_the_same_race():
    finalists = [("b#1", "b", {}), ("c#1", "c", {}), ("a#1", "a", {"train.lr": 0.1})]
    fresh = replay(settings(), [], candidates=finalists)
    assert fresh.to_dict() == three().to_dict()  # no records: a new race, in the canonical order
    assert due(fresh) == due(three())
    stray = {"status": "completed", "entrant": "d", "candidate": "d#1", "seed": 11,
             "final": {"knn_acc": 0.99}}  # a run of a finalist chosen otherwise: no candidate here
    assert [c.id for c in replay(settings(), [stray], candidates=finalists).candidates] == \
        ["a#1", "b#1", "c#1"]
