"""augtune.analysis: records on disk -> DataFrame -> comparison tables, on synthetic records.

Every number below is computed by hand from the records written here; only the `slow` test trains.
"""
from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from augtune.analysis import (AnalysisError, MixedDatasetsError, NoFinishedRunsError, NoRecordsError,
                              SkippedRecordWarning, UnknownColumnError, UnknownMetricError, comparison_table,
                              completed, find_records, load_runs)
from augtune import cli
from augtune.config import from_dict, set_values, to_dict
from augtune.records import new_record, write_record

ROOT = Path(__file__).resolve().parents[1]


def make_run(folder: Path, *, method: str = "simclr", dataset: str = "digits", seed: int = 0,
             final: dict | None = None, refs: dict | None = None, status: str = "completed",
             error: str | None = None, params: dict | None = None, **settings) -> Path:
    """A record as `augtune train` writes it: the full resolved config, `settings` as dotted keys
    (`params`: a search trial's, as the search writes them)."""
    base, *augment = method.split("+")
    dotted = {"dataset.name": dataset, "method.base": base, "method.augment": augment, "train.seed": seed}
    dotted.update({k.replace("__", "."): v for k, v in settings.items()})  # train__lr=0.1 -> train.lr
    record = new_record(to_dict(from_dict(set_values({}, dotted))), method=method, dataset=dataset, seed=seed)
    record.update(status=status, error=error, final=final or {}, references=refs or {},
                  epochs=[{"epoch": 1, **(final or {})}])
    if params is not None:
        record.update(params=params, phase="search", entrant=method)
    folder.mkdir(parents=True, exist_ok=True)
    write_record(folder, record)
    return folder


def write_search_file(exp: Path, *, num_samples: int, top: int, seeds: list[int]) -> None:
    """The search's own file (`augtune_search.yaml`), as a search writes it at its start."""
    search = {"num_samples": num_samples, "repeat_best": {"top": top, "seeds": seeds}}
    cfg = to_dict(from_dict({"search": search}))
    exp.mkdir(parents=True, exist_ok=True)
    (exp / "augtune_search.yaml").write_text(yaml.safe_dump({"config": cfg, "base": cfg, "name": exp.name}))


def refs(seed: int) -> dict:
    """raw: kNN 0.95 whatever the seed, SR 0.90 + 0.01 seed; random-init: kNN 0.50 + 0.02 seed."""
    return {
        "raw": {"knn_acc": 0.95, "sr_acc": 0.90 + 0.01 * seed},
        "random-init": {"knn_acc": 0.50 + 0.02 * seed},
    }


@pytest.fixture
def experiment(tmp_path) -> Path:
    """A Ray-like experiment: trial folders at two depths, a checkpoint snapshot, a stray file."""
    exp = tmp_path / "exp_digits"
    make_run(exp / "trial_0_a1", seed=0, final={"knn_acc": 0.80, "sr_acc": 0.70}, refs=refs(0))
    make_run(exp / "trial_1_b2", seed=1, final={"knn_acc": 0.82, "sr_acc": 0.74}, refs=refs(1))
    make_run(exp / "group" / "trial_2_c3", seed=2, final={"knn_acc": 0.84}, refs=refs(2))
    make_run(exp / "trial_3_d4", method="byol", seed=0, final={"knn_acc": 0.90, "sr_acc": 0.60}, refs=refs(0))
    make_run(exp / "trial_4_e5", method="byol", seed=1, final={"knn_acc": 0.86}, refs=refs(1))
    make_run(exp / "trial_5_f6", method="byol", seed=2, final={"knn_acc": 0.10}, refs=refs(2),
             status="failed", error="loss became nan at epoch 3")
    make_run(exp / "trial_6_g7", method="byol", seed=3, refs=refs(3), status="running")
    # A snapshot of trial 0 inside its checkpoint: not a second run.
    make_run(exp / "trial_0_a1" / "checkpoint_000000", seed=0, final={"knn_acc": 0.11}, refs=refs(0))
    (exp / "stray").mkdir()
    (exp / "stray" / "record.json").write_text(json.dumps({"something": "else"}))
    return exp


def load(*paths) -> pd.DataFrame:
    with pytest.warns(SkippedRecordWarning, match="stray"):
        return load_runs(paths)


EXPECTED_MD = """\
Table: unfinished (1 running run left out): knn_acc in %: mean ± std (n runs); best per column in bold

| method | digits |
| :--- | ---: |
| byol | **88.00 ± 2.83 (2)** |
| simclr | 82.00 ± 2.00 (3) |
| *references* | |
| raw | 95.00 ± 0.00 (3) |
| random-init | 52.00 ± 2.00 (3) |
"""


# -- the DataFrame -----------------------------------------------------------------------------


def test_one_row_per_run_plus_deduplicated_references(experiment):
    df = load(experiment)
    runs, references = df[df["kind"] == "run"], df[df["kind"] == "reference"]
    assert len(runs) == 7  # the checkpoint snapshot and the stray file are not runs
    assert sorted(Path(r).name for r in runs["run"]) == [
        f"trial_{i}" for i in ["0_a1", "1_b2", "2_c3", "3_d4", "4_e5", "5_f6", "6_g7"]
    ]
    assert set(df["experiment"]) == {"exp_digits"}
    assert list(df.columns[:9]) == [
        "run",
        "experiment",
        "kind",
        "status",
        "error",
        "method",
        "dataset",
        "seed",
        "epochs_done",
    ]
    for key in ("train.lr", "method.base", "dataset.as_vectors", "model.width", "search.repeat_best.top"):
        assert key in df.columns
    assert runs["method.augment"].iloc[0] == ()  # lists become hashable tuples
    assert runs["view.crop_scale"].iloc[0] == (0.2, 1.0)
    assert list(df.columns[-2:]) == ["knn_acc", "sr_acc"]
    # Both methods measured the same references at seeds 0-2: one row per (reference, seed).
    assert len(references) == 8
    assert sorted(zip(references["method"], references["seed"])) == [
        ("random-init", s) for s in range(4)] + [("raw", s) for s in range(4)]
    seed0 = references[(references["method"] == "raw") & (references["seed"] == 0)].iloc[0]
    assert seed0["measured_by"] == 2 and seed0["knn_acc"] == 0.95 and seed0["sr_acc"] == 0.90
    assert pd.isna(seed0["train.lr"])  # references do not depend on it


def test_unfinished_runs_are_in_the_frame_with_their_status(experiment):
    df = load(experiment)
    runs = df[df["kind"] == "run"].set_index("seed")
    byol = runs[runs["method"] == "byol"]
    assert byol.loc[2, "status"] == "failed" and byol.loc[2, "error"] == "loss became nan at epoch 3"
    assert byol.loc[3, "status"] == "running"
    # References measured by a completed run count as completed; seed 3's only by a running one.
    ref_status = df[df["kind"] == "reference"].groupby("seed")["status"].first()
    assert list(ref_status) == ["completed", "completed", "completed", "running"]
    done = completed(df)
    assert set(done["status"]) == {"completed"} and len(done) == 5 + 6
    with pytest.warns(SkippedRecordWarning):
        assert len(load_runs(experiment, completed_only=True)) == 11


def test_reference_dedup_rule(tmp_path):
    """Same reference = same name, dataset, seed, dataset.* and eval settings (+ model.* for random-init)."""
    exp = tmp_path / "exp"
    raw, ri = {"knn_acc": 0.95}, {"knn_acc": 0.5}
    make_run(exp / "a", seed=0, refs={"raw": raw, "random-init": ri}, final={"knn_acc": 0.8})
    make_run(exp / "b", method="byol", seed=0, final={"knn_acc": 0.8},  # asked for more metrics
             refs={"raw": {**raw, "sr_acc": 0.9}, "random-init": {**ri, "sr_acc": 0.4}})
    make_run(exp / "c", seed=0, model__width=8, refs={"raw": raw, "random-init": {"knn_acc": 0.6}})
    make_run(exp / "d", seed=1, refs={"raw": raw, "random-init": ri})
    make_run(exp / "e", seed=0, train__lr=0.01, refs={"raw": raw, "random-init": ri})
    make_run(exp / "f", seed=0, dataset__as_vectors=True, refs={"raw": raw, "random-init": ri})
    make_run(exp / "g", seed=0, eval__knn_k=20, refs={"raw": raw, "random-init": ri})
    ref = load_runs(exp).query("kind == 'reference'")
    by = {(r["method"], Path(r["run"]).name): r for _, r in ref.iterrows()}
    assert sorted(by) == [("random-init", x) for x in "acdfg"] + [("raw", x) for x in "adfg"]
    assert by[("raw", "a")]["measured_by"] == 4  # a, b, c (other backbone), e (other lr)
    assert by[("random-init", "a")]["measured_by"] == 3  # a, b, e
    assert by[("raw", "a")]["sr_acc"] == 0.9 and by[("random-init", "a")]["sr_acc"] == 0.4  # filled from b
    assert by[("random-init", "c")]["knn_acc"] == 0.6 and by[("random-init", "c")]["model.width"] == 8
    assert pd.isna(by[("raw", "a")]["model.width"])  # the raw input does not depend on the backbone


def test_paths_may_be_runs_records_or_nested_folders_and_count_once(experiment, tmp_path):
    plain = make_run(tmp_path / "runs" / "one", seed=5, final={"knn_acc": 0.5})
    df = load(experiment, experiment / "trial_0_a1", plain / "record.json")
    runs = df[df["kind"] == "run"]
    assert len(runs) == 8  # trial_0 given twice counts once
    assert runs.set_index("seed").loc[5, "experiment"] == "one"
    assert find_records(experiment / "trial_0_a1") == [experiment / "trial_0_a1" / "record.json"]
    # A trial that has only checkpoint snapshots: the last one stands for it.
    make_run(tmp_path / "exp2" / "t" / "checkpoint_000001", seed=0, final={"knn_acc": 0.2})
    make_run(tmp_path / "exp2" / "t" / "checkpoint_000002", seed=0, final={"knn_acc": 0.3})
    only = load_runs(tmp_path / "exp2")
    assert list(only["knn_acc"][only["kind"] == "run"]) == [0.3]


def test_not_a_record_warns_instead_of_crashing(tmp_path):
    make_run(tmp_path / "exp" / "ok", final={"knn_acc": 0.5})
    (tmp_path / "exp" / "broken").mkdir()
    (tmp_path / "exp" / "broken" / "record.json").write_text("{half")
    (tmp_path / "exp" / "other").mkdir()
    (tmp_path / "exp" / "other" / "record.json").write_text(json.dumps({"format": "someone.else/3"}))
    with pytest.warns(SkippedRecordWarning) as caught:
        df = load_runs(tmp_path / "exp")
    messages = sorted(str(w.message) for w in caught)
    assert "broken" in messages[0] and "not valid JSON" in messages[0]
    assert "other" in messages[1] and "not an augtune record" in messages[1]
    assert (df["kind"] == "run").sum() == 1


def test_importing_analysis_loads_neither_torch_nor_ray(experiment):
    """The analysis alone loads no torch, Ray, search or trainables; the export command (the CLI may
    reach `augtune.storage` for experiments in cloud storage) still loads no torch and no Ray."""
    code = f"""
import sys, warnings
warnings.simplefilter("ignore")
import augtune.analysis
from augtune.analysis.compare import answer
from augtune.plots import search
df = augtune.analysis.load_runs({str(experiment)!r})
augtune.analysis.comparison_table(df).to_latex()
def loaded(prefixes):
    return sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "ray", "torchvision")
                  or m.startswith(prefixes))
bad = loaded(("augtune.trainables", "augtune.search", "augtune.methods", "augtune.models"))
from augtune import cli
assert cli.main(["export", {str(experiment)!r}, "--format", "csv"]) == 0
bad += loaded(("augtune.trainables", "augtune.methods", "augtune.models"))
print("BAD", bad, file=sys.stderr)
sys.exit(1 if bad else 0)
"""
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr


# -- the table ---------------------------------------------------------------------------------


def test_mean_std_n_per_cell(experiment):
    table = comparison_table(load(experiment), metrics=("knn_acc", "sr_acc"))
    c = table.cells
    assert c[("simclr", "digits", "knn_acc")].mean == pytest.approx(0.82)
    assert c[("simclr", "digits", "knn_acc")].std == pytest.approx(0.02)  # ddof=1 over seeds 0-2
    assert c[("simclr", "digits", "knn_acc")].n == 3
    assert c[("byol", "digits", "knn_acc")].std == pytest.approx(0.0282842712)  # sqrt(2 * 0.02**2 / 1)
    assert c[("byol", "digits", "knn_acc")].n == 2  # the failed and the running run are left out
    assert c[("simclr", "digits", "sr_acc")].n == 2  # seed 2 did not report sr_acc
    assert c[("byol", "digits", "sr_acc")].n == 1 and pd.isna(c[("byol", "digits", "sr_acc")].std)
    assert (
        c[("raw", "digits", "sr_acc")].mean == pytest.approx(0.91) and c[("raw", "digits", "sr_acc")].n == 3
    )
    assert c[("random-init", "digits", "knn_acc")].std == pytest.approx(0.02)


def test_markdown_bolds_the_best_and_lists_references_last(experiment):
    assert comparison_table(load(experiment)).to_markdown() == EXPECTED_MD
    md = comparison_table(load(experiment), metrics="knn_acc,sr_acc").to_markdown()
    lines = md.splitlines()
    assert lines[2] == "| method | digits knn_acc | digits sr_acc |"
    assert "| simclr | 82.00 ± 2.00 (3) | **72.00 ± 2.83 (2)** |" in lines
    assert "| byol | **88.00 ± 2.83 (2)** | 60.00 (1) |" in lines
    assert lines[-3] == "| *references* | | |" and lines[-2].startswith("| raw |")


def test_latex_booktabs_bold_pm_and_escapes(experiment, tmp_path):
    make_run(tmp_path / "fm" / "r", dataset="fashion_mnist", final={"knn_acc": 0.85}, refs=refs(0))
    tex = comparison_table(load(experiment, tmp_path / "fm")).to_latex()
    lines = tex.splitlines()
    assert lines[1] == r"\begin{tabular}{lcc}" and lines[2] == r"\toprule"
    assert lines[3] == r"method & digits & fashion\_mnist \\"
    assert r"byol & \textbf{88.00 $\pm$ 2.83 (2)} & -- \\" in lines
    assert r"simclr & 82.00 $\pm$ 2.00 (3) & 85.00 (1) \\" in lines  # alone in its column: not bold
    assert lines[lines.index(r"raw & 95.00 $\pm$ 0.00 (3) & 95.00 (1) \\") - 1] == r"\midrule"
    assert lines[-2:] == [r"\bottomrule", r"\end{tabular}"]
    assert "±" not in tex and "_acc" not in tex.replace(r"\_acc", "")


def test_csv_is_machine_readable_without_bold(experiment):
    table = comparison_table(load(experiment), metrics=("knn_acc", "sr_acc"))
    text = table.to_csv()
    assert "**" not in text and "textbf" not in text and "±" not in text
    data = pd.read_csv(io.StringIO(text))
    assert list(data.columns) == ["method", "dataset", "metric", "mean", "std", "n", "kind", "best"]
    simclr = data[(data["method"] == "simclr") & (data["metric"] == "knn_acc")].iloc[0]
    assert simclr["mean"] == pytest.approx(0.82) and simclr["std"] == pytest.approx(0.02) and simclr["n"] == 3
    byol_sr = data[(data["method"] == "byol") & (data["metric"] == "sr_acc")].iloc[0]
    assert byol_sr["n"] == 1 and pd.isna(byol_sr["std"])  # undefined for one run: blank
    assert list(data["method"].drop_duplicates()) == ["byol", "simclr", "raw", "random-init"]
    assert set(data[data["best"]]["method"]) == {"byol", "simclr"}


def test_mode_and_unfinished_runs(experiment):
    df = load(experiment)
    low = comparison_table(df, mode="min")
    assert low.best == {("simclr", "digits", "knn_acc")}
    assert not comparison_table(df, mode=None).best
    everything = comparison_table(df, only_completed=False)
    assert everything.cells[("byol", "digits", "knn_acc")].n == 3  # the failed run's 0.10 counts now
    assert everything.cells[("raw", "digits", "knn_acc")].n == 4  # and seed 3's references


def test_any_columns_and_reference_placement(tmp_path):
    exp = tmp_path / "lr"
    for i, (lr, knn) in enumerate([(0.01, 0.70), (0.01, 0.74), (0.1, 0.60)]):
        make_run(exp / f"t{i}", seed=i, train__lr=lr, final={"knn_acc": knn}, refs=refs(i))
    df = load_runs(exp)
    md = comparison_table(df, rows="train.lr", cols="dataset").to_markdown().splitlines()
    assert md[4:6] == ["| 0.01 | **72.00 ± 2.83 (2)** |", "| 0.1 | 60.00 (1) |"]
    assert md[-2:] == ["| raw | 95.00 ± 0.00 (3) |", "| random-init | 52.00 ± 2.00 (3) |"]
    # With `method` across, references become the last columns; other keys are named in the header.
    md = comparison_table(df, rows="seed", cols="method").to_markdown().splitlines()
    assert md[2] == "| seed | simclr | raw | random-init |"
    md = comparison_table(df, rows="method", cols="train.lr").to_markdown().splitlines()
    assert md[2] == "| method | train.lr=0.01 | train.lr=0.1 |"
    assert md[-1] == "| random-init | 52.00 ± 2.00 (3) | 52.00 ± 2.00 (3) |"  # independent of the lr


def test_rows_may_combine_columns_and_method_sections_label_only_their_runs(tmp_path, capsys):
    exp = tmp_path / "pinda"
    make_run(exp / "t0", method="simclr", seed=0, final={"knn_acc": 0.70}, refs=refs(0))
    make_run(
        exp / "t1", method="simclr+pinda", seed=0, pinda__mu="zero", final={"knn_acc": 0.80}, refs=refs(0)
    )
    make_run(
        exp / "t2", method="simclr+pinda", seed=1, pinda__mu="zero", final={"knn_acc": 0.82}, refs=refs(1)
    )
    make_run(
        exp / "t3", method="simclr+pinda", seed=0, pinda__mu="learned", final={"knn_acc": 0.76}, refs=refs(0)
    )
    table = comparison_table(load_runs(exp), rows="method,pinda.mu", cols="dataset")
    # the plain SimCLR run also carries pinda.mu = zero (a default it never reads): not split by it
    assert table.row_labels == ["simclr", "simclr+pinda (pinda.mu=learned)", "simclr+pinda (pinda.mu=zero)",
                                "raw", "random-init"]
    assert table.cells[("simclr+pinda (pinda.mu=zero)", "digits", "knn_acc")].n == 2
    assert table.reference_axis == "rows"  # references still follow the axis that leads with method
    assert cli.main(["export", str(exp), "--rows", "method, pinda.mu, train.lr"]) == 0
    assert "| simclr+pinda (pinda.mu=zero, train.lr=0.001) |" in capsys.readouterr().out
    with pytest.raises(UnknownColumnError, match="rows: no column 'pinda.sigma'"):
        comparison_table(load_runs(exp), rows="method,pinda.sigma")


# -- errors ------------------------------------------------------------------------------------


def test_no_records(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(NoRecordsError, match=r"no augtune records \(record.json\) found under .*empty"):
        load_runs([tmp_path / "empty"])
    with pytest.raises(NoRecordsError, match="nowhere: no such file or folder"):
        load_runs([tmp_path / "nowhere"])


def test_no_finished_runs(tmp_path):
    exp = tmp_path / "exp_x"
    for i in range(3):
        make_run(exp / f"r{i}", seed=i, status="running")
    make_run(exp / "f", status="failed", error="loss became nan")
    with pytest.raises(NoFinishedRunsError, match="^no finished runs in exp_x: 3 running, 1 failed$"):
        comparison_table(load_runs(exp))


def test_unknown_metric_and_column(experiment):
    df = load(experiment)
    with pytest.raises(
        UnknownMetricError, match=r"no run reports metric 'linear_acc' \(available: knn_acc, sr_acc\)"
    ):
        comparison_table(df, metrics=["knn_acc", "linear_acc"])
    with pytest.raises(UnknownColumnError, match="cols: no column 'train.lrr'.*did you mean train.lr"):
        comparison_table(df, cols="train.lrr")
    with pytest.raises(AnalysisError, match="both 'method'"):
        comparison_table(df, cols="method")


def test_mixed_datasets_need_dataset_on_an_axis(experiment, tmp_path):
    make_run(tmp_path / "fm" / "r", dataset="fashion_mnist", final={"knn_acc": 0.85})
    df = load(experiment, tmp_path / "fm")
    with pytest.raises(
        MixedDatasetsError,
        match="^these runs span datasets digits, fashion_mnist: put dataset in "
        "--rows or --cols, or pass one experiment per dataset$",
    ):
        comparison_table(df, rows="method", cols="train.lr")
    assert comparison_table(df, rows="dataset", cols="method").row_labels == ["digits", "fashion_mnist"]


# -- the command -------------------------------------------------------------------------------


def test_export_prints_or_writes_the_table(experiment, tmp_path, capsys):
    assert cli.main(["export", str(experiment), "--format", "md"]) == 0
    out, err = capsys.readouterr()
    assert out == EXPECTED_MD
    assert err.startswith("augtune: warning: skipped") and "stray" in err
    target = tmp_path / "tables" / "t.tex"
    target.parent.mkdir()
    assert cli.main(["export", str(experiment), "--metric", "knn_acc,sr_acc", "--format", "latex",
                        "--out", str(target)]) == 0
    assert r"\multicolumn{2}{c}{digits}" in target.read_text()
    assert capsys.readouterr().out == f"wrote {target}: 4 rows x 1 columns\n"
    assert cli.main(["export", str(experiment), "--format", "csv", "--include-unfinished"]) == 0
    data = pd.read_csv(io.StringIO(capsys.readouterr().out)).set_index("method")
    assert data.loc["byol", "mean"] == pytest.approx((0.90 + 0.86 + 0.10) / 3) and data.loc["byol", "n"] == 3


@pytest.mark.parametrize("args,message", [
    (["{empty}"], "no augtune records (record.json) found under"),
    (["{exp}", "--metric", "nmi"], "no run reports metric 'nmi'"),
    (["{exp}", "--rows", "pinda.sigma"], "rows: no column 'pinda.sigma'"),
    (["{exp}", "--out", "{tmp}/no/such/dir/t.md"], "--out: folder"),
    (["{exp}", "--out", "{tmp}"], "is a folder"),
])
def test_export_bad_input_exits_2_with_one_error_line(experiment, tmp_path, capsys, args, message):
    (tmp_path / "empty").mkdir()
    argv = [a.format(exp=experiment, empty=tmp_path / "empty", tmp=tmp_path) for a in args]
    assert cli.main(["export", *argv]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("augtune: error:")]
    assert len(errors) == 1 and message in errors[0]


def test_wired_into_the_augtune_cli(experiment, capsys):
    from augtune import cli

    assert cli.main(["export", str(experiment)]) == 0
    assert capsys.readouterr().out == EXPECTED_MD


@pytest.mark.slow
def test_end_to_end_two_real_runs(tmp_path):
    exp = tmp_path / "exp"
    for seed in (0, 1):
        res = subprocess.run(
            [
                sys.executable,
                "-m",
                "augtune.cli",
                "train",
                "examples/quickstart.yaml",
                "--out",
                str(exp / f"s{seed}"),
                *sum(
                    (
                        ["--set", s]
                        for s in (
                            "train.epochs=1",
                            "eval.metrics=[knn]",
                            "dataset.max_train=300",
                            "model.width=4",
                            f"train.seed={seed}",
                        )
                    ),
                    [],
                ),
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert res.returncode == 0, res.stderr
    res = subprocess.run([sys.executable, "-m", "augtune.cli", "export", str(exp), "--format", "md"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[2] == "| method | digits |"
    assert lines[4].startswith("| simclr |") and lines[4].endswith(" (2) |")
    assert [line.split(" |")[0] for line in lines[-2:]] == ["| raw", "| random-init"]
    df = load_runs(exp)
    assert list(df["kind"]) == ["run", "run", "reference", "reference", "reference", "reference"]


def test_runs_that_differ_only_in_keys_they_do_not_read_count_once(tmp_path):
    exp = tmp_path / "grid"
    for seed in (1, 2):  # a grid crossed nrcc.negatives with plain SimCLR: the same run twice per seed
        for neg in ("sghmc", "augment"):
            make_run(
                exp / f"plain_{seed}_{neg}",
                seed=seed,
                final={"knn_acc": 0.5 + 0.1 * seed},
                nrcc__negatives=neg,
            )
            make_run(exp / f"nrcc_{seed}_{neg}", method="simclr+nrcc", seed=seed,
                     final={"knn_acc": 0.7 if neg == "sghmc" else 0.6}, nrcc__negatives=neg)
    text = comparison_table(load_runs(exp), rows="method,nrcc.negatives").to_markdown()
    assert "| simclr | 65.00 ± 7.07 (2) |" in text  # seeds 1 and 2 once each, not four runs
    assert "(nrcc.negatives=sghmc)" in text and "(nrcc.negatives=augment)" in text


# -- honest tables: no pooling of runs that read different settings, data sets told apart -------------


def test_runs_with_different_settings_or_data_files_are_never_pooled(tmp_path, capsys):
    """simclr runs at lr 0.1 and 0.01 on one CSV, at lr 0.1 on another (once pooled as one row and column)."""
    exp = tmp_path / "exp"
    a, b = str(tmp_path / "data" / "a.csv"), str(tmp_path / "data" / "b.csv")
    make_run(exp / "r0", dataset="arrays", seed=0, train__lr=0.1, dataset__path=a, final={"knn_acc": 0.90})
    make_run(exp / "r1", dataset="arrays", seed=1, train__lr=0.01, dataset__path=a, final={"knn_acc": 0.50})
    make_run(exp / "r2", dataset="arrays", seed=2, train__lr=0.1, dataset__path=b, final={"knn_acc": 0.70})
    make_run(exp / "r3", dataset="arrays", seed=3, train__lr=0.1, dataset__path=a, final={"knn_acc": 0.80})
    df = load_runs(exp)
    assert sorted(set(df["dataset"])) == ["arrays (a.csv)", "arrays (b.csv)"]
    assert set(df["dataset.name"]) == {"arrays"}
    with pytest.raises(MixedDatasetsError, match=r"span datasets arrays \(a.csv\), arrays \(b.csv\)"):
        comparison_table(df, cols="train.epochs")
    table = comparison_table(df)
    assert table.col_labels == ["arrays (a.csv)", "arrays (b.csv)"]
    assert table.row_labels == ["simclr (train.lr=0.01)", "simclr (train.lr=0.1)"]
    cells = {k: (round(c.mean, 6), c.n) for k, c in table.cells.items()}
    assert cells == {("simclr (train.lr=0.01)", "arrays (a.csv)", "knn_acc"): (0.5, 1),
                     ("simclr (train.lr=0.1)", "arrays (a.csv)", "knn_acc"): (0.85, 2),
                     ("simclr (train.lr=0.1)", "arrays (b.csv)", "knn_acc"): (0.7, 1)}
    # asked for: the learning rates pooled (never the data files: without dataset on an axis, refused)
    pooled = comparison_table(df, pool=["train.lr"])
    assert pooled.row_labels == ["simclr"]
    assert pooled.cells[("simclr", "arrays (a.csv)", "knn_acc")].n == 3
    assert cli.main(["export", str(exp), "--pool", "train.lr", "--pool", "train.seed"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Table: knn_acc in %: mean ± std (n runs, pooled over train.lr)\n")
    assert "| simclr | 73.33 ± 20.82 (3) | 70.00 (1) |" in out


def test_two_data_files_of_one_name_are_labelled_by_as_much_path_as_tells_them_apart(tmp_path):
    exp = tmp_path / "exp"
    for i, folder in enumerate(("x", "y")):
        make_run(exp / f"r{i}", dataset="arrays", dataset__path=str(tmp_path / folder / "data.csv"),
                 final={"knn_acc": 0.5})
    make_run(exp / "fm0", dataset="fashion_mnist", final={"knn_acc": 0.8})  # no path, no root: its name
    make_run(exp / "d0", dataset="digits", dataset__root="/srv/one/digits", final={"knn_acc": 0.9})
    make_run(exp / "d1", dataset="digits", dataset__root="/srv/two/digits", final={"knn_acc": 0.9})
    labels = sorted(set(load_runs(exp)["dataset"]))
    assert labels == ["arrays (x/data.csv)", "arrays (y/data.csv)", "digits (one/digits)",
                      "digits (two/digits)", "fashion_mnist"]


def test_a_row_names_every_setting_that_tells_its_runs_apart_with_the_digits_it_takes(tmp_path):
    exp = tmp_path / "exp"
    make_run(exp / "a0", seed=0, train__lr=0.000123451, model__width=8, final={"knn_acc": 0.6})
    make_run(exp / "a1", seed=1, train__lr=0.000123451, model__width=8, final={"knn_acc": 0.7})
    make_run(exp / "b0", seed=0, train__lr=0.000123452, model__width=8, final={"knn_acc": 0.8})
    make_run(exp / "c0", seed=0, train__lr=0.000123452, model__width=16, final={"knn_acc": 0.9})
    # differing only in what is never read or changes no score: same row (eval.metrics, search.*)
    make_run(exp / "c1", seed=1, train__lr=0.000123452, model__width=16, final={"knn_acc": 0.9},
             eval__metrics=["knn"], search__num_samples=9)
    table = comparison_table(load_runs(exp))
    assert table.row_labels == ["simclr (model.width=8, train.lr=0.000123451)",
                                "simclr (model.width=8, train.lr=0.000123452)",
                                "simclr (model.width=16, train.lr=0.000123452)"]
    assert [table.cells[(r, "digits", "knn_acc")].n for r in table.row_labels] == [2, 1, 2]
    with pytest.raises(UnknownColumnError, match=r"--pool: no config key 'train.lrr'.*did you mean train.lr"):
        comparison_table(load_runs(exp), pool=["train.lrr"])


def test_method_on_the_columns_splits_the_columns(tmp_path):
    exp = tmp_path / "exp"
    for seed in (0, 1):
        make_run(exp / f"a{seed}", seed=seed, train__lr=0.1, final={"knn_acc": 0.6}, refs=refs(seed))
        make_run(exp / f"b{seed}", seed=seed, train__lr=0.01, final={"knn_acc": 0.7}, refs=refs(seed))
    table = comparison_table(load_runs(exp), rows="seed", cols="method")
    assert table.col_labels == ["simclr (train.lr=0.01)", "simclr (train.lr=0.1)", "raw", "random-init"]
    assert table.row_labels == [0, 1]
    assert table.cells[(1, "random-init", "knn_acc")].mean == pytest.approx(0.52)


def test_export_of_a_search_folder_tabulates_its_repeat_best_runs(tmp_path, capsys):
    exp = tmp_path / "search"
    write_search_file(exp, num_samples=2, top=1, seeds=[1, 2])
    make_run(exp / "trial_0", seed=0, train__lr=0.1, final={"knn_acc": 0.99}, params={"train.lr": 0.1})
    make_run(exp / "trial_1", seed=0, train__lr=0.01, final={"knn_acc": 0.50}, params={"train.lr": 0.01})
    for seed, knn in ((1, 0.80), (2, 0.84)):
        make_run(exp / "repeat_best" / f"r{seed}", seed=seed, train__lr=0.1, final={"knn_acc": knn})
    assert cli.main(["export", str(exp)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Table: knn_acc in %")  # a finished search: no mark
    assert "| simclr | 82.00 ± 2.83 (2) |" in out and "99.00" not in out and "50.00" not in out
    # without a repeat: the trials, each configuration in its own row
    shutil.rmtree(exp / "repeat_best")
    write_search_file(exp, num_samples=2, top=0, seeds=[1, 2])
    assert cli.main(["export", str(exp)]) == 0
    out = capsys.readouterr().out
    assert "| simclr (train.lr=0.01) | 50.00 (1) |" in out
    assert "| simclr (train.lr=0.1) | **99.00 (1)** |" in out


def test_a_table_of_an_unfinished_search_says_so(tmp_path, capsys):
    exp = tmp_path / "search"
    write_search_file(exp, num_samples=4, top=1, seeds=[1, 2])
    make_run(exp / "trial_0", seed=0, final={"knn_acc": 0.9}, params={"train.lr": 0.001})
    make_run(exp / "trial_1", seed=0, train__lr=0.01, status="interrupted", params={"train.lr": 0.01})
    assert cli.main(["export", str(exp)]) == 0
    caption = capsys.readouterr().out.splitlines()[0]
    assert caption == ("Table: unfinished (search search: 1 of 4 trials ended, the best not repeated yet; "
                       "1 interrupted run left out): knn_acc in %: mean ± std (n runs)")
    make_run(exp / "trial_1", seed=0, train__lr=0.01, final={"knn_acc": 0.5}, params={"train.lr": 0.01})
    make_run(exp / "trial_2", seed=0, train__lr=0.02, final={"knn_acc": 0.5}, params={"train.lr": 0.02})
    make_run(exp / "trial_3", seed=0, train__lr=0.03, status="failed", params={"train.lr": 0.03})
    make_run(exp / "repeat_best" / "r1", seed=1, final={"knn_acc": 0.91})
    make_run(exp / "repeat_best" / "r2", seed=2, status="running")
    assert cli.main(["export", str(exp)]) == 0
    caption = capsys.readouterr().out.splitlines()[0]
    assert caption.startswith("Table: unfinished (search search: 1 of 2 repeat runs ended; "
                              "1 running run left out)")
    make_run(exp / "repeat_best" / "r2", seed=2, final={"knn_acc": 0.93})
    assert cli.main(["export", str(exp)]) == 0
    assert capsys.readouterr().out.startswith("Table: knn_acc in %: mean ± std (n runs)\n")


# -- records that are not what they say ----------------------------------------------------------------


def test_a_metric_that_is_not_a_number_is_left_out_with_one_warning_line_naming_the_record(tmp_path, capsys):
    exp = tmp_path / "exp"
    make_run(exp / "good", seed=0, final={"knn_acc": 0.90})
    bad = make_run(exp / "bad", seed=1, final={"knn_acc": 0.92})
    record = json.loads((bad / "record.json").read_text())
    record["final"] = {"knn_acc": "0.80", "sr_acc": 0.7}
    (bad / "record.json").write_text(json.dumps(record))
    assert cli.main(["export", str(exp), "--metric", "knn_acc,sr_acc"]) == 0
    out, err = capsys.readouterr()
    assert err.splitlines() == [f"augtune: warning: {bad / 'record.json'}: left out final.knn_acc = '0.80' "
                                "(not a number)"]
    assert "| simclr | 90.00 (1) | 70.00 (1) |" in out
    record["final"] = {}
    (bad / "record.json").write_text(json.dumps(record))
    assert cli.main(["export", str(exp)]) == 0
    assert "completed but it has no final metrics" in capsys.readouterr().err


@pytest.mark.parametrize("field,value,message", [
    ("final", [0.9], "final is a list, expected a mapping"),
    ("epochs", 3, "epochs is a int, expected a list"),
    ("seed", "1", "seed is a str, expected an integer"),
    ("config", None, "config is null, expected a mapping"),
    ("references", {"raw": 0.9}, "references.raw is a float, expected a mapping"),
    ("status", 1, "status is a int, expected a string"),
])
def test_a_broken_record_is_one_error_line_and_exit_2(tmp_path, capsys, field, value, message):
    exp = tmp_path / "exp"
    make_run(exp / "good", seed=0, final={"knn_acc": 0.90})
    bad = make_run(exp / "bad", seed=1, final={"knn_acc": 0.92})
    record = json.loads((bad / "record.json").read_text())
    record[field] = value
    (bad / "record.json").write_text(json.dumps(record))
    before = (bad / "record.json").read_bytes()
    assert cli.main(["export", str(exp)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [f"augtune: error: {bad / 'record.json'}: broken record: {message}"]
    assert (bad / "record.json").read_bytes() == before


# -- one rule for "what a run reads", one formatter, method sections from the config classes --------------


def test_run_signature_keeps_what_the_run_reads_and_scores_with():
    from augtune.config import flatten, run_signature

    flat = flatten(to_dict(from_dict({"train": {"lr": 0.1}, "cocor": {"lengths": [1, 2]}})))
    sig = dict(run_signature(flat, "moco"))
    assert sig["train.lr"] == 0.1 and sig["method.augment"] == () and "train.seed" in sig
    unread = ("cocor", "pinda", "nrcc", "diffaug", "search", "compare", "resources")
    assert not [k for k in sig if k.split(".")[0] in unread]
    assert {"eval.metrics", "eval.every", "train.device", "train.checkpoint_every"}.isdisjoint(sig)
    assert dict(run_signature(flat, "moco+cocor"))["cocor.lengths"] == (1, 2)  # hashable
    assert "pinda.clae_eps" in dict(run_signature(flat, "simclr+clae"))  # PiNDA's baselines read their keys
    assert "pinda.mu" not in dict(run_signature(flat, "simclr+clae"))
    assert "train.seed" not in dict(run_signature(flat, "moco", ignore=["train.seed"]))
    assert run_signature({"a.b": [1, {"x": 2}]}, "simclr") == (("a.b", (1, (("x", 2),))),)
    assert len({run_signature(flat, "moco"), run_signature(dict(flat), "moco")}) == 1
    from augtune.config import _NOT_WHAT_KEYS, dotted_keys

    assert _NOT_WHAT_KEYS <= dotted_keys()  # a renamed setting must not slip into what splits tables


def test_one_value_formatter():
    from augtune.config import format_value

    assert [format_value(v) for v in (True, None, (1, 2.5), 0.000123456, "zero", 3)] == [
        "true", "none", "[1, 2.5]", "0.0001235", "zero", "3"]
    assert format_value(0.000123456, None) == "0.000123456" and format_value(1e-05, None) == "1e-05"


def test_every_registered_augmentations_config_section_is_covered():
    """A section named after an augmentation is a method section (derived from `Config`'s field marks),
    and every method-section key an augmentation's code reads is one `key_applies` gives to its runs: so a
    new method cannot be forgotten and silently split (or pool) tables."""
    import ast
    import dataclasses
    import inspect

    from augtune.config import _KEY_READERS, METHOD_SECTIONS, Config, dotted_keys, key_applies
    from augtune.methods import AUGMENTATIONS

    sections = {f.name for f in dataclasses.fields(Config)}
    marked = {f.name for f in dataclasses.fields(Config) if f.metadata.get("method_section")}
    assert set(METHOD_SECTIONS) == marked
    assert set(METHOD_SECTIONS) <= set(AUGMENTATIONS)  # each is some augmentation's own section
    assert {s for s in sections if s in AUGMENTATIONS} <= set(METHOD_SECTIONS)
    assert set(_KEY_READERS) <= dotted_keys()
    assert {r for rs in _KEY_READERS.values() for r in rs} <= set(AUGMENTATIONS)
    checked = 0
    for name, cls in AUGMENTATIONS.items():
        tree = ast.parse(inspect.getsource(inspect.getmodule(cls)))
        for node in ast.walk(tree):  # cfg.<section>.<key> and `c = cfg.<section>` then c.<key>
            if isinstance(node, ast.ClassDef) and node.name == cls.__name__:
                reads = _method_keys_read(node, set(METHOD_SECTIONS))
                for key in reads:
                    assert key_applies(key, f"simclr+{name}"), (name, key)
                    checked += 1
    assert checked >= 10


def _method_keys_read(cls_node, method_sections: set[str]) -> set[str]:
    """Method-section keys a class reads: `cfg.pinda.mu`, `self.cfg.pinda.mu`, `c = cfg.pinda; c.mu`."""
    import ast

    aliases: dict[str, str] = {}
    for node in ast.walk(cls_node):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Attribute) and \
                node.value.attr in method_sections:
            for target in node.targets:
                for t in (target.elts if isinstance(target, ast.Tuple) else [target]):
                    name = t.attr if isinstance(t, ast.Attribute) else getattr(t, "id", None)
                    if name:
                        aliases[name] = node.value.attr
    keys = set()
    for node in ast.walk(cls_node):
        if not isinstance(node, ast.Attribute):
            continue
        inner = node.value
        if isinstance(inner, ast.Attribute) and inner.attr in method_sections:
            keys.add(f"{inner.attr}.{node.attr}")
        elif isinstance(inner, (ast.Name, ast.Attribute)) and \
                (inner.id if isinstance(inner, ast.Name) else inner.attr) in aliases:
            keys.add(f"{aliases[inner.id if isinstance(inner, ast.Name) else inner.attr]}.{node.attr}")
    return keys
