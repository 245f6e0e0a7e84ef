"""benchmarks/controls.py: its tiny form runs every part on real training, and its rates are the
verdict's own decisions counted (the benchmark's numbers are on the results page)."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def controls():
    spec = importlib.util.spec_from_file_location("controls", ROOT / "benchmarks" / "controls.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_tiny_controls_run_and_count_the_verdicts_decisions(controls, tmp_path):
    out = tmp_path / "controls.json"
    result = controls.main(["--tiny", "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    assert result["compares"] == 2 and result["seeds"] == 3 and result["alpha"] == controls.ALPHA
    for kind, key in (("negative", "false_separation"), ("positive", "power")):
        part = result[kind]
        assert part["looks"] == [3] and len(part["compares"]) == 2
        decisions = [c["3"] for c in part["compares"]]
        assert all(d["leader"] in (("a", "b") if kind == "negative" else ("full", "handicapped"))
                   for d in decisions)
        hits = sum(d["separated"] and (kind == "negative" or d["leader"] == "full") for d in decisions)
        assert part[f"{key}_n3"] == hits / 2
        assert all(0 <= d["p_holm"] <= 1 for d in decisions)
        assert abs(part["true_gap"]) < 1  # a difference of two accuracies
    assert "| negative | 3 |" in controls.table(result)


def test_a_compare_pairs_each_seed_on_one_split_and_separates_a_real_gap(controls):
    """The decision is the verdict's: two entrants 10 points apart on every paired seed are separated
    and the better one leads; two equal in distribution are not (fabricated records, no training)."""
    def rec(name, seed, v):
        return {"status": "completed", "entrant": name, "method": name, "seed": seed,
                "final": {"knn_acc": v}, "epochs": [{"epoch": 1, "epoch_time_s": 1.0}]}

    apart = [rec("full", s, 0.9 + 0.01 * (s % 2)) for s in range(6)] + \
        [rec("handicapped", s, 0.8 + 0.01 * (s % 3)) for s in range(6)]
    d = controls.decide(apart, 6)
    assert d["leader"] == "full" and d["separated"] and d["p_holm"] < 0.05
    same = [rec("a", s, 0.9 + 0.01 * (s % 2)) for s in range(6)] + \
        [rec("b", s, 0.9 + 0.01 * ((s + 1) % 2)) for s in range(6)]
    assert not controls.decide(same, 6)["separated"]


@pytest.mark.parametrize("handicap, differs", [
    ("epochs", {"train": {"epochs": 1}}),
    ("views", {"view": {"crop_scale": [1.0, 1.0]}}),
    ("noviews", {"view": {"crop_scale": [1.0, 1.0], "jitter_p": 0.0, "gray_p": 0.0}}),  # never flipped
    ("data", {"dataset": {"max_train": 750}}),
])
def test_each_handicap_changes_only_what_it_says(controls, handicap, differs):
    from augtune.config import to_dict

    base, worse = (to_dict(c) for c in controls.configs("fashion", False, handicap))
    changed = {section: {k: v for k, v in worse[section].items() if base[section][k] != v}
               for section in worse if isinstance(worse[section], dict) and worse[section] != base[section]}
    assert changed == differs
    assert handicap in controls.HANDICAPS
