"""DiffAug (Zang et al., 2024) on SimCLR's backbone: replacement probability, phase schedule, diffusion
steps, the kernels' degrees of freedom and the same-sample prior alpha.

`method.augment: [diffaug]` with base simclr: DiffAug's A-steps replace the base's loss by the soft
contrastive loss, so the base only lends its backbone and projector (methods/diffaug.py).
`diffaug.sample_variance` is not searched: beta and posterior gave the same metrics within a standard
deviation on digits and Fashion-MNIST as vectors (README, DiffAug), so it would only thin the budget.
"""
from ray import tune

from augtune.spaces.common import LR, Space

_SCHEDULES = [
    "A:330,B:330,A:340",  # 3.2: bio-feature data
    "A:200,B:400,A:800",  # 3.3: vision
    "A:1,B:1,A:2",  # a short first A-step, half the run with generated positives
    "sync",  # Table 5 B4: both networks every step
]

_DEFAULTS = {
    "train.lr": 1e-3,  # Table 9 (vision) 0.001; Table 11 (bio) uses 1e-4 for ~1000 epochs
    "diffaug.schedule": "A:330,B:330,A:340",
    "diffaug.steps": 1000,  # DDPM's T (the official code uses 100 for bio-features: the other choice)
    "diffaug.nu_y": 100.0,  # official code: nu_input = 100 (docs/methods/diffaug.md)
    "diffaug.alpha": 1.0,  # config.py: positives get P = 1
}

SPACE = Space(
    name="diffaug",
    params={
        "method.base": "simclr",
        "method.augment": ["diffaug"],
        "train.lr": LR,
        "diffaug.lam": tune.uniform(0.0, 0.3),  # 3.6: gains at 0.1-0.15, the encoder collapses near 1
        "diffaug.schedule": tune.choice(_SCHEDULES),
        "diffaug.steps": tune.choice([100, 1000]),
        "diffaug.nu_y": tune.loguniform(1.0, 200.0),
        "diffaug.nu_z": tune.loguniform(0.01, 5.0),  # official 0.01; Tables 9/11 list nu in 0.1..5
        "diffaug.alpha": tune.uniform(0.0, 1.0),  # 2.1: beta in [0, 1]
    },
    points_to_evaluate=[
        {**_DEFAULTS, "diffaug.lam": 0.1, "diffaug.nu_z": 0.01},  # 3.6's default lambda, official nu_z
        # 3.6's other best lambda; Table 9 CF10 nu = 1
        {**_DEFAULTS, "diffaug.lam": 0.15, "diffaug.nu_z": 1.0},
    ],
    grid_presets={"default": {"diffaug.lam": [0.0, 0.05, 0.1, 0.15, 0.3]}},  # the lambda sweep of 3.6
)
