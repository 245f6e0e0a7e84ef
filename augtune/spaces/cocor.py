"""CoCor (Wang et al.) on MoCo v2: composite lengths, basic pool, consistency loss, MMNN or constants,
labelled fraction (§5.4, App. A, F), with MoCo v2's own optimiser entries around them."""
from ray import tune

from augtune.spaces.common import LR, WEIGHT_DECAY, Space

# MoCo v2 as CoCor D: weight decay 1e-4, batch 256, tau 0.2; Adam 1e-3 (spaces/moco.py's reasons)
_DEFAULTS = {"train.lr": 1e-3, "train.weight_decay": 1e-4, "train.temperature": 0.2}

SPACE = Space(
    name="cocor",
    params={
        "method.base": "moco",  # the paper's main base; cocor stacks on any (method.base: simsiam ...)
        "method.augment": ["cocor"],
        "train.batch_size": 256,  # CoCor D
        "train.lr": LR,
        "train.weight_decay": WEIGHT_DECAY,
        "train.temperature": tune.choice([0.07, 0.2, 0.5]),
        # one view per length per sample; App. G also tries single lengths and 5
        "cocor.lengths": tune.choice([[1, 2, 3], [1], [2], [3], [1, 2, 3, 5]]),
        "cocor.pool": tune.choice(["all", "color", "affine"]),  # §5.4, Table 6
        "cocor.consistency": tune.choice(["softplus", "abs"]),  # App. A (better in the paper) vs eq. 2
        "cocor.mmnn": tune.choice([True, False]),  # false: App. F's constants per length
        "cocor.label_fraction": tune.choice([0.01, 0.05, 0.1]),  # 1% as the paper's MMNN update
    },
    points_to_evaluate=[
        # the paper's setting: lengths 1-3, all 14 ops, softplus on batch means, MMNN, 1% labels
        {**_DEFAULTS, "cocor.lengths": [1, 2, 3], "cocor.pool": "all", "cocor.consistency": "softplus",
         "cocor.mmnn": True, "cocor.label_fraction": 0.01},
        # App. F: constants instead of the MMNN (no labels used)
        {**_DEFAULTS, "cocor.lengths": [1, 2, 3], "cocor.pool": "all", "cocor.consistency": "softplus",
         "cocor.mmnn": False, "cocor.label_fraction": 0.01},
    ],
    grid_presets={
        "default": {"cocor.lengths": [[1, 2, 3], [1], [3], [1, 2, 3, 5]], "cocor.mmnn": [True, False]},
    },
    fixed_on={"vector": {"cocor.pool": "all"}},  # colour and affine ops are image ops
)
