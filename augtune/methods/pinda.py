"""PiNDA (Zhang et al.): learned pi-noise augmentation, a generator trained with the encoder.

The pi-noise generator ``f_psi(x, eps)`` (paper 3.4, 4.2, eqs. 17-19) maps a sample to a diagonal
Gaussian ``N(mu, Sigma)`` and draws ``noise = mu + eps * Sigma``, ``eps ~ N(0, I)``; the pi-noise view
is ``x + noise``, in input space, the same shape as x. ``pinda.mu: zero`` has no mean parameters at
all; ``pinda.noise: uniform`` draws ``(2 eps - 1) * u``, ``eps ~ U(0, 1)``. Encoder and generator are
trained jointly by the encoder's optimiser (Adam 1e-3, B.4), both minimising the base's contrastive
loss (eq. 17), plus ``pinda.penalty / mean ||noise||`` (B.4): without it the cooperative generator
shrinks its noise to nothing, as the tests show.

Sigma is ``|head(x)|`` as in the same group's pi-noise code (docs/methods/pinda.md): a per-element
scale used as a standard deviation, non-negative, with gradients on both sides of 0.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from augtune.methods.base import Augmentation, Batch, Outputs, StepInfo
from augtune.models import cifar_resnet


class MLPGenerator(nn.Module):
    """Vectors: a 3-layer fully connected net, hidden 1024 (4.2), to `k` maps of the input's size."""

    def __init__(self, dim: int, k: int, hidden: int = 1024):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(inplace=True), nn.Linear(hidden, hidden),
                                 nn.ReLU(inplace=True), nn.Linear(hidden, k * dim))
        self.k = k

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x.flatten(1)).view(x.shape[0], self.k, *x.shape[1:])  # (B, k, *shape)


class ResNetGenerator(nn.Module):
    """Images: a CIFAR-stem ResNet-18 encoder and a linear head to `k` maps of the image's shape (4.2)."""

    def __init__(self, shape: tuple[int, ...], k: int):
        super().__init__()
        self.encoder = cifar_resnet(18, shape[0])
        self.head = nn.Linear(self.encoder.out_dim, k * math.prod(shape))
        self.k = k

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x)).view(x.shape[0], self.k, *x.shape[1:])


class UNetGenerator(nn.Module):
    """Images: a two-level U-Net (Table 6's alternative generator), k maps per input channel."""

    def __init__(self, channels: int, k: int, width: int = 32):
        super().__init__()

        def block(c_in: int, c_out: int) -> nn.Sequential:
            return nn.Sequential(nn.Conv2d(c_in, c_out, 3, padding=1), nn.GroupNorm(min(8, c_out), c_out),
                                 nn.SiLU(), nn.Conv2d(c_out, c_out, 3, padding=1), nn.SiLU())

        self.down1, self.down2 = block(channels, width), block(width, 2 * width)
        self.mid = block(2 * width, 2 * width)
        self.up = block(3 * width, width)
        self.out = nn.Conv2d(width, k * channels, 1)
        self.k = k

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h1 = self.down1(x)  # (B, w, H, W)
        h2 = self.mid(self.down2(F.avg_pool2d(h1, 2, ceil_mode=True)))  # (B, 2w, H/2, W/2)
        up = F.interpolate(h2, size=h1.shape[-2:], mode="nearest")
        out = self.out(self.up(torch.cat([h1, up], dim=1)))  # (B, k C, H, W)
        return out.view(x.shape[0], self.k, *x.shape[1:])


def build_generator(name: str, modality: str, shape: tuple[int, ...], k: int, width: int) -> nn.Module:
    """`pinda.generator` for data of `modality` and per-sample `shape`, with `k` output maps."""
    if name == "auto":
        name = "mlp" if modality == "vector" else "resnet18"
    if name == "mlp":
        return MLPGenerator(math.prod(shape), k)
    if modality != "image":
        raise ValueError(f"pinda.generator: {name} needs image data; this dataset gives vectors (use mlp)")
    if name == "resnet18":
        return ResNetGenerator(shape, k)
    return UNetGenerator(shape[0], k, width)


class PiNoiseGenerator(nn.Module):
    """f_psi(x, eps): the distribution's parameters from x, and reparameterised draws (eqs. 18-19)."""

    def __init__(self, net: nn.Module, mu: str, noise: str, mean=None, std=None):
        super().__init__()
        self.net, self.learned_mu, self.noise = net, mu == "learned", noise
        self.register_buffer("mean", torch.tensor(mean).view(1, -1, 1, 1) if mean else torch.zeros(()),
                             persistent=False)
        self.register_buffer("std", torch.tensor(std).view(1, -1, 1, 1) if std else torch.ones(()),
                             persistent=False)

    def params(self, x: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor]:
        """(mu or None, scale): scale is Sigma (Gaussian) or u (uniform), >= 0, both x's shape."""
        out = self.net((x - self.mean) / self.std)  # (B, k, *shape), input normalised as the encoder's
        scale = out[:, 0].abs()
        return (out[:, 1] if self.learned_mu else None), scale

    def sample(self, mu: torch.Tensor | None, scale: torch.Tensor) -> torch.Tensor:
        """One draw of the pi-noise: mu + eps * Sigma (eq. 19) or (2 eps - 1) u, eps ~ U(0, 1)."""
        if self.noise == "uniform":
            noise = (2 * torch.rand_like(scale) - 1) * scale
        else:
            noise = torch.randn_like(scale) * scale
        return noise if mu is None else mu + noise

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.sample(*self.params(x))


def mean_norm(noise: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
    """The mean L2 norm of the rows of `noise` (N, *shape); with `weight` (N,) 0/1 keeping at least
    one row, of the rows it keeps (a weighted mean: no device sync, unlike selecting the rows)."""
    norms = noise.flatten(1).norm(dim=1)  # (N,)
    return norms.mean() if weight is None else (norms * weight).sum() / weight.sum()


def inverse_norm_penalty(noise: torch.Tensor, eps: float = 1e-8,
                         weight: torch.Tensor | None = None) -> torch.Tensor:
    """B.4's penalty: the multiplicative inverse of the batch's mean pi-noise norm (L2 per sample);
    `weight`: which rows count (see :func:`mean_norm`)."""
    return 1.0 / (mean_norm(noise, weight) + eps)


def _selection_is_free(device: torch.device) -> bool:
    """Whether picking rows by a mask costs no device sync (host tensors): there the used noises
    are picked (bitwise the numbers of earlier runs); on an accelerator they are weighted."""
    return device.type == "cpu"


class PiNDA(Augmentation):
    """Learned pi-noise augmentation (PiNDA, Algorithms 1-2): views x + f_psi(x, eps), trained jointly."""

    name = "pinda"
    figures = ("pinda",)
    knobs = ("pinda.penalty",)  # read in every loss_terms

    def __init__(self, cfg, data):
        super().__init__(cfg, data)
        c = cfg.pinda
        k = 2 if c.mu == "learned" else 1  # Sigma, and mu only when learned: mu=0 has no mean parameters
        net = build_generator(c.generator, data.modality, tuple(data.shape), k, c.width)
        self.generator = PiNoiseGenerator(net, c.mu, c.noise, data.mean, data.std)
        self.figures = ("pinda",) if data.modality == "image" else ()  # the noise grid shows images
        view = cfg.view.name
        self.pair = c.draw == "pair" or (c.draw == "auto" and view == "identity")

    def joint_parameters(self) -> list:
        return list(self.generator.parameters())  # the encoder's optimiser trains psi with theta (Alg. 2)

    def slots(self, batch_size: int, num_views: int, like: torch.Tensor) -> torch.Tensor:
        """(V, B) bool: which view slots take the pi-noise view. Alg. 1: slot 0 always; Alg. 2: each
        slot draws PiNDA or the predefined augmentation with probability 1/2."""
        if self.pair:
            mask = torch.zeros(num_views, batch_size, dtype=torch.bool, device=like.device)
            mask[0] = True
            return mask
        return torch.rand(num_views, batch_size, device=like.device) < 0.5

    def transform(self, batch: Batch, method, info: StepInfo) -> Batch:
        mask = self.slots(batch.x.shape[0], len(batch.views), batch.x)  # (V, B)
        mu, scale = self.generator.params(batch.x)  # one generator pass, one draw per slot
        views, noises = [], []
        for v, m in zip(batch.views, mask):
            noise = self.generator.sample(mu, scale)  # (B, *shape)
            views.append(torch.where(m.view(-1, *[1] * (v.dim() - 1)), batch.x + noise, v))
            noises.append(noise)
        # the noises the views used (the penalty's and the diagnostics' sample), no device sync
        weight = None
        if self.pair:  # Alg. 1: slot 0 always, no other slot
            used = noises[0]
        elif _selection_is_free(batch.x.device):
            used = torch.cat([z[m] for z, m in zip(noises, mask)])
            if used.shape[0] == 0:  # no slot drew PiNDA: the penalty has nothing to measure
                used = noise
        else:  # every slot's noise, weight 1 where the slot drew PiNDA (last slot's if none did)
            used = torch.cat(noises)  # (V B, *shape)
            weight = mask.flatten().to(noise.dtype)  # (V B,)
            last = torch.zeros_like(mask)
            last[-1] = True
            weight = torch.where(weight.sum() > 0, weight, last.flatten().to(weight.dtype))
        with torch.no_grad():
            self.meter.add("noise_norm", mean_norm(used, weight))  # mean ||noise|| per sample
            self.meter.add("sigma_mean", scale.mean())  # mean Sigma (or u) per element
            self.meter.add("rate", mask.float().mean())  # fraction of view slots that were x + noise
        extra = {"pinda_noise": used} if weight is None else {"pinda_noise": used,
                                                              "pinda_weight": weight}
        return batch.with_views(views, **extra)

    def loss_terms(self, batch: Batch, out: Outputs, method, info: StepInfo) -> dict[str, torch.Tensor]:
        if not self.cfg.pinda.penalty:
            return {}
        noise, weight = batch.extra["pinda_noise"], batch.extra.get("pinda_weight")
        penalty = self.cfg.pinda.penalty * inverse_norm_penalty(noise, weight=weight)
        return {"pinda_penalty": penalty}
