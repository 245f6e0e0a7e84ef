"""A method = one base objective + zero or more augmentation methods, composed in config order."""
from __future__ import annotations

import torch
from torch import nn

from augtune.methods.base import Augmentation, Batch, Objective, OptimizerSpec, StepInfo, Update


class Method(nn.Module):
    """What the training loop trains. ``forward`` is one training step's loss (so DDP can wrap it)."""

    def __init__(self, objective: Objective, augments: list[Augmentation]):
        super().__init__()
        self.objective = objective
        self.augments = nn.ModuleList(augments)
        objective.feature_hooks = [self._perturb_features] if augments else []
        # Phases the encoder trains in: the last augmentation that restricts them wins (None: all).
        self.encoder_phases = next((a.encoder_phases for a in reversed(augments)
                                    if a.encoder_phases is not None), None)

    def _perturb_features(self, h: torch.Tensor, info: StepInfo | None) -> torch.Tensor:
        for aug in self.augments:
            out = aug.perturb_features(h, info)
            if out is not None:
                h = out
        return h

    def forward(self, batch: Batch, info: StepInfo) -> tuple[torch.Tensor, dict[str, torch.Tensor], Batch]:
        """Total loss, its named terms (detached) and the batch as the augmentations transformed it."""
        for aug in self.augments:
            batch = aug.transform(batch, self, info)
        for aug in self.augments:
            terms = aug.phase_loss(batch, self, info)
            if terms is not None:
                break
        else:
            loss, out = self.objective.loss(batch.views[0], batch.views[1], info)
            terms = {"contrast": loss}
            for aug in self.augments:
                terms.update(aug.loss_terms(batch, out, self, info))
        total = sum(terms.values())
        return total, {k: v.detach() for k, v in terms.items()}, batch

    @torch.no_grad()
    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Representation that evaluation sees (the backbone's output)."""
        return self.objective.features(x)

    def optimizer_specs(self) -> list[OptimizerSpec]:
        """The encoder's optimiser (objective + jointly trained networks) first, then the augments'."""
        params = [p for p in self.objective.parameters() if p.requires_grad]
        for aug in self.augments:
            params += aug.joint_parameters()
        specs = [OptimizerSpec("encoder", params, phases=self.encoder_phases)]
        for aug in self.augments:
            specs += aug.optimizer_specs()
        return specs

    def default_phases(self) -> str:
        return next((s for s in (a.default_phases() for a in self.augments) if s), "")

    def after_step(self, batch: Batch, info: StepInfo, update: Update) -> None:
        if self.encoder_active(info.phase):
            self.objective.after_step(info)
        for aug in self.augments:
            aug.after_step(batch, self, info, update)

    def encoder_active(self, phase: str) -> bool:
        return self.encoder_phases is None or phase in self.encoder_phases

    def apply_knobs(self, cfg) -> None:
        """The config in force from this epoch on, to the objective and every augmentation."""
        self.objective.apply_knobs(cfg)
        for aug in self.augments:
            aug.apply_knobs(cfg)

    def on_epoch_start(self, info: StepInfo) -> None:
        for aug in self.augments:
            aug.meter.reset()
            aug.on_epoch_start(self, info)

    def epoch_metrics(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for aug in self.augments:
            out.update(aug.epoch_metrics())
        return out

    @property
    def figures(self) -> tuple[str, ...]:
        """The figures the augmentations ask for at the end of a run, in order, once each."""
        return tuple(dict.fromkeys(k for aug in self.augments for k in aug.figures))
