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
- Generated positives (eqs. 4, 8): once the generator has been trained, the second view of each sample
  is replaced by a generated positive with probability lambda (the first view stays the anchor's own
  view x_c). At the start of every encoder epoch the epoch's replacements are drawn first, one
  Bernoulli(lambda) per training sample (an epoch visits each sample once), from a generator seeded by
  (train.seed, epoch) alone: independent of the data and of every other draw, the same on every DDP
  rank and after a resume. The EMA generator then draws positives for those samples only, and of them
  only for the ones the epoch's steps visit (the loop's `StepInfo.visits`: the last partial batch is
  dropped), conditioned on each one's z (encoder in eval mode: Enc(x | theta*)): about lambda times the
  visited samples, not N of which most would go unused. Unlike the official code, the positives are
  really generated and the rate is lambda.
"""
from __future__ import annotations

import copy

import numpy as np
import torch

from augtune.data.batches import as_float, is_streamed
from augtune.methods.base import Augmentation, Batch, OptimizerSpec, StepInfo, Update
from augtune.methods.diffaug_ops import (
    DDPM,
    ResidualMLPDenoiser,
    UNetDenoiser,
    ema_update,
    soft_contrastive_loss,
    soft_contrastive_loss_two_views,
)

_CHUNK = 1024  # samples generated per call while refreshing the positives (memory, not results)


class DiffAug(Augmentation):
    """DiffAug: soft contrastive encoder + conditional diffusion generator in phases, generated positives."""

    name = "diffaug"
    figures = ("diffaug",)
    # read through self.d in every step or buffer refresh; steps, schedule and the networks are set-up
    knobs = ("diffaug.lam", "diffaug.nu_y", "diffaug.nu_z", "diffaug.alpha", "diffaug.ema",
             "diffaug.sample_steps", "diffaug.sample_variance", "diffaug.clip")

    def __init__(self, cfg, data):
        super().__init__(cfg, data)
        d = self.d = cfg.diffaug
        self.sync = d.schedule.strip() == "sync"
        self.encoder_phases = None if self.sync else ("A",)
        self.image = data.modality == "image"
        self.shape = tuple(data.shape)
        self.x_train = data.pretrain()[0]  # (N, *shape) on the CPU: the samples whose positives are generated
        if is_streamed(self.x_train):  # the chosen samples are gathered for each refresh: in memory by design
            raise ValueError("diffaug: needs the training images in memory (dataset.cache: memory)")
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
        # the data's range in the generator's space (diffaug.clip): [-1, 1] for images, per feature for
        # vectors
        lo = torch.full(self.shape, -1.0) if self.image else self.x_train.min(0).values
        hi = torch.full(self.shape, 1.0) if self.image else self.x_train.max(0).values
        self.register_buffer("clip_lo", lo, persistent=False)
        self.register_buffer("clip_hi", hi, persistent=False)
        # the epoch's generated positives, rebuilt each encoder epoch, not saved: `positives` (K, *shape) for
        # the K samples drawn for replacement, `slot` (N,) each sample's row in it, -1 where not replaced
        self.positives: torch.Tensor | None = None
        self.slot: torch.Tensor | None = None
        self.seed = cfg.train.seed
        self._z_c: tuple | None = None  # (x, z_c): a B-step's batch and condition, for its extra updates
        # the last epoch of a B-phase: after it the generator never trains again (None: sync trains always)
        self.last_b = None if self.sync else self._last_b_epoch(cfg)
        self._ema_loaded = False  # the generator set to its EMA after the last B-phase (reset by a load)
        self.register_state_dict_post_hook(_store_ema_once)
        self.register_load_state_dict_pre_hook(_restore_ema)

    def apply_knobs(self, cfg) -> None:
        super().apply_knobs(cfg)
        self.d = cfg.diffaug

    # -- the generator's space: images in [-1, 1] (DDPM), vectors as they are (already standardised) --

    @staticmethod
    def _last_b_epoch(cfg) -> int:
        """0-based epoch of the schedule's last B-phase epoch (-1: none)."""
        from augtune.phases import parse_phases

        phases = parse_phases(cfg.train.phases or cfg.diffaug.schedule, cfg.train.epochs)
        return max((e for e, p in enumerate(phases) if p == "B"), default=-1)

    def ema_is_generator(self) -> bool:
        """Whether the EMA copy holds the generator's very values (before the first generator update,
        and after the last B-phase, where the generator is set to its EMA): then it is stored once."""
        ema, gen = self.ema_generator.state_dict(), self.generator.state_dict()
        return all(torch.equal(ema[k], gen[k]) for k in gen)

    def _to_gen(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2 - 1 if self.image else x

    def _from_gen(self, x: torch.Tensor) -> torch.Tensor:
        return ((x.clamp(-1, 1) + 1) / 2) if self.image else x

    @staticmethod
    def _embed(method, x: torch.Tensor, info: StepInfo | None) -> tuple[torch.Tensor, torch.Tensor]:
        """(y, z) = (backbone output, projector of it): (B, F), (B, proj_dim)."""
        y = method.objective.encode(x)
        return y, method.objective.head(y, info)

    @torch.no_grad()
    def condition(self, method, x: torch.Tensor) -> torch.Tensor:
        """z_c = Enc(x | theta*) under stop-gradient, in eval mode (eq. 4): (B, *shape) -> (B, proj_dim)."""
        obj = method.objective
        was = obj.training
        obj.eval()
        try:
            z = self._embed(method, x, None)[1]
            return z.float() if z.dtype in (torch.float16, torch.bfloat16) else z  # autocast's bf16 up
        finally:
            obj.train(was)

    @torch.no_grad()
    def generate(self, method, x: torch.Tensor) -> torch.Tensor:
        """x_i^+ = Gen(delta | z_i), z_i from Enc(x_i) (eq. 8): positives of x, in the data's space, drawn
        as every sampling of the run is (the buffer's refresh, the figures): `diffaug.sample_steps`
        strided steps, sigma^2 `diffaug.sample_variance`, clamped to the data's range if `diffaug.clip`."""
        out = []
        clip = (self.clip_lo, self.clip_hi) if self.d.clip else None
        for i in range(0, len(x), _CHUNK):
            z = self.condition(method, x[i:i + _CHUNK])
            x0 = self.ddpm.sample(self.ema_generator, z, self.shape, self.d.sample_steps, clip,
                                  sample_variance=self.d.sample_variance)
            out.append(self._from_gen(x0))
        return torch.cat(out) if out else x.new_zeros((0, *self.shape))

    # -- hooks -----------------------------------------------------------------------------------

    def default_phases(self) -> str:
        return "" if self.sync else self.d.schedule

    def optimizer_specs(self) -> list[OptimizerSpec]:
        return [OptimizerSpec("generator", list(self.generator.parameters()), lr=self.d.gen_lr, kind="adam",
                              weight_decay=0.0, phases=None if self.sync else ("B",))]

    def _encoder_step(self, info: StepInfo) -> bool:
        return self.sync or info.phase != "B"

    def replacements(self, epoch: int) -> torch.Tensor:
        """(N,) bool: which samples' positives are replaced in `epoch`, each with probability lambda, drawn
        from a generator seeded by (train.seed, epoch) alone (the module doc)."""
        seed = np.random.SeedSequence([self.seed, epoch, 0xD1FFA6]).generate_state(1)[0]
        g = torch.Generator().manual_seed(int(seed))
        return torch.rand(len(self.x_train), generator=g) < self.d.lam  # rand < 1 always: lambda 1 is all

    def on_epoch_start(self, method, info: StepInfo) -> None:
        if self.last_b is not None and 0 <= self.last_b < info.epoch and not self._ema_loaded:
            # no B-phase follows: the generator never trains again and only its EMA samples, so the generator
            # becomes that EMA (idempotent, so once: until a checkpoint is loaded), which a checkpoint then
            # holds once (_store_ema_once)
            self.generator.load_state_dict(self.ema_generator.state_dict())
            self._ema_loaded = True
        if not (self.d.lam > 0 and int(self.updates) > 0 and self._encoder_step(info)):
            self.positives = self.slot = None  # before the first B-step: ordinary augmentation only
            return
        device = next(self.generator.parameters()).device
        replaced = self.replacements(info.epoch)
        if info.visits is not None:  # a sample the epoch never trains on needs no positive (drop_last)
            visited = torch.zeros_like(replaced)
            visited[info.visits.cpu()] = True
            replaced &= visited
        chosen = replaced.nonzero().squeeze(1)  # (K,) ascending sample indices
        slot = torch.full((len(self.x_train),), -1, dtype=torch.long)
        slot[chosen] = torch.arange(len(chosen))
        x = as_float(self.x_train[chosen].to(device))  # (K, *shape): uint8 images float once per refresh
        # in the training's precision: the denoiser under bf16 autocast where the steps run so (the chain
        # itself stays in the schedule's float32; tests/test_precision.py bounds the samples' error)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=info.autocast):
            self.positives = self.generate(method, x)
        self.slot = slot.to(device)
        if x.numel() > 1:
            # diagnostic: ~1 when the generated positives have the data's spread; >> 1 flags an
            # under-trained generator whose sampling chain amplified its noise (up to 1/sqrt(abar_T))
            self.meter.set("gen_std_ratio", float(self.positives.std() / x.std().clamp_min(1e-12)))

    def transform(self, batch: Batch, method, info: StepInfo) -> Batch:
        if self.positives is None or not self._encoder_step(info):
            return batch
        b = batch.x.shape[0]
        slot = self.slot[batch.index]  # (B,) each sample's row of the epoch's positives, -1: not replaced
        replace = slot >= 0
        gen = self.positives[slot.clamp_min(0)] if len(self.positives) else batch.views[1]  # (B, *shape)
        view = torch.where(replace.view(b, *([1] * len(self.shape))), gen, batch.views[1])
        self.meter.add("replaced", replace.float().mean(), weight=b)  # observed rate, ~lambda
        return batch.with_views([batch.views[0], view, *batch.views[2:]], diffaug_replaced=replace)

    def phase_loss(self, batch: Batch, method, info: StepInfo) -> dict[str, torch.Tensor] | None:
        terms: dict[str, torch.Tensor] = {}
        if self.sync or info.phase == "B":  # Alg. 1 line 5: L_df(x_c, SG(z_c) | phi)
            z_c = self.condition(method, batch.x)
            terms["diffusion"] = self.ddpm.loss(self.generator, self._to_gen(batch.x), z_c)
            if not self.sync:
                self._z_c = (batch.x, z_c)  # the encoder is frozen in B: the step's extra updates reuse z_c
                return terms
        if self.d.objective == "base":
            if not self.sync:
                return None  # the base's own loss (and other augmentations' terms)
            terms["contrast"] = method.objective.loss(batch.views[0], batch.views[1], info)[0]
            return terms
        # Each view in turn is the centre view x_c; the others are its background views (eq. 3): the
        # same sample's views are positives (H = 1), every other sample's views negatives. Symmetric.
        emb = [self._embed(method, v, info) for v in batch.views]  # [(B, F), (B, proj_dim)] per view
        if len(emb) == 2:  # the same loss, Q computed once for both centres (it is symmetric)
            (y1, z1), (y2, z2) = emb
            d = self.d
            terms["scl"] = soft_contrastive_loss_two_views(y1, z1, y2, z2, d.nu_y, d.nu_z, d.alpha)
            return terms
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

    def after_step(self, batch: Batch, method, info: StepInfo, update: Update) -> None:
        if not (self.sync or info.phase == "B"):
            return
        self._ema()
        if self.d.gen_steps > 1:  # diffaug.gen_steps: more updates on the same batch, fresh t and noise each
            # the condition is the same for all of them: the encoder is frozen in B, and in sync it stepped
            # once, before them
            cached = self._z_c is not None and self._z_c[0] is batch.x
            z_c = self._z_c[1] if cached else self.condition(method, batch.x)
            x0 = self._to_gen(batch.x)
            for _ in range(self.d.gen_steps - 1):
                update("generator", loss=self.ddpm.loss(self.generator, x0, z_c))
                self._ema()
        self._z_c = None

    def epoch_metrics(self) -> dict[str, float]:
        # generator steps so far; the observed replacement rate (~lambda); std of generated positives /
        # std of the data (~1 when the generator has learnt the data's spread)
        return {"diffaug_generator_steps": float(self.updates), **super().epoch_metrics()}


def _store_ema_once(module: DiffAug, state: dict, prefix: str, local_metadata) -> None:
    """state_dict post-hook: the EMA generator's entries are left out where they equal the generator's
    (before the first generator update; after the last B-phase): a checkpoint holds one copy, not two."""
    if module.ema_is_generator():
        for k in module.ema_generator.state_dict():
            del state[f"{prefix}ema_generator.{k}"]


def _restore_ema(module: DiffAug, state: dict, prefix: str, *args) -> None:
    """load_state_dict pre-hook: an EMA left out by `_store_ema_once` is the generator's copy."""
    module._ema_loaded = False  # the loaded generator may not be its EMA: the next epoch start sets it again
    ema, gen = f"{prefix}ema_generator.", f"{prefix}generator."
    if not any(k.startswith(ema) for k in state):
        for k in [k for k in state if k.startswith(gen)]:
            state[ema + k[len(gen):]] = state[k]
