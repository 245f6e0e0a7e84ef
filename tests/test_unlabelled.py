"""Mostly unlabelled data (docs/guides/unlabelled.md): rows without a label train and are never scored,
in every format; `dataset.labels_per_class`; data with no label at all scored and compared by RankMe."""
from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

import augtune
from dataclasses import replace

from augtune.config import ConfigError, DatasetConfig
from augtune.data import DataError, load_dataset

ROOT = Path(__file__).resolve().parents[1]


def _digits():
    from sklearn.datasets import load_digits

    return load_digits(return_X_y=True)


def _write_csv(path: Path, x, labels, split=None) -> Path:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow([f"p{i}" for i in range(x.shape[1])] + ["label"] + ["split"] * (split is not None))
        for i, (row, label) in enumerate(zip(x, labels)):
            w.writerow([*(f"{v:g}" for v in row), label, *([split[i]] if split is not None else [])])
    return path


def _partly_labelled(tmp_path: Path, every: int = 10) -> tuple[Path, int]:
    """Digits with one row in `every` labelled, the others empty or NA (alternately)."""
    x, y = _digits()
    labels = [str(v) if i % every == 0 else ("" if i % 2 else " NA ") for i, v in enumerate(y)]
    return _write_csv(tmp_path / "part.csv", x, labels), sum(1 for lab in labels if lab)


def test_empty_and_na_labels_are_unlabelled_rows_not_a_class(tmp_path):
    path, _ = _partly_labelled(tmp_path)
    labelled = sum(1 for i in range(1797) if i % 10 == 0)
    d = load_dataset(DatasetConfig(name="arrays", path=str(path)))
    assert d.classes == tuple(str(c) for c in range(10)) and d.num_classes == 10
    assert len(d.y_train) + len(d.y_test) == labelled
    assert len(d.x_unlabeled) == 1797 - labelled
    x, y = d.pretrain()
    assert len(x) == 1797 - len(d.y_test) and int((y == -1).sum()) == 1797 - labelled
    # the unlabelled rows are the CSV's rows without a label, standardised with the rest
    raw = load_dataset(DatasetConfig(name="arrays", path=str(path), standardize=False))
    digits, _ = _digits()
    assert torch.equal(raw.x_unlabeled, torch.from_numpy(digits[[i for i in range(1797) if i % 10]]).float())


def test_a_csv_without_any_label_is_all_unlabelled(tmp_path):
    x, _ = _digits()
    path = _write_csv(tmp_path / "none.csv", x, [""] * len(x))
    d = load_dataset(DatasetConfig(name="arrays", path=str(path), evaluate_on="val"))
    assert (d.num_classes, len(d.y_train), len(d.y_test), len(d.x_unlabeled)) == (0, 0, 0, 1797)
    from augtune.data.datasets import describe_rows

    assert describe_rows(d).startswith("no labels: 1797 unlabelled rows")


@pytest.mark.parametrize("labels, match", [
    (lambda y: [str(v) if i != 7 else "seven" for i, v in enumerate(y)], "data row 8 holds 'seven'"),
    (lambda y: [str(v) if i != 3 else "2.5" for i, v in enumerate(y)], "non-integer labels such as '2.5'"),
])
def test_labels_that_look_numeric_but_are_not_are_one_line(tmp_path, labels, match):
    x, y = _digits()
    with pytest.raises(DataError, match=match) as e:
        load_dataset(DatasetConfig(name="arrays", path=str(_write_csv(tmp_path / "bad.csv", x, labels(y)))))
    assert "\n" not in str(e.value)


def test_whole_number_labels_written_as_floats_are_the_integers(tmp_path):
    x, y = _digits()
    path = _write_csv(tmp_path / "f.csv", x, [f"{v}.0" for v in y])
    d = load_dataset(DatasetConfig(name="arrays", path=str(path)))
    assert d.classes == tuple(str(c) for c in range(10))


def test_an_empty_feature_column_a_lone_label_and_an_unlabelled_test_row_are_refused(tmp_path):
    path = tmp_path / "gap.csv"
    path.write_text("a,b,label\n1,,x\n2,,y\n3,,x\n4,,y\n")
    with pytest.raises(DataError, match="column 'b' is empty in every row"):
        load_dataset(DatasetConfig(name="arrays", path=str(path)))
    x, y = _digits()
    lone = [str(v) if v != 3 else "" for v in y]
    lone[np.flatnonzero(y == 3)[0]] = "3"
    with pytest.raises(DataError, match="class '3' has a single labelled row"):
        load_dataset(DatasetConfig(name="arrays", path=str(_write_csv(tmp_path / "lone.csv", x, lone))))
    split = ["train"] * len(y)
    split[5] = "test"
    labels = [str(v) if i != 5 else "" for i, v in enumerate(y)]
    with pytest.raises(DataError, match="data row 6 is a test row without a label"):
        load_dataset(DatasetConfig(name="arrays", path=str(_write_csv(tmp_path / "s.csv", x, labels, split))))


def test_an_npz_may_carry_unlabelled_rows(tmp_path):
    x, y = _digits()
    np.savez(tmp_path / "d.npz", x=x[:500], y=y[:500], x_unlabeled=x[500:])
    d = load_dataset(DatasetConfig(name="arrays", path=str(tmp_path / "d.npz")))
    assert len(d.y_train) + len(d.y_test) == 500 and len(d.x_unlabeled) == 1297
    np.savez(tmp_path / "bad.npz", x=x[:500], y=y[:500], x_unlabeled=x[500:, :10])
    with pytest.raises(DataError, match="x_unlabeled has samples of shape"):
        load_dataset(DatasetConfig(name="arrays", path=str(tmp_path / "bad.npz")))


def _image_tree(root: Path, classes=("a", "b"), per_class=6, unlabelled=7, folder="unlabeled") -> Path:
    from PIL import Image

    rng = np.random.default_rng(0)
    for c in classes:
        (root / c).mkdir(parents=True)
        for i in range(per_class):
            Image.fromarray(rng.integers(0, 255, (10, 10, 3), dtype=np.uint8)).save(root / c / f"{i}.png")
    (root / folder / "deeper").mkdir(parents=True)
    for i in range(unlabelled):
        pixels = rng.integers(0, 255, (10, 10, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(root / folder / "deeper" / f"{i}.png")
    return root


def test_an_image_folders_unlabeled_folder_trains_and_is_no_class(tmp_path):
    root = _image_tree(tmp_path / "imgs")
    got = {}
    for cache in ("memory", "none"):
        d = load_dataset(DatasetConfig(name="imagefolder", path=str(root), image_size=8, cache=cache,
                                       test_fraction=0.34, shared=False))
        assert d.classes == ("a", "b") and len(d.y_train) + len(d.y_test) == 12 and len(d.x_unlabeled) == 7
        got[cache] = d.x_unlabeled if cache == "memory" else d.x_unlabeled[torch.arange(7)]
        assert len(d.pretrain()[0]) == len(d.y_train) + 7
    assert torch.equal(got["memory"], got["none"])
    other = _image_tree(tmp_path / "other", folder="extra")
    d = load_dataset(DatasetConfig(name="imagefolder", path=str(other), image_size=8, unlabeled_dir="extra",
                                   shared=False))
    assert d.classes == ("a", "b") and len(d.x_unlabeled) == 7  # the folder named is no class
    d = load_dataset(DatasetConfig(name="imagefolder", path=str(other), image_size=8, shared=False))
    assert d.classes == ("a", "b", "extra") and d.x_unlabeled is None  # not named: a class like any other
    with pytest.raises(ConfigError, match="dataset.unlabeled_dir: is for imagefolder"):
        augtune.config_from({"dataset": {"name": "digits", "unlabeled_dir": "u"}})


def test_an_image_folder_of_unlabelled_images_only_has_no_labels(tmp_path):
    root = _image_tree(tmp_path / "imgs", classes=())
    d = load_dataset(DatasetConfig(name="imagefolder", path=str(root), image_size=8, shared=False))
    assert (d.num_classes, len(d.y_train), len(d.x_unlabeled)) == (0, 0, 7)


def test_labels_per_class_keeps_exactly_n_per_class_seeded_and_the_rest_trains_unlabelled():
    full = load_dataset(DatasetConfig(name="digits"))
    for n in (1, 5, 25):
        d = load_dataset(DatasetConfig(name="digits", labels_per_class=n))
        assert np.bincount(d.y_train.numpy()).tolist() == [n] * 10
        assert len(d.y_train) + len(d.x_unlabeled) == len(full.y_train)  # every training row still trains
        assert torch.equal(d.y_test, full.y_test)  # the test split keeps its labels
    seeds = [load_dataset(DatasetConfig(name="digits", labels_per_class=5, split_seed=s)).x_train
             for s in range(6)]
    assert torch.equal(seeds[0], load_dataset(DatasetConfig(name="digits", labels_per_class=5)).x_train)
    assert all(not torch.equal(seeds[0], other) for other in seeds[1:])
    # which rows are kept is uniform over a class: over many seeds each row of a class is drawn about
    # equally often (chi-squared against uniform, class by class)
    from scipy.stats import chisquare

    counts = np.zeros(len(full.y_train))
    for seed in range(200):
        counts[_kept(full, seed)] += 1
    for c in range(10):
        rows = np.flatnonzero(full.y_train.numpy() == c)
        assert counts[rows].sum() == 200 * 5 and chisquare(counts[rows]).pvalue > 1e-3


def _kept(full, seed: int) -> np.ndarray:
    """The training rows `labels_per_class: 5` keeps under `seed` (the selection itself, on digits)."""
    from augtune.data.datasets import _few_labels

    mark = torch.arange(len(full.y_train), dtype=torch.float32).view(-1, 1, 1, 1).expand(-1, *full.shape)
    d = _few_labels(replace(full, x_train=mark.contiguous()), 5, seed)
    return d.x_train[:, 0, 0, 0].long().numpy()


def test_labels_per_class_leaves_the_validation_split_its_labels():
    d = load_dataset(DatasetConfig(name="digits", labels_per_class=3, evaluate_on="both"))
    full = load_dataset(DatasetConfig(name="digits", evaluate_on="both"))
    assert torch.equal(d.y_val, full.y_val) and np.bincount(d.y_train.numpy()).tolist() == [3] * 10


def test_a_label_metric_on_data_without_labels_is_refused_naming_it(tmp_path):
    from augtune.checks import check_against_data

    x, _ = _digits()
    path = _write_csv(tmp_path / "none.csv", x, [""] * len(x))
    data = load_dataset(DatasetConfig(name="arrays", path=str(path)))
    cfg = augtune.config_from({"dataset.name": "arrays", "dataset.path": str(path)})
    with pytest.raises(ConfigError, match="eval.metrics: knn needs labels and this data has none"):
        check_against_data(cfg, data)
    free = augtune.config_from(cfg, {"eval.metrics": ["rankme"], "eval.epoch_metrics": [],
                                     "method.augment": ["cocor"]})
    with pytest.raises(ConfigError, match="cocor.mmnn"):
        check_against_data(free, data)
    check_against_data(augtune.config_from(free, {"cocor.mmnn": False}), data)


def test_a_lower_is_better_score_is_refused_where_the_highest_would_win():
    from augtune.search.plan import check_metric

    cfg = augtune.config_from({"eval.metrics": ["knn", "uniformity"], "search.metric": "uniformity"})
    with pytest.raises(ConfigError, match="search.mode: max would choose the worst uniformity"):
        check_metric(cfg)
    check_metric(augtune.config_from(cfg, {"search.mode": "min"}))


@pytest.mark.parametrize("first", ["alignment", "uniformity"])
def test_a_compare_that_selects_on_a_lower_is_better_score_minimises_it_everywhere(first):
    """Each entrant's search, the race and the importances minimise alignment or uniformity."""
    from augtune.analysis.race import race_settings
    from augtune.search.compare import plan_compare

    cfg = augtune.config_from({"compare.metrics": [first, "knn_acc"], "compare.methods": ["base", "pinda"],
                               "compare.race": {"enabled": True}, "eval.metrics": ["knn", first]})
    plan = plan_compare(cfg, "vector", storage="/tmp/x", name="x")
    assert [p.cfg.search.mode for p in plan.plans] == ["min", "min"]
    assert {p.cfg.search.metric for p in plan.plans} == {first}
    assert race_settings(plan.cfg.compare, 0).mode == "min"
    assert race_settings(augtune.config_from(cfg, {"compare.metrics": ["knn_acc"]}).compare, 0).mode == "max"
    # a label-first compare keeps maximising its accuracy
    plan = plan_compare(augtune.config_from(cfg, {"compare.metrics": ["knn_acc", first]}), "vector",
                        storage="/tmp/x", name="x")
    assert [p.cfg.search.mode for p in plan.plans] == ["max", "max"]


def _free_runs(metric, means, untrained, raw, spread=0.01):
    """Repeat records of entrants with `means` of a label-free `metric` over three paired seeds."""
    return [{"status": "completed", "entrant": e, "method": e, "seed": s,
             "final": {metric: v + spread * (s - 2) * (1 if k % 2 else -1)},
             "references": {"random-init": {metric: untrained}, "raw": {metric: raw}},
             "rows": {"train": 0, "test": 0, "unlabeled": 500},
             "config": {"train": {"seed": s}, "dataset": {"evaluate_on": "test"}}, "phase": "repeat"}
            for k, (e, v) in enumerate(means.items()) for s in (1, 2, 3)]


def test_the_verdict_ranks_a_lower_is_better_column_by_its_lowest_mean():
    from augtune.analysis.verdict import verdict

    repeat = _free_runs("alignment", {"simclr": 0.60, "simclr+pinda": 0.40}, untrained=0.90, raw=1.50)
    v = verdict(repeat, ("alignment",))
    d = v.decisions["alignment"]
    assert d.leader == "simclr+pinda" and d.winner == "simclr+pinda" and d.worse == ["simclr"]
    assert v.best("alignment").entrant == "simclr+pinda"
    # below the untrained encoder and the raw input is better: both beat them, tested one-sided below
    assert d.beats_untrained == {"simclr": True, "simclr+pinda": True}
    assert d.beats_raw == {"simclr": True, "simclr+pinda": True}
    text = v.render("md")
    assert "simclr+pinda is best on alignment" in text and "simclr is significantly above it" in text
    assert "**0.400 ± 0.010 (3)**" in text and "(the lowest for alignment)" in v.caption()
    assert "lower meaning views closer together" in text and "rankme" not in text
    # the same numbers as a higher-is-better column would crown the other entrant: the sign decides
    flipped = verdict(_free_runs("rankme", {"simclr": 0.60, "simclr+pinda": 0.40}, 0.90, 1.50), ("rankme",))
    assert flipped.decisions["rankme"].leader == "simclr"


def test_an_entrant_above_the_untrained_uniformity_does_not_beat_it():
    from augtune.analysis.verdict import verdict

    repeat = _free_runs("uniformity", {"simclr": -2.0, "simclr+pinda": -3.0}, untrained=-2.5, raw=-1.0)
    v = verdict(repeat, ("uniformity",))
    d = v.decisions["uniformity"]
    assert d.leader == "simclr+pinda" and d.beats_untrained == {"simclr": False, "simclr+pinda": True}
    assert d.winner == "simclr+pinda"
    assert v.row("simclr+pinda").cells["uniformity"].note == "best"
    tied = verdict(_free_runs("uniformity", {"a": -2.0, "b": -2.001}, -3.0, -1.0, spread=0.2),
                   ("uniformity",))
    td = tied.decisions["uniformity"]
    assert td.leader == "b" and not td.separated and td.winner is None
    assert tied.row("b").cells["uniformity"].note == "lowest mean"
    assert "lowest mean: b" in tied.render("md") and "b has the lowest uniformity" in tied.plainly()
    assert td.beats_untrained == {"a": False, "b": False}


def test_a_run_on_partly_labelled_data_trains_on_every_row_and_scores_the_labelled(tmp_path):
    path, _ = _partly_labelled(tmp_path, every=4)
    cfg = augtune.config_from({"dataset.name": "arrays", "dataset.path": str(path), "train.epochs": 1,
                               "train.batch_size": 64, "eval.metrics": ["knn", "rankme", "alignment"],
                               "eval.epoch_metrics": [], "eval.references": False})
    run = augtune.train(cfg, out=tmp_path / "run")
    rows = run.record["rows"]
    assert rows["unlabeled"] > 0 and rows["train"] + rows["test"] + rows["unlabeled"] == 1797
    final = run.record["final"]
    assert 0 < final["knn_acc"] <= 1 and 1 <= final["rankme"] <= 256 and 0 <= final["alignment"] <= 4
    # a step per 64 of every training row, labelled or not
    data = load_dataset(cfg.dataset)
    from augtune.trainables.loop import Trainer

    assert Trainer(cfg, data, log=lambda s: None).steps_per_epoch == (rows["train"] + rows["unlabeled"]) // 64


def test_a_run_on_data_without_labels_reports_the_label_free_scores(tmp_path):
    x, _ = _digits()
    path = _write_csv(tmp_path / "none.csv", x, [""] * len(x))
    cfg = augtune.config_from({"dataset.name": "arrays", "dataset.path": str(path), "train.epochs": 1,
                               "eval.metrics": ["rankme", "uniformity"], "eval.epoch_metrics": ["rankme"]})
    run = augtune.train(cfg, out=tmp_path / "run")
    assert set(run.record["final"]) >= {"rankme", "uniformity"}
    assert set(run.record["references"]["random-init"]) == {"rankme", "uniformity"}
    assert run.record["rows"] == {"train": 0, "test": 0, "unlabeled": 1797}


def test_the_verdict_of_data_without_labels_claims_no_accuracy():
    from augtune.analysis.verdict import verdict

    def run(entrant, seed, value):
        return {"status": "completed", "entrant": entrant, "method": entrant, "seed": seed,
                "final": {"rankme": value},
                "references": {"random-init": {"rankme": 90.0}, "raw": {"rankme": 50.0}},
                "rows": {"train": 0, "test": 0, "unlabeled": 1797},
                "config": {"train": {"seed": seed}, "dataset": {"evaluate_on": "test"}}, "phase": "repeat"}

    repeat = [run(e, s, v + s) for e, v in (("simclr", 60.0), ("simclr+pinda", 70.0)) for s in (1, 2, 3)]
    v = verdict(repeat, ("rankme",), search=[])
    text = v.render("md")
    assert v.unlabelled and "No accuracy is claimed here: this data has no labels." in text
    assert "acc" not in text.split("\n\n")[1]  # the table: rankme only
    assert "rankme in dimensions" in v.caption() and "72.00 ± 1.00 (3)" in text


@pytest.mark.slow
@pytest.mark.ray
def test_a_compare_of_a_csv_without_labels_selects_by_rankme(tmp_path):
    """End to end through the CLI: a tiny CSV with no label at all compares on rankme, and says so."""
    x, _ = _digits()
    path = _write_csv(tmp_path / "none.csv", x[:400, ::4], [""] * 400)
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({
        "dataset": {"name": "arrays", "path": str(path)},
        "model": {"backbone": "mlp", "hidden_dim": 32, "num_layers": 2, "embed_dim": 16},
        "train": {"epochs": 1, "batch_size": 64, "num_threads": 1},
        "compare": {"methods": ["base", "cocor"], "trials": 1, "seeds": 2},
    }))
    out = subprocess.run([sys.executable, "-m", "augtune.cli", "compare", str(config), "--storage",
                          str(tmp_path / "res"), "--name", "nolabels"], cwd=ROOT, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "data: no labels: 400 unlabelled rows" in out.stdout and "selecting on rankme" in out.stdout
    assert "No accuracy is claimed here" in out.stdout
    table = [line for line in out.stdout.splitlines() if line.startswith("| entrant")]
    assert table and "rankme" in table[0] and "acc" not in table[0]
    saved = yaml.safe_load((tmp_path / "res" / "nolabels" / "augtune_compare.yaml").read_text())
    assert saved["config"]["compare"]["metrics"] == ["rankme"]
    records = [json.loads(p.read_text()) for p in (tmp_path / "res" / "nolabels").rglob("record.json")]
    assert records and all(r["config"]["cocor"]["mmnn"] is False for r in records if "cocor" in r["method"])
