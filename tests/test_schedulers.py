"""The scheduler registry (`augtune.search.schedulers`): one entry per `search.scheduler`, each saying what
the plan, the Tune run and the trial need of it (docs/contributing.md, "The search layer")."""
import typing

import pytest
from test_pbt import PBT  # a tiny PBT search of PiNDA

from augtune.config import SCHEDULES, CompareConfig, SearchConfig, from_dict, to_dict
from augtune.records import searched_schedule
from augtune.search.schedulers import PBT_CHECKPOINTS, SCHEDULERS, scheduling


def test_the_registry_names_every_scheduler_the_config_allows_and_only_those():
    allowed = set(typing.get_args(typing.get_type_hints(SearchConfig)["scheduler"]))
    assert set(SCHEDULERS) == allowed
    entrants = typing.get_args(typing.get_type_hints(CompareConfig)["scheduler"])  # tuple[Literal, ...]
    assert set(typing.get_args(entrants[0])) == allowed
    assert {n for n, s in SCHEDULERS.items() if s.population} == set(SCHEDULES)
    assert all(s.name == n for n, s in SCHEDULERS.items())


@pytest.mark.parametrize("name", ["none", "asha", "pbt", "pb2"])
def test_scheduling_reads_the_search_section_and_records_say_the_same(name):
    cfg = from_dict({**PBT, "search": {**PBT["search"], "scheduler": name}})
    assert scheduling(cfg) is SCHEDULERS[name]
    # a record's config (JSON) and the typed config agree on "is this a population?"
    assert searched_schedule(to_dict(cfg)) == scheduling(cfg).population
    assert not searched_schedule(None) and not searched_schedule({"search": "pbt"})


def test_a_pbt_search_hands_tune_its_whole_population_and_a_tpe_search_its_slots():
    pbt = from_dict({**PBT, "search": {**PBT["search"], "num_samples": 8}})
    assert scheduling(pbt).live_trials(pbt, 2) == 8 and scheduling(pbt).live_trials(pbt, 16) == 16
    tpe = from_dict({"search": {"num_samples": 8}})
    assert scheduling(tpe).live_trials(tpe, 2) == 2


def test_checkpoints_kept_and_cadence_follow_the_scheduler():
    pbt = from_dict({**PBT, "search": {**PBT["search"], "keep_checkpoints": 1}})
    assert scheduling(pbt).checkpoints_kept(pbt) == PBT_CHECKPOINTS  # a donor's must outlive its copy
    more = from_dict({**PBT, "search": {**PBT["search"], "keep_checkpoints": 9}})
    assert scheduling(more).checkpoints_kept(more) == 9
    asha = from_dict({"search": {"scheduler": "asha", "keep_checkpoints": 1}})
    assert scheduling(asha).checkpoints_kept(asha) == 1
    assert scheduling(pbt).checkpoint_every(pbt) == 2 and scheduling(asha).checkpoint_every(asha) is None
    assert scheduling(pbt).rung_epochs(pbt) == (2, 4)  # every interval, below the last epoch


def test_a_pbt_trial_records_its_mutated_knobs_from_its_own_config(tmp_path):
    """The plan writes the knobs PBT mutates into the trial's `train.track`; the loop reads only that."""
    from augtune.search.plan import trial_base
    from augtune.spaces import resolve_space
    from augtune.trainables.loop import tracked_keys

    cfg = from_dict(PBT)
    cfg = scheduling(cfg).check(cfg, resolve_space(cfg.search, "vector"), to_dict(cfg))
    base = trial_base(cfg, str(tmp_path))
    assert base["train"]["track"] == ["pinda.penalty", "train.lr"]
    assert base["train"]["checkpoint_every"] == 2
    trial = from_dict({**base, "search": {"scheduler": "none"}})  # the search section no longer matters
    assert tracked_keys(trial) == ("pinda.penalty", "train.lr")
    scheduled = from_dict({**base, "schedule": [{"epoch": 3, "set": {"train.temperature": 0.2}}]})
    assert tracked_keys(scheduled) == ("train.temperature", "pinda.penalty", "train.lr")
    plain = from_dict({"search": {"scheduler": "asha"}})
    assert trial_base(plain, str(tmp_path))["train"]["track"] == []


def test_describe_says_what_each_scheduler_does():
    asha = from_dict({"search": {"scheduler": "asha", "grace_period": 2, "reduction_factor": 3}})
    assert scheduling(asha).describe(asha).startswith("ASHA (grace 2, reduction 3")
    none = from_dict({"search": {"scheduler": "none"}})
    assert "every trial runs every epoch" in scheduling(none).describe(none)
    pbt = from_dict(PBT)
    assert scheduling(pbt).describe(pbt).startswith("PBT every 2 epoch(s)")


def test_an_unknown_tracked_key_is_refused_in_one_line():
    from augtune.config import ConfigError

    with pytest.raises(ConfigError, match=r"^train.track\[1\]: 'train.nope' is not a config key"):
        from_dict({"train": {"track": ["train.lr", "train.nope"]}})
