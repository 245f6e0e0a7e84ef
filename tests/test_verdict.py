"""The compare verdict: its statistics against scipy, Holm's correction, the detectable difference
against the noncentral t, and the marking and wording rules on hand-made records (a clear winner,
rows within noise, n = 1, an entrant that did not train, entrants no better than untrained, a
semi-supervised entrant, a race's decisions)."""
from __future__ import annotations

import re

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
    assert "win beats the raw input (95.00" in v.sentences()[0]
    assert "training beats the untrained encoder for every entrant" in v.sentences()[0]
    assert v.winner("knn_acc").entrant == "win"
    assert "could not be detected" not in v.sentences()[0]  # separated: nothing left undetected


def test_rows_within_noise_are_not_bold_and_no_entrant_is_called_best():
    # (was: every row within noise of the best was bold, and the best was "best": a headline
    # the test does not support)
    v = verdict(
        runs({"a": [0.90, 0.94, 0.92], "b": [0.91, 0.93, 0.90], "c": [0.92, 0.90, 0.93]}), ("knn_acc",)
    )
    assert not any(r.cells["knn_acc"].bold for r in v.rows) and v.winner("knn_acc") is None
    text = v.sentences()[0]
    assert text.startswith(
        "knn_acc: no entrant is separated (highest mean: a, 92.00 ± 2.00, n = 3)")
    assert "b, c are not distinguishable from it" in text and " is best" not in text
    assert "nothing beats the raw input (95.00)" in text
    assert "could not be detected with n = 3." in text
    assert "**" not in v.render("md")


def test_n_equal_one_carries_no_test_says_so_and_is_not_bold():
    v = verdict(runs({"a": [0.90, 0.91, 0.92], "single": [0.91]}), ("knn_acc",))
    single = {r.entrant: r for r in v.rows}["single"].cells["knn_acc"]
    assert single.p is None and single.note == "untested (n = 1)"
    assert not single.bold  # within the noise of the best, but nothing shows it: no bold without a test
    md = v.render("md")
    assert "| single | 91.00 ± 0.00 (1) |" in md and "untested (n = 1)" in md
    assert "a row with n = 1 is untested and not bold" in v.caption()
    assert "single cannot be tested (n = 1)" in v.sentences()[0]
    # a leader with n = 1: every other row is untested, and nothing is bold (was: the leader was)
    v = verdict(runs({"top": [0.95], "b": [0.90, 0.91, 0.92]}), ("knn_acc",))
    cells = {r.entrant: r.cells["knn_acc"] for r in v.rows}
    assert not cells["top"].bold and not cells["b"].bold and cells["b"].note == "untested (n = 1)"
    assert "with n = 1 nothing can be tested" in v.sentences()[0]


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
    import io

    import pandas as pd

    numbers = pd.read_csv(io.StringIO(v.render("csv")))  # numbers, not the cells' text
    a = numbers[(numbers["entrant"] == "a") & (numbers["metric"] == "knn_acc")].iloc[0]
    assert (a["mean"], a["std"], a["n"], a["best"]) == (pytest.approx(0.91), pytest.approx(0.01), 3, True)
    assert set(numbers["kind"]) >= {"entrant"}
    tex = v.render("latex")
    assert tex.startswith("% needs \\usepackage{booktabs}") and "\\textbf{91.00 $\\pm$ 1.00 (3)}" in tex
    assert {r.entrant: r.relative_cost for r in v.rows}["a+x"] == pytest.approx(1.0)


def test_the_table_is_a_dataframe_of_the_records_numbers_and_prints_as_before():
    """`table()` holds numbers (each entrant's mean, std and n over its repeat runs' records, in the
    metric's own units; the references after them); `table_text`, through `render`, prints it as the
    verdict always has (the golden lines below are the output before the table became a DataFrame)."""
    import pandas as pd

    values = {"good": [(0.95, 0.50), (0.96, 0.52), (0.955, 0.51)],
              "meh": [(0.80, 0.60), (0.82, 0.58), (0.79, 0.61)]}
    recs = [record(name, seed, knn, sr_acc=sr) for name, pairs in values.items()
            for seed, (knn, sr) in enumerate(pairs, 1)]
    untrained = {1: 0.80, 2: 0.81, 3: 0.80}
    v = verdict(with_references(recs, raw=0.9, untrained=untrained), ("knn_acc", "sr_acc"))
    table = v.table()
    assert isinstance(table, pd.DataFrame)
    per_metric = [f"{m}{s}" for m in ("knn_acc", "sr_acc") for s in ("", "_std", "_n", "_p_holm", "_best")]
    assert list(table.columns) == ["entrant", "kind", *per_metric, "cost_x_base", "compute_min", "note"]
    assert list(table["entrant"]) == ["good", "meh", "raw", "random-init"]
    assert list(table["kind"]) == ["entrant", "entrant", "reference", "reference"]
    rows = table.set_index("entrant")
    for name in values:
        for m in ("knn_acc", "sr_acc"):
            x = [r["final"][m] for r in recs if r["entrant"] == name]
            assert rows.loc[name, m] == pytest.approx(np.mean(x))  # a fraction, not a percentage
            assert rows.loc[name, f"{m}_std"] == pytest.approx(np.std(x, ddof=1))
            assert rows.loc[name, f"{m}_n"] == len(x)
            cell = v.row(name).cells[m]
            assert rows.loc[name, f"{m}_best"] == cell.bold
            assert (np.isnan(rows.loc[name, f"{m}_p_holm"]) if cell.p_holm is None
                    else rows.loc[name, f"{m}_p_holm"] == pytest.approx(cell.p_holm))
    assert rows["knn_acc_best"].to_dict() == {"good": True, "meh": False, "raw": False, "random-init": False}
    assert rows.loc["random-init", "knn_acc"] == pytest.approx(np.mean(list(untrained.values())))
    assert rows.loc["raw", "knn_acc"] == pytest.approx(0.9) and rows.loc["raw", "sr_acc_n"] == 0
    assert rows.loc["good", "compute_min"] == pytest.approx(3 * 1.0 / 60)  # three runs of one 1-s epoch
    assert rows.loc["good", "cost_x_base"] == pytest.approx(1.0) and np.isnan(rows.loc["raw", "cost_x_base"])
    assert rows.loc["meh", "note"] == "no better than untrained (knn_acc)"
    assert rows.loc["raw", "note"] == "reference"
    printed = [
        "| entrant | knn_acc | sr_acc | cost (x base) | compute | note |",
        "| :--- | ---: | ---: | ---: | ---: | :--- |",
        "| good | **95.50 ± 0.50 (3)** | 51.00 ± 1.00 (3) | 1.00x | 0.1 min |  |",
        "| meh | 80.33 ± 1.53 (3) | **59.67 ± 1.53 (3)** | 1.00x | 0.1 min "
        "| no better than untrained (knn_acc) |",
        "| *raw* | 90.00 ± 0.00 (3) | – |  |  | reference |",
        "| *random-init* | 80.33 ± 0.58 (3) | – |  |  | reference |",
    ]
    assert v.render("md", caption=False, plainly=False).split("\n\n")[0] == "\n".join(printed)
    assert v.table_text()[0] == ["entrant", "knn_acc", "sr_acc", "cost (x base)", "compute", "note"]
    assert len(v.table_text()) == len(table) + 1
    with pytest.raises(ValueError, match="markup"):
        v.table_text("latex")


# -- the detectable difference --------------------------------------------------------------------

def test_the_detectable_difference_has_power_0_8_by_the_noncentral_t_over_many_cases():
    from augtune.analysis.stats import detectable_difference

    rng = np.random.default_rng(0)
    for _ in range(300):
        sd, n = float(rng.uniform(0.001, 5.0)), int(rng.integers(2, 40))
        level = float(rng.choice([0.001, 0.005, 0.0121, 0.025, 0.05, 0.1]))
        sides = int(rng.choice([1, 2]))
        d = detectable_difference(sd, n, level, sides=sides)
        # the power of the paired t-test, computed here from its definition: the chance that the
        # statistic, noncentral t with df = n - 1 and nc = d sqrt(n) / sd, falls beyond the
        # critical value
        df, nc = n - 1, d * np.sqrt(n) / sd
        c = stats.t.ppf(1 - level / sides, df)
        # (the tail against the difference is below the central t's level / 2; scipy's nct.cdf
        # gives NaN
        # for some of its tiny values, which count as 0)
        wrong = np.nan_to_num(stats.nct.cdf(-c, df, nc)) if sides == 2 else 0.0
        power = stats.nct.sf(c, df, nc) + wrong
        assert power == pytest.approx(0.8, abs=1e-6), (sd, n, level, sides)
        twice = detectable_difference(2 * sd, n, level, sides=sides)
        assert twice == pytest.approx(2 * d, rel=1e-6)
        assert detectable_difference(sd, n + 1, level, sides=sides) < d
        if n >= 20:  # the textbook approximation (t_{1-level/2} + t_{0.8}) sd / sqrt(n)
            approx = (stats.t.ppf(1 - level / sides, df) + stats.t.ppf(0.8, df)) * sd / np.sqrt(n)
            assert d == pytest.approx(approx, rel=0.03)
    assert detectable_difference(1.0, 1, 0.05) == np.inf
    assert detectable_difference(0.0, 5, 0.05) == 0


def test_the_detectable_difference_is_detected_80_percent_of_the_time_in_simulation():
    from augtune.analysis.stats import detectable_difference

    rng = np.random.default_rng(1)
    for n, level in ((3, 0.05), (5, 0.0121), (10, 0.025)):
        d = detectable_difference(0.01, n, level)
        diffs = d + 0.01 * rng.standard_normal((20000, n))
        rate = (stats.ttest_1samp(diffs, 0, axis=1).pvalue < level).mean()
        assert rate == pytest.approx(0.8, abs=0.02), (n, level, rate)


def test_the_sentence_states_the_difference_the_run_could_not_detect():
    from augtune.analysis.stats import detectable_difference, pooled_sd

    a, b, c = [0.90, 0.94, 0.92, 0.91], [0.91, 0.93, 0.90, 0.92], [0.92, 0.90, 0.93, 0.90]
    v = verdict(runs({"a": a, "b": b, "c": c}), ("knn_acc",))
    sd = pooled_sd([np.subtract(a, b), np.subtract(a, c)])
    d = detectable_difference(sd, 4, 0.05 / 2)  # Holm's strictest step over the two tested rows
    assert v.decisions["knn_acc"].detectable == pytest.approx(d)
    said = f"Differences under {100 * d:.2g} points could not be detected with n = 4."
    assert said in v.sentences()[0]


# -- the untrained encoder and the raw input ------------------------------------------------------

def with_references(recs: list[dict], raw: float, untrained: dict[int, float]) -> list[dict]:
    for r in recs:
        r["references"] = {"raw": {"knn_acc": raw},
                           "random-init": {"knn_acc": untrained[r["seed"]]}}
    return recs


def test_every_entrant_above_raw_but_not_above_random_init_is_said_so():
    recs = with_references(runs({"a": [0.90, 0.94, 0.92], "b": [0.91, 0.93, 0.90]}), raw=0.80,
                           untrained={1: 0.93, 2: 0.94, 3: 0.92})
    v = verdict(recs, ("knn_acc",))
    text = v.sentences()[0]
    assert "every entrant beats the raw input but none beats the untrained encoder " \
           "(random-init 93.00 ± 1.00, n = 3)" in text
    assert v.decisions["knn_acc"].beats_raw == {"a": True, "b": True}
    assert v.decisions["knn_acc"].beats_untrained == {"a": False, "b": False}
    table = v.table()
    notes = table[table["kind"] == "entrant"].note
    assert all("no better than untrained (knn_acc)" in note for note in notes)
    assert "| *random-init* | 93.00 ± 1.00 (3) |" in v.render("md")  # references show ± and n
    assert "| *raw* | 80.00 ± 0.00 (3) |" in v.render("md")


def test_a_separated_leader_no_better_than_untrained_is_never_named_best():
    recs = with_references(runs({"top": [0.95, 0.96, 0.955], "low": [0.80, 0.81, 0.805]}), raw=0.5,
                           untrained={1: 0.97, 2: 0.95, 3: 0.96})
    v = verdict(recs, ("knn_acc",))
    d = v.decisions["knn_acc"]
    assert d.separated and d.winner is None and v.winner("knn_acc") is None
    assert not any(r.cells["knn_acc"].bold for r in v.rows)
    assert v.sentences()[0].startswith(
        "knn_acc: no entrant is best: top is separated from the others")
    assert "but no better than untrained" in v.sentences()[0]


def test_the_untrained_test_is_scipys_one_sided_paired_test_by_seed_holm_across_entrants():
    a, b = [0.90, 0.93, 0.91, 0.95], [0.89, 0.92, 0.93, 0.90]
    untrained = {1: 0.88, 2: 0.90, 3: 0.89, 4: 0.91}
    recs = with_references(runs({"a": a, "b": b}), raw=0.9, untrained=untrained)
    v = verdict(recs, ("knn_acc",))
    u = list(untrained.values())
    p = [stats.ttest_rel(x, u, alternative="greater").pvalue for x in (a, b)]
    raw_p = [stats.ttest_1samp(x, 0.9, alternative="greater").pvalue for x in (a, b)]
    cells = {r.entrant: r.cells["knn_acc"] for r in v.rows}
    assert [cells["a"].untrained_p, cells["b"].untrained_p] == pytest.approx(holm(p))
    assert [cells["a"].raw_p, cells["b"].raw_p] == pytest.approx(holm(raw_p))


def test_some_entrants_beat_the_untrained_encoder_and_the_others_are_marked():
    recs = with_references(runs({"good": [0.95, 0.96, 0.955], "meh": [0.80, 0.82, 0.79]}), raw=0.9,
                           untrained={1: 0.80, 2: 0.81, 3: 0.80})
    v = verdict(recs, ("knn_acc",))
    text = v.sentences()[0]
    assert "good is best" in text and "good beats the untrained encoder" in text
    assert "meh is no better than untrained" in text and "good beats the raw input (90.00" in text
    assert {r.entrant: r.cells["knn_acc"].bold for r in v.rows} == {"good": True, "meh": False}


# -- semi-supervised ------------------------------------------------------------------------------

def test_an_entrant_that_reads_labels_is_marked_semi_supervised():
    recs = runs({"simclr": [0.90, 0.91, 0.92]}) + runs({"simclr+cocor": [0.95, 0.96, 0.955]})
    v = verdict(recs, ("knn_acc",))
    assert {r.entrant: r.semi != "" for r in v.rows} == {"simclr": False, "simclr+cocor": True}
    assert "simclr+cocor (semi-supervised) is best" in v.sentences()[0]
    assert "simclr+cocor reads labels while training (CoCor's MMNN, 1% of train labelled): " \
           "semi-supervised" in v.sentences()[0]
    assert "semi-supervised" in v.table().set_index("entrant").loc["simclr+cocor", "note"]
    for r in recs:  # its config says the MMNN is off: it reads no labels
        r["config"] = {"method": {"augment": ["cocor"] if "cocor" in r["entrant"] else []},
                       "cocor": {"mmnn": False, "label_fraction": 0.01}}
    assert not any(r.semi for r in verdict(recs, ("knn_acc",)).rows)


# -- with a margin --------------------------------------------------------------------------------

def test_a_margin_says_which_entrants_are_shown_equivalent():
    a, b = [0.900, 0.920, 0.910, 0.905], [0.899, 0.919, 0.911, 0.903]
    v = verdict(runs({"a": a, "b": b}), ("knn_acc",), margin=0.01)
    assert v.decisions["knn_acc"].equivalent == ["b"]
    assert stats.ttest_1samp(np.subtract(a, b), 0.01, alternative="less").pvalue < 0.05
    assert "a, b are equivalent within ±1 points (TOST)" in v.sentences()[0]
    tight = verdict(runs({"a": a, "b": b}), ("knn_acc",), margin=0.0001)
    assert not tight.decisions["knn_acc"].equivalent


# -- with a race ----------------------------------------------------------------------------------

def race_records(means: dict[str, float], sd: float, seed: int, margin=None,
                 untrained: float = 0.5):
    """A race of candidates with these means run to its end, and the records it leaves."""
    from augtune.analysis import race

    rng = np.random.default_rng(seed)
    s = race.RaceSettings("knn_acc", tuple(range(1, 11)), 3, margin=margin)
    values = {c: mu + sd * rng.standard_normal(10) for c, mu in means.items()}
    state = race.start(s, [(c, c.split("#")[0], {"train.lr": 0.1}) for c in means])
    while not state.stopped:
        got: dict = {}
        for cid, k in race.due(state):
            got.setdefault(cid, {})[k] = float(values[cid][k - 1])
        state = race.advance(state, got)
    recs = [{"status": "completed", "method": c.split("#")[0], "entrant": c.split("#")[0],
             "candidate": c, "seed": k, "final": {"knn_acc": v}, "params": {"train.lr": 0.1},
             "epochs": [{"epoch": 1, "epoch_time_s": 1.0}],
             "references": {"raw": {"knn_acc": 0.95},
                            "random-init": {"knn_acc": untrained + 0.001 * k}}}
            for c, got in state.results.items() for k, v in got.items()]
    return state, recs


def test_a_race_winner_is_named_with_the_rounds_of_the_others():
    from augtune.analysis import race

    state, recs = race_records({"a#1": 0.97, "a#2": 0.965, "b#1": 0.90, "c#1": 0.80}, 0.004, 0)
    assert race.replay(state.settings, recs).to_dict() == state.to_dict()
    v = verdict(recs, ("knn_acc",), race=state)
    text = v.sentences()[0]
    assert v.winner("knn_acc").entrant == "a" and text.startswith("knn_acc: a is best (")
    assert "the race separated it from every other entrant" in text
    assert re.search(r"; b \(round \d\), c \(round \d\) were eliminated as significantly worse;",
                     text)
    rows = {r.entrant: r for r in v.rows}
    assert rows["b"].race_note.startswith("eliminated in round") and rows["a"].race_note == ""
    assert rows["a"].candidate in ("a#1", "a#2") and rows["a"].cells["knn_acc"].bold
    assert "was decided by a race" in v.caption()


def test_a_race_on_the_validation_split_is_said_apart_and_the_test_columns_are_tested_once():
    """The race decided on val_knn_acc (not a column): its rounds and eliminations get a sentence of their
    own, and knn_acc, on the test split, is tested by one look over the shared seeds, never by the race."""
    from augtune.analysis import race

    state, recs = race_records({"a#1": 0.97, "b#1": 0.96, "c#1": 0.80}, 0.004, 0)
    val = race.RaceSettings("val_knn_acc", state.settings.seeds, state.settings.min_seeds)
    for r in recs:  # the values the race saw, on the validation split; the test split says the reverse
        r["final"] = {"val_knn_acc": r["final"]["knn_acc"], "knn_acc": 1.7 - r["final"]["knn_acc"]}
    raced = race.replay(val, recs)
    assert raced.candidate("c#1").status == "eliminated"
    v = verdict(recs, ("knn_acc",), race=raced)
    said = v.sentences()
    assert not v.decisions["knn_acc"].by_race  # one look on the test split
    assert v.decisions["knn_acc"].leader == "c"  # the test split's own order, not the race's
    apart = next(t for t in said if t.startswith("The race (knn_acc on the validation split"))
    assert f"stopped after {len(raced.rounds)} rounds" in apart and "c#1 (round " in apart
    assert "tested once, on the test split" in apart
    assert "a race on the validation split (val_knn_acc, not a column)" in v.caption()
    assert "in the other columns" not in v.caption()


def test_a_race_of_equals_says_no_entrant_is_separated_and_what_it_could_not_detect():
    from augtune.analysis.stats import detectable_difference, pooled_sd

    state, recs = race_records({"a#1": 0.9, "b#1": 0.9, "c#1": 0.9}, 0.01, 3)
    assert state.stopped == "max_seeds"
    v = verdict(recs, ("knn_acc",), race=state)
    d = v.decisions["knn_acc"]
    text = v.sentences()[0]
    assert text.startswith("knn_acc: no entrant is separated (highest mean: ")
    assert "not distinguishable from it (Holm p >= 0.012)" in text
    assert "the race stopped after 8 rounds, at max_seeds (n = 10)" in text
    lead = v.row(d.leader).cells["knn_acc"]
    diffs = [np.subtract(list(lead.seeds.values()), list(v.row(e).cells["knn_acc"].seeds.values()))
             for e in d.contenders]
    expected = detectable_difference(pooled_sd(diffs), 10, state.settings.level / 2)
    assert d.detectable == pytest.approx(expected)
    assert f"Differences under {100 * expected:.2g} points could not be detected with n = 10." \
        in text


def test_a_race_that_shows_equivalence_says_so():
    state, recs = race_records({"a#1": 0.9, "b#1": 0.9}, 0.003, 4, margin=0.03)
    assert state.stopped == "equivalent"
    v = verdict(recs, ("knn_acc",), race=state)
    assert "are equivalent within ±3 points (TOST)" in v.sentences()[0]
    assert v.winner("knn_acc") is None


def test_an_unfinished_race_says_so():
    from augtune.analysis import race

    state, recs = race_records({"a#1": 0.9, "b#1": 0.9}, 0.01, 5)
    first = [r for r in recs if r["seed"] <= 4]  # the records after round 2
    mid = race.replay(state.settings, first)
    assert mid.stopped is None and mid.n == 4
    text = verdict(first, ("knn_acc",), race=mid).sentences()[0]
    assert "and is unfinished (n = 4 of at most 10)" in text


def test_an_unequal_budget_is_said():
    """A search trial that failed leaves its entrant fewer trials: the verdict says so, naming it."""
    from augtune.analysis.verdict import budget_note

    search = [{"entrant": "a", "status": "completed"}, {"entrant": "a", "status": "stopped"},
              {"entrant": "b", "status": "completed"}, {"entrant": "b", "status": "failed"}]
    note = budget_note(search)
    assert note.startswith("Unequal budget") and "b 1 of 2 (1 failed)" in note and "a " not in note
    assert budget_note(search[:2] + [{"entrant": "b", "status": "completed"}] * 2) == ""
    nan = {"entrant": "b", "status": "failed", "error": "NonFiniteLoss: loss became nan at epoch 2"}
    assert "b 1 of 2 (1 diverged: its loss became NaN)" in budget_note(search[:3] + [nan])


# -- schedule against constant (`compare.scheduler: [asha, pbt]`) ------------------------------------

def test_each_method_searched_for_a_schedule_is_tested_against_its_constant():
    """Two-sided, paired over the shared seeds (scipy's), Holm across a metric's pairs: a schedule that
    beats, one no different, and the label parsed for what the method reads (@pbt is no augmentation)."""
    rng = np.random.default_rng(3)
    base = 0.80 + 0.01 * rng.normal(size=6)
    values = {"simclr+pinda": list(base), "simclr+pinda@pbt": list(base + 0.05 + 0.002 * rng.normal(size=6)),
              "simclr+cocor": list(base + 0.01),
              "simclr+cocor@pbt": list(base + 0.01 + 0.01 * rng.normal(size=6)),
              "simclr+nrcc": list(base)}
    v = verdict(runs(values), ("knn_acc",))
    said = next(s for s in v.sentences() if s.startswith("Schedule against constant"))
    p = [stats.ttest_rel(values[f"{m}@pbt"], values[m]).pvalue for m in ("simclr+cocor", "simclr+pinda")]
    cocor, pinda = holm(p)
    assert pinda < 0.05 < cocor
    diff = 100 * (np.mean(values["simclr+pinda@pbt"]) - np.mean(values["simclr+pinda"]))
    assert f"simclr+pinda@pbt's schedule beats simclr+pinda's constant (+{diff:.2g} points, Holm p = " \
           f"{pinda:.2g})" in said
    assert "simclr+cocor@pbt's schedule is not distinguishable from simclr+cocor's constant" in said
    assert f"Holm p = {cocor:.2g})" in said and "nrcc" not in said
    worse = {"simclr+pinda": list(base + 0.05), "simclr+pinda@pbt": list(base)}
    assert "simclr+pinda@pbt's schedule is worse than simclr+pinda's constant (−" in \
        verdict(runs(worse), ("knn_acc",)).sentences()[1]
    # no pair, no sentence; one seed: said untested
    assert not [s for s in verdict(runs({"a": [0.9, 0.8], "b": [0.7, 0.6]}), ("knn_acc",)).sentences()
                if s.startswith("Schedule")]
    one = verdict(runs({"simclr": [0.9], "simclr@pbt": [0.8]}), ("knn_acc",)).sentences()
    assert "Schedule against constant: knn_acc: simclr@pbt against simclr: untested (n = 1)." in one


def test_a_schedule_of_cocor_still_reads_labels():
    recs = runs({"simclr+cocor@pbt": [0.95, 0.96, 0.955], "simclr": [0.90, 0.91, 0.92]})
    assert {r.entrant: bool(r.semi) for r in verdict(recs, ("knn_acc",)).rows} == {
        "simclr+cocor@pbt": True, "simclr": False}


def test_an_entrant_whose_search_ran_one_trial_is_named_untuned_first():
    """A budget that left an entrant one search trial compares its defaults: the verdict's first sentence
    says so in words, and its row's note too; entrants with more trials are not named."""
    def trials(name: str, k: int) -> list[dict]:
        return [{"status": "completed", "entrant": name, "method": name, "phase": "search",
                 "params": {"train.lr": 0.1 * (i + 1)}} for i in range(k)]

    repeat = runs({"a": [0.90, 0.91, 0.92], "b": [0.80, 0.82, 0.81], "c": [0.85, 0.86, 0.84]})
    v = verdict(repeat, ("knn_acc",), search=trials("a", 4) + trials("b", 1) + trials("c", 1))
    assert v.untuned == ("b", "c")
    first = v.sentences()[0]
    assert first.split(" ran one search trial")[0] == "Untuned defaults: b, c"
    notes = dict(zip(v.table()["entrant"], v.table()["note"]))
    assert "untuned defaults" in notes["b"] and "untuned defaults" not in notes["a"]
    assert "Untuned defaults" in v.render("md")
    searched = verdict(repeat, ("knn_acc",), search=trials("a", 2) + trials("b", 2) + trials("c", 3))
    assert searched.untuned == () and not searched.sentences()[0].startswith("Untuned")


# -- the answer in plain words --------------------------------------------------------------------

def test_plainly_names_a_clear_winner_and_what_the_seeds_could_not_detect():
    recs = with_references(runs({"good": [0.95, 0.96, 0.955], "meh": [0.80, 0.82, 0.79]}), raw=0.9,
                           untrained={1: 0.80, 2: 0.81, 3: 0.80})
    text = verdict(recs, ("knn_acc",)).plainly()
    assert text.startswith("Plainly: good is best on knn_acc: the tests separate it from every other entrant")
    assert "meh is significantly below it" in text and "only good beats the untrained encoder" in text
    assert "nothing beats the raw input" not in text and text.endswith(".")


def test_plainly_says_when_nothing_is_separable():
    recs = with_references(runs({"a": [0.90, 0.94, 0.92], "b": [0.91, 0.93, 0.90]}), raw=0.95,
                           untrained={1: 0.80, 2: 0.81, 3: 0.80})
    text = verdict(recs, ("knn_acc",)).plainly()
    assert "a has the highest knn_acc, but b is not separated from it" in text
    assert "every entrant beats the untrained encoder on knn_acc" in text
    assert "nothing beats the raw input on knn_acc" in text and " best " not in text


def test_plainly_says_when_nothing_beats_the_untrained_encoder():
    recs = with_references(runs({"top": [0.95, 0.96, 0.955], "low": [0.80, 0.81, 0.805]}), raw=0.5,
                           untrained={1: 0.97, 2: 0.95, 3: 0.96})
    text = verdict(recs, ("knn_acc",)).plainly()
    assert "top has the highest knn_acc and is separated from the others, but it is no better than the " \
           "untrained encoder" in text
    assert "no entrant beats the untrained encoder on knn_acc" in text


def test_plainly_marks_a_semi_supervised_entrant_untuned_defaults_and_the_unranked():
    from augtune.analysis.verdict import untuned_entrants

    recs = runs({"simclr": [0.90, 0.91, 0.92], "simclr+cocor": [0.95, 0.96, 0.955]})
    recs += runs({"simclr+diffaug": [0.1, 0.1, 0.1]}, diffaug_gen_std_ratio=0.0)
    search = [{"status": "completed", "entrant": e, "phase": "search", "trial": "t1"}
              for e in ("simclr", "simclr+cocor", "simclr+diffaug")]
    v = verdict(recs, ("knn_acc",), search=search)
    assert v.untuned == untuned_entrants(search) == ("simclr", "simclr+cocor", "simclr+diffaug")
    text = v.plainly()
    assert text.startswith("Plainly: simclr, simclr+cocor, simclr+diffaug ran their untuned defaults")
    assert "simclr+cocor (semi-supervised) is best on knn_acc" in text
    assert "simclr+cocor reads labels while training (semi-supervised)" in text
    flagged = [r for r in v.rows if r.flag]
    assert flagged and all(f"{r.entrant} is not ranked ({r.flag})" in text for r in flagged)


def test_a_verdict_shows_its_answer_in_a_notebook_not_a_dump():
    recs = with_references(runs({"good": [0.95, 0.96, 0.955], "meh": [0.80, 0.82, 0.79]}), raw=0.9,
                           untrained={1: 0.80, 2: 0.81, 3: 0.80})
    v = verdict(recs, ("knn_acc",))
    assert len(repr(v)) < 500 and v.plainly() in repr(v)
    md = v._repr_markdown_()
    assert md.startswith(v.plainly()) and "| entrant | knn_acc |" in md and "Table:" not in md
    page = v._repr_html_()
    assert page.startswith("<p><b>Plainly: good is best") and page.count("<tr>") == len(v.table()) + 1
    assert "**" not in page and "<td><b>95.50 ± 0.50 (3)</b></td>" in page  # bold as HTML, not markdown
    assert "<td><i>random-init</i></td>" in page
