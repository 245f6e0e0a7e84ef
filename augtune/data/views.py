"""View pipelines that run on whole batches, on the training device.

A view maps a batch ``(B, *shape)`` to a random view of the same shape, dtype and device. Every random
parameter is drawn per sample from the global torch RNG of ``x.device`` (so ``torch.manual_seed`` makes a
run reproducible on that device) and no op loops over samples. Image ops are plain functions of
``(x, per-sample parameters)`` so that other augmentation pools (CoCor's RandAugment ops) can reuse them;
views are ``nn.Module``s looked up by name in :data:`VIEWS`.

Images are ``(B, C, H, W)`` in [0, 1], C = 1 or 3, not yet normalised. Vectors are ``(B, D)``, already
standardised by the loader. Ops stay differentiable but nothing here needs gradients.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from augtune.config import ViewConfig

# ITU-R 601 luma, as PIL's convert("L") (299/1000, 587/1000, 114/1000), which FixMatch's and CoCor's
# ImageEnhance ops use. torchvision's rgb_to_grayscale uses 0.2989 for red (TensorFlow's constants; the
# weights sum to 0.9999): its grey is this one minus 1e-4 R, at most 1e-4 darker on [0, 1] images.
_GRAY = (0.299, 0.587, 0.114)
# RGB -> YIQ (rows Y, I, Q); a hue shift is a rotation of the (I, Q) chroma plane that keeps luma Y.
_YIQ = torch.tensor([[0.299, 0.587, 0.114], [0.596, -0.274, -0.322], [0.211, -0.523, 0.312]],
                    dtype=torch.float64)
_YIQ_INV = torch.linalg.inv(_YIQ)
_HOST = {"gray": torch.tensor(_GRAY, dtype=torch.float64).view(1, 3, 1, 1),  # (1, 3, 1, 1)
         "yiq": _YIQ, "yiq_inv": _YIQ_INV}
# The host constants above as each device and dtype reads them, copied there once: a view op on an
# accelerator then makes no host-to-device copy (the values are those of `.to(device, dtype)`)
_ON_DEVICE: dict[tuple[str, torch.device, torch.dtype], Tensor] = {}


def _constant(name: str, like: Tensor) -> Tensor:
    """Host constant `name` in like's dtype on like's device (one copy per device and dtype)."""
    key = (name, like.device, like.dtype)
    out = _ON_DEVICE.get(key)
    if out is None:
        out = _ON_DEVICE.setdefault(key, _HOST[name].to(like.device, like.dtype))
    return out


def _as_param(v: float | Tensor, x: Tensor) -> Tensor:
    """A float or a tensor parameter in x's dtype on x's device. A float is filled in there (a fill
    kernel, no host-to-device copy; the same value as ``torch.as_tensor(v, dtype)``)."""
    if isinstance(v, Tensor):
        return v.to(x.device, x.dtype)
    return torch.full((1,), v, dtype=x.dtype, device=x.device)


def _per_sample(v: float | Tensor, x: Tensor) -> Tensor:
    """A float or (B,) parameter -> broadcastable against x: (B, 1, ..., 1) in x's dtype and device."""
    return _as_param(v, x).reshape(-1, *([1] * (x.dim() - 1)))


def _uniform(shape: int | tuple[int, ...], lo: float, hi: float, like: Tensor) -> Tensor:
    return lo + (hi - lo) * torch.rand(shape, device=like.device, dtype=like.dtype)


def coin(p: float, batch: int, like: Tensor) -> Tensor:
    """(B,) bool on like.device, each True with probability p."""
    return torch.rand(batch, device=like.device) < p


def _where(apply: Tensor, a: Tensor, b: Tensor) -> Tensor:
    return torch.where(apply.reshape(-1, *([1] * (a.dim() - 1))), a, b)


# --- geometry: random resized crop and flip as one per-sample affine warp ----------------------------

def sample_crop(batch: int, scale: Sequence[float], ratio: Sequence[float], height: int, width: int,
                like: Tensor, tries: int = 10) -> Tensor:
    """(B, 4) boxes ``(cx, cy, w, h)`` as fractions of the input, drawn as torchvision's
    RandomResizedCrop: area fraction ~ U(scale), pixel aspect ratio w/h log-uniform in ``ratio``, the
    first of ``tries`` draws that fits inside the image, else its fallback (the whole image, aspect
    clamped into ``ratio``); position uniform over the places the box fits (continuous, not whole pixels).
    ``like``: a tensor whose device and dtype the boxes take."""
    s = _uniform((batch, tries), scale[0], scale[1], like)
    r = torch.exp(_uniform((batch, tries), math.log(ratio[0]), math.log(ratio[1]), like))
    w = torch.sqrt(s * r * height / width)  # (B, tries) fraction of the width: w_px = sqrt(s H W r)
    h = torch.sqrt(s / r * width / height)
    fits = (w <= 1) & (h <= 1)
    first = fits.to(w.dtype).argmax(1, keepdim=True)  # (B, 1) index of the first fitting try
    w, h = w.gather(1, first)[:, 0], h.gather(1, first)[:, 0]  # (B,)
    aspect = width / height
    fw = ratio[1] / aspect if aspect > ratio[1] else 1.0
    fh = aspect / ratio[0] if aspect < ratio[0] else 1.0
    found = fits.any(1)
    w, h = torch.where(found, w, fw), torch.where(found, h, fh)
    cx = w / 2 + (1 - w) * torch.rand(batch, device=like.device, dtype=like.dtype)
    cy = h / 2 + (1 - h) * torch.rand(batch, device=like.device, dtype=like.dtype)
    return torch.stack([cx, cy, w, h], 1)


def crop_theta(box: Tensor, flip: Tensor | None = None) -> Tensor:
    """(B, 4) boxes and optional (B,) bool flips -> (B, 2, 3) ``affine_grid`` matrices mapping output
    coordinates in [-1, 1] onto the box. With align_corners=False, ±1 are the outer pixel edges, so the
    whole-image box is exactly the identity and a negated x scale is exactly ``torch.flip``."""
    cx, cy, w, h = box.unbind(1)
    sx = w if flip is None else torch.where(flip, -w, w)
    zero = torch.zeros_like(w)
    return torch.stack([torch.stack([sx, zero, 2 * cx - 1], 1), torch.stack([zero, h, 2 * cy - 1], 1)], 1)


def warp(x: Tensor, theta: Tensor, padding_mode: str = "border") -> Tensor:
    """Resample (B, C, H, W) through per-sample affine maps theta (B, 2, 3); bilinear, same size."""
    grid = F.affine_grid(theta.to(x.dtype), list(x.shape), align_corners=False)  # (B, H, W, 2)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode=padding_mode, align_corners=False)


def resized_crop(x: Tensor, box: Tensor, flip: Tensor | None = None) -> Tensor:
    """Crop each image to its box, flip where asked, and resize back to the input size, in one warp."""
    return warp(x, crop_theta(box, flip))


# --- colour: factors are floats or (B,) tensors; each op clamps to [0, 1] as torchvision's do ----------

def luma(x: Tensor) -> Tensor:
    """(B, C, H, W) -> (B, 1, H, W); a 1-channel image is its own luma."""
    if x.shape[1] == 1:
        return x
    return (x * _constant("gray", x)).sum(1, keepdim=True)


def to_grayscale(x: Tensor) -> Tensor:
    """Luma repeated over the channels (the channel count is kept, as RandomGrayscale does)."""
    return luma(x).repeat(1, x.shape[1], 1, 1) if x.shape[1] > 1 else x


def _blend(a: Tensor, b: Tensor, factor: float | Tensor) -> Tensor:
    f = _per_sample(factor, a)  # factor 1 gives `a` exactly
    return (f * a + (1 - f) * b).clamp_(0, 1)


def adjust_brightness(x: Tensor, factor: float | Tensor) -> Tensor:
    return (x * _per_sample(factor, x)).clamp_(0, 1)


def adjust_contrast(x: Tensor, factor: float | Tensor) -> Tensor:
    """Blend with the mean luma of each image (factor 0: flat grey image)."""
    return _blend(x, luma(x).mean((1, 2, 3), keepdim=True), factor)


def adjust_saturation(x: Tensor, factor: float | Tensor) -> Tensor:
    """Blend with the image's own luma (factor 0: grayscale); a no-op on 1-channel images."""
    return x if x.shape[1] == 1 else _blend(x, luma(x), factor)


def adjust_hue(x: Tensor, shift: float | Tensor) -> Tensor:
    """Rotate chroma by ``shift`` turns (B,) in YIQ space; a no-op on 1-channel images.

    Luma is kept exactly up to the final clamp and the op is periodic in ``shift`` with period 1. It
    differs from torchvision's HSV hue shift, which keeps the max channel rather than luma; a positive
    shift turns red towards green, as there. Built as I + T^-1 (R - I) T so that shift 0 is exact."""
    if x.shape[1] == 1:
        return x
    angle = 2 * math.pi * _as_param(shift, x).reshape(-1)  # (B,) radians
    cos, sin = torch.cos(angle) - 1, torch.sin(angle)
    rot = torch.zeros(angle.shape[0], 3, 3, dtype=x.dtype, device=x.device)  # (B, 3, 3): R - I
    rot[:, 1, 1], rot[:, 1, 2], rot[:, 2, 1], rot[:, 2, 2] = cos, sin, -sin, cos
    yiq, yiq_inv = _constant("yiq", x), _constant("yiq_inv", x)
    m = torch.eye(3, dtype=x.dtype, device=x.device) + yiq_inv @ rot @ yiq  # (B, 3, 3)
    return torch.einsum("bij,bjhw->bihw", m, x).clamp_(0, 1)


# --- blur ---------------------------------------------------------------------------------------------

def blur_kernel_size(side: int) -> int:
    """SimCLR: ~10% of the side, odd, at least 3 (3 for 8-32 px, 9 for 96 px, 23 for 224 px)."""
    return max(3, 2 * int(0.05 * side) + 1)


def gaussian_blur(x: Tensor, sigma: float | Tensor, kernel_size: tuple[int, int] | None = None) -> Tensor:
    """Per-sample Gaussian blur with sigma (B,) in pixels: separable, reflect padding as torchvision.
    Each (sample, channel) plane is one group of a depthwise conv (7x faster on CPU than shift-and-add)."""
    b, c, height, width = x.shape
    kh, kw = kernel_size or (blur_kernel_size(height), blur_kernel_size(width))
    sigma = _as_param(sigma, x).reshape(-1, 1).expand(b, 1)  # (B, 1) px

    def kernel(k: int) -> Tensor:  # (B*C, k) normalised taps, one row per plane
        t = torch.arange(k, dtype=x.dtype, device=x.device) - k // 2
        g = torch.exp(-t ** 2 / (2 * sigma ** 2))
        return (g / g.sum(1, keepdim=True)).repeat_interleave(c, 0)

    y = F.pad(x.reshape(1, b * c, height, width), (kw // 2, kw // 2, kh // 2, kh // 2), mode="reflect")
    y = F.conv2d(y, kernel(kw).view(b * c, 1, 1, kw), groups=b * c)  # (1, B*C, H + kh - 1, W)
    y = F.conv2d(y, kernel(kh).view(b * c, 1, kh, 1), groups=b * c)  # (1, B*C, H, W)
    return y.view(b, c, height, width)


# --- vector ops ---------------------------------------------------------------------------------------

def add_noise(x: Tensor, std: float | Tensor) -> Tensor:
    """x + std * N(0, I); std a float or (B,)."""
    return x + _per_sample(std, x) * torch.randn_like(x)


def mask_features(x: Tensor, p: float | Tensor) -> Tensor:
    """Zero each entry independently with probability p (no 1/(1-p) rescaling: a view, not dropout)."""
    return torch.where(torch.rand_like(x) < _per_sample(p, x), torch.zeros_like(x), x)


# --- views --------------------------------------------------------------------------------------------

class SimCLRView(nn.Module):
    """SimCLR's augmentation (Chen et al. 2020, App. A), sized to the input: random resized crop and
    horizontal flip (one warp), colour jitter with probability ``jitter_p`` (brightness, contrast,
    saturation, hue in that fixed order; torchvision shuffles it), grayscale with ``gray_p`` and
    Gaussian blur with ``blur_p`` (sigma ~ U(0.1, 2.0) px, kernel ~10% of the side)."""

    modalities = ("image",)

    def __init__(self, crop_scale: Sequence[float] = (0.2, 1.0), flip_p: float = 0.5, jitter: float = 0.4,
                 hue: float = 0.1, jitter_p: float = 0.8, gray_p: float = 0.2, blur_p: float = 0.0,
                 ratio: Sequence[float] = (3 / 4, 4 / 3), sigma: Sequence[float] = (0.1, 2.0)):
        super().__init__()
        self.crop_scale, self.ratio, self.sigma = tuple(crop_scale), tuple(ratio), tuple(sigma)
        self.flip_p, self.jitter, self.hue = flip_p, jitter, hue
        self.jitter_p, self.gray_p, self.blur_p = jitter_p, gray_p, blur_p

    @classmethod
    def from_config(cls, cfg: ViewConfig, shape: tuple[int, ...]) -> "SimCLRView":
        return cls(crop_scale=cfg.crop_scale, flip_p=cfg.flip_p, jitter=cfg.jitter, hue=cfg.hue,
                   jitter_p=cfg.jitter_p, gray_p=cfg.gray_p, blur_p=cfg.blur_p)

    def forward(self, x: Tensor) -> Tensor:
        return self.apply(x, self.sample(x.shape[0], x))

    def sample(self, b: int, like: Tensor) -> dict[str, Tensor]:
        """Every random parameter of `b` views, each (b, ...) per sample (cheap: no pixels), drawn in a
        fixed order from the global RNG of like.device. A DDP rank draws them for the whole global
        batch and applies its own rows: the same views as one process, for a 1/world share of the work."""
        _, channels, height, width = like.shape  # like: a batch of the images (any rows of them)
        dtype = torch.float32 if like.dtype in (torch.float16, torch.bfloat16, torch.uint8) else like.dtype
        like = torch.empty(0, dtype=dtype, device=like.device)
        p = {"box": sample_crop(b, self.crop_scale, self.ratio, height, width, like),  # (B, 4)
             "flip": coin(self.flip_p, b, like)}
        if self.jitter_p > 0:
            p["factors"] = _uniform((3, b), max(0.0, 1 - self.jitter), 1 + self.jitter, like).T  # (B, 3)
            p["shift"] = _uniform(b, -self.hue, self.hue, like)  # (B,) turns
            p["jitter"] = coin(self.jitter_p, b, like)
        if self.gray_p > 0 and channels == 3:
            p["gray"] = coin(self.gray_p, b, like)
        if self.blur_p > 0:
            p["sigma"] = _uniform(b, self.sigma[0], self.sigma[1], like)
            p["blur"] = coin(self.blur_p, b, like)
        return p

    def apply(self, x: Tensor, p: dict[str, Tensor]) -> Tensor:
        """The views of x (B, C, H, W) with the parameters `p` of `sample` (rows matching x's)."""
        dtype = x.dtype
        if dtype in (torch.float16, torch.bfloat16):
            x = x.float()  # grid coordinates need more than 8 bits of mantissa at 96 px
        x = resized_crop(x, p["box"], p["flip"])
        if "jitter" in p:
            f = p["factors"]
            y = adjust_hue(
                adjust_saturation(adjust_contrast(adjust_brightness(x, f[:, 0]), f[:, 1]), f[:, 2]),
                p["shift"],
            )
            x = _where(p["jitter"], y, x)
        if "gray" in p:
            x = _where(p["gray"], to_grayscale(x), x)
        if "blur" in p:
            x = _where(p["blur"], gaussian_blur(x, p["sigma"]), x)
        return x.clamp(0, 1).to(dtype)

    def extra_repr(self) -> str:
        return (f"crop_scale={self.crop_scale}, flip_p={self.flip_p}, jitter={self.jitter}, hue={self.hue}, "
                f"jitter_p={self.jitter_p}, gray_p={self.gray_p}, blur_p={self.blur_p}")


class IdentityView(nn.Module):
    """No augmentation: returns its input (the same tensor)."""

    modalities = ("image", "vector")

    @classmethod
    def from_config(cls, cfg: ViewConfig, shape: tuple[int, ...]) -> "IdentityView":
        return cls()

    def forward(self, x: Tensor) -> Tensor:
        return x

    def sample(self, b: int, like: Tensor) -> dict[str, Tensor]:
        return {}

    def apply(self, x: Tensor, p: dict[str, Tensor]) -> Tensor:
        return x


class NoiseView(nn.Module):
    """PiNDA's "Random Noise" baseline: x + noise_std * N(0, I), in the loader's standardised units."""

    modalities = ("vector",)

    def __init__(self, noise_std: float = 1.0, mask_p: float = 0.0):
        super().__init__()
        self.noise_std, self.mask_p = noise_std, mask_p

    @classmethod
    def from_config(cls, cfg: ViewConfig, shape: tuple[int, ...]) -> nn.Module:
        return cls(noise_std=cfg.noise_std)

    def forward(self, x: Tensor) -> Tensor:
        return self.apply(x, self.sample(x.shape[0], x))

    def sample(self, b: int, like: Tensor) -> dict[str, Tensor]:
        """The mask and the noise of `b` views (as SimCLRView.sample: drawn for a global batch)."""
        shape = (b, *like.shape[1:])
        p = {}
        if self.mask_p > 0:
            p["drop"] = torch.rand(shape, dtype=like.dtype, device=like.device) < self.mask_p
        if self.noise_std > 0:
            p["noise"] = self.noise_std * torch.randn(shape, dtype=like.dtype, device=like.device)
        return p

    def apply(self, x: Tensor, p: dict[str, Tensor]) -> Tensor:
        if "drop" in p:
            x = torch.where(p["drop"], torch.zeros_like(x), x)
        return x + p["noise"] if "noise" in p else x

    def extra_repr(self) -> str:
        return f"noise_std={self.noise_std}, mask_p={self.mask_p}"


class MaskView(NoiseView):
    """Zero each feature independently with probability mask_p."""

    @classmethod
    def from_config(cls, cfg: ViewConfig, shape: tuple[int, ...]) -> nn.Module:
        return cls(noise_std=0.0, mask_p=cfg.mask_p)


class NoiseMaskView(NoiseView):
    """Mask (mask_p), then add noise (noise_std)."""

    @classmethod
    def from_config(cls, cfg: ViewConfig, shape: tuple[int, ...]) -> nn.Module:
        return cls(noise_std=cfg.noise_std, mask_p=cfg.mask_p)


VIEWS: dict[str, type] = {"simclr": SimCLRView, "identity": IdentityView, "noise": NoiseView,
                          "mask": MaskView, "noise_mask": NoiseMaskView}
AUTO_VIEW = {"image": "simclr", "vector": "noise"}  # view.name "auto", per modality


def build_view(cfg: ViewConfig, modality: str, shape: tuple[int, ...]) -> nn.Module:
    """The view named by ``cfg.name`` for inputs of one sample's ``shape``; ValueError if it does not fit."""
    if modality not in AUTO_VIEW:
        raise ValueError(f"view: unknown modality {modality!r} (known: {', '.join(AUTO_VIEW)})")
    shape = tuple(shape)
    if modality == "image" and (len(shape) != 3 or shape[0] not in (1, 3)):
        raise ValueError(f"view: image views need a (C, H, W) shape with C = 1 or 3, got {shape}")
    name = AUTO_VIEW[modality] if cfg.name == "auto" else cfg.name
    if name not in VIEWS:
        raise ValueError(f"view.name: unknown view {name!r} (known: auto, {', '.join(VIEWS)})")
    if modality not in VIEWS[name].modalities:
        fits = [n for n, v in VIEWS.items() if modality in v.modalities]
        raise ValueError(
            f"view.name: {name!r} does not fit {modality} inputs (use one of: auto, {', '.join(fits)})"
        )
    return VIEWS[name].from_config(cfg, shape)
