"""Methods in pure PyTorch: base objectives and augmentation methods (never imports ray).

Registries, not if-chains: a new base objective or augmentation method is one line here.
"""
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
    "random_noise": RandomNoise,  # PiNDA's baselines (Table 2, B.2)
    "simcl": SimCL,
    "clae": CLAE,
    "nrcc": NRCC,  # SGHMC hard negatives + the clustering regulariser (InfoNCE = simclr, BYOL)
    "cocor": CoCor,  # composite augmentations + consistency loss + MMNN, bi-level
    "diffaug": DiffAug,  # soft contrastive encoder + conditional diffusion generator, in phases
}

__all__ = ["AUGMENTATIONS", "BASES", "Augmentation", "Batch", "BYOL", "DiffAug", "Encoder", "Method", "MoCo",
           "MomentumObjective", "Objective", "OptimizerSpec", "SimCLR", "SimSiam", "StepInfo",
           "build_method"]


def build_method(cfg, data) -> Method:
    """Backbone, objective and augmentation methods for `cfg` on `data` (a DataSplit)."""
    from augtune.models import build_backbone

    backbone = build_backbone(cfg.model, data.modality, data.shape)
    encoder = Encoder(backbone, data.mean, data.std)
    objective = BASES[cfg.method.base](encoder, cfg)
    augments = [AUGMENTATIONS[name](cfg, data) for name in cfg.method.augment]
    return Method(objective, augments)
