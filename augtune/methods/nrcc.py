"""NRCC (Kumar, Chakrabarty, Mullick and Das): a negative-pair regulariser for clustering, with
SGHMC-generated negatives.

Each step makes a third view ``x^c`` per sample by SGHMC in input space (3.4, eqs. 16-18, Alg. 1):
seed ``s0`` drawn from the batch's augmented views, momentum ``p0 = r0 ~ N(0, I)``, then ``steps``
iterations of ``p <- (1 - d1) p - d2 grad P(s) + d3 r`` and ``s <- s + d2 p`` (eq. 18 moves with
the momentum before its update; ``nrcc.order: momentum_first`` uses the updated one), where
``P(X) = 1 / (1 + cos(g(f(X)), g(f(x_i))))`` and the gradient is taken with respect to the input
through the encoder and projector — the target branch for a momentum base — with no gradient
reaching any weight. The regulariser (5-6) then adds, per anchor and its twin,

    lam * [logsumexp_{j != i} <a_i, c_j> / tau - logsumexp_j <a_i, b_j> / tau]

with a, b, c the normalised projections of the two views and of x^c. Eq. 5 prints the ratio the
other way up; its own gradients (eqs. 10-11: more attraction to b_i, repulsion from the c_j,
less repulsion from the b_j) are those of the form above, which the tests check. For BYOL
(3.6.1, Fig. 4c) a is the online prediction q(z^a), b and c come from the target branch without
the predictor, under stop-gradient; MoCo reads its query and keys the same way. ``negatives:
augment`` takes x^c as an ordinary augmented view of another sample (the "w/o SGHMC" ablation).
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from augtune.methods.base import Augmentation, Batch, Outputs, StepInfo
from augtune.methods.cocor import ieee_fp32


def nrcc_log_ratio(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, tau: float) -> torch.Tensor:
    """(B,) per anchor i: logsumexp_{j != i}(<a_i, c_j>/tau) - logsumexp_j(<a_i, b_j>/tau), raw inner
    products.

    The c-sum leaves out j = i: NRCC's negative pairs are (x_i^a, x_j^c), i != j (Alg. 2 line 10,
    and the j != i sum of eq. 11). Gradient in a_i: sum_{j != i} softmax_c(j) c_j / tau (eq. 11's
    repulsion from the c_j) - softmax_b(i) b_i / tau (eq. 10's extra attraction to b_i)
    - sum_{j != i} softmax_b(j) b_j / tau (eq. 11's reduced repulsion,
    psi'_j = 1 / sum_l exp(<a_i, b_l>/tau)).
    """
    own = torch.eye(a.shape[0], dtype=torch.bool, device=a.device)
    to_c = (a @ c.T / tau).masked_fill(own, float("-inf"))  # (B, B)
    return torch.logsumexp(to_c, dim=1) - torch.logsumexp(a @ b.T / tau, dim=1)


def nrcc_regulariser(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, tau: float) -> torch.Tensor:
    """Eqs. 5-6's regulariser for anchors a against positives' batch b and hard negatives c, mean over
    anchors, on L2-normalised embeddings (B, D) each."""
    return nrcc_log_ratio(F.normalize(a, dim=1), F.normalize(b, dim=1), F.normalize(c, dim=1), tau).mean()


def sghmc(seed: torch.Tensor, density: Callable[[torch.Tensor], torch.Tensor], delta1: float, delta2: float,
          delta3: float, steps: int, order: str = "momentum_first", p0: torch.Tensor | None = None,
          grad_clip: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Alg. 1 on a batch: ``steps`` SGHMC iterations from ``seed`` (B, *shape), no Python loop over samples.

    `density(s)` gives (B,) values P_Omega(s_i), each depending on its own row only; its gradient
    is taken with respect to s alone (autograd.grad: no parameter receives a gradient) and clipped
    element-wise to [-grad_clip, grad_clip] when given (the official code: 1). Both in IEEE float32
    (autocast off, no TF32: `ieee_fp32`): an input gradient of a trained network did not survive
    bf16. On digits after 3 epochs (SimCLR and BYOL, MLP and CNN, 20 batches of 64) bf16 autocast
    gave per-sample cosines with the float64 gradient down to -0.39, and the gradient's part of x^c
    was off by up to 190% (1-9% in the median sample); TF32, emulated, gave cosines down to 0.28. In
    float32 that part is within 1.2e-5 of float64 (tests/test_precision.py). `p0`: the initial
    momentum (default r0 ~ N(0, I), as Alg. 1). ``order``: momentum_first (the official code and
    textbook SGHMC: move with the updated momentum) or paper (eq. 18 as printed: move with the
    momentum before its update, so one step never uses the gradient).

    Returns (x^c, the part of x^c - seed that the density's gradient made): the momentum is linear
    in its inputs, so the displacement splits exactly into a gradient part and a noise part.
    """
    s = seed.detach()
    p = torch.randn_like(s) if p0 is None else p0
    p_grad = torch.zeros_like(s)  # the gradient's share of the momentum ...
    moved_by_grad = torch.zeros_like(s)  # ... and of the displacement
    for j in range(steps):
        if order == "paper" and j == steps - 1:  # eq. 18: the last move needs no new gradient
            return s + delta2 * p, moved_by_grad + delta2 * p_grad
        with torch.enable_grad(), ieee_fp32(s.device):
            x = s.clone().requires_grad_(True)
            (grad,) = torch.autograd.grad(density(x).sum(), x)
        if grad_clip is not None:
            grad = grad.clamp(-grad_clip, grad_clip)
        p_new = (1 - delta1) * p - delta2 * grad + delta3 * torch.randn_like(s)  # eq. 17
        p_grad_new = (1 - delta1) * p_grad - delta2 * grad
        if order == "paper":  # eq. 18: the momentum before its update
            s, moved_by_grad = s + delta2 * p, moved_by_grad + delta2 * p_grad
        else:
            s, moved_by_grad = s + delta2 * p_new, moved_by_grad + delta2 * p_grad_new
        p, p_grad = p_new, p_grad_new
    return s.detach(), moved_by_grad.detach()


class NRCC(Augmentation):
    """NRCC: SGHMC hard negatives x^c and the regulariser of eqs. 5-6 on InfoNCE, BYOL (and MoCo, SimSiam)."""

    name = "nrcc"
    # read in every step (negatives, loss_terms); negatives and order are the ablations' switches
    knobs = ("nrcc.lam", "nrcc.tau", "nrcc.delta1", "nrcc.delta2", "nrcc.delta3", "nrcc.steps",
             "nrcc.grad_clip")
    figures = ("umap",)

    @staticmethod
    def density(objective, x: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
        """Eq. 16 with sim = cosine: s (B, *shape) -> (B,) P(s_i) = 1 / (1 + cos(g(f(s_i)),
        g(f(x_i)))), g(f(.)) the base's target side, whose gradient SGHMC follows; g(f(x)) of the
        clean samples is computed once, at the first call (so in SGHMC's precision)."""
        g = objective.target_network
        anchor: list[torch.Tensor] = []

        def density(s: torch.Tensor) -> torch.Tensor:
            if not anchor:
                with torch.no_grad():
                    anchor.append(F.normalize(g(x), dim=1))  # (B, D)
            return 1.0 / (1.0 + (F.normalize(g(s), dim=1) * anchor[0]).sum(dim=1))

        return density

    def negatives(self, batch: Batch, method) -> torch.Tensor:
        """x^c for every sample: SGHMC from a random view of the batch, or (augment) a random view."""
        views = torch.cat(batch.views[:2])  # (2B, *shape): the seeds' pool, Alg. 1 line 1
        b = batch.x.shape[0]
        pick = torch.randint(0, 2 * b, (b,), device=views.device)
        c = self.cfg.nrcc
        if c.negatives == "augment":
            return views[pick]
        objective = method.objective
        was_training = objective.training
        objective.eval()  # BatchNorm on running statistics: each sample's density depends on it alone
        density = self.density(objective, batch.x)
        try:
            out, by_grad = sghmc(views[pick], density, c.delta1, c.delta2, c.delta3, c.steps, c.order,
                                 grad_clip=c.grad_clip)
        finally:
            objective.train(was_training)
        # how much of x^c's move the density's gradient made (the rest is SGHMC's noise): per sample
        # ||gradient part|| / ||x^c - seed||; ~1e-5 in the official setting, where x^c is a noisy view
        moved = (out - views[pick]).flatten(1).norm(dim=1)
        self.meter.add("grad_share", (by_grad.flatten(1).norm(dim=1) / moved.clamp_min(1e-12)).mean())
        return out

    def loss_terms(self, batch: Batch, out: Outputs, method, info: StepInfo) -> dict[str, torch.Tensor]:
        c = self.cfg.nrcc
        xc = self.negatives(batch, method)
        # Fig. 4c: x^c and the positives b on the target side (BYOL's target branch without predictor,
        # SimSiam's stop-gradient projections, SimCLR's own), anchors a = q(z^a) where there is a predictor
        zc = method.objective.target_embed(xc, info)
        (a1, a2), (b2, b1) = out.anchors, out.targets
        reg = nrcc_regulariser(a1, b1, zc, c.tau) + nrcc_regulariser(a2, b2, zc, c.tau)  # l_a and its b-twin
        # how close x_i^c lands to x_i's own view (eq. 16 pulls it there): mean cos(z^c_i, z^b_i)
        self.meter.add("cos_c_b", F.cosine_similarity(zc.detach().float(), b1.detach().float(), dim=1).mean())
        return {"nrcc": c.lam * reg}
