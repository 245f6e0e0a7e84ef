"""DiffAug's sampler: an ancestral DDPM on a respaced chain, sigma_t^2 = the respaced beta ("beta", the
default) or the posterior's beta_tilde ("posterior"). Checked against diffusers' DDPMScheduler
(fixed_large / fixed_small, custom timesteps), against DDIM with eta = 1, and against the closed-form
variance that the exact noise predictor of Gaussian data gives."""
from __future__ import annotations

import pytest
import torch

from augtune.methods.diffaug_ops import DDPM, SAMPLE_VARIANCES

KINDS = {"beta": "fixed_large", "posterior": "fixed_small"}  # ours -> diffusers' variance_type


pytestmark = pytest.mark.usefixtures("one_thread")


def _stand_in(ddpm: DDPM):
    """A fixed, deterministic g_phi(x_t, t, z_c) that depends on all three and keeps the chain bounded:
    the exact noise predictor of N(mean(z_c), 0.5^2) data, plus a small nonlinear error."""
    def net(x: torch.Tensor, t: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        ab = ddpm.alphas_bar[t].view(-1, 1)
        mu = cond.mean(1, keepdim=True)
        return (1 - ab).sqrt() * (x - ab.sqrt() * mu) / (ab * 0.25 + 1 - ab) + 0.05 * torch.tanh(x)
    return net


def _scheduler(ddpm: DDPM, kind: str, ts: list[int], clip: float | None = None):
    diffusers = pytest.importorskip("diffusers", reason="diffusers is not installed (pip install diffusers)")
    sched = diffusers.DDPMScheduler(num_train_timesteps=ddpm.steps, trained_betas=ddpm.betas.numpy(),
                                    variance_type=KINDS[kind], clip_sample=clip is not None,
                                    clip_sample_range=clip or 1.0)
    sched.set_timesteps(timesteps=ts)  # the same respaced chain
    return sched


def _diffusers_variance(sched, t) -> torch.Tensor:
    """sigma_t^2 of diffusers' step t through its public `step`: from x_t = 0 with a zero noise prediction
    the mean is 0, so prev_sample is sigma_t times the noise its `generator` draws (redrawn here from the
    same seed); 0 on the step to x0, which adds no noise."""
    zero = torch.zeros(64, 1)  # (B, D): `step` reads the channel dimension
    out = sched.step(zero, t, zero, generator=torch.Generator().manual_seed(0)).prev_sample
    noise = torch.randn(64, 1, generator=torch.Generator().manual_seed(0))
    return (out / noise).pow(2).mean()


def _prev(ts: list[int], i: int) -> int | None:
    return ts[i + 1] if i + 1 < len(ts) else None


def _gaussian_eps(mu: float, s: float, ddpm: DDPM):
    """The exact noise predictor of N(mu, s^2) data: E[eps | x_t] = sqrt(1 - ab)(x_t - sqrt(ab) mu) /
    (ab s^2 + 1 - ab)."""
    def net(x, t, cond):
        ab = ddpm.alphas_bar[t].view(-1, 1)
        return (1 - ab).sqrt() * (x - ab.sqrt() * mu) / (ab * s ** 2 + 1 - ab)
    return net


@pytest.mark.parametrize("steps,sample_steps", [(100, None), (100, 10), (1000, None), (1000, 50), (1000, 10)])
@pytest.mark.parametrize("kind", SAMPLE_VARIANCES)
def test_variance_schedule_matches_diffusers(steps, sample_steps, kind):
    """Both sides hold abar in float32 (rel. error 6e-8) and form 1 - abar_t / abar_prev, which
    amplifies it by 1 / beta <= 1e4: agreement to 1e-3 relative, and to 1e-6 absolute."""
    ddpm = DDPM(steps)
    ts = ddpm.timesteps(sample_steps)
    sched = _scheduler(ddpm, kind, ts)
    assert sched.timesteps.tolist() == ts
    ours = torch.stack([ddpm.variance(t, _prev(ts, i), kind) for i, t in enumerate(ts)])
    ref = torch.stack([_diffusers_variance(sched, t) for t in sched.timesteps]).float()
    assert (ours[:-1] - ref[:-1]).abs().max() < 1e-6
    assert ((ours[:-1] - ref[:-1]).abs() / ref[:-1]).max() < 1e-3
    # the step to x0 adds no noise on either side (diffusers skips t = 0, `sample` its last step);
    # beta_tilde is 0 there, the respaced beta that of the full chain's first step
    assert ref[-1] == 0.0
    assert (ours[-1] == 0.0) if kind == "posterior" else (abs(ours[-1] - ddpm.betas[0]) < 1e-6)
    if kind == "posterior" and sample_steps is not None:  # the respaced chain's beta_tilde < its beta
        beta = torch.stack([ddpm.variance(t, _prev(ts, i), "beta") for i, t in enumerate(ts)])
        assert (ours[:-1] < beta[:-1]).all()


@pytest.mark.parametrize("clip", [None, 1.0])
@pytest.mark.parametrize("kind", SAMPLE_VARIANCES)
def test_sampler_trajectory_matches_diffusers(kind, clip):
    """Same seed, same stand-in network: diffusers draws its initial noise and one noise per step but
    the last from the same global RNG, in the same order, so the samples must agree. Its abar is a
    float32 cumprod, ours a float64 one rounded to float32: observed <= 1e-5 on samples of size ~1."""
    ddpm = DDPM(1000)
    ts = ddpm.timesteps(50)
    sched = _scheduler(ddpm, kind, ts, clip)
    cond = torch.linspace(-1, 1, 64 * 3).view(64, 3)
    lim = None if clip is None else (torch.tensor(-clip), torch.tensor(clip))
    net = _stand_in(ddpm)
    torch.manual_seed(0)
    ours = ddpm.sample(net, cond, (5,), 50, lim, sample_variance=kind)
    torch.manual_seed(0)
    x = torch.randn(64, 5)
    for t in sched.timesteps:
        x = sched.step(net(x, torch.full((64,), int(t)), cond), t, x).prev_sample
    assert ours.abs().max() < 5 and (ours - x).abs().max() < 1e-4


def test_default_is_the_respaced_beta_sampler_bit_for_bit():
    """The default (and "beta") is eq. 7's ancestral update with sigma^2 = the respaced beta, written
    out here as it was before the option existed."""
    ddpm = DDPM(100)
    net, cond = _stand_in(ddpm), torch.randn(32, 3, generator=torch.Generator().manual_seed(1))
    for sample_steps in (None, 10):
        torch.manual_seed(3)
        default = ddpm.sample(net, cond, (4,), sample_steps)
        torch.manual_seed(3)
        beta = ddpm.sample(net, cond, (4,), sample_steps, sample_variance="beta")
        torch.manual_seed(3)
        x = torch.randn(32, 4)
        ts = ddpm.timesteps(sample_steps)
        for i, t in enumerate(ts):
            ab = ddpm.alphas_bar[t]
            ab_prev = ddpm.alphas_bar[ts[i + 1]] if i + 1 < len(ts) else torch.ones(())
            alpha = ab / ab_prev
            mean = (x - (1 - alpha) / (1 - ab).sqrt() * net(x, torch.full((32,), t), cond)) / alpha.sqrt()
            x = mean + (1 - alpha).sqrt() * torch.randn_like(x) if i + 1 < len(ts) else mean
        assert torch.equal(default, beta) and torch.equal(default, x)


def test_posterior_sampler_is_ddim_with_eta_one():
    """DDIM (Song et al. eq. 12) with sigma^2 = eta^2 beta_tilde, eta = 1:
    x_prev = sqrt(ab_prev) x0 + sqrt(1 - ab_prev - sigma^2) eps + sigma z, the same Markov chain
    (computed here in float64, with the same float32 noise)."""
    ddpm = DDPM(100)
    net, cond = _stand_in(ddpm), torch.randn(32, 3, generator=torch.Generator().manual_seed(2))
    torch.manual_seed(4)
    ours = ddpm.sample(net, cond, (4,), 10, sample_variance="posterior")
    torch.manual_seed(4)
    x = torch.randn(32, 4).double()
    ts = ddpm.timesteps(10)
    abar = ddpm.alphas_bar.double()
    for i, t in enumerate(ts):
        ab, ab_prev = abar[t], abar[ts[i + 1]] if i + 1 < len(ts) else torch.ones((), dtype=torch.float64)
        eps = net(x.float(), torch.full((32,), t), cond).double()
        x0 = (x - (1 - ab).sqrt() * eps) / ab.sqrt()
        var = (1 - ab_prev) / (1 - ab) * (1 - ab / ab_prev)
        x = ab_prev.sqrt() * x0 + (1 - ab_prev - var).sqrt() * eps
        if i + 1 < len(ts):
            x = x + var.sqrt() * torch.randn(32, 4).double()
    assert ours.abs().max() < 5 and (ours - x).abs().max() < 1e-4


def _closed_form_std(ddpm: DDPM, ts: list[int], kind: str, s: float) -> float:
    """With the exact predictor of N(mu, s^2) data each step is linear-Gaussian, x_prev - mu =
    c_t (x_t - sqrt(ab) mu ...) + sigma z; its variance obeys v_prev = c_t^2 v + sigma_t^2, from v = 1."""
    ab_all = ddpm.alphas_bar.double()
    v = torch.ones((), dtype=torch.float64)
    for i, t in enumerate(ts):
        ab = ab_all[t]
        ab_prev = ab_all[ts[i + 1]] if i + 1 < len(ts) else torch.ones((), dtype=torch.float64)
        alpha = ab / ab_prev
        c = (1 - (1 - alpha) / (ab * s ** 2 + 1 - ab)) / alpha.sqrt()  # d mean / d x_t
        shrink = (1 - ab_prev) / (1 - ab) if kind == "posterior" else 1.0  # beta_tilde / beta
        var = 0.0 if i + 1 == len(ts) else (1 - alpha) * shrink
        v = c ** 2 * v + var
    return float(v.sqrt())


@pytest.mark.parametrize("sample_steps", [None, 10])
def test_exact_predictor_gives_the_closed_form_spread_for_each_variance(sample_steps):
    """N(1, 0.3^2) data, exact predictor, T = 100: the samples' std is the linear-Gaussian recursion's,
    per choice (5 seeds x 8000 x 4 numbers: the std's standard error is 0.25%, asserted to 2%); "beta"
    spreads wider than the data, "posterior" narrower, and the gap grows as the chain is respaced."""
    ddpm, mu, s = DDPM(100), 1.0, 0.3
    net, cond = _gaussian_eps(mu, s, ddpm), torch.zeros(8000, 1)
    ts = ddpm.timesteps(sample_steps)
    stds = {}
    for kind in SAMPLE_VARIANCES:
        samples = []
        for seed in range(5):
            torch.manual_seed(seed)
            samples.append(ddpm.sample(net, cond, (4,), sample_steps, sample_variance=kind))
        x = torch.cat(samples)
        expected = _closed_form_std(ddpm, ts, kind, s)
        stds[kind] = float(x.std())
        assert abs(stds[kind] / expected - 1) < 0.02, (kind, stds[kind], expected)
        assert abs(float(x.mean()) - mu) < 0.01
    assert stds["posterior"] < s < stds["beta"]
    if sample_steps == 10:  # 10 steps: 0.44 vs 0.16, against the data's 0.3
        assert stds["beta"] > 1.3 * s and stds["posterior"] < 0.7 * s


def test_unknown_sample_variance_is_refused():
    ddpm = DDPM(10)
    with pytest.raises(ValueError, match="sample_variance"):
        ddpm.sample(_stand_in(ddpm), torch.zeros(2, 3), (4,), sample_variance="fixed_large")
    with pytest.raises(ValueError, match="sample_variance"):
        ddpm.variance(5, 4, "small")


def _per_step_reference(ddpm: DDPM, net, cond, shape, sample_steps, clip, kind) -> torch.Tensor:
    """The sampler as it was before its per-step coefficients were computed once per chain: each step
    derives them from 0-d tensors, and the network embeds the condition at every call."""
    b, dtype = cond.shape[0], ddpm.alphas_bar.dtype
    x = torch.randn((b, *shape)).to(dtype)
    ts = ddpm.timesteps(sample_steps)
    one = torch.ones((), dtype=dtype)
    for i, t in enumerate(ts):
        eps = net(x, torch.full((b,), t), cond).to(dtype)
        ab = ddpm.alphas_bar[t]
        ab_prev = ddpm.alphas_bar[ts[i + 1]] if i + 1 < len(ts) else one
        alpha = ab / ab_prev
        beta = 1 - alpha
        if clip is None:
            mean = (x - beta / (1 - ab).sqrt() * eps) / alpha.sqrt()
        else:
            x0 = (x - (1 - ab).sqrt() * eps) / ab.sqrt()
            x0 = torch.minimum(torch.maximum(x0, clip[0]), clip[1])
            mean = ab_prev.sqrt() * beta / (1 - ab) * x0 + alpha.sqrt() * (1 - ab_prev) / (1 - ab) * x
        if i + 1 == len(ts):
            x = mean
        else:
            x = mean + ddpm.variance(t, ts[i + 1], kind).sqrt() * torch.randn(x.shape).to(dtype)
    return x


@pytest.mark.parametrize("denoiser", ["mlp", "unet"])
@pytest.mark.parametrize("kind", SAMPLE_VARIANCES)
@pytest.mark.parametrize("clip", [False, True])
def test_the_chain_is_bit_for_bit_the_per_step_one(denoiser, kind, clip):
    """`sample` computes the chain's coefficients once (`DDPM._chain`) and the condition's embedding once
    (`embed_condition`), inside inference mode: the same samples, bit for bit, as a chain that derives
    them at every step, in float32, in float64 and under bf16 autocast; and an ordinary tensor back."""
    from augtune.methods.diffaug_ops import ResidualMLPDenoiser, UNetDenoiser

    torch.manual_seed(0)
    if denoiser == "mlp":
        net, shape = ResidualMLPDenoiser(6, 3, 100, hidden=32, min_width=16), (6,)
    else:
        net, shape = UNetDenoiser(1, 3, width=4, emb=16), (1, 6, 6)
    with torch.no_grad():  # the zero-initialised output layers would make every prediction 0
        for p in net.parameters():
            p.add_(0.1 * torch.randn_like(p))
    cond = torch.randn(9, 3)
    for dtype, autocast in ((torch.float32, False), (torch.float64, False), (torch.float32, True)):
        ddpm, n = DDPM(100).to(dtype), net.to(dtype)
        lim = (torch.full(shape, -0.5, dtype=dtype), torch.full(shape, 0.5, dtype=dtype)) if clip else None
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            torch.manual_seed(1)
            ours = ddpm.sample(n, cond.to(dtype), shape, 10, lim, sample_variance=kind)
            torch.manual_seed(1)
            ref = _per_step_reference(ddpm, n, cond.to(dtype), shape, 10, lim, kind)
        assert torch.equal(ours, ref), (dtype, autocast)
    assert not ours.is_inference()
    ours.add_(1)  # in place, outside inference mode
