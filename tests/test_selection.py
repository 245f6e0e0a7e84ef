"""Selection never sees the test split (issue 28.4) and what a compare's seeds vary (28.3): the
validation split a search's trials are scored on, the repeat runs' test split and per-seed splits, and
what the verdict says of them."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from augtune.analysis.verdict import RAW, splits_note, verdict
from augtune.config import ConfigError, DatasetConfig, from_dict, to_dict
from augtune.data import load_dataset
from augtune.search.compare import default_vary, plan_compare
from augtune.search.plan import fit_size, plan_config, selecting
from augtune.trainables.loop import Trainer
from augtune.trainables.ray_trainable import repeat_params, trial_config
from conftest import TINY_MLP

pytestmark = pytest.mark.usefixtures("one_thread")


def _rows(x: torch.Tensor) -> set[bytes]:
    return {r.numpy().tobytes() for r in x}


def _npz(path, seed=0, n=400, n_test=120, d=6, classes=3):
    """A vector data set with its own test split, the test split's labels given apart (to poison)."""
    rng = np.random.default_rng(seed)
    y, yt = rng.integers(0, classes, n), rng.integers(0, classes, n_test)
    x = rng.normal(size=(n, d)) + y[:, None]
    xt = rng.normal(size=(n_test, d)) + yt[:, None]
    return x.astype(np.float32), y, xt.astype(np.float32), yt


# ---------------------------------------------------------------------------------------------
# the data layer

@pytest.mark.parametrize("seed", range(5))
def test_the_validation_split_is_carved_from_training_and_holds_no_test_sample(tmp_path, seed):
    x, y, xt, yt = _npz(tmp_path, seed)
    np.savez(tmp_path / "d.npz", x=x, y=y, x_test=xt, y_test=yt)
    kw = dict(name="arrays", path=str(tmp_path / "d.npz"), standardize=False, split_seed=seed)
    full = load_dataset(DatasetConfig(**kw))
    val = load_dataset(DatasetConfig(**kw, evaluate_on="val", val_fraction=0.25))
    assert len(val.y_test) == 100 and len(val.y_train) == 300  # 25 % of 400 held out
    assert _rows(val.x_test) <= _rows(full.x_train) and not _rows(val.x_test) & _rows(full.x_test)
    assert not _rows(val.x_train) & _rows(val.x_test)
    assert _rows(val.x_train) | _rows(val.x_test) == _rows(full.x_train)
    # stratified: each class's share of the validation split is its share of the training split
    share = torch.bincount(full.y_train) / len(full.y_train)
    assert torch.allclose(torch.bincount(val.y_test) / len(val.y_test), share, atol=0.02)


@pytest.mark.parametrize("seed", range(3))
def test_both_holds_the_validation_split_beside_the_test_split(tmp_path, seed):
    """`evaluate_on: both` (a race's runs): the training rows and validation rows of `val`, and the test
    split of `test`, untouched."""
    x, y, xt, yt = _npz(tmp_path, seed)
    np.savez(tmp_path / "d.npz", x=x, y=y, x_test=xt, y_test=yt)
    kw = dict(name="arrays", path=str(tmp_path / "d.npz"), standardize=False, split_seed=seed,
              val_fraction=0.25)
    full, val, both = (load_dataset(DatasetConfig(**kw, evaluate_on=on)) for on in ("test", "val", "both"))
    assert torch.equal(both.x_train, val.x_train) and torch.equal(both.y_train, val.y_train)
    assert torch.equal(both.x_val, val.x_test) and torch.equal(both.y_val, val.y_test)
    assert torch.equal(both.x_test, full.x_test) and torch.equal(both.y_test, full.y_test)
    assert full.x_val is None and val.x_val is None
    with pytest.raises(ConfigError, match="evaluate_on: both needs a validation split"):
        from_dict({"dataset": {**kw, "val_fraction": 0, "evaluate_on": "both"}})


def test_a_run_on_both_splits_scores_each_as_the_runs_on_one(tmp_path):
    """The same seed trained without the validation rows: its val_<metric> is what a run scored on the
    validation split gets, its <metric> what the same model gets on the test split."""
    x, y, xt, yt = _npz(tmp_path)
    np.savez(tmp_path / "d.npz", x=x, y=y, x_test=xt, y_test=yt)
    finals = {}
    for on in ("val", "both"):
        cfg = from_dict({"dataset": {"name": "arrays", "path": str(tmp_path / "d.npz"), "evaluate_on": on},
                         "model": TINY_MLP, "train": {"epochs": 2, "batch_size": 64, "seed": 4},
                         "eval": {"metrics": ["knn", "linear"], "every": 0, "references": False}})
        t = Trainer(cfg, load_dataset(cfg.dataset), log=lambda s: None)
        finals[on] = t.fit()
        if on == "both":  # the test split's scores: the same model, the same training features
            on_test = dataclasses.replace(t.data, x_val=None, y_val=None)
            t.data = on_test
            assert {k: finals[on][k] for k in ("knn_acc", "linear_acc")} == \
                {k: v for k, v in t.evaluate(cfg.eval.metrics).items() if k in ("knn_acc", "linear_acc")}
    assert finals["both"]["val_knn_acc"] == finals["val"]["knn_acc"]
    assert finals["both"]["val_linear_acc"] == finals["val"]["linear_acc"]
    assert finals["both"]["knn_acc"] != finals["both"]["val_knn_acc"]  # a different split


def test_a_races_runs_are_scored_on_both_splits_and_other_repeats_on_the_test_split():
    base = {"compare": {"race": {"enabled": True}}}
    assert repeat_params({"train.seed": 1}, base, racing=True)["dataset.evaluate_on"] == "both"
    assert repeat_params({"train.seed": 1}, base)["dataset.evaluate_on"] == "test"


def test_vector_standardisation_is_fitted_on_the_training_rows_only(tmp_path):
    x, y, xt, yt = _npz(tmp_path)
    np.savez(tmp_path / "d.npz", x=x, y=y, x_test=xt, y_test=yt)
    val = load_dataset(DatasetConfig(name="arrays", path=str(tmp_path / "d.npz"), evaluate_on="val"))
    assert torch.allclose(val.x_train.mean(0), torch.zeros(6), atol=1e-5)
    assert not torch.allclose(val.x_test.mean(0), torch.zeros(6), atol=1e-3)


def test_resplit_draws_a_stratified_split_of_the_same_sizes_per_seed(tmp_path):
    x, y, xt, yt = _npz(tmp_path)
    np.savez(tmp_path / "d.npz", x=x, y=y, x_test=xt, y_test=yt)
    kw = dict(name="arrays", path=str(tmp_path / "d.npz"), standardize=False)
    given = load_dataset(DatasetConfig(**kw))
    everything = _rows(given.x_train) | _rows(given.x_test)
    tests = []
    for seed in range(1, 9):
        s = load_dataset(DatasetConfig(**kw, resplit=True, split_seed=seed))
        assert (len(s.y_train), len(s.y_test)) == (400, 120)
        assert _rows(s.x_train) | _rows(s.x_test) == everything and not _rows(s.x_train) & _rows(s.x_test)
        pooled = torch.cat([given.y_train, given.y_test])
        share = torch.bincount(pooled) / len(pooled)
        assert torch.allclose(torch.bincount(s.y_test) / 120, share, atol=0.02)
        tests.append(frozenset(_rows(s.x_test)))
        again = load_dataset(DatasetConfig(**kw, resplit=True, split_seed=seed))
        assert torch.equal(again.x_test, s.x_test)  # the seed decides it
    assert len(set(tests)) == 8  # every seed its own split


def test_the_config_refuses_what_cannot_work():
    with pytest.raises(ConfigError, match="evaluate_on: val needs"):
        from_dict({"dataset": {"evaluate_on": "val", "val_fraction": 0}})
    with pytest.raises(ConfigError, match="compare.vary"):
        from_dict({"compare": {"vary": ["split"]}})
    with pytest.raises(ConfigError, match="compare.vary"):
        from_dict({"compare": {"vary": ["init", "folds"]}})
    with pytest.raises(ConfigError, match="val_fraction"):
        from_dict({"dataset": {"val_fraction": 1.0}})


# ---------------------------------------------------------------------------------------------
# the search layer: trials on the validation split, repeats on the test split

def _cfg(path, **search) -> dict:
    return {"dataset": {"name": "arrays", "path": str(path), "max_test": None},
            "model": TINY_MLP, "view": {"name": "noise"},
            "train": {"epochs": 2, "batch_size": 32, "seed": 1},
            "eval": {"metrics": ["knn", "linear"], "epoch_metrics": ["knn"], "every": 1},
            "search": {"space": "simclr", "num_samples": 2, **search}}


def _search_trial_metrics(tmp_path, data_file) -> list[dict]:
    plan = plan_config(from_dict(_cfg(data_file)), storage=str(tmp_path / "runs"), name="s",
                       check_name_free=False)
    cfg = trial_config({"train.lr": 0.05, "train.temperature": 0.3}, plan.base)
    assert cfg.dataset.evaluate_on == "val"
    trainer = Trainer(cfg, load_dataset(cfg.dataset), log=lambda s: None)
    seen = []
    final = trainer.fit(on_epoch_end=lambda _, m, __: seen.append(m))
    return [*seen, final, trainer.references]


def test_poisoned_test_labels_leave_every_number_a_search_chooses_by_unchanged(tmp_path):
    """The search's metrics never read a test sample: with the test split's labels (and features)
    replaced by noise, a search trial reports exactly the same numbers, references included, so
    whatever it would choose is unchanged."""
    x, y, xt, yt = _npz(tmp_path, n=800)  # the space's batch sizes fit the 640 training rows
    np.savez(tmp_path / "clean.npz", x=x, y=y, x_test=xt, y_test=yt)
    rng = np.random.default_rng(1)
    np.savez(tmp_path / "poisoned.npz", x=x, y=y, x_test=rng.normal(size=xt.shape).astype(np.float32),
             y_test=rng.permutation(yt))
    clean = _search_trial_metrics(tmp_path, tmp_path / "clean.npz")
    poisoned = _search_trial_metrics(tmp_path, tmp_path / "poisoned.npz")

    def numbers(ms):
        return [{k: v for k, v in m.items() if isinstance(v, float) and not k.endswith(("_s", "per_s"))}
                for m in ms[:-1]] + [ms[-1]]

    assert numbers(clean) == numbers(poisoned)
    assert "knn_acc" in clean[-2]
    # ... while a run scored on the test split (a repeat) does see the poison
    runs = []
    for name in ("clean", "poisoned"):
        cfg = from_dict({**_cfg(tmp_path / f"{name}.npz"), "train": {"epochs": 1, "batch_size": 32}})
        runs.append(Trainer(cfg, load_dataset(cfg.dataset), log=lambda s: None).fit()["knn_acc"])
    assert runs[0] != runs[1]


def test_selecting_scores_on_validation_only_when_there_is_one():
    assert selecting(from_dict({})).dataset.evaluate_on == "val"
    assert selecting(from_dict({"dataset": {"val_fraction": 0}})).dataset.evaluate_on == "test"


def test_a_repeat_run_is_scored_on_the_test_split_and_varies_the_split_when_asked():
    base = to_dict(selecting(from_dict({"compare": {"vary": ["init"]}})))
    params = {"train.lr": 0.1, "train.seed": 7}
    cfg = trial_config(repeat_params(params, base), base)
    assert (cfg.dataset.evaluate_on, cfg.dataset.resplit, cfg.dataset.split_seed) == ("test", False, 0)
    base = to_dict(selecting(from_dict({"compare": {"vary": ["init", "split"]}})))
    cfg = trial_config(repeat_params(params, base), base)
    assert (cfg.dataset.evaluate_on, cfg.dataset.resplit, cfg.dataset.split_seed) == ("test", True, 7)
    assert params == {"train.lr": 0.1, "train.seed": 7}  # what names the configuration is untouched


def test_fit_size_is_what_a_search_trial_trains_on():
    data = load_dataset(DatasetConfig())
    val = load_dataset(DatasetConfig(evaluate_on="val", val_fraction=0.2))
    assert fit_size(data, 0.2) == len(val.y_train) == fit_size(val)


def test_vary_defaults_to_the_split_on_small_test_splits(tmp_path):
    assert default_vary(540) == ("init", "split") and default_vary(10_000) == ("init",)
    cfg = from_dict({"dataset": {"max_train": 320}, "compare": {"methods": ["base"], "trials": 1}})
    data = load_dataset(cfg.dataset)
    plan = plan_compare(cfg, data.modality, storage=str(tmp_path), name="c", data=data)
    assert plan.cfg.compare.vary == ("init", "split")
    assert all(p.base["compare"]["vary"] == ["init", "split"] for p in plan.plans)
    assert all(p.base["dataset"]["evaluate_on"] == "val" for p in plan.plans)
    fixed = from_dict({**to_dict(cfg), "compare": {**to_dict(cfg)["compare"], "vary": ["init"]}})
    plan = plan_compare(fixed, data.modality, storage=str(tmp_path), name="c", data=data)
    assert plan.cfg.compare.vary == ("init",)


# ---------------------------------------------------------------------------------------------
# what the verdict says

def _record(entrant, seed, value, raw=0.9, evaluate_on="test", resplit=False, fraction=0.2):
    return {"status": "completed", "method": entrant, "entrant": entrant, "seed": seed,
            "final": {"knn_acc": value}, "epochs": [{"epoch": 1, "epoch_time_s": 1.0}],
            "config": {"dataset": {"evaluate_on": evaluate_on, "val_fraction": fraction,
                                   "resplit": resplit}},
            "references": {"raw": {"knn_acc": raw}, "random-init": {"knn_acc": 0.5}}}


def test_the_verdict_says_which_split_chose_and_which_one_it_reports():
    repeat = [_record("a", s, 0.9) for s in (1, 2, 3)]
    search = [_record("a", 0, 0.8, evaluate_on="val")]
    note = splits_note(search, repeat)
    assert "validation split (20% of the training split" in note and "never read" in note
    assert note in verdict(repeat, ("knn_acc",), search=search).sentences()
    assert "optimistic" in splits_note([_record("a", 0, 0.8)], repeat)
    assert "optimistic" in splits_note([_record("a", 0, 0.8), _record("a", 1, 0.8, "val")], repeat)
    split = [_record("a", s, 0.9, resplit=True) for s in (1, 2, 3)]
    assert "each seed drew its own train/test split" in splits_note(search, split)
    assert splits_note([], repeat) == ""
    raced = [{**_record("a", s, 0.9, evaluate_on="both"), "candidate": f"a#{s % 2}"} for s in (1, 2, 3)]
    note = splits_note(search, raced)
    assert "the race chose between each entrant's finalists on the same validation split" in note
    assert "did not train on" in note and "optimistic" not in note
    assert "the race chose" not in splits_note(search, [{**r, "candidate": "a#0"} for r in raced])
    earlier = [{**_record("a", s, 0.9), "candidate": f"a#{s % 2}"} for s in (1, 2, 3)]  # scored on test only
    assert "finalists on the test split these numbers are on" in splits_note(search, earlier)


def test_raw_is_paired_by_seed_when_each_seed_has_its_own_split():
    """Each seed's split moves raw and the entrant together: paired, the entrant is reliably above raw;
    against raw's mean alone (the one-sample test) the split's spread hides it."""
    raws = [0.80, 0.90, 0.85, 0.95, 0.82]
    repeat = [_record("a", s, r + 0.01 + 0.001 * s, raw=r, resplit=True)
              for s, r in enumerate(raws, 1)]
    v = verdict(repeat, ("knn_acc",))
    assert v.decisions["knn_acc"].beats_raw == {"a": True}
    assert v.references[RAW]["knn_acc"] == pytest.approx(np.mean(raws))
    one = [_record("a", s, r + 0.01 + 0.001 * s, raw=0.87) for s, r in enumerate(raws, 1)]
    assert verdict(one, ("knn_acc",)).decisions["knn_acc"].beats_raw == {"a": False}


def test_a_batch_larger_than_what_a_search_trial_trains_on_names_the_validation_split(tmp_path):
    cfg = from_dict({"dataset": {"max_train": 256}, "compare": {"methods": ["base"], "trials": 1}})
    data = load_dataset(cfg.dataset)
    with pytest.raises(ConfigError, match=r"\(204 samples left after dataset.val_fraction's validation"):
        plan_compare(cfg, data.modality, storage=str(tmp_path), name="c", data=data)
