"""CoCor (Wang et al.): composite augmentations, a consistency loss on latent similarities, and a
monotone network (MMNN) that learns the target similarity of each composite, trained bi-level.

Per step (Algorithm 1): the encoder trains on L_contrast + L_consistent with the MMNN fixed (eq. 3,
``loss_terms``); then the MMNN and a linear classifier train on cross-entropy over a small labelled
subset through the one-step look-ahead theta_e'(theta_d) = theta_e - eta grad L_consistent (eqs. 4-5,
8-11; ``after_step``), either exactly (``cocor.meta: exact``, autograd through the step with
``torch.func.functional_call``) or by finite differences (``finite_difference``: the mixed second
derivative of App. B replaced by a difference of L_consistent at theta_e +- eps u, u = dCE/dtheta_e,
so only the MMNN is back-propagated). The look-ahead starts from the encoder the loop has just
updated: the labelled step of Alg. 1 sees theta_e^(i), and eq. 11's second derivative is taken there.
"""
from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F
from torch import nn

from augtune.config import ConfigError
from augtune.methods.base import Augmentation, Batch, OptimizerSpec, StepInfo
from augtune.methods.cocor_ops import composite_views, pool_ops

# App. F, Table 9: the best constant target per length 1, 2, 3. SimCLR's InfoNCE behaves as MoCo's,
# BYOL's predictor + cosine as SimSiam's (augtune's choice: the paper has no constants for them).
TABLE9 = {"moco": (0.80, 0.75, 0.65), "simsiam": (0.75, 0.70, 0.60)}
_LIKE = {"simclr": "moco", "byol": "simsiam"}
MMNN_LR = 1e-3  # Adam; the meta-gradient is O(eta_e), Adam's normalisation makes its scale irrelevant
FD_EPS = 0.01  # finite-difference step, as a norm in encoder-parameter space (DARTS' 0.01 / |u|)


def constant_target(base: str, length: int) -> float:
    """Table 9's constant for `length`; past 3, 0.05 less per extra op (augtune's extrapolation)."""
    table = TABLE9[_LIKE.get(base, base)]
    if length <= 3:
        return table[length - 1]
    return max(0.05, table[2] - 0.05 * (length - 3))


class MMNN(nn.Module):
    """g(v): composition vector (N, n_ops) -> target similarity (N,) in (0, 1), strictly decreasing
    in every entry (§4.3.2). Monotone layers (You et al., 2017): effective weights softplus(W) > 0
    and a strictly increasing activation (tanh(h) + 0.1 h) make s(v) strictly increasing; g = sigmoid(-s)."""

    def __init__(self, n_ops: int, hidden: int = 16):
        super().__init__()
        dims = [n_ops, hidden, hidden, 1]
        # raw weights around softplus^-1(1 / sqrt(fan_in)): s(v) of order 1, gradients that do not vanish
        self.weights = nn.ParameterList([nn.Parameter(0.3 * torch.randn(o, i) + math.log(math.expm1(1 / math.sqrt(i))))
                                         for i, o in zip(dims, dims[1:])])
        self.biases = nn.ParameterList([nn.Parameter(torch.zeros(o)) for o in dims[1:]])

    def forward(self, v: torch.Tensor) -> torch.Tensor:
        h = v
        for k, (w, b) in enumerate(zip(self.weights, self.biases)):
            h = F.linear(h, F.softplus(w), b)  # non-negative weights: increasing in h
            if k < len(self.weights) - 1:
                h = torch.tanh(h) + 0.1 * h  # strictly increasing, never flat (tanh alone saturates)
        return torch.sigmoid(-h.squeeze(-1))  # (N,) decreasing in v

    @torch.enable_grad()
    def warm_start(self, n_ops: int, targets: dict[int, float], steps: int = 200, seed: int = 0) -> None:
        """Fit g to one constant per length (the official starting weights file is missing)."""
        gen = torch.Generator().manual_seed(seed)
        ls = torch.tensor(sorted(targets)).repeat(64)  # (N,) lengths
        t = torch.tensor([targets[int(l)] for l in ls])  # (N,)

        def draw() -> torch.Tensor:  # (N, n_ops) composition vectors of the lengths ls
            ops = torch.randint(0, n_ops, (len(ls), int(ls.max())), generator=gen)
            active = torch.arange(int(ls.max())).view(1, -1) < ls.view(-1, 1)
            return torch.zeros(len(ls), n_ops).scatter_add_(1, ops, active.float())

        with torch.no_grad():  # start at the mean target, so that the fit shapes g instead of shrinking it
            s = -torch.logit(self(draw()), eps=1e-6)
            self.biases[-1] -= torch.logit(t.mean()) + s.mean()  # now mean s = -logit(mean t)
        opt = torch.optim.Adam(self.parameters(), lr=0.01)
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # a tiny network: one thread is far faster than a contended pool
        try:
            self._fit(draw, t, opt, steps)
        finally:
            torch.set_num_threads(threads)

    def _fit(self, draw, t: torch.Tensor, opt, steps: int) -> None:
        for _ in range(steps):
            loss = F.mse_loss(self(draw()), t)
            opt.zero_grad()
            loss.backward()
            opt.step()


def consistency_loss(sim: torch.Tensor, target: torch.Tensor, kind: str = "softplus") -> torch.Tensor:
    """L_consistent from latent similarities and targets, both (L, B) (one row per length).

    softplus (App. A, eq. 7 as the official code computes it): mean over lengths of
    softplus(mean target - mean sim): a view already closer than its target gets a small gradient.
    abs (eq. 2): mean over views of |sim - target|.
    """
    if kind == "softplus":
        return F.softplus(target.mean(1) - sim.mean(1)).mean()
    return (sim - target).abs().mean()


def labelled_subset(y: torch.Tensor, fraction: float, seed: int) -> torch.Tensor:
    """Indices of a stratified, seeded subset: round(fraction n_c) of each class c (at least one)."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for c in torch.unique(y):
        idx = (y == c).nonzero().squeeze(1)
        k = max(1, round(fraction * len(idx)))
        out.append(idx[torch.randperm(len(idx), generator=gen)[:k]])
    return torch.sort(torch.cat(out)).values


@contextlib.contextmanager
def kept_buffers(*modules: nn.Module):
    """Restore the modules' buffers (BatchNorm statistics) after the meta step's extra forwards."""
    bufs = [b for m in modules if m is not None for b in m.buffers()]
    saved = [b.clone() for b in bufs]
    try:
        yield
    finally:
        with torch.no_grad():
            for b, s in zip(bufs, saved):
                b.copy_(s)


class CoCor(Augmentation):
    name = "cocor"
    figures = ("cocor",)

    def __init__(self, cfg, data):
        super().__init__(cfg, data)
        c = cfg.cocor
        if not c.lengths or any(int(l) < 1 for l in c.lengths):
            raise ConfigError(f"cocor.lengths: {list(c.lengths)} must be a non-empty list of lengths >= 1")
        if data.modality == "vector" and c.pool != "all":
            raise ConfigError(f"cocor.pool: {c.pool!r} is an image pool; vector data has one pool, 'all'")
        self.lengths = tuple(int(l) for l in c.lengths)
        self.modality = data.modality
        self.ops = pool_ops(c.pool, data.modality)
        base = cfg.method.base
        self.register_buffer("constants", torch.tensor([constant_target(base, l) for l in self.lengths]))
        self.mmnn = self.classifier = None
        if c.mmnn:
            self.mmnn = MMNN(len(self.ops))
            self.mmnn.warm_start(len(self.ops), {l: constant_target(base, l) for l in range(1, max(self.lengths) + 1)},
                                 seed=cfg.train.seed)
            from augtune.models import build_backbone

            with torch.device("meta"):  # only its feature size: no weights, no RNG
                out_dim = build_backbone(cfg.model, data.modality, tuple(data.shape)).out_dim
            self.classifier = nn.Linear(out_dim, data.num_classes)
            idx = labelled_subset(data.y_train, c.label_fraction, cfg.train.seed)
            self.x_lab, self.y_lab = data.x_train[idx], data.y_train[idx]  # CPU; a batch moves per step
        self._meta: tuple | None = None
        self._sums: dict[str, torch.Tensor] = {}
        self._steps = self._meta_steps = 0  # encoder steps and MMNN updates this epoch

    # -- the encoder step (eq. 3) -------------------------------------------------------------------

    @staticmethod
    def embed(objective, x: torch.Tensor, info: StepInfo | None = None) -> torch.Tensor:
        """f(A(x)): projector (then predictor where the base has one: SimSiam/BYOL, App. D), normalised."""
        z = objective.project(x, info)  # (N, D)
        pred = getattr(objective, "predictor", None)
        return F.normalize(pred(z) if pred is not None else z, dim=1)

    def latent_similarity(self, objective, x: torch.Tensor, views: torch.Tensor,
                          info: StepInfo | None = None) -> torch.Tensor:
        """l_d = f(x)^T f(A(x)) (Definition 3), (L, B); x is encoded with stop-gradient (App. D)."""
        with torch.no_grad():
            z0 = F.normalize(objective.project(x, info), dim=1)  # (B, D)
        z = self.embed(objective, views, info).view(len(self.lengths), x.shape[0], -1)  # (L, B, D), one pass
        return (z * z0.to(z.dtype)).sum(-1)  # (L, B)

    def targets(self, counts: torch.Tensor, b: int) -> torch.Tensor:
        """Target similarities (L, b) of composites with composition vectors counts (L*b, n_ops)."""
        if self.mmnn is None:
            return self.constants.view(-1, 1).expand(-1, b)
        return self.mmnn(counts.to(self.constants.dtype)).view(len(self.lengths), b)

    def loss_terms(self, batch: Batch, out: dict, method, info: StepInfo) -> dict[str, torch.Tensor]:
        x = batch.x  # the batch is shuffled: its first samples are a random subset
        x = x[:max(1, round(self.cfg.cocor.view_fraction * x.shape[0]))]  # (b, ...)
        b, obj = x.shape[0], method.objective
        with torch.no_grad():
            views, counts = composite_views(x, self.lengths, self.ops, self.modality)  # (L*B, ...), (L*B, n_ops)
            target = self.targets(counts, b).float()  # the MMNN is fixed in the encoder step
        sim = self.latent_similarity(obj, x, views, info).float()  # (L, B)
        loss = consistency_loss(sim, target, self.cfg.cocor.consistency)
        with torch.no_grad():
            for i, l in enumerate(self.lengths):
                self._add(f"sim_l{l}", sim[i].mean())
                self._add(f"target_l{l}", target[i].mean())
            self._steps += 1
        if self.mmnn is not None and self.training:
            m = min(b, self.cfg.cocor.meta_batch)
            shape = (len(self.lengths), b) + tuple(x.shape[1:])
            self._meta = (x[:m].detach(), views.view(shape)[:, :m].reshape(-1, *x.shape[1:]),
                          counts.view(len(self.lengths), b, -1)[:, :m].reshape(-1, counts.shape[1]))
        return {"consistent": loss}

    def _add(self, key: str, value: torch.Tensor) -> None:
        self._sums[key] = self._sums.get(key, 0) + value.detach().float()

    # -- the MMNN + classifier step (eqs. 4-5, App. B) ----------------------------------------------

    def optimizer_specs(self) -> list[OptimizerSpec]:
        if self.mmnn is None:
            return []
        params = list(self.mmnn.parameters()) + list(self.classifier.parameters())
        return [OptimizerSpec("cocor", params, lr=MMNN_LR, kind="adam", weight_decay=0.0, manual=True)]

    def labelled_batch(self, n: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        pick = torch.randperm(len(self.y_lab))[:n]
        return self.x_lab[pick].to(device, non_blocking=True), self.y_lab[pick].to(device, non_blocking=True)

    def meta_gradients(self, objective, meta: tuple, x_l: torch.Tensor, y_l: torch.Tensor, eta: float,
                       mode: str) -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor]:
        """d CE(theta_e'(theta_d)) / d theta_d and the classifier's gradient, and the CE.

        theta_e' = theta_e - eta grad_e L_consistent(theta_e, theta_d) (eq. 9; L_contrast does not
        depend on theta_d, eq. 11); theta_e = the backbone's parameters (CE reads the backbone).
        """
        x0, views, counts = meta
        m = x0.shape[0]
        names, params = zip(*[(n, p) for n, p in objective.encoder.named_parameters() if p.requires_grad])
        d_params, c_params = list(self.mmnn.parameters()), list(self.classifier.parameters())
        kind = self.cfg.cocor.consistency
        if mode == "exact":
            loss = consistency_loss(self.latent_similarity(objective, x0, views).float(), self.targets(counts, m).float(), kind)
            g = torch.autograd.grad(loss, params, create_graph=True, allow_unused=True)
            ahead = {n: p if gi is None else p - eta * gi for n, p, gi in zip(names, params, g)}
            h = torch.func.functional_call(objective.encoder, ahead, (x_l,))  # features at theta_e'(theta_d)
            ce = F.cross_entropy(self.classifier(h).float(), y_l)
            grads = torch.autograd.grad(ce, d_params + c_params, allow_unused=True)
            return list(grads[:len(d_params)]), list(grads[len(d_params):]), ce.detach()
        # finite_difference: -eta d/dtheta_d <grad_e L, u> ~ -eta [d_d L(theta+) - d_d L(theta-)] / (2 eps)
        ce = F.cross_entropy(self.classifier(objective.encoder(x_l)).float(), y_l)
        grads = torch.autograd.grad(ce, list(params) + c_params, allow_unused=True)
        u = [torch.zeros_like(p) if gi is None else gi for p, gi in zip(params, grads[:len(params)])]
        eps = FD_EPS / (torch.sqrt(sum((gi.float() ** 2).sum() for gi in u)) + 1e-12)
        sims = []
        with torch.no_grad():
            for step in (eps, -2 * eps):
                torch._foreach_add_(list(params), [gi * step for gi in u])  # theta +- eps u
                sims.append(self.latent_similarity(objective, x0, views).float())
            torch._foreach_add_(list(params), [gi * eps for gi in u])  # back to theta
        t = self.targets(counts, m).float()
        surrogate = -eta / (2 * eps) * (consistency_loss(sims[0], t, kind) - consistency_loss(sims[1], t, kind))
        g_d = torch.autograd.grad(surrogate, d_params, allow_unused=True)
        return list(g_d), list(grads[len(params):]), ce.detach()

    def after_step(self, batch: Batch, method, info: StepInfo, optimizers: dict) -> None:
        if self.mmnn is None or self._meta is None or not self.training:
            return
        meta, self._meta = self._meta, None
        c = self.cfg.cocor
        if info.step % c.meta_every:
            return
        obj, opt = method.objective, optimizers["cocor"]
        eta = optimizers["encoder"].param_groups[0]["lr"]
        x_l, y_l = self.labelled_batch(batch.x.shape[0], batch.x.device)
        bf16 = batch.x.device.type == "cuda" and self.cfg.train.precision in ("auto", "bf16")
        with kept_buffers(obj.encoder, obj.projector, getattr(obj, "predictor", None)), \
                torch.autocast(batch.x.device.type, dtype=torch.bfloat16, enabled=bf16):
            g_d, g_c, ce = self.meta_gradients(obj, meta, x_l, y_l, eta, c.meta)
        for p, g in zip(list(self.mmnn.parameters()) + list(self.classifier.parameters()), g_d + g_c):
            p.grad = None if g is None else g.to(p.dtype)
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            from augtune.trainables.loop import allreduce_gradients

            allreduce_gradients([p for g in opt.param_groups for p in g["params"]],
                                torch.distributed.get_world_size())
        opt.step()
        opt.zero_grad(set_to_none=True)
        self._add("ce", ce)
        self._meta_steps += 1

    # -- diagnostics ----------------------------------------------------------------------------------

    def on_epoch_start(self, method, info: StepInfo) -> None:
        self._sums, self._steps, self._meta_steps, self._meta = {}, 0, 0, None

    def epoch_metrics(self) -> dict[str, float]:
        """Mean latent similarity and target per length (Figure 4a), the labelled CE (MMNN runs)."""
        if not self._steps:
            return {}
        return {f"cocor_{k}": v.item() / (max(1, self._meta_steps) if k == "ce" else self._steps)
                for k, v in self._sums.items()}
