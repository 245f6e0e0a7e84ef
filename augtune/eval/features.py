"""Features of a whole split, extracted batch by batch on the training device."""
from __future__ import annotations

from typing import Any, Callable, Optional

import torch

from augtune.data.batches import batches, sequential


@torch.no_grad()
def extract_features(
    fn: Callable[[torch.Tensor], torch.Tensor],
    x: Any,
    batch_size: int,
    device: torch.device,
    index: Optional[torch.Tensor] = None,
    workers: int = 0,
) -> torch.Tensor:
    """fn over the rows `index` of x (default: all, in order) in batches on `device`; features come back
    as float32 on the CPU. x: a tensor (uint8 images become float per batch, on the device) or a streamed
    source of image files, decoded ahead in `workers` DataLoader processes."""
    rows = sequential(len(x), batch_size, index)
    return torch.cat([fn(b).float().cpu() for b in batches(x, rows, device, workers)])
