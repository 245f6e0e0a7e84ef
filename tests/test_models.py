"""Backbones and heads: shapes, feature sizes, the CIFAR stem."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from augtune.config import from_dict
from augtune.models import MLP, SmallCNN, build_backbone, cifar_resnet, projector, resolve_backbone


def test_mlp_is_pindas_three_layers_to_256():
    net = MLP(64)
    linears = [m for m in net.modules() if isinstance(m, nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(64, 1024), (1024, 1024), (1024, 256)]
    assert net(torch.randn(5, 64)).shape == (5, 256)


@pytest.mark.parametrize("side", [8, 28, 32])
def test_small_cnn_handles_small_images(side):
    net = SmallCNN(1 if side < 32 else 3, side, width=8)
    x = torch.randn(2, net.features[0].in_channels, side, side)
    assert net(x).shape == (2, net.out_dim) == (2, 64)


def test_cifar_resnet_has_3x3_stem_and_no_maxpool():
    net = cifar_resnet(18, 3)
    assert net.conv1.kernel_size == (3, 3) and net.conv1.stride == (1, 1)
    assert isinstance(net.maxpool, nn.Identity) and net.out_dim == 512
    net.eval()
    assert net(torch.randn(1, 3, 32, 32)).shape == (1, 512)


def test_auto_backbone_and_projector_sizes():
    assert resolve_backbone("auto", "vector", (64,)) == "mlp"
    assert resolve_backbone("auto", "image", (1, 28, 28)) == "cnn"
    assert resolve_backbone("auto", "image", (3, 96, 96)) == "resnet18"
    cfg = from_dict({})
    head = projector(256, cfg.model)
    assert head(torch.randn(4, 256)).shape == (4, 128)  # PiNDA B.2: 256 -> 128
    with pytest.raises(ValueError, match="needs image data"):
        build_backbone(from_dict({"model": {"backbone": "cnn"}}).model, "vector", (64,))


def test_norm_none_has_no_batchnorm():
    net = build_backbone(from_dict({"model": {"norm": "none", "backbone": "cnn"}}).model, "image", (1, 8, 8))
    assert not any(isinstance(m, nn.BatchNorm2d) for m in net.modules())
