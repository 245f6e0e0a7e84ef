"""Importances from records: on a synthetic search where only one parameter moves the metric, that
parameter comes out on top, over several draws of the synthetic search."""
from __future__ import annotations

import numpy as np

from augtune.analysis.importance import importances


def synthetic(seed: int, n: int = 30) -> list[dict]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        lr, wd = 10 ** rng.uniform(-4, -2), 10 ** rng.uniform(-7, -3)
        base = ["simclr", "byol"][rng.integers(2)]
        value = 0.9 - 0.2 * (np.log10(lr) + 3) ** 2 + 0.001 * rng.normal()  # only the learning rate matters
        out.append(
            {
                "phase": "search",
                "params": {"train.lr": lr, "train.weight_decay": wd, "method.base": base},
                "epochs": [{"epoch": 1, "knn_acc": float(value)}],
            }
        )
    return out


def test_the_one_parameter_that_matters_comes_out_on_top():
    for seed in range(5):
        values, how = importances(synthetic(seed), "knn_acc")
        assert max(values, key=values.get) == "train.lr", (seed, values)
        assert how in ("fANOVA", "PED-ANOVA")


def test_too_few_trials_or_nothing_varied_is_a_reason_not_an_exception():
    assert importances(synthetic(0, n=1), "knn_acc")[0] == {}
    same = [{"params": {"train.lr": 0.001}, "epochs": [{"knn_acc": v}]} for v in (0.1, 0.2)]
    values, why = importances(same, "knn_acc")
    assert values == {} and "varied" in why
