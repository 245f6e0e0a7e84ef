"""Label-free scores of an embedding: what selects a configuration when the data has no labels.

- ``rankme`` (Garrido et al., ICML 2023, eq. 1): the effective rank exp(H(p)) of the embedding matrix,
  p_k = sigma_k / ||sigma||_1 + eps over its singular values; between 1 and min(N, D); higher is better
  (a collapsed embedding has rank ~1). The paper shows that choosing hyperparameters by it loses little
  against choosing by a labelled probe on ImageNet; `benchmarks/label_free.py` measures what holds here.
- ``alignment`` and ``uniformity`` (Wang & Isola, ICML 2020, eqs. 4 and 5) of the L2-normalised
  features: alignment E||f(x) - f(x+)||^alpha over positive pairs (two views of one sample), uniformity
  log E exp(-t ||f(x) - f(y)||^2) over distinct samples. Both are lower-is-better.

Each is computed on at most ``samples`` rows, the same seeded subsample for every run that scores the
same split (seed 0, never the run's seed), so that the scores of the trials of a search are comparable:
the effective rank in particular grows with the number of rows until it reaches the dimension.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch

from augtune.records import LOWER_IS_BETTER  # noqa: F401 (in augtune.records: the analysis needs no torch)

RANKME_EPS = 1e-7  # the paper's epsilon (its official snippet)


def subsample(n: int, samples: Optional[int]) -> Optional[torch.Tensor]:
    """The rows scored of `n` (sorted, seed 0: the same rows for every run); None: all of them."""
    if samples is None or n <= samples:
        return None
    g = torch.Generator().manual_seed(0)
    return torch.randperm(n, generator=g)[:samples].sort().values


def rankme(z: torch.Tensor, eps: float = RANKME_EPS) -> float:
    """The effective rank of the (N, D) embedding `z` (RankMe, Garrido et al. 2023, eq. 1)."""
    z = torch.as_tensor(z).detach().to(torch.float64)
    if z.ndim != 2 or z.shape[0] == 0:
        raise ValueError(f"rankme: expected a non-empty (N, D) embedding, got shape {tuple(z.shape)}")
    s = torch.linalg.svdvals(z)
    if float(s.sum()) == 0.0:  # an all-zero embedding: no direction at all
        return 1.0
    p = s / s.sum() + eps
    return float(torch.exp(-(p * torch.log(p)).sum()))


def _normalised(z: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.normalize(torch.as_tensor(z).detach().to(torch.float64), dim=1)


def alignment(a: torch.Tensor, b: torch.Tensor, alpha: float = 2.0) -> float:
    """Wang & Isola's alignment of positive pairs (row i of `a` with row i of `b`), lower is better."""
    if a.shape != b.shape or a.ndim != 2:
        raise ValueError(f"alignment: expected two (N, D) embeddings of one shape, got {tuple(a.shape)} "
                         f"and {tuple(b.shape)}")
    return float((_normalised(a) - _normalised(b)).norm(dim=1).pow(alpha).mean())


def uniformity(z: torch.Tensor, t: float = 2.0) -> float:
    """Wang & Isola's uniformity over the distinct pairs of rows of `z`, lower is better."""
    z = _normalised(z)
    if len(z) < 2:
        raise ValueError("uniformity: needs at least two samples")
    return float(torch.pdist(z, p=2).pow(2).mul(-t).exp().mean().log())



def label_free_scores(names, held: torch.Tensor, *, samples: Optional[int] = None,
                      pairs: Optional[Callable[[Optional[torch.Tensor]], tuple]] = None) -> dict[str, float]:
    """The label-free `names` (output names) of the held-out features `held`, on their fixed subsample;
    `pairs(rows)` gives the features of two views of those rows (alignment)."""
    held = torch.as_tensor(held)
    rows = subsample(len(held), samples)
    z = held if rows is None else held[rows.to(held.device)]
    out: dict[str, float] = {}
    if "rankme" in names:
        out["rankme"] = rankme(z)
    if "uniformity" in names:
        out["uniformity"] = uniformity(z)
    if "alignment" in names:
        if pairs is None:
            raise ValueError("alignment: needs the features of two views of each sample")
        a, b = pairs(rows)
        out["alignment"] = alignment(a, b)
    return out
