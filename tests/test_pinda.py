"""PiNDA: the pi-noise generator's distributions, the penalty, Algorithms 1-2, and its baselines."""
from __future__ import annotations

import pytest
import torch

from augtune.config import from_dict
from augtune.data import load_dataset
from augtune.methods import Batch, StepInfo, build_method
from augtune.methods.losses import nt_xent
from augtune.methods.pinda import MLPGenerator, PiNoiseGenerator, build_generator, inverse_norm_penalty
from augtune.plots import PlotError, load_run, plot
from augtune.trainables import train_run
from augtune.trainables.loop import Trainer
from augtune.plots import end_of_run_figures

INFO = StepInfo(0, 0, 10)
SMALL = {"hidden_dim": 64, "embed_dim": 32, "proj_hidden_dim": 32, "proj_dim": 16, "pred_hidden_dim": 32}


def cfg_of(**sections):
    data = {"dataset": {"name": "digits", "as_vectors": True, "max_train": 512, "max_test": 200},
            "model": dict(SMALL), "view": {"name": "identity"}, "method": {"augment": ["pinda"]},
            "train": {"epochs": 2, "batch_size": 128}, "eval": {"metrics": ["knn"], "references": False}}
    for k, v in sections.items():
        data.setdefault(k, {}).update(v)
    return from_dict(data)


@pytest.fixture(scope="module")
def digits_vectors():
    return load_dataset(cfg_of().dataset)


def generator(mu="zero", noise="gaussian", dim=6):
    torch.manual_seed(0)
    return PiNoiseGenerator(MLPGenerator(dim, 2 if mu == "learned" else 1, hidden=16), mu, noise)


def test_reparameterised_noise_carries_gradients_to_psi():
    for mu in ("zero", "learned"):
        for noise in ("gaussian", "uniform"):
            g = generator(mu, noise)
            g(torch.randn(5, 6)).square().sum().backward()
            grads = [p.grad for p in g.parameters()]
            assert all(gr is not None and gr.abs().sum() > 0 for gr in grads), (mu, noise)


def test_mu_zero_has_no_mean_parameters_and_zero_mean_noise():
    zero, learned = generator("zero"), generator("learned")
    n_zero = sum(p.numel() for p in zero.parameters())
    n_learned = sum(p.numel() for p in learned.parameters())
    assert n_learned - n_zero == 16 * 6 + 6  # exactly the mean head's weights and biases
    x = torch.randn(1, 6).expand(20000, 6)  # one sample, many draws of eps
    with torch.no_grad():
        mu, sigma = zero.params(x)
        draws = zero.sample(mu, sigma)
    assert mu is None
    assert draws.mean(0).abs().max() < 5 * sigma[0].max() / 20000**0.5 + 1e-6  # mean ~ 0 (5 standard errors)
    assert torch.allclose(draws.std(0), sigma[0], rtol=0.05)  # Sigma is the standard deviation (eq. 19)
    with torch.no_grad():
        mu_l, sigma_l = learned.params(x)
        draws_l = learned.sample(mu_l, sigma_l)
    assert torch.allclose(draws_l.mean(0), mu_l[0], atol=5 * sigma_l[0].max().item() / 20000**0.5)


def test_uniform_noise_is_bounded_by_u_and_fills_the_interval():
    g = generator("zero", "uniform")
    x = torch.randn(1, 6).expand(5000, 6)
    with torch.no_grad():
        _, u = g.params(x)
        draws = g.sample(None, u)
    assert (u >= 0).all() and (draws.abs() <= u + 1e-7).all()
    assert torch.allclose(draws.abs().max(0).values, u[0], rtol=0.01)  # reaches +-u
    assert torch.allclose(draws.var(0), u[0] ** 2 / 3, rtol=0.1)  # U(-u, u) has variance u^2 / 3


def test_penalty_is_the_inverse_mean_norm_and_grows_as_the_noise_shrinks():
    noise = torch.zeros(4, 3)
    noise[:, 0] = torch.tensor([1.0, 2.0, 3.0, 4.0])  # norms 1..4, mean 2.5
    assert inverse_norm_penalty(noise).item() == pytest.approx(1 / 2.5)
    values = [inverse_norm_penalty(noise * s).item() for s in (4.0, 1.0, 0.25, 0.01)]
    assert values == sorted(values) and values[-1] == pytest.approx(1 / 0.025, rel=1e-5)
    scale = torch.tensor(1.0, requires_grad=True)
    inverse_norm_penalty(noise * scale).backward()
    assert scale.grad < 0  # descending the penalty makes the noise larger


def _noise_norms(penalty: float, data) -> list[float]:
    cfg = cfg_of(pinda={"penalty": penalty}, train={"epochs": 8, "schedule": "constant"}, eval={"every": 0})
    trainer = Trainer(cfg, data, log=lambda s: None)
    trainer.fit()
    return [h["pinda_noise_norm"] for h in trainer.history]


def test_without_the_penalty_the_noise_shrinks_and_with_it_it_does_not(digits_vectors):
    free = _noise_norms(0.0, digits_vectors)
    held = _noise_norms(1.0, digits_vectors)
    assert free == sorted(free, reverse=True) and free[-1] < 0.25 * free[0]  # alone it shrinks (B.4)
    assert held[-1] > 0.5 * held[0] and held[-1] > 10 * free[-1]  # the penalty holds it at a scale


def _batch(x: torch.Tensor, views=None) -> Batch:
    return Batch(x=x, views=views or [x.clone(), x.clone()], index=torch.arange(len(x)))


def test_algorithm_2_draws_pinda_for_half_of_the_view_slots_and_algorithm_1_for_view_one(digits_vectors):
    torch.manual_seed(0)
    x = digits_vectors.x_train[:256]
    uniform = build_method(cfg_of(view={"name": "noise"}), digits_vectors)  # auto: Alg. 2
    aug = uniform.augments[0]
    assert not aug.pair
    masks = torch.stack([aug.slots(256, 2, x) for _ in range(40)])  # (40, V, B)
    assert masks.float().mean().item() == pytest.approx(0.5, abs=0.01)  # |A| = 2: PiNDA or a(x)
    both = (masks[:, 0] & masks[:, 1]).float().mean().item()
    assert both == pytest.approx(0.25, abs=0.02)  # the two draws are independent

    pair = build_method(cfg_of(), digits_vectors).augments[0]  # view identity -> Alg. 1
    out = pair.transform(_batch(x), None, INFO)
    assert pair.pair and not torch.equal(out.views[0], x) and torch.equal(out.views[1], x)
    assert out.extra["pinda_noise"].shape == x.shape


def test_the_pinda_view_is_x_plus_the_generated_noise(digits_vectors):
    method = build_method(cfg_of(), digits_vectors)
    aug = method.augments[0]
    x = digits_vectors.x_train[:8]
    torch.manual_seed(3)
    out = aug.transform(_batch(x), method, INFO)
    torch.manual_seed(3)
    mu, scale = aug.generator.params(x)
    assert torch.allclose(out.views[0], x + aug.generator.sample(mu, scale))


def test_random_noise_and_simcl_make_positives_of_the_right_shape(digits_vectors):
    x = digits_vectors.x_train[:32]
    method = build_method(cfg_of(method={"augment": ["random_noise"]}), digits_vectors)
    torch.manual_seed(0)
    out = method.augments[0].transform(_batch(x), method, INFO)
    assert [v.shape for v in out.views] == [x.shape, x.shape] and not torch.equal(out.views[0], out.views[1])
    assert (out.views[0] - x).std().item() == pytest.approx(1.0, abs=0.1)  # standardised: N(0, 1)

    simcl = build_method(cfg_of(method={"augment": ["simcl"]}, pinda={"simcl_eta": 0.5}), digits_vectors)
    aug = simcl.augments[0].train()
    h = torch.randn(32, 10)
    moved = aug.perturb_features(h, INFO)
    assert moved.shape == h.shape
    assert torch.allclose((moved - h).norm(dim=1), 0.5 * h.norm(dim=1), rtol=1e-5)  # normalised noise
    assert aug.eval().perturb_features(h, INFO) is None  # evaluation sees clean features
    z1 = simcl.train().objective.embed(x, INFO)
    z2 = simcl.objective.embed(x, INFO)
    assert not torch.allclose(z1, z2)  # the two positives of x differ only by the feature noise


def test_clae_stays_in_budget_and_increases_the_contrastive_loss(digits_vectors):
    cfg = cfg_of(method={"augment": ["clae"]}, pinda={"clae_eps": 0.3})
    torch.manual_seed(0)
    method = build_method(cfg, digits_vectors).train()
    x = digits_vectors.x_train[:64]
    v1, v2 = x + 0.1 * torch.randn_like(x), x + 0.1 * torch.randn_like(x)
    out = method.augments[0].transform(_batch(x, [v2, v1]), method, INFO)
    adv = out.views[1]  # the last view is attacked, so that [clae, pinda] contrasts x + noise with it
    assert adv.shape == v1.shape and torch.equal(out.views[0], v2)
    assert (adv - v1).abs().max().item() == pytest.approx(0.3, rel=1e-5)
    assert not any(p.grad is not None for p in method.parameters())  # the adversary trains nothing
    obj, tau = method.objective, cfg.train.temperature
    with torch.no_grad():
        clean = nt_xent(obj.embed(v1, INFO), obj.embed(v2, INFO), tau, gather=False)
        attacked = nt_xent(obj.embed(adv, INFO), obj.embed(v2, INFO), tau, gather=False)
    assert attacked > clean


@pytest.mark.parametrize("base", ["simclr", "byol", "moco", "simsiam"])
def test_pinda_trains_on_every_base(base, digits_vectors):
    cfg = cfg_of(method={"base": base, "augment": ["clae", "pinda"], "queue_size": 256},
                 view={"name": "noise"}, pinda={"mu": "learned"})
    trainer = Trainer(cfg, digits_vectors, log=lambda s: None)
    final = trainer.fit()
    assert 0 <= final["knn_acc"] <= 1
    assert trainer.history[-1]["pinda_rate"] == pytest.approx(0.5, abs=0.1)
    assert all(p.grad is None for p in trainer.method.parameters())  # stepped and cleared


def test_generators_for_images_and_the_noise_figure(tmp_path):
    for name in ("resnet18", "unet"):
        net = build_generator(name, "image", (1, 8, 8), 2, 8)
        assert net(torch.rand(3, 1, 8, 8)).shape == (3, 2, 1, 8, 8)
    with pytest.raises(ValueError, match="pinda.generator: unet needs image data"):
        build_generator("unet", "vector", (64,), 1, 8)

    cfg = from_dict(
        {
            "dataset": {"name": "digits", "max_train": 256, "max_test": 100},
            "model": {"backbone": "cnn", "width": 8, **SMALL},
            "method": {"augment": ["pinda"]},
            "pinda": {"generator": "unet", "width": 8, "mu": "learned"},
            "train": {"epochs": 1, "batch_size": 128},
            "eval": {"metrics": ["knn"], "references": False},
        }
    )
    record = train_run(cfg, load_dataset(cfg.dataset), tmp_path / "run", log=lambda s: None,
        on_completed=end_of_run_figures)
    assert record["figures"] == ["figures/pinda_noise_simclr_pinda_seed0.png"]
    files = plot("pinda", [load_run(tmp_path / "run")], tmp_path / "again")
    assert [f.name for f in files] == ["pinda_noise_simclr_pinda_seed0.png"] and files[
        0
    ].stat().st_size > 1000


def test_the_noise_figure_refuses_runs_without_images_or_without_pinda(tmp_path, digits_vectors):
    record = train_run(cfg_of(train={"epochs": 1}), digits_vectors, tmp_path / "vec", log=lambda s: None,
        on_completed=end_of_run_figures)
    assert "figures" not in record and "figure_errors" not in record  # vectors ask for no grid
    with pytest.raises(PlotError, match="needs image data"):
        plot("pinda", [load_run(tmp_path / "vec")], tmp_path / "out")
    train_run(cfg_of(method={"augment": []}, train={"epochs": 1}), digits_vectors, tmp_path / "plain",
              log=lambda s: None, on_completed=end_of_run_figures)
    with pytest.raises(PlotError, match="no pinda augmentation"):
        plot("pinda", [load_run(tmp_path / "plain")], tmp_path / "out")


def test_pinda_on_clae_contrasts_the_noise_view_with_the_adversarial_one(digits_vectors):
    cfg = cfg_of(method={"augment": ["clae", "pinda"]}, pinda={"clae_eps": 0.2})  # identity views: Alg. 1
    torch.manual_seed(0)
    method = build_method(cfg, digits_vectors).train()
    x = digits_vectors.x_train[:32]
    batch = _batch(x)
    for aug in method.augments:
        batch = aug.transform(batch, method, INFO)
    noise = batch.extra["pinda_noise"]
    assert torch.allclose(batch.views[0], x + noise)  # view 1: x + pi-noise
    moved = batch.views[1] - x  # view 2: the adversarial example of x, within the budget
    assert moved.abs().max().item() == pytest.approx(0.2, rel=1e-5) and (moved.abs() <= 0.2 + 1e-6).all()
