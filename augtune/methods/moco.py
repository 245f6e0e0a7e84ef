"""MoCo v2 (Chen et al., 2020): momentum key encoder and a FIFO queue of negatives."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from augtune.methods.base import Encoder, MomentumObjective, Outputs, StepInfo
from augtune.methods.losses import gather_no_grad, info_nce_queue


class MoCo(MomentumObjective):
    name = "moco"
    knobs = ("train.temperature",)
    default_momentum = 0.99  # MoCo uses 0.999 over ~500k ImageNet steps; short runs need 0.99

    def __init__(self, encoder: Encoder, cfg):
        super().__init__(encoder, cfg)
        dim, size = cfg.model.proj_dim, cfg.method.queue_size
        # Random unit vectors to start, as MoCo does; they are flushed after `size` keys.
        self.register_buffer("queue", F.normalize(torch.randn(size, dim), dim=1))  # (K, D)
        self.register_buffer("queue_ptr", torch.zeros((), dtype=torch.long))

    @torch.no_grad()
    def enqueue(self, keys: torch.Tensor) -> None:
        """Write keys (all ranks' in rank order) at the pointer, oldest entries first out."""
        keys = gather_no_grad(F.normalize(keys, dim=1))
        size = self.queue.shape[0]
        keys = keys[-size:]  # a batch larger than the queue keeps its newest keys
        slots = (self.queue_ptr + torch.arange(keys.shape[0], device=keys.device)) % size
        self.queue[slots] = keys.to(self.queue.dtype)
        self.queue_ptr.copy_((self.queue_ptr + keys.shape[0]) % size)

    def loss(self, v1: torch.Tensor, v2: torch.Tensor, info: StepInfo) -> tuple[torch.Tensor, Outputs]:
        q1, q2 = self.embed(v1, info), self.embed(v2, info)
        k1, k2 = self.target_embed(v1), self.target_embed(v2)
        tau = self.cfg.train.temperature
        queue = self.queue.clone()  # the negatives of this step; enqueue below writes in place
        loss = info_nce_queue(q1, k2, queue, tau) + info_nce_queue(q2, k1, queue, tau)  # symmetrised
        if self.training:  # k1 then k2, each gathered in rank order: the order one process would use
            self.enqueue(k1)
            self.enqueue(k2)
        return loss, Outputs(projections=(q1, q2), targets=(k1, k2))
