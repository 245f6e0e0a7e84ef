"""SimSiam (Chen & He, 2021): a predictor and a stop-gradient, no target network, no negatives."""
from __future__ import annotations

import torch

from augtune.methods.base import Encoder, Objective, Outputs, StepInfo
from augtune.methods.losses import negative_cosine
from augtune.models import predictor


class SimSiam(Objective):
    name = "simsiam"

    def __init__(self, encoder: Encoder, cfg):
        super().__init__(encoder, cfg)
        self.predictor = predictor(cfg.model)

    def loss(self, v1: torch.Tensor, v2: torch.Tensor, info: StepInfo) -> tuple[torch.Tensor, Outputs]:
        z1, z2 = self.embed(v1, info), self.embed(v2, info)
        p1, p2 = self.predictor(z1), self.predictor(z2)
        loss = 0.5 * (negative_cosine(p1, z2) + negative_cosine(p2, z1))  # SimSiam eq. 2, z detached
        return loss, Outputs(projections=(z1, z2), targets=(z1.detach(), z2.detach()), predictions=(p1, p2))

    def target_embed(self, x: torch.Tensor, info: StepInfo | None = None) -> torch.Tensor:
        return self.embed(x, info).detach()  # SimSiam's target: the projection under stop-gradient
