"""Several searches in one Tune run (`augtune.search.multiplex`): a compare's entrants share trial
processes, and each keeps its own budget, study, limit and scheduler. Built from real Tune and Optuna
objects, without a Ray runtime."""
from __future__ import annotations

import tempfile
from types import SimpleNamespace

import optuna
from ray.tune.experiment import Experiment, Trial
from ray.tune.schedulers import ASHAScheduler, TrialScheduler

from augtune.search.multiplex import EntrantsScheduler, EntrantsSearch, entrant_of
from augtune.search.adapters import MetricResultsOptunaSearch
from augtune.search.resume import Held, settle_study
from augtune.search.searchers import Continuing, limited
from augtune.config import from_dict, to_dict
from augtune.records import ENTRANT, RESUME

SPACE = {"train.lr": optuna.distributions.FloatDistribution(1e-4, 1e-2, log=True)}


def _trainable(config):
    pass


def _searcher(seed: int, storage=None) -> MetricResultsOptunaSearch:
    extra = {} if storage is None else {"storage": storage, "study_name": "augtune"}
    return MetricResultsOptunaSearch(space=dict(SPACE), metric="knn", mode="max",
                                     sampler=optuna.samplers.RandomSampler(seed=seed), **extra)


def _search(budgets: dict[str, int], limit: int = 2, populations: tuple = (), storages: dict | None = None,
            held: dict | None = None) -> EntrantsSearch:
    """A compare's search of `budgets` entrants, as `tune_run` builds it; `held` (entrant -> `resume.Held`):
    resumed from those records, each entrant's Optuna study in `storages`."""
    entrants = {}
    for i, (name, n) in enumerate(budgets.items()):
        live = n if name in populations else limit
        optuna_search = _searcher(i, (storages or {}).get(name))
        mine = (held or {}).get(name, [])
        numbers = {}
        if mine:
            study = optuna.load_study(study_name="augtune", storage=storages[name])
            numbers = settle_study(study, mine, "knn")
        again = [h.again() for h in mine if not h.ended]
        entrants[name] = (Continuing(limited(optuna_search, live), live, again, [h.made for h in mine],
                                     len(mine), optuna_search, numbers), {"method.base": name}, n)
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
    counts = {name: sub.inner._counter for name, sub in search._subs.items()}
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
    studies = {name: sub.inner.searcher.searcher._ot_study for name, sub in search._subs.items()}
    assert [t.value for t in studies["a"].trials] == [0.1, 0.1]
    assert [t.value for t in studies["b"].trials] == [0.9, 0.9]


def test_a_resumed_compare_makes_only_what_each_entrant_lacks_and_tells_each_study_each_trial_once():
    """Killed with entrant a's first trial ended, its second asked of Optuna but never started, and b's
    first part-way: resumed from the records and the journals, b's trial is made again (in its folder, told
    to the study's trial asked for it), a's never-started one fails in its study and a asks one more, and
    each study holds each trial once."""
    storages = {name: optuna.storages.InMemoryStorage() for name in ("a", "b")}
    search = _search({"a": 2, "b": 2}, storages=storages)
    a1, b1 = _drain(search)
    search.on_trial_complete(a1.trial_id, _result(a1, 0.4))
    (a2,) = _drain(search)  # asked of a's study; the driver is killed before it starts
    assert a2.config[ENTRANT] == "a"

    def held(trial: Trial, status: str, value=None) -> Held:
        config = {k: v for k, v in trial.config.items()}
        return Held(trial.trial_id, config, status, {"knn": value} if value is not None else {},
                    {"folder": trial.trial_id, "checkpoint": f"/ckpt/{trial.trial_id}", "epoch": 1}, config)

    resumed = _search({"a": 2, "b": 2}, storages=storages,
                      held={"a": [held(a1, "completed", 0.4)], "b": [held(b1, "running")]})
    made = _drain(resumed)
    assert sorted(t.config[ENTRANT] for t in made) == ["a", "b"]
    again = next(t for t in made if t.config[ENTRANT] == "b")
    assert again.config[RESUME]["folder"] == b1.trial_id and again.config["train.lr"] == b1.config["train.lr"]
    for t in made:
        resumed.on_trial_complete(t.trial_id, _result(t, 0.6))
    (b2,) = _drain(resumed)  # b's second and last; a has made both of its own (a1 ended, one anew)
    assert b2.config[ENTRANT] == "b" and RESUME not in b2.config
    resumed.on_trial_complete(b2.trial_id, _result(b2, 0.7))
    assert _drain(resumed) == [] and resumed.is_finished()
    study = {name: optuna.load_study(study_name="augtune", storage=storages[name]) for name in storages}
    assert [(t.state.name, t.value) for t in study["a"].trials] == [("COMPLETE", 0.4), ("FAIL", None),
                                                                    ("COMPLETE", 0.6)]
    assert [(t.state.name, t.value) for t in study["b"].trials] == [("COMPLETE", 0.6), ("COMPLETE", 0.7)]


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


def test_a_search_is_the_one_entrant_none_whose_trials_name_no_entrant():
    """A search runs as a compare of one entrant (`tune_run.tune_run`): its trials carry its constants and
    no entrant's name, its results reach its searcher, and it makes its budget, none more."""
    search = _search({None: 3})
    made = _drain(search)
    assert len(made) == 2 and all(ENTRANT not in t.config and "train.lr" in t.config for t in made)
    while not search.is_finished():
        ended = made.pop(0)
        search.on_trial_complete(ended.trial_id, _result(ended, 0.5))
        made += _drain(search)
    assert search._subs[None].inner._counter == 3 and entrant_of(made[-1]) is None


def test_trial_parameters_name_their_entrant_and_drop_it_before_training(monkeypatch):
    """One trial function for a search (the entrant None) and a compare: the entrant picks its base and
    its records' folder, the record keeps its label, and what trains never sees the name."""
    import augtune.trainables.ray_trainable as rt

    seen = []
    monkeypatch.setattr(rt, "_in_trial", lambda cfg, folder, hook, about, *_: seen.append(
        (cfg.train.lr, cfg.train.epochs, folder, about["entrant"], about["params"])))
    monkeypatch.setattr(rt, "TrialFolder", lambda records: SimpleNamespace(name="t", records=records))
    bases = {"b": to_dict(from_dict({"train": {"epochs": 3}})), None: to_dict(from_dict({}))}
    rt.tune_trial({ENTRANT: "b", "train.lr": 0.1}, bases=bases, experiments={"b": "/e/b", None: "/e"},
                  repeats="/e/repeat")
    rt.tune_trial({"train.lr": 0.2}, bases=bases, experiments={"b": "/e/b", None: "/e"})
    (lr, epochs, folder, entrant, params), (lr2, _, folder2, entrant2, _) = seen
    assert (lr, epochs, folder.records, entrant, params) == (0.1, 3, "/e/b", "b", {"train.lr": 0.1})
    assert (lr2, folder2.records, entrant2) == (0.2, "/e", "simclr")  # a search's: its method's label
