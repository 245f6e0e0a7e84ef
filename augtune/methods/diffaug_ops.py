"""DiffAug's mathematics as pure functions and small modules (Zang et al., 2024).

- the Student-t kernel with its normalising constant (App. B eq. 9) and the soft contrastive loss
  (eq. 2, App. B eqs. 14-15);
- a DDPM (Ho et al., 2020) with a linear beta schedule: the noise-prediction loss (eq. 6) and ancestral
  sampling (eq. 7), over all T steps or, for generation during training, over a respaced chain of
  evenly strided steps (Nichol & Dhariwal 2021). The strided sampler is an ancestral DDPM on the
  respaced chain, not DDIM. Eq. 7 leaves sigma_t open; it is the respaced beta ("fixed large", the
  default) or the respaced posterior variance beta_tilde ("fixed small"; with it the update is exactly
  DDIM with eta = 1, Song et al. 2021), Ho et al.'s two choices (Sec. 3.2);
- the two denoisers g_phi(x_t, t, z_c): the residual MLP of App. E (vectors) and a small U-Net with
  self-attention (App. D, Listing 1) for images.

No config objects here: the augmentation in `diffaug.py` reads the config and calls these.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

# ---------------------------------------------------------------------------------------------
# Kernel and soft contrastive loss

_EPS = 1e-6  # Q and P are kept in [eps, 1 - eps] so that log Q and log(1 - Q) stay finite
_MAX_SQ = 1e30  # squared distances are capped below float32's overflow (inf - inf -> NaN otherwise)


def log_t_norm(nu: float) -> float:
    """log of eq. 9's constant Gamma((nu+1)/2) / (sqrt(nu pi) Gamma(nu/2)): kappa at distance 0."""
    return math.lgamma((nu + 1) / 2) - 0.5 * math.log(nu * math.pi) - math.lgamma(nu / 2)


class _Log1pViaDouble(torch.autograd.Function):
    """log1p of a float32 tensor evaluated in float64 and rounded back; the gradient is torch.log1p's
    own, grad / (x + 1), in float32.

    On the CPU, torch's float32 log1p runs ~6x slower than its float64 one (0.62 ms against 0.095 ms,
    round trip included, for 256 x 256 values on one core, torch 2.14): six of them were half of an
    A-step's soft contrastive loss. The value is the float32 rounding of the float64 log1p, i.e.
    correctly rounded but for double rounding; torch's float32 one is within 0.56 ulp, and the two
    agree bitwise on 99.5-100 % of the loss's inputs, elsewhere by one ulp.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return x.double().log1p_().to(x.dtype)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return grad / (x + 1)  # torch.log1p's backward (log1p_backward), bit for bit


def log1p(x: torch.Tensor) -> torch.Tensor:
    """torch.log1p, through float64 for float32 tensors on the CPU (`_Log1pViaDouble`: the speed)."""
    if x.dtype == torch.float32 and x.device.type == "cpu":
        return _Log1pViaDouble.apply(x)
    return torch.log1p(x)


def log_t_kernel(sq_dist: torch.Tensor, nu: float) -> torch.Tensor:
    """log kappa_nu for squared distances d^2 (eq. 9): log C(nu) - (nu+1)/2 log(1 + d^2/nu).

    Computed in log space so that a tiny nu (DiffAug's nu_z = 0.01) or a huge distance never
    underflows to log 0.
    """
    sq = sq_dist.clamp(0, _MAX_SQ)
    return log_t_norm(nu) - (nu + 1) / 2 * log1p(sq / nu)


class _SqDists(torch.autograd.Function):
    """||a_i - b_j||^2 for all pairs, (N, D), (M, D) -> (N, M), as torch.cdist(a, b).pow(2) computes it
    above 25 rows (one matmul of [-2a, |a|^2, 1] by [b, 1, |b|^2], clamped at 0), without the square root
    and its square; b None: a against itself, whose diagonal is then exactly 0 (the matmul leaves a
    rounding residue of |a_i|^2 there).

    The backward is cdist's with the square folded in (a pair at distance 0 passes no gradient):
    2 (a G1 - G b) for a, 2 (b G1' - G'a) for b. Against a itself one matmul by G + G' replaces cdist's
    two (a 256 x 256 x 300 matmul less per centre and step on the example's y). Runs in float32 under
    autocast as cdist does.
    """

    @staticmethod
    def forward(ctx, a: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        with torch.autocast(a.device.type, enabled=False):
            na = a.pow(2).sum(-1, keepdim=True)
            nb = na if b is None else b.pow(2).sum(-1, keepdim=True)
            rhs = torch.cat([a if b is None else b, torch.ones_like(nb), nb], -1)
            sq = torch.cat([a.mul(-2), na, torch.ones_like(na)], -1).matmul(rhs.mT).clamp_min_(0)
            if b is None:
                sq.diagonal(dim1=-2, dim2=-1).zero_()
        ctx.save_for_backward(a, b, sq)
        return sq

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        a, b, sq = ctx.saved_tensors
        with torch.autocast(grad.device.type, enabled=False):
            g = grad.masked_fill(sq == 0, 0)
            if b is None:
                g = g + g.mT
                return 2 * (a * g.sum(-1, keepdim=True) - g.matmul(a)), None
            ga = 2 * (a * g.sum(-1, keepdim=True) - g.matmul(b)) if ctx.needs_input_grad[0] else None
            gb = 2 * (b * g.sum(-2).unsqueeze(-1) - g.mT.matmul(a)) if ctx.needs_input_grad[1] else None
            return ga, gb


def sq_dists(a: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """Squared Euclidean distances in float32, (N, D), (M, D) -> (N, M); b None: a against itself.
    torch.cdist(a, b).pow(2) up to the rounding of its square root (`_SqDists`); with at most 25 rows
    on both sides that very expression (cdist then takes exact differences, not the matmul)."""
    a, b = a.float(), None if b is None else b.float()
    if a.shape[-2] <= 25 and (b is None or b.shape[-2] <= 25):
        return torch.cdist(a, a if b is None else b).pow(2)
    return _SqDists.apply(a, b)


def t_kernel(a: torch.Tensor, b: torch.Tensor, nu: float) -> torch.Tensor:
    """kappa_nu(a_i, b_j) for all pairs: (N, D), (M, D) -> (N, M), the Student-t density (eq. 9)."""
    return log_t_kernel(torch.cdist(a.float(), b.float()).pow(2), nu).exp()


def soft_contrastive_loss(
    y: torch.Tensor,
    z: torch.Tensor,
    z_bg: torch.Tensor,
    same: torch.Tensor,
    nu_y: float,
    nu_z: float,
    alpha: float,
) -> torch.Tensor:
    """L_scl of eq. 2 / eq. 14 for B centres against their background sets, mean over centres.

    y: (B, Dy) and z: (B, Dz), the centres' high- and low-dimensional embeddings (Enc(x_c) = (y_c, z_c));
    z_bg: (M, Dz) the background views' z; same: (B, M) bool, H_cj = 1 when background view j is an
    augmentation (or generated positive) of centre c (eq. 3), else it is another sample's view.

    Q_cj = kappa_{nu_z}(z_c, z_j) (eq. 15). P_cj = R_cj kappa_{nu_y}(y_c, y_s(j)), R_cj = e^alpha where
    H_cj = 1 else 1, with y_s(j) the y of the centre view of j's sample: the y-similarity of a
    background view is that of the sample it stands for, so a positive has d^y = 0 and P = e^alpha
    kappa(0), and a negative the similarity of the two samples (as the official code builds P from
    one view's y). M must be a multiple of B, views stacked sample-major per view ([s_0..s_B-1, ...]).

    Both P and Q carry gradients, as eq. 2 is written: dL/dP = log((1 - Q) / Q) > 0 pushes the
    samples' y apart (a uniformity force on the backbone) while Q pulls positives together in z.
    With P held as a target (no gradient) the objective feeds on itself: y drawn closer raise the
    negatives' P, which pull them closer still; measured on Fashion-MNIST images, the loss then rose
    20 -> 110 over 8 epochs and k-NN fell 0.63 -> 0.49, against 12 -> 6.2 and 0.70 with the gradient.
    Clamps: P to [0, 1] (e^alpha kappa(0) > 1 for alpha > 0.92 at nu_y = 100: a probability cannot;
    alpha = 1 gives positives P = 1, and no gradient); log Q to [log eps, log(1 - eps)] (a far pair's
    Q underflows to 0).
    """
    return _scl(y, *_log_q(z, z_bg, nu_z), same, nu_y, alpha)


def soft_contrastive_loss_two_views(
    y1: torch.Tensor, z1: torch.Tensor, y2: torch.Tensor, z2: torch.Tensor, nu_y: float, nu_z: float,
    alpha: float,
) -> torch.Tensor:
    """The symmetric loss of two views, each in turn the centre against the other's views: (L(y1, z1 |
    z2) + L(y2, z2 | z1)) / 2 of `soft_contrastive_loss` with H = identity, and the same values. Q
    of the second centre is the first one's transposed (kappa is symmetric), so Q and log(1 - Q) are
    computed once, with their gradients."""
    log_q, log_1mq = _log_q(z1, z2, nu_z)  # (B, B): centre i of view 1 against view 2's j
    same = torch.eye(y1.shape[0], dtype=torch.bool, device=y1.device)
    first = _scl(y1, log_q, log_1mq, same, nu_y, alpha)
    return (first + _scl(y2, log_q.mT, log_1mq.mT, same, nu_y, alpha)) / 2


def _log_q(z: torch.Tensor, z_bg: torch.Tensor, nu_z: float) -> tuple[torch.Tensor, torch.Tensor]:
    """log Q and log(1 - Q) of `soft_contrastive_loss`, (B, M) each; log Q clamped to [log eps,
    log(1 - eps)]."""
    log_q = log_t_kernel(sq_dists(z, z_bg), nu_z).clamp(math.log(_EPS), math.log1p(-_EPS))
    return log_q, log1p(-log_q.exp())


def _scl(y: torch.Tensor, log_q: torch.Tensor, log_1mq: torch.Tensor, same: torch.Tensor, nu_y: float,
         alpha: float) -> torch.Tensor:
    """`soft_contrastive_loss` from the centres' y (B, Dy), log Q and log(1 - Q) (B, M) and H (B, M)."""
    b, m = log_q.shape
    k_y = log_t_kernel(sq_dists(y), nu_y).exp()  # (B, B) between samples
    k_y = k_y if m == b else k_y.repeat(1, m // b)  # (B, M)
    p = (k_y * torch.where(same, math.exp(alpha), 1.0)).clamp(0, 1)
    return -(p * log_q + (1 - p) * log_1mq).sum(dim=1).mean()


# ---------------------------------------------------------------------------------------------
# DDPM

SAMPLE_VARIANCES = ("beta", "posterior")  # DDPM.sample's sigma_t^2: the respaced beta, or the posterior's


def _check_variance(sample_variance: str) -> None:
    if sample_variance not in SAMPLE_VARIANCES:
        raise ValueError(f"sample_variance: {sample_variance!r} is not one of {', '.join(SAMPLE_VARIANCES)}")


class DDPM(nn.Module):
    """The linear beta schedule and the three operations a DDPM needs, for any denoiser.

    Betas run linearly from 1e-4 to 0.02 at T = 1000 (DDPM) and are scaled by 1000/T for other T
    (Nichol & Dhariwal 2021), so that a short chain (T = 100 in tests) still ends near pure noise.
    """

    def __init__(self, steps: int):
        super().__init__()
        scale = 1000 / steps
        betas = torch.linspace(1e-4 * scale, min(0.02 * scale, 0.999), steps, dtype=torch.float64)
        alphas_bar = torch.cumprod(1 - betas, 0)
        self.steps = steps
        for name, v in {"betas": betas, "alphas_bar": alphas_bar}.items():
            self.register_buffer(name, v.float(), persistent=False)

    def loss(self, net: nn.Module, x0: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        """Eq. 6: || delta - g(sqrt(abar_t) x0 + sqrt(1 - abar_t) delta, t, z_c) ||^2, mean over elements.

        x0: (B, *shape) in the generator's space; cond: (B, Dz) condition under stop-gradient.
        """
        b = x0.shape[0]
        t = torch.randint(0, self.steps, (b,), device=x0.device)  # (B,) 0-based: t = 1..T in the paper
        noise = torch.randn_like(x0)
        ab = self.alphas_bar[t].view(b, *([1] * (x0.dim() - 1)))
        xt = ab.sqrt() * x0 + (1 - ab).sqrt() * noise
        return F.mse_loss(net(xt, t, cond.detach()).to(noise.dtype), noise)  # autocast's bf16 up

    def timesteps(self, sample_steps: int | None = None) -> list[int]:
        """The 0-based steps the sampler visits, descending: all T, or `sample_steps` evenly strided."""
        if sample_steps is None or sample_steps >= self.steps:
            return list(range(self.steps - 1, -1, -1))
        return torch.linspace(self.steps - 1, 0, sample_steps).round().long().unique_consecutive().tolist()

    def variance(self, t: int, t_prev: int | None, sample_variance: str = "beta") -> torch.Tensor:
        """sigma^2 of the step t -> t_prev (t_prev None: the last step, to x0) of the chain.

        "beta": beta = 1 - abar_t / abar_prev, the respaced chain's beta (diffusers' "fixed_large").
        "posterior": beta_tilde = (1 - abar_prev) / (1 - abar_t) beta, the variance of q(x_prev | x_t, x0)
        (Ho et al. eq. 7; diffusers' "fixed_small"), 0 on the step to x0. Ho et al. (Sec. 3.2) found
        both equally good over all T = 1000 steps; on a short respaced chain they differ (`sample`).
        """
        _check_variance(sample_variance)
        ab = self.alphas_bar[t]
        ab_prev = self.alphas_bar[t_prev] if t_prev is not None else torch.ones_like(ab)
        beta = 1 - ab / ab_prev
        return beta if sample_variance == "beta" else beta * (1 - ab_prev) / (1 - ab)

    @torch.no_grad()
    def sample(
        self,
        net: nn.Module,
        cond: torch.Tensor,
        shape: tuple[int, ...],
        sample_steps: int | None = None,
        clip: tuple[torch.Tensor, torch.Tensor] | None = None,
        sample_variance: str = "beta",
    ) -> torch.Tensor:
        """Gen(delta, z_c): (B, Dz) conditions -> (B, *shape) samples.

        sample_steps None or >= T: ancestral sampling over all T steps (eq. 7). Otherwise the same
        ancestral update on `sample_steps` evenly strided steps, with the betas of the strided chain,
        1 - abar_t / abar_prev (respacing, Nichol & Dhariwal 2021): T/sample_steps times fewer denoiser
        calls. This is a DDPM on the respaced chain, not DDIM.

        sample_variance: sigma_t^2 of each step (see `variance`). "beta" (fixed large, the default) adds
        more noise than the posterior's "posterior" (fixed small); with few steps the difference is
        large. With the exact noise predictor of N(mu, 0.3^2) data the samples' std is 0.31 over all
        T = 100 steps, 0.35 over 25 and 0.44 over 10 with "beta", 0.27, 0.23 and 0.16 with "posterior"
        (which is DDIM with eta = 1); on N(mu, 1) data "beta" gives exactly 1 at any step count and
        "posterior" 0.96, 0.86 and 0.72. (eta = 0, deterministic DDIM, threw ~2% far outliers on a
        briefly trained generator.)

        clip (lo, hi), broadcastable to a sample: the predicted clean sample x0 is clamped to it before
        the step (DDPM's clip_denoised), so that the predictor's error at large t, which the chain
        amplifies by up to 1/sqrt(abar_T) ~ 150, cannot carry samples out of the data's range.
        """
        _check_variance(sample_variance)
        with torch.inference_mode():  # no autograd bookkeeping at all (a few % of the chain on a CPU core)
            x = self._chain_sample(net, cond, shape, sample_steps, clip, sample_variance)
        return x.clone()  # an ordinary tensor again: the caller may modify it in place

    def _chain_sample(self, net, cond, shape, sample_steps, clip, sample_variance) -> torch.Tensor:
        """`sample`'s chain."""
        b, dtype = cond.shape[0], self.alphas_bar.dtype  # the chain runs in the schedule's dtype
        x = _normal((b, *shape), cond.device, dtype)  # delta ~ N(0, 1)
        ts = self.timesteps(sample_steps)
        c = self._chain(ts, sample_variance)  # the per-step coefficients: (len(ts),) each
        embed = getattr(net, "embed_condition", None)  # the condition's embedding, the same at every step
        if embed is not None:
            cond = embed(cond, dtype)
        for i, t in enumerate(ts):
            tt = torch.full((b,), t, device=cond.device, dtype=torch.long)
            eps = (net(x, tt, cond, embedded=True) if embed is not None else net(x, tt, cond)).to(dtype)
            if clip is None:
                mean = (x - c["eps"][i] * eps) / c["sqrt_alpha"][i]  # eq. 7's mean
            else:
                x0 = (x - c["sqrt_1mab"][i] * eps) / c["sqrt_ab"][i]
                x0 = torch.minimum(torch.maximum(x0, clip[0]), clip[1])
                # the posterior mean of q(x_prev | x_t, x0), equal to eq. 7's mean when x0 is not clamped
                mean = c["x0"][i] * x0 + c["xt"][i] * x
            if i + 1 == len(ts):
                x = mean  # the last step adds no noise
            else:
                x = mean + c["sigma"][i] * _normal(x.shape, x.device, dtype)
        return x

    def _chain(self, ts: list[int], sample_variance: str) -> dict[str, torch.Tensor]:
        """The coefficients of `sample`'s steps along `ts`, each a (len(ts),) tensor in the schedule's
        dtype, computed once per chain with the very operations a step made on its 0-d tensors (so the
        same values bit for bit): with ab = abar_t, ab_prev = abar of the next step (1 after the last),
        alpha = ab / ab_prev and beta = 1 - alpha, eq. 7's `eps` = beta / sqrt(1 - ab) and `sqrt_alpha`,
        the clamped x0's `sqrt_1mab` and `sqrt_ab`, the posterior mean's `x0` = sqrt(ab_prev) beta /
        (1 - ab) and `xt` = sqrt(alpha) (1 - ab_prev) / (1 - ab), and `sigma`, the square root of
        `variance` (its last entry, the step to x0, unused)."""
        idx = torch.tensor(ts, device=self.alphas_bar.device)
        ab = self.alphas_bar[idx]
        ab_prev = torch.cat([self.alphas_bar[idx[1:]], torch.ones_like(ab[:1])])
        alpha = ab / ab_prev  # 1 - beta_t on the full chain
        beta = 1 - alpha
        var = beta if sample_variance == "beta" else beta * (1 - ab_prev) / (1 - ab)  # `variance`
        return {"eps": beta / (1 - ab).sqrt(), "sqrt_alpha": alpha.sqrt(), "sqrt_1mab": (1 - ab).sqrt(),
                "sqrt_ab": ab.sqrt(), "x0": ab_prev.sqrt() * beta / (1 - ab),
                "xt": alpha.sqrt() * (1 - ab_prev) / (1 - ab), "sigma": var.sqrt()}


def _normal(shape: tuple[int, ...], device, dtype: torch.dtype) -> torch.Tensor:
    """N(0, 1) drawn in float32 whatever the chain's dtype: a float64 chain (the tests' reference)
    sees the very noise a float32 one does from the same seed (torch's float64 stream differs)."""
    return torch.randn(shape, device=device).to(dtype)


@torch.no_grad()
def ema_update(target: nn.Module, online: nn.Module, decay: float) -> None:
    """target <- decay target + (1 - decay) online (parameters); buffers are copied."""
    t, o = list(target.parameters()), list(online.parameters())
    torch._foreach_mul_(t, decay)
    torch._foreach_add_(t, o, alpha=1 - decay)
    for bt, bo in zip(target.buffers(), online.buffers()):
        bt.copy_(bo)


# ---------------------------------------------------------------------------------------------
# Denoisers g_phi(x_t, t, z_c)

def _block(dim: int, hidden: int) -> nn.Sequential:
    # App. E's diff_block without its first norm: InstanceNorm1d over a sample's features (a LayerNorm
    # without affine) removes each sample's mean and scale, which the denoiser then cannot see nor
    # denoise; ancestral sampling amplified that direction (per-sample feature means spread 37 vs the
    # data's 0.13 on digits). The norm of the hidden layer stays.
    return nn.Sequential(nn.LeakyReLU(), nn.Linear(dim, hidden), nn.LeakyReLU(),
                         nn.LayerNorm(hidden, elementwise_affine=False), nn.Linear(hidden, dim))


class ResidualMLPDenoiser(nn.Module):
    """App. E Listing 2: four encoder and four decoder blocks with dense skips; the time embedding
    and the condition are added to the input of every block.

    The residual stream is a learned linear lift of the input to `max(in_dim, min_width)` features
    (brought back by another): App. E runs it at the input's width, where each block's leading
    LeakyReLU flattens the negative half of x_t. On digits (64-d) the lifted stream's samples match
    the data (feature std 0.95 vs 0.97), the unlifted one's do not (8.5).
    """

    def __init__(self, in_dim: int, cond_dim: int, steps: int, hidden: int = 2000, min_width: int = 256):
        super().__init__()
        width = max(in_dim, min_width)
        self.lift, self.lower = nn.Linear(in_dim, width), nn.Linear(width, in_dim)
        self.enc = nn.ModuleList(_block(width, hidden) for _ in range(4))
        self.dec = nn.ModuleList(_block(width, hidden) for _ in range(4))
        self.time = nn.Embedding(steps, width)
        self.cond = nn.Sequential(nn.Linear(cond_dim, width), nn.SiLU(), nn.Linear(width, width))
        for blk in [*self.enc, *self.dec]:  # every block starts at 0, so the dense skips start small:
            nn.init.zeros_(blk[-1].weight)  # on digits the noise loss after 300 steps is 0.31, not 0.60
            nn.init.zeros_(blk[-1].bias)

    def embed_condition(self, cond: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The condition's embedding (B, Dz) -> (B, W), for inputs x of `dtype`: what `forward` adds to
        the time's, the same at every step of a sampling chain (`DDPM.sample` computes it once)."""
        return self.cond(cond.to(dtype))

    def forward(self, x: torch.Tensor, t: torch.Tensor, cond: torch.Tensor,
                embedded: bool = False) -> torch.Tensor:
        """g(x_t, t, z_c): cond is z_c (B, Dz), or its `embed_condition` (B, W) if `embedded`."""
        shape = x.shape
        h = self.lift(x.flatten(1))  # (B, W)
        # (B, W): added before every block
        c = self.time(t) + (cond if embedded else self.embed_condition(cond, x.dtype))
        e1 = self.enc[0](h + c)
        e2 = self.enc[1](e1 + c) + e1
        e3 = self.enc[2](e2 + c) + e1 + e2
        e4 = self.enc[3](e3 + c) + e1 + e2 + e3
        d1 = self.dec[0](e4 + c)
        d2 = self.dec[1](d1 + c) + e3 + d1
        d3 = self.dec[2](d2 + c) + e2 + d1 + d2
        d4 = self.dec[3](d3 + c) + e1 + d1 + d2 + d3
        return self.lower(d4).view(shape)


def sinusoidal(t: torch.Tensor, dim: int) -> torch.Tensor:
    """Listing 1's pos_encoding: (B,) steps -> (B, dim) sin/cos features."""
    inv = 1.0 / (10000 ** (torch.arange(0, dim, 2, device=t.device).float() / dim))
    arg = t.float()[:, None] * inv[None, :]
    return torch.cat([arg.sin(), arg.cos()], dim=1)


class _DoubleConv(nn.Module):
    def __init__(self, c_in: int, c_out: int, emb: int, residual: bool = False):
        super().__init__()
        self.residual = residual and c_in == c_out
        self.net = nn.Sequential(
            nn.Conv2d(c_in, c_out, 3, padding=1, bias=False),
            nn.GroupNorm(1, c_out),
            nn.GELU(),
            nn.Conv2d(c_out, c_out, 3, padding=1, bias=False),
            nn.GroupNorm(1, c_out),
        )
        self.emb = nn.Sequential(nn.SiLU(), nn.Linear(emb, c_out))  # time + condition, per channel

    def forward(self, x: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        h = self.net(x) + self.emb(e)[:, :, None, None]
        return F.gelu(x + h) if self.residual else F.gelu(h)


class _SelfAttention(nn.Module):
    def __init__(self, c: int, heads: int = 4):
        super().__init__()
        self.norm = nn.LayerNorm(c)
        self.attn = nn.MultiheadAttention(c, heads if c % heads == 0 else 1, batch_first=True)
        self.ff = nn.Sequential(nn.LayerNorm(c), nn.Linear(c, c), nn.GELU(), nn.Linear(c, c))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        s = x.flatten(2).transpose(1, 2)  # (B, HW, C)
        n = self.norm(s)
        s = s + self.attn(n, n, n, need_weights=False)[0]
        s = s + self.ff(s)
        return s.transpose(1, 2).view(b, c, h, w)


class UNetDenoiser(nn.Module):
    """App. D Listing 1, made small: DoubleConv stem, two down and two up stages (channels w, 2w, 4w),
    self-attention at the two lowest resolutions, time (sinusoidal) + condition embedding added in
    every block. Listing 1 has three stages for 32 px; two keep 8x8 digits and 28x28 images whole
    (sides are padded to a multiple of 4 and cropped back).
    """

    def __init__(self, channels: int, cond_dim: int, width: int = 16, emb: int = 128):
        super().__init__()
        w = width
        self.emb_dim = emb
        self.cond = nn.Sequential(nn.Linear(cond_dim, emb), nn.SiLU(), nn.Linear(emb, emb))
        self.inc = _DoubleConv(channels, w, emb)
        self.down1, self.down2 = _DoubleConv(w, 2 * w, emb), _DoubleConv(2 * w, 4 * w, emb)
        self.sa1, self.sa2 = _SelfAttention(2 * w), _SelfAttention(4 * w)
        self.mid = _DoubleConv(4 * w, 4 * w, emb, residual=True)
        self.up1, self.up2 = _DoubleConv(6 * w, 2 * w, emb), _DoubleConv(3 * w, w, emb)
        self.sa3 = _SelfAttention(2 * w)
        self.outc = nn.Conv2d(w, channels, 1)
        nn.init.zeros_(self.outc.weight)  # predicts zero noise at first (as DDPM's U-Net)
        nn.init.zeros_(self.outc.bias)

    def embed_condition(self, cond: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The condition's embedding (B, Dz) -> (B, emb), for inputs x of `dtype`: what `forward` adds to
        the time's, the same at every step of a sampling chain (`DDPM.sample` computes it once)."""
        return self.cond(cond.to(dtype))

    def forward(self, x: torch.Tensor, t: torch.Tensor, cond: torch.Tensor,
                embedded: bool = False) -> torch.Tensor:
        """g(x_t, t, z_c): cond is z_c (B, Dz), or its `embed_condition` (B, emb) if `embedded`."""
        h_in, w_in = x.shape[-2:]
        ph, pw = (-h_in) % 4, (-w_in) % 4
        x = F.pad(x, (0, pw, 0, ph))
        cond = cond if embedded else self.embed_condition(cond, x.dtype)
        e = sinusoidal(t, self.emb_dim) + cond  # (B, emb)
        x1 = self.inc(x, e)  # (B, w, H, W)
        x2 = self.sa1(self.down1(F.max_pool2d(x1, 2), e))  # (B, 2w, H/2, W/2)
        x3 = self.sa2(self.down2(F.max_pool2d(x2, 2), e))  # (B, 4w, H/4, W/4)
        x3 = self.mid(x3, e)
        u = F.interpolate(x3, scale_factor=2, mode="bilinear", align_corners=True)
        u = self.sa3(self.up1(torch.cat([u, x2], 1), e))  # (B, 2w, H/2, W/2)
        u = F.interpolate(u, scale_factor=2, mode="bilinear", align_corners=True)
        u = self.up2(torch.cat([u, x1], 1), e)  # (B, w, H, W)
        return self.outc(u)[..., :h_in, :w_in]
