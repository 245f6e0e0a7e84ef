"""DiffAug: the t-kernel and soft contrastive loss, the conditional DDPM, phases and generated positives."""
from __future__ import annotations

import copy
import math

import pytest
import torch

from augtune.checks import check_config
from augtune.config import ConfigError, from_dict, to_dict
from augtune.data import load_dataset
from augtune.methods import Batch, StepInfo
from augtune.methods.diffaug_ops import (DDPM, ResidualMLPDenoiser, UNetDenoiser, ema_update, log1p,
                                         log_t_kernel, soft_contrastive_loss, soft_contrastive_loss_two_views,
                                         sq_dists, t_kernel)
from augtune.trainables.loop import Trainer
from augtune.plots import end_of_run_figures



pytestmark = pytest.mark.usefixtures("one_thread")


# ---------------------------------------------------------------------------------------------
# Kernel (App. B eq. 9)


@pytest.mark.parametrize("nu,at_zero", [
    (1.0, 1 / math.pi),  # Cauchy
    (2.0, 1 / (2 * math.sqrt(2))),
    (0.5, math.gamma(0.75) / (math.sqrt(0.5 * math.pi) * math.gamma(0.25))),
    (1e6, 1 / math.sqrt(2 * math.pi)),  # nu -> inf: the standard normal density
])
def test_t_kernel_at_distance_zero_is_eq9_normalising_constant(nu, at_zero):
    a = torch.zeros(1, 3)
    assert t_kernel(a, a, nu).item() == pytest.approx(at_zero, rel=1e-5)


@pytest.mark.parametrize("nu", [1.0, 3.0, 100.0])
def test_t_kernel_of_a_1d_difference_integrates_to_one(nu):
    d = torch.linspace(-2000, 2000, 2_000_001, dtype=torch.float64)
    density = log_t_kernel(d**2, nu).exp()
    tail = 2 / (math.pi * 2000) if nu == 1 else 0  # Cauchy mass beyond |d| = 2000
    assert torch.trapezoid(density, d).item() == pytest.approx(1 - tail, abs=2e-4)


def test_kernel_decreases_with_distance_and_small_nu_has_heavier_tails():
    sq = torch.tensor([0.0, 1.0, 4.0, 100.0])
    for nu in (0.01, 1.0, 100.0):
        k = log_t_kernel(sq, nu)
        assert torch.all(k[1:] < k[:-1])
    far = torch.tensor([1e4])
    zero = torch.zeros(1)
    assert log_t_kernel(far, 0.01) - log_t_kernel(zero, 0.01) > log_t_kernel(far, 100.0) - log_t_kernel(
        zero, 100.0
    )


# ---------------------------------------------------------------------------------------------
# Soft contrastive loss (eq. 2, App. B eqs. 13-17)

def _views(b=6, dy=16, dz=4, seed=0, scale=1.0):
    """Centres' y and z, background views' z (one per sample) and H = identity."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randn(b, dy, generator=g) * scale
    z = torch.randn(b, dz, generator=g) * scale
    z_bg = torch.randn(b, dz, generator=g) * scale
    return y, z, z_bg, torch.eye(b, dtype=torch.bool)


def test_loss_finite_with_finite_gradients_at_extreme_distances():
    y, z, z_bg, same = _views()
    z, z_bg = z.clone(), z_bg.clone()
    z[0] = z_bg[0] = 0  # a positive pair at distance 0
    z[1] = 1e18  # a centre absurdly far from everything
    y[2] = y[3]  # identical y: kappa(0) for a negative pair
    for alpha in (0.0, 1.0, 10.0):
        zz, yy = z.clone().requires_grad_(True), y.clone().requires_grad_(True)
        loss = soft_contrastive_loss(yy, zz, z_bg, same, 100.0, 0.01, alpha)
        loss.backward()
        assert torch.isfinite(loss) and torch.isfinite(zz.grad).all() and torch.isfinite(yy.grad).all()


def test_gradient_through_p_spreads_the_samples_y_apart():
    """Eq. 2 as written: P(y_c, y_j) is differentiated too, and dL/dP = log((1 - Q)/Q) > 0 moves the
    samples' y away from each other (what keeps the backbone from collapsing)."""
    y, z, z_bg, same = _views(b=8, seed=4, scale=0.1)  # y close together: the negatives' P is not 0
    yy = y.clone().requires_grad_(True)
    soft_contrastive_loss(yy, z, z_bg, same, 100.0, 0.01, 1.0).backward()
    assert yy.grad is not None and yy.grad.abs().sum() > 0
    spread = lambda v: torch.pdist(v).mean().item()
    assert spread(y - 0.1 * yy.grad) > spread(y)


def test_soft_loss_trains_an_encoder_without_collapse():
    """A-steps on a tiny encoder, y = F(x), z = H(y), two noisy views of 4 clusters: the loss falls
    and the samples' y stay spread (with P as a no-gradient target, both went the other way)."""
    g = torch.Generator().manual_seed(0)
    centres = 3 * torch.randn(4, 10, generator=g)
    x = centres.repeat(16, 1) + 0.5 * torch.randn(64, 10, generator=g)  # (64, 10)
    torch.manual_seed(0)
    f = torch.nn.Sequential(torch.nn.Linear(10, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32))
    h = torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Linear(32, 2))
    opt = torch.optim.Adam([*f.parameters(), *h.parameters()], lr=1e-3)
    same = torch.eye(64, dtype=torch.bool)
    losses, spreads = [], []
    for _ in range(300):
        v1, v2 = (x + 0.3 * torch.randn(x.shape, generator=g) for _ in range(2))
        y1, y2 = f(v1), f(v2)
        loss = (soft_contrastive_loss(y1, h(y1), h(y2), same, 100.0, 0.01, 1.0)
                + soft_contrastive_loss(y2, h(y2), h(y1), same, 100.0, 0.01, 1.0)) / 2
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        spreads.append(torch.pdist(y1.detach()).mean().item())
    assert sum(losses[-20:]) / 20 < 0.8 * sum(losses[:20]) / 20
    assert spreads[-1] > spreads[0]


def test_p_and_q_lie_in_the_unit_interval():
    for scale in (1e-6, 1.0, 1e6):
        y, z, z_bg, same = _views(scale=scale)
        for nu in (0.01, 1.0, 100.0):
            q = t_kernel(z, z_bg, nu)
            p = (t_kernel(y, y, nu) * torch.where(same, math.e, 1.0)).clamp(0, 1)
            assert torch.all(q >= 0) and torch.all(q < 1) and torch.all((p >= 0) & (p <= 1))
            assert scale > 1 or torch.all(q > 0)  # only absurd distances underflow Q to 0 ...
        # ... which the loss clamps (log Q >= log eps): still finite
        assert torch.isfinite(soft_contrastive_loss(y, z, z_bg, same, 100.0, 0.01, 1.0))


@pytest.mark.parametrize("alpha", [0.0, 1e-4, 0.5])
def test_soft_loss_differs_from_the_bce_form_of_cl_by_eq17(alpha):
    """L_CL - L_SCL = sum_j (H_cj - R_cj kappa(d^y_cj)) log(1/kappa(d^z_cj) - 1) (eq. 17, exact with H
    fixed)."""
    y, z, z_bg, same = _views(seed=1)
    nu_y, nu_z = 100.0, 1.0
    q = t_kernel(z, z_bg, nu_z).double()
    ky = t_kernel(y, y, nu_y).double()
    h = same.double()
    l_cl = (-(h * q.log() + (1 - h) * (1 - q).log())).sum(1).mean()  # eq. 13
    r = 1 + (math.exp(alpha) - 1) * h
    eq17 = ((h - r * ky) * (1 / q - 1).log()).sum(1).mean()
    l_scl = soft_contrastive_loss(y, z, z_bg, same, nu_y, nu_z, alpha).double()
    assert (l_cl - l_scl).item() == pytest.approx(eq17.item(), rel=1e-4, abs=1e-4)


def test_with_p_equal_to_h_the_soft_loss_is_the_bce_form_of_cl():
    """Lemma B.1's L_CL^p: when P_cj = H_cj (here: alpha = ln(1/kappa(0)), negatives far in y) the two
    agree."""
    y, z, z_bg, same = _views(seed=3)
    y = y * 100  # negatives: kappa_{nu_y}(d^y) underflows to 0
    nu_y, nu_z = 100.0, 1.0
    alpha = -math.log(t_kernel(y[:1], y[:1], nu_y).item())  # e^alpha kappa(0) = 1
    q = t_kernel(z, z_bg, nu_z).double()
    h = same.double()
    l_cl = (-(h * q.log() + (1 - h) * (1 - q).log())).sum(1).mean()
    assert soft_contrastive_loss(y, z, z_bg, same, nu_y, nu_z, alpha).item() == pytest.approx(
        l_cl.item(), rel=1e-4
    )


def test_soft_loss_is_continuous_as_alpha_goes_to_zero_and_pulls_positives():
    y, z, z_bg, same = _views(seed=2)
    base = soft_contrastive_loss(y, z, z_bg, same, 100.0, 1.0, 0.0)
    diffs = [abs(soft_contrastive_loss(y, z, z_bg, same, 100.0, 1.0, a) - base).item() for a in (1e-1, 1e-2)]
    assert 8 < diffs[0] / diffs[1] < 12  # linear in alpha near 0: L_scl is continuous there (eq. 12)
    # gradient descent on the centres' z draws each one to its own positive, not to the others
    zz = z.clone().requires_grad_(True)
    opt = torch.optim.Adam([zz], lr=0.05)
    gap0 = (z - z_bg).norm(dim=1).mean()
    for _ in range(100):
        opt.zero_grad()
        soft_contrastive_loss(y, zz, z_bg, same, 100.0, 1.0, 1.0).backward()
        opt.step()
    d = torch.cdist(zz.detach(), z_bg)
    assert d.diagonal().mean() < 0.5 * gap0 and torch.equal(d.argmin(1), torch.arange(len(z)))


def test_log1p_is_torchs_rounded_correctly_with_torchs_gradient():
    """The loss's log1p (float32 on the CPU: through float64, for speed) is within half an ulp of the
    exact value (torch's own float32 one: 0.56 here), agrees with torch's on nearly every input, and
    has torch's gradient bit for bit."""
    g = torch.Generator().manual_seed(0)
    x = torch.cat([torch.rand(20000, generator=g) * 1e-3, torch.rand(20000, generator=g) * 100,
                   -torch.rand(20000, generator=g) * (1 - 1e-6), torch.tensor([0.0, 1e30])])
    xa, xb = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    ours, torchs = log1p(xa), torch.log1p(xb)
    exact = torch.log1p(x.double())
    spacing = torch.pow(2.0, (torch.frexp(exact.float())[1] - 24).double())  # float32's ulp there
    ulp = lambda v: ((v.double() - exact).abs() / spacing).max()  # noqa: E731
    assert ours.dtype == torch.float32 and ulp(ours) <= 0.5 + 1e-6 and ulp(torchs) < 1
    assert (ours == torchs).float().mean() > 0.99
    grad = torch.randn(x.shape, generator=g)
    ours.backward(grad)
    torchs.backward(grad)
    assert torch.equal(xa.grad, xb.grad)
    assert torch.equal(log1p(x.double()), torch.log1p(x.double()))  # other dtypes: torch's own


@pytest.mark.parametrize("rows", [6, 64])  # cdist's exact differences up to 25 rows, its matmul above
def test_sq_dists_is_cdist_squared_with_its_gradient(rows):
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(rows, 30, generator=g), torch.randn(rows + 3, 30, generator=g) + 0.5
    a[1] = a[0]  # a pair at distance 0 inside a, and one across
    b[2] = a[3]
    for other in (b, None):
        ref_b = a if other is None else other
        ref_a64, ref_b64 = a.double().requires_grad_(True), ref_b.double().requires_grad_(True)
        if other is None:
            ref_b64 = ref_a64
        ref = torch.cdist(ref_a64, ref_b64).pow(2)
        xa = a.clone().requires_grad_(True)
        xb = None if other is None else other.clone().requires_grad_(True)
        sq = sq_dists(xa, xb)
        assert sq.dtype == torch.float32 and torch.allclose(sq.double(), ref, rtol=1e-5, atol=1e-4)
        if other is None:
            assert torch.all(sq.diagonal() == 0)
        up = torch.randn(sq.shape, generator=g)
        sq.backward(up)
        ref.backward(up.double())
        assert torch.allclose(xa.grad.double(), ref_a64.grad, rtol=1e-4, atol=1e-3)
        if other is not None:
            assert torch.allclose(xb.grad.double(), ref_b64.grad, rtol=1e-4, atol=1e-3)
    # the hand-written backward against finite differences (float64, the matmul's path at any size)
    from augtune.methods.diffaug_ops import _SqDists

    a64, b64 = (t[:8, :5].double().requires_grad_(True) for t in (a + 0.1, b))
    assert torch.autograd.gradcheck(lambda u, v: _SqDists.apply(u, v), (a64, b64))
    assert torch.autograd.gradcheck(lambda u: _SqDists.apply(u, None), (a64,))


def test_two_view_loss_is_the_mean_of_the_two_centres_losses():
    """Q shared between the two centres (transposed): the same loss and gradients as each view in turn
    the centre against the other (the general path), up to float32 rounding, at the example's batch."""
    g = torch.Generator().manual_seed(0)
    b = 64
    base = [torch.randn(b, 40, generator=g), torch.randn(b, 8, generator=g)]
    views = [[t + 0.3 * torch.randn(t.shape, generator=g) for t in base] for _ in range(2)]
    same = torch.eye(b, dtype=torch.bool)
    for nu_z in (0.01, 1.0):
        one = [[t.clone().requires_grad_(True) for t in v] for v in views]
        two = [[t.clone().requires_grad_(True) for t in v] for v in views]
        (y1, z1), (y2, z2) = one
        ours = soft_contrastive_loss_two_views(y1, z1, y2, z2, 100.0, nu_z, 1.0)
        (u1, w1), (u2, w2) = two
        ref = (soft_contrastive_loss(u1, w1, w2, same, 100.0, nu_z, 1.0)
               + soft_contrastive_loss(u2, w2, w1, same, 100.0, nu_z, 1.0)) / 2
        assert ours.item() == pytest.approx(ref.item(), rel=1e-6)
        ours.backward()
        ref.backward()
        for p, q in zip([t for v in one for t in v], [t for v in two for t in v]):
            assert torch.allclose(p.grad, q.grad, rtol=1e-4, atol=1e-6 * q.grad.abs().max())


# ---------------------------------------------------------------------------------------------
# Conditional DDPM (eqs. 6-7) on a 2-D Gaussian mixture

CENTERS = torch.tensor([[-2.0, 0.0], [2.0, 1.0]])


def _mixture(n, g):
    k = torch.randint(0, 2, (n,), generator=g)
    return CENTERS[k] + 0.3 * torch.randn(n, 2, generator=g), torch.nn.functional.one_hot(k, 2).float()


@pytest.fixture(scope="module")
def trained_ddpm():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    net = ResidualMLPDenoiser(2, 2, 100, hidden=64, min_width=32)
    ema = copy.deepcopy(net)
    ddpm = DDPM(100)
    opt = torch.optim.Adam(net.parameters(), 2e-3)
    losses = []
    for i in range(400):
        x, c = _mixture(256, g)
        loss = ddpm.loss(net, x, c)
        opt.zero_grad()
        loss.backward()
        opt.step()
        ema_update(ema, net, min(0.99, (1 + i) / (10 + i)))
        losses.append(loss.item())
    return ddpm, ema, losses


def test_diffusion_loss_falls(trained_ddpm):
    _, _, losses = trained_ddpm
    first, last = sum(losses[:20]) / 20, sum(losses[-20:]) / 20
    assert last < 0.3 * first


@pytest.mark.parametrize("sample_steps", [None, 50])  # ancestral over T = 100, strided over 50
def test_samples_match_the_mixture_mean_and_covariance(trained_ddpm, sample_steps):
    ddpm, ema, _ = trained_ddpm
    torch.manual_seed(1)
    x, c = _mixture(3000, torch.Generator().manual_seed(1))
    s = ddpm.sample(ema, c, (2,), sample_steps)
    assert torch.allclose(s.mean(0), x.mean(0), atol=0.15)
    assert torch.allclose(torch.cov(s.T), torch.cov(x.T), atol=0.35)


def test_conditioning_lands_samples_near_their_component(trained_ddpm):
    ddpm, ema, _ = trained_ddpm
    torch.manual_seed(2)
    for k in range(2):
        cond = torch.zeros(500, 2)
        cond[:, k] = 1
        s = ddpm.sample(ema, cond, (2,), 50)
        assert (s.mean(0) - CENTERS[k]).norm() < 0.3
        assert ((s - CENTERS[k]).norm(dim=1) < 1.5).float().mean() > 0.9


def test_unet_denoiser_keeps_shapes_and_conditions_each_block():
    torch.manual_seed(0)
    for shape in ((1, 8, 8), (1, 28, 28), (3, 32, 32)):
        net = UNetDenoiser(shape[0], cond_dim=5, width=4, emb=16)
        # zero-init output
        assert torch.all(net(torch.randn(2, *shape), torch.tensor([0, 9]), torch.randn(2, 5)) == 0)
        torch.nn.init.normal_(net.outc.weight)
        x = torch.randn(2, *shape)
        t = torch.tensor([0, 9])
        out = net(x, t, torch.randn(2, 5))
        assert out.shape == x.shape
        assert not torch.allclose(net(x, t, torch.zeros(2, 5)), net(x, t, torch.ones(2, 5)))


# ---------------------------------------------------------------------------------------------
# Config: the schedule

@pytest.mark.parametrize("schedule,message", [
    ("A:2,C:1", "phases are A (encoder) and B (generator)"),
    ("A-2,B:1", "expected NAME:EPOCHS"),
    ("A:0,B:1", "at least one epoch"),
    ("", "expected NAME:EPOCHS"),
    ("B:4", "no A phase"),
])
def test_bad_schedules_are_refused_naming_the_key(schedule, message):
    with pytest.raises(ConfigError) as e:
        check_config(from_dict({"diffaug": {"schedule": schedule}}))
    assert (
        str(e.value).startswith("diffaug.schedule: ") and message in str(e.value) and "\n" not in str(e.value)
    )


def test_good_schedules_pass():
    for s in ("A:200,B:400,A:800", "A:330,B:330,A:340", "sync", "A:1"):
        assert check_config(from_dict({"diffaug": {"schedule": s}})).diffaug.schedule == s


# ---------------------------------------------------------------------------------------------
# In the loop: phases, generated positives at rate lambda, a smoke run on digits-as-vectors

def _cfg(**diffaug):
    return from_dict(
        {
            "dataset": {"name": "digits", "as_vectors": True, "max_train": 256, "max_test": 128},
            "model": {
                "hidden_dim": 64,
                "num_layers": 2,
                "embed_dim": 32,
                "proj_hidden_dim": 32,
                "proj_dim": 8,
            },
            "method": {"base": "simclr", "augment": ["diffaug"]},
            "train": {"epochs": 3, "batch_size": 64},
            "diffaug": {
                "schedule": "A:1,B:1,A:1",
                "steps": 20,
                "sample_steps": 5,
                "gen_hidden": 32,
                "gen_steps": 1,
                **diffaug,
            },
            "eval": {"metrics": ["knn"], "epoch_metrics": ["knn"], "references": False},
        }
    )


@pytest.fixture(scope="module")
def digits():
    return load_dataset(_cfg().dataset)


def test_smoke_run_trains_encoder_in_a_and_generator_in_b(digits):
    trainer = Trainer(_cfg(lam=0.3), digits, log=lambda s: None)
    aug = trainer.method.augments[0]
    enc = lambda: [p.clone() for p in trainer.method.objective.parameters()]  # noqa: E731
    gen = lambda: [p.clone() for p in aug.generator.parameters()]  # noqa: E731
    e0, g0 = enc(), gen()
    trainer.fit(stop_after=1)  # A
    e1, g1 = enc(), gen()
    assert any(not torch.equal(a, b) for a, b in zip(e0, e1)) and all(
        torch.equal(a, b) for a, b in zip(g0, g1)
    )
    assert aug.positives is None  # before the first B-step: ordinary augmentation only
    trainer.fit(stop_after=2)  # B
    e2, g2 = enc(), gen()
    assert all(torch.equal(a, b) for a, b in zip(e1, e2)) and any(
        not torch.equal(a, b) for a, b in zip(g1, g2)
    )
    final = trainer.fit()  # A again, with generated positives
    h = trainer.history
    assert [e["phase"] for e in h] == ["A", "B", "A"]
    assert "loss_scl" in h[0] and "loss_diffusion" in h[1] and all(math.isfinite(e["loss"]) for e in h)
    assert "diffaug_replaced" not in h[0] and 0.15 < h[2]["diffaug_replaced"] < 0.45
    assert "diffaug_gen_std_ratio" not in h[0] and math.isfinite(h[2]["diffaug_gen_std_ratio"])
    assert 0 <= final["knn_acc"] <= 1


def test_replaced_positives_are_generated_samples_at_rate_lambda(digits):
    lam = 0.2
    trainer = Trainer(_cfg(lam=lam), digits, log=lambda s: None)
    trainer.fit(stop_after=2)  # A then B: the generator has been trained
    method, aug = trainer.method, trainer.method.augments[0]
    info = StepInfo(2, trainer.global_step, trainer.total_steps, "A")
    x, n = trainer.x_train, len(trainer.x_train)
    replaced = 0
    for epoch in range(2, 22):
        method.on_epoch_start(StepInfo(epoch, trainer.global_step, trainer.total_steps, "A"))
        chosen = aug.replacements(epoch)
        pos = aug.positives  # generated for the epoch's chosen samples only, in index order
        assert pos.shape == (int(chosen.sum()), *x.shape[1:]) and torch.isfinite(pos).all()
        assert torch.equal(aug.slot >= 0, chosen) and torch.equal(aug.slot[chosen], torch.arange(len(pos)))
        idx = torch.randperm(n)[:64]  # a batch's samples, in any order
        v0, v1 = x[idx] + 0.01, x[idx] - 0.01
        out = aug.transform(Batch(x=x[idx], views=[v0, v1], index=idx), method, info)
        mask = out.extra["diffaug_replaced"]
        assert torch.equal(mask, chosen[idx])  # the epoch's draw decides, not the step
        assert torch.equal(out.views[0], v0)  # the anchor's own view is never replaced
        assert torch.equal(out.views[1][mask], pos[aug.slot[idx][mask]])
        assert torch.equal(out.views[1][~mask], v1[~mask])
        replaced += int(chosen.sum())
    assert pos.abs().sum() > 0 and not torch.allclose(pos, x[chosen], atol=1e-3)  # not zeros, not copies
    assert pos.std(0).mean() > 0.1  # really varied, not one constant vector
    rate, sd = replaced / (20 * n), math.sqrt(lam * (1 - lam) / (20 * n))
    assert abs(rate - lam) < 4 * sd
    b_info = StepInfo(1, 0, 1, "B")
    assert aug.transform(Batch(x=x, views=[x, x], index=torch.arange(n)), method, b_info).views[1] is x


def _diffaug(digits, **train):
    from augtune.methods.diffaug import DiffAug

    cfg = _cfg(lam=0.1)
    cfg = from_dict({**to_dict(cfg), "train": {**to_dict(cfg)["train"], **train}})
    return DiffAug(cfg, digits)


def test_the_epochs_replacements_are_bernoulli_lambda_per_sample_over_many_seeds(digits):
    """Over 40 seeds x 25 epochs: each sample is replaced at rate lambda, every sample alike (chi-square),
    every class alike (a contingency test: the draw does not see the data), and an epoch's draw is
    independent of the last one's (their 2 x 2 table)."""
    from scipy import stats

    lam, n = 0.1, len(digits.x_train)
    per_sample = torch.zeros(n)
    pairs = torch.zeros(2, 2)  # (replaced in epoch e, replaced in e + 1)
    for seed in range(40):
        aug = _diffaug(digits, seed=seed)
        draws = torch.stack([aug.replacements(e) for e in range(25)])  # (25, N)
        per_sample += draws.sum(0)
        for a in (0, 1):
            for b in (0, 1):
                pairs[a, b] += ((draws[:-1] == bool(a)) & (draws[1:] == bool(b))).sum()
    total = 40 * 25 * n
    assert abs(per_sample.sum() / total - lam) < 4 * math.sqrt(lam * (1 - lam) / total)
    assert stats.chisquare(per_sample.numpy()).pvalue > 1e-3  # uniform over the samples
    y = digits.y_train[:n]
    hits = torch.stack([per_sample[y == c].sum() for c in y.unique()])  # (classes,) replacements
    draws = torch.stack([40 * 25 * (y == c).sum() for c in y.unique()])  # (classes,) decisions
    by_class = torch.stack([hits, draws - hits], 1)  # (classes, 2): replaced, kept
    assert stats.chi2_contingency(by_class.numpy()).pvalue > 1e-3
    assert stats.chi2_contingency(pairs.numpy()).pvalue > 1e-3


def test_the_replacements_depend_on_seed_and_epoch_only(digits):
    """The same (seed, epoch) draws the same set on other data of the same size, whatever the global RNG
    (every DDP rank, a resumed run); another seed or epoch draws another set."""
    aug = _diffaug(digits, seed=3)
    other = copy.copy(aug)
    other.x_train = torch.randn_like(aug.x_train)
    torch.manual_seed(123)
    first = aug.replacements(4)
    torch.manual_seed(999)
    assert torch.equal(other.replacements(4), first)
    assert not torch.equal(aug.replacements(5), first)
    assert not torch.equal(_diffaug(digits, seed=4).replacements(4), first)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_lambda_one_generates_the_whole_set_as_the_full_refresh_did(digits, seed):
    """lambda = 1: every sample is chosen, and the positives are bitwise the full refresh's (the draw
    uses its own generator, so the sampling sees the same RNG stream); lambda 0.1 generates only the
    chosen ~10%."""
    trainer = Trainer(_cfg(lam=1.0), digits, log=lambda s: None)
    trainer.fit(stop_after=2)
    method, aug = trainer.method, trainer.method.augments[0]
    torch.manual_seed(seed)
    method.on_epoch_start(StepInfo(2, trainer.global_step, trainer.total_steps, "A"))
    torch.manual_seed(seed)
    full = aug.generate(method, trainer.x_train)
    assert torch.equal(aug.positives, full) and torch.equal(aug.slot, torch.arange(len(full)))

    rows = []
    sample = DDPM.sample

    def counted(net, cond, *args, **kwargs):
        rows.append(len(cond))
        return sample(aug.ddpm, net, cond, *args, **kwargs)

    aug.ddpm.sample = counted
    aug.d = aug.d.__class__(**{**vars(aug.d), "lam": 0.1})
    method.on_epoch_start(StepInfo(3, trainer.global_step, trainer.total_steps, "A"))
    assert sum(rows) == int(aug.replacements(3).sum()) < 0.2 * len(full)


def test_a_b_step_conditions_once_however_many_generator_updates(digits, monkeypatch):
    """diffaug.gen_steps updates of a B-step share the step's z_c (the encoder is frozen in B): one
    encoder pass per step, not one per update."""
    from augtune.methods.diffaug import DiffAug

    calls = []
    condition = DiffAug.condition

    def counted(self, method, x):
        calls.append(len(x))
        return condition(self, method, x)

    monkeypatch.setattr(DiffAug, "condition", counted)
    trainer = Trainer(_cfg(lam=0.2, gen_steps=4, schedule="A:1,B:1"), digits, log=lambda s: None)
    trainer.fit()
    aug = trainer.method.augments[0]
    assert int(aug.updates) == 4 * trainer.steps_per_epoch
    assert len(calls) == trainer.steps_per_epoch  # phase B only; A before any B-step generates nothing


def test_the_refresh_runs_in_the_trainings_precision(digits, monkeypatch):
    """The positives' refresh runs its denoiser under bf16 autocast where the steps do (a GPU's
    default) and in float32 where they do not; the positives are float32 either way. On the CPU the
    trainer's switch is set by hand: the same code path with the CPU's autocast."""
    trainer = Trainer(_cfg(lam=0.2), digits, log=lambda s: None)
    trainer.fit(stop_after=2)  # A then B: the generator has been trained
    method, aug = trainer.method, trainer.method.augments[0]
    seen = []
    aug.ema_generator.register_forward_hook(
        lambda module, args, out: seen.append((torch.is_autocast_enabled("cpu"), out.dtype)))
    for autocast in (False, True):
        seen.clear()
        method.on_epoch_start(StepInfo(2, trainer.global_step, trainer.total_steps, "A", autocast=autocast))
        assert seen and set(seen) == {(autocast, torch.bfloat16 if autocast else torch.float32)}
        assert aug.positives.dtype == torch.float32 and torch.isfinite(aug.positives).all()
    infos = []
    monkeypatch.setattr(method, "on_epoch_start", infos.append)
    trainer.bf16 = True  # the loop hands its precision to the epoch's set-up
    trainer.train_epoch()
    assert [i.autocast for i in infos] == [True]


def test_sync_trains_both_every_step_and_lambda_zero_never_generates(digits):
    trainer = Trainer(_cfg(schedule="sync", lam=0.0), digits, log=lambda s: None)
    trainer.fit(stop_after=2)
    h = trainer.history
    assert all("loss_scl" in e and "loss_diffusion" in e and "phase" not in e for e in h)
    aug = trainer.method.augments[0]
    assert int(aug.updates) == 2 * trainer.steps_per_epoch and aug.positives is None


@pytest.mark.parametrize("kind", ["beta", "posterior"])
def test_sample_variance_reaches_every_sampling_call(tmp_path, digits, monkeypatch, kind):
    """diffaug.sample_variance is what the buffer's refresh and the end-of-run figure sample with."""
    from augtune.trainables import train_run

    seen = []
    sample = DDPM.sample

    def spy(self, *args, **kwargs):
        seen.append(kwargs.get("sample_variance"))
        return sample(self, *args, **kwargs)

    monkeypatch.setattr(DDPM, "sample", spy)
    cfg = from_dict({**to_dict(_cfg(lam=0.5, sample_variance=kind)),
                     "eval": {"metrics": ["knn"], "epoch_metrics": [], "references": False}})
    record = train_run(cfg, digits, tmp_path / "run", log=lambda s: None, on_completed=end_of_run_figures)
    assert record["status"] == "completed" and record["figures"] and "figure_errors" not in record
    assert len(seen) >= 4 and set(seen) == {kind}  # one refresh (the last A epoch) + three figure columns
    assert record["config"]["diffaug"]["sample_variance"] == kind


def test_unknown_sample_variance_is_a_config_error():
    with pytest.raises(ConfigError, match="diffaug.sample_variance"):
        from_dict({"diffaug": {"sample_variance": "fixed_large"}})


def test_continuing_from_a_checkpoint_is_bitwise_identical(tmp_path, digits):
    cfg = _cfg(lam=0.5)
    straight = Trainer(cfg, digits, log=lambda s: None)
    straight.fit()
    first = Trainer(cfg, digits, log=lambda s: None)
    first.fit(tmp_path / "c.pt", stop_after=2)
    torch.manual_seed(123)
    second = Trainer(cfg, digits, log=lambda s: None)
    second.load_checkpoint(tmp_path / "c.pt")
    second.fit()
    a, b = straight.method.state_dict(), second.method.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_checkpoint_holds_the_generator_once_where_its_ema_is_the_same(tmp_path, digits):
    """Before the first generator update, and after the last B-phase (where the generator, never trained
    again, becomes the EMA that samples), the two copies are equal: a checkpoint stores one, and loading it
    restores both bit for bit. Between, both are stored."""
    cfg = _cfg(lam=0.5)  # A:1,B:1,A:1
    trainer = Trainer(cfg, digits, log=lambda s: None)
    aug = trainer.method.augments[0]
    held, ema_after_b = {}, None
    for stop in (1, 2, 3):
        trainer.fit(tmp_path / f"c{stop}.pt", stop_after=stop)
        held[stop] = sum(k.startswith("augments.0.ema_generator.") for k in
                         torch.load(tmp_path / f"c{stop}.pt", weights_only=True)["method"])
        fresh = Trainer(cfg, digits, log=lambda s: None)
        fresh.load_checkpoint(tmp_path / f"c{stop}.pt")
        for net in ("generator", "ema_generator"):
            a, b = getattr(aug, net).state_dict(), getattr(fresh.method.augments[0], net).state_dict()
            assert all(torch.equal(a[k], b[k]) for k in a), (stop, net)
        if stop == 2:
            ema_after_b = copy.deepcopy(aug.ema_generator.state_dict())
            assert not aug.ema_is_generator()
    assert held == {1: 0, 2: len(aug.ema_generator.state_dict()), 3: 0}
    gen = aug.generator.state_dict()
    assert all(torch.equal(gen[k], v) for k, v in ema_after_b.items())  # the generator is now its EMA


def test_after_the_last_b_the_generator_becomes_its_ema_once_and_again_after_a_load(digits, monkeypatch):
    """The copy is made at the first epoch start after the last B-phase, not at every one (the generator
    never trains again); loading a state (a resume, a PBT exploit) makes it again at the next start."""
    trainer = Trainer(_cfg(lam=0.5), digits, log=lambda s: None)  # A:1,B:1,A:1
    trainer.fit()
    method, aug = trainer.method, trainer.method.augments[0]
    assert aug.ema_is_generator()
    copies = []
    load = type(aug.generator).load_state_dict
    monkeypatch.setattr(type(aug.generator), "load_state_dict",
                        lambda net, *a, **k: (copies.append(net is aug.generator), load(net, *a, **k))[1])
    info = StepInfo(3, trainer.global_step, trainer.total_steps, "A")
    method.on_epoch_start(info)
    assert copies == []
    with torch.no_grad():
        next(aug.generator.parameters()).add_(1.0)  # a loaded state whose generator is not its EMA
    method.load_state_dict(method.state_dict())
    assert not aug.ema_is_generator()
    copies.clear()
    method.on_epoch_start(info)
    assert copies == [True] and aug.ema_is_generator()


# ---------------------------------------------------------------------------------------------
# Images (U-Net generator) and the figures

def test_image_run_with_the_unet_draws_its_figure_at_the_end(tmp_path):
    from augtune.trainables import train_run

    cfg = from_dict({
        "dataset": {"name": "digits", "max_train": 128, "max_test": 64},
        "model": {"backbone": "cnn", "width": 4, "proj_hidden_dim": 16, "proj_dim": 8},
        "method": {"base": "simclr", "augment": ["diffaug"]},
        "train": {"epochs": 3, "batch_size": 64},
        "diffaug": {"schedule": "A:1,B:1,A:1", "steps": 10, "sample_steps": 3, "gen_width": 4, "lam": 0.5},
        "eval": {"metrics": ["knn"], "epoch_metrics": [], "references": False},
    })
    data = load_dataset(cfg.dataset)
    record = train_run(cfg, data, tmp_path / "run", log=lambda s: None, on_completed=end_of_run_figures)
    assert record["status"] == "completed" and "figure_errors" not in record
    assert record["figures"] == ["figures/diffaug_samples_digits_lam0.5_seed0.png"]
    assert (tmp_path / "run" / "figures" / "diffaug_samples_digits_lam0.5_seed0.png").stat().st_size > 1000
    last = record["epochs"][-1]
    assert last["phase"] == "A" and 0.2 < last["diffaug_replaced"] < 0.8


def test_plot_draws_violins_per_lambda_and_the_lambda_curve(tmp_path, digits):
    from augtune.plots import find_runs, plot
    from augtune.trainables import train_run

    for lam in (0.0, 0.3):
        cfg = _cfg(lam=lam)
        evals = {"metrics": ["knn"], "epoch_metrics": [], "references": False, "figures": []}
        cfg = from_dict({**to_dict(cfg), "eval": evals})
        train_run(cfg, digits, tmp_path / f"lam{lam}", log=lambda s: None, on_completed=end_of_run_figures)
    files = plot("diffaug", find_runs([tmp_path]), tmp_path / "figs")
    names = sorted(p.name for p in files)
    assert names == ["diffaug_lambda_digits.png", "diffaug_samples_digits_lam0.0_seed0.png",
                     "diffaug_samples_digits_lam0.3_seed0.png"]
    assert all(p.stat().st_size > 1000 for p in files)


def test_gen_steps_gives_more_generator_updates_per_batch_in_b_only(digits):
    trainer = Trainer(_cfg(gen_steps=3), digits, log=lambda s: None)
    aug = trainer.method.augments[0]
    trainer.fit(stop_after=1)
    assert int(aug.updates) == 0
    g1 = [p.clone() for p in aug.generator.parameters()]
    trainer.fit(stop_after=2)
    assert int(aug.updates) == 3 * trainer.steps_per_epoch
    assert any(not torch.equal(a, b) for a, b in zip(g1, aug.generator.parameters()))


def test_clipping_x0_keeps_a_briefly_trained_generator_in_the_data_range():
    """32-d, components at -1 and +1 on every feature: 300 steps leave the predictor's error at large t,
    which the chain amplifies (~1/sqrt(abar_T)) to samples ~20 off; clamping x0 keeps them in range."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    net = ResidualMLPDenoiser(32, 2, 100, hidden=64, min_width=64)
    ddpm = DDPM(100)
    opt = torch.optim.Adam(net.parameters(), 2e-3)

    def draw(n):
        k = torch.randint(0, 2, (n,), generator=g)
        x = (2 * k - 1).float()[:, None] + 0.3 * torch.randn(n, 32, generator=g)
        return x, torch.nn.functional.one_hot(k, 2).float()

    for _ in range(300):
        x, c = draw(256)
        loss = ddpm.loss(net, x, c)
        opt.zero_grad()
        loss.backward()
        opt.step()
    x, c = draw(1000)
    sign = c[:, 1] * 2 - 1  # the component's mean, -1 or +1
    clip = (x.min(0).values, x.max(0).values)
    for steps in (None, 25):
        free = ddpm.sample(net, c, (32,), steps)
        s = ddpm.sample(net, c, (32,), steps, clip)
        assert torch.all((s >= clip[0]) & (s <= clip[1]))  # the last step returns the clamped x0
        assert (s.mean(1) - sign).abs().mean() < 0.2 * (free.mean(1) - sign).abs().mean()


def test_the_refresh_generates_for_the_chosen_samples_the_epoch_visits_only(digits):
    """The loop says at an epoch's start which samples its steps train on (the last partial batch is
    dropped): a positive is generated for a sample both chosen and visited, never for one the epoch
    skips; what the steps see is unchanged (the draw is the same, and no step reads an unvisited row)."""
    cfg = to_dict(_cfg(lam=0.5))
    cfg["train"]["batch_size"] = 48  # not a divisor of the 256 training rows: a partial batch is dropped
    trainer = Trainer(from_dict(cfg), digits, log=lambda s: None)
    trainer.fit(stop_after=2)
    method, aug = trainer.method, trainer.method.augments[0]
    n, batch = len(trainer.x_train), trainer.cfg.train.batch_size
    for epoch in (2, 3, 4):
        visits = trainer.visits(epoch)
        assert len(visits) == (n // batch) * batch < n and len(set(visits.tolist())) == len(visits)
        method.on_epoch_start(StepInfo(epoch, trainer.global_step, trainer.total_steps, "A", visits=visits))
        visited = torch.zeros(n, dtype=torch.bool)
        visited[visits] = True
        chosen = aug.replacements(epoch)
        assert torch.equal(aug.slot >= 0, chosen & visited)  # skipped samples get no positive
        assert len(aug.positives) == int((chosen & visited).sum()) < int(chosen.sum())
        idx = visits[:batch]  # the epoch's first step
        x = trainer.x_train[idx]
        out = aug.transform(Batch(x=x, views=[x + 0.01, x - 0.01], index=idx), method,
                            StepInfo(epoch, trainer.global_step, trainer.total_steps, "A"))
        assert torch.equal(out.extra["diffaug_replaced"], chosen[idx])  # the step's rows: the same decision
