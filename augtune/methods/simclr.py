"""SimCLR (Chen et al., 2020): NT-Xent between two views, negatives from the whole (global) batch."""
from __future__ import annotations

import torch

from augtune.methods.base import Objective, Outputs, StepInfo
from augtune.methods.losses import nt_xent


class SimCLR(Objective):
    name = "simclr"
    knobs = ("train.temperature",)

    def loss(self, v1: torch.Tensor, v2: torch.Tensor, info: StepInfo) -> tuple[torch.Tensor, Outputs]:
        z1, z2 = self.embed(v1, info), self.embed(v2, info)  # (B, proj_dim) each
        loss = nt_xent(z1, z2, self.cfg.train.temperature)
        return loss, Outputs(projections=(z1, z2), targets=(z1, z2))
