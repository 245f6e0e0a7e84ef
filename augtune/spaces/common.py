"""What the method spaces share: the `Space` record and the optimiser entries every base searches.

Every base trains with Adam here (augtune's default, as PiNDA B.4), so the bases' own SGD/LARS
learning rates (SimCLR 0.3 x B/256, MoCo v2 0.03, SimSiam 0.05 x B/256) do not carry over; their
weight decays, temperatures and momenta do, and the spaces take those from the papers.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from ray import tune


@dataclass(frozen=True)
class Space:
    """A search space: data for Ray Tune and Optuna, never code that trains.

    params: dotted key -> a Tune domain (`tune.loguniform`, `tune.choice`, ...), a
        `tune.grid_search` dict, or a constant that every trial gets (a named space fixes
        `method.base` to its method this way).
    define_by_run: an Optuna define-by-run function `(trial) -> dict | None` for conditional
        parameters. It only calls `trial.suggest_*(dotted key, ...)` and may return a dict of
        constants; it never trains. When set, `params` holds constants only. Keep it a module-level
        function: Tune pickles the searcher, function included, into its own state.
    points_to_evaluate: flat {dotted key: value} dicts run before the searcher proposes anything,
        the papers' defaults first. With `params`, a point names every searched (non-constant) key,
        as Optuna requires; with `define_by_run` a point may be partial (the rest is sampled).
    grid_presets: named grids {name: {dotted key: [values]}}; `algorithm: grid` runs "default",
        holding every other searched key at the first point's value. Every registered space has a
        "default" preset (a test demands it).
    fixed_on: what the space may not sample on some data: {modality: {dotted key: value}}; on data of
        that modality each key is a constant (out of the points and presets), e.g. CoCor's image pools
        on vectors.
    """
    name: str
    params: dict[str, Any] = field(default_factory=dict)
    define_by_run: Optional[Callable[[Any], Optional[dict]]] = None
    points_to_evaluate: list[dict] = field(default_factory=list)
    grid_presets: dict[str, dict] = field(default_factory=dict)
    fixed_on: dict[str, dict] = field(default_factory=dict)


LR = tune.loguniform(1e-4, 1e-2)  # Adam; PiNDA B.4 trains at 1e-3, the middle of this range
LR_GRID = [3e-4, 1e-3, 3e-3]  # grid presets: half a decade either side of Adam 1e-3
# spans SimCLR 1e-6, BYOL 1.5e-6, MoCo v2 and SimSiam ImageNet 1e-4, SimSiam CIFAR 5e-4
WEIGHT_DECAY = tune.loguniform(1e-7, 1e-3)
BATCH_SIZE = tune.choice([64, 128, 256, 512])  # global; PiNDA Table 3 runs m = 64/256/512, CoCor D 256
# SimCLR Table 5 compares 0.05..1; SimCLR CIFAR-10 0.5, MoCo v2 0.2, PiNDA B.4 and NRCC 0.1
TEMPERATURE = tune.loguniform(0.05, 1.0)
# EMA of the target (BYOL) or key (MoCo) encoder: BYOL 0.996, MoCo 0.999; 0.99 is augtune's
# default for short runs (methods/base.py), as the papers' values assume ~1000 ImageNet epochs
EMA_MOMENTUM = tune.choice([0.9, 0.95, 0.99, 0.996, 0.999])
EMA_MOMENTUM_GRID = [0.99, 0.996, 0.999]
