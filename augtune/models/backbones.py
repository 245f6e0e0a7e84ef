"""Backbones: the encoders whose output features are evaluated.

Every backbone has an ``out_dim`` attribute (the feature size that heads and probes see).
"""
from __future__ import annotations

import math

import torch
from torch import nn


def _norm1d(dim: int, norm: str) -> nn.Module:
    return nn.BatchNorm1d(dim) if norm == "batch" else nn.Identity()


def _norm2d(dim: int, norm: str) -> nn.Module:
    return nn.BatchNorm2d(dim) if norm == "batch" else nn.Identity()


class MLP(nn.Module):
    """PiNDA's non-vision backbone: `num_layers` fully connected layers, hidden 1024, embedding 256.

    The last layer is linear (no norm, no ReLU): its output is the representation that the
    projector consumes and the probes evaluate.
    """

    def __init__(self, in_dim: int, hidden_dim: int = 1024, num_layers: int = 3, out_dim: int = 256,
                 norm: str = "batch"):
        super().__init__()
        layers: list[nn.Module] = []
        dim = in_dim
        for _ in range(num_layers - 1):
            layers += [nn.Linear(dim, hidden_dim), _norm1d(hidden_dim, norm), nn.ReLU(inplace=True)]
            dim = hidden_dim
        layers.append(nn.Linear(dim, out_dim))
        self.net = nn.Sequential(*layers)
        self.out_dim = out_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x.flatten(1))  # (B, D) -> (B, out_dim)


class SmallCNN(nn.Module):
    """A VGG-style CNN for 8x8 to 32x32 inputs that trains in minutes on two CPU cores.

    Blocks of conv3x3-norm-ReLU with widths w, 2w, 4w, 8w; a 2x2 max-pool follows each block while
    the side is at least 4 (8x8 digits get two pools, 28x28 three), then global average pooling.
    """

    def __init__(self, in_channels: int, side: int, width: int = 32, norm: str = "batch"):
        super().__init__()
        layers: list[nn.Module] = []
        c_in = in_channels
        for i in range(4):
            c_out = width * 2**i
            layers += [nn.Conv2d(c_in, c_out, 3, padding=1, bias=norm != "batch"),
                       _norm2d(c_out, norm), nn.ReLU(inplace=True)]
            if side >= 4 and i < 3:
                layers.append(nn.MaxPool2d(2))
                side //= 2
            c_in = c_out
        self.features = nn.Sequential(*layers)
        self.out_dim = c_in

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.features(x).mean(dim=(2, 3))  # (B, C, H, W) -> (B, 8w)


def cifar_resnet(depth: int, in_channels: int, norm: str = "batch") -> nn.Module:
    """torchvision's ResNet with the CIFAR stem: 3x3 stride-1 conv, no max-pool, no classifier."""
    import torchvision

    ctor = {18: torchvision.models.resnet18, 34: torchvision.models.resnet34,
            50: torchvision.models.resnet50}[depth]
    kw = {} if norm == "batch" else {"norm_layer": lambda c: nn.Identity()}
    net = ctor(weights=None, **kw)
    net.conv1 = nn.Conv2d(in_channels, 64, 3, stride=1, padding=1, bias=False)
    net.maxpool = nn.Identity()
    net.out_dim = net.fc.in_features  # 512 for 18/34, 2048 for 50
    net.fc = nn.Identity()
    return net


def resolve_backbone(name: str, modality: str, shape: tuple[int, ...]) -> str:
    """`auto` -> mlp for vectors, cnn for images up to 32 px, resnet18 above."""
    if name != "auto":
        return name
    if modality == "vector":
        return "mlp"
    return "cnn" if max(shape[1:]) <= 32 else "resnet18"


def build_backbone(cfg, modality: str, shape: tuple[int, ...]) -> nn.Module:
    """Backbone for `cfg` (a ModelConfig) on inputs of `shape` (per sample)."""
    name = resolve_backbone(cfg.backbone, modality, shape)
    if name == "mlp":
        return MLP(math.prod(shape), cfg.hidden_dim, cfg.num_layers, cfg.embed_dim, cfg.norm)
    if modality != "image":
        raise ValueError(f"model.backbone: {name} needs image data; this dataset gives vectors (use mlp)")
    if name == "cnn":
        return SmallCNN(shape[0], min(shape[1:]), cfg.width, cfg.norm)
    if name.startswith("resnet"):
        return cifar_resnet(int(name[6:]), shape[0], cfg.norm)
    raise ValueError(f"model.backbone: unknown backbone {name!r}")


def mlp_params(in_dim: int, hidden: int, out: int, norm: str) -> int:
    """Linear(in, hidden) [+ BatchNorm] -> Linear(hidden, out): a head's parameters."""
    return in_dim * hidden + hidden + (2 * hidden if norm == "batch" else 0) + hidden * out + out


def backbone_parameters(cfg, modality: str, shape: tuple[int, ...]) -> tuple[int, int]:
    """(parameters, out_dim) of the backbone `build_backbone(cfg, modality, shape)` builds, counted
    from the config in Python integers (no overflow, nothing allocated): a width of 10^12 is a
    number here, not a 36 TB allocation."""
    name = resolve_backbone(cfg.backbone, modality, shape)
    batch = cfg.norm == "batch"
    if name == "mlp":
        total, dim = 0, math.prod(shape)
        for _ in range(cfg.num_layers - 1):
            total += dim * cfg.hidden_dim + cfg.hidden_dim + (2 * cfg.hidden_dim if batch else 0)
            dim = cfg.hidden_dim
        return total + dim * cfg.embed_dim + cfg.embed_dim, cfg.embed_dim
    if name == "cnn":
        total, c_in = 0, shape[0]
        for i in range(4):
            c_out = cfg.width * 2**i
            total += 9 * c_in * c_out + (2 * c_out if batch else c_out)
            c_in = c_out
        return total, c_in
    if name.startswith("resnet") and modality == "image":  # fixed: counted on the meta device
        with torch.device("meta"):
            net = cifar_resnet(int(name[6:]), shape[0], cfg.norm)
        return sum(p.numel() for p in net.parameters()), net.out_dim
    return 0, 0  # refused by build_backbone with its own message


def model_parameters(cfg, modality: str, shape: tuple[int, ...], predictor: bool = False) -> int:
    """Parameters of the backbone and projector (and, with `predictor`, BYOL's and SimSiam's
    predictor) that `cfg` (a ModelConfig) gives on inputs of `shape`: the networks every method
    builds, counted before any is built (:func:`backbone_parameters`)."""
    total, out_dim = backbone_parameters(cfg, modality, shape)
    total += mlp_params(out_dim, cfg.proj_hidden_dim, cfg.proj_dim, cfg.norm)
    if predictor:
        total += mlp_params(cfg.proj_dim, cfg.pred_hidden_dim, cfg.proj_dim, cfg.norm)
    return total
