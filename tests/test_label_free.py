"""The label-free scores (augtune/eval/label_free.py): RankMe against its closed form and a slow reference
written out from the paper, alignment and uniformity against Wang & Isola's definitions, and the fixed
subsample that makes the trials of a search comparable."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from augtune.config import EvalConfig
from augtune.eval import evaluate
from augtune.eval.label_free import RANKME_EPS, alignment, label_free_scores, rankme, subsample, uniformity


def _with_singular_values(s: np.ndarray, n: int, d: int, seed: int) -> torch.Tensor:
    """An (n, d) matrix U diag(s) V^T with random orthonormal U, V: its singular values are exactly s."""
    rng = np.random.default_rng(seed)
    u, _ = np.linalg.qr(rng.standard_normal((n, len(s))))
    v, _ = np.linalg.qr(rng.standard_normal((d, len(s))))
    return torch.from_numpy(u @ np.diag(s) @ v.T)


def _rankme_reference(z: np.ndarray) -> float:
    """Garrido et al. 2023, eq. 1, term by term: p_k = sigma_k / ||sigma||_1 + eps, exp(-sum p_k log p_k)."""
    sigma = np.linalg.svd(z, compute_uv=False)
    total = sum(abs(x) for x in sigma)
    entropy = 0.0
    for x in sigma:
        p = x / total + RANKME_EPS
        entropy -= p * math.log(p)
    return math.exp(entropy)


@pytest.mark.parametrize("k", [1, 2, 5, 16])
def test_rankme_of_k_equal_singular_values_is_k(k):
    for seed in range(5):
        z = _with_singular_values(np.full(k, 3.0), 64, 16, seed)
        assert rankme(z) == pytest.approx(k, rel=1e-4)


def test_rankme_of_known_singular_values_is_their_entropy():
    s = np.array([4.0, 2.0, 1.0, 1.0])
    p = np.concatenate([s / s.sum(), np.zeros(12 - len(s))]) + RANKME_EPS  # 12 = min(50, 12) values
    expected = math.exp(-(p * np.log(p)).sum())
    for seed in range(10):
        assert rankme(_with_singular_values(s, 50, 12, seed)) == pytest.approx(expected, rel=1e-5)


def test_rankme_equals_the_papers_formula_over_many_draws():
    for seed in range(20):
        rng = np.random.default_rng(seed)
        z = rng.standard_normal((40, 8)) @ rng.standard_normal((8, 8)) * rng.uniform(0.1, 10)
        assert rankme(torch.from_numpy(z)) == pytest.approx(_rankme_reference(z), rel=1e-9)


def test_rankme_is_invariant_to_scale_and_to_permutations_of_rows_and_columns():
    for seed in range(10):
        g = torch.Generator().manual_seed(seed)
        z = torch.randn(100, 12, generator=g) @ torch.randn(12, 12, generator=g)
        base = rankme(z)
        assert rankme(z * 1e-3) == pytest.approx(base, rel=1e-6)  # float32 input: its rounding
        assert rankme(z * 1e3) == pytest.approx(base, rel=1e-6)
        assert rankme(z[torch.randperm(100, generator=g)]) == pytest.approx(base, rel=1e-6)
        assert rankme(z[:, torch.randperm(12, generator=g)]) == pytest.approx(base, rel=1e-6)


def test_rankme_grows_as_an_embedding_collapses_less():
    """Mixing a collapsed embedding (one direction) with an isotropic one raises the rank monotonically."""
    for seed in range(5):
        g = torch.Generator().manual_seed(seed)
        iso = torch.randn(500, 16, generator=g)
        line = torch.randn(500, 1, generator=g) * torch.ones(1, 16)
        ranks = [rankme((1 - a) * line + a * iso) for a in (0.0, 0.01, 0.1, 0.5, 1.0)]
        assert ranks == sorted(ranks)
        assert ranks[0] == pytest.approx(1.0, abs=1e-3) and 14 < ranks[-1] <= 16


def _alignment_reference(a: np.ndarray, b: np.ndarray, alpha: float = 2) -> float:
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return float(np.mean([np.linalg.norm(x - y) ** alpha for x, y in zip(a, b)]))


def _uniformity_reference(z: np.ndarray, t: float = 2) -> float:
    z = z / np.linalg.norm(z, axis=1, keepdims=True)
    pairs = [math.exp(-t * np.linalg.norm(z[i] - z[j]) ** 2)
             for i in range(len(z)) for j in range(i + 1, len(z))]
    return math.log(np.mean(pairs))


def test_alignment_and_uniformity_match_their_definitions_over_many_draws():
    for seed in range(20):
        rng = np.random.default_rng(seed)
        a, noise = rng.standard_normal((30, 5)), rng.standard_normal((30, 5))
        b = a + rng.uniform(0.01, 2) * noise
        got = alignment(torch.from_numpy(a), torch.from_numpy(b))
        assert got == pytest.approx(_alignment_reference(a, b))
        assert uniformity(torch.from_numpy(a)) == pytest.approx(_uniformity_reference(a))


def test_alignment_is_zero_for_identical_views_symmetric_and_scale_free():
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(50, 8, generator=g), torch.randn(50, 8, generator=g)
    assert alignment(a, a * 3) == pytest.approx(0.0, abs=1e-12)
    assert alignment(a, b) == pytest.approx(alignment(b, a))
    assert 0 <= alignment(a, b) <= 4  # squared distances of unit vectors


def test_uniformity_is_lowest_for_spread_points_and_zero_for_one_point():
    g = torch.Generator().manual_seed(0)
    spread = torch.randn(400, 3, generator=g)
    clump = torch.tensor([1.0, 0.0, 0.0]) + 0.05 * torch.randn(400, 3, generator=g)
    assert uniformity(spread) < uniformity(clump) < 0
    assert uniformity(torch.ones(10, 3)) == pytest.approx(0.0, abs=1e-12)  # log E exp(0)


def test_the_subsample_is_the_same_rows_whatever_the_global_random_state():
    torch.manual_seed(123)
    a = subsample(10_000, 256)
    torch.manual_seed(456)
    b = subsample(10_000, 256)
    assert torch.equal(a, b) and len(a) == 256 and bool((a[1:] > a[:-1]).all())
    assert subsample(100, 256) is None


def test_the_scores_through_evaluate_read_no_label_and_use_the_subsample():
    g = torch.Generator().manual_seed(0)
    held = torch.randn(3000, 10, generator=g)
    cfg = EvalConfig(label_free_samples=512)
    got = evaluate(None, None, held, None, 0, cfg, ("rankme", "uniformity"))
    rows = subsample(3000, 512)
    assert got == {"rankme": pytest.approx(rankme(held[rows])),
                   "uniformity": pytest.approx(uniformity(held[rows]))}
    views = (held + 0.1, held - 0.1)
    pairs = lambda r: (views[0][r], views[1][r])  # noqa: E731
    assert label_free_scores(("alignment",), held, samples=512, pairs=pairs)["alignment"] == pytest.approx(
        alignment(views[0][rows], views[1][rows]))
    with pytest.raises(ValueError, match="two views"):
        evaluate(None, None, held, None, 0, cfg, ("alignment",))


@pytest.mark.slow
def test_the_benchmark_runs_every_part_small():
    """benchmarks/label_free.py --tiny: real training of each entrant's first trials on digits and a CSV,
    every score, the rank correlations and the regrets (its full run is on docs/guides/unlabelled.md)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "label_free.py"
    spec = importlib.util.spec_from_file_location("label_free_benchmark", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    results = bench.main(["--tiny"])
    assert set(results["data"]) == {"digits", "csv"}
    for by_entrant in results["data"].values():
        for r in by_entrant.values():
            assert len(r["trials"]) == 3
            assert all(math.isnan(v) or -1 <= v <= 1 for v in r["spearman"].values())
            assert r["regret_points"]["val_knn (all labels)"] == 0  # the reference choice against itself
            for t in r["trials"]:
                assert 0 <= t["test_knn"] <= 1 and t["rankme"] >= 1 and 0 <= t["alignment"] <= 4
    assert results["regret_over_searches"]["rankme (no label)"]["searches"] == 4
