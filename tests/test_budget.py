"""`compare.time_budget`: the allocation rule (not wall time), the schedule floor, the measured costs
and what the plan, the progress line and the verdict say (issue 28.6)."""
from __future__ import annotations

import io
import re

import pytest

from augtune.analysis.verdict import time_note, verdict
from augtune.config import ConfigError, from_dict, load_config
from augtune.data import load_dataset
from augtune.phases import parse_phases
from augtune.search.budget import MIN_SEEDS, RUN_S, Cost, allocate, measure, min_epochs, wall_s
from augtune.search.compare import describe_compare, plan_compare
from augtune.search.plan import selecting
from augtune.search.progress import Progress

COSTS = [Cost("a", epoch_s=2.0, fixed_s=5.0), Cost("b", epoch_s=6.0, fixed_s=5.0, min_epochs=4)]


def test_the_estimate_is_the_runs_work_over_the_slots_plus_the_start():
    # (3 trials + 2 seeds) x ((10 x 2 + 5 + run) + (10 x 6 + 5 + run)) / 2 slots + 30 s
    assert wall_s(COSTS, 3, 10, 2, 2, start_s=30) == pytest.approx(30 + 5 * (25 + 65 + 2 * RUN_S) / 2)


def test_a_budget_the_asked_design_fits_changes_nothing():
    got = allocate(COSTS, 10_000, trials=3, epochs=10, seeds=3, slots=2)
    assert (got.trials, got.epochs, got.seeds) == (3, 10, 3) and got.estimate_s <= 10_000
    assert "asked" not in got.describe((3, 10, 3))


@pytest.mark.parametrize("budget", [150, 200, 300, 450, 700, 1000, 1500])
def test_trials_and_epochs_shrink_together_to_the_largest_design_that_fits(budget):
    got = allocate(COSTS, budget, trials=8, epochs=40, seeds=3, slots=2, start_s=30)
    assert got.estimate_s <= budget and got.seeds == 3
    assert got.estimate_s == pytest.approx(wall_s(COSTS, got.trials, got.epochs, 3, 2, 30))
    # one factor for both: the trials' share and the epochs' share of what was asked stay together
    assert abs(got.trials / 8 - got.epochs / 40) <= 1 / 8 + 1e-9 or got.trials == 1 or got.epochs == 4
    # the largest: one more trial with one more epoch's share would not fit
    k = max(got.trials / 8, got.epochs / 40) + 1 / 16
    bigger = (max(1, int(8 * k)), max(4, int(40 * k)))
    if bigger != (got.trials, got.epochs) and k <= 1:
        assert wall_s(COSTS, *bigger, 3, 2, 30) > budget * 0.97


def test_more_budget_never_gives_a_smaller_design():
    designs = [allocate(COSTS, b, trials=8, epochs=40, seeds=3, slots=2, start_s=30)
               for b in range(120, 3000, 40)]
    for a, b in zip(designs, designs[1:]):
        assert (b.trials, b.epochs, b.seeds) >= (a.trials, a.epochs, a.seeds)


def test_epochs_never_drop_below_what_every_entrant_needs_then_seeds_shrink_to_two():
    got = allocate(COSTS, 100, trials=8, epochs=40, seeds=5, slots=2, start_s=30)
    assert got.epochs == 4 and got.trials == 1 and MIN_SEEDS <= got.seeds < 5 and got.estimate_s <= 100
    with pytest.raises(ConfigError, match=r"60 s is too short .* 1 trial, 4 epoch\(s\) and 2 seeds"):
        allocate(COSTS, 60, trials=8, epochs=40, seeds=5, slots=2, start_s=30)


def test_the_phase_floor_keeps_every_phase_of_a_schedule():
    assert min_epochs("") == 1
    assert min_epochs("A:1,B:2") == 2
    for schedule in ("A:200,B:400,A:800", "B:2,A:2", "A:1,B:10,A:1", "A:3,B:1,A:3,B:1"):
        e = min_epochs(schedule)
        names = parse_phases(schedule, e)
        assert 1 + sum(x != y for x, y in zip(names, names[1:])) == len(schedule.split(","))
        shorter = parse_phases(schedule, e - 1)
        assert e == len(schedule.split(",")) or \
            1 + sum(x != y for x, y in zip(shorter, shorter[1:])) < len(schedule.split(","))


def test_measure_times_an_entrants_epoch_and_its_fixed_costs():
    cfg = selecting(from_dict({"dataset": {"max_train": 320}, "model": {"backbone": "cnn", "width": 4},
                               "method": {"augment": ["diffaug"]}, "diffaug": {"schedule": "A:1,B:2,A:1"},
                               "train": {"epochs": 8, "batch_size": 64}, "eval": {"metrics": ["knn"]}}))
    cost = measure(cfg, load_dataset(cfg.dataset))
    assert cost.entrant == "simclr+diffaug" and cost.epoch_s > 0 and cost.fixed_s > 0
    assert cost.min_epochs == min_epochs("A:1,B:2,A:1") == 3


def test_a_budgeted_compare_is_sized_before_ray_and_says_so(tmp_path):
    cfg = load_config("examples/compare_digits.yaml",
                      ["dataset.max_train=400", "compare.methods=[base, pinda]", "compare.time_budget=1h",
                       "compare.race.enabled=false"])
    data = load_dataset(cfg.dataset)
    plan = plan_compare(cfg, data.modality, storage=str(tmp_path), name="c", data=data)
    assert (plan.cfg.compare.trials, plan.cfg.train.epochs, plan.cfg.compare.seeds) == (3, 6, 3)
    assert plan.budget.startswith("time budget 60 min: 3 trial(s), 6 epoch(s), 3 seed(s) per entrant;")
    assert plan.budget in describe_compare(plan) and plan.budget_began is not None
    tight = load_config("examples/compare_digits.yaml",
                        ["dataset.max_train=400", "compare.methods=[base, pinda]", "compare.trials=200",
                         "compare.time_budget=90s", "compare.race.enabled=false"])
    plan = plan_compare(tight, data.modality, storage=str(tmp_path), name="c", data=data)
    c = plan.cfg
    assert c.compare.trials < 200 and "(asked: 200 trials, 6 epochs, 3 seeds)" in plan.budget
    assert all(p.cfg.search.num_samples == c.compare.trials and p.cfg.train.epochs == c.train.epochs
               for p in plan.plans)  # every entrant the same budget
    with pytest.raises(ConfigError, match="time_budget: 60 s is too short"):
        plan_compare(load_config("examples/compare_digits.yaml", ["compare.time_budget=60s"]), data.modality,
                     storage=str(tmp_path), name="c", data=data)


def test_a_budget_under_what_any_compare_spends_is_refused_before_anything_is_timed(monkeypatch):
    """10 s cannot hold Ray's start and the runs' own set-up, whatever the entrants cost: refused at once,
    the timing probe (seconds to minutes of training) never run."""
    from augtune.search import compare

    def probe(*args, **kwargs):
        raise AssertionError("the timing probe ran")

    monkeypatch.setattr(compare, "measure_costs", probe)
    cfg = load_config("examples/compare_digits.yaml", ["compare.time_budget=10s"])
    with pytest.raises(ConfigError, match=r"compare.time_budget: 10 s is less than a compare of 5 "
                                          r"entrant\(s\) spends before any training \(\d+ s: Ray's start"):
        compare.fit_time_budget(cfg, "image")
    from augtune.search.budget import check_floor

    check_floor(3600, 5, 4, 2, 2)  # an hour is above the floor: no error
    with pytest.raises(ConfigError, match="less than a compare of 8 entrant"):
        check_floor(40, 8, 4, 2, 1)  # 30 s start + 8 x (4 + 2 x 2) runs x 1 s


def test_a_duration_that_is_no_duration_is_refused():
    with pytest.raises(ConfigError, match="compare.time_budget: expected a duration such as 90s, 20m"):
        from_dict({"compare": {"time_budget": "soon"}})


def test_the_progress_line_counts_the_budget_down():
    now = [100.0]  # the budget began at 40 (the measuring), the run at 100
    p = Progress("knn_acc", "max", 4, stream=io.StringIO(), tty=False, clock=lambda: now[0],
                 budget=(600, 40))
    now[0] = 225
    assert "budget 10m00s: 6m55s left" in p.line([])  # 600 - (225 - 40)
    now[0] = 700
    assert "budget 10m00s: 1m00s over" in p.line([])


def test_the_verdict_states_the_budget_it_ran_under():
    def record(entrant, seed, value):
        return {"status": "completed", "method": entrant, "entrant": entrant, "seed": seed,
                "final": {"knn_acc": value}, "epochs": [{"epoch": 1, "epoch_time_s": 1.0}],
                "config": {"compare": {"time_budget": "20m", "trials": 2, "seeds": 3},
                           "train": {"epochs": 5}}}
    repeat = [record("a", s, 0.9) for s in (1, 2, 3)]
    note = time_note(repeat)
    assert note == ("Run under compare.time_budget 20m: 2 trial(s), 5 epoch(s) and 3 seed(s) per entrant, "
                    "sized from each entrant's epochs, measured before the compare started.")
    assert note in verdict(repeat, ("knn_acc",)).sentences()
    assert time_note([{**r, "config": {}} for r in repeat]) == ""


def test_a_race_is_budgeted_at_its_most_runs_and_its_max_seeds_shrink():
    # 2 finalists x 6 seeds = 12 repeat runs per entrant at most, against 6 with per_seed 1
    assert wall_s(COSTS, 3, 10, 6, 2, 30, per_seed=2) > wall_s(COSTS, 3, 10, 6, 2, 30)
    got = allocate(COSTS, 300, trials=1, epochs=4, seeds=6, slots=2, start_s=30, per_seed=2)
    assert got.seeds == 5 and got.estimate_s <= 300  # (1 + 2 x 5) x 44 / 2 + 30 = 272


def test_a_budgeted_race_sets_its_max_seeds(tmp_path):
    cfg = load_config("examples/compare_digits.yaml",
                      ["dataset.max_train=400", "compare.methods=[base, pinda]", "compare.trials=1",
                       "train.epochs=2", "compare.race.max_seeds=400", "compare.time_budget=2m"])
    data = load_dataset(cfg.dataset)
    plan = plan_compare(cfg, data.modality, storage=str(tmp_path), name="c", data=data)
    race = plan.cfg.compare.race
    assert race.enabled and 2 <= race.max_seeds < 400 and race.min_seeds <= race.max_seeds
    assert "(asked: 1 trials, 2 epochs, 400 seeds)" in plan.budget


@pytest.mark.parametrize("budget_s", [90, 150, 300, 600, 1200, 2400, 4800])
def test_the_fit_never_falls_below_min_trials_with_a_costly_entrant(budget_s):
    """A fake entrant ten times the others' epoch cost (DiffAug's old share): whatever the budget, each
    entrant keeps min_trials search trials (epochs and seeds give way), or the budget is refused naming
    one that fits; asked for fewer trials than min_trials, the asked number is the floor."""
    costs = [Cost("cheap", 1.0, 5.0), Cost("cheap2", 1.5, 5.0), Cost("costly", 10.0, 5.0, min_epochs=3)]
    try:
        got = allocate(costs, budget_s, trials=8, epochs=30, seeds=3, slots=2, start_s=30, min_trials=4)
    except ConfigError as e:
        asked = re.search(r"give at least (\d+)(s|m)", str(e))
        assert asked, str(e)
        enough = int(asked.group(1)) * (60 if asked.group(2) == "m" else 1)
        again = allocate(costs, enough, trials=8, epochs=30, seeds=3, slots=2, start_s=30, min_trials=4)
        assert again.trials == 4 and again.estimate_s <= enough  # the smallest search fits in it
        return
    assert got.trials >= 4 and got.epochs >= 3 and got.estimate_s <= budget_s
    few = allocate(costs, budget_s * 10, trials=2, epochs=30, seeds=3, slots=2, start_s=30, min_trials=4)
    assert few.trials == 2


def test_the_refusal_names_the_smallest_budget_and_min_trials():
    costs = [Cost("a", 10.0, 5.0), Cost("b", 10.0, 5.0)]
    with pytest.raises(ConfigError, match=r"even 4 trials, 1 epoch\(s\) and 2 seeds .* give at least \d+m "
                                          r"\(or lower compare.min_trials\)"):
        allocate(costs, 120, trials=8, epochs=30, seeds=3, slots=2, min_trials=4)


def test_equal_compute_gives_a_costlier_entrant_proportionally_fewer_epochs():
    from augtune.search.compare import equal_compute

    costs = [Cost("base", 1.0, 5.0), Cost("x2", 2.0, 5.0), Cost("x3.1", 3.1, 5.0), Cost("x10", 10.0, 5.0),
             Cost("schedule", 10.0, 5.0, min_epochs=3)]
    assert equal_compute(costs, 6) == [6, 3, 1, 1, 3]  # never more than the cheapest's cost, nor below floors
    assert equal_compute(costs, 30) == [30, 15, 9, 3, 3]
    # each entrant's training costs at most the cheapest one's (unless one epoch is more), and within one
    # of its epochs of it
    for epochs in (6, 30, 100):
        for c, e in zip(costs[:4], equal_compute(costs[:4], epochs)):
            assert epochs * 1.0 - c.epoch_s < e * c.epoch_s <= max(epochs * 1.0, c.epoch_s) + 1e-9


def test_an_equal_compute_compare_plans_each_entrants_epochs_and_says_so(tmp_path, monkeypatch):
    from augtune.search import compare

    measured = [Cost("simclr", 1.0, 2.0), Cost("simclr+nrcc", 2.5, 2.0)]
    monkeypatch.setattr(compare, "measure_costs", lambda cfg, modality: measured)
    cfg = load_config("examples/compare_digits.yaml",
                      ["compare.methods=[base, nrcc]", "compare.equal=compute", "train.epochs=10",
                       "compare.race.enabled=false"])
    data = load_dataset(cfg.dataset)
    plan = plan_compare(cfg, data.modality, storage=str(tmp_path), name="c", data=data)
    assert plan.epochs == {"simclr": 10, "simclr+nrcc": 4}
    assert [p.cfg.train.epochs for p in plan.plans] == [10, 4]
    assert any(line.endswith("simclr 10, simclr+nrcc 4") for line in describe_compare(plan))
    assert "at most 84 epochs" in describe_compare(plan)[-1]  # (3 trials + 3 seeds) x (10 + 4)
    plan.save()
    import yaml

    assert yaml.safe_load((tmp_path / "c" / "augtune_compare.yaml").read_text())["epochs"] == plan.epochs
    # equal epochs (the default) measures nothing
    monkeypatch.setattr(compare, "measure_costs", lambda cfg, modality: pytest.fail("measured"))
    plain = plan_compare(load_config("examples/compare_digits.yaml", ["compare.methods=[base, nrcc]"]),
                         data.modality, storage=str(tmp_path), name="d", data=data)
    assert plain.epochs is None and {p.cfg.train.epochs for p in plain.plans} == {6}


def test_the_verdict_of_an_equal_compute_compare_names_each_entrants_epochs():
    def record(entrant, seed, value, epochs):
        return {"status": "completed", "method": entrant, "entrant": entrant, "seed": seed,
                "final": {"knn_acc": value}, "config": {"train": {"epochs": epochs}}}
    repeat = [record("a", s, 0.9, 6) for s in (1, 2, 3)] + [record("b", s, 0.8, 2) for s in (1, 2, 3)]
    said = verdict(repeat, ("knn_acc",), equal="compute").sentences()
    assert said[-1].startswith("Equal compute (compare.equal: compute)") and said[-1].endswith("a 6, b 2.")
    assert not any("Equal compute" in s for s in verdict(repeat, ("knn_acc",)).sentences())
