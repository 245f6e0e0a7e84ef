"""NRCC on InfoNCE (SimCLR): regulariser weight lambda and temperature tau, SGHMC's delta1-3 and steps.

The paper tunes tau in {0.1, 1, 10} and lambda in {0.1, 0.5, 1} and keeps 0.1 and 0.1 (its 3x3
grid is the "default" preset); SGHMC runs at (0.1, 0.05, 0.99) for one step, as its code. BYOL+NRCC:
`--set method.base=byol` (the space's keys all apply) or an inline space.
"""
from ray import tune

from augtune.spaces.common import LR, Space

_PAPER = {"nrcc.lam": 0.1, "nrcc.tau": 0.1, "nrcc.delta1": 0.1, "nrcc.delta2": 0.05, "nrcc.delta3": 0.99,
          "nrcc.steps": 1, "train.lr": 1e-3}

SPACE = Space(
    name="nrcc",
    params={
        "method.base": "simclr",
        "method.augment": ["nrcc"],
        "nrcc.lam": tune.loguniform(0.05, 2.0),
        "nrcc.tau": tune.loguniform(0.05, 10.0),
        "nrcc.delta1": tune.uniform(0.0, 0.5),  # friction
        "nrcc.delta2": tune.loguniform(0.005, 0.5),  # step
        "nrcc.delta3": tune.uniform(0.0, 1.0),  # noise
        "nrcc.steps": tune.randint(1, 6),  # zeta in 1..5
        "train.lr": LR,
    },
    points_to_evaluate=[_PAPER, {**_PAPER, "nrcc.steps": 3}],
    grid_presets={"default": {"nrcc.tau": [0.1, 1.0, 10.0], "nrcc.lam": [0.1, 0.5, 1.0]}},  # the paper's grid
)
