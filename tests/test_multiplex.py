"""Several searches in one Tune run (`augtune.search.multiplex`): a compare's entrants share trial
processes, and each keeps its own budget, study, limit and scheduler. Built from real Tune and Optuna
objects, without a Ray runtime."""
from __future__ import annotations

import tempfile

import optuna
from ray.tune.experiment import Experiment, Trial
from ray.tune.schedulers import ASHAScheduler, TrialScheduler

from augtune.search.multiplex import EntrantsScheduler, EntrantsSearch, entrant_of
from augtune.search.adapters import MetricResultsOptunaSearch
from augtune.search.adapters import restorable
from augtune.records import ENTRANT
from conftest import save_tune_trials

SPACE = {"train.lr": optuna.distributions.FloatDistribution(1e-4, 1e-2, log=True)}


def _trainable(config):
    pass


def _searcher(seed: int) -> MetricResultsOptunaSearch:
    return MetricResultsOptunaSearch(space=dict(SPACE), metric="knn", mode="max",
                                     sampler=optuna.samplers.RandomSampler(seed=seed))


def _search(budgets: dict[str, int], limit: int = 2, populations: tuple = ()) -> EntrantsSearch:
    entrants = {name: (restorable(_searcher(i), n if name in populations else limit), {"method.base": name},
                       n) for i, (name, n) in enumerate(budgets.items())}
    search = EntrantsSearch(entrants, limit, populations)
    search.set_search_properties("knn", "max", {})
    search.add_configurations([Experiment("exp", run=_trainable, config={}, storage_path=tempfile.mkdtemp(),
                                          resources_per_trial={"cpu": 1})])
    return search


def _drain(search) -> list[Trial]:
    return list(iter(search.next_trial, None))


def _result(trial: Trial, value: float) -> dict:
    return {"knn": value, **{f"config/{k}": v for k, v in trial.config.items()}}


def test_each_entrant_gets_its_budget_in_turn_under_one_limit():
    search = _search({"simclr": 2, "byol": 3, "moco": 1})
    assert search.total_samples == 6
    made = _drain(search)
    assert [t.config[ENTRANT] for t in made] == ["simclr", "byol"]  # in turn, two at a time in all
    for t in made:
        assert t.config["method.base"] == t.config[ENTRANT]  # each entrant's own constants
    while not search.is_finished():
        ended = made.pop(0)
        search.on_trial_complete(ended.trial_id, _result(ended, 0.5))
        made += _drain(search)
        assert len(made) <= 2
    for t in made:
        search.on_trial_complete(t.trial_id, _result(t, 0.5))
    counts = {name: sub._counter for name, sub in search._subs.items()}
    assert counts == {"simclr": 2, "byol": 3, "moco": 1}  # the budgets, none more


def test_a_pbt_population_is_handed_out_whole_beside_the_others_limit():
    """PBT compares only trials that have not finished: its population is live all at once (Tune's slots
    hold how many run), while a TPE entrant still gets at most the limit at a time."""
    search = _search({"tpe": 3, "pbt": 4}, limit=2, populations=("pbt",))
    made = _drain(search)
    assert sorted(t.config[ENTRANT] for t in made) == ["pbt"] * 4 + ["tpe"] * 2
    ended = next(t for t in made if t.config[ENTRANT] == "tpe")
    search.on_trial_complete(ended.trial_id, _result(ended, 0.5))
    assert [t.config[ENTRANT] for t in _drain(search)] == ["tpe"]  # the third, once one of two ended


def test_results_reach_only_their_entrants_study():
    search = _search({"a": 2, "b": 2}, limit=4)
    made = _drain(search)
    values = {t.trial_id: (0.1 if t.config[ENTRANT] == "a" else 0.9) for t in made}
    for t in made:
        search.on_trial_result(t.trial_id, {**_result(t, values[t.trial_id]), "training_iteration": 1})
        search.on_trial_complete(t.trial_id, _result(t, values[t.trial_id]))
    studies = {name: sub.searcher.searcher._ot_study for name, sub in search._subs.items()}
    assert [t.value for t in studies["a"].trials] == [0.1, 0.1]
    assert [t.value for t in studies["b"].trials] == [0.9, 0.9]


def test_one_snapshot_restores_every_entrant_reconciled_with_tunes_trials(tmp_path):
    from ray import cloudpickle

    search = _search({"a": 2, "b": 2})
    first = _drain(search)  # a1, b1
    search.save_to_dir(str(tmp_path), "s")  # the snapshot ...
    ended = first[0]
    search.on_trial_complete(ended.trial_id, _result(ended, 0.4))
    (second,) = _drain(search)  # ... one trial (a2) behind the trials Tune saved after it
    assert second.config[ENTRANT] == "a"
    ended.set_status(Trial.TERMINATED)
    ended.run_metadata.last_result = {"knn": 0.4, "config": ended.config}
    save_tune_trials(tmp_path, [ended, first[1], second])
    assert [p.name for p in tmp_path.glob("entrants-search-state-*")] == ["entrants-search-state-s.pkl"]

    restored = cloudpickle.loads(cloudpickle.dumps(_search({"a": 2, "b": 2})))
    assert restored.has_checkpoint(str(tmp_path))
    restored.restore_from_dir(str(tmp_path))
    assert restored._live == {first[1].trial_id, second.trial_id}
    assert {n: s._counter for n, s in restored._subs.items()} == {"a": 2, "b": 1}
    assert _drain(restored) == []  # two live: no slot
    restored.on_trial_complete(second.trial_id, _result(second, 0.6))
    (last,) = _drain(restored)
    assert last.config[ENTRANT] == "b"  # b's second and last trial; a has made both of its own
    study_a = restored._subs["a"].searcher.searcher._ot_study
    # a1 told from Tune's state (its end came after the snapshot), a2 when it ended: each once
    assert [(t.state.name, t.value) for t in study_a.trials] == [("COMPLETE", 0.4), ("COMPLETE", 0.6)]


def _trial(name: str, trial_id: str) -> Trial:
    trial = Trial("_trainable", config={ENTRANT: name}, trial_id=trial_id, stub=True,
                  placement_group_factory={"cpu": 1})
    return trial


def test_each_entrant_has_its_own_asha_rungs():
    """A weak entrant's best trial is compared with its own trials only: in one shared ASHA every trial of
    entrant b would be stopped at the first rung by a's better ones."""
    schedulers = {name: ASHAScheduler(time_attr="epoch", max_t=4, grace_period=1, reduction_factor=2)
                  for name in ("a", "b")}
    mux = EntrantsScheduler(schedulers)
    mux.set_search_properties("knn", "max")
    shared = ASHAScheduler(time_attr="epoch", max_t=4, grace_period=1, reduction_factor=2)
    shared.set_search_properties("knn", "max")
    trials = [_trial("a", "a1"), _trial("a", "a2"), _trial("b", "b1"), _trial("b", "b2")]
    values = {"a1": 0.9, "a2": 0.8, "b1": 0.3, "b2": 0.2}
    decisions, alone = {}, {}
    for t in trials:
        mux.on_trial_add(None, t)
        shared.on_trial_add(None, t)
    for t in trials:
        result = {"epoch": 1, "knn": values[t.trial_id]}
        decisions[t.trial_id] = mux.on_trial_result(None, t, result)
        alone[t.trial_id] = shared.on_trial_result(None, t, result)
    assert decisions["b1"] == TrialScheduler.CONTINUE  # the best of b, among b's
    assert alone["b1"] == TrialScheduler.STOP  # what a shared scheduler would have done
    assert entrant_of(trials[2]) == "b" and entrant_of({f"config/{ENTRANT}": "a"}) == "a"


def test_trial_parameters_name_their_entrant_and_drop_it_before_training(monkeypatch):
    import augtune.trainables.ray_trainable as rt

    seen = {}
    monkeypatch.setattr(rt, "tune_trial", lambda params, base, experiment, **where: seen.update(
        params=params, base=base, experiment=experiment, **where))
    rt.tune_entrant_trial({ENTRANT: "b", "train.lr": 0.1}, bases={"a": {"x": 1}, "b": {"x": 2}},
                          experiments={"a": "/e/a", "b": "/e/b"}, repeats="/e/repeat")
    assert seen == {"params": {"train.lr": 0.1}, "base": {"x": 2}, "experiment": "/e/b",
                    "repeats": "/e/repeat", "entrant": "b"}  # the record keeps the entrant's label

