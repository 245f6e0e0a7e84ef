"""Methods in pure PyTorch: base objectives and augmentation methods (never imports ray).

Registries, not if-chains: a new base objective or augmentation method is one line here, and enters
every command by itself: `augtune compare` enters every registered augmentation that applies to the
data's modality (its class's `modalities`, both by default), in this order, searching the space
registered under its name (`augtune.spaces.SPACES`) or, without one, its base's.

A method kept outside augtune registers itself the same way from a module named in the environment
variable AUGTUNE_PLUGINS (comma-separated module names, imported with this package: in the CLI, in the
driver and in every Ray trial process, which inherit the variable), e.g. a module doing
`AUGMENTATIONS["feature_dropout"] = FeatureDropout`.
"""
import importlib
import os

from augtune.methods.base import (Augmentation, Batch, Encoder, MomentumObjective, Objective,
                                  OptimizerSpec, StepInfo)
from augtune.methods.byol import BYOL
from augtune.methods.cocor import CoCor
from augtune.methods.compose import Method
from augtune.methods.diffaug import DiffAug
from augtune.methods.moco import MoCo
from augtune.methods.nrcc import NRCC
from augtune.methods.pinda import PiNDA
from augtune.methods.pinda_baselines import CLAE, RandomNoise, SimCL
from augtune.methods.simclr import SimCLR
from augtune.methods.simsiam import SimSiam

BASES: dict[str, type[Objective]] = {
    "simclr": SimCLR,  # also the InfoNCE base of NRCC
    "byol": BYOL,
    "moco": MoCo,  # MoCo v2
    "simsiam": SimSiam,
}

AUGMENTATIONS: dict[str, type[Augmentation]] = {
    "pinda": PiNDA,  # learned pi-noise views x + f_psi(x, eps)
    "nrcc": NRCC,  # SGHMC hard negatives + the clustering regulariser (InfoNCE = simclr, BYOL)
    "cocor": CoCor,  # composite augmentations + consistency loss + MMNN, bi-level
    "diffaug": DiffAug,  # soft contrastive encoder + conditional diffusion generator, in phases
    "random_noise": RandomNoise,  # PiNDA's non-vision baselines (Table 2, B.2): vectors only
    "simcl": SimCL,
    "clae": CLAE,
}
MODALITIES = ("image", "vector")  # what an augmentation applies to unless its class says otherwise

__all__ = ["AUGMENTATIONS", "BASES", "Augmentation", "Batch", "BYOL", "CLAE", "CoCor", "DiffAug", "Encoder",
           "Method", "MoCo", "MomentumObjective", "NRCC", "Objective", "OptimizerSpec", "PiNDA",
           "RandomNoise", "SimCL", "SimCLR", "SimSiam", "StepInfo", "build_method", "check_modality", "knobs",
           "modalities"]


def modalities(name: str) -> tuple[str, ...]:
    """The data modalities the augmentation `name` applies to (its class's `modalities`)."""
    return tuple(getattr(AUGMENTATIONS[name], "modalities", MODALITIES))


def check_modality(cfg, modality: str) -> None:
    """Refuse, naming the key, a config whose augmentations cannot run on data of `modality`: one that
    does not apply to it, or a setting its class's `check_modality(cfg, modality)` refuses."""
    from augtune.config import ConfigError

    for name in cfg.method.augment:
        if name not in AUGMENTATIONS:
            continue  # unknown names are check_config's to refuse
        if modality not in modalities(name):
            raise ConfigError(f"method.augment: {name} applies to {' and '.join(modalities(name))} data; "
                              f"this data set gives {modality}s")
        hook = getattr(AUGMENTATIONS[name], "check_modality", None)
        if hook is not None:
            hook(cfg, modality)


def knobs(cfg) -> tuple[str, ...]:
    """The dotted keys a run of `cfg` reads at every epoch (a `schedule` or PBT may set them): the loop's
    (`config.LOOP_KNOBS`), its base's and its augmentations' `knobs`, in that order."""
    from augtune.config import LOOP_KNOBS

    parts = [LOOP_KNOBS, getattr(BASES.get(cfg.method.base), "knobs", ())]
    parts += [getattr(AUGMENTATIONS.get(name), "knobs", ()) for name in cfg.method.augment]
    return tuple(dict.fromkeys(k for part in parts for k in part))


def build_method(cfg, data) -> Method:
    """Backbone, objective and augmentation methods for `cfg` on `data` (a DataSplit)."""
    from augtune.models import build_backbone

    backbone = build_backbone(cfg.model, data.modality, data.shape)
    encoder = Encoder(backbone, data.mean, data.std)
    objective = BASES[cfg.method.base](encoder, cfg)
    augments = [AUGMENTATIONS[name](cfg, data) for name in cfg.method.augment]
    return Method(objective, augments)


def load_plugins() -> None:
    """Import the modules AUGTUNE_PLUGINS names: they add their methods to the registries."""
    from augtune.config import ConfigError

    for name in filter(None, (n.strip() for n in os.environ.get("AUGTUNE_PLUGINS", "").split(","))):
        try:
            importlib.import_module(name)
        except ImportError as e:
            raise ConfigError(f"AUGTUNE_PLUGINS: cannot import {name!r} ({e})") from None


load_plugins()
