"""The compare verdict: its statistics against scipy, Holm's correction, and the marking rules on
hand-made records (a clear winner, rows within noise, n = 1, an entrant that did not train)."""
from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from augtune.analysis.verdict import holm, verdict


def record(entrant: str, seed: int, value: float, **final) -> dict:
    return {"status": "completed", "method": entrant, "entrant": entrant, "seed": seed,
            "final": {"knn_acc": value, **final}, "epochs": [{"epoch": 1, "epoch_time_s": 1.0}],
            "references": {"raw": {"knn_acc": 0.95}, "random-init": {"knn_acc": 0.5}}}


def runs(values: dict[str, list[float]], **final) -> list[dict]:
    return [record(name, seed, v, **final) for name, vs in values.items() for seed, v in enumerate(vs, 1)]


def test_holm_matches_a_hand_worked_example():
    # p sorted 0.01, 0.02, 0.04 with m = 3: 0.03, max(0.03, 0.04), max(0.04, 0.04)
    assert holm([0.04, 0.01, 0.02]) == pytest.approx([0.04, 0.03, 0.04])
    assert holm([0.5, 0.6]) == pytest.approx([1.0, 1.0])
    try:
        from statsmodels.stats.multitest import multipletests
    except ImportError:
        return
    p = [0.001, 0.04, 0.03, 0.2, 0.011]
    assert holm(p) == pytest.approx(list(multipletests(p, method="holm")[1]))


def test_p_values_are_scipys_paired_test_over_shared_seeds():
    rng = np.random.default_rng(0)
    a, b, c = (
        0.9 + 0.01 * rng.normal(size=5),
        0.85 + 0.01 * rng.normal(size=5),
        0.89 + 0.01 * rng.normal(size=5),
    )
    v = verdict(runs({"a": list(a), "b": list(b), "c": list(c)}), ("knn_acc",))
    assert v.test.startswith("paired")
    rows = {r.entrant: r.cells["knn_acc"] for r in v.rows}
    assert rows["b"].p == pytest.approx(stats.ttest_rel(a, b).pvalue)
    assert rows["c"].p == pytest.approx(stats.ttest_rel(a, c).pvalue)
    assert [rows["b"].p_holm, rows["c"].p_holm] == pytest.approx(holm([rows["b"].p, rows["c"].p]))


def test_unshared_seeds_fall_back_to_welch():
    recs = runs({"a": [0.90, 0.91, 0.92]}) + [record("b", s, v) for s, v in ((7, 0.80), (8, 0.82), (9, 0.81))]
    v = verdict(recs, ("knn_acc",))
    assert v.test == "Welch's t-test"
    b = {r.entrant: r.cells["knn_acc"] for r in v.rows}["b"]
    assert b.p == pytest.approx(
        stats.ttest_ind([0.90, 0.91, 0.92], [0.80, 0.82, 0.81], equal_var=False).pvalue
    )


def test_a_clear_winner_is_the_only_bold_row():
    v = verdict(runs({"win": [0.97, 0.98, 0.975], "lose": [0.80, 0.81, 0.805], "worse": [0.70, 0.72, 0.71]}),
                ("knn_acc",))
    bold = {r.entrant for r in v.rows if r.cells["knn_acc"].bold}
    assert bold == {"win"}
    assert "win is best" in v.sentences()[0] and "significantly worse" in v.sentences()[0]
    assert "it beats the raw input" in v.sentences()[0]


def test_rows_within_noise_are_all_bold_and_said_to_be_indistinguishable():
    v = verdict(
        runs({"a": [0.90, 0.94, 0.92], "b": [0.91, 0.93, 0.90], "c": [0.92, 0.90, 0.93]}), ("knn_acc",)
    )
    assert all(r.cells["knn_acc"].bold for r in v.rows)
    assert "not distinguishable" in v.sentences()[0]
    assert "nothing beats the raw input (95.00)" in v.sentences()[0]


def test_n_equal_one_carries_no_test_says_so_and_is_not_bold():
    v = verdict(runs({"a": [0.90, 0.91, 0.92], "single": [0.91]}), ("knn_acc",))
    single = {r.entrant: r for r in v.rows}["single"].cells["knn_acc"]
    assert single.p is None and single.note == "untested (n = 1)"
    assert not single.bold  # within the noise of the best, but nothing shows it: no bold without a test
    md = v.render("md")
    assert "| single | 91.00 ± 0.00 (1) |" in md and "untested (n = 1)" in md
    assert "a row with n = 1 is untested and not bold" in v.caption()
    assert "single cannot be tested (n = 1)" in v.sentences()[0]
    # a best row with n = 1: every other row is untested; only the best is bold
    v = verdict(runs({"top": [0.95], "b": [0.90, 0.91, 0.92]}), ("knn_acc",))
    cells = {r.entrant: r.cells["knn_acc"] for r in v.rows}
    assert cells["top"].bold and not cells["b"].bold and cells["b"].note == "untested (n = 1)"


def test_flagged_entrants_are_left_out_of_holms_family():
    a, b = [0.90, 0.92, 0.91, 0.93], [0.88, 0.91, 0.88, 0.90]
    recs = runs({"a": a, "b": b}) + runs({"diffaug": [0.90, 0.93, 0.90, 0.92]}, diffaug_generator_steps=12.0)
    v = verdict(recs, ("knn_acc",))
    cells = {r.entrant: r.cells["knn_acc"] for r in v.rows}
    p = stats.ttest_rel(a, b).pvalue
    assert cells["b"].p == pytest.approx(p)
    assert cells["b"].p_holm == pytest.approx(p)  # a family of one: b; the flagged entrant is not ranked
    assert cells["diffaug"].p is None and cells["diffaug"].p_holm is None and not cells["diffaug"].bold
    alone = verdict(runs({"a": a, "b": b}), ("knn_acc",))
    assert {r.entrant: r.cells["knn_acc"].p_holm for r in alone.rows}["b"] == pytest.approx(cells["b"].p_holm)


def test_an_entrant_that_did_not_train_is_flagged_not_the_winner():
    recs = runs({"ok": [0.90, 0.91, 0.92]}) + runs(
        {"diffaug": [0.99, 0.99, 0.99]}, diffaug_generator_steps=12.0
    )
    v = verdict(recs, ("knn_acc",))
    assert v.best("knn_acc").entrant == "ok"
    flagged = {r.entrant: r for r in v.rows}["diffaug"]
    assert "generator barely trained: 12 updates" in flagged.flag and not flagged.cells["knn_acc"].bold
    assert "Not ranked: diffaug" in v.sentences()[0] and "significantly worse" not in v.sentences()[0]


def test_renders_markdown_csv_and_latex_with_its_packages():
    v = verdict(runs({"a": [0.90, 0.91, 0.92], "a+x": [0.80, 0.81, 0.82]}), ("knn_acc",))
    assert "| **91.00 ± 1.00 (3)** |" in v.render("md")
    assert v.render("csv").splitlines()[0].startswith("entrant,knn_acc")
    tex = v.render("latex")
    assert tex.startswith("% needs \\usepackage{booktabs}") and "\\textbf{91.00 $\\pm$ 1.00 (3)}" in tex
    assert {r.entrant: r.relative_cost for r in v.rows}["a+x"] == pytest.approx(1.0)
