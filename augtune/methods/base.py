"""The seam every method plugs into: a base objective plus augmentation methods.

A training step sees a :class:`Batch` (clean samples and their views, immutable) and a
:class:`StepInfo` (where the run is, the encoder's learning rate, whether autocast is on). A base
:class:`Objective` (SimCLR, BYOL, MoCo, SimSiam) turns two views into a loss and an
:class:`Outputs` record, and offers a narrow interface to the networks it owns: ``encode``,
``head``, ``embed``, ``predict``, ``target_embed``, ``target_network`` and ``features`` (and, for a
look-ahead, ``encoder_parameters`` and ``encode_with``).
An :class:`Augmentation` (PiNDA, NRCC, CoCor, DiffAug, ...) uses only that interface and may

- return a new batch with changed or added views (``transform``; ``after_step`` sees that batch),
- perturb representations between backbone and projector (``perturb_features``),
- add loss terms that read the objective's outputs (``loss_terms``),
- replace the loss in phases it owns (``phase_loss``: DiffAug's generator steps),
- own networks trained with the encoder (``joint_parameters``) or by optimisers of their own that
  the loop builds, schedules, checkpoints and steps only in the phases they name
  (``optimizer_specs``); an extra update of its own (CoCor's bi-level MMNN step, DiffAug's extra
  generator steps) is asked of the loop through the ``update`` callback of ``after_step``, so that
  the loop owns every optimiser step (all-reduce over ranks, gradient clipping, zeroing),
- ask for named training phases (``default_phases``, e.g. ``"A:200,B:400,A:800"``),
- report diagnostics of the epoch beside the loss through its :class:`EpochMeter` (``self.meter``),
- name the figures a run draws at its end (``figures``: kinds of ``augtune plot``).
"""
from __future__ import annotations

import copy
import dataclasses
import math
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping, Optional, Protocol, Sequence

import torch
from torch import nn

from augtune.models import projector


@dataclass(frozen=True)
class Batch:
    x: torch.Tensor  # (B, *shape) clean samples, unnormalised (images in [0, 1])
    views: tuple[torch.Tensor, ...]  # views of x (two by default), same space as x
    index: torch.Tensor  # (B,) positions in the training set
    y: Optional[torch.Tensor] = None  # (B,) labels: never used by self-supervised objectives
    # what augmentations pass on to their loss terms (read-only: `with_views(..., key=value)` adds)
    extra: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    def with_views(self, views: Sequence[torch.Tensor], **extra: Any) -> "Batch":
        """A new batch with these views (and `extra` entries added); this one is left as it is."""
        return dataclasses.replace(self, views=tuple(views), extra=MappingProxyType({**self.extra, **extra}))


@dataclass(frozen=True)
class StepInfo:
    epoch: int  # 0-based epoch being trained
    step: int  # global optimisation step, 0-based
    total_steps: int
    phase: str = ""  # named phase of the schedule; "" when the run has one phase
    lr: float = 0.0  # the encoder's learning rate in this step (after warm-up and schedule)
    autocast: bool = False  # whether the step's (or the epoch start's) forward passes run under bf16 autocast
    # at an epoch's start: the samples (indices into the training split) its steps will train on, every
    # other one left out by the last partial batch; None: every sample may be
    visits: Optional[torch.Tensor] = None

    @property
    def progress(self) -> float:
        return self.step / max(1, self.total_steps)


class Update(Protocol):
    """The loop's step of optimiser `name`: from `loss` (back-propagated here) or from `grads` (one per
    parameter of that optimiser, in its order; None leaves a parameter without gradient). The
    gradients are averaged over DDP ranks and clipped as the loop's own steps are."""

    def __call__(self, name: str, *, loss: Optional[torch.Tensor] = None,
                 grads: Optional[Sequence[Optional[torch.Tensor]]] = None) -> None: ...


@dataclass(frozen=True)
class Outputs:
    """What a base objective computed for the two views of a step (each a pair: view 1, view 2)."""

    projections: tuple[torch.Tensor, torch.Tensor]  # online g(f(v)), (B, D) each, with gradient
    # what each view's anchor is pulled towards: the EMA target of a momentum base (no gradient), z under
    # stop-gradient for SimSiam, z itself for SimCLR (both sides of a symmetric contrast carry gradient)
    targets: tuple[torch.Tensor, torch.Tensor]
    predictions: Optional[tuple[torch.Tensor, torch.Tensor]] = None  # q(g(f(v))) where there is a predictor

    @property
    def anchors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The online side of the comparison: predictions where the base has a predictor, else projections."""
        return self.predictions if self.predictions is not None else self.projections


@dataclass
class OptimizerSpec:
    """An optimiser the loop builds for an augmentation's own networks."""
    name: str
    params: list  # parameters or parameter-group dicts
    lr: Optional[float] = None  # None: train.lr
    kind: Optional[str] = None  # None: train.optimizer
    weight_decay: Optional[float] = None  # None: train.weight_decay
    phases: Optional[tuple[str, ...]] = None  # active only in these phases; None: always
    manual: bool = False  # stepped only through `update` from its owner's `after_step`, not every step
    eps: Optional[float] = None  # Adam's epsilon; None: torch's 1e-8


class EpochMeter:
    """A method's diagnostics over one epoch: means of values added per step (weighted), and states
    set once. Values stay tensors on their device until read (no host sync per step); the loop
    resets every meter at the start of an epoch."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self._sums: dict[str, Any] = {}
        self._weights: dict[str, float] = {}
        self._states: dict[str, float] = {}

    def add(self, key: str, value: Any, weight: float = 1.0) -> None:
        value = value.detach().float() if isinstance(value, torch.Tensor) else float(value)
        self._sums[key] = self._sums.get(key, 0) + (value if weight == 1.0 else value * weight)
        self._weights[key] = self._weights.get(key, 0.0) + weight

    def set(self, key: str, value: float) -> None:
        self._states[key] = float(value)

    def means(self) -> dict[str, float]:
        out = {k: float(v) / self._weights[k] for k, v in self._sums.items() if self._weights[k]}
        out.update(self._states)
        return out


class Encoder(nn.Module):
    """Input normalisation followed by the backbone, so target copies normalise identically."""

    def __init__(self, backbone: nn.Module, mean: tuple[float, ...] | None, std: tuple[float, ...] | None):
        super().__init__()
        self.backbone = backbone
        self.out_dim = backbone.out_dim
        shape = (1, -1, 1, 1)
        self.register_buffer(
            "mean", torch.tensor(mean).view(shape) if mean else torch.zeros(()), persistent=False
        )
        self.register_buffer(
            "std", torch.tensor(std).view(shape) if std else torch.ones(()), persistent=False
        )

    # set by the loop under `train.compile: reduce-overhead`: a CUDA graph's replay writes its outputs
    # into the same memory, so a method that calls the backbone again while it still holds an earlier
    # output (CoCor's composites, NRCC's chain) needs its own copy
    clone_outputs = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.backbone((x - self.mean) / self.std)
        return y.clone() if self.clone_outputs else y


class Objective(nn.Module):
    """A base method: two views in, a scalar loss and an :class:`Outputs` record out.

    Subclasses build their heads in ``__init__`` and implement ``loss``; a base with a predictor
    sets ``self.predictor``. The online branch is ``encode -> head`` (``head``: the composite's
    feature perturbations, then the projector); ``features`` is what evaluation sees.
    """

    name = "objective"
    # Dotted config keys it reads from `self.cfg` at every step (never caches at set-up): a `schedule` or
    # PBT may change them between epochs, handed over by `apply_knobs`.
    knobs: tuple[str, ...] = ()

    def __init__(self, encoder: Encoder, cfg):
        super().__init__()
        self.cfg = cfg
        self.encoder = encoder
        self.projector = projector(encoder.out_dim, cfg.model)
        self.predictor: Optional[nn.Module] = None  # set by a base with a predictor (BYOL, SimSiam)
        self.feature_hooks: list = []  # callables (h, info) -> h, set by the composite

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """f(x): the online backbone's features (B, F), with gradient."""
        return self.encoder(x)

    def encoder_parameters(self) -> dict[str, nn.Parameter]:
        """f's trainable parameters by name: what a look-ahead step differentiates (CoCor's MMNN update)."""
        return {n: p for n, p in self.encoder.named_parameters() if p.requires_grad}

    def encode_with(self, params: Mapping[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """f(x) at other weights: `params` (names of :meth:`encoder_parameters`) stand in for the
        backbone's own for this call only (a functional call; the module's weights are not touched)."""
        return torch.func.functional_call(self.encoder, dict(params), (x,))

    def head(self, h: torch.Tensor, info: StepInfo | None = None) -> torch.Tensor:
        """g(h): feature perturbations (SimCL's) then the projector, (B, F) -> (B, proj_dim)."""
        for hook in self.feature_hooks:
            h = hook(h, info)
        return self.projector(h)

    def embed(self, x: torch.Tensor, info: StepInfo | None = None) -> torch.Tensor:
        """g(f(x)): the online projection (B, proj_dim), with gradient."""
        return self.head(self.encode(x), info)

    def predict(self, z: torch.Tensor) -> torch.Tensor:
        """q(z) where the base has a predictor (BYOL, SimSiam); z itself otherwise."""
        return z if self.predictor is None else self.predictor(z)

    def target_embed(self, x: torch.Tensor, info: StepInfo | None = None) -> torch.Tensor:
        """What an anchor is pulled towards, for new inputs x: as :attr:`Outputs.targets` (here the
        online projection itself, with gradient, as SimCLR's symmetric contrast has it)."""
        return self.embed(x, info)

    def target_network(self, x: torch.Tensor) -> torch.Tensor:
        """The target side as a plain function of x (no feature perturbations): gradients taken with
        respect to x reach no weight that the caller does not differentiate (NRCC's SGHMC)."""
        return self.projector(self.encoder(x))

    def online_networks(self) -> list[nn.Module]:
        """The networks trained by the encoder's optimiser (whose buffers a look-ahead must keep)."""
        return [m for m in (self.encoder, self.projector, self.predictor) if m is not None]

    def apply_knobs(self, cfg) -> None:
        """The config in force from this epoch on (it differs from the run's only in `knobs`)."""
        self.cfg = cfg

    def loss(self, v1: torch.Tensor, v2: torch.Tensor, info: StepInfo) -> tuple[torch.Tensor, Outputs]:
        raise NotImplementedError

    @torch.no_grad()
    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(x)

    def after_step(self, info: StepInfo) -> None:
        """Called after every optimiser step of the encoder (momentum updates)."""


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
        encoder = (
            self.target_encoder if self.cfg.eval.encoder in ("target", "target_if_any") else self.encoder
        )
        return encoder(x)

    def target_network(self, x: torch.Tensor) -> torch.Tensor:
        return self.target_projector(self.target_encoder(x))  # frozen weights: only x can get a gradient

    @torch.no_grad()
    def target_embed(self, x: torch.Tensor, info: StepInfo | None = None) -> torch.Tensor:
        return self.target_network(x)

    @torch.no_grad()
    def after_step(self, info: StepInfo) -> None:
        m = self.momentum(info)
        online, target = list(self.online_parameters()), list(self.target_parameters())
        torch._foreach_mul_(target, m)
        torch._foreach_add_(target, online, alpha=1 - m)  # target <- m target + (1 - m) online
        if self.cfg.method.target_bn == "online":  # else the target keeps the statistics of its own passes
            for t, o in zip(self.target_buffers(), self.online_buffers()):
                t.copy_(o)

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
    """An augmentation method stacked on a base objective. Every hook is optional.

    Hooks receive the composite `method` (a :class:`augtune.methods.Method`); they reach the base
    only through ``method.objective``'s interface (:class:`Objective`), never its attributes.
    """

    name = "augmentation"
    figures: tuple[str, ...] = ()  # `augtune plot` kinds drawn at the end of a run (eval.figures: None)
    encoder_phases: Optional[tuple[str, ...]] = None  # phases the encoder trains in; None: all
    # Dotted config keys it reads from `self.cfg` at every step (per-epoch knobs): a `schedule` or PBT may
    # change them between epochs (`apply_knobs`). A key read only at set-up (a network's width) is not one.
    knobs: tuple[str, ...] = ()

    def __init__(self, cfg, data):
        super().__init__()
        self.cfg = cfg
        self.meter = EpochMeter()  # this epoch's diagnostics, reported as `<name>_<key>`

    def apply_knobs(self, cfg) -> None:
        """The config in force from this epoch on (it differs from the run's only in `knobs`); a method
        that keeps a section of its own (`self.d = cfg.diffaug`) refreshes it here."""
        self.cfg = cfg

    def transform(self, batch: Batch, method, info: StepInfo) -> Batch:
        return batch  # a new Batch (`batch.with_views(...)`) when the views change

    def perturb_features(self, h: torch.Tensor, info: StepInfo | None) -> torch.Tensor | None:
        return None  # None: this method does not touch representations

    def loss_terms(self, batch: Batch, out: Outputs, method, info: StepInfo) -> dict[str, torch.Tensor]:
        return {}

    def phase_loss(self, batch: Batch, method, info: StepInfo) -> dict[str, torch.Tensor] | None:
        return None  # a dict of terms replaces the objective's loss in this phase

    def joint_parameters(self) -> list:
        return []  # trained by the encoder's optimiser, as PiNDA's generator

    def optimizer_specs(self) -> list[OptimizerSpec]:
        return []

    def default_phases(self) -> str:
        return ""

    def after_step(self, batch: Batch, method, info: StepInfo, update: Update) -> None:
        """After the loop's optimiser step; `batch` is the one this step trained on (transformed)."""

    def on_epoch_start(self, method, info: StepInfo) -> None:
        pass

    def epoch_metrics(self) -> dict[str, float]:
        """Diagnostics of the epoch just trained, named `<method>_<what>`: the meter's means."""
        return {f"{self.name}_{k}": v for k, v in self.meter.means().items()}
