"""CoCor's affine ops against two independent references: torchvision's v2 `affine`/`rotate` (the
kernels of torchvision's RandAugment) and PIL's `Image.transform(AFFINE)` (FixMatch's RandAugment), on
square and non-square images, both signs, several magnitudes.

Tolerances. torchvision's tensor kernel with fill=None is the same resampling as ours (grid_sample,
bilinear, align_corners=False, zero padding); only the float32 grid coordinates are computed another
way, so whole images, borders included, agree to the rounding of a coordinate of <= 20 px
(~20 * 6e-8 px), times a bilinear slope <= 1 per px: observed <= 3e-6, asserted 1e-5. A wrong pivot or
aspect moves content by >= 0.1 px and changes pixels by ~0.1-0.5. Borders are convention: with an
explicit fill=0 torchvision blends `mask * img + (1 - mask) * fill`, which multiplies a border pixel
already padded with zeros by its in-image weight again, and PIL clamps its bilinear neighbours at the
edge; those comparisons use the pixels whose four bilinear neighbours all lie inside the image.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torchvision.transforms.v2.functional as TF
from PIL import Image
from torchvision.transforms import InterpolationMode

from augtune.methods import cocor_ops
from augtune.methods.cocor_ops import apply_image_op, composite_views

SHAPES = [(1, 8, 8), (3, 12, 20), (3, 20, 12)]  # (C, H, W): square, wide, tall
SHEARS = [0.03, -0.03, 0.17, -0.17, 0.3, -0.3]  # shear factors, both signs, up to the drawn range's top
ANGLES = [3.0, -3.0, 17.5, -17.5, 30.0, -30.0, 90.0]  # degrees
SHIFTS = [0.03, -0.03, 0.17, -0.17, 0.3, -0.3]  # fractions of the width / height
ATOL = 1e-5  # see the module docstring
BILINEAR = InterpolationMode.BILINEAR


pytestmark = pytest.mark.usefixtures("one_thread")


def _image(shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(1, *shape, generator=g)  # (1, C, H, W) in [0, 1]


def _reference(op: str, x: torch.Tensor, m: float, fill=None) -> torch.Tensor:
    """torchvision's result for `op` with magnitude m in cocor_ops' units (its RandAugment's calls, with
    fractional translations where RandAugment rounds them to whole pixels)."""
    h, w = x.shape[-2:]
    shear = math.degrees(math.atan(m)) if op in ("ShearX", "ShearY") else 0.0
    if op == "Rotate":
        return TF.rotate(x, m, interpolation=BILINEAR, fill=fill)  # counter-clockwise, about the centre
    if op == "ShearX":  # torchvision's RandAugment: shear=[degrees(atan(m)), 0], center=[0, 0]
        return TF.affine(x, angle=0.0, translate=[0.0, 0.0], scale=1.0, shear=[shear, 0.0],
                         interpolation=BILINEAR, fill=fill, center=[0, 0])
    if op == "ShearY":
        return TF.affine(x, angle=0.0, translate=[0.0, 0.0], scale=1.0, shear=[0.0, shear],
                         interpolation=BILINEAR, fill=fill, center=[0, 0])
    if op == "TranslateX":
        return TF.affine(x, angle=0.0, translate=[m * w, 0.0], scale=1.0, shear=[0.0, 0.0],
                         interpolation=BILINEAR, fill=fill)
    if op == "TranslateY":
        return TF.affine(x, angle=0.0, translate=[0.0, m * h], scale=1.0, shear=[0.0, 0.0],
                         interpolation=BILINEAR, fill=fill)
    raise KeyError(op)


def _worst(ops: tuple[str, ...], mags: list[float]) -> tuple[float, str]:
    """The largest |ours - torchvision| over the ops, shapes and magnitudes, and where it is."""
    worst, where = 0.0, ""
    for shape in SHAPES:
        x = _image(shape)
        for op in ops:
            for m in mags:
                err = (apply_image_op(op, x, torch.tensor([m])) - _reference(op, x, m)).abs().max().item()
                if err > worst:
                    worst, where = err, f"{op} m={m} on {shape}"
    return worst, where


def test_shear_pivots_at_the_top_left_corner_as_torchvision_randaugment():
    worst, where = _worst(("ShearX", "ShearY"), SHEARS)
    assert worst < ATOL, where


def test_shear_matches_pil_affine_transform_inside_the_image():
    """FixMatch's ShearX is PIL's img.transform(size, AFFINE, (1, m, 0, 0, 1, 0)): x_in = x + m y with
    pixel centres at (i + 0.5, j + 0.5) from the top-left corner. PIL clamps the bilinear neighbours at
    the edge and fills a point outside the image, so compare where x_in lies in [0.5, W - 0.5]."""
    for shape in SHAPES:
        h, w = shape[1:]
        x = _image(shape, seed=1)[:, :1]  # (1, 1, H, W): PIL's float mode "F" is one channel
        img = Image.fromarray(x[0, 0].numpy(), mode="F")
        yy, xx = np.mgrid[0:h, 0:w] + 0.5  # (H, W) pixel centres
        for m in SHEARS:
            for op, data, src, size in [("ShearX", (1, m, 0, 0, 1, 0), xx + m * yy, w),
                                        ("ShearY", (1, 0, 0, m, 1, 0), yy + m * xx, h)]:
                ref = np.asarray(img.transform((w, h), Image.Transform.AFFINE, data,
                                               resample=Image.Resampling.BILINEAR))
                ours = apply_image_op(op, x, torch.tensor([m]))[0, 0].numpy()
                inside = (src >= 0.5) & (src <= size - 0.5)
                assert inside.sum() > h * w / 2
                assert np.abs(ours - ref)[inside].max() < ATOL, (op, m, shape)


def test_rotate_matches_torchvision_rotate_on_square_and_non_square_images():
    worst, where = _worst(("Rotate",), ANGLES)
    assert worst < ATOL, where


def test_rotation_keeps_pixel_distances_on_non_square_images():
    """A blob 4 px right of the centre of a 12x20 image lands 4 px above it after a 90 degree turn
    (in affine_grid's [-1, 1]^2 square it landed 2.4 px above: 4/10 of the half-width, times 6)."""
    h, w = 12, 20
    rows, cols = torch.meshgrid(torch.arange(h).float(), torch.arange(w).float(), indexing="ij")
    cy, cx = (h - 1) / 2, (w - 1) / 2  # pixel centres' centre
    x = torch.exp(-((rows - cy) ** 2 + (cols - cx - 4) ** 2) / (2 * 0.6 ** 2)).view(1, 1, h, w)
    moves = [(90.0, (-4.0, 0.0)), (-90.0, (4.0, 0.0)), (30.0, (-2.0, 4 * math.cos(math.pi / 6)))]  # (dy, dx)
    for angle, (dy, dx) in moves:
        y = apply_image_op("Rotate", x, torch.tensor([angle]))[0, 0]
        mass = y.sum()
        r, c = (y * rows).sum() / mass, (y * cols).sum() / mass
        assert abs(r - cy - dy) < 0.05 and abs(c - cx - dx) < 0.05, (angle, float(r - cy), float(c - cx))


def test_translate_matches_torchvision_affine_in_pixels():
    """m widths (heights) is m W (m H) pixels; torchvision's RandAugment rounds it to whole pixels."""
    worst, where = _worst(("TranslateX", "TranslateY"), SHIFTS)
    assert worst < ATOL, where


def test_black_fill_matches_torchvision_fill_zero_inside_the_image():
    """With fill=0 torchvision re-weights border pixels by their in-image weight; inside, where all
    four bilinear neighbours exist (a warped all-ones image is 1), it must agree with ours."""
    for shape in SHAPES:
        x = _image(shape, seed=2)
        for op, mags in [("Rotate", ANGLES), ("ShearX", SHEARS), ("ShearY", SHEARS), ("TranslateX", SHIFTS)]:
            for m in mags:
                mt = torch.tensor([m])
                inside = apply_image_op(op, torch.ones_like(x), mt) > 1 - 1e-6  # (1, C, H, W)
                err = (apply_image_op(op, x, mt) - _reference(op, x, m, fill=0.0)).abs()[inside]
                assert err.max() < ATOL, (op, m, shape)


def test_composite_views_affine_path_matches_torchvision(monkeypatch):
    """composite_views batches the affine ops of a step into one grid_sample; it must build the same
    size-aware maps. Magnitudes are pinned so that each view has a known reference."""
    pinned = {"Rotate": [30.0, -17.5, 90.0, -3.0], "ShearX": [0.3, -0.3, 0.17, -0.03],
              "ShearY": [-0.3, 0.3, 0.03, -0.17], "TranslateX": [0.3, -0.17, 0.03, -0.3],
              "TranslateY": [-0.3, 0.17, -0.03, 0.3]}
    for op, mags in pinned.items():
        monkeypatch.setattr(cocor_ops, "sample_magnitude", lambda _op, n, mags=mags: torch.tensor(mags[:n]))
        for shape in SHAPES:
            x = torch.cat([_image(shape, seed=s) for s in range(len(mags))])  # (4, C, H, W)
            views, counts = composite_views(x, (1,), (op,))
            assert counts.sum().item() == len(mags)
            for i, m in enumerate(mags):
                err = (views[i] - _reference(op, x[i:i + 1], m)[0]).abs().max().item()
                assert err < ATOL, (op, m, shape)
