"""BYOL (Grill et al., 2020): Adam learning rate, weight decay, batch size and the target EMA rate."""
from augtune.spaces.common import (BATCH_SIZE, EMA_MOMENTUM, EMA_MOMENTUM_GRID, LR, LR_GRID,
                                   WEIGHT_DECAY, Space)

# lr: Adam 1e-3 (PiNDA B.4, whose PiNDA runs on BYOL); weight decay 1.5e-6 (BYOL 3.2, with LARS);
# batch 256 (PiNDA Table 3). BYOL has no temperature.
_DEFAULTS = {"train.lr": 1e-3, "train.weight_decay": 1.5e-6, "train.batch_size": 256}

SPACE = Space(
    name="byol",
    params={
        "method.base": "byol",
        "train.lr": LR,
        "train.weight_decay": WEIGHT_DECAY,
        "train.batch_size": BATCH_SIZE,
        "method.momentum": EMA_MOMENTUM,  # tau_base; the cosine schedule takes it to 1 (BYOL 3.2)
    },
    points_to_evaluate=[
        {**_DEFAULTS, "method.momentum": 0.996},  # BYOL 3.2: tau_base = 0.996
        {**_DEFAULTS, "method.momentum": 0.99},  # augtune's short-run default (methods/byol.py)
    ],
    grid_presets={"default": {"train.lr": LR_GRID, "method.momentum": EMA_MOMENTUM_GRID}},
)
