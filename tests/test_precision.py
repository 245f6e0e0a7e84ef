"""Mathematics that survives the precision it runs in: CoCor's meta-gradient, NRCC's SGHMC density
gradient and DiffAug's sampler, each on models trained for a few steps (not fresh ones), over many
draws, in float32 (training on a CPU) and under bf16 autocast (training on a GPU), against a float64
reference at the same weights and inputs.

bf16 autocast runs here on the CPU (torch.autocast('cpu', dtype=torch.bfloat16)): matmuls and
convolutions round to bf16 as a GPU's autocast makes them. A GPU's TF32 convolutions cannot be run
here; `ieee_fp32` switches them off where it matters (its flags are checked below). On a machine with
a GPU the `_on_the_gpu` tests run the same draws there, under CUDA bf16 autocast with TF32 switched
on (the cheapest setting a run may choose), against the same float64 reference on the CPU."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from augtune.config import from_dict
from augtune.data import load_dataset
from augtune.data.batches import as_float
from augtune.methods import StepInfo
from augtune.methods.base import Batch
from augtune.methods.cocor import ieee_fp32, kept_buffers
from augtune.methods.diffaug_ops import SAMPLE_VARIANCES
from augtune.methods.nrcc import NRCC, sghmc
from augtune.trainables.loop import Trainer
from conftest import TINY_CNN, TINY_MLP, needs_gpu

pytestmark = pytest.mark.usefixtures("one_thread")

_QUIET_EVAL = {"every": 0, "epoch_metrics": [], "metrics": [], "references": False}


def bf16(device: str = "cpu"):
    return torch.autocast(device, dtype=torch.bfloat16)


@pytest.fixture
def tf32_on():
    """TF32 matmuls and convolutions, as a run that asks for speed has them; restored after."""
    flags = (torch.backends.cuda.matmul, torch.backends.cudnn.conv)
    before = [f.fp32_precision for f in flags]
    for f in flags:
        f.fp32_precision = "tf32"
    yield
    for f, b in zip(flags, before):
        f.fp32_precision = b


def _trained(cfg: dict):
    """The method after `cfg`'s few epochs of float32 training on the CPU, and its data."""
    cfg = from_dict({**cfg, "train": {**cfg["train"], "device": "cpu", "precision": "fp32"},
                     "eval": _QUIET_EVAL})
    data = load_dataset(cfg.dataset)
    trainer = Trainer(cfg, data, log=lambda s: None)
    trainer.fit()
    return trainer.method, data


def _flat(grads) -> torch.Tensor:
    return torch.cat([g.flatten().double() for g in grads])


def test_ieee_fp32_turns_autocast_and_tf32_off_inside_and_restores_them():
    with bf16():
        with ieee_fp32(torch.device("cpu")):
            assert not torch.is_autocast_enabled("cpu")
            assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float32
        assert torch.is_autocast_enabled("cpu")
    flags = (torch.backends.cuda.matmul, torch.backends.cudnn.conv)
    before = [f.fp32_precision for f in flags]
    with ieee_fp32(torch.device("cuda")):  # the flags only: nothing runs on a GPU here
        assert [f.fp32_precision for f in flags] == ["ieee", "ieee"]
    assert [f.fp32_precision for f in flags] == before
    with pytest.raises(KeyError), ieee_fp32(torch.device("cuda")):
        raise KeyError("an error inside")
    assert [f.fp32_precision for f in flags] == before


# ---------------------------------------------------------------------------------------------
# CoCor: the MMNN's meta-gradient

@pytest.fixture(scope="module", ids="-".join,
                params=[("moco", "mlp"), ("moco", "cnn"), ("simsiam", "mlp"), ("simsiam", "cnn")])
def cocor_trained(request):
    base, backbone = request.param
    return _trained({
        "dataset": {"name": "digits", "max_train": 768, "max_test": 64},
        "model": TINY_MLP if backbone == "mlp" else TINY_CNN,
        "method": {"base": base, "augment": ["cocor"], "queue_size": 256},
        "train": {"epochs": 3, "batch_size": 128, "seed": 0},
        "cocor": {"label_fraction": 0.1},
    })


def test_cocor_meta_gradient_in_float32_and_bf16_is_the_float64_hypergradient(cocor_trained):
    """30 MMNN updates of a model trained 18 steps: the float32 estimate (forward_mode) and
    both modes under bf16 autocast against the float64 exact hypergradient, cosine > 0.999 and
    length within 10%. Both rest on <grad_e sim, u>, inner products over all encoder weights that
    measured 3e-5 to 5e-3 of |grad_e sim| |u|; float32 keeps them (measured here: cosine
    >= 0.999999, length within 0.1%; on wider models, 60 draws: >= 0.99999, within 0.8%). What it
    catches: the central difference at eps = 1e-4 in float32 fell to cosine 0.89 here (-0.43 on
    the wider models); under bf16 autocast it fell to -0.26 and `exact` to -0.41 (-0.79, -0.86)."""
    method, data = cocor_trained
    aug, obj = method.augments[0], method.objective
    m64 = copy.deepcopy(method).double()
    eta = 1e-3  # the encoder's learning rate: the look-ahead is one step of its optimiser
    bad = []
    for draw in range(30):
        torch.manual_seed(draw)
        idx = torch.randperm(len(data.x_train))[:128]
        x = as_float(data.x_train[idx])
        with kept_buffers(*obj.online_networks(), *m64.objective.online_networks()):
            aug.loss_terms(Batch(x=x, views=(x, x), index=idx), None, method, StepInfo(0, 0, 1))
            meta, (x_l, y_l) = aug._meta, aug.labelled_batch(128, "cpu")
            meta64 = tuple(t.double() for t in meta)
            ref = m64.augments[0].meta_gradients(m64.objective, meta64, x_l.double(), y_l, eta,
                                                 "exact")[0]
            fd32 = aug.meta_gradients(obj, meta, x_l, y_l, eta, "forward_mode")[0]
            with bf16():
                fd16 = aug.meta_gradients(obj, meta, x_l, y_l, eta, "forward_mode")[0]
                exact16 = aug.meta_gradients(obj, meta, x_l, y_l, eta, "exact")[0]
        # autocast does not reach the meta step
        assert all(torch.equal(a, b) for a, b in zip(fd32, fd16))
        ref = _flat(ref)
        for name, est in (("float32", _flat(fd32)), ("bf16 exact", _flat(exact16))):
            cos = float(F.cosine_similarity(est, ref, dim=0))
            ratio = float(est.norm() / ref.norm())
            if not (cos > 0.999 and abs(ratio - 1) < 0.1):
                bad.append((draw, name, cos, ratio))
    assert not bad, bad


@needs_gpu
def test_cocor_meta_gradient_on_the_gpu_is_the_float64_hypergradient(cocor_trained, tf32_on):
    """The same 30 draws with the method on CUDA, both modes under CUDA bf16 autocast with TF32 on,
    against the float64 exact hypergradient computed on the CPU: cosine > 0.999, length within 10%."""
    method, data = cocor_trained
    dev = torch.device("cuda")
    gpu = copy.deepcopy(method).to(dev)
    aug, obj = gpu.augments[0], gpu.objective
    m64 = copy.deepcopy(method).double()
    bad = []
    for draw in range(30):
        torch.manual_seed(draw)
        idx = torch.randperm(len(data.x_train))[:128]
        x = as_float(data.x_train[idx]).to(dev)
        with kept_buffers(*obj.online_networks(), *m64.objective.online_networks()):
            aug.loss_terms(Batch(x=x, views=(x, x), index=idx.to(dev)), None, gpu, StepInfo(0, 0, 1))
            meta, (x_l, y_l) = aug._meta, aug.labelled_batch(128, dev)
            meta64 = tuple(t.detach().cpu().double() for t in meta)
            ref = m64.augments[0].meta_gradients(m64.objective, meta64, x_l.cpu().double(), y_l.cpu(),
                                                 1e-3, "exact")[0]
            with bf16("cuda"):
                fd16 = aug.meta_gradients(obj, meta, x_l, y_l, 1e-3, "forward_mode")[0]
                exact16 = aug.meta_gradients(obj, meta, x_l, y_l, 1e-3, "exact")[0]
        ref = _flat(ref)
        for name, est in (("bf16 forward_mode", _flat(fd16).cpu()),
                          ("bf16 exact", _flat(exact16).cpu())):
            cos = float(F.cosine_similarity(est, ref, dim=0))
            ratio = float(est.norm() / ref.norm())
            if not (cos > 0.999 and abs(ratio - 1) < 0.1):
                bad.append((draw, name, cos, ratio))
    assert not bad, bad


# ---------------------------------------------------------------------------------------------
# NRCC: SGHMC's density gradient

@pytest.fixture(scope="module", ids="-".join,
                params=[("simclr", "mlp"), ("simclr", "cnn"), ("byol", "mlp"), ("byol", "cnn")])
def nrcc_trained(request):
    base, backbone = request.param
    return _trained({
        "dataset": {"name": "digits", "as_vectors": backbone == "mlp", "max_train": 512,
                    "max_test": 64},
        "model": TINY_MLP if backbone == "mlp" else TINY_CNN,
        "method": {"base": base, "augment": ["nrcc"]},
        "train": {"epochs": 3, "batch_size": 64, "seed": 0},
    })


SGHMC_ARGS = dict(delta1=0.1, delta2=0.05, delta3=0.0, steps=3, grad_clip=1.0)


def _sghmc_agrees(got: torch.Tensor, seed: torch.Tensor, x: torch.Tensor, p0: torch.Tensor, o64) -> int:
    """Assert that `got` (SGHMC's gradient part of x^c in a lower precision) is the float64 chain's, per
    sample, to 1e-4 relative; return how many samples sit at a kink. A sample whose float64 chain jumps
    when its start moves by 1e-7 (a ReLU or max-pool switching: the CNN is piecewise linear) has two
    right answers; there `got` must equal the float64 chain from one of four such starts."""
    density = NRCC.density(o64, x.double())
    ref = sghmc(seed.double(), density, p0=p0.double(), **SGHMC_ARGS)[1]

    def rel(a):
        return (got.cpu().double() - a).flatten(1).norm(dim=1) / a.flatten(1).norm(dim=1)

    off = rel(ref) > 1e-4
    if off.any():
        g = torch.Generator().manual_seed(0)
        moved = [sghmc(seed.double() + 1e-7 * torch.randn(seed.shape, generator=g, dtype=torch.float64),
                       density, p0=p0.double(), **SGHMC_ARGS)[1] for _ in range(4)]
        nearest = torch.stack([rel(m) for m in moved]).min(0).values
        assert (nearest[off] < 1e-4).all(), (rel(ref)[off], nearest[off])
    return int(off.sum())


def test_sghmc_density_gradient_in_float32_and_bf16_is_the_float64_one(nrcc_trained):
    """20 batches of 64 from a model trained 24 steps: SGHMC without noise (delta3 = 0, a given p0,
    3 steps); its gradient part of x^c matches the float64 chain's per sample to 1e-4 relative, in
    float32 and under bf16 autocast (measured: 1.2e-5; before SGHMC took the gradient in IEEE
    float32, bf16 autocast put it off by up to 190%, 1-9% in the median sample). A sample at a kink
    matches the float64 chain from a start 1e-7 away (one of 1280 in byol-cnn trained on one thread:
    5.3% from the first float64 chain, which itself moves 5.3% when its start moves by 1e-7)."""
    method, data = nrcc_trained
    obj = method.objective.eval()  # as in `negatives`: BatchNorm on running statistics
    o64 = copy.deepcopy(obj).double()
    kinks = 0
    for draw in range(20):
        torch.manual_seed(draw)
        x = as_float(data.x_train[torch.randperm(len(data.x_train))[:64]])
        seed = x[torch.randperm(64)] + 0.1 * torch.randn_like(x)  # a noisy view of another sample
        p0 = torch.randn_like(seed)
        got32 = sghmc(seed, NRCC.density(obj, x), p0=p0, **SGHMC_ARGS)[1]
        with bf16():
            got16 = sghmc(seed, NRCC.density(obj, x), p0=p0, **SGHMC_ARGS)[1]
        assert torch.equal(got16, got32)  # the density's gradient is taken outside autocast
        kinks += _sghmc_agrees(got32, seed, x, p0, o64)
    assert kinks <= 3  # of 1280: rare, or the chain is not what is being compared


@needs_gpu
def test_sghmc_density_gradient_on_the_gpu_is_the_float64_one(nrcc_trained, tf32_on):
    """The same 20 chains on CUDA under CUDA bf16 autocast with TF32 on, against the float64 chain on
    the CPU: the gradient part of x^c per sample within 1e-4 relative (at a kink, of the float64 chain
    from a start 1e-7 away)."""
    method, data = nrcc_trained
    dev = torch.device("cuda")
    obj = copy.deepcopy(method.objective).eval()
    o64, obj = copy.deepcopy(obj).double(), obj.to(dev)
    kinks = 0
    for draw in range(20):
        torch.manual_seed(draw)
        x = as_float(data.x_train[torch.randperm(len(data.x_train))[:64]])
        seed = x[torch.randperm(64)] + 0.1 * torch.randn_like(x)
        p0 = torch.randn_like(seed)
        with bf16("cuda"):
            got = sghmc(seed.to(dev), NRCC.density(obj, x.to(dev)), p0=p0.to(dev), **SGHMC_ARGS)[1]
        kinks += _sghmc_agrees(got, seed, x, p0, o64)
    assert kinks <= 3


def test_nrcc_negatives_under_bf16_autocast_are_finite_and_the_float32_ones(nrcc_trained):
    method, data = nrcc_trained
    method.train()
    aug = method.augments[0]
    for draw in range(5):
        torch.manual_seed(draw)
        x = as_float(data.x_train[torch.randperm(len(data.x_train))[:32]])
        batch = Batch(x=x, views=(x + 0.1 * torch.randn_like(x), x + 0.1 * torch.randn_like(x)),
                      index=torch.arange(32))
        torch.manual_seed(100 + draw)
        plain = aug.negatives(batch, method)
        torch.manual_seed(100 + draw)
        with bf16():
            auto = aug.negatives(batch, method)
        assert torch.isfinite(auto).all() and torch.equal(auto, plain)
    assert method.training


# ---------------------------------------------------------------------------------------------
# DiffAug: the sampler

@pytest.fixture(scope="module", params=["vector", "image"])
def diffaug_trained(request):
    image = request.param == "image"
    method, data = _trained({
        "dataset": {"name": "digits", "as_vectors": not image, "max_train": 256, "max_test": 64},
        "model": TINY_CNN if image else TINY_MLP,
        "method": {"base": "simclr", "augment": ["diffaug"]},
        "train": {"epochs": 3, "batch_size": 64, "seed": 0},
        # T = 100 with betas scaled by 10: abar_T as at T = 1000, so the chain amplifies as much
        "diffaug": {"schedule": "A:1,B:2", "steps": 100, "sample_steps": 20, "gen_hidden": 64,
                    "gen_width": 4, "gen_steps": 8},
    })
    assert int(method.augments[0].updates) == 64  # 2 B-epochs x 4 batches x 8 generator steps
    return method, data


@pytest.mark.parametrize("kind", SAMPLE_VARIANCES)
def test_diffaug_sampler_under_bf16_autocast_stays_finite_and_near_float64(diffaug_trained, kind):
    """8 draws of 64 samples from a trained generator, float32 and bf16 autocast, against the same
    chain in float64 (the same noise: the sampler draws it in float32 for every dtype). float32:
    within 1e-4 of the data's span (measured 2.4e-6). bf16: the denoiser's output carries bf16's
    2^-8 relative rounding, which the chain does not amplify: mean error below 2^-8 of the span and
    no element off by more than 10% of it (measured 3.2e-4 and 2.0% vectors, 1.8e-4 and 0.5%
    images). Nothing needed fixing here; the float64 reference needed the denoisers to run in their
    input's dtype."""
    method, data = diffaug_trained
    aug = method.augments[0]
    net, ddpm = aug.ema_generator, aug.ddpm
    net64, ddpm64 = copy.deepcopy(net).double(), copy.deepcopy(ddpm).double()
    cond = aug.condition(method, as_float(data.x_train[:64]))
    clip = (aug.clip_lo, aug.clip_hi)
    span = float((clip[1] - clip[0]).mean())  # images: 2 ([-1, 1]); vectors: each feature's range
    for seed in range(8):
        torch.manual_seed(seed)
        clip64 = tuple(c.double() for c in clip)
        ref = ddpm64.sample(net64, cond.double(), aug.shape, 20, clip64, kind)
        torch.manual_seed(seed)
        s32 = ddpm.sample(net, cond, aug.shape, 20, clip, kind)
        torch.manual_seed(seed)
        with bf16():
            s16 = ddpm.sample(net, cond, aug.shape, 20, clip, kind)
        assert s32.dtype == s16.dtype == torch.float32 and torch.isfinite(s16).all()
        assert (s32 - ref).abs().max() < 1e-4 * span
        err = (s16 - ref).abs()
        assert err.mean() < 2 ** -8 * span and err.max() < 0.1 * span, (seed, float(err.max()))
