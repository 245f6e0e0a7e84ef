"""Data sets (a registry of loaders returning train/test data), compact batches and batched view pipelines."""
from augtune.data.batches import as_float, batches, is_streamed, on_device
from augtune.data.datasets import DATASETS, DataError, DataSplit, load_dataset, register
from augtune.data import imagefolder  # noqa: F401  (registers `imagefolder`)
from augtune.data.views import VIEWS, build_view

__all__ = ["DATASETS", "VIEWS", "DataError", "DataSplit", "as_float", "batches", "build_view", "is_streamed",
           "load_dataset", "on_device", "register"]
