"""SimCLR (Chen et al., 2020): Adam learning rate, weight decay, batch size and NT-Xent temperature."""
from augtune.spaces.common import BATCH_SIZE, LR, LR_GRID, TEMPERATURE, WEIGHT_DECAY, Space

_DEFAULTS = {"train.lr": 1e-3, "train.weight_decay": 1e-6, "train.batch_size": 256}
# lr: Adam 1e-3 (PiNDA B.4); weight decay 1e-6 (SimCLR's default setting, with LARS); batch 256
# (PiNDA Table 3, whose SimCLR runs use m = 256 unless stated)

SPACE = Space(
    name="simclr",
    params={
        "method.base": "simclr",
        "train.lr": LR,
        "train.weight_decay": WEIGHT_DECAY,
        "train.batch_size": BATCH_SIZE,
        "train.temperature": TEMPERATURE,
    },
    points_to_evaluate=[
        {**_DEFAULTS, "train.temperature": 0.5},  # SimCLR App. B.9: CIFAR-10's best of {0.1, 0.5, 1.0}
        {**_DEFAULTS, "train.temperature": 0.1},  # PiNDA B.4 ("0.1 on all datasets") and NRCC
    ],
    grid_presets={
        "default": {"train.lr": LR_GRID, "train.temperature": [0.1, 0.5, 1.0]},  # SimCLR B.9's grid
    },
)
