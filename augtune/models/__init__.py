"""Backbones (MLP, small CNN, CIFAR-style ResNets) and heads."""
from augtune.models.backbones import MLP, SmallCNN, build_backbone, cifar_resnet, resolve_backbone
from augtune.models.heads import mlp_head, predictor, projector

__all__ = ["MLP", "SmallCNN", "build_backbone", "cifar_resnet", "resolve_backbone", "mlp_head",
           "predictor", "projector"]
