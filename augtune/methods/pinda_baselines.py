"""PiNDA's non-vision baselines (Table 2, App. B.2), each an augmentation method of its own.

- ``random_noise``: rescale the input, then add standard Gaussian noise (untrained noise: what
  PiNDA's learned noise is compared with).
- ``simcl`` (Yang et al., 2022): normalised random noise added to the representation before the
  projection head; every projection of a view gets its own draw.
- ``clae`` (Ho & Vasconcelos, 2020): an adversarial example as a positive: the last view moves,
  within an L-inf budget ``pinda.clae_eps``, in the direction that increases the contrastive loss
  (FGSM; PGD with ``pinda.clae_steps`` > 1). ``augment: [clae, pinda]`` is PiNDA on top of CLAE: the
  adversarial view is PiNDA's a(x) (Alg. 1: view 1 is x + noise, view 2 the adversarial example).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from augtune.data.batches import as_float, is_streamed
from augtune.methods.base import Augmentation, Batch, StepInfo
from augtune.methods.losses import nt_xent


class RandomNoise(Augmentation):
    """Random Noise (B.2): views x + N(0, 1) after rescaling each feature to unit scale."""

    name = "random_noise"
    modalities = ("vector",)  # a non-vision baseline (PiNDA B.2)

    def __init__(self, cfg, data):
        super().__init__(cfg, data)
        # "rescale the input feature, then add standard Gaussian noise": noise in units of each
        # feature's spread over the training set (standardised vectors: std 1, so plain N(0, 1)).
        x = data.pretrain()[0]
        if is_streamed(x):
            raise ValueError("random_noise: needs the training images in memory (dataset.cache: memory)")
        std = as_float(x).std(dim=0, keepdim=True).clamp_min(1e-6)  # (1, *shape); uint8: one float copy, here
        self.register_buffer("scale", std, persistent=False)

    def transform(self, batch: Batch, method, info: StepInfo) -> Batch:
        return batch.with_views([batch.x + torch.randn_like(batch.x) * self.scale for _ in batch.views])


class SimCL(Augmentation):
    """SimCL (B.2): h + eta ||h|| n / ||n||, n ~ N(0, I), between backbone and projector."""

    name = "simcl"
    knobs = ("pinda.simcl_eta",)
    modalities = ("vector",)  # a non-vision baseline (PiNDA B.2)

    def perturb_features(self, h: torch.Tensor, info: StepInfo | None) -> torch.Tensor | None:
        if not self.training:
            return None  # evaluation sees the clean representation
        direction = F.normalize(torch.randn_like(h), dim=1)  # (B, F) unit rows
        return h + self.cfg.pinda.simcl_eta * h.norm(dim=1, keepdim=True).detach() * direction


class CLAE(Augmentation):
    """CLAE: the last view replaced by its adversarial example, which increases the contrastive loss."""

    name = "clae"
    knobs = ("pinda.clae_eps", "pinda.clae_steps", "train.temperature")
    modalities = ("vector",)  # a non-vision baseline (PiNDA B.2)

    def adversarial(self, v1: torch.Tensor, v2: torch.Tensor, method, info: StepInfo) -> torch.Tensor:
        """v1 + delta, ||delta||_inf <= eps, ascending NT-Xent of the online projections against v2 (as
        CLAE does for SimCLR, whatever the base: it reads no queue and no target). No gradient reaches
        weights; BatchNorm's running statistics do see the extra forward passes."""
        c = self.cfg.pinda
        objective = method.objective
        step = c.clae_eps if c.clae_steps == 1 else 2.5 * c.clae_eps / c.clae_steps
        with torch.no_grad():
            z2 = objective.embed(v2, info)
        delta = torch.zeros_like(v1)
        for _ in range(c.clae_steps):
            delta.requires_grad_(True)
            with torch.enable_grad():
                loss = nt_xent(
                    objective.embed(v1 + delta, info), z2, self.cfg.train.temperature, gather=False
                )
                (grad,) = torch.autograd.grad(loss, delta)
            delta = (delta.detach() + step * grad.sign()).clamp(-c.clae_eps, c.clae_eps)
        return (v1 + delta).detach()

    def transform(self, batch: Batch, method, info: StepInfo) -> Batch:
        return batch.with_views(
            [*batch.views[:-1], self.adversarial(batch.views[-1], batch.views[0], method, info)]
        )
