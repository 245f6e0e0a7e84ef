"""`schedule:`, values that change during a run: validation (keys, values, epochs, per-epoch knobs only),
the Trainer putting each epoch's values in force, and the record listing them per epoch."""
from __future__ import annotations

import pytest

from augtune.checks import check_config
from augtune.config import ConfigError, from_dict, to_dict, values_at
from augtune.data import load_dataset
from augtune.methods import AUGMENTATIONS, BASES, knobs
from augtune.trainables import train_run
from augtune.trainables.loop import Trainer
from conftest import TINY_MLP

BASE = {
    "dataset": {"name": "digits", "as_vectors": True, "max_train": 128, "max_test": 64},
    "model": TINY_MLP,
    "method": {"base": "simclr", "augment": ["pinda"]},
    "train": {"epochs": 4, "batch_size": 32, "seed": 1, "num_threads": 1},
    "eval": {"every": 0, "epoch_metrics": [], "metrics": ["knn"], "references": False, "figures": []},
    "pinda": {"generator": "mlp"},
}
SCHEDULE = [{"epoch": 2, "set": {"pinda.penalty": 0.5, "train.temperature": 0.2}},
            {"epoch": 4, "set": {"pinda.penalty": 0.25, "train.lr": 0.002}}]


def config(**changes):
    return check_config(from_dict({**BASE, **changes}))


@pytest.fixture(scope="module")
def data():
    return load_dataset(from_dict(BASE).dataset)


def test_a_schedule_is_piecewise_constant_from_each_steps_1_based_epoch():
    cfg = config(schedule=SCHEDULE)
    assert values_at(cfg, 1) == {}
    assert values_at(cfg, 2) == values_at(cfg, 3) == {"pinda.penalty": 0.5, "train.temperature": 0.2}
    assert values_at(cfg, 4) == {"pinda.penalty": 0.25, "train.temperature": 0.2, "train.lr": 0.002}
    assert from_dict(to_dict(cfg)) == cfg  # it round-trips through the record's dict


@pytest.mark.parametrize("schedule, message", [
    ([{"epoch": 2, "set": {"pinda.width": 8}}], "schedule[0].set.pinda.width: pinda.width is read only at "
                                                "set-up"),
    ([{"epoch": 2, "set": {"model.hidden_dim": 8}}], "schedule[0].set.model.hidden_dim: model.hidden_dim is "
                                                     "read only at set-up"),
    ([{"epoch": 2, "set": {"nrcc.lam": 0.5}}], "not by simclr+pinda"),
    ([{"epoch": 2, "set": {"train.lr": 0}}], "schedule[0].set.train.lr: expected a number > 0"),
    ([{"epoch": 2, "set": {"pinda.penalty": "much"}}], "schedule[0].set.pinda.penalty: expected a number"),
    ([{"epoch": 2, "set": {"train.learning_rate": 0.1}}], "schedule[0].set.train.learning_rate: unknown key"),
    ([{"epoch": 3, "set": {"train.lr": 0.1}}, {"epoch": 3, "set": {"train.lr": 0.2}}],
     "schedule[1].epoch: 3 does not follow"),
    ([{"epoch": 5, "set": {"train.lr": 0.1}}], "schedule[0].epoch: 5 is past the run's last epoch"),
    ([{"epoch": 0, "set": {"train.lr": 0.1}}], "schedule[0].epoch: expected a number >= 1"),
    ([{"epoch": 2, "set": {"search.seed": 3}}], "schedule[0].set.search.seed: not a setting of the training"),
    ([{"epoch": 2}], "schedule[0].set: expected at least one"),
])
def test_a_bad_schedule_is_one_line_naming_the_key(schedule, message):
    with pytest.raises(ConfigError) as e:
        config(schedule=schedule)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_every_declared_knob_is_a_config_key_and_set_up_keys_are_not_knobs():
    from augtune.config import dotted_keys

    keys = dotted_keys()
    for cls in [*BASES.values(), *AUGMENTATIONS.values()]:
        assert set(cls.knobs) <= keys, cls
    stacked = {"base": "moco", "augment": ["pinda", "nrcc", "cocor", "diffaug"]}
    every = set(knobs(from_dict({"method": stacked})))
    assert {"train.lr", "train.temperature", "pinda.penalty", "nrcc.lam", "cocor.view_fraction",
            "diffaug.lam"} <= every
    assert not every & {"pinda.width", "pinda.generator", "cocor.lengths", "cocor.mmnn", "diffaug.steps",
                        "diffaug.schedule", "model.width", "train.batch_size", "train.epochs"}


def test_the_trainer_puts_each_epochs_values_in_force_and_the_record_lists_them(tmp_path, data):
    cfg = config(schedule=SCHEDULE)
    seen = []

    def watch(tr: Trainer, metrics, ckpt):
        pinda = tr.method.augments[0]
        seen.append((pinda.cfg.pinda.penalty, tr.method.objective.cfg.train.temperature,
                     tr.optimizers["encoder"].param_groups[0]["base_lr"]))

    trainer = Trainer(cfg, data, log=lambda s: None)
    trainer.fit(on_epoch_end=watch)
    assert seen == [(1.0, 0.1, 1e-3), (0.5, 0.2, 1e-3), (0.5, 0.2, 1e-3), (0.25, 0.2, 0.002)]
    assert trainer.cfg == cfg  # the run's own config is what it was given

    record = train_run(cfg, data, tmp_path / "run", log=lambda s: None)
    per_epoch = [e["knobs"] for e in record["epochs"]]
    assert per_epoch == [
        {"pinda.penalty": 1.0, "train.temperature": 0.1, "train.lr": 0.001},
        {"pinda.penalty": 0.5, "train.temperature": 0.2, "train.lr": 0.001},
        {"pinda.penalty": 0.5, "train.temperature": 0.2, "train.lr": 0.001},
        {"pinda.penalty": 0.25, "train.temperature": 0.2, "train.lr": 0.002},
    ]


def test_a_schedule_changes_the_training_from_its_epoch_on_and_not_before(tmp_path, data):
    plain = train_run(config(), data, tmp_path / "plain", log=lambda s: None)
    late = train_run(config(schedule=[{"epoch": 3, "set": {"pinda.penalty": 0.0}}]), data, tmp_path / "late",
                     log=lambda s: None)
    losses = [e["loss"] for e in plain["epochs"]], [e["loss"] for e in late["epochs"]]
    assert losses[0][:2] == losses[1][:2]  # bitwise the same run until the step
    assert losses[0][2] != losses[1][2]
    assert "knobs" not in plain["epochs"][0]  # a run without a schedule records no knobs


def test_a_scheduled_run_stopped_and_resumed_is_bitwise_the_straight_one(tmp_path, data):
    import torch

    cfg = config(schedule=SCHEDULE)
    straight = train_run(cfg, data, tmp_path / "straight", log=lambda s: None)
    train_run(cfg, data, tmp_path / "halves", log=lambda s: None, stop_after=3)
    torch.manual_seed(99)
    resumed = train_run(cfg, data, tmp_path / "halves", resume=True, log=lambda s: None)
    assert [e["loss"] for e in straight["epochs"]] == [e["loss"] for e in resumed["epochs"]]
    assert [e["knobs"] for e in straight["epochs"]] == [e["knobs"] for e in resumed["epochs"]]


def test_runs_of_two_schedules_are_two_rows_of_a_table_never_pooled(tmp_path, data):
    from augtune.analysis import comparison_table, load_runs

    for name, schedule in (("a", []), ("b", [{"epoch": 3, "set": {"pinda.penalty": 0.5}}]),
                           ("c", [{"epoch": 3, "set": {"pinda.penalty": 0.25}}])):
        train_run(config(schedule=schedule), data, tmp_path / "runs" / name, log=lambda s: None)
    table = comparison_table(load_runs([tmp_path / "runs"]), rows="method", cols="dataset", metrics="knn_acc")
    labels = sorted(table.row_labels)
    assert len(labels) == 3 and labels[-1] == "simclr+pinda (schedule=none)"
    assert all("schedule=1 step #" in label for label in labels[:2])


def test_augtune_train_refuses_a_set_up_key_in_a_schedule_with_exit_2_before_training(tmp_path, capsys):
    import yaml

    from augtune import cli

    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({**BASE, "schedule": [{"epoch": 2, "set": {"pinda.generator": "mlp"}}]}))
    assert cli.main(["train", str(path), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("augtune: error: schedule[0].set.pinda.generator: pinda.generator is read only at "
                          "set-up") and "\n" not in err
    assert not (tmp_path / "run").exists()


def test_augtune_methods_lists_the_per_epoch_knobs_by_what_reads_them(capsys):
    from augtune import cli

    assert cli.main(["methods"]) == 0
    out = capsys.readouterr().out
    section = out.split("per-epoch knobs")[1].split("datasets")[0]
    assert "the loop       train.lr" in section and "pinda          pinda.penalty" in section
    assert "byol" not in section  # BYOL reads no knob of its own at every step
