"""The race wired into a compare's repeat phase (`compare.race`): `choosers.RaceOfFinalists` gives out the
runs round by round from the ended repeat trials alone, `repeat.SearchThenRepeat` asks it again as each
repeat trial ends, and a restored run (within a round, or between two) continues the race with nothing
run twice. Fabricated search records and real Tune trial objects, without a Ray runtime; one real
compare at the end (`ray`, `slow`)."""
from __future__ import annotations

import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from ray import cloudpickle, tune
from ray.tune.experiment import Experiment, Trial

from augtune.config import ConfigError, load_config, to_dict
from augtune.records import CANDIDATE, ENTRANT, REPEAT, RESUME, ROUND
from augtune.search.choosers import FirstSeedFigures, RaceOfFinalists, race_record, top_of
from augtune.search.repeat import Ended, SearchThenRepeat
from augtune.search.resume import Held, Records
from augtune.search.searchers import Continuing, VariantGenerator, limited
from conftest import sigkill_driver

ROOT = Path(__file__).resolve().parents[1]
GRID = {"train.lr": tune.grid_search([0.1, 0.2])}


def _search_records(folder: Path, scores: dict[float, float]) -> None:
    """An entrant's search trials on disk: {lr: the knn_acc its last epoch reported}."""
    for i, (lr, value) in enumerate(scores.items()):
        (folder / f"t{i}").mkdir(parents=True)
        record = {"format": "augtune.record/1", "status": "completed", "params": {"train.lr": lr},
                  "epochs": [{"epoch": 1, "knn_acc": value, "epoch_time_s": 1.0}]}
        (folder / f"t{i}" / "record.json").write_text(json.dumps(record))


def _race(tmp_path: Path, names=("a", "b", "c"), finalists: int = 2, min_seeds: int = 3,
          max_seeds: int = 6, margin=None) -> RaceOfFinalists:
    entrants = []
    for name in names:
        _search_records(tmp_path / name, {0.1: 0.9, 0.2: 0.8, 0.3: 0.7})
        entrants.append((name, str(tmp_path / name), "simclr", (name,)))
    cfg = load_config(None, ["compare.race.enabled=true", f"compare.race.finalists={finalists}",
                             f"compare.race.min_seeds={min_seeds}", f"compare.race.max_seeds={max_seeds}",
                             "train.seed=10"] + ([f"compare.margin={margin}"] if margin else []))
    return RaceOfFinalists(tuple(entrants), "knn_acc", "max", to_dict(cfg)["compare"], 10, str(tmp_path))


def _value(run: dict, means: dict[str, float]) -> float:
    """A repeat run's knn_acc: its candidate's mean plus a noise of its seed (the same for every
    candidate, as a seed's shared effect is) and one of the run's own (seeded: the same every time)."""
    seed, cid = run[REPEAT]["train.seed"], run[CANDIDATE]
    return means[cid] + 0.01 * ((seed * 7) % 5) + random.Random(f"run {cid} {seed}").gauss(0, 0.005)


def _ended(run: dict, means: dict[str, float], i: int) -> Ended:
    """The run's result: `_value` on the validation split, which the race decides on; on the test split
    the order reversed, so a race that read the test split would decide otherwise."""
    value = _value(run, means)
    return Ended(f"r{i}", run, {"val_knn_acc": value, "knn_acc": 1 - value, "epoch": 6})


def _run_race(choose, means) -> tuple[list[list[dict]], bool]:
    """Every round of the race, each run ended as soon as it is given out."""
    rounds, ended = [], []
    while True:
        runs, finished = choose(ended)
        if finished:
            return rounds, finished
        assert runs, "a race that has not finished waits for runs"
        rounds.append(runs)
        ended += [_ended(r, means, len(ended) + i) for i, r in enumerate(runs)]


def test_round_one_is_every_entrants_finalists_on_min_seeds_each_run_naming_its_candidate_and_round(
        tmp_path):
    choose = _race(tmp_path)
    runs, finished = choose([])
    assert not finished and len(runs) == 3 * 2 * 3
    assert {(r[CANDIDATE], r[REPEAT]["train.seed"]) for r in runs} == {
        (f"{e}#{k}", s) for e in "abc" for k in (1, 2) for s in (11, 12, 13)}
    assert {r[ROUND] for r in runs} == {1}
    one = next(r for r in runs if r[CANDIDATE] == "b#2")
    # the entrant's second-best search trial, with its method, re-run: not trusted from its one search run
    assert one[ENTRANT] == "b" and one[REPEAT]["train.lr"] == 0.2
    assert one[REPEAT]["method.augment"] == ["b"] and one[REPEAT]["method.base"] == "simclr"
    assert choose([]) == (runs, False)  # a function of the ended runs alone


def test_a_clear_winner_is_separated_in_few_rounds(tmp_path):
    choose = _race(tmp_path)
    means = {"a#1": 0.95, "a#2": 0.94, "b#1": 0.80, "b#2": 0.79, "c#1": 0.70, "c#2": 0.69}
    rounds, _ = _run_race(choose, means)
    assert len(rounds) <= 2
    state = choose.state([_ended(r, means, i) for i, r in enumerate(sum(rounds, []))])
    assert state.stopped == "separated" and {c.entrant for c in state.racing} == {"a"}
    assert json.loads((tmp_path / "race.json").read_text())["stopped"] == "separated"  # for people


def test_an_eliminated_candidate_gets_no_more_seeds_and_later_rounds_add_one_seed(tmp_path):
    choose = _race(tmp_path, names=("a", "b", "c"), finalists=1, max_seeds=8)
    # a and b close (the noise keeps them apart for a while), c far behind: out in round 1
    means = {"a#1": 0.90, "b#1": 0.899, "c#1": 0.50}
    rounds, _ = _run_race(choose, means)
    assert {r[CANDIDATE] for r in rounds[0]} == {"a#1", "b#1", "c#1"}
    assert all("c#1" not in {r[CANDIDATE] for r in later} for later in rounds[1:])
    for n, later in enumerate(rounds[1:], start=2):  # one more seed each, the next one, named by its round
        assert sorted(r[CANDIDATE] for r in later) == ["a#1", "b#1"]
        assert {r[REPEAT]["train.seed"] for r in later} == {10 + 3 + n - 1}
        assert {r[ROUND] for r in later} == {n}


def test_equal_candidates_run_to_max_seeds_or_are_shown_equivalent_within_a_margin(tmp_path):
    means = {"a#1": 0.9, "b#1": 0.9}
    plain = _race(tmp_path / "plain", names=("a", "b"), finalists=1, max_seeds=5)
    rounds, _ = _run_race(plain, means)
    assert len(rounds) == 3 and sum(len(r) for r in rounds) == 2 * 5  # seeds 3, 4, 5
    ended = [_ended(r, means, i) for i, r in enumerate(sum(rounds, []))]
    assert plain.state(ended).stopped == "max_seeds"
    wide = _race(tmp_path / "wide", names=("a", "b"), finalists=1, max_seeds=5, margin=0.05)
    rounds, _ = _run_race(wide, means)
    ended = [_ended(r, means, i) for i, r in enumerate(sum(rounds, []))]
    assert wide.state(ended).stopped == "equivalent" and sum(len(r) for r in rounds) < 2 * 5


def test_a_failed_run_or_one_that_did_not_train_withdraws_its_candidate(tmp_path):
    choose = _race(tmp_path, names=("a", "b", "c"), finalists=1)
    runs, _ = choose([])
    means = {"a#1": 0.9, "b#1": 0.9, "c#1": 0.9}
    ended = [_ended(r, means, i) for i, r in enumerate(runs)]
    ended[0] = Ended("r0", runs[0], {}, "the trial errored")
    bad = next(i for i, r in enumerate(runs) if r[CANDIDATE] != runs[0][CANDIDATE])
    ended[bad] = Ended(f"r{bad}", runs[bad], {"val_knn_acc": 0.9, "knn_acc": 0.9, "pinda_noise_norm": 0.0})
    state = choose.state(ended)
    out = {c.id: c.reason for c in state.candidates if c.status == "withdrawn"}
    assert set(out) == {runs[0][CANDIDATE], runs[bad][CANDIDATE]}
    assert "failed" in out[runs[0][CANDIDATE]] and "collapsed" in out[runs[bad][CANDIDATE]]
    assert state.stopped == "alone" and choose(ended) == ([], True)
    assert race_record(ended[0], "knn_acc")["status"] == "failed"


def test_one_entrant_has_no_race_but_its_round_one(tmp_path):
    choose = _race(tmp_path, names=("a",), finalists=2)
    runs, finished = choose([])
    assert not finished and len(runs) == 2 * 3
    assert choose([_ended(r, {"a#1": 0.9, "a#2": 0.8}, i) for i, r in enumerate(runs)]) == ([], True)


def test_a_pbt_entrant_races_its_best_schedules_each_replayed_from_scratch(tmp_path):
    """A PBT entrant's finalists are its best trials' schedules (the values each epoch trained under, the
    donors' epochs included), each a candidate of its own; a constant's finalists carry none. The race
    treats them as any candidate: the best schedule can separate itself from the constant."""
    def pbt_trial(name: str, lrs: list[float], value: float) -> None:
        (tmp_path / "pbt" / name).mkdir(parents=True)
        record = {"format": "augtune.record/1", "status": "completed", "params": {"train.lr": lrs[-1]},
                  "config": {"search": {"scheduler": "pbt"}},
                  "epochs": [{"epoch": i, "knn_acc": value, "knobs": {"train.lr": lr}}
                             for i, lr in enumerate(lrs, 1)]}
        (tmp_path / "pbt" / name / "record.json").write_text(json.dumps(record))

    pbt_trial("t0", [0.1, 0.1, 0.3, 0.3], 0.9)
    pbt_trial("t1", [0.3, 0.3, 0.3, 0.3], 0.85)  # the same last value, another schedule: another candidate
    pbt_trial("t2", [0.1, 0.1, 0.3, 0.3], 0.8)  # t0's schedule again: not a third finalist
    _search_records(tmp_path / "asha", {0.1: 0.9, 0.2: 0.8})
    cfg = load_config(None, ["compare.race.enabled=true", "compare.race.min_seeds=3",
                             "compare.race.max_seeds=6", "train.seed=10"])
    choose = RaceOfFinalists((("simclr", str(tmp_path / "asha"), "simclr", ()),
                              ("simclr@pbt", str(tmp_path / "pbt"), "simclr", ())),
                             "knn_acc", "max", to_dict(cfg)["compare"], 10, str(tmp_path))
    runs, _ = choose([])
    first = {r[CANDIDATE]: r[REPEAT] for r in runs}
    assert set(first) == {"simclr#1", "simclr#2", "simclr@pbt#1", "simclr@pbt#2"}
    assert first["simclr@pbt#1"]["schedule"] == [{"epoch": 1, "set": {"train.lr": 0.1}},
                                                 {"epoch": 3, "set": {"train.lr": 0.3}}]
    assert first["simclr@pbt#2"]["schedule"] == [{"epoch": 1, "set": {"train.lr": 0.3}}]
    assert "schedule" not in first["simclr#1"] and "schedule" not in first["simclr#2"]
    assert {r[ENTRANT] for r in runs if r[CANDIDATE].startswith("simclr@pbt")} == {"simclr@pbt"}
    means = {"simclr#1": 0.80, "simclr#2": 0.79, "simclr@pbt#1": 0.90, "simclr@pbt#2": 0.70}
    rounds, _ = _run_race(choose, means)
    ended = [_ended(r, means, i) for i, r in enumerate(sum(rounds, []))]
    state = choose.state(ended)
    assert state.stopped == "separated" and [c.id for c in state.racing] == ["simclr@pbt#1"]


def test_the_finalists_are_the_best_distinct_configurations_ties_to_the_first(tmp_path):
    _search_records(tmp_path / "e", {0.1: 0.8, 0.2: 0.9, 0.3: 0.8, 0.4: 0.5})
    assert top_of(tmp_path / "e", "knn_acc", "max", 3) == [{"train.lr": 0.2}, {"train.lr": 0.1},
                                                            {"train.lr": 0.3}]
    assert top_of(tmp_path / "e", "knn_acc", "min", 1) == [{"train.lr": 0.4}]
    # a key the method never reads does not make another configuration (pinda.mu of a plain simclr)
    for i, mu in enumerate((0.1, 0.2)):
        (tmp_path / "s" / f"t{i}").mkdir(parents=True)
        (tmp_path / "s" / f"t{i}" / "record.json").write_text(json.dumps({
            "format": "augtune.record/1", "status": "completed", "params": {"train.lr": 0.1, "pinda.mu": mu},
            "epochs": [{"epoch": 1, "knn_acc": 0.9 - i / 10}]}))
    assert len(top_of(tmp_path / "s", "knn_acc", "max", 2, "simclr")) == 1


# -- in the Tune run: SearchThenRepeat asks again as each repeat trial ends -------------------------------


def _trainable(config):
    pass


def _algorithm(choose, limit: int = 4, records: Records | None = None) -> SearchThenRepeat:
    """The Tune run's algorithm, as `tune_run` builds it; `records`: resumed from what they hold."""
    held = records.search.get(None, []) if records is not None else []
    search = Continuing(limited(VariantGenerator(), limit), limit, [h.again() for h in held if not h.ended],
                        [h.made for h in held], len(held))
    alg = SearchThenRepeat(search, choose, limit, records)
    alg.set_search_properties("knn_acc", "max", GRID)
    alg.add_configurations([Experiment("exp", run=_trainable, config=GRID, storage_path=tempfile.mkdtemp(),
                                       resources_per_trial={"cpu": 1})])
    return alg


def _drain(alg) -> list[Trial]:
    return list(iter(alg.next_trial, None))


def _end(alg, trial: Trial, means: dict) -> None:
    """What Tune does when a trial ends: its last result, flattened, to the search algorithm."""
    trial.set_status(Trial.TERMINATED)
    value = _value(trial.config, means) if CANDIDATE in trial.config else 0.5
    scores = {"knn_acc": value, "val_knn_acc": value}  # a search trial's knn_acc is on the validation split
    trial.run_metadata.last_result = {**scores, "epoch": 6, "config": trial.config}
    flat = {**scores, "epoch": 6, **{f"config/{k}": v for k, v in trial.config.items()}}
    alg.on_trial_complete(trial.trial_id, result=flat)


def _key(trial: Trial) -> tuple:
    return trial.config[CANDIDATE], trial.config[REPEAT]["train.seed"]


MEANS = {"a#1": 0.90, "a#2": 0.88, "b#1": 0.899, "b#2": 0.70, "c#1": 0.60, "c#2": 0.50}


def _finish(alg, live: list[Trial], made: list[Trial]) -> None:
    """Run the repeat to its end: the oldest live trial ends, the algorithm gives out what it will."""
    live += _drain(alg)
    made += live
    while live:
        _end(alg, live.pop(0), MEANS)
        new = _drain(alg)
        live += new
        made += new


def _search_phase(alg) -> list[Trial]:
    search = _drain(alg)
    for t in search:
        _end(alg, t, MEANS)
    return search


def test_the_repeat_runs_the_race_round_by_round_to_its_stop(tmp_path):
    choose = _race(tmp_path)
    alg = _algorithm(choose)
    _search_phase(alg)
    made: list[Trial] = []
    first = _drain(alg)
    assert len(first) == 4 and alg.phase == "repeat" and not alg.is_finished()  # 4 at a time
    _finish(alg, first, made)
    assert alg.is_finished()
    keys = [_key(t) for t in made]
    assert len(keys) == len(set(keys))  # no run made twice
    assert len(keys) > 18  # round 1 (18 runs), then more rounds for those still racing
    ended = [Ended(t.trial_id, t.config, {"val_knn_acc": _value(t.config, MEANS)}) for t in made]
    state = choose.state(ended)
    assert state.stopped is not None
    for c in state.candidates:  # every run given out is the race's: no seed beyond a candidate's last round
        seeds = {s for cid, s in keys if cid == c.id}
        n = state.rounds[c.out_round - 1].n if c.out_round else state.n
        assert seeds == set(state.settings.seeds[:n]), c.id


def _held(trial: Trial) -> Held:
    """A trial as its record tells it (`resume.read_records`): one that ended with its last result, any
    other (running when the driver was killed) with the checkpoint it continues from."""
    config = {k: v for k, v in trial.config.items() if k != RESUME}
    if trial.status == Trial.TERMINATED:
        metrics = {k: v for k, v in trial.last_result.items() if k in ("knn_acc", "val_knn_acc", "epoch")}
        return Held(trial.trial_id, config, "completed", metrics, {"folder": trial.trial_id}, config)
    return Held(trial.trial_id, config, "running", {},
                {"folder": trial.trial_id, "checkpoint": f"/ckpt/{trial.trial_id}", "epoch": 3}, config)


@pytest.mark.parametrize("when", ["within_a_round", "between_rounds", "before_the_repeat"])
def test_a_resumed_run_continues_the_race_where_it_stopped_with_nothing_run_twice(tmp_path, when):
    """The driver killed (SIGKILL: the records are what is left) within a round (some of its runs ended,
    some running, some not yet made), between two rounds (the last round's runs all ended, the next not
    yet made), or before the repeat began: resumed from the records, it makes again the runs left
    part-way (from their checkpoints), makes only the runs the race is missing, and the race ends as the
    uninterrupted one did."""
    whole = _algorithm(_race(tmp_path / "whole"))
    _search_phase(whole)
    uninterrupted: list[Trial] = []
    _finish(whole, [], uninterrupted)

    choose = _race(tmp_path / "cut")
    alg = _algorithm(choose)
    search = _search_phase(alg)
    made, ended, live = [], [], []
    if when != "before_the_repeat":
        live = _drain(alg)
        made += live
        target = 18 if when == "between_rounds" else 9  # round 1 has 18 runs
        while len(ended) < target:
            t = live.pop(0)
            _end(alg, t, MEANS)
            ended.append(t)
            if len(ended) < target:
                new = _drain(alg)
                live += new
                made += new
    assert (len(live) > 0) == (when == "within_a_round")
    records = Records({None: [_held(t) for t in search]}, [_held(t) for t in made])
    resumed = _algorithm(cloudpickle.loads(cloudpickle.dumps(choose)), records=records)
    again = _drain(resumed)
    assert resumed.phase == "repeat"
    assert not {_key(t) for t in again} & {_key(t) for t in ended}  # nothing that ended is made again
    continued = [t for t in again if RESUME in t.config]
    assert sorted(_key(t) for t in continued) == sorted(_key(t) for t in live)  # the part-way ones go on
    assert all(t.config[RESUME]["checkpoint"] for t in continued)
    if when == "between_rounds":
        assert again and {t.config[ROUND] for t in again} == {2}  # the next round, at once
    after: list[Trial] = []
    _finish(resumed, again, after)
    assert resumed.is_finished()
    keys = [_key(t) for t in ended] + [_key(t) for t in after]
    assert len(keys) == len(set(keys))
    assert sorted(keys) == sorted(_key(t) for t in uninterrupted)


# -- the config, the records, the figures -------------------------------------------------------------------


@pytest.mark.parametrize("overrides, error", [
    (["compare.race.min_seeds=5", "compare.race.max_seeds=4"],
     "compare.race.min_seeds: 5 is above compare.race.max_seeds (4)"),
    (["compare.race.finalists=0"], "compare.race.finalists: expected a number >= 1, got 0"),
    (["compare.race.min_seeds=1"], "compare.race.min_seeds: expected a number >= 2, got 1"),
    (["compare.margin=-0.01"], "compare.margin: expected a number > 0"),
])
def test_race_settings_are_refused_in_one_line(overrides, error):
    with pytest.raises(ConfigError) as e:
        load_config(None, overrides)
    assert error in str(e.value) and "\n" not in str(e.value)


def test_the_race_is_off_unless_enabled_and_its_settings_reach_the_analysis():
    from augtune.analysis.race import race_settings

    off = load_config(None, []).compare
    assert off.race.enabled is False and race_settings(off, 0) is None
    on = load_config(None, ["compare.race.enabled=true", "compare.race.max_seeds=6",
                            "compare.margin=0.01"]).compare
    s = race_settings(on, 10)
    assert s.seeds == (11, 12, 13, 14, 15, 16) and s.min_seeds == 3 and s.margin == 0.01


def test_a_race_plan_says_its_seeds_and_its_fewest_and_most_runs(tmp_path):
    from augtune.search.compare import describe_compare, plan_compare

    cfg = load_config(None, ["dataset.as_vectors=true", "compare.methods=[base, random_noise]",
                             "compare.trials=1", "compare.race.enabled=true", "compare.race.max_seeds=5"])
    plan = plan_compare(cfg, "vector", storage=str(tmp_path), name="c")
    assert plan.plans[0].cfg.search.repeat_best.seeds == (1, 2, 3, 4, 5)
    text = "\n".join(describe_compare(plan))
    assert "a race of each entrant's best 2 configuration(s) on seeds 1..3" in text
    assert "in all: 2 search trials and 12 to 20 repeat runs" in text


def test_a_race_runs_record_names_its_candidate_and_round(monkeypatch):
    from augtune.trainables import ray_trainable

    seen = {}
    monkeypatch.setattr(ray_trainable, "_in_trial", lambda cfg, folder, hook, about, *_: seen.update(about))
    monkeypatch.setattr(ray_trainable, "TrialFolder", lambda records: SimpleNamespace(name="t"))
    run = {REPEAT: {"train.lr": 0.1, "train.seed": 12}, ENTRANT: "simclr", CANDIDATE: "simclr#2", ROUND: 1}
    ray_trainable.tune_trial(run, bases={"simclr": to_dict(load_config(None, []))},
                             experiments={"simclr": tempfile.mkdtemp()}, repeats=tempfile.mkdtemp())
    assert (seen["candidate"], seen["round"], seen["phase"]) == ("simclr#2", 1, "repeat")
    assert seen["params"] == {"train.lr": 0.1, "train.seed": 12}


def test_only_the_best_candidates_first_seed_run_draws_the_figures():
    drawn = []
    hook = FirstSeedFigures(lambda tr, run_dir, record, log: drawn.append(record["candidate"]), seed=11)
    for cid in ("a#1", "a#2"):
        hook(None, Path("."), {"seed": 11, "candidate": cid}, print)
    assert drawn == ["a#1"]


def test_the_analysis_withdraws_a_candidate_whose_run_failed_as_the_driver_did():
    from augtune.analysis.compare import race_of

    cfg = {"compare": to_dict(load_config(None, ["compare.race.enabled=true"]))["compare"],
           "train": {"seed": 0}}
    records = [{"entrant": e, "candidate": f"{e}#1", "seed": s, "status": "completed",
                "final": {"val_knn_acc": 0.9 + s / 1000}} for e in ("a", "b", "c") for s in (1, 2, 3)]
    lost = {**records[3], "status": "failed", "final": {}, "error": "lost: the driver was killed ..."}
    again = {**records[4], "status": "failed", "final": {}}  # failed once, then completed when run again
    records[0] = {**records[0], "status": "failed", "final": {}}
    state = race_of(cfg, records + [lost, again])
    assert state.candidate("a#1").status == "withdrawn" and state.rounds
    assert state.candidate("b#1").status != "withdrawn"


# -- one real compare -------------------------------------------------------------------------------------


@pytest.mark.ray
@pytest.mark.slow
def test_a_real_compare_races_its_finalists_and_the_verdict_reads_the_race(tmp_path, shared_ray):
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({
        "dataset": {"name": "digits", "as_vectors": True, "max_train": 256, "max_test": 128},
        "model": {"backbone": "mlp", "hidden_dim": 32, "num_layers": 2, "embed_dim": 16,
                  "proj_hidden_dim": 16, "proj_dim": 8},
        "train": {"epochs": 1, "batch_size": 64, "num_threads": 1},
        "eval": {"metrics": ["knn"]},
        "compare": {"methods": ["base", "random_noise"], "trials": 1, "metrics": ["knn_acc"],
                    "race": {"enabled": True, "min_seeds": 2, "max_seeds": 3, "finalists": 1}},
    }))
    run = subprocess.run([sys.executable, "-m", "augtune.cli", "compare", str(config), "--storage",
                          str(tmp_path / "res"), "--name", "cmp", "--address", shared_ray], cwd=ROOT,
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    exp = tmp_path / "res" / "cmp"
    repeats = [json.loads(p.read_text()) for p in (exp / "repeat").glob("*/record.json")]
    got = sorted((r["candidate"], r["seed"], r["round"]) for r in repeats)
    assert [g for g in got if g[2] == 1] == [("simclr#1", 1, 1), ("simclr#1", 2, 1),
                                             ("simclr+random_noise#1", 1, 1), ("simclr+random_noise#1", 2, 1)]
    # stopped at round 1, or ran to max_seeds: seed 3 in round 2
    assert {g[1:] for g in got if g[2] != 1} <= {(3, 2)} and len(got) in (4, 6) and len(set(got)) == len(got)
    race = json.loads((exp / "race.json").read_text())
    assert race["stopped"] in ("separated", "max_seeds")
    # chosen on the validation split, which the race's runs did not train on; reported on the test split
    assert race["settings"]["metric"] == "val_knn_acc"
    assert all(r["config"]["dataset"]["evaluate_on"] == "both" for r in repeats)
    assert all({"knn_acc", "val_knn_acc"} <= set(r["final"]) for r in repeats)
    assert "race: round 1 (n = 2)" in run.stdout
    import augtune

    v = augtune.load(exp).verdict()
    assert v.race is not None and v.race.stopped == race["stopped"] and not v.unfinished


RACE_COMPARE = {
    "dataset": {"name": "digits", "as_vectors": True, "max_train": 256, "max_test": 128},
    "model": {"backbone": "mlp", "hidden_dim": 32, "num_layers": 2, "embed_dim": 16, "proj_hidden_dim": 16,
              "proj_dim": 8},
    "train": {"epochs": 30, "batch_size": 64, "num_threads": 1, "checkpoint_every": 1},
    "eval": {"metrics": ["knn"]},
    # alpha so small that no test separates the two at round 1: round 2 always comes
    "compare": {"methods": ["base", "random_noise"], "trials": 1, "metrics": ["knn_acc"], "alpha": 1e-9,
                "race": {"enabled": True, "min_seeds": 2, "max_seeds": 4, "finalists": 1}},
}


def _records(folder: Path) -> list[dict]:
    out = []
    for path in folder.glob("*/record.json") if folder.exists() else ():
        try:
            out.append(json.loads(path.read_text()))
        except (OSError, ValueError):  # being replaced right now: the next look has it
            pass
    return out


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.parametrize("moment", ["a round-1 run part-way", "round 2 given out"])
def test_a_real_race_killed_by_sigkill_resumes_with_nothing_run_twice(tmp_path, moment):
    """The driver of a racing compare SIGKILLed (its Ray with it) while a round-1 run trains, or once round
    2's runs exist; `augtune resume` finishes the race: every (candidate, seed) the race ran has one
    completed run, no record is left running, a run Tune never saved says so, and the verdict is whole."""
    import os
    import time

    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(RACE_COMPARE))
    exp = tmp_path / "res" / "cmp"
    env = {**os.environ, "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.5", "TUNE_GLOBAL_CHECKPOINT_S": "1"}
    log = tmp_path / "driver.log"
    with log.open("wb") as out:
        driver = subprocess.Popen([sys.executable, "-m", "augtune.cli", "compare", str(config), "--storage",
                                   str(tmp_path / "res"), "--name", "cmp"], cwd=ROOT, env=env, stdout=out,
                                  stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.time() + 600
        while time.time() < deadline and driver.poll() is None:
            runs = _records(exp / "repeat")
            if moment.startswith("a round-1") and any(2 <= len(r["epochs"]) < 25 for r in runs):
                break
            if moment.startswith("round 2") and any(r.get("round") == 2 for r in runs):
                break
            time.sleep(0.1)
        else:
            pytest.fail(f"never saw the moment (exit {driver.poll()}): {log.read_text()[-3000:]}")
    finally:
        sigkill_driver(driver)
    res = subprocess.run([sys.executable, "-m", "augtune.cli", "resume", str(exp)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    repeats = _records(exp / "repeat")
    assert [r["status"] for r in repeats if r["status"] not in ("completed", "failed")] == []
    assert all("driver was killed" in r["error"] for r in repeats if r["status"] == "failed")
    done = [(r["candidate"], r["seed"]) for r in repeats if r["status"] == "completed"]
    assert len(done) == len(set(done)), sorted(done)  # nothing run twice
    race = json.loads((exp / "race.json").read_text())
    assert race["stopped"] in ("separated", "max_seeds", "equivalent")
    for cid, results in race["results"].items():  # the race's results are its completed runs, all of them
        assert sorted(int(k) for k in results) == sorted(s for c, s in done if c == cid), cid
    import augtune

    v = augtune.load(exp).verdict()
    assert v.race is not None and not v.unfinished
