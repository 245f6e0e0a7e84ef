"""CoCor's basic augmentations (Appendix C) and composite augmentations (Definitions 1-2).

Every op works on a whole batch on the device and takes one magnitude per sample, in the op's own
units (below). Magnitudes are drawn per sample and per application, RandAugment/FixMatch style, from
the documented ranges; a random sign makes the symmetric ops go both ways.

| op | magnitude m (units) | effect | range drawn |
| --- | --- | --- | --- |
| AutoContrast | - | per-channel min-max stretch to [0, 1] | - |
| Brightness, Color, Contrast, Sharpness | enhance factor f (PIL) | deg + f (x - deg) (*) | 1 +- U(0.1, 0.9) |
| Rotate | degrees, counter-clockwise | about the centre; bilinear, black fill | +-U(3, 30) |
| ShearX, ShearY | shear factor | x_in = x + m y (resp. y_in = y + m x), px from top-left | +-U(0.03, 0.3) |
| TranslateX, TranslateY | fraction of the width/height, right/down | content moves by m | +-U(0.03, 0.3) |
| Posterize | bits kept of 8 | fewer bits, coarser levels | {4, 5, 6} |
| Solarize | threshold in [0, 1] | pixels >= m are inverted; lower m inverts more | U(0.25, 0.75) |
| Equalize | - | per-channel histogram equalisation (textbook cdf formula, see _equalize) | - |
| Identity | - | none | - |

(*) deg = black, the grey image, its mean grey, the smoothed image, in that order (PIL's ImageEnhance);
f > 1 strengthens.

Affine ops work in pixels, so angles and distances hold on non-square images, and the shear pivots at
the top-left corner: FixMatch's PIL `img.transform(size, AFFINE, (1, m, 0, 0, 1, 0))` and torchvision's
RandAugment (`affine(shear=[degrees(atan(m)), 0], center=[0, 0])`); CoCor's code uses FixMatch's. The
corner pivot adds a shift of m H / 2 px to a shear about the centre, which changes 97% of the pixels of
random 32 px images at m = 0.3 (74% of digits'). tests/test_cocor_ops_reference.py checks the five
affine ops against torchvision's v2 affine/rotate, and the shears against PIL.
Affine ops fill with black (0), not FixMatch's grey: small data sets here have black backgrounds.
Color is the identity on one-channel images (grey is already grey).

Vector data (no paper does this; augtune's choice): Identity, GaussianNoise (x + m sd eps, m the
noise level in units of the batch's per-feature sd), Mask (each feature with probability m, and at
least one, replaced by the batch mean), Scale (each feature times 1 + U(-m, m)), Swap (each feature
with probability m, at least one, taken from a random sample of the batch, SCARF-style);
m ~ U(0.05, 0.3).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from augtune.data.views import adjust_brightness, adjust_contrast, adjust_saturation, warp

IMAGE_OPS = ("AutoContrast", "Brightness", "Color", "Contrast", "Rotate", "Equalize", "Identity",
             "Posterize", "Sharpness", "ShearX", "ShearY", "Solarize", "TranslateX", "TranslateY")
COLOR_OPS = ("AutoContrast", "Brightness", "Color", "Contrast", "Equalize", "Identity", "Posterize",
             "Sharpness", "Solarize")  # App. C, Omega_color
AFFINE_OPS = ("Rotate", "Identity", "ShearX", "ShearY", "TranslateX", "TranslateY")  # App. C, Omega_affine
POOLS = {"all": IMAGE_OPS, "color": COLOR_OPS, "affine": AFFINE_OPS}
VECTOR_OPS = ("Identity", "GaussianNoise", "Mask", "Scale", "Swap")

_ENHANCE = ("Brightness", "Color", "Contrast", "Sharpness")
_AFFINE = ("Rotate", "ShearX", "ShearY", "TranslateX", "TranslateY")


def pool_ops(pool: str, modality: str) -> tuple[str, ...]:
    if modality == "vector":
        return VECTOR_OPS  # one pool for vectors: color/affine mean nothing there
    return POOLS[pool]


def _signed(lo: float, hi: float, n: int) -> torch.Tensor:
    sign = torch.randint(0, 2, (n,)).float() * 2 - 1
    return sign * (lo + (hi - lo) * torch.rand(n))


def sample_magnitude(op: str, n: int) -> torch.Tensor:
    """(n,) magnitudes of `op` in its units (module table), drawn on the CPU from the global RNG."""
    if op in _ENHANCE:
        return 1 + _signed(0.1, 0.9, n)
    if op == "Rotate":
        return _signed(3.0, 30.0, n)
    if op in ("ShearX", "ShearY", "TranslateX", "TranslateY"):
        return _signed(0.03, 0.3, n)
    if op == "Posterize":
        return torch.randint(4, 7, (n,)).float()
    if op == "Solarize":
        return 0.25 + 0.5 * torch.rand(n)
    if op in ("GaussianNoise", "Mask", "Scale", "Swap"):
        return 0.05 + 0.25 * torch.rand(n)
    return torch.zeros(n)


def _smooth(x: torch.Tensor) -> torch.Tensor:
    """PIL's SMOOTH filter (3x3, centre 5, others 1, /13), border pixels kept (as ImageEnhance.Sharpness)."""
    c = x.shape[1]
    k = torch.ones(3, 3, dtype=x.dtype, device=x.device)
    k[1, 1] = 5
    k = (k / 13).expand(c, 1, 3, 3)
    out = x.clone()
    out[..., 1:-1, 1:-1] = F.conv2d(x, k, groups=c)
    return out


def _equalize(x: torch.Tensor) -> torch.Tensor:
    """Per-channel histogram equalisation over 256 levels: lut(k) = (cdf(k) - cdf_min) / (n - cdf_min).

    The textbook formula, not PIL's (torchvision's) step scheme, which leaves every image of fewer
    than ~256 pixels unchanged (8x8 digits)."""
    b, c, h, w = x.shape
    q = (x.float().clamp(0, 1) * 255).round().long().flatten(2)  # (B, C, HW) levels
    hist = torch.zeros(b, c, 256, device=x.device).scatter_add_(2, q, torch.ones_like(q, dtype=torch.float))
    cdf = hist.cumsum(2)  # (B, C, 256)
    cdf_min = torch.where(hist > 0, cdf, torch.full_like(cdf, float(h * w))).amin(2, keepdim=True)
    lut = ((cdf - cdf_min) / (h * w - cdf_min).clamp_min(1)).clamp(0, 1)  # (B, C, 256)
    flat = torch.where(cdf_min < h * w, lut.gather(2, q), q.float() / 255)  # one-level channels stay
    return flat.view(b, c, h, w).to(x.dtype)


def _affine_theta(op: str, m: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """(n, 2, 3) inverse maps (output -> input) of `op` with magnitudes m (n,), for `warp`.

    Built in pixels (x right, y down, origin at the image centre, one unit = one pixel, as torchvision's
    affine), then conjugated into affine_grid's [-1, 1] coordinates by S = diag(W/2, H/2):
    theta = [S^-1 A S | S^-1 b] for the pixel map p_in = A p_out + b. Working in pixels keeps angles and
    distances on non-square images (in [-1, 1]^2 a 90 degree turn of a 12x20 image sends a point 5 px
    right of the centre to 3 px above it, not 5).
    """
    n = m.shape[0]
    a = torch.zeros(n, 2, 2, dtype=m.dtype, device=m.device)  # (n, 2, 2) pixel-space linear part
    a[:, 0, 0] = a[:, 1, 1] = 1
    b = torch.zeros(n, 2, dtype=m.dtype, device=m.device)  # (n, 2) pixel-space offset
    if op == "Rotate":  # counter-clockwise, about the centre: x_in = x cos - y sin, y_in = x sin + y cos
        r = m * (math.pi / 180)
        a[:, 0, 0], a[:, 0, 1] = r.cos(), -r.sin()
        a[:, 1, 0], a[:, 1, 1] = r.sin(), r.cos()
    elif op == "ShearX":  # about the top-left corner (PIL's (1, m, 0, 0, 1, 0)): X_in = X + m Y, X = x + W/2
        a[:, 0, 1] = m
        b[:, 0] = m * (height / 2)
    elif op == "ShearY":  # Y_in = Y + m X
        a[:, 1, 0] = m
        b[:, 1] = m * (width / 2)
    elif op == "TranslateX":  # content moves right by m widths: x_in = x - m W
        b[:, 0] = -m * width
    elif op == "TranslateY":
        b[:, 1] = -m * height
    s = torch.full((2,), width / 2, dtype=m.dtype, device=m.device)  # (2,) pixels per unit: x, y
    s[1] = height / 2  # filled in on m's device: no host-to-device copy
    theta = torch.empty(n, 2, 3, dtype=m.dtype, device=m.device)
    theta[:, :, :2] = a * s.view(1, 1, 2) / s.view(1, 2, 1)  # S^-1 A S
    theta[:, :, 2] = b / s  # S^-1 b
    return theta


def apply_image_op(op: str, x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """`op` on images x (n, C, H, W) in [0, 1] with magnitudes m (n,) on x's device."""
    f = m.to(x.dtype).view(-1, 1, 1, 1)
    if op == "Identity":
        return x
    if op == "AutoContrast":
        lo, hi = x.amin(dim=(2, 3), keepdim=True), x.amax(dim=(2, 3), keepdim=True)
        return torch.where(hi > lo, (x - lo) / (hi - lo).clamp_min(1e-6), x)
    # PIL's ImageEnhance: deg + f (x - deg), deg = black / grey / mean luma / smoothed; the view
    # module's colour ops are these same blends
    if op == "Brightness":
        return adjust_brightness(x, m)
    if op == "Color":
        return adjust_saturation(x, m)
    if op == "Contrast":
        return adjust_contrast(x, m)
    if op == "Sharpness":
        deg = _smooth(x)
        return (deg + f * (x - deg)).clamp(0, 1)
    if op in _AFFINE:
        theta = _affine_theta(op, m.to(x.dtype), x.shape[-2], x.shape[-1])
        return warp(x, theta, padding_mode="zeros")  # black fill
    if op == "Posterize":
        shift = (8 - m).to(torch.int32).view(-1, 1, 1, 1)
        q = (x * 255).round().to(torch.int32)
        return ((q >> shift) << shift).to(x.dtype) / 255
    if op == "Solarize":
        return torch.where(x >= f, 1 - x, x)
    if op == "Equalize":
        return _equalize(x)
    raise KeyError(op)


def _pick(x: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """(n, D) features chosen with probability p each, and always at least one per sample."""
    one = F.one_hot(torch.randint(0, x.shape[1], (x.shape[0],), device=x.device), x.shape[1]).bool()
    return (torch.rand_like(x) < p) | one


def apply_vector_op(op: str, x: torch.Tensor, m: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """`op` on vectors x (n, D); `ref` (B, D) is the clean batch whose statistics the ops use."""
    p = m.to(x.dtype).view(-1, 1)
    if op == "Identity":
        return x
    if op == "GaussianNoise":
        return x + p * ref.std(0, unbiased=False) * torch.randn_like(x)
    if op == "Mask":
        return torch.where(_pick(x, p), ref.mean(0).expand_as(x), x)
    if op == "Scale":
        return x * (1 + p * (2 * torch.rand_like(x) - 1))
    if op == "Swap":
        other = ref[torch.randint(0, ref.shape[0], (x.shape[0],), device=x.device)]  # (n, D)
        return torch.where(_pick(x, p), other, x)
    raise KeyError(op)


def _draws_share_rng(device: torch.device) -> bool:
    """Whether the host's RNG is `device`'s: then magnitudes are drawn just before their op runs,
    as the vector ops' own noise is drawn from the same generator (fixed-seed runs keep their
    numbers); elsewhere all are drawn first and reach the device in one copy."""
    return device.type == "cpu"


def composite_views(x: torch.Tensor, lengths: tuple[int, ...], ops: tuple[str, ...],
                    modality: str = "image") -> tuple[torch.Tensor, torch.Tensor]:
    """One composite view per length per sample (Definition 1), and its composition vectors.

    x: (B, *shape). Returns views (L*B, *shape), length-major (the views of lengths[0] first), and
    counts (L*B, len(ops)) float: how often each op was applied (Definition 2; rows sum to l).
    Ops are drawn with replacement and applied in the drawn order. All views of all lengths go
    through the ops together: step k touches the views whose length exceeds k, and within a step
    the views are grouped by op, so a step costs one call per op present. The choices, the
    grouping and the magnitudes are drawn on the host (no device sync); on an accelerator they
    reach it in one copy per call, never one per op.
    """
    b, n_ops = x.shape[0], len(ops)
    image = modality == "image"
    length = torch.tensor(lengths).repeat_interleave(b)  # (N,) length of each view
    n, l_max = length.shape[0], max(lengths)
    choice = torch.randint(0, n_ops, (n, l_max))  # (N, l_max) op ids, host
    active = torch.arange(l_max).view(1, -1) < length.view(-1, 1)  # (N, l_max)
    counts = torch.zeros(n, n_ops)
    counts.scatter_add_(1, choice, active.float())  # (N, n_ops)
    # per step: the views sorted by the op they take, and (op, start, stop) slices of that order
    orders, groups = [], []
    for k in range(l_max):
        step = torch.where(active[:, k], choice[:, k], -1)  # -1: this view is done
        orders.append(torch.argsort(step, stable=True))  # (N,) finished views first, then by op
        sizes = torch.bincount(step + 1, minlength=n_ops + 1).tolist()
        bounds = [sum(sizes[:i + 1]) for i in range(n_ops + 1)]
        groups.append([(ops[i], bounds[i], bounds[i + 1]) for i in range(n_ops)
                       if bounds[i + 1] > bounds[i] and ops[i] != "Identity"])

    def draw(op: str, size: int) -> torch.Tensor:  # (size,) magnitudes; affine ops: (size, 2, 3)
        m = sample_magnitude(op, size)
        return _affine_theta(op, m, x.shape[-2], x.shape[-1]) if image and op in _AFFINE else m

    wanted = [(op, stop - start) for g in groups for op, start, stop in g]  # in the order ops run
    if _draws_share_rng(x.device):
        draws = (draw(op, size) for op, size in wanted)  # lazily: each just before its op runs
        index = orders
    else:  # one packed float64 copy (exact for the int64 indices, counts and float32 draws)
        drawn = [draw(op, size) for op, size in wanted]
        pack = torch.cat([torch.stack(orders).flatten().double(), counts.flatten().double(),
                          *(d.flatten().double() for d in drawn)])
        if x.device.type == "cuda":
            pack = pack.pin_memory()  # an asynchronous copy needs page-locked host memory
        pack = pack.to(x.device, non_blocking=True)
        index = pack[:l_max * n].long().view(l_max, n)  # (l_max, N)
        at = l_max * n
        counts = pack[at:at + counts.numel()].view(n, n_ops)
        at += counts.numel()
        parts = []
        for d in drawn:
            parts.append(pack[at:at + d.numel()].view(d.shape).to(d.dtype))
            at += d.numel()
        draws = iter(parts)
    views = x.repeat(len(lengths), *([1] * (x.dim() - 1)))  # (N, *shape)
    for k in range(l_max):
        out = views.clone()
        affine_idx, affine_theta = [], []  # the affine ops of this step share one grid_sample
        for op, start, stop in groups[k]:
            idx, d = index[k][start:stop].to(x.device), next(draws).to(x.device)
            if image and op in _AFFINE:
                affine_idx.append(idx)
                affine_theta.append(d)
            elif image:
                out[idx] = apply_image_op(op, views[idx], d)
            else:
                out[idx] = apply_vector_op(op, views[idx], d, x)
        if affine_idx:
            idx = torch.cat(affine_idx)
            theta = torch.cat(affine_theta)  # (n, 2, 3) maps
            out[idx] = warp(views[idx], theta, padding_mode="zeros")
        views = out
    return views, counts.to(x.device, torch.float32)
