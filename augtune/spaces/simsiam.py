"""SimSiam (Chen & He, 2021): Adam learning rate, weight decay and batch size (no temperature, no EMA)."""
from augtune.spaces.common import BATCH_SIZE, LR, LR_GRID, WEIGHT_DECAY, Space

SPACE = Space(
    name="simsiam",
    params={
        "method.base": "simsiam",
        "train.lr": LR,
        "train.weight_decay": WEIGHT_DECAY,
        "train.batch_size": BATCH_SIZE,
    },
    points_to_evaluate=[
        # SimSiam App. D, CIFAR-10: weight decay 5e-4, batch 512; lr Adam 1e-3 (PiNDA B.4), as
        # SimSiam's SGD 0.03 x B/256 does not carry over to Adam
        {"train.lr": 1e-3, "train.weight_decay": 5e-4, "train.batch_size": 512},
        # SimSiam 4 (ImageNet) weight decay 1e-4, at CoCor D's batch 256
        {"train.lr": 1e-3, "train.weight_decay": 1e-4, "train.batch_size": 256},
    ],
    grid_presets={"default": {"train.lr": LR_GRID, "train.weight_decay": [1e-6, 1e-4, 5e-4]}},
)
