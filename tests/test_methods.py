"""The mathematics of the base objectives: closed forms, symmetry, stop-gradients, queue, EMA."""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from augtune.config import from_dict
from augtune.methods import BASES, BYOL, Batch, StepInfo, build_method
from augtune.methods.base import cosine_momentum
from augtune.methods.losses import cosine_regression, info_nce_queue, negative_cosine, nt_xent


def tiny_cfg(base: str = "simclr", **sections) -> object:
    data = {"method": {"base": base, "queue_size": 64},
            "model": {"hidden_dim": 32, "embed_dim": 16, "proj_hidden_dim": 16, "proj_dim": 8,
                      "pred_hidden_dim": 16},
            "train": {"temperature": 0.5}}
    for k, v in sections.items():
        data.setdefault(k, {}).update(v)
    return from_dict(data)


def vector_data(n: int = 64, d: int = 10) -> SimpleNamespace:
    return SimpleNamespace(modality="vector", shape=(d,), mean=None, std=None, num_classes=2,
                           x_train=torch.randn(n, d), y_train=torch.zeros(n, dtype=torch.long))


def info(step: int = 0, total: int = 100) -> StepInfo:
    return StepInfo(epoch=0, step=step, total_steps=total)


# -- NT-Xent ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("n,t", [(4, 0.5), (8, 0.1), (3, 1.0)])
def test_nt_xent_closed_form_on_aligned_orthogonal_embeddings(n, t):
    z = torch.eye(n, 16, dtype=torch.float64)  # n mutually orthogonal unit vectors
    expected = math.log(1 + (2 * n - 2) * math.exp(-1 / t))
    assert nt_xent(z, z.clone(), t).item() == pytest.approx(expected, rel=1e-5)


def test_nt_xent_is_symmetric_in_its_views_and_scale_invariant():
    torch.manual_seed(0)
    a, b = torch.randn(6, 5), torch.randn(6, 5)
    assert nt_xent(a, b, 0.2).item() == pytest.approx(nt_xent(b, a, 0.2).item(), rel=1e-6)
    assert nt_xent(3 * a, b, 0.2).item() == pytest.approx(nt_xent(a, b, 0.2).item(), rel=1e-6)


def test_nt_xent_prefers_aligned_views():
    torch.manual_seed(0)
    a = torch.randn(8, 5)
    assert nt_xent(a, a + 0.01 * torch.randn(8, 5), 0.2) < nt_xent(a, torch.randn(8, 5), 0.2)


# -- BYOL / SimSiam losses -------------------------------------------------------------------------

def test_cosine_losses_values_and_stop_gradient():
    p = torch.tensor([[1.0, 0.0], [0.0, 2.0]], requires_grad=True)
    z = torch.tensor([[1.0, 0.0], [1.0, 0.0]], requires_grad=True)
    assert cosine_regression(p, z).item() == pytest.approx((0 + 2) / 2)  # cos = 1 and 0
    assert negative_cosine(p, z).item() == pytest.approx(-0.5)
    (cosine_regression(p, z) + negative_cosine(p, z)).backward()
    assert z.grad is None and p.grad is not None  # the target gets no gradient


@pytest.mark.parametrize("base", ["byol", "simsiam"])
def test_symmetric_losses_and_no_gradient_to_targets(base):
    torch.manual_seed(0)
    obj = build_method(tiny_cfg(base), vector_data()).objective
    obj.eval()  # BatchNorm in eval mode: the loss is a function of the two views only
    v1, v2 = torch.randn(8, 10), torch.randn(8, 10)
    l12, _ = obj.loss(v1, v2, info())
    l21, _ = obj.loss(v2, v1, info())
    assert l12.item() == pytest.approx(l21.item(), rel=1e-5)
    l12.backward()
    if isinstance(obj, BYOL):
        assert all(p.grad is None for p in obj.target_parameters())
        assert all(not p.requires_grad for p in obj.target_parameters())
    assert all(p.grad is not None for p in obj.encoder.parameters())


def test_simsiam_stop_gradient_means_z_branch_gets_gradient_only_through_p():
    # D(p1, sg(z2)): the gradient reaches the predicted view only, never the target view.
    torch.manual_seed(0)
    obj = build_method(tiny_cfg("simsiam"), vector_data()).objective
    obj.eval()
    v1 = torch.randn(4, 10, requires_grad=True)
    v2 = torch.randn(4, 10, requires_grad=True)
    z1, z2 = obj.embed(v1), obj.embed(v2)
    negative_cosine(obj.predictor(z1), z2).backward()
    assert v1.grad is not None and v2.grad is None


# -- MoCo ------------------------------------------------------------------------------------------

def test_moco_queue_is_fifo_and_wraps():
    torch.manual_seed(0)
    moco = build_method(tiny_cfg("moco", method={"queue_size": 5}), vector_data()).objective
    keys = [F.normalize(torch.randn(2, 8), dim=1) for _ in range(3)]
    for k in keys:
        moco.enqueue(k)
    # 6 keys into 5 slots: slots 0-4 got k0,k0,k1,k1,k2; then k2[1] overwrote slot 0 (the oldest)
    expect = torch.stack([keys[2][1], keys[0][1], keys[1][0], keys[1][1], keys[2][0]])
    assert torch.allclose(moco.queue, expect)
    assert moco.queue_ptr.item() == 1


def test_momentum_update_is_exact():
    torch.manual_seed(0)
    moco = build_method(tiny_cfg("moco", method={"momentum": 0.9}), vector_data()).objective
    with torch.no_grad():
        for p in moco.online_parameters():
            p.add_(torch.randn_like(p))
    online = [p.clone() for p in moco.online_parameters()]
    target = [p.clone() for p in moco.target_parameters()]
    moco.after_step(info())
    for o, t, new in zip(online, target, moco.target_parameters()):
        assert torch.allclose(new, 0.9 * t + 0.1 * o, atol=1e-7)


@pytest.mark.parametrize("base", ["byol", "moco"])
def test_target_batchnorm_keeps_its_own_statistics_unless_told_to_copy(base):
    """BYOL's, MoCo's and lightly's targets keep the running statistics of their own forward passes;
    `method.target_bn: online` copies the online network's instead (augtune before 0.2)."""
    for mode in ("own", "online"):
        torch.manual_seed(0)
        obj = build_method(tiny_cfg(base, method={"target_bn": mode}), vector_data()).objective.train()
        x = torch.randn(16, 10)
        for _ in range(3):
            # both networks see it
            obj.loss(x + 0.1 * torch.randn_like(x), x + 0.1 * torch.randn_like(x), info())
            mine = [b.clone() for b in obj.target_buffers()]
            obj.after_step(info())
        bn = [(t, o) for t, o in zip(obj.target_buffers(), obj.online_buffers()) if t.dtype.is_floating_point]
        assert bn, "the tiny MLP has BatchNorm"
        if mode == "own":  # the step moved only parameters: the buffers are what the target's passes made
            assert all(torch.equal(a, b) for a, b in zip(mine, obj.target_buffers()))
            assert any(not torch.equal(t, o) for t, o in bn)
        else:
            assert all(torch.equal(t, o) for t, o in bn)


def test_byol_momentum_follows_cosine_schedule():
    assert cosine_momentum(0.99, 0.0) == pytest.approx(0.99)
    assert cosine_momentum(0.99, 0.5) == pytest.approx(0.995)
    assert cosine_momentum(0.99, 1.0) == pytest.approx(1.0)


def test_info_nce_queue_closed_form():
    q = torch.tensor([[1.0, 0.0]])
    k = torch.tensor([[1.0, 0.0]])
    queue = torch.tensor([[0.0, 1.0], [0.0, -1.0]])
    t = 0.5
    expected = -math.log(math.exp(1 / t) / (math.exp(1 / t) + 2))
    assert info_nce_queue(q, k, queue, t).item() == pytest.approx(expected, rel=1e-6)


# -- training lowers every method's loss -----------------------------------------------------------

@pytest.mark.parametrize("base", sorted(BASES))
def test_twenty_steps_lower_the_loss(base):
    torch.manual_seed(0)
    cfg = tiny_cfg(base)
    data = vector_data(n=32)
    method = build_method(cfg, data)
    opt = torch.optim.Adam([p for p in method.parameters() if p.requires_grad], lr=1e-2)
    x = data.x_train

    def step(i: int) -> float:
        gen = torch.Generator().manual_seed(i % 2)  # two fixed pairs of views: a learnable target
        views = [x + 0.1 * torch.randn(x.shape, generator=gen) for _ in range(2)]
        loss, _, batch = method(Batch(x=x, views=views, index=torch.arange(len(x))), info(i, 20))
        opt.zero_grad()
        loss.backward()
        opt.step()
        method.after_step(batch, info(i, 20), None)
        return loss.item()

    losses = [step(i) for i in range(20)]
    assert sum(losses[-4:]) / 4 < sum(losses[:4]) / 4 - 1e-3, losses
