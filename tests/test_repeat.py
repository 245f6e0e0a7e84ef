"""A search and the repeat of its best in one Tune run (`augtune.search.repeat`): the repeat starts only
when every search trial has ended, repeats what the search found best, is never stopped early by the
search's scheduler, and agrees with the trials Tune restores. Built from real Tune objects, without a
Ray runtime."""
from __future__ import annotations

import io
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest
from ray import cloudpickle, tune
from ray.tune.experiment import Experiment, Trial
from ray.tune.schedulers import ASHAScheduler, TrialScheduler

from augtune.config import from_dict, to_dict
from augtune.search.tune_run import search_algorithm
from augtune.search.repeat import RepeatBest, SearchThenRepeat, best_configs
from augtune.search.adapters import ReplayingVariantGenerator, restorable
from augtune.records import REPEAT
from conftest import save_tune_trials

GRID = {"train.lr": tune.grid_search([0.1, 0.2, 0.3, 0.4])}
VALUE = {0.1: 0.5, 0.2: 0.9, 0.3: 0.7, 0.4: 0.6}  # the search metric each lr reaches
CFG = from_dict({"search": {"metric": "knn_acc", "repeat_best": {"top": 2, "seeds": [7, 8]}}})
CHOOSE = RepeatBest(to_dict(CFG))


def _trainable(config):
    pass


def _search(limit: int = 2) -> SearchThenRepeat:
    alg = SearchThenRepeat(restorable(ReplayingVariantGenerator(), limit), CHOOSE, limit)
    alg.set_search_properties("knn_acc", "max", GRID)
    alg.add_configurations([Experiment("exp", run=_trainable, config=GRID, storage_path=tempfile.mkdtemp(),
                                       resources_per_trial={"cpu": 1})])
    return alg


def _restored(folder: Path, limit: int) -> SearchThenRepeat:
    """The algorithm as a resumed Tune run has it: unpickled from the Tuner's file, as it was made (never
    configured: a resumed run restores its search algorithm instead), then restored from `folder`."""
    alg = cloudpickle.loads(cloudpickle.dumps(
        SearchThenRepeat(restorable(ReplayingVariantGenerator(), limit), CHOOSE, limit)))
    assert alg.has_checkpoint(str(folder))
    alg.restore_from_dir(str(folder))
    return alg


def _drain(alg) -> list[Trial]:
    return list(iter(alg.next_trial, None))


def _end(alg, trial: Trial, **result) -> None:
    """What Tune does when a trial ends: its last result, flattened, to the search algorithm."""
    trial.set_status(Trial.TERMINATED)
    value = VALUE.get(trial.config.get("train.lr"), 0.0)
    trial.run_metadata.last_result = {"knn_acc": value, "epoch": 3, **result, "config": trial.config}
    flat = {"knn_acc": value, "epoch": 3, **result, **{f"config/{k}": v for k, v in trial.config.items()}}
    alg.on_trial_complete(trial.trial_id, result=flat)


def test_the_repeat_starts_when_every_search_trial_has_ended_and_repeats_the_best():
    alg = _search()
    made = _drain(alg)
    assert [t.config["train.lr"] for t in made] == [0.1, 0.2]  # two at a time
    while alg.phase == "search":
        _end(alg, made.pop(0))
        made += _drain(alg)
    repeats = made
    assert not alg.is_finished()
    assert repeats and all(t.status == Trial.PENDING for t in repeats)
    # the best two distinct settings (0.2, then 0.3), each once per seed, every parameter in the run itself
    assert [t.config for t in repeats] == [{REPEAT: {"train.lr": 0.2, "train.seed": 7}},
                                           {REPEAT: {"train.lr": 0.2, "train.seed": 8}}]
    for t in list(repeats):
        _end(alg, t)
    rest = _drain(alg)
    assert [t.config[REPEAT] for t in rest] == [{"train.lr": 0.3, "train.seed": 7},
                                                {"train.lr": 0.3, "train.seed": 8}]
    assert alg.is_finished() and alg.runs is not None and len(alg.runs) == 4
    for t in rest:
        _end(alg, t, knn_acc=0.0)  # a repeat run's result never reaches the search's own algorithm
    assert len(alg._ended) == 4


def test_a_search_trial_still_running_holds_the_repeat_back():
    alg = _search(limit=4)
    a, b, c, d = _drain(alg)
    for t in (a, b, c):
        _end(alg, t)
    assert _drain(alg) == [] and alg.phase == "search"  # d is still running: nothing is chosen yet
    _end(alg, d)
    assert [t.config[REPEAT]["train.lr"] for t in _drain(alg)] == [0.2, 0.2, 0.3, 0.3]


def test_no_repeat_asked_finishes_with_the_search_and_failed_trials_are_never_repeated():
    cfg = from_dict({"search": {"metric": "knn_acc", "repeat_best": {"top": 0}}})
    alg = SearchThenRepeat(restorable(ReplayingVariantGenerator(), 0), RepeatBest(to_dict(cfg)), 0)
    alg.add_configurations([Experiment("exp", run=_trainable, config=GRID, storage_path=tempfile.mkdtemp(),
                                       resources_per_trial={"cpu": 1})])
    for t in _drain(alg):
        _end(alg, t)
    assert _drain(alg) == [] and alg.is_finished() and alg.runs == []
    ended = [SimpleNamespace(config={"train.lr": 0.2}, metrics={"knn_acc": 0.99}, error="the trial errored"),
             SimpleNamespace(config={"train.lr": 0.1}, metrics={"knn_acc": 0.5}, error=None)]
    assert best_configs(ended, CFG) == [{"train.lr": 0.1}]


@pytest.mark.parametrize("when", ["before_the_repeat", "during_the_repeat"])
def test_restored_from_an_older_snapshot_no_repeat_run_is_made_twice_and_none_is_lost(tmp_path, when):
    alg = _search(limit=4)
    search = _drain(alg)
    for t in search:
        _end(alg, t)
    if when == "before_the_repeat":
        alg.save_to_dir(str(tmp_path), "s")  # the snapshot: the search ended, nothing chosen yet ...
        repeats = _drain(alg)
    else:
        repeats = _drain(alg)
        alg.save_to_dir(str(tmp_path), "s")
    _end(alg, repeats[0])
    # ... and Tune's trials, saved after it: every search trial, the repeat runs made, one of them ended
    save_tune_trials(tmp_path, search + repeats[:3])

    restored = _restored(tmp_path, limit=4)
    assert restored.phase == "repeat" and restored.runs == alg.runs
    (again,) = _drain(restored)  # the fourth run, which Tune never held; the first three are not made again
    assert again.config == repeats[3].config and again.trial_id != repeats[3].trial_id
    assert restored.is_finished()


def test_the_searchs_scheduler_never_stops_a_repeat_run():
    asha = ASHAScheduler(time_attr="epoch", max_t=4, grace_period=1, reduction_factor=2)
    _, sched = search_algorithm(_search(), CHOOSE, 2, asha)
    sched.set_search_properties("knn_acc", "max")
    good = Trial("_trainable", config={"train.lr": 0.2}, trial_id="s1", stub=True)
    weak = Trial("_trainable", config={"train.lr": 0.1}, trial_id="s2", stub=True)
    rerun = Trial("_trainable", config={REPEAT: {"train.lr": 0.1, "train.seed": 7}}, trial_id="r1", stub=True)
    for t in (good, weak, rerun):
        sched.on_trial_add(None, t)
    assert sched.on_trial_result(None, good, {"epoch": 1, "knn_acc": 0.9}) == TrialScheduler.CONTINUE
    assert sched.on_trial_result(None, weak, {"epoch": 1, "knn_acc": 0.1}) == TrialScheduler.STOP
    assert sched.on_trial_result(None, rerun, {"epoch": 1, "knn_acc": 0.0}) == TrialScheduler.CONTINUE


def test_the_progress_line_counts_the_phase_under_way():
    from augtune.search.progress import Progress

    out = io.StringIO()
    p = Progress("knn_acc", "max", total=2, stream=out, every_s=0, clock=lambda: 0.0)
    p.phases = SimpleNamespace(runs=[{}, {}, {}])
    search = [SimpleNamespace(status="TERMINATED", config={"train.lr": lr}) for lr in (0.1, 0.2)]
    p.on_trial_result(0, search, search[1], {"knn_acc": 0.9})
    assert p.line(search).startswith("search: 2/2 done  0 running  0 pending  best knn_acc 0.9000")
    rerun = SimpleNamespace(status="RUNNING", config={REPEAT: {"method.base": "byol", "train.lr": 0.2,
                                                                "train.seed": 7}})
    p.on_trial_result(0, [*search, rerun], rerun, {"knn_acc": 0.8})
    assert p.line([*search, rerun]).startswith(
        "repeat: 0/3 done  1 running  2 pending  best knn_acc 0.8000 (byol: train.seed=7)")
    said = out.getvalue().splitlines()  # the search's last count is said before the repeat's first
    assert said[-2].startswith("search: 2/2 done") and said[-1].startswith("repeat: 0/3 done")
    assert pickle_free_of_phases(p)


def pickle_free_of_phases(p) -> bool:
    """Tune pickles its callbacks with the run's state: the progress line does not carry the algorithm."""
    return cloudpickle.loads(cloudpickle.dumps(p)).phases is None


@pytest.mark.parametrize("again", ["resumed", "restarted"])
def test_an_errored_trial_that_tune_runs_again_holds_the_repeat_back_until_it_has_ended(tmp_path, again):
    """`augtune resume` runs an errored trial again (the same trial; `--restart-errored`: a new one of the
    same config): what the repeat is chosen from must wait for it."""
    alg = _search(limit=4)
    a, b, c, d = _drain(alg)
    for t in (a, b, c):
        _end(alg, t)
    d.set_status(Trial.ERROR)
    alg.on_trial_complete(d.trial_id, error=True)
    alg.save_to_dir(str(tmp_path), "s")
    save_tune_trials(tmp_path, [a, b, c, d])

    restored = _restored(tmp_path, limit=4)
    assert _drain(restored) == [] and restored.phase == "search"
    rerun = d if again == "resumed" else Trial("_trainable", config=dict(d.config), stub=True)
    _end(restored, rerun)  # lr 0.4 ends at 0.6 this time
    repeats = _drain(restored)
    assert [t.config[REPEAT]["train.lr"] for t in repeats] == [0.2, 0.2, 0.3, 0.3]
    assert sorted(e.config["train.lr"] for e in restored._ended.values() if e.error is None) == [
        0.1, 0.2, 0.3, 0.4]


def test_an_experiment_whose_repeat_was_a_tune_run_of_its_own_is_refused_in_one_line():
    """augtune 0.2 ran the repeat as a second Tune run: its restored search algorithm is a plain one."""
    from augtune.config import ConfigError
    from augtune.search.launch import finish

    old = SimpleNamespace(_local_tuner=SimpleNamespace(_tune_config=SimpleNamespace(
        search_alg=restorable(ReplayingVariantGenerator(), 2))))
    with pytest.raises(ConfigError, match="^/x/exp: started by an augtune older than 0.3"):
        finish(old, "/x/exp")


def test_one_ranking_for_tune_results_and_records():
    """`ranked`, the ranking `best_configs` (Tune's results) and `compare.top_of` (records) share: best first
    by `mode`, ties to the first made, each configuration once by its signature, at most `top` per group."""
    from augtune.search.repeat import ranked

    scored = [(0.5, {"lr": 1, "m": "a"}), (0.9, {"lr": 2, "m": "a"}), (0.9, {"lr": 3, "m": "b"}),
              (0.7, {"lr": 4, "m": "b"}), (0.9, {"lr": 2, "m": "a", "unread": 1})]
    everything = ranked(scored, "max", 10, signature=lambda p: p)
    assert [p["lr"] for p in everything] == [2, 3, 2, 4, 1]  # a stable sort: ties in the order made
    once = ranked(scored, "max", 10, signature=lambda p: {k: v for k, v in p.items() if k != "unread"})
    assert [p["lr"] for p in once] == [2, 3, 4, 1]  # what the run never reads makes no second configuration
    assert [p["lr"] for p in ranked(scored, "min", 2, signature=lambda p: p)] == [1, 4]
    per = ranked(scored, "max", 1, signature=lambda p: p, group=lambda p: p["m"])
    assert [(p["m"], p["lr"]) for p in per] == [("a", 2), ("b", 3)]  # the best of each group
    assert ranked([], "max", 3, signature=lambda p: p) == []
