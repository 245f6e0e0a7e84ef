"""CoCor (Wang et al.): composite augmentations, a consistency loss on latent similarities, and a
monotone network (MMNN) that learns the target similarity of each composite, trained bi-level.

Per step (Algorithm 1): the encoder trains on L_contrast + L_consistent with the MMNN fixed (eq. 3,
``loss_terms``); then the MMNN and a linear classifier train on cross-entropy over a small labelled
subset through the one-step look-ahead theta_e'(theta_d) = theta_e - eta grad L_consistent (eqs. 4-5,
8-11; ``after_step``), either exactly (``cocor.meta: exact``, autograd through the step, the encoder
called at theta_e' through the objective's ``encode_with``) or by forward mode (``forward_mode``:
App. B's central difference of L_consistent at theta_e +- eps u, u = dCE/dtheta_e at theta_e' as in
DARTS, taken in its limit eps -> 0 by forward-mode differentiation, so only the MMNN is
back-propagated). Both give the exact hypergradient; both run in IEEE float32 (or
float64), whatever precision the encoder's step runs in (``ieee_fp32``). The look-ahead starts
from the encoder the loop has just updated: the labelled step of Alg. 1 sees theta_e^(i), and
eq. 11's second derivative is taken there.
"""
from __future__ import annotations

import contextlib
import math
import warnings

import torch
import torch.autograd.forward_ad as fwAD
import torch.nn.functional as F
from torch import nn

from augtune.config import ConfigError
from augtune.data.batches import as_float
from augtune.methods.base import Augmentation, Batch, OptimizerSpec, Outputs, StepInfo, Update
from augtune.methods.cocor_ops import composite_views, pool_ops

# App. F, Table 9: the best constant target per length 1, 2, 3. SimCLR's InfoNCE behaves as MoCo's,
# BYOL's predictor + cosine as SimSiam's (augtune's choice: the paper has no constants for them).
TABLE9 = {"moco": (0.80, 0.75, 0.65), "simsiam": (0.75, 0.70, 0.60)}
_LIKE = {"simclr": "moco", "byol": "simsiam"}
MMNN_LR = 1e-3  # Adam
# Adam's step m / (sqrt(v) + eps) is free of the gradient's scale only while eps << sqrt(v). The
# hypergradient is O(eta_e) small: about 1e-8 an element, torch's default eps, which damped the MMNN's
# steps to about half (median sqrt(v) / (sqrt(v) + eps) = 0.46) and made them depend on its scale. Far
# below any gradient float32 holds in v (g^2 >= ~1e-38), this eps leaves Adam's step scale-free.
MMNN_EPS = 1e-30


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
        self.weights = nn.ParameterList(
            [
                nn.Parameter(0.3 * torch.randn(o, i) + math.log(math.expm1(1 / math.sqrt(i))))
                for i, o in zip(dims, dims[1:])
            ]
        )
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
            counts = torch.zeros(len(ls), n_ops)
            return counts.scatter_add_(1, ops, active.to(counts.dtype))

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
def ieee_fp32(device: torch.device):
    """Autocast off and, on CUDA, float32 matmuls and convolutions in IEEE float32, not TF32
    (cuDNN's default for convolutions): how CoCor's meta step and NRCC's SGHMC gradient compute.

    CoCor's hypergradient rests on <grad_e sim_l, u> (u = dCE/dtheta_e, sim_l the mean similarity
    of length l), inner products over all encoder weights that measured 3e-5 to 5e-3 of
    |grad_e sim_l| |u| (digits, after 3 epochs), so u needs far more relative precision than that.
    bf16's 2^-8 is not enough: in 60 draws of small MoCo/SimSiam models trained 3 epochs the cosine
    with the float64 exact hypergradient fell to -0.86 (`exact`) and -0.79 (`forward_mode`)
    under bf16 autocast, and to -0.55 (both) with TF32 emulated on the CPU (operands rounded to 10
    bits). In IEEE float32: >= 0.99999 in every draw. The cost: the meta step without autocast or
    TF32; the encoder's own step keeps its precision."""
    with torch.autocast(device.type, enabled=False):
        if device.type != "cuda":
            yield
            return
        flags = (torch.backends.cuda.matmul, torch.backends.cudnn.conv)
        saved = [f.fp32_precision for f in flags]
        try:
            for f in flags:
                f.fp32_precision = "ieee"
            yield
        finally:
            for f, v in zip(flags, saved):
                f.fp32_precision = v


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
    """CoCor: composite-augmentation views held to MMNN target similarities, the MMNN learned bi-level."""

    name = "cocor"
    figures = ("cocor",)
    # read in every step; lengths, pool and mmnn shape its networks and buffers at set-up
    knobs = ("cocor.consistency", "cocor.meta_batch", "cocor.meta_every", "cocor.view_fraction")

    @classmethod
    def check_modality(cls, cfg, modality: str) -> None:
        """The colour and affine pools are image ops: vector data has one pool, `all` (the planner
        calls this on every sampled config, so a search never hands a trial an image pool)."""
        if modality == "vector" and cfg.cocor.pool != "all":
            raise ConfigError(f"cocor.pool: {cfg.cocor.pool!r} is an image pool; vector data has one pool, "
                              "'all'")

    def __init__(self, cfg, data):
        super().__init__(cfg, data)
        c = cfg.cocor
        if not c.lengths or any(int(l) < 1 for l in c.lengths):
            raise ConfigError(f"cocor.lengths: {list(c.lengths)} must be a non-empty list of lengths >= 1")
        self.check_modality(cfg, data.modality)
        self.lengths = tuple(int(l) for l in c.lengths)
        self.modality = data.modality
        self.ops = pool_ops(c.pool, data.modality)
        base = cfg.method.base
        self.register_buffer("constants", torch.tensor([constant_target(base, l) for l in self.lengths]))
        self.mmnn = self.classifier = None
        if c.mmnn:
            self.mmnn = MMNN(len(self.ops))
            self.mmnn.warm_start(
                len(self.ops),
                {l: constant_target(base, l) for l in range(1, max(self.lengths) + 1)},
                seed=cfg.train.seed,
            )
            from augtune.models import build_backbone

            with torch.device("meta"):  # only its feature size: no weights, no RNG
                out_dim = build_backbone(cfg.model, data.modality, tuple(data.shape)).out_dim
            self.classifier = nn.Linear(out_dim, data.num_classes)
            idx = labelled_subset(data.y_train, c.label_fraction, cfg.train.seed)
            self.x_lab, self.y_lab = data.x_train[idx], data.y_train[idx]  # CPU; a batch moves per step
        self._meta: tuple | None = None  # this step's composites for the MMNN update in after_step

    # -- the encoder step (eq. 3) -------------------------------------------------------------------

    @staticmethod
    def embed(objective, x: torch.Tensor, info: StepInfo | None = None,
              params: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
        """f(A(x)): projector (then predictor where the base has one: SimSiam/BYOL, App. D), normalised;
        at the backbone weights `params` instead of its own where given (the look-ahead's points)."""
        h = objective.encode(x) if params is None else objective.encode_with(params, x)
        return F.normalize(objective.predict(objective.head(h, info)), dim=1)  # (N, D)

    @staticmethod
    @torch.no_grad()
    def anchor(objective, x: torch.Tensor, info: StepInfo | None = None) -> torch.Tensor:
        """f(x) of the clean samples, normalised, under stop-gradient (App. D): (B, D)."""
        return F.normalize(objective.embed(x, info), dim=1)

    def latent_similarity(self, objective, x: torch.Tensor, views: torch.Tensor,
                          info: StepInfo | None = None, z0: torch.Tensor | None = None,
                          params: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
        """l_d = f(x)^T f(A(x)) (Definition 3), (L, B); x is encoded with stop-gradient (App. D), or
        `z0` is that anchor already (`forward_mode` holds it fixed at theta while the views are
        encoded at the backbone weights `params`)."""
        if z0 is None:
            z0 = self.anchor(objective, x, info)  # (B, D)
        z = self.embed(objective, views, info, params).view(len(self.lengths), x.shape[0], -1)  # (L, B, D)
        return (z * z0.to(z.dtype)).sum(-1)  # (L, B)

    def targets(self, counts: torch.Tensor, b: int) -> torch.Tensor:
        """Target similarities (L, b) of composites with composition vectors counts (L*b, n_ops)."""
        if self.mmnn is None:
            return self.constants.view(-1, 1).expand(-1, b)
        return self.mmnn(counts.to(self.constants.dtype)).view(len(self.lengths), b)

    def loss_terms(self, batch: Batch, out: Outputs, method, info: StepInfo) -> dict[str, torch.Tensor]:
        x = batch.x  # the batch is shuffled: its first samples are a random subset
        x = x[:max(1, round(self.cfg.cocor.view_fraction * x.shape[0]))]  # (b, ...)
        b, obj = x.shape[0], method.objective
        with torch.no_grad():
            # (L*B, ...), (L*B, n_ops)
            views, counts = composite_views(x, self.lengths, self.ops, self.modality)
            target = self.targets(counts, b).float()  # the MMNN is fixed in the encoder step
        sim = self.latent_similarity(obj, x, views, info).float()  # (L, B)
        loss = consistency_loss(sim, target, self.cfg.cocor.consistency)
        with torch.no_grad():  # Figure 4a: mean latent similarity and target per length
            for i, l in enumerate(self.lengths):
                self.meter.add(f"sim_l{l}", sim[i].mean())
                self.meter.add(f"target_l{l}", target[i].mean())
        if self.mmnn is not None and self.training:
            m = min(b, self.cfg.cocor.meta_batch)
            shape = (len(self.lengths), b) + tuple(x.shape[1:])
            self._meta = (x[:m].detach(), views.view(shape)[:, :m].reshape(-1, *x.shape[1:]),
                          counts.view(len(self.lengths), b, -1)[:, :m].reshape(-1, counts.shape[1]))
        return {"consistent": loss}

    # -- the MMNN + classifier step (eqs. 4-5, App. B) ----------------------------------------------

    def optimizer_specs(self) -> list[OptimizerSpec]:
        if self.mmnn is None:
            return []
        params = list(self.mmnn.parameters()) + list(self.classifier.parameters())
        return [OptimizerSpec("cocor", params, lr=MMNN_LR, kind="adam", weight_decay=0.0, manual=True,
                              eps=MMNN_EPS)]

    def labelled_batch(self, n: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        pick = torch.randperm(len(self.y_lab))[:n]
        x = as_float(self.x_lab[pick].to(device, non_blocking=True))  # uint8 images: float on the device
        return x, self.y_lab[pick].to(device, non_blocking=True)

    def meta_gradients(self, objective, meta: tuple, x_l: torch.Tensor, y_l: torch.Tensor, eta: float,
                       mode: str) -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor]:
        """d CE(theta_e'(theta_d)) / d theta_d and the classifier's gradient, and the CE, all at theta_e'.

        theta_e' = theta_e - eta grad_e L_consistent(theta_e, theta_d) (eq. 9; L_contrast does not
        depend on theta_d, eq. 11); theta_e = the backbone's parameters (CE reads the backbone), reached
        only through the objective's `encoder_parameters` / `encode_with`: nothing is modified in place.
        In IEEE float32 (float64 for a float64 model) under any autocast (`ieee_fp32`).
        """
        with ieee_fp32(meta[0].device):
            return self._meta_gradients(objective, meta, x_l, y_l, eta, mode == "exact")

    def _meta_gradients(self, objective, meta: tuple, x_l: torch.Tensor, y_l: torch.Tensor,
                        eta: float, exact: bool
                        ) -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor]:
        x0, views, counts = meta
        m, kind = x0.shape[0], self.cfg.cocor.consistency
        theta = objective.encoder_parameters()
        names, params = list(theta), list(theta.values())
        d_params, c_params = list(self.mmnn.parameters()), list(self.classifier.parameters())
        z0 = self.anchor(objective, x0)  # f(x) under stop-gradient (App. D): held at theta by both modes
        t = self.targets(counts, m)  # (L, m), a function of theta_d
        sim = self.latent_similarity(objective, x0, views, z0=z0)  # (L, m)
        g = torch.autograd.grad(consistency_loss(sim, t if exact else t.detach(), kind), params,
                                create_graph=exact, allow_unused=True)  # grad_e L_consistent at theta_e
        with torch.set_grad_enabled(exact):  # exact: the graph runs through the step to theta_d
            ahead = {n: p if gi is None else p - eta * gi for n, p, gi in zip(names, params, g)}
        if not exact:  # u = dCE/dtheta_e at theta' (as DARTS): a leaf, so only CE's own gradient is taken
            ahead = {n: a.detach().requires_grad_(True) for n, a in ahead.items()}
        ce = F.cross_entropy(self.classifier(objective.encode_with(ahead, x_l)), y_l)
        if exact:
            grads = torch.autograd.grad(ce, d_params + c_params, allow_unused=True)
            return list(grads[:len(d_params)]), list(grads[len(d_params):]), ce.detach()
        grads = torch.autograd.grad(ce, list(ahead.values()) + c_params, allow_unused=True)
        u = [torch.zeros_like(p) if gi is None else gi for p, gi in zip(params, grads[:len(params)])]
        return self._forward_mode(objective, meta, z0, t, u, eta), list(grads[len(params):]), ce.detach()

    def _forward_mode(self, objective, meta: tuple, z0: torch.Tensor, t: torch.Tensor,
                      u: list[torch.Tensor], eta: float) -> list[torch.Tensor]:
        """-eta d/dtheta_d <grad_e L_consistent(theta_e, theta_d), u>: App. B's central difference
        -eta [d_d L(theta+) - d_d L(theta-)] / (2 eps), theta+- = theta_e +- eps u, in its limit
        eps -> 0 (the exact hypergradient -eta (d^2 L / d theta_d d theta_e)^T dCE(theta')).

        The limit is taken by forward-mode differentiation: one pass of the encoder with tangent
        u gives sim and J u = d sim / d theta_e . u, both (L, m); then
        <grad_e L, u> = <dL/dsim (sim, t), J u>, and only the MMNN (through t) is back-propagated
        through that. Like the difference it keeps no second-order graph of the encoder (`exact`
        does), but it subtracts nothing: J u carries a rounding relative to itself. The difference
        (eps = 1e-4 / |u|, the largest step that crossed no ReLU/max-pool kink in float64)
        subtracted two float32 passes whose difference could be below their rounding: after 3
        epochs on digits its cosine with the float64 exact hypergradient fell to -0.89 (MoCo, MLP),
        its length to x0.09..x3.5. On the CPU this costs 1.1-1.3x the difference's two passes,
        less than `exact`.

        u is dCE/dtheta_e at theta', as in the exact hypergradient; u at theta_e instead was off
        where one step flips ReLU/max-pool choices (CNN on digits, 60 draws: cosine with the exact
        hypergradient down to 0.07). The anchor f(x) is under stop-gradient in L_consistent, so it
        stays z0 (at theta_e): differentiating through it differentiates another function (wrong
        sign in about a third of the draws).
        """
        x0, views, _ = meta
        theta = objective.encoder_parameters()
        kind, d_params = self.cfg.cocor.consistency, list(self.mmnn.parameters())
        with torch.no_grad(), fwAD.dual_level():  # no_grad: forward mode needs no graph
            with warnings.catch_warnings():  # torch's first make_dual scripts its own decompositions with
                # torch.jit.script, which warns that it is deprecated: torch's use, not ours, on the console
                # of every run (before --plan's first line, with a time budget)
                warnings.filterwarnings("ignore", message="`torch.jit.script` is deprecated",
                                        category=FutureWarning)
                duals = {n: fwAD.make_dual(p.detach(), ui.to(p.dtype))
                         for (n, p), ui in zip(theta.items(), u)}
            sim, ju = fwAD.unpack_dual(
                self.latent_similarity(objective, x0, views, z0=z0, params=duals))
        sim = sim.detach().requires_grad_(True)  # (L, m) at theta_e
        ju = torch.zeros_like(sim) if ju is None else ju.detach()  # (L, m) d sim / d theta_e . u
        (dl_dsim,) = torch.autograd.grad(consistency_loss(sim, t, kind), sim, create_graph=True)
        surrogate = -eta * (dl_dsim * ju).sum()  # its gradient in theta_d is the estimate
        return list(torch.autograd.grad(surrogate, d_params, allow_unused=True))

    def after_step(self, batch: Batch, method, info: StepInfo, update: Update) -> None:
        if self.mmnn is None or self._meta is None or not self.training:
            return
        meta, self._meta = self._meta, None
        c = self.cfg.cocor
        if info.step % c.meta_every:
            return
        obj = method.objective
        x_l, y_l = self.labelled_batch(batch.x.shape[0], batch.x.device)
        # meta_gradients runs in IEEE float32 whatever info.autocast says (ieee_fp32)
        with kept_buffers(*obj.online_networks()):  # eta: the encoder's lr
            g_d, g_c, ce = self.meta_gradients(obj, meta, x_l, y_l, info.lr, c.meta)
        update("cocor", grads=g_d + g_c)
        self.meter.add("ce", ce)  # the labelled cross-entropy, mean over this epoch's MMNN updates

    def on_epoch_start(self, method, info: StepInfo) -> None:
        self._meta = None
