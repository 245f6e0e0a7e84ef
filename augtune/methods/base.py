"""The seam every method plugs into: a base objective plus augmentation methods.

A training step sees a :class:`Batch` (clean samples and their views) and a :class:`StepInfo`
(where the run is). A base :class:`Objective` (SimCLR, BYOL, MoCo, SimSiam) turns two views into a
loss. An :class:`Augmentation` (PiNDA, NRCC, CoCor, DiffAug, ...) may

- change or add views before the objective sees them (``transform``),
- perturb representations between backbone and projector (``perturb_features``),
- add loss terms that read the objective's outputs (``loss_terms``),
- replace the loss in phases it owns (``phase_loss``: DiffAug's generator steps),
- own networks trained with the encoder (``joint_parameters``) or by optimisers of their own that
  the loop builds, schedules, checkpoints and steps only in the phases they name
  (``optimizer_specs``), or steps itself (``manual``: CoCor's bi-level MMNN update, in ``after_step``),
- ask for named training phases (``default_phases``, e.g. ``"A:200,B:400,A:800"``),
- report diagnostics of the epoch beside the loss (``epoch_metrics``: PiNDA's noise norm, ...),
- name the figures a run draws at its end (``figures``: kinds of ``augtune plot``).
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
from torch import nn

from augtune.models import projector


@dataclass
class Batch:
    x: torch.Tensor  # (B, *shape) clean samples, unnormalised (images in [0, 1])
    views: list[torch.Tensor]  # views of x (two by default), same space as x
    index: torch.Tensor  # (B,) positions in the training set
    y: Optional[torch.Tensor] = None  # (B,) labels: never used by self-supervised objectives
    extra: dict[str, Any] = field(default_factory=dict)  # what augmentations pass on to their loss terms


@dataclass(frozen=True)
class StepInfo:
    epoch: int  # 0-based epoch being trained
    step: int  # global optimisation step, 0-based
    total_steps: int
    phase: str = ""  # named phase of the schedule; "" when the run has one phase

    @property
    def progress(self) -> float:
        return self.step / max(1, self.total_steps)


@dataclass
class OptimizerSpec:
    """An optimiser the loop builds for an augmentation's own networks."""
    name: str
    params: list  # parameters or parameter-group dicts
    lr: Optional[float] = None  # None: train.lr
    kind: Optional[str] = None  # None: train.optimizer
    weight_decay: Optional[float] = None  # None: train.weight_decay
    phases: Optional[tuple[str, ...]] = None  # active only in these phases; None: always
    manual: bool = False  # stepped by its owner in `after_step`, not by the loop


class Encoder(nn.Module):
    """Input normalisation followed by the backbone, so target copies normalise identically."""

    def __init__(self, backbone: nn.Module, mean: tuple[float, ...] | None, std: tuple[float, ...] | None):
        super().__init__()
        self.backbone = backbone
        self.out_dim = backbone.out_dim
        shape = (1, -1, 1, 1)
        self.register_buffer("mean", torch.tensor(mean).view(shape) if mean else torch.zeros(()), persistent=False)
        self.register_buffer("std", torch.tensor(std).view(shape) if std else torch.ones(()), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.backbone((x - self.mean) / self.std)


class Objective(nn.Module):
    """A base method: two views in, a scalar loss and named outputs out.

    Subclasses build their heads in ``__init__`` and implement ``loss``. The online branch is
    ``encoder -> perturb_features -> projector``; ``features`` is what evaluation sees.
    """

    name = "objective"

    def __init__(self, encoder: Encoder, cfg):
        super().__init__()
        self.cfg = cfg
        self.encoder = encoder
        self.projector = projector(encoder.out_dim, cfg.model)
        self.feature_hooks: list = []  # callables (h, info) -> h, set by the composite

    def project(self, x: torch.Tensor, info: StepInfo | None = None) -> torch.Tensor:
        h = self.encoder(x)  # (B, F)
        for hook in self.feature_hooks:
            h = hook(h, info)
        return self.projector(h)  # (B, proj_dim)

    def loss(self, v1: torch.Tensor, v2: torch.Tensor, info: StepInfo) -> tuple[torch.Tensor, dict]:
        raise NotImplementedError

    @torch.no_grad()
    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(x)

    def after_step(self, info: StepInfo) -> None:
        """Called after every optimiser step (momentum updates)."""


class MomentumObjective(Objective):
    """An objective with an EMA target copy of encoder and projector (BYOL, MoCo)."""

    default_momentum = 0.99

    def __init__(self, encoder: Encoder, cfg):
        super().__init__(encoder, cfg)
        self.target_encoder = copy.deepcopy(self.encoder)
        self.target_projector = copy.deepcopy(self.projector)
        for p in self.target_parameters():
            p.requires_grad_(False)
        m = cfg.method.momentum
        self.base_momentum = self.default_momentum if m is None else m

    def target_parameters(self):
        yield from self.target_encoder.parameters()
        yield from self.target_projector.parameters()

    def online_parameters(self):
        yield from self.encoder.parameters()
        yield from self.projector.parameters()

    def momentum(self, info: StepInfo) -> float:
        return self.base_momentum

    @torch.no_grad()
    def features(self, x: torch.Tensor) -> torch.Tensor:
        encoder = self.target_encoder if self.cfg.eval.encoder in ("target", "target_if_any") else self.encoder
        return encoder(x)

    @torch.no_grad()
    def target_project(self, x: torch.Tensor) -> torch.Tensor:
        return self.target_projector(self.target_encoder(x))

    @torch.no_grad()
    def after_step(self, info: StepInfo) -> None:
        m = self.momentum(info)
        online, target = list(self.online_parameters()), list(self.target_parameters())
        torch._foreach_mul_(target, m)
        torch._foreach_add_(target, online, alpha=1 - m)  # target <- m target + (1 - m) online
        for t, o in zip(self.target_buffers(), self.online_buffers()):
            t.copy_(o)  # BatchNorm running statistics follow the online network

    def target_buffers(self):
        yield from self.target_encoder.buffers()
        yield from self.target_projector.buffers()

    def online_buffers(self):
        yield from self.encoder.buffers()
        yield from self.projector.buffers()


def cosine_momentum(base: float, progress: float) -> float:
    """BYOL's schedule: tau = 1 - (1 - tau_base) (cos(pi k / K) + 1) / 2, from tau_base to 1."""
    return 1 - (1 - base) * (math.cos(math.pi * progress) + 1) / 2


class Augmentation(nn.Module):
    """An augmentation method stacked on a base objective. Every hook is optional."""

    name = "augmentation"
    figures: tuple[str, ...] = ()  # `augtune plot` kinds drawn at the end of a run (eval.figures: None)

    def __init__(self, cfg, data):
        super().__init__()
        self.cfg = cfg

    def transform(self, batch: Batch, method, info: StepInfo) -> Batch:
        return batch

    def perturb_features(self, h: torch.Tensor, info: StepInfo | None) -> torch.Tensor | None:
        return None  # None: this method does not touch representations

    def loss_terms(self, batch: Batch, out: dict, method, info: StepInfo) -> dict[str, torch.Tensor]:
        return {}

    def phase_loss(self, batch: Batch, method, info: StepInfo) -> dict[str, torch.Tensor] | None:
        return None  # a dict of terms replaces the objective's loss in this phase

    def joint_parameters(self) -> list:
        return []  # trained by the encoder's optimiser, as PiNDA's generator

    def optimizer_specs(self) -> list[OptimizerSpec]:
        return []

    encoder_phases: Optional[tuple[str, ...]] = None  # phases the encoder trains in; None: all

    def default_phases(self) -> str:
        return ""

    def after_step(self, batch: Batch, method, info: StepInfo, optimizers: dict) -> None:
        pass

    def on_epoch_start(self, method, info: StepInfo) -> None:
        pass

    def epoch_metrics(self) -> dict[str, float]:
        """Diagnostics of the epoch just trained, named `<method>_<what>` (reset in on_epoch_start)."""
        return {}
