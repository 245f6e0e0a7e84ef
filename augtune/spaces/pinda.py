"""PiNDA: mu = 0 vs learned mu, Gaussian vs uniform pi-noise, the penalty weight, Adam lr, temperature.

Two spaces, because the generator is a choice only where the modality allows one: `pinda` (any
data; vectors get the paper's 3-layer MLP generator, images its ResNet-18) and `pinda_vision`
(images: the ResNet-18 of 4.2 or the U-Net of Table 6 as a searched choice). Both stack PiNDA on
SimCLR, the paper's non-vision setting (B.4: "the same as SimCLR"); `--set method.base=byol` or an
inline space puts it on another base.
"""
from ray import tune

from augtune.spaces.common import LR, LR_GRID, TEMPERATURE, Space

_PAPER = {"pinda.mu": "zero", "pinda.noise": "gaussian", "pinda.penalty": 1.0,
          "train.lr": 1e-3, "train.temperature": 0.1}  # 4.2 (mu = 0 suggested), B.4 (Adam 1e-3, tau 0.1)
_PARAMS = {
    "method.base": "simclr",
    "method.augment": ["pinda"],
    "pinda.mu": tune.choice(["zero", "learned"]),
    "pinda.noise": tune.choice(["gaussian", "uniform"]),
    # B.4 gives no weight; 1 / mean ||eps|| is O(1/sqrt(D)) at the start, so 1 is a mild push
    "pinda.penalty": tune.loguniform(0.01, 10.0),
    "train.lr": LR,
    "train.temperature": TEMPERATURE,
}
_GRID = {"pinda.mu": ["zero", "learned"], "pinda.noise": ["gaussian", "uniform"], "train.lr": LR_GRID}

SPACE = Space(
    name="pinda",
    params=_PARAMS,
    points_to_evaluate=[_PAPER, {**_PAPER, "pinda.mu": "learned"}],  # Table 2's two PiNDA rows
    grid_presets={"default": _GRID},
)

VISION_SPACE = Space(
    name="pinda_vision",
    params={**_PARAMS, "pinda.generator": tune.choice(["resnet18", "unet"])},
    points_to_evaluate=[{**_PAPER, "pinda.generator": "resnet18"}, {**_PAPER, "pinda.generator": "unet"}],
    grid_presets={"default": {**_GRID, "pinda.generator": ["resnet18", "unet"]}},
)
