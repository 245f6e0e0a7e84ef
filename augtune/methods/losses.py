"""Contrastive losses as pure functions of tensors.

No config objects, no devices, no rank logic except the explicit, optional gather across DDP ranks
and the one gradient all-reduce every optimiser step of a DDP run goes through.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def gather_with_grad(x: torch.Tensor) -> tuple[torch.Tensor, int]:
    """All ranks' rows, concatenated in rank order, with gradients flowing back to each rank's own.

    Returns the gathered tensor and the offset of this rank's rows in it. Without a process group
    this is the identity (offset 0).
    """
    if not _distributed():
        return x, 0
    from torch.distributed.nn.functional import all_gather  # differentiable; works with gloo

    parts = all_gather(x)
    return torch.cat(parts), dist.get_rank() * x.shape[0]


@torch.no_grad()
def gather_no_grad(x: torch.Tensor) -> torch.Tensor:
    """All ranks' rows in rank order, no gradient (MoCo's keys before they enter the queue)."""
    if not _distributed():
        return x
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, x.contiguous())
    return torch.cat(parts)


def nt_xent(z1: torch.Tensor, z2: torch.Tensor, temperature: float, gather: bool = True) -> torch.Tensor:
    """SimCLR's NT-Xent (InfoNCE over 2N views), mean over all 2N anchors.

    z1, z2: (B, D) projections of two views of the same B samples. With ``gather`` and a process
    group, negatives come from every rank (the loss then equals the single-process loss on the
    global batch). For mutually orthogonal, aligned unit embeddings the value is
    log(1 + (2N - 2) exp(-1/t)).
    """
    z1, z2 = F.normalize(z1, dim=1), F.normalize(z2, dim=1)
    offset = 0
    if gather:
        z1_all, offset = gather_with_grad(z1)
        z2_all, _ = gather_with_grad(z2)
    else:
        z1_all, z2_all = z1, z2
    n = z1_all.shape[0]
    keys = torch.cat([z1_all, z2_all])  # (2N, D)
    anchors = torch.cat([z1, z2])  # (2B, D): only this rank's anchors
    logits = anchors @ keys.T / temperature  # (2B, 2N)
    b = z1.shape[0]
    rows = torch.arange(2 * b, device=z1.device)
    own = torch.cat([rows[:b] + offset, rows[:b] + offset + n])  # each anchor's own column
    positive = torch.cat([rows[:b] + offset + n, rows[:b] + offset])  # its other view
    logits = logits.masked_fill(F.one_hot(own, 2 * n).bool(), float("-inf"))
    loss = F.cross_entropy(logits, positive, reduction="sum") / (2 * b)
    return loss


def cosine_regression(p: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """BYOL's loss 2 - 2 cos(p, z), mean over the batch; z is a target (its gradient is stopped)."""
    return (2 - 2 * F.cosine_similarity(p, z.detach(), dim=-1)).mean()


def negative_cosine(p: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """SimSiam's D(p, stopgrad(z)) = -cos(p, z), mean over the batch."""
    return -F.cosine_similarity(p, z.detach(), dim=-1).mean()


def info_nce_queue(q: torch.Tensor, k: torch.Tensor, queue: torch.Tensor, temperature: float) -> torch.Tensor:
    """MoCo's InfoNCE: each query's positive is its key, its negatives the queue.

    q: (B, D) queries, k: (B, D) keys (no gradient), queue: (K, D) normalised negatives.
    """
    q, k = F.normalize(q, dim=1), F.normalize(k.detach(), dim=1)
    pos = (q * k).sum(dim=1, keepdim=True)  # (B, 1)
    neg = q @ queue.detach().T  # (B, K)
    logits = torch.cat([pos, neg], dim=1) / temperature
    return F.cross_entropy(logits, torch.zeros(q.shape[0], dtype=torch.long, device=q.device))


@torch.no_grad()
def allreduce_gradients(params: list[torch.Tensor], world_size: int) -> None:
    """Average gradients over DDP ranks in one flat all-reduce (a missing gradient counts as 0).

    Done by hand rather than by wrapping in DistributedDataParallel: phases leave whole networks
    without gradients, and one flat buffer keeps every rank's reduction identical and in one call.
    """
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= world_size
    offset = 0
    for p in params:
        n = p.numel()
        p.grad = flat[offset:offset + n].view_as(p).clone()
        offset += n
