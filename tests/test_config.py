"""Config: typed, frozen, refuses what it does not know with one line naming the dotted key."""
from __future__ import annotations

import dataclasses

import pytest

from augtune.checks import check_config
from augtune.config import (ConfigError, apply_overrides, from_dict, load_config, to_dict)
from augtune.phases import parse_phases


def test_defaults_are_the_embedded_digits_and_simclr():
    cfg = load_config()
    assert cfg.dataset.name == "digits" and cfg.method.base == "simclr"
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.train.lr = 1.0  # type: ignore[misc]


def test_round_trip_through_dict():
    cfg = from_dict({"train": {"lr": 0.01, "epochs": 3}, "method": {"augment": []}})
    assert from_dict(to_dict(cfg)) == cfg


def test_train_compile_is_a_switch_or_one_of_torchs_modes(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("train: {compile: true}\n")
    assert load_config(path).train.compile is True
    assert load_config(path, ["train.compile=reduce-overhead"]).train.compile == "reduce-overhead"
    assert load_config(path, ["train.compile=false"]).train.compile is False


def test_overrides_by_dotted_name_parse_yaml_scalars_and_lists(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("train:\n  lr: 1e-3\n  epochs: 4\nview:\n  crop_scale: [0.3, 1.0]\n")
    cfg = load_config(path, ["train.lr=0.01", "method.base=byol", "eval.metrics=[knn, sr]",
                             "dataset.max_train=100", "train.grad_clip=null"])
    assert cfg.train.lr == 0.01 and isinstance(cfg.train.lr, float)
    assert cfg.method.base == "byol"
    assert cfg.eval.metrics == ("knn", "sr")
    assert cfg.view.crop_scale == (0.3, 1.0)
    assert cfg.dataset.max_train == 100 and cfg.train.grad_clip is None
    assert load_config(path).train.lr == 1e-3  # PyYAML reads 1e-3 as a string; it is a float here


@pytest.mark.parametrize("data,overrides,message", [
    ({"trian": {}}, [], "trian: unknown key"),
    ({"train": {"lrr": 1}}, [], "train.lrr: unknown key"),
    ({}, ["train.lr=-1"], "train.lr: expected a number > 0"),
    ({}, ["train.epochs=0"], "train.epochs: expected a number >= 1"),
    ({}, ["train.epochs=2.5"], "train.epochs: expected an integer"),
    ({}, ["train.epochs=true"], "train.epochs: expected an integer"),
    ({}, ["train.lr=fast"], "train.lr: expected a number"),
    ({}, ["train.optimizer=lamb"], "train.optimizer: expected one of 'adam', 'adamw', 'sgd'"),
    ({}, ["dataset.as_vectors=yes please"], "dataset.as_vectors: expected true or false"),
    ({}, ["dataset.test_fraction=1"], "dataset.test_fraction: expected a number < 1"),
    ({}, ["method.base=simclrr"], "method.base: unknown base method 'simclrr'"),
    ({}, ["method.augment=[nope]"], "method.augment[0]: unknown augmentation method 'nope'"),
    ({}, ["dataset.name=mnist3d"], "dataset.name: unknown dataset 'mnist3d'"),
    ({}, ["view.crop_scale=[0.5, 0.2]"], "view.crop_scale: expected [lo, hi]"),
    ({}, ["train.phases=A200"], "train.phases: expected NAME:EPOCHS"),
    ({}, ["eval.metrics=[knn, accuracy]"], "eval.metrics: unknown metric 'accuracy'"),
    ({"train": 3}, [], "train: expected a mapping"),
    ({}, ["train.lr"], "expected KEY=VALUE"),
    ({}, ["train.lr.x=1"], "train.lr: expected a number"),
    ({"train": {"lr": 0.1}}, ["train.lr.x=1"], "train.lr: is a value"),
    ({}, ["dataset.name=arrays"], "dataset.path: the `arrays` dataset needs"),
    ({}, ["train.compile=fast"], "train.compile: expected true or false or one of 'default', 'reduce"),
])
def test_bad_configs_are_refused_with_one_line_naming_the_key(tmp_path, data, overrides, message):
    import yaml

    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError) as err:
        check_config(load_config(path, overrides))
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_unreadable_yaml_and_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("train: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)


def test_yaml_is_loaded_safely(tmp_path):
    path = tmp_path / "evil.yaml"
    path.write_text("train: !!python/object/apply:os.system ['echo pwned']\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(path)


def test_apply_overrides_does_not_mutate_its_input():
    data = {"train": {"lr": 1.0}}
    apply_overrides(data, ["train.lr=2"])
    assert data == {"train": {"lr": 1.0}}


def test_phase_schedule_scales_to_the_run_and_keeps_order():
    assert parse_phases("A:200,B:400,A:800", 1400) == ["A"] * 200 + ["B"] * 400 + ["A"] * 800
    assert parse_phases("A:200,B:400,A:800", 14) == ["A"] * 2 + ["B"] * 4 + ["A"] * 8
    assert parse_phases("A:330,B:330,A:340", 10) == ["A"] * 3 + ["B"] * 4 + ["A"] * 3
    assert parse_phases("", 3) == ["", "", ""]
    assert len(parse_phases("A:1,B:1,A:1", 7)) == 7
    for bad in ("A", "A:0", "A:-1", ":3", "A:2,,B:1", "1A:2"):
        with pytest.raises(ValueError):
            parse_phases(bad, 10)


@pytest.mark.parametrize("key", ["train.seed", "dataset.split_seed", "search.seed"])
def test_seeds_are_those_numpy_and_scikit_learn_take_and_the_message_names_the_key(key):
    """0 .. 2^32 - 1 (numpy's and scikit-learn's `random_state`): a seed of 2e70 was torch's "Overflow
    when unpacking long long", a negative split seed blamed dataset.test_fraction."""
    from augtune.config import MAX_SEED

    assert load_config(None, [f"{key}={MAX_SEED}"])
    with pytest.raises(ConfigError, match=rf"^{key}: expected a number <= {MAX_SEED}, got 2000"):
        load_config(None, [f"{key}=2{'0' * 70}"])
    with pytest.raises(ConfigError, match=rf"^{key}: expected a number >= 0, got -1$"):
        load_config(None, [f"{key}=-1"])
    with pytest.raises(ConfigError, match=r"^search.repeat_best.seeds\[1\]: expected a number >= 0"):
        load_config(None, ["search.repeat_best.seeds=[1, -2]"])


def test_model_sizes_are_counted_from_the_config_before_anything_is_built():
    """A width of 10^12 is refused by the config check (it was a 36 TB allocation's traceback); the
    count it rests on is exact for every backbone and head (compared with the built networks)."""
    from augtune.config import ModelConfig
    from augtune.models.backbones import build_backbone, model_parameters
    from augtune.models.heads import predictor, projector

    with pytest.raises(ConfigError, match=r"^model.width: 1e\+12 makes a model that needs at least"):
        check_config(load_config(None, ["model.backbone=cnn", "model.width=1000000000000"]))
    check_config(load_config(None, ["model.backbone=resnet18", "model.width=1000000000000"]))  # unused
    for model, modality, shape in [(ModelConfig(backbone="mlp"), "vector", (64,)),
                                   (ModelConfig(backbone="mlp", num_layers=1, norm="none"), "vector", (5,)),
                                   (ModelConfig(backbone="cnn"), "image", (1, 8, 8)),
                                   (ModelConfig(backbone="cnn", norm="none"), "image", (3, 32, 32)),
                                   (ModelConfig(backbone="resnet18"), "image", (3, 32, 32))]:
        nets = [build_backbone(model, modality, shape)]
        nets += [projector(nets[0].out_dim, model), predictor(model)]
        built = sum(p.numel() for net in nets for p in net.parameters())
        assert model_parameters(model, modality, shape, predictor=True) == built
