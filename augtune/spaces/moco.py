"""MoCo v2 (Chen et al., 2020b): Adam learning rate, weight decay, batch size, InfoNCE temperature,
key-encoder EMA rate and queue length."""
from ray import tune

from augtune.spaces.common import (BATCH_SIZE, EMA_MOMENTUM, EMA_MOMENTUM_GRID, LR, TEMPERATURE,
                                   WEIGHT_DECAY, Space)

# lr: Adam 1e-3 (PiNDA B.4; MoCo v2's SGD 0.03 does not carry over to Adam); weight decay 1e-4 and
# batch 256 (MoCo v2, as CoCor D restates for its MoCo runs)
_DEFAULTS = {"train.lr": 1e-3, "train.weight_decay": 1e-4, "train.batch_size": 256}

SPACE = Space(
    name="moco",
    params={
        "method.base": "moco",
        "train.lr": LR,
        "train.weight_decay": WEIGHT_DECAY,
        "train.batch_size": BATCH_SIZE,
        "train.temperature": TEMPERATURE,
        "method.momentum": EMA_MOMENTUM,
        # negatives; 65536 is MoCo's ImageNet queue, longer than small data sets (digits: 1257 train)
        "method.queue_size": tune.choice([1024, 4096, 16384, 65536]),
    },
    points_to_evaluate=[
        # MoCo v2: tau 0.2; MoCo: m 0.999, K 65536 (CoCor D uses the same)
        {**_DEFAULTS, "train.temperature": 0.2, "method.momentum": 0.999, "method.queue_size": 65536},
        # augtune's short-run defaults (methods/moco.py, config.py): m 0.99, K 4096
        {**_DEFAULTS, "train.temperature": 0.2, "method.momentum": 0.99, "method.queue_size": 4096},
    ],
    grid_presets={
        # MoCo v1 0.07, MoCo v2 0.2, and a softer 0.5
        "default": {"train.temperature": [0.07, 0.2, 0.5], "method.momentum": EMA_MOMENTUM_GRID},
    },
)
