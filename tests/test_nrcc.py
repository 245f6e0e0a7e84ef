"""NRCC: GridShift, SGHMC, the regulariser's gradients (eqs. 10-11, 13-14), clustering without k."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from sklearn.cluster import MeanShift
from sklearn.datasets import make_blobs
from sklearn.metrics import adjusted_rand_score

from augtune.config import from_dict
from augtune.data import load_dataset
from augtune.eval.clustering import cluster_scores
from augtune.eval.gridshift import auto_bandwidth, gridshift
from augtune.methods import Batch, StepInfo, build_method
from augtune.methods.nrcc import nrcc_log_ratio, nrcc_regulariser, sghmc
from augtune.plots import load_run, plot
from augtune.trainables import train_run
from augtune.trainables.loop import Trainer
from augtune.plots import end_of_run_figures

INFO = StepInfo(0, 0, 10)


def blobs(d: int, n: int = 2000, k: int = 5, seed: int = 0):
    centers = np.random.default_rng(seed).uniform(-20, 20, (k, d))
    return make_blobs(n, n_features=d, centers=centers, cluster_std=1.0, random_state=seed)


# ---------------------------------------------------------------------------------------------
# GridShift

@pytest.mark.parametrize("d", [2, 3])
def test_gridshift_finds_the_blobs_without_k_and_agrees_with_meanshift(d):
    x, y = blobs(d)
    h = auto_bandwidth(x, quantile=0.1)
    labels, centres = gridshift(x, h)
    assert adjusted_rand_score(y, labels) >= 0.9
    assert len(np.unique(labels)) >= 5 and centres.shape[1] == d
    flat = MeanShift(bandwidth=h, bin_seeding=True).fit_predict(x)  # scikit-learn's flat kernel
    assert adjusted_rand_score(flat, labels) >= 0.9
    big = [c for c in np.unique(labels) if (labels == c).sum() > 100]
    true_centres = np.array([x[y == k].mean(0) for k in range(5)])
    for c in big:  # every large cluster's centre sits on a blob's mean
        assert np.min(np.linalg.norm(true_centres - centres[c], axis=1)) < 0.5


def test_gridshift_labels_are_contiguous_and_independent_of_point_order():
    x, _ = blobs(2, n=600)
    labels, centres = gridshift(x, 1.5)
    assert set(labels) == set(range(len(centres)))
    perm = np.random.default_rng(1).permutation(len(x))
    labels_p, centres_p = gridshift(x[perm], 1.5)
    assert np.array_equal(labels_p, labels[perm])  # the same numbering, not just the same partition
    assert np.allclose(centres_p, centres)


def test_gridshift_edge_cases_one_point_duplicates_one_cluster():
    labels, centres = gridshift(np.array([[0.3, -1.2]]))
    assert labels.tolist() == [0] and np.allclose(centres, [[0.3, -1.2]])
    labels, centres = gridshift(np.ones((50, 3)))  # duplicates: auto bandwidth degenerates to 0
    assert set(labels) == {0} and np.allclose(centres, 1)
    x = np.random.default_rng(0).normal(size=(500, 2))  # one blob
    labels, _ = gridshift(x, bandwidth=2.0)
    assert np.bincount(labels).max() >= 0.99 * len(x)
    with pytest.raises(ValueError, match="bandwidth must be > 0"):
        gridshift(x, bandwidth=0.0)


def test_cluster_scores_switch_between_gridshift_meanshift_and_kmeans():
    x, y = blobs(8, n=1000, k=5)  # 8-d features: UMAP to 2, then cluster
    for algorithm in ("gridshift", "meanshift", "kmeans"):
        scores = cluster_scores(x, y, algorithm, k=5, neighbors=15, metric="euclidean")
        assert set(scores) == {"cluster_acc", "cluster_nmi", "cluster_ari", "cluster_k"}
        assert scores["cluster_acc"] > 0.95 and scores["cluster_ari"] > 0.9, algorithm
    assert scores["cluster_k"] == 5  # kmeans is told k; the others found it above


# ---------------------------------------------------------------------------------------------
# SGHMC

def _density(w: torch.Tensor, target: torch.Tensor):
    """P(s) = 1 / (1 + cos(W s, W x_i)): eq. 16 with a linear g(f(.))."""
    anchor = F.normalize(target @ w.T, dim=1)
    return lambda s: 1.0 / (1.0 + (F.normalize(s @ w.T, dim=1) * anchor).sum(1))


def test_sghmc_zero_steps_returns_the_seed_and_paper_order_moves_by_the_first_momentum():
    torch.manual_seed(0)
    w, x, seed = torch.randn(4, 6), torch.randn(8, 6), torch.randn(8, 6)
    density = _density(w, x)
    assert torch.equal(sghmc(seed, density, 0.1, 0.05, 0.99, steps=0)[0], seed)
    r0 = torch.randn(8, 6)
    one, by_grad = sghmc(seed, density, 0.1, 0.05, 0.99, steps=1, order="paper", p0=r0)
    assert torch.allclose(one, seed + 0.05 * r0)  # eq. 18: s1 = s0 + delta2 p0, the gradient not yet used
    assert torch.equal(by_grad, torch.zeros_like(seed))


def _official_sghmc(seed, density, d1, d2, d3, steps, p0, noise, clip=1.0):
    """The official code's SGHMC, written out sample by sample: momentum first, gradient clipped."""
    out = []
    for i in range(seed.shape[0]):
        s, p = seed[i].clone(), p0[i].clone()
        for j in range(steps):
            x = s.clone().requires_grad_(True)
            rows = torch.cat([seed[:i], x[None], seed[i + 1:]])  # the density of row i reads only row i
            (g,) = torch.autograd.grad(density(rows)[i], x)
            p = (1 - d1) * p - d2 * g.clamp(-clip, clip) + d3 * noise[j][i]
            s = s + d2 * p
        out.append(s)
    return torch.stack(out)


def test_sghmc_default_order_and_clip_reproduce_the_official_code_over_seeds():
    for trial in range(20):
        torch.manual_seed(trial)
        w, x, seed, p0 = (torch.randn(n, 6, dtype=torch.float64) for n in (4, 8, 8, 8))
        density = _density(5 * w, x)  # steep enough that the clip at 1 bites
        steps = 1 + trial % 3
        torch.manual_seed(100 + trial)
        got, _ = sghmc(seed, density, 0.1, 0.05, 0.99, steps, p0=p0, grad_clip=1.0)
        torch.manual_seed(100 + trial)
        noise = [torch.randn(8, 6, dtype=torch.float64) for _ in range(steps)]
        want = _official_sghmc(seed, density, 0.1, 0.05, 0.99, steps, p0, noise)
        assert torch.allclose(got, want, atol=1e-12), trial


def test_sghmc_gradient_part_is_what_the_noise_free_chain_moves():
    """The displacement splits exactly: with the noise and the initial momentum zero, x^c - seed is
    the gradient part; the gradient part does not depend on the noise."""
    for trial in range(10):
        torch.manual_seed(trial)
        w, x, seed = torch.randn(4, 6), torch.randn(16, 6), torch.randn(16, 6)
        density = _density(w, x)
        zero = torch.zeros_like(seed)
        for order in ("momentum_first", "paper"):
            quiet, part = sghmc(seed, density, 0.1, 0.05, 0.0, 3, order=order, p0=zero)
            assert torch.allclose(quiet - seed, part, atol=1e-6)
            torch.manual_seed(50 + trial)
            _, noisy_part = sghmc(seed, density, 0.1, 0.05, 0.99, 1, order=order, p0=zero)
            _, quiet_part = sghmc(seed, density, 0.1, 0.05, 0.0, 1, order=order, p0=zero)
            assert torch.allclose(noisy_part, quiet_part, atol=1e-6)  # one step: the gradient at the seed


def test_sghmc_without_noise_lowers_the_density_for_a_small_step():
    torch.manual_seed(0)
    w, x, seed = torch.randn(4, 6), torch.randn(64, 6), torch.randn(64, 6)
    density = _density(w, x)
    zero = torch.zeros_like(seed)
    for order, steps in (("momentum_first", 1), ("paper", 2)):
        s, _ = sghmc(seed, density, 0.1, 0.05, 0.0, steps=steps, order=order, p0=zero)
        before, after = density(seed), density(s)
        assert (after <= before + 1e-7).all() and (after < before).float().mean() > 0.9, order


def test_sghmc_negatives_reach_no_weight_and_differ_from_their_seeds():
    cfg = from_dict({"dataset": {"name": "digits", "as_vectors": True, "max_train": 256, "max_test": 64},
                     "model": {"hidden_dim": 32, "embed_dim": 16, "proj_hidden_dim": 16, "proj_dim": 8,
                               "pred_hidden_dim": 16},
                     "method": {"base": "byol", "augment": ["nrcc"]}, "nrcc": {"order": "momentum_first"}})
    data = load_dataset(cfg.dataset)
    torch.manual_seed(0)
    method = build_method(cfg, data).train()
    x = data.x_train[:32]
    batch = Batch(
        x=x, views=[x + 0.1 * torch.randn_like(x), x + 0.1 * torch.randn_like(x)], index=torch.arange(32)
    )
    xc = method.augments[0].negatives(batch, method)
    assert xc.shape == x.shape and not xc.requires_grad
    assert all(p.grad is None for p in method.parameters())
    assert method.training  # restored after the eval-mode passes
    pool = torch.cat(batch.views)
    assert torch.cdist(xc, pool).min(dim=1).values.min() > 0  # moved away from every seed


# ---------------------------------------------------------------------------------------------
# The regulariser: gradients as the paper's eqs. 10-11 (InfoNCE) and 13-14 (BYOL, simplified)

def _paper_gradient(a, b, c, tau, lam):
    """lam x (eq. 10's extra attraction + eq. 11's new terms) for every anchor, term by term."""
    n = a.shape[0]
    grad = torch.zeros_like(a)
    for i in range(n):
        sb = torch.exp(a[i] @ b.T / tau)  # (n,)
        sc = torch.exp(a[i] @ c.T / tau)
        sc[i] = 0  # negatives (x_i^a, x_j^c) with j != i
        attraction = lam * sb[i] / sb.sum() * b[i] / tau  # eq. 10: [1 + lam softmax] on the z_i^b pull
        psi = 1.0 / sb.sum()  # psi'_j
        repulsion = sum(
            lam * (c[j] * sc[j] / sc.sum() - psi * b[j] * sb[j]) / tau for j in range(n) if j != i
        )
        grad[i] = repulsion - attraction  # the loss grows with repulsion terms, falls along attraction
    return grad


def test_infonce_nrcc_gradient_matches_eqs_10_and_11():
    torch.manual_seed(0)
    n, d, tau, lam = 6, 5, 0.5, 0.3
    a = F.normalize(torch.randn(n, d), dim=1).requires_grad_(True)
    b, c = F.normalize(torch.randn(n, d), dim=1), F.normalize(torch.randn(n, d), dim=1)
    (lam * nrcc_log_ratio(a, b, c, tau).sum()).backward()
    assert torch.allclose(a.grad, _paper_gradient(a.detach(), b, c, tau, lam), atol=1e-5)


def test_regulariser_rewards_close_positives_and_hard_negatives_far():
    torch.manual_seed(0)
    a = torch.randn(8, 4)
    far_c = -a  # negatives opposite every anchor
    assert nrcc_regulariser(a, a, far_c, 0.1) < nrcc_regulariser(a, torch.randn(8, 4), a.roll(1, 0), 0.1)


def test_byol_nrcc_reads_the_online_prediction_against_target_embeddings_without_predictor():
    cfg = from_dict({"dataset": {"name": "digits", "as_vectors": True, "max_train": 256, "max_test": 64},
                     "model": {"hidden_dim": 32, "embed_dim": 16, "proj_hidden_dim": 16, "proj_dim": 8,
                               "pred_hidden_dim": 16},
                     "method": {"base": "byol", "augment": ["nrcc"]}, "nrcc": {"lam": 0.5, "tau": 0.2}})
    data = load_dataset(cfg.dataset)
    torch.manual_seed(0)
    method = build_method(cfg, data).train()
    x = data.x_train[:16]
    v1, v2 = x + 0.1 * torch.randn_like(x), x + 0.1 * torch.randn_like(x)
    batch = Batch(x=x, views=[v1, v2], index=torch.arange(16))
    _, out = method.objective.loss(v1, v2, INFO)
    p1 = out.predictions[0].detach().requires_grad_(True)
    p2 = out.predictions[1].detach().requires_grad_(True)
    torch.manual_seed(1)
    reg = method.augments[0].loss_terms(batch, dataclasses.replace(out, predictions=(p1, p2)), method, INFO)[
        "nrcc"
    ]
    reg.backward()
    t1, t2 = out.targets
    assert not t1.requires_grad and not t2.requires_grad  # stop-gradient on the target
    torch.manual_seed(1)
    xc = method.augments[0].negatives(batch, method)
    zc = F.normalize(method.objective.target_embed(xc), dim=1)  # no predictor on the target path
    a = F.normalize(p1.detach(), dim=1).requires_grad_(True)
    (0.5 * nrcc_log_ratio(a, F.normalize(t2, dim=1), zc, 0.2).mean()).backward()
    # eqs. 13-14 in the simplified setting are eqs. 10-11's added terms with z^a -> q(z^a): through
    # the normalisation, d/dp1 = (I - a a^T) / ||p1|| applied to the paper's gradient
    expected = _paper_gradient(a.detach(), F.normalize(t2, dim=1), zc, 0.2, 0.5) / 16
    proj = torch.eye(a.shape[1]) - a.detach()[:, :, None] * a.detach()[:, None, :]
    expected = (proj @ expected[:, :, None]).squeeze(-1) / p1.detach().norm(dim=1, keepdim=True)
    assert torch.allclose(p1.grad, expected, atol=1e-5)


# ---------------------------------------------------------------------------------------------
# Training and the figure

@pytest.mark.parametrize("base", ["simclr", "byol"])
def test_nrcc_trains_on_infonce_and_byol_and_evaluates_clusters_without_k(base, tmp_path):
    cfg = from_dict({"dataset": {"name": "digits", "max_train": 400, "max_test": 300},
                     "model": {"backbone": "cnn", "width": 8},
                     "view": {"crop_scale": [0.3, 1.0], "flip_p": 0.0},
                     "method": {"base": base, "augment": ["nrcc"]},
                     "train": {"epochs": 2, "batch_size": 100},
                     "eval": {"metrics": ["cluster", "kmeans"], "references": False, "every": 0,
                              "encoder": "target" if base == "byol" else "online", "umap_neighbors": 15}})
    record = train_run(cfg, load_dataset(cfg.dataset), tmp_path / "run", log=lambda s: None,
        on_completed=end_of_run_figures)
    final = record["final"]
    assert 0 < final["cluster_acc"] <= 1 and final["cluster_k"] >= 1 and 0 <= final["kmeans_nmi"] <= 1
    assert record["epochs"][-1]["loss_nrcc"] != 0
    assert record["figures"] == [f"figures/umap_{base}_nrcc_seed0.png"]
    files = plot("umap", [load_run(tmp_path / "run")], tmp_path / "again")
    assert files[0].stat().st_size > 1000


def test_nrcc_without_sghmc_takes_ordinary_views_of_the_batch():
    cfg = from_dict({"dataset": {"name": "digits", "as_vectors": True, "max_train": 256, "max_test": 64},
                     "method": {"augment": ["nrcc"]}, "nrcc": {"negatives": "augment"}})
    data = load_dataset(cfg.dataset)
    method = build_method(cfg, data)
    x = data.x_train[:32]
    batch = Batch(x=x, views=[x + 1, x - 1], index=torch.arange(32))
    xc = method.augments[0].negatives(batch, method)
    pool = torch.cat(batch.views)
    assert (xc[:, None, :] == pool[None]).all(-1).any(1).all()  # every x^c is one of the views


def test_trainer_reports_the_nrcc_term_and_the_loss_falls():
    cfg = from_dict({"dataset": {"name": "digits", "as_vectors": True, "max_train": 512, "max_test": 64},
                     "model": {"hidden_dim": 64, "embed_dim": 32, "proj_hidden_dim": 32, "proj_dim": 16},
                     "view": {"name": "noise", "noise_std": 0.5}, "method": {"augment": ["nrcc"]},
                     "train": {"epochs": 6, "batch_size": 128},
                     "eval": {"metrics": ["knn"], "references": False, "every": 0}})
    trainer = Trainer(cfg, load_dataset(cfg.dataset), log=lambda s: None)
    trainer.fit()
    losses = [h["loss"] for h in trainer.history]
    assert losses[-1] < losses[0] and "loss_nrcc" in trainer.history[0]
