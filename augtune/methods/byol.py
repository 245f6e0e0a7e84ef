"""BYOL (Grill et al., 2020): online predictor regresses an EMA target; no negatives."""
from __future__ import annotations

import torch

from augtune.methods.base import Encoder, MomentumObjective, Outputs, StepInfo, cosine_momentum
from augtune.methods.losses import cosine_regression
from augtune.models import predictor


class BYOL(MomentumObjective):
    name = "byol"
    default_momentum = 0.99  # BYOL uses 0.996 for 1000 ImageNet epochs; short runs need a faster target

    def __init__(self, encoder: Encoder, cfg):
        super().__init__(encoder, cfg)
        self.predictor = predictor(cfg.model)

    def momentum(self, info: StepInfo) -> float:
        return cosine_momentum(self.base_momentum, info.progress)  # from tau_base up to 1

    def loss(self, v1: torch.Tensor, v2: torch.Tensor, info: StepInfo) -> tuple[torch.Tensor, Outputs]:
        z1, z2 = self.embed(v1, info), self.embed(v2, info)
        p1, p2 = self.predictor(z1), self.predictor(z2)
        t1, t2 = self.target_embed(v1), self.target_embed(v2)  # no gradient reaches the target
        loss = cosine_regression(p1, t2) + cosine_regression(p2, t1)  # symmetrised, as BYOL eq. 2
        return loss, Outputs(projections=(z1, z2), targets=(t1, t2), predictions=(p1, p2))
