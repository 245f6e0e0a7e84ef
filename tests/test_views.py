"""Batched views: shapes, ranges, reproducibility, and the mathematics of each op. Tiny, CPU, seeded."""
import math

import pytest
import torch

from augtune.config import ViewConfig
from augtune.data.views import (
    VIEWS, IdentityView, NoiseView, SimCLRView, adjust_brightness, adjust_contrast, adjust_hue,
    adjust_saturation, blur_kernel_size, build_view, crop_theta, gaussian_blur, luma, resized_crop,
    sample_crop, to_grayscale, warp,
)

ALL_OFF = dict(crop_scale=(1.0, 1.0), flip_p=0.0, jitter_p=0.0, gray_p=0.0, blur_p=0.0)
ALL_ON = dict(crop_scale=(0.2, 1.0), flip_p=0.5, jitter=0.4, hue=0.1, jitter_p=1.0, gray_p=0.5, blur_p=0.5)


def images(b=8, c=3, h=12, w=12, seed=0, dtype=torch.float32):
    return torch.rand(b, c, h, w, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def views_and_inputs():
    """(name, view, input) for every registered view, on the modality it fits."""
    img, vec = images(), torch.randn(8, 5, generator=torch.Generator().manual_seed(1))
    out = []
    for name, cls in VIEWS.items():
        x = img if "image" in cls.modalities else vec
        modality = "image" if x.dim() == 4 else "vector"
        cfg = ViewConfig(name=name, **(ALL_ON if name == "simclr" else {}))
        out.append((name, build_view(cfg, modality, tuple(x.shape[1:])), x))
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_every_view_keeps_shape_dtype_device(dtype):
    for name, view, x in views_and_inputs():
        x = x.to(dtype)
        y = view(x)
        assert y.shape == x.shape and y.dtype == x.dtype and y.device == x.device, name
        if x.dim() == 4:
            assert y.min() >= 0 and y.max() <= 1, name


@pytest.mark.parametrize("c,size", [(1, 8), (1, 28), (3, 32), (3, 17)])
def test_simclr_stays_in_unit_range(c, size):
    torch.manual_seed(0)
    y = SimCLRView(**ALL_ON)(images(16, c, size, size))
    assert y.shape == (16, c, size, size) and y.min() >= 0 and y.max() <= 1


def test_simclr_half_precision_keeps_dtype():
    torch.manual_seed(0)
    x = images(4).to(torch.bfloat16)
    assert SimCLRView(**ALL_ON)(x).dtype == torch.bfloat16


def test_identity_is_exact():
    x = images()
    assert IdentityView()(x) is x


def test_same_seed_same_output():
    for name, view, x in views_and_inputs():
        torch.manual_seed(3)
        a = view(x)
        torch.manual_seed(3)
        b = view(x)
        assert torch.equal(a, b), name


def test_samples_get_their_own_parameters():
    torch.manual_seed(0)
    x = images(1).expand(6, -1, -1, -1).contiguous()  # six copies of one image
    y = SimCLRView()(x).flatten(1)
    distance = torch.cdist(y, y) + torch.eye(6) * 1e9
    assert distance.min() > 1e-3
    z = VIEWS["noise"](noise_std=1.0)(torch.zeros(6, 5))
    assert (torch.cdist(z, z) + torch.eye(6) * 1e9).min() > 1e-3


def test_works_with_and_without_grad():
    x = images(4).requires_grad_(True)
    y = SimCLRView(**ALL_ON)(x)
    y.sum().backward()  # differentiable, though no view needs it
    assert x.grad is not None and x.grad.shape == x.shape
    with torch.no_grad():
        assert SimCLRView(**ALL_ON)(x).shape == x.shape
        assert NoiseView(0.5, 0.2)(torch.randn(3, 4, requires_grad=True)).shape == (3, 4)


# --- geometry --------------------------------------------------------------------------------------

def test_full_crop_without_flip_is_identity():
    torch.manual_seed(0)
    x = images(8, 3, 9, 11)  # aspect 11/9 is inside [3/4, 4/3]; wider images get a ratio-clamped crop
    assert torch.allclose(SimCLRView(**ALL_OFF)(x), x, atol=1e-5)


def test_flip_is_exact_mirror():
    torch.manual_seed(0)
    x = images(8, 1, 8, 8)
    y = SimCLRView(**{**ALL_OFF, "flip_p": 1.0})(x)
    assert torch.allclose(y, torch.flip(x, dims=[-1]), atol=1e-5)


def test_crop_box_lands_where_it_says():
    # On an image that is linear in the column position, bilinear resampling is exact, so the output
    # must be the ramp between the box edges: checks centre, width, and the align_corners convention.
    w = 16
    ramp = ((torch.arange(w) + 0.5) / w).expand(2, 1, w, w)
    box = torch.tensor([[0.5, 0.5, 0.5, 0.5], [0.4, 0.6, 0.25, 0.25]])  # (cx, cy, w, h) fractions
    y = resized_crop(ramp, box)
    for i, (cx, _, bw, _) in enumerate(box.tolist()):
        expected = cx - bw / 2 + bw * (torch.arange(w) + 0.5) / w
        assert torch.allclose(y[i, 0, 0], expected, atol=1e-5)


def test_sample_crop_follows_scale_and_ratio():
    torch.manual_seed(0)
    x = torch.empty(0)
    box = sample_crop(4000, (0.3, 0.6), (3 / 4, 4 / 3), 20, 10, x)
    cx, cy, w, h = box.unbind(1)
    area, ratio = w * h, (w * 10) / (h * 20)  # ratio in pixels
    assert area.min() >= 0.3 - 1e-5 and area.max() <= 0.6 + 1e-5
    assert ratio.min() >= 3 / 4 - 1e-4 and ratio.max() <= 4 / 3 + 1e-4
    assert (cx - w / 2).min() >= 0 and (cx + w / 2).max() <= 1 + 1e-6
    assert (cy - h / 2).min() >= 0 and (cy + h / 2).max() <= 1 + 1e-6
    w, h = sample_crop(4000, (0.1, 0.5), (3 / 4, 4 / 3), 8, 8, x)[:, 2:].unbind(1)
    assert abs((w * h).mean().item() - 0.3) < 0.01  # every draw fits: area uniform in scale
    assert abs(torch.log(w / h).mean().item()) < 0.01  # log-uniform ratio, symmetric about 1


def test_warp_identity_theta():
    x = images(2, 3, 5, 7)
    theta = crop_theta(torch.tensor([[0.5, 0.5, 1.0, 1.0]] * 2))
    assert torch.allclose(warp(x, theta), x, atol=1e-6)


# --- colour -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("c", [1, 3])
def test_colour_ops_at_strength_zero_are_identity(c):
    x = images(4, c)
    ones = torch.ones(4)
    assert torch.equal(adjust_brightness(x, ones), x)
    assert torch.equal(adjust_contrast(x, ones), x)
    assert torch.equal(adjust_saturation(x, ones), x)
    assert torch.allclose(adjust_hue(x, torch.zeros(4)), x, atol=1e-6)
    torch.manual_seed(0)
    view = SimCLRView(**{**ALL_OFF, "jitter_p": 1.0, "jitter": 0.0, "hue": 0.0})
    assert torch.allclose(view(x), x, atol=1e-5)


def test_colour_op_limits():
    x = images(4)
    flat = adjust_contrast(x, 0.0)
    assert torch.allclose(flat, luma(x).mean((1, 2, 3), keepdim=True).expand_as(x), atol=1e-6)
    assert torch.allclose(adjust_saturation(x, 0.0), to_grayscale(x), atol=1e-6)
    assert torch.equal(adjust_brightness(x, 0.0), torch.zeros_like(x))
    per_sample = adjust_brightness(x, torch.tensor([0.5, 1.0, 1.0, 1.0]))  # factors are per sample
    assert torch.allclose(per_sample[0], x[0] * 0.5) and torch.equal(per_sample[1:], x[1:])


def test_grayscale_has_equal_channels():
    x = images(4)
    g = to_grayscale(x)
    assert torch.equal(g[:, 0], g[:, 1]) and torch.equal(g[:, 1], g[:, 2])
    torch.manual_seed(0)
    y = SimCLRView(**{**ALL_OFF, "gray_p": 1.0})(x)
    assert torch.allclose(y[:, 0], y[:, 1]) and torch.allclose(y[:, 1], y[:, 2])
    one = images(4, 1)
    assert torch.equal(to_grayscale(one), one)
    assert torch.equal(adjust_saturation(one, 0.0), one) and torch.equal(adjust_hue(one, 0.3), one)


def test_hue_keeps_luma_is_periodic_and_moves_red_to_green():
    x = 0.4 + 0.2 * images(4)  # pale colours: no clamping, so luma is kept exactly
    shift = torch.tensor([0.1, -0.25, 0.4, 0.5])
    y = adjust_hue(x, shift)
    assert (y - x).abs().max() > 0.01
    assert torch.allclose(luma(y), luma(x), atol=1e-5)
    assert torch.allclose(adjust_hue(x, shift + 1), y, atol=1e-5)
    assert torch.allclose(adjust_hue(adjust_hue(x, shift), -shift), x, atol=1e-5)
    red = torch.tensor([0.8, 0.2, 0.2]).view(1, 3, 1, 1)
    assert adjust_hue(red, 0.05)[0, 1] > red[0, 1]  # same direction as torchvision's HSV shift


# --- blur -------------------------------------------------------------------------------------------

def total_variation(x):
    return (x[..., 1:, :] - x[..., :-1, :]).abs().sum() + (x[..., :, 1:] - x[..., :, :-1]).abs().sum()


def test_blur_smooths_and_keeps_flat_images():
    idx = torch.arange(24) // 3
    board = ((idx[:, None] + idx[None, :]) % 2).float().expand(3, 1, 24, 24)  # 3-px squares
    sigma = torch.tensor([0.5, 1.0, 2.0])
    tv0 = total_variation(board[0])
    for y in (gaussian_blur(board, sigma), gaussian_blur(board, sigma, (9, 9))):
        tv = [total_variation(y[i]) for i in range(3)]
        assert tv[2] < tv[1] < tv[0] < tv0  # more sigma, smoother
        assert torch.allclose(y.mean((1, 2, 3)), board.mean((1, 2, 3)), atol=0.02)
    flat = torch.full((2, 3, 10, 10), 0.3)
    assert torch.allclose(gaussian_blur(flat, torch.tensor([0.1, 2.0])), flat, atol=1e-6)
    assert torch.allclose(gaussian_blur(board, 0.05), board, atol=1e-6)  # tiny sigma: a delta
    assert [blur_kernel_size(s) for s in (8, 28, 32, 96, 224)] == [3, 3, 3, 9, 23]


# --- vectors and building -------------------------------------------------------------------------

def test_noise_has_the_configured_std():
    torch.manual_seed(0)
    x = torch.randn(2000, 16)
    d = build_view(ViewConfig(name="noise", noise_std=0.5), "vector", (16,))(x) - x
    assert abs(d.std().item() - 0.5) < 0.01 and abs(d.mean().item()) < 0.01


def test_mask_zeroes_the_configured_fraction():
    torch.manual_seed(0)
    x = torch.ones(2000, 16)
    y = build_view(ViewConfig(name="mask", mask_p=0.3), "vector", (16,))(x)
    assert set(y.unique().tolist()) == {0.0, 1.0}
    assert abs((y == 0).float().mean().item() - 0.3) < 0.01


def test_noise_mask_masks_then_adds_noise():
    torch.manual_seed(0)
    x = torch.full((4000, 8), 3.0)
    y = build_view(ViewConfig(name="noise_mask", mask_p=0.25, noise_std=0.1), "vector", (8,))(x)
    masked = y.abs() < 1.5  # noise on a zeroed entry stays near 0, on a kept one near 3
    assert abs(masked.float().mean().item() - 0.25) < 0.01
    assert abs(y[masked].std().item() - 0.1) < 0.01 and abs(y[~masked].std().item() - 0.1) < 0.01


def test_build_view_resolves_auto_and_refuses_misfits():
    assert type(build_view(ViewConfig(), "image", (3, 32, 32))) is SimCLRView
    assert type(build_view(ViewConfig(), "vector", (64,))) is NoiseView
    assert type(build_view(ViewConfig(name="identity"), "vector", (64,))) is IdentityView
    cfg = build_view(ViewConfig(crop_scale=(0.5, 0.9), blur_p=0.3), "image", (1, 8, 8))
    assert cfg.crop_scale == (0.5, 0.9) and cfg.blur_p == 0.3
    with pytest.raises(ValueError, match="simclr"):
        build_view(ViewConfig(name="simclr"), "vector", (64,))
    with pytest.raises(ValueError, match="noise"):
        build_view(ViewConfig(name="noise"), "image", (3, 8, 8))
    with pytest.raises(ValueError, match="C = 1 or 3"):
        build_view(ViewConfig(), "image", (2, 8, 8))
    with pytest.raises(ValueError, match="modality"):
        build_view(ViewConfig(), "graph", (8,))


def test_simclr_batch_is_fast_enough_to_run():
    # Timing is reported by benchmarks/views.py; here only that a CIFAR-sized batch goes through.
    torch.manual_seed(0)
    x = torch.rand(256, 3, 32, 32)
    y = SimCLRView()(x)
    assert y.shape == x.shape and not torch.isnan(y).any()
    assert math.isfinite(y.sum().item())
