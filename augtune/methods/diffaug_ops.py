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


def log_t_kernel(sq_dist: torch.Tensor, nu: float) -> torch.Tensor:
    """log kappa_nu for squared distances d^2 (eq. 9): log C(nu) - (nu+1)/2 log(1 + d^2/nu).

    Computed in log space so that a tiny nu (DiffAug's nu_z = 0.01) or a huge distance never
    underflows to log 0.
    """
    sq = sq_dist.clamp(0, _MAX_SQ)
    return log_t_norm(nu) - (nu + 1) / 2 * torch.log1p(sq / nu)


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
    b, m = z.shape[0], z_bg.shape[0]
    log_q = log_t_kernel(torch.cdist(z.float(), z_bg.float()).pow(2), nu_z)  # (B, M)
    log_q = log_q.clamp(math.log(_EPS), math.log1p(-_EPS))
    k_y = log_t_kernel(torch.cdist(y.float(), y.float()).pow(2), nu_y).exp()  # (B, B) between samples
    p = (k_y.repeat(1, m // b) * torch.where(same, math.exp(alpha), 1.0)).clamp(0, 1)  # (B, M)
    log_1mq = torch.log1p(-log_q.exp())  # log(1 - Q)
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
        b, dtype = cond.shape[0], self.alphas_bar.dtype  # the chain runs in the schedule's dtype
        x = _normal((b, *shape), cond.device, dtype)  # delta ~ N(0, 1)
        ts = self.timesteps(sample_steps)
        one = torch.ones((), device=cond.device, dtype=dtype)
        for i, t in enumerate(ts):
            tt = torch.full((b,), t, device=cond.device, dtype=torch.long)
            eps = net(x, tt, cond).to(dtype)  # autocast's bf16 up
            ab = self.alphas_bar[t]
            ab_prev = self.alphas_bar[ts[i + 1]] if i + 1 < len(ts) else one
            alpha = ab / ab_prev  # 1 - beta_t on the full chain
            beta = 1 - alpha
            if clip is None:
                mean = (x - beta / (1 - ab).sqrt() * eps) / alpha.sqrt()  # eq. 7's mean
            else:
                x0 = (x - (1 - ab).sqrt() * eps) / ab.sqrt()
                x0 = torch.minimum(torch.maximum(x0, clip[0]), clip[1])
                # the posterior mean of q(x_prev | x_t, x0), equal to eq. 7's mean when x0 is not clamped
                mean = ab_prev.sqrt() * beta / (1 - ab) * x0 + alpha.sqrt() * (1 - ab_prev) / (1 - ab) * x
            if i + 1 == len(ts):
                x = mean  # the last step adds no noise
            else:
                sigma = self.variance(t, ts[i + 1], sample_variance).sqrt()
                x = mean + sigma * _normal(x.shape, x.device, dtype)
        return x


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

    def forward(self, x: torch.Tensor, t: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        h = self.lift(x.flatten(1))  # (B, W)
        c = self.time(t) + self.cond(cond.to(x.dtype))  # (B, W): added before every block
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

    def forward(self, x: torch.Tensor, t: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        h_in, w_in = x.shape[-2:]
        ph, pw = (-h_in) % 4, (-w_in) % 4
        x = F.pad(x, (0, pw, 0, ph))
        e = sinusoidal(t, self.emb_dim) + self.cond(cond.to(x.dtype))  # (B, emb)
        x1 = self.inc(x, e)  # (B, w, H, W)
        x2 = self.sa1(self.down1(F.max_pool2d(x1, 2), e))  # (B, 2w, H/2, W/2)
        x3 = self.sa2(self.down2(F.max_pool2d(x2, 2), e))  # (B, 4w, H/4, W/4)
        x3 = self.mid(x3, e)
        u = F.interpolate(x3, scale_factor=2, mode="bilinear", align_corners=True)
        u = self.sa3(self.up1(torch.cat([u, x2], 1), e))  # (B, 2w, H/2, W/2)
        u = F.interpolate(u, scale_factor=2, mode="bilinear", align_corners=True)
        u = self.up2(torch.cat([u, x1], 1), e)  # (B, w, H, W)
        return self.outc(u)[..., :h_in, :w_in]
