"""NRCC (Maji et al.): a negative-pair regulariser for clustering, with SGHMC-generated negatives.

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

from augtune.methods.base import Augmentation, Batch, MomentumObjective, StepInfo


def nrcc_log_ratio(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, tau: float) -> torch.Tensor:
    """(B,) per anchor i: logsumexp_{j != i}(<a_i, c_j>/tau) - logsumexp_j(<a_i, b_j>/tau), raw inner products.

    The c-sum leaves out j = i: NRCC's negative pairs are (x_i^a, x_j^c), i != j (Alg. 2 line 10,
    and the j != i sum of eq. 11). Gradient in a_i: sum_{j != i} softmax_c(j) c_j / tau (eq. 11's
    repulsion from the c_j) - softmax_b(i) b_i / tau (eq. 10's extra attraction to b_i)
    - sum_{j != i} softmax_b(j) b_j / tau (eq. 11's reduced repulsion, psi'_j = 1 / sum_l exp(<a_i, b_l>/tau)).
    """
    own = torch.eye(a.shape[0], dtype=torch.bool, device=a.device)
    to_c = (a @ c.T / tau).masked_fill(own, float("-inf"))  # (B, B)
    return torch.logsumexp(to_c, dim=1) - torch.logsumexp(a @ b.T / tau, dim=1)


def nrcc_regulariser(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, tau: float) -> torch.Tensor:
    """Eqs. 5-6's regulariser for anchors a against positives' batch b and hard negatives c, mean over
    anchors, on L2-normalised embeddings (B, D) each."""
    return nrcc_log_ratio(F.normalize(a, dim=1), F.normalize(b, dim=1), F.normalize(c, dim=1), tau).mean()


def sghmc(seed: torch.Tensor, density: Callable[[torch.Tensor], torch.Tensor], delta1: float, delta2: float,
          delta3: float, steps: int, order: str = "paper", p0: torch.Tensor | None = None) -> torch.Tensor:
    """Alg. 1 on a batch: ``steps`` SGHMC iterations from ``seed`` (B, *shape), no Python loop over samples.

    `density(s)` gives (B,) values P_Omega(s_i), each depending on its own row only; its gradient
    is taken with respect to s alone (autograd.grad: no parameter receives a gradient). `p0`: the
    initial momentum (default r0 ~ N(0, I), as Alg. 1).
    """
    s = seed.detach()
    p = torch.randn_like(s) if p0 is None else p0
    for j in range(steps):
        if order == "paper" and j == steps - 1:
            return s + delta2 * p  # eq. 18: the last move needs no new gradient (with steps 1, none at all)
        with torch.enable_grad():
            x = s.clone().requires_grad_(True)
            (grad,) = torch.autograd.grad(density(x).sum(), x)
        p_new = (1 - delta1) * p - delta2 * grad + delta3 * torch.randn_like(s)  # eq. 17
        s = s + delta2 * (p if order == "paper" else p_new)  # eq. 18: the momentum before its update
        p = p_new
    return s.detach()


class NRCC(Augmentation):
    """NRCC: SGHMC hard negatives x^c and the regulariser of eqs. 5-6 on InfoNCE, BYOL (and MoCo, SimSiam)."""

    name = "nrcc"
    figures = ("umap",)

    def __init__(self, cfg, data):
        super().__init__(cfg, data)
        self._dist: list[torch.Tensor] = []

    @staticmethod
    def _branch(objective) -> Callable[[torch.Tensor], torch.Tensor]:
        """g(f(.)) whose gradient SGHMC follows: the target branch of a momentum base, else the online."""
        if isinstance(objective, MomentumObjective):
            return lambda x: objective.target_projector(objective.target_encoder(x))
        return lambda x: objective.projector(objective.encoder(x))

    def negatives(self, batch: Batch, method) -> torch.Tensor:
        """x^c for every sample: SGHMC from a random view of the batch, or (augment) a random view."""
        views = torch.cat(batch.views[:2])  # (2B, *shape): the seeds' pool, Alg. 1 line 1
        b = batch.x.shape[0]
        pick = torch.randint(0, 2 * b, (b,), device=views.device)
        c = self.cfg.nrcc
        if c.negatives == "augment":
            return views[pick]
        objective = method.objective
        g = self._branch(objective)
        was_training = objective.training
        objective.eval()  # BatchNorm on running statistics: each sample's density depends on it alone
        anchor: list[torch.Tensor] = []  # g(f(x_i)) of the clean samples, computed when first needed

        def density(s: torch.Tensor) -> torch.Tensor:  # eq. 16 with sim = cosine
            if not anchor:
                with torch.no_grad():
                    anchor.append(F.normalize(g(batch.x), dim=1))  # (B, D)
            return 1.0 / (1.0 + (F.normalize(g(s), dim=1) * anchor[0]).sum(dim=1))

        try:
            out = sghmc(views[pick], density, c.delta1, c.delta2, c.delta3, c.steps, c.order)
        finally:
            objective.train(was_training)
        return out

    def loss_terms(self, batch: Batch, out: dict, method, info: StepInfo) -> dict[str, torch.Tensor]:
        c = self.cfg.nrcc
        xc = self.negatives(batch, method)
        objective = method.objective
        if isinstance(objective, MomentumObjective):  # Fig. 4c: target branch, no predictor, stop-gradient
            zc = objective.target_project(xc)
            b1, b2 = out["t2"], out["t1"]
        else:
            zc = objective.project(xc, info)
            b1, b2 = out["z2"], out["z1"]
            if "p1" in out:  # SimSiam: its z's are targets under stop-gradient
                zc, b1, b2 = zc.detach(), b1.detach(), b2.detach()
        a1, a2 = out.get("p1", out["z1"]), out.get("p2", out["z2"])  # q(z^a) where there is a predictor
        reg = nrcc_regulariser(a1, b1, zc, c.tau) + nrcc_regulariser(a2, b2, zc, c.tau)  # l_a and its b-twin
        with torch.no_grad():  # how close x_i^c lands to x_i's own view (eq. 16 pulls it there): a diagnostic
            self._dist.append(F.cosine_similarity(zc.float(), b1.float(), dim=1).mean())
        return {"nrcc": c.lam * reg}

    def on_epoch_start(self, method, info: StepInfo) -> None:
        self._dist = []

    def epoch_metrics(self) -> dict[str, float]:
        if not self._dist:
            return {}
        return {"nrcc_cos_c_b": float(torch.stack(self._dist).mean())}  # mean cos(z^c_i, z^b_i)
