"""Batches of training data on the device: compact in memory, float only where the model reads it.

Images are held as uint8 pixel counts (4x smaller than float32) and become float32 in [0, 1] per batch
on the training device, through a 256-entry table of ``v / 255`` rounded to float32 once: the same
numbers as the float32 tensor that used to be held (``np.float32(v) / np.float32(255)``, correctly
rounded), on every device and backend. Float data (vectors, 8x8 digits, a user's float images) pass
through untouched. A streamed source (``imagefolder`` with ``dataset.cache: none``) is not a tensor: it
decodes its batches in ``torch.utils.data.DataLoader`` workers and is asked for them through its own
``batches`` method.
"""
from __future__ import annotations

from typing import Any, Iterable, Iterator

import numpy as np
import torch

_TABLE = torch.from_numpy(np.arange(256, dtype=np.float32) / np.float32(255))  # (256,) exact v / 255
_TABLES: dict[torch.device, torch.Tensor] = {}
_GATHER = 1 << 24  # elements converted at once: bounds the int32 index temporary to 64 MiB


def as_float(x: torch.Tensor) -> torch.Tensor:
    """uint8 pixel counts -> float32 in [0, 1] on x's device; floating tensors are returned as they are."""
    if x.dtype != torch.uint8:
        return x
    table = _TABLES.get(x.device)
    if table is None:
        table = _TABLES.setdefault(x.device, _TABLE.to(x.device))
    if x.numel() <= _GATHER or x.dim() == 0 or len(x) < 2:
        return table[x.int()]  # a gather: exact by construction (int32 indices: half the memory of int64)
    # a whole set: its indices a chunk at a time
    out = torch.empty(x.shape, dtype=torch.float32, device=x.device)
    step = max(1, _GATHER // max(1, x[0].numel()))
    for i in range(0, len(x), step):
        out[i:i + step] = table[x[i:i + step].int()]
    return out


def is_streamed(x: Any) -> bool:
    """Whether `x` is a source read from files batch by batch rather than a tensor in memory."""
    return not isinstance(x, torch.Tensor)


def on_device(x: Any, device: torch.device) -> Any:
    """A tensor moved to `device` (uint8 images: a quarter of the float32 bytes); a streamed source stays."""
    return x if is_streamed(x) else x.to(device)


def batches(
    x: Any, index: Iterable[torch.Tensor], device: torch.device, workers: int = 0
) -> Iterator[torch.Tensor]:
    """The rows ``x[i]`` of each index batch `i` in turn, as float on `device` (images in [0, 1]).

    A tensor is indexed where it lives (move it with :func:`on_device` first to index on the device);
    a streamed source decodes the batches ahead in `workers` DataLoader processes (0: in this one).
    """
    if is_streamed(x):
        yield from x.batches(index, device, workers)
        return
    for i in index:
        yield as_float(x[i.to(x.device)].to(device))


def sequential(n: int, batch_size: int, index: torch.Tensor | None = None) -> list[torch.Tensor]:
    """`index` (default: 0..n-1) cut into consecutive batches of `batch_size` (the last may be short)."""
    index = torch.arange(n) if index is None else index
    return [index[i:i + batch_size] for i in range(0, len(index), batch_size)]
