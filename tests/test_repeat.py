"""A search and the repeat of its best in one Tune run (`augtune.search.repeat`): the repeat starts only
when every search trial has ended, repeats what the search found best, is never stopped early by the
search's scheduler, and continues from what the records hold when resumed (`augtune.search.resume`).
Built from real Tune objects, without a Ray runtime."""
from __future__ import annotations

import io
import json
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest
from ray import cloudpickle, tune
from ray.tune.experiment import Experiment, Trial
from ray.tune.schedulers import ASHAScheduler, TrialScheduler

from augtune.config import from_dict, to_dict
from augtune.search.multiplex import EntrantsScheduler
from augtune.search.choosers import RepeatBest
from augtune.search.repeat import SearchThenRepeat
from augtune.search.resume import Held, Records
from augtune.search.searchers import Continuing, VariantGenerator, limited
from augtune.records import REPEAT, RESUME

GRID = {"train.lr": tune.grid_search([0.1, 0.2, 0.3, 0.4])}
VALUE = {0.1: 0.5, 0.2: 0.9, 0.3: 0.7, 0.4: 0.6}  # the search metric each lr reaches
CFG = from_dict({"search": {"metric": "knn_acc", "repeat_best": {"top": 2, "seeds": [7, 8]}}})


def _trainable(config):
    pass


def record(folder: str, trial: Trial, status: str = "completed") -> None:
    """The record a search trial leaves in its folder (a trial a resume made again: the folder it had): its
    parameters and its epochs, the last reaching the metric VALUE gives its lr."""
    epochs = [{"epoch": 3, "knn_acc": VALUE.get(trial.config.get("train.lr"), 0.0)}]
    run = Path(folder) / ((trial.config.get(RESUME) or {}).get("folder") or trial.trial_id)
    run.mkdir(parents=True, exist_ok=True)
    params = {k: v for k, v in trial.config.items() if k != RESUME}
    (run / "record.json").write_text(json.dumps({"status": status, "params": params, "epochs": epochs}))


def _search(limit: int = 2, records: Records | None = None, restart_errored: bool = False,
            folder: str | None = None) -> SearchThenRepeat:
    """The algorithm of a search of GRID, new or (`records`) resumed, as `tune_run` makes it; its trials'
    records in `folder` (a new one by default)."""
    held = records.search.get(None, []) if records is not None else []
    search = Continuing(limited(VariantGenerator(), limit), limit,
                        [h.again(restart_errored) for h in held if not h.ended], [h.made for h in held],
                        len(held))
    choose = RepeatBest(folder or tempfile.mkdtemp(), to_dict(CFG))
    alg = SearchThenRepeat(search, choose, limit, records, restart_errored)
    alg.set_search_properties("knn_acc", "max", GRID)
    alg.add_configurations([Experiment("exp", run=_trainable, config=GRID, storage_path=tempfile.mkdtemp(),
                                       resources_per_trial={"cpu": 1})])
    return alg


def held(trial: Trial, status: str) -> Held:
    """A trial as its record tells it (`resume.read_records`): ended ones with their last result."""
    metrics = {"knn_acc": VALUE.get(trial.config.get("train.lr"), 0.0), "epoch": 3} if status == "completed" \
        else {}
    again = {} if status == "completed" else {"checkpoint": f"/ckpt/{trial.trial_id}", "epoch": 2, "index": 1}
    return Held(trial.trial_id, dict(trial.config), status, metrics,
                {"folder": trial.trial_id, **again}, dict(trial.config))


def _drain(alg) -> list[Trial]:
    return list(iter(alg.next_trial, None))


def _end(alg, trial: Trial, **result) -> None:
    """What Tune does when a trial ends: its last result, flattened, to the search algorithm (a search
    trial's record says it completed)."""
    if REPEAT not in trial.config:
        record(alg.choose.folder, trial)
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
    assert len(alg._repeat_ended) == 4 and not alg._search_live


def test_a_search_trial_still_running_holds_the_repeat_back():
    alg = _search(limit=4)
    a, b, c, d = _drain(alg)
    for t in (a, b, c):
        _end(alg, t)
    assert _drain(alg) == [] and alg.phase == "search"  # d is still running: nothing is chosen yet
    _end(alg, d)
    assert [t.config[REPEAT]["train.lr"] for t in _drain(alg)] == [0.2, 0.2, 0.3, 0.3]


def test_no_repeat_asked_finishes_with_the_search_and_failed_trials_are_never_repeated(tmp_path):
    cfg = from_dict({"search": {"metric": "knn_acc", "repeat_best": {"top": 0}}})
    alg = SearchThenRepeat(limited(VariantGenerator(), 0), RepeatBest(str(tmp_path / "a"), to_dict(cfg)), 0)
    alg.add_configurations([Experiment("exp", run=_trainable, config=GRID, storage_path=tempfile.mkdtemp(),
                                       resources_per_trial={"cpu": 1})])
    for t in _drain(alg):
        _end(alg, t)
    assert _drain(alg) == [] and alg.is_finished() and alg.runs == []
    errored, finished = (Trial("_trainable", config={"train.lr": lr}, trial_id=f"t{lr}", stub=True)
                         for lr in (0.2, 0.1))
    record(str(tmp_path / "b"), errored, "failed")  # it reached the best value, then failed: not repeated
    record(str(tmp_path / "b"), finished)
    runs, finished = RepeatBest(str(tmp_path / "b"), to_dict(CFG))()
    assert finished and [r[REPEAT] for r in runs] == [{"train.lr": 0.1, "train.seed": 7},
                                                      {"train.lr": 0.1, "train.seed": 8}]


@pytest.mark.parametrize("when", ["before_the_repeat", "during_the_repeat"])
def test_resumed_no_repeat_run_is_made_twice_none_is_lost_and_an_unfinished_one_continues(when):
    """The driver killed before the repeat was chosen, or with one repeat run ended, two part-way and one
    never made: resumed from the records, the ended run is not made again, the part-way ones are made again
    in their folders from their checkpoints, and the missing one is made anew."""
    alg = _search(limit=4)
    search = _drain(alg)
    for t in search:
        _end(alg, t)
    repeats = [] if when == "before_the_repeat" else _drain(alg)
    records = Records({None: [held(t, "completed") for t in search]},
                      [held(repeats[0], "completed"), *(held(t, "running") for t in repeats[1:3])] if repeats
                      else [])

    resumed = _search(limit=4, records=records, folder=alg.choose.folder)
    made = _drain(resumed)
    runs = [{REPEAT: {"train.lr": lr, "train.seed": seed}} for lr in (0.2, 0.3) for seed in (7, 8)]
    assert resumed.phase == "repeat" and resumed.runs == runs
    if when == "before_the_repeat":
        assert [t.config for t in made] == runs  # chosen from the records, each made anew
    else:
        assert [{k: v for k, v in t.config.items() if k != RESUME} for t in made] == \
            [r.config for r in repeats[1:]]
        assert [t.config[RESUME] for t in made[:2]] == [
            {"folder": r.trial_id, "checkpoint": f"/ckpt/{r.trial_id}", "epoch": 2, "index": 1}
            for r in repeats[1:3]]
        assert RESUME not in made[2].config  # never made before: anew
    for t in made:
        _end(resumed, t)
    assert resumed.is_finished()


def test_the_searchs_scheduler_never_stops_a_repeat_run():
    asha = ASHAScheduler(time_attr="epoch", max_t=4, grace_period=1, reduction_factor=2)
    sched = EntrantsScheduler({None: asha})  # as `tune_run` gives a search's own
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


@pytest.mark.parametrize("restart_errored", [False, True])
def test_an_errored_trial_a_resume_makes_again_holds_the_repeat_back_until_it_has_ended(restart_errored):
    """`augtune resume` makes an errored trial again, in its folder, from its checkpoint (`--restart-errored`:
    from scratch); what the repeat is chosen from must wait for it, and no other trial is made again."""
    alg = _search(limit=4)
    a, b, c, d = _drain(alg)
    records = Records({None: [held(a, "completed"), held(b, "completed"), held(c, "completed"),
                              held(d, "failed")]})
    for t, status in ((a, "completed"), (b, "completed"), (c, "completed"), (d, "failed")):
        record(alg.choose.folder, t, status)

    resumed = _search(limit=4, records=records, restart_errored=restart_errored, folder=alg.choose.folder)
    (rerun,) = _drain(resumed)
    assert {k: v for k, v in rerun.config.items() if k != RESUME} == d.config
    assert rerun.config[RESUME]["folder"] == d.trial_id
    assert rerun.config[RESUME]["checkpoint"] == (None if restart_errored else f"/ckpt/{d.trial_id}")
    assert resumed.phase == "search"
    _end(resumed, rerun)  # lr 0.4 ends at 0.6 this time
    repeats = _drain(resumed)
    assert [t.config[REPEAT]["train.lr"] for t in repeats] == [0.2, 0.2, 0.3, 0.3]
    assert not resumed._search_live and resumed.held == {"search": 3, "repeat": 0}


def test_one_ranking_of_the_records():
    """`ranked`, the ranking of `top_of` (the records) that every chooser reads: best first by `mode`, ties
    to the first made, each configuration once by its signature, at most `top` per group."""
    from augtune.search.choosers import ranked

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
