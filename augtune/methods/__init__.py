"""Methods in pure PyTorch: base objectives and augmentation methods (never imports ray).

Registries, not if-chains: a new base objective or augmentation method is one line here.
"""
from augtune.methods.base import (Augmentation, Batch, Encoder, MomentumObjective, Objective,
                                  OptimizerSpec, StepInfo)
from augtune.methods.byol import BYOL
from augtune.methods.compose import Method, build_method
from augtune.methods.diffaug import DiffAug
from augtune.methods.moco import MoCo
from augtune.methods.simclr import SimCLR
from augtune.methods.simsiam import SimSiam

BASES: dict[str, type[Objective]] = {
    "simclr": SimCLR,  # also the InfoNCE base of NRCC
    "byol": BYOL,
    "moco": MoCo,  # MoCo v2
    "simsiam": SimSiam,
}

AUGMENTATIONS: dict[str, type[Augmentation]] = {
    "diffaug": DiffAug,  # soft contrastive encoder + conditional diffusion generator, in phases
}

__all__ = ["AUGMENTATIONS", "BASES", "Augmentation", "Batch", "BYOL", "DiffAug", "Encoder", "Method", "MoCo",
           "MomentumObjective", "Objective", "OptimizerSpec", "SimCLR", "SimSiam", "StepInfo",
           "build_method"]
