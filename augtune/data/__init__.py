"""Data sets (a registry of loaders returning train/test tensors) and batched view pipelines."""
from augtune.data.datasets import DATASETS, DataError, DataSplit, load_dataset, register
from augtune.data.views import VIEWS, build_view

__all__ = ["DATASETS", "VIEWS", "DataError", "DataSplit", "build_view", "load_dataset", "register"]
