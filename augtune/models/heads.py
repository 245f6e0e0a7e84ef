"""Projector and predictor heads."""
from __future__ import annotations

from torch import nn


def mlp_head(in_dim: int, hidden_dim: int, out_dim: int, norm: str = "batch") -> nn.Sequential:
    """Linear-(BN)-ReLU-Linear: SimCLR's projector (PiNDA B.2: 256 -> 128) and BYOL's predictor."""
    return nn.Sequential(
        nn.Linear(in_dim, hidden_dim),
        nn.BatchNorm1d(hidden_dim) if norm == "batch" else nn.Identity(),
        nn.ReLU(inplace=True),
        nn.Linear(hidden_dim, out_dim),
    )


def projector(in_dim: int, cfg) -> nn.Sequential:
    return mlp_head(in_dim, cfg.proj_hidden_dim, cfg.proj_dim, cfg.norm)


def predictor(cfg) -> nn.Sequential:
    return mlp_head(cfg.proj_dim, cfg.pred_hidden_dim, cfg.proj_dim, cfg.norm)
