"""DiffAug (Zang et al., 2024): a semantic encoder and a conditional diffusion generator trained in
turn; generated positives replace augmented ones with probability lambda.

How it maps onto augtune (App. B: z = H(y), y = F(x)):

- Enc(x) -> (y, z): y is the base's backbone output (F, what evaluation sees), z the base's
  projector applied to it (H, low-dimensional). The paper's bio-feature encoder [input, 500, 300, 80]
  is `model: {backbone: mlp, num_layers: 2, hidden_dim: 500, embed_dim: 300, proj_dim: 80}`.
- A-steps (Alg. 1 lines 8-12): the soft contrastive loss (eq. 2) replaces the base's loss
  (`phase_loss`); the base contributes backbone + projector only (Table 5: SimCLR's InfoNCE is the
  ablation B3, not part of DiffAug). Each view in turn is the centre x_c; the background set (eq. 3)
  is the other views of the batch: the same sample's are positives (H = 1), the rest negatives.
  `diffaug.objective: base` keeps the base's loss instead (Table 5 B3).
- B-steps (lines 4-6): the diffusion loss (eq. 6) trains the generator conditioned on z_c of the clean
  sample under stop-gradient, with the encoder frozen (`encoder_phases = ("A",)`; the generator's
  optimiser runs in phase B only). `diffaug.schedule: sync` trains both every step (Table 5 B4).
- Generated positives (eqs. 4, 8): once the generator has been trained, at the start of every encoder
  epoch the EMA generator draws one positive per training sample, conditioned on that sample's z
  (encoder in eval mode: Enc(x | theta*)). In each step the second view of each sample is replaced by
  its generated positive with probability lambda (the first view stays the anchor's own view x_c).
  Unlike the official code, the buffer is really generated and the rate is lambda.
"""
from __future__ import annotations

import copy

import torch
import torch.distributed as dist

from augtune.methods.base import Augmentation, Batch, OptimizerSpec, StepInfo
from augtune.methods.diffaug_ops import DDPM, ResidualMLPDenoiser, UNetDenoiser, ema_update, soft_contrastive_loss

_CHUNK = 1024  # samples generated per call while refreshing the buffer (memory, not results)


class DiffAug(Augmentation):
    """DiffAug: soft contrastive encoder + conditional diffusion generator in phases, generated positives."""

    name = "diffaug"
    figures = ("diffaug",)

    def __init__(self, cfg, data):
        super().__init__(cfg, data)
        d = self.d = cfg.diffaug
        self.sync = d.schedule.strip() == "sync"
        self.encoder_phases = None if self.sync else ("A",)
        self.image = data.modality == "image"
        self.shape = tuple(data.shape)
        self.x_train = data.x_train  # (N, *shape) on the CPU: the samples whose positives are generated
        kind = d.denoiser if d.denoiser != "auto" else ("unet" if self.image else "mlp")
        if kind == "unet" and not self.image:
            raise ValueError("diffaug.denoiser: unet needs images; this dataset gives vectors (use mlp)")
        cond_dim = cfg.model.proj_dim  # z_c is the projector's output
        if kind == "unet":
            self.generator = UNetDenoiser(self.shape[0], cond_dim, width=d.gen_width)
        else:
            in_dim = 1
            for s in self.shape:
                in_dim *= s
            self.generator = ResidualMLPDenoiser(in_dim, cond_dim, d.steps, hidden=d.gen_hidden)
        self.ema_generator = copy.deepcopy(self.generator)  # Gen(. | phi*): the one that samples
        for p in self.ema_generator.parameters():
            p.requires_grad_(False)
        self.ddpm = DDPM(d.steps)
        self.register_buffer("updates", torch.zeros((), dtype=torch.long))  # generator steps so far
        # the data's range in the generator's space (diffaug.clip): [-1, 1] for images, per feature for vectors
        lo = torch.full(self.shape, -1.0) if self.image else data.x_train.min(0).values
        hi = torch.full(self.shape, 1.0) if self.image else data.x_train.max(0).values
        self.register_buffer("clip_lo", lo, persistent=False)
        self.register_buffer("clip_hi", hi, persistent=False)
        self.positives: torch.Tensor | None = None  # (N, *shape) generated; rebuilt each epoch, not saved
        self._replaced = self._offered = 0
        self._std_ratio: float | None = None

    # -- the generator's space: images in [-1, 1] (DDPM), vectors as they are (already standardised) --

    def _to_gen(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2 - 1 if self.image else x

    def _from_gen(self, x: torch.Tensor) -> torch.Tensor:
        return ((x.clamp(-1, 1) + 1) / 2) if self.image else x

    @staticmethod
    def _embed(method, x: torch.Tensor, info: StepInfo | None) -> tuple[torch.Tensor, torch.Tensor]:
        """(y, z) = (backbone output, projector of it): (B, F), (B, proj_dim)."""
        obj = method.objective
        y = obj.encoder(x)
        h = y
        for hook in obj.feature_hooks:
            h = hook(h, info)
        return y, obj.projector(h)

    @torch.no_grad()
    def condition(self, method, x: torch.Tensor) -> torch.Tensor:
        """z_c = Enc(x | theta*) under stop-gradient, in eval mode (eq. 4): (B, *shape) -> (B, proj_dim)."""
        obj = method.objective
        was = obj.training
        obj.eval()
        try:
            return self._embed(method, x, None)[1].float()
        finally:
            obj.train(was)

    @torch.no_grad()
    def generate(self, method, x: torch.Tensor, sample_steps: int | None = None) -> torch.Tensor:
        """x_i^+ = Gen(delta | z_i), z_i from Enc(x_i) (eq. 8): positives of x, in the data's space."""
        out = []
        for i in range(0, len(x), _CHUNK):
            z = self.condition(method, x[i:i + _CHUNK])
            clip = (self.clip_lo, self.clip_hi) if self.d.clip else None
            out.append(self._from_gen(self.ddpm.sample(self.ema_generator, z, self.shape, sample_steps, clip)))
        return torch.cat(out) if out else x.new_zeros((0, *self.shape))

    # -- hooks -----------------------------------------------------------------------------------

    def default_phases(self) -> str:
        return "" if self.sync else self.d.schedule

    def optimizer_specs(self) -> list[OptimizerSpec]:
        return [OptimizerSpec("generator", list(self.generator.parameters()), lr=self.d.gen_lr, kind="adam",
                              weight_decay=0.0, phases=None if self.sync else ("B",))]

    def _encoder_step(self, info: StepInfo) -> bool:
        return self.sync or info.phase != "B"

    def on_epoch_start(self, method, info: StepInfo) -> None:
        self._replaced = self._offered = 0
        self._std_ratio = None
        if self.d.lam > 0 and int(self.updates) > 0 and self._encoder_step(info):
            device = next(self.generator.parameters()).device
            x = self.x_train.to(device)
            self.positives = self.generate(method, x, self.d.sample_steps)
            # diagnostic: ~1 when the generated positives have the data's spread; >> 1 flags an
            # under-trained generator whose sampling chain amplified its noise (up to 1/sqrt(abar_T))
            self._std_ratio = float(self.positives.std() / x.std().clamp_min(1e-12))
        else:
            self.positives = None  # before the first B-step: ordinary augmentation only

    def transform(self, batch: Batch, method, info: StepInfo) -> Batch:
        if self.positives is None or not self._encoder_step(info):
            return batch
        b = batch.x.shape[0]
        replace = torch.rand(b, device=batch.x.device) < self.d.lam  # (B,) each positive w.p. lambda
        gen = self.positives[batch.index]  # (B, *shape)
        view = torch.where(replace.view(b, *([1] * len(self.shape))), gen, batch.views[1])
        self._replaced += int(replace.sum())
        self._offered += b
        extra = {**batch.extra, "diffaug_replaced": replace}
        return Batch(batch.x, [batch.views[0], view, *batch.views[2:]], batch.index, batch.y, extra)

    def phase_loss(self, batch: Batch, method, info: StepInfo) -> dict[str, torch.Tensor] | None:
        terms: dict[str, torch.Tensor] = {}
        if self.sync or info.phase == "B":  # Alg. 1 line 5: L_df(x_c, SG(z_c) | phi)
            z_c = self.condition(method, batch.x)
            terms["diffusion"] = self.ddpm.loss(self.generator, self._to_gen(batch.x), z_c)
            if not self.sync:
                return terms
        if self.d.objective == "base":
            if not self.sync:
                return None  # the base's own loss (and other augmentations' terms)
            terms["contrast"] = method.objective.loss(batch.views[0], batch.views[1], info)[0]
            return terms
        # Each view in turn is the centre view x_c; the others are its background views (eq. 3): the
        # same sample's views are positives (H = 1), every other sample's views negatives. Symmetric.
        emb = [self._embed(method, v, info) for v in batch.views]  # [(B, F), (B, proj_dim)] per view
        b = batch.x.shape[0]
        same = torch.eye(b, dtype=torch.bool, device=batch.x.device).repeat(1, len(emb) - 1)  # (B, (V-1) B)
        losses = []
        for c, (y, z) in enumerate(emb):
            z_bg = torch.cat([e[1] for k, e in enumerate(emb) if k != c])  # ((V-1) B, proj_dim)
            losses.append(soft_contrastive_loss(y, z, z_bg, same, self.d.nu_y, self.d.nu_z, self.d.alpha))
        terms["scl"] = sum(losses) / len(losses)
        return terms

    def _ema(self) -> None:
        self.updates += 1
        n = int(self.updates)
        ema_update(self.ema_generator, self.generator, min(self.d.ema, (1 + n) / (10 + n)))

    def after_step(self, batch: Batch, method, info: StepInfo, optimizers: dict) -> None:
        if not (self.sync or info.phase == "B"):
            return
        self._ema()
        opt = optimizers["generator"]
        params = list(self.generator.parameters())
        for _ in range(self.d.gen_steps - 1):  # diffaug.gen_steps: more updates on the same batch
            z_c = self.condition(method, batch.x)
            self.ddpm.loss(self.generator, self._to_gen(batch.x), z_c).backward()
            if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
                from augtune.trainables.loop import allreduce_gradients  # (loop imports methods)

                allreduce_gradients(params, dist.get_world_size())  # as the loop does for its own steps
            if self.cfg.train.grad_clip:
                torch.nn.utils.clip_grad_norm_(params, self.cfg.train.grad_clip)
            opt.step()
            opt.zero_grad(set_to_none=True)
            self._ema()

    def epoch_metrics(self) -> dict[str, float]:
        out = {"diffaug_generator_steps": float(self.updates)}
        if self._offered:
            out["diffaug_replaced"] = self._replaced / self._offered  # observed rate, ~lambda
        if self._std_ratio is not None:
            out["diffaug_gen_std_ratio"] = self._std_ratio  # std of generated positives / std of the data
        return out
