"""augtune.eval: the mathematics of each score on tiny, seeded, CPU problems."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from augtune.config import EvalConfig
from augtune.eval import (
    METRICS,
    cluster_accuracy,
    evaluate,
    fit_logistic_regression,
    kmeans_scores,
    knn_accuracy,
    linear_probe_accuracy,
    select_C,
    softmax_regression_accuracy,
)
from augtune.eval.probes import _fit_softmax_regression


def blobs(n_per: int, k: int, d: int = 8, sep: float = 10.0, noise: float = 0.5, seed: int = 0):
    """k well-separated Gaussian blobs centred at sep * e_i: apart in direction as well as in
    distance, so they separate under cosine similarity and L2 normalisation too."""
    rng = np.random.default_rng(seed)
    y = np.repeat(np.arange(k), n_per)
    x = sep * np.eye(k, d)[y] + noise * rng.normal(size=(len(y), d))
    perm = rng.permutation(len(y))
    return x[perm].astype(np.float32), y[perm]


def split(x, y, test_fraction=0.3, seed=1):
    perm = np.random.default_rng(seed).permutation(len(y))
    n_test = int(len(y) * test_fraction)
    te, tr = perm[:n_test], perm[n_test:]
    return x[tr], y[tr], x[te], y[te]


# ---------------------------------------------------------------------------------------------
# Hungarian cluster accuracy


def test_cluster_accuracy_permuted_labelling_is_one():
    y = np.array([0, 0, 1, 1, 2, 2, 2])
    assert cluster_accuracy(y, np.array([2, 0, 1])[y]) == 1.0


def test_cluster_accuracy_more_clusters_than_classes():
    # clusters x classes: c0 {0: 2}, c1 {0: 1}, c2 {1: 3}; best: c0->0, c2->1; c1 unmatched
    y_true = [0, 0, 0, 1, 1, 1]
    y_pred = [0, 0, 1, 2, 2, 2]
    assert cluster_accuracy(y_true, y_pred) == pytest.approx(5 / 6)


def test_cluster_accuracy_fewer_clusters_than_classes():
    # c0 {0: 2, 1: 1}, c1 {1: 1, 2: 2}: best c0->0, c1->2; class 1 unmatched
    y_true = [0, 0, 1, 1, 2, 2]
    y_pred = [0, 0, 0, 1, 1, 1]
    assert cluster_accuracy(y_true, y_pred) == pytest.approx(4 / 6)


def test_cluster_accuracy_non_contiguous_labels():
    # classes {2, 5, 9}, clusters {0, 7}: c7 {2: 3}, c0 {5: 2, 9: 1} -> 5 of 6
    y_true = np.array([2, 2, 2, 5, 5, 9])
    y_pred = np.array([7, 7, 7, 0, 0, 0])
    assert cluster_accuracy(y_true, y_pred) == pytest.approx(5 / 6)
    assert cluster_accuracy(torch.tensor(y_true), torch.tensor(y_pred)) == pytest.approx(5 / 6)


def test_cluster_accuracy_one_cluster_is_majority_fraction():
    y_true = [0, 0, 0, 1, 1, 2]
    assert cluster_accuracy(y_true, [4] * 6) == pytest.approx(0.5)


def test_cluster_accuracy_equals_brute_force_on_random_cases():
    rng = np.random.default_rng(0)
    for _ in range(20):
        n_cls, n_clu = rng.integers(1, 5), rng.integers(1, 5)
        y_true, y_pred = rng.integers(0, n_cls, 30) * 3 + 1, rng.integers(0, n_clu, 30) * 2
        classes, clusters = np.unique(y_true), np.unique(y_pred)
        best = 0
        # every injective cluster -> class matching (a cluster may also stay unmatched)
        for r in range(min(len(classes), len(clusters)) + 1):
            for clus in itertools.combinations(clusters, r):
                for cls in itertools.permutations(classes, r):
                    hits = sum(np.sum((y_pred == a) & (y_true == b)) for a, b in zip(clus, cls))
                    best = max(best, hits)
        assert cluster_accuracy(y_true, y_pred) == pytest.approx(best / 30)


# ---------------------------------------------------------------------------------------------
# k-NN


def test_knn_separable_blobs_is_one():
    assert knn_accuracy(*split(*blobs(30, 4))) == 1.0


def test_knn_k1_on_train_itself_is_one():
    x = torch.randn(50, 6, generator=torch.Generator().manual_seed(0))
    y = torch.randint(0, 5, (50,), generator=torch.Generator().manual_seed(1))
    assert knn_accuracy(x, y, x, y, k=1) == 1.0


def test_knn_does_not_depend_on_chunk_size():
    g = torch.Generator().manual_seed(0)
    trx, tex = torch.randn(200, 5, generator=g), torch.randn(57, 5, generator=g)
    tr_y, te_y = torch.randint(0, 3, (200,), generator=g), torch.randint(0, 3, (57,), generator=g)
    ref = knn_accuracy(trx, tr_y, tex, te_y, k=7, batch_size=1000)
    assert 0 < ref < 1
    for bs in (1, 7, 56):
        assert knn_accuracy(trx, tr_y, tex, te_y, k=7, batch_size=bs) == ref


def test_knn_tie_goes_to_larger_summed_similarity():
    # k = 2 gives one vote to each class; the class whose neighbour is more similar wins
    angles = torch.tensor([0.0, 30.0]).deg2rad()
    train_x = torch.stack([angles.cos(), angles.sin()], 1)
    test_angles = torch.tensor([10.0, 20.0]).deg2rad()
    test_x = torch.stack([test_angles.cos(), test_angles.sin()], 1)
    assert knn_accuracy(train_x, [5, 9], test_x, [5, 9], k=2) == 1.0
    assert knn_accuracy(train_x, [5, 9], test_x, [9, 5], k=2) == 0.0


# ---------------------------------------------------------------------------------------------
# softmax regression (PiNDA B.3)


def test_softmax_regression_separable_blobs():
    # 112 train points are 4 steps an epoch: PiNDA's lr 1e-3 assumes the thousands of steps a
    # real train split gives, so the tiny problem gets a larger step
    assert softmax_regression_accuracy(*split(*blobs(40, 4)), num_classes=4, lr=1e-2, batch_size=32) >= 0.99


def test_softmax_regression_random_labels_is_chance():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4000, 16, generator=g)
    y = torch.randint(0, 10, (4000,), generator=g)
    acc = softmax_regression_accuracy(x[:2000], y[:2000], x[2000:], y[2000:], 10, epochs=10)
    assert 0.06 < acc < 0.14  # chance 0.1; std of the estimate ~0.007


def test_softmax_regression_seeded_and_leaves_global_rng_alone():
    data = split(*blobs(20, 3, noise=6.0))  # overlapping: the result depends on the seed's path
    state = torch.get_rng_state()
    a = softmax_regression_accuracy(*data, num_classes=3, epochs=5, seed=3)
    assert torch.equal(torch.get_rng_state(), state)
    assert softmax_regression_accuracy(*data, num_classes=3, epochs=5, seed=3) == a


def test_softmax_regression_hand_gradient_matches_autograd_adam():
    x, y = torch.randn(70, 6, generator=torch.Generator().manual_seed(0)), torch.arange(70) % 3
    wb = _fit_softmax_regression(
        x, y, 3, epochs=3, lr=1e-2, batch_size=16, gen=torch.Generator().manual_seed(5)
    )
    # reference: nn.Linear-style init, autograd, torch.optim.Adam, the same draws from the generator
    gen = torch.Generator().manual_seed(5)
    w = ((torch.rand(3, 6, generator=gen) * 2 - 1) / 6 ** 0.5).requires_grad_()
    b = ((torch.rand(3, generator=gen) * 2 - 1) / 6 ** 0.5).requires_grad_()
    opt = torch.optim.Adam([w, b], lr=1e-2)
    for _ in range(3):
        for idx in torch.randperm(70, generator=gen).split(16):
            opt.zero_grad()
            F.cross_entropy(F.linear(x[idx], w, b), y[idx]).backward()
            opt.step()
    torch.testing.assert_close(wb, torch.cat([w, b[:, None]], 1).detach(), atol=1e-5, rtol=1e-4)


# ---------------------------------------------------------------------------------------------
# linear probe (CoCor E)


def test_linear_probe_separable_blobs():
    assert linear_probe_accuracy(*split(*blobs(40, 4))) >= 0.99


def test_logistic_regression_solution_matches_sklearn():
    from sklearn.linear_model import LogisticRegression

    x, y = blobs(40, 3, d=5, noise=4.0)  # overlapping classes: a unique, non-trivial optimum
    x = (x - x.mean(0)) / x.std(0)
    ref = LogisticRegression(C=1.0, tol=1e-8, max_iter=10_000).fit(x.astype(np.float64), y)
    wb = fit_logistic_regression(torch.tensor(x), torch.tensor(y), 3, C=1.0, tol=1e-6)
    w, b = wb[:-1].T.numpy(), wb[-1].numpy()
    # multinomial logits are defined up to a shift shared by the classes; sklearn's sum to zero
    np.testing.assert_allclose(w - w.mean(0), ref.coef_, atol=2e-3)
    np.testing.assert_allclose(b - b.mean(), ref.intercept_, atol=2e-3)


def _one_signal_feature(n, d, signal, seed):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n)
    x = rng.normal(size=(n, d))
    x[:, 0] += signal * (2 * y - 1)
    return x.astype(np.float32), y


def test_linear_probe_selects_stronger_regularisation_on_noisy_few_samples():
    noisy = select_C(*_one_signal_feature(40, 100, 1.0, seed=0))  # 100 dims, 32 fitted points
    clean = select_C(*_one_signal_feature(400, 5, 4.0, seed=0))
    assert noisy < clean
    assert noisy <= 1e-2 and clean >= 1e2


# ---------------------------------------------------------------------------------------------
# k-means and the entry point


def test_kmeans_three_blobs_is_perfect():
    x, y = blobs(30, 3)
    scores = kmeans_scores(x, y + 4, k=3)  # labels need not be 0..k-1
    assert set(scores) == {"kmeans_acc", "kmeans_nmi", "kmeans_ari"}
    for v in scores.values():
        assert isinstance(v, float) and v == pytest.approx(1.0, abs=1e-9)


def test_evaluate_returns_exactly_the_requested_keys_and_leaves_rng_alone():
    train_x, train_y, test_x, test_y = split(*blobs(20, 3))
    cfg = EvalConfig(sr_epochs=3)
    torch_state, np_state = torch.get_rng_state(), np.random.get_state()
    views = torch.tensor(test_x), torch.tensor(test_x) + 0.1  # alignment's two views of each held-out row
    def pairs(rows):
        return views if rows is None else (views[0][rows], views[1][rows])

    everything = evaluate(train_x, train_y, test_x, test_y, 3, cfg, tuple(METRICS), pairs=pairs)
    assert torch.equal(torch.get_rng_state(), torch_state)
    assert np.random.get_state()[1].tolist() == np_state[1].tolist()
    assert set(everything) == {"knn_acc", "sr_acc", "linear_acc", "kmeans_acc", "kmeans_nmi", "kmeans_ari",
                               "cluster_acc", "cluster_nmi", "cluster_ari", "cluster_k",
                               "rankme", "alignment", "uniformity"}
    assert all(isinstance(v, float) for v in everything.values())
    assert evaluate(torch.tensor(train_x), torch.tensor(train_y), torch.tensor(test_x), torch.tensor(test_y),
                    3, cfg, ("knn",)) == {"knn_acc": 1.0}
    assert set(evaluate(train_x, train_y, test_x, test_y, 3, cfg, ("sr", "kmeans"))) == {
        "sr_acc", "kmeans_acc", "kmeans_nmi", "kmeans_ari"}
    with pytest.raises(KeyError, match="unknown metric"):
        evaluate(train_x, train_y, test_x, test_y, 3, cfg, ("knn", "nope"))


@pytest.mark.slow
def test_umaps_kernels_are_cached_on_disk_and_a_later_process_embeds_the_same(tmp_path):
    """umap-learn's numba kernels go to numba's on-disk cache (a trial sets $NUMBA_CACHE_DIR): the first
    process compiles and writes them, a later one loads them, and both give this embedding bitwise."""
    import os
    import subprocess
    import sys

    from augtune.eval.clustering import umap_embed

    x = np.random.default_rng(0).normal(size=(120, 16)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    code = ("import sys, numpy as np; from augtune.eval.clustering import umap_embed; "
            f"np.save(sys.argv[1], umap_embed(np.load({str(tmp_path / 'x.npy')!r}), 2, 10, seed=3))")
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba")}
    for n in (1, 2):
        subprocess.run([sys.executable, "-c", code, str(tmp_path / f"e{n}.npy")], env=env, check=True,
                       timeout=600)
        if n == 1:
            cached = {p.name.split(".")[0] for p in (tmp_path / "numba").rglob("*.nbi")}
            assert any(name.startswith(("layouts", "umap_")) for name in cached), sorted(cached)[:10]
    here = umap_embed(x, 2, 10, seed=3)
    assert np.array_equal(np.load(tmp_path / "e1.npy"), here)
    assert np.array_equal(np.load(tmp_path / "e2.npy"), here)
