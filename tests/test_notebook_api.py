"""What a notebook reaches for on a finished compare (`augtune.api`): the best configuration and its trained
encoder, the trials and the importances as numeric DataFrames, figures as objects, answers that render.

The fixture is a compare folder as augtune leaves it: each entrant's search trials (records only) and the
repeat runs of its best trial on two seeds, trained for real in this process (two epochs of a tiny MLP on
digits, about a second each), so that their checkpoints give back the networks that were scored."""
from __future__ import annotations

import json
import shutil
import statistics
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

import augtune
from augtune.config import Config, ConfigError, from_dict, set_values, to_dict

ENTRANTS = {"simclr": 0.05, "byol": 0.02}  # entrant -> the learning rate of its best search trial
SEEDS = (1, 2)


def _config(entrant: str, **dotted) -> Config:
    from conftest import TINY_MLP

    data = {"dataset": {"name": "digits", "as_vectors": True, "max_train": 256, "max_test": 128},
            "model": TINY_MLP, "method": {"base": entrant},
            "train": {"epochs": 2, "batch_size": 64, "num_threads": 1},
            "eval": {"metrics": ["knn"], "references": False}}
    return from_dict(set_values(to_dict(from_dict(data)), dotted))


def _search_trials(folder: Path, entrant: str, best_lr: float) -> None:
    """Three search trials of `entrant` (records only): the best at `best_lr`, one ASHA stopped."""
    from augtune.records import new_record, write_record

    trials = [(best_lr, 1e-5, 0.9, "completed"), (best_lr / 10, 1e-4, 0.7, "completed"),
              (best_lr / 100, 1e-6, 0.5, "stopped")]
    folder.mkdir(parents=True)
    config = to_dict(_config(entrant))
    (folder / "augtune_search.yaml").write_text(yaml.safe_dump({"config": config, "base": config}))
    for i, (lr, wd, knn, status) in enumerate(trials):
        params = {"train.lr": lr, "train.weight_decay": wd}
        record = new_record(to_dict(_config(entrant, **params)), method=entrant, dataset="digits", seed=0)
        epochs = [{"epoch": e, "knn_acc": knn - 0.1 / e, "epoch_time_s": 0.5}
                  for e in range(1, 3 if status == "completed" else 2)]
        record.update(status=status, phase="search", entrant=entrant, params=params, epochs=epochs,
                      final={"knn_acc": epochs[-1]["knn_acc"]} if status == "completed" else {},
                      started=f"2026-01-01T00:0{i}:00", seconds={"train": 1.0 + i, "eval": 0.25})
        (folder / f"trial_{i}").mkdir()
        write_record(folder / f"trial_{i}", record)


def _repeat_run(folder: Path, entrant: str, lr: float, seed: int) -> None:
    """A repeat run of `entrant`'s best trial on `seed`, trained here, recorded as in a Tune trial."""
    from augtune.data import load_dataset
    from augtune.records import write_record
    from augtune.trainables import train_run

    params = {"train.lr": lr, "train.weight_decay": 1e-5}
    cfg = _config(entrant, **params, **{"train.seed": seed})
    record = train_run(cfg, load_dataset(cfg.dataset), folder, log=lambda s: None)
    assert record["status"] == "completed"
    record.update(phase="repeat", entrant=entrant,
                  params={**params, "method.base": entrant, "method.augment": [], "train.seed": seed})
    write_record(folder, record)


@pytest.fixture(scope="module")
def compare(tmp_path_factory, one_thread) -> Path:
    exp = tmp_path_factory.mktemp("nb") / "cmp"
    exp.mkdir()
    settings = to_dict(_config("simclr", **{"compare.metrics": ["knn_acc"], "train.seed": 0}))
    (exp / "augtune_compare.yaml").write_text(yaml.safe_dump({"config": settings,
                                                              "entrants": list(ENTRANTS)}))
    for entrant, lr in ENTRANTS.items():
        _search_trials(exp / entrant, entrant, lr)
        for seed in SEEDS:
            _repeat_run(exp / "repeat" / f"{entrant}_{seed}", entrant, lr, seed)
    return exp


@pytest.fixture(scope="module")
def search(compare) -> Path:
    """A search folder of SimCLR alone: the compare's SimCLR trials and the repeat of its best."""
    exp = compare.parent / "search"
    shutil.copytree(compare / "simclr", exp)
    for seed in SEEDS:
        shutil.copytree(compare / "repeat" / f"simclr_{seed}", exp / "repeat_best" / f"trial_{seed}")
    return exp  # its augtune_search.yaml is the entrant's


def _records(exp: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(exp.rglob("record.json"))]


def _repeat_means(exp: Path) -> dict[str, float]:
    by = {}
    for r in _records(exp):
        if r["phase"] == "repeat":
            by.setdefault(r["entrant"], []).append(r["final"]["knn_acc"])
    return {e: statistics.fmean(v) for e, v in by.items()}


def test_the_best_of_a_compare_is_the_highest_mean_of_its_repeat_runs(compare):
    exp = augtune.load(compare)
    means = _repeat_means(compare)
    best = exp.best()
    assert isinstance(best, augtune.api.Best)
    assert best.entrant == max(means, key=means.get) and best.metric == "knn_acc"
    assert best.score == pytest.approx(means[best.entrant], abs=1e-12)
    assert (best.n, best.split) == (2, "test")
    records = {r["seed"]: r for r in _records(compare / "repeat") if r["entrant"] == best.entrant}
    assert best.seeds == {s: records[s]["final"]["knn_acc"] for s in SEEDS}
    assert best.std == pytest.approx(statistics.stdev(best.seeds.values()))
    # what was searched: not the method or the seed of the repeat run's parameters
    assert best.params == {"train.lr": ENTRANTS[best.entrant], "train.weight_decay": 1e-5}
    assert isinstance(best.config, Config) and best.config.train.lr == ENTRANTS[best.entrant]
    assert [run.record["seed"] for run in best.runs] == list(SEEDS)
    row = exp.verdict().best("knn_acc")  # the verdict's row says the same
    assert (row.entrant, row.cells["knn_acc"].mean, row.cells["knn_acc"].n) == (best.entrant, best.score, 2)
    other = next(e for e in ENTRANTS if e != best.entrant)
    assert exp.best(entrant=other).score == pytest.approx(means[other], abs=1e-12)
    with pytest.raises(ConfigError, match="'nope' is not one of byol, simclr"):
        exp.best(entrant="nope")


def test_the_best_config_trains_again_to_the_same_score(compare, tmp_path):
    best = augtune.load(compare).best()
    again = augtune.train(best.config, out=tmp_path / "again")
    assert again.final["knn_acc"] == best.seeds[SEEDS[0]]


def test_the_best_encoders_features_scored_again_give_the_recorded_knn(compare):
    import torch

    from augtune.data import load_dataset
    from augtune.eval import evaluate

    best = augtune.load(compare).best()
    encoder = best.encoder()
    assert isinstance(encoder, torch.nn.Module) and not encoder.training
    (x_train, y_train), (x_test, y_test) = best.features("train"), best.features("test")
    assert x_train.dtype == np.float32 and x_test.shape == (128, encoder.out_dim) and y_test.shape == (128,)
    data = load_dataset(best.config.dataset)
    with torch.no_grad():  # the encoder itself gives the features
        assert np.allclose(encoder(data.x_test).numpy(), x_test, atol=1e-6)
    assert np.array_equal(y_test, data.y_test.numpy())
    scored = evaluate(x_train, y_train, x_test, y_test, data.num_classes, best.config.eval, ("knn",),
                      seed=best.config.train.seed)
    assert scored["knn_acc"] == best.run.record["final"]["knn_acc"]


def test_a_notebook_goes_from_a_compare_to_a_scikit_learn_classifier_in_ten_lines(compare):
    notebook = f"""
import augtune
from sklearn.linear_model import LogisticRegression
exp = augtune.load({str(compare)!r})  # or augtune.compare(cfg)
best = exp.best()
encoder = best.encoder()  # the trained network, for features of new inputs
x_train, y_train = best.features("train")
x_test, y_test = best.features("test")
accuracy = LogisticRegression(max_iter=2000).fit(x_train, y_train).score(x_test, y_test)
"""
    lines = notebook.strip().splitlines()
    assert len(lines) <= 10
    scope: dict = {}
    exec(notebook, scope)
    assert 0.5 < scope["accuracy"] <= 1.0  # ten classes: chance is 0.1


def test_the_trials_are_one_numeric_row_per_trial(compare):
    df = augtune.load(compare).trials()
    records = _records(compare)
    assert len(df) == len(records) == 10  # 2 x 3 search trials, 2 x 2 repeat runs
    assert list(df.columns) == ["trial", "entrant", "phase", "state", "seed", "train.lr",
                                "train.weight_decay", "knn_acc", "epochs", "seconds"]
    for column in ("seed", "train.lr", "train.weight_decay", "knn_acc", "epochs", "seconds"):
        assert pd.api.types.is_numeric_dtype(df[column]), column
    assert list(df["phase"]) == ["search"] * 3 + ["repeat"] * 2 + ["search"] * 3 + ["repeat"] * 2
    by_trial = {(r["entrant"], r["phase"], r["params"]["train.lr"], r["seed"]): r for r in records}
    for row in df.to_dict("records"):
        r = by_trial[(row["entrant"], row["phase"], row["train.lr"], row["seed"])]
        assert row["state"] == r["status"] and row["epochs"] == len(r["epochs"])
        assert row["knn_acc"] == r["epochs"][-1]["knn_acc"]  # the value a search trial is ranked by
        assert row["seconds"] == pytest.approx(sum(r["seconds"].values()))
        if row["phase"] == "repeat":
            assert row["knn_acc"] == r["final"]["knn_acc"]
    assert set(df.loc[df["state"] == "stopped", "trial"]) == {"trial_2"}


def test_the_importances_are_numbers_equal_to_the_commands(compare):
    from augtune.analysis.importance import importances

    df = augtune.load(compare).importance()
    assert list(df.columns) == ["entrant", "key", "importance", "method"]
    assert df["importance"].dtype == np.float64 and set(df["entrant"]) == set(ENTRANTS)
    for entrant in ENTRANTS:
        values, how = importances([r for r in _records(compare / entrant)], "knn_acc")
        mine = df[df["entrant"] == entrant]
        assert dict(zip(mine["key"], mine["importance"])) == pytest.approx(values)
        assert set(mine["method"]) == {how}
        assert list(mine["importance"]) == sorted(mine["importance"], reverse=True)


def test_figures_are_returned_as_objects_and_written_on_request(compare, tmp_path, monkeypatch):
    import sys
    import types

    import matplotlib.pyplot as plt
    from matplotlib.figure import Figure

    from augtune import plots

    exp = augtune.load(compare)
    fig = exp.figure("search", which="parallel", path=tmp_path / "parallel.png")
    assert isinstance(fig, Figure) and (tmp_path / "parallel.png").stat().st_size > 10_000
    assert fig.number not in plt.get_fignums()  # pyplot lets it go: a notebook shows it once
    names = set(plots.figures("search", plots.find_runs([compare / "byol"])))
    assert names == {"search_history", "search_parallel", "search_importances"}
    # a figure of trained runs is drawn from the best configuration's runs and their checkpoints
    kind = types.ModuleType("augtune_test_norms")

    def figures(runs):
        fig, ax = plt.subplots()
        for run in runs:
            ax.hist(run.features("test").norm(dim=1).numpy(), label=run.label)
        return {f"norms_{run.record['seed']}": fig for run in runs[:1]} | {"seeds": plt.figure()}

    kind.figures = figures
    monkeypatch.setitem(sys.modules, kind.__name__, kind)
    monkeypatch.setitem(plots.PLOTS, "norms", kind.__name__)
    fig = exp.figure("norms")
    assert isinstance(fig, Figure) and fig.axes[0].patches
    assert exp.figure("norms", which="seeds") is not fig
    with pytest.raises(plots.PlotError, match="no figure named like 'nothing'"):
        exp.figure("norms", which="nothing")


def test_an_experiment_and_a_run_show_their_answer_in_a_few_lines(compare, search):
    exp = augtune.load(compare)
    best = exp.best()
    md = exp._repr_markdown_()
    assert md.startswith("**augtune compare** `cmp`: 6 search trials, 4 repeat runs")
    shown = f"knn_acc {100 * best.score:.2f} ± {100 * best.std:.2f} % (n = 2, test split)"
    assert f"**{best.entrant}**, {shown}" in md
    assert "the verdict names" in md and len(md) < 400
    html = exp._repr_html_()
    assert f"<b>{best.entrant}</b>" in html and "<code>cmp</code>" in html and "**" not in html
    run = best.run
    assert f"knn_acc {100 * run.record['final']['knn_acc']:.2f} %" in run._repr_markdown_()
    assert "completed after 2 epochs" in run._repr_html_()
    assert "train.lr = 0.05" in augtune.load(search)._repr_markdown_()
    assert best._repr_markdown_().startswith(f"**{best.entrant}**: knn_acc ")


def test_a_search_folder_gives_its_repeated_best_or_its_best_trial(search, tmp_path):
    exp = augtune.load(search)
    best = exp.best()
    assert (best.entrant, best.n, best.split) == ("simclr", 2, "test")
    assert best.score == pytest.approx(_repeat_means(search)["simclr"], abs=1e-12)
    assert best.params == {"train.lr": 0.05, "train.weight_decay": 1e-5}
    assert len(exp.trials()) == 5 and set(exp.importance()["entrant"]) == {"simclr"}
    bare = tmp_path / "bare"  # a search that repeated nothing: its best trial, one run
    shutil.copytree(search, bare, ignore=shutil.ignore_patterns("repeat_best"))
    best = augtune.load(bare).best()
    assert (best.n, best.score, best.params["train.lr"]) == (1, 0.85, 0.05)


def test_config_from_takes_its_overrides_by_keyword_beside_sections(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"train": {"epochs": 4}}))
    assert augtune.config_from(path, overrides={"train.lr": 0.02}).train.lr == 0.02
    cfg = augtune.config_from(path, overrides=["train.lr=0.01"], train={"batch_size": 32})
    assert (cfg.train.epochs, cfg.train.lr, cfg.train.batch_size) == (4, 0.01, 32)
    assert augtune.config_from(source={"train.epochs": 3}).train.epochs == 3


# -- resume: the CLI is the API's front door (one answer for each case) -----------------------------------

def _resume_both(path: Path, capsys) -> tuple[int, str, str, object]:
    """`augtune resume PATH` (exit code, stdout, stderr), then `augtune.resume(PATH)` (its Experiment, or
    the ConfigError it raised)."""
    from augtune.cli import main

    code = main(["resume", str(path)])
    out, err = capsys.readouterr()
    try:
        answer = augtune.resume(path)
    except ConfigError as e:
        answer = e
    return code, out, err, answer


@pytest.mark.parametrize("kind", ["compare", "search"])
def test_resuming_a_finished_experiment_answers_from_its_records_alike_and_starts_no_ray(
        kind, compare, search, tmp_path, capsys, monkeypatch):
    from augtune.search.experiment import mark_finished

    exp = tmp_path / kind
    shutil.copytree(compare if kind == "compare" else search, exp)
    mark_finished(str(exp))
    monkeypatch.setattr("augtune.api.run_job", lambda *a, **k: pytest.fail("a finished experiment ran"))
    code, out, err, answer = _resume_both(exp, capsys)
    assert code == 0 and err == ""
    said = "verdict" if kind == "compare" else "table"
    assert out.startswith(f"{exp} has finished; its {said}, from its records:\n")
    assert isinstance(answer, augtune.api.Experiment) and answer.path == str(exp)
    assert answer.is_compare == (kind == "compare")


def test_resuming_one_entrant_of_a_compare_is_refused_alike_naming_the_compare(compare, capsys):
    code, out, err, answer = _resume_both(compare / "simclr", capsys)
    line = (f"{compare / 'simclr'}: an entrant of the compare experiment {compare}, whose searches run "
            f"together; continue it with: augtune resume {compare}")
    assert (code, out, err) == (2, "", f"augtune: error: {line}\n")
    assert isinstance(answer, ConfigError) and str(answer) == line


def test_resuming_a_folder_that_is_no_experiment_is_refused_alike(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    code, out, err, answer = _resume_both(tmp_path / "empty", capsys)
    assert code == 2 and out == "" and err == f"augtune: error: {answer}\n"
    assert isinstance(answer, ConfigError) and "not an augtune experiment" in str(answer)
