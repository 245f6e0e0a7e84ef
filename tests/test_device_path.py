"""The device path, checked on the CPU: views and the methods' own view work make no host<->device
copy or sync per op, and the batched views are the per-sample views bitwise.

A machine without an accelerator cannot see a host-to-device copy (every tensor is on the CPU), so
:class:`DeviceSplit` plays the accelerator: a torch function mode that tags the tensors that would
live on the device (the batch, the networks' weights, and everything computed from them or made
with an explicit ``device=``) and counts every place where a real device would copy or wait:

- ``h2d``: host data made into a device tensor (``torch.tensor(..., device=)``, ``new_tensor``,
  ``.to(device)`` of a host tensor, a host tensor copied, assigned or used as an index into a
  device one, or mixed into an op with device tensors; a 0-dim host tensor is a scalar and passes
  free, as on CUDA);
- ``d2h``: the host waits for the device (``.item()``, ``.tolist()``, ``bool()``, ``.cpu()``, a
  boolean-mask index, ``nonzero``).

On a GPU the same tests run with real tensors where marked (skipped here, with the reason).
"""

from __future__ import annotations

import importlib
from collections import Counter

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils.weak import WeakIdKeyDictionary

from augtune.config import ViewConfig, from_dict
from augtune.data import DataSplit, load_dataset, views
from augtune.data.views import SimCLRView, build_view
from augtune.methods import build_method
from augtune.methods import cocor_ops
from augtune.methods import pinda as pinda_module
from augtune.methods.base import Batch, StepInfo
from augtune.methods.cocor_ops import IMAGE_OPS, VECTOR_OPS, composite_views
from augtune.trainables.loop import Trainer, two_views
from conftest import TINY_CNN, needs_gpu

DEVICE = torch.device(
    "cpu", 1
)  # what a tagged tensor's `.device` says: code passing it on is seen
FACTORIES = {
    "rand",
    "randn",
    "randint",
    "randperm",
    "zeros",
    "ones",
    "empty",
    "full",
    "arange",
    "linspace",
    "logspace",
    "eye",
    "empty_strided",
    "normal",
    "scalar_tensor",
    "tril_indices",
    "triu_indices",
}
FROM_DATA = {"tensor", "as_tensor", "asarray", "from_numpy"}
LIKE = {
    "zeros_like",
    "ones_like",
    "empty_like",
    "full_like",
    "rand_like",
    "randn_like",
    "randint_like",
    "new_zeros",
    "new_ones",
    "new_empty",
    "new_full",
}
SYNCS = {
    "item",
    "tolist",
    "__bool__",
    "__int__",
    "__float__",
    "__index__",
    "numpy",
    "nonzero",
    "masked_select",
    "unique",
    "unique_consecutive",
    "argwhere",
}


def _tensors(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            yield from _tensors(o)
    elif isinstance(obj, dict):
        for o in obj.values():
            yield from _tensors(o)


def _device_arg(args, kwargs):
    """The device a call names (a torch.device or string among its arguments), or None."""
    for a in (kwargs.get("device"), *args):
        if isinstance(a, torch.device):
            return a
        if isinstance(a, str) and a.split(":")[0] in ("cpu", "cuda"):
            return torch.device(a)
    return None


class DeviceSplit(TorchFunctionMode):
    """Counts where code run on host tensors would copy to or wait for a device (module doc).

    A tagged tensor's ``.device`` reads :data:`DEVICE` (``cpu:1``, which torch accepts and places
    on the CPU), so a tensor made with ``device=x.device`` of a tagged x is tagged, one made with a
    host tensor's device is not, and ``.to(x.device)`` of a host tensor is a copy to the device."""

    def __init__(self, *on_device) -> None:
        super().__init__()
        self.dev = WeakIdKeyDictionary()
        self.events: Counter = Counter()  # (kind, function name) -> count
        for obj in on_device:
            self.mark(obj)

    def mark(self, obj) -> None:
        """Tensors, modules (parameters, buffers) and optimisers (their state) on the device."""
        if isinstance(obj, torch.nn.Module):
            for t in (*obj.parameters(), *obj.buffers()):
                self.dev[t] = True
        elif isinstance(obj, torch.optim.Optimizer):
            for state in obj.state.values():
                for t in state.values():
                    if (
                        isinstance(t, torch.Tensor) and t.dim() > 0
                    ):  # Adam's 0-dim `step` stays on the host
                        self.dev[t] = True
        else:
            for t in _tensors(obj):
                self.dev[t] = True

    def count(self, kind: str) -> int:
        return sum(n for (k, _), n in self.events.items() if k == kind)

    def _on(self, t) -> bool:
        return isinstance(t, torch.Tensor) and t in self.dev

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = getattr(func, "__name__", "")
        if name == "__get__":
            return self._attribute(func, args, out)
        tensors = list(_tensors((args, kwargs)))
        dev = [t for t in tensors if self._on(t)]
        host = [t for t in tensors if not self._on(t) and t.dim() > 0]
        if name in SYNCS or name == "cpu":
            if dev:
                self.events["d2h", name] += 1
        elif name in FACTORIES or name in FROM_DATA or name in LIKE or name == "new_tensor":
            self._made(name, args, kwargs, out)
        elif name in ("to", "cuda", "copy_"):
            self._moved(name, args, kwargs, out)
        else:
            if name in ("__getitem__", "__setitem__", "index_select", "index_put_", "index_copy_"):
                if dev and any(t.dtype == torch.bool and self._on(t) for t in tensors[1:]):
                    self.events["d2h", name] += 1  # a boolean mask: its count must reach the host
                if self._on(args[0]) and host:
                    self.events["h2d", name] += 1  # a host index or value, copied over
            elif dev and host:
                self.events["h2d", name] += (
                    1  # a real device refuses this or copies the host tensor
                )
            if dev:
                self.mark(out)
        return out

    def _attribute(self, func, args, out):
        """x.device of a tagged x says DEVICE; x.grad, x.T, x.data follow x."""
        if args and self._on(args[0]):
            if getattr(getattr(func, "__self__", None), "__name__", "") == "device":
                return DEVICE
            self.mark(out)
        return out

    def _made(self, name, args, kwargs, out) -> None:
        """A new tensor: on the device where the call names DEVICE (or, for `new_*` and `*_like`,
        where its model tensor is); from host data (a list, a host tensor) a copy to the device."""
        target = _device_arg(args, kwargs)
        follows = target is None and args and self._on(args[0])
        if name in FACTORIES:
            there, copied = target == DEVICE, False
        elif name in LIKE:
            there, copied = target == DEVICE or follows, False
        else:  # tensor, as_tensor, new_tensor: host data, unless as_tensor gets a device tensor
            there = target == DEVICE or (name == "new_tensor" and follows)
            copied = there and not (name in FROM_DATA and self._on(args[0]))
        if copied:
            self.events["h2d", name] += 1
        if there:
            self.mark(out)

    def _moved(self, name, args, kwargs, out) -> None:
        """`.to`, `.cuda` and `copy_` between host and device."""
        src = args[0]
        if name == "copy_":
            dst, src = args[0], args[1]
            if self._on(dst) and not self._on(src) and src.dim() > 0:
                self.events["h2d", name] += 1
            elif not self._on(dst) and self._on(src):
                self.events["d2h", name] += 1
            return
        target = _device_arg(args, kwargs)
        other = next((a for a in args[1:] if isinstance(a, torch.Tensor)), None)
        if other is not None:
            target = DEVICE if self._on(other) else torch.device("cpu")
        if name == "cuda" or target == DEVICE:
            if not self._on(src):
                self.events["h2d", name] += 1
            self.mark(out)
        elif self._on(src):
            if target is not None:
                self.events["d2h", name] += 1
            else:
                self.mark(out)  # a dtype change stays where it is


@pytest.fixture(autouse=True)
def fresh_device_caches(monkeypatch):
    """Constants copied to the device once are tagged by the split that saw the copy: each test
    starts with none (a device the views have not run on yet)."""
    monkeypatch.setattr(views, "_ON_DEVICE", {})
    monkeypatch.setattr(importlib.import_module("augtune.data.batches"), "_TABLES", {})


def images(b=16, c=3, side=16, seed=0):
    torch.manual_seed(seed)
    return torch.rand(b, c, side, side)


def test_the_device_split_sees_copies_and_syncs():
    x = images()
    with DeviceSplit(x) as split:
        y = x * x.new_tensor([1.0, 2.0, 3.0]).view(1, 3, 1, 1)  # h2d
        y = y + torch.ones(3, 1, 1)  # h2d: a host tensor mixed in
        y = y + torch.zeros(3, 1, 1).to(x.device)  # h2d
        y = y[y > 0.5]  # d2h: the mask's count
        z = (
            x * torch.rand(16, 1, 1, 1, device=x.device) * torch.tensor(2.0)
        )  # a device draw and a scalar
        bool(z.sum() > 0)  # d2h
        w = torch.zeros(3, device=torch.ones(2).device) + torch.ones(3)  # host only
        w.tolist()
    assert split.count("h2d") == 3 and split.count("d2h") == 2, dict(split.events)


@pytest.mark.parametrize("c, side, blur_p", [(3, 16, 0.5), (1, 8, 0.0)])
def test_simclr_views_make_no_copy_and_no_sync(c, side, blur_p):
    view = SimCLRView(blur_p=blur_p)
    x = images(c=c, side=side)
    with DeviceSplit(x) as split:
        view(x)  # the first views copy the colour constants there, once
        first = dict(split.events)
        split.events.clear()
        p = view.sample(32, x)  # a global batch of 32: this rank's rows are the first 16
        v = view.apply(x, {k: t[:16] for k, t in p.items()})
    assert v.shape == x.shape
    assert not split.events, dict(split.events)
    host = view.apply(x, {k: t[:16] for k, t in p.items()})  # the same parameters, host path
    assert torch.equal(v, host)
    assert first == ({("h2d", "to"): 3} if c == 3 else {}), (
        first
    )  # luma weights, YIQ and its inverse


def test_uint8_batches_become_float_on_the_device_without_a_copy():
    batches = importlib.import_module(
        "augtune.data.batches"
    ).batches  # the package's `batches` is a function

    x = torch.randint(0, 256, (64, 3, 8, 8), dtype=torch.uint8)
    order = torch.randperm(64)
    with DeviceSplit(x, order) as split:
        rows = list(batches(x, [order[:16], order[16:32], order[32:48]], x.device))
    assert [r.dtype for r in rows] == [torch.float32] * 3
    assert dict(split.events) == {("h2d", "to"): 1}, dict(
        split.events
    )  # the 256-entry table, once


@pytest.mark.parametrize("modality", ["image", "vector"])
def test_cocor_composites_reach_the_device_in_one_copy(monkeypatch, modality):
    monkeypatch.setattr(
        cocor_ops, "_draws_share_rng", lambda device: False
    )  # an accelerator's schedule
    x = images(b=32) if modality == "image" else torch.randn(32, 20)
    ops = IMAGE_OPS if modality == "image" else VECTOR_OPS
    with DeviceSplit(x) as split:
        composite_views(
            x, (1, 3, 5), ops, modality
        )  # the first: the colour ops' constants reach the device
        split.events.clear()
        views, counts = composite_views(x, (1, 3, 5), ops, modality)
    assert views.shape == (96, *x.shape[1:]) and counts.shape == (96, len(ops))
    assert dict(split.events) == {
        ("h2d", "to"): 1
    }  # choices, grouping and magnitudes: one packed copy


def test_cocor_image_composites_are_the_same_on_either_schedule(monkeypatch):
    """Images: both schedules draw the same host numbers in the same order, so the views agree
    bitwise (vectors' ops draw noise of their own, from the host generator on the CPU: there the
    order differs)."""
    x = images(b=32)
    torch.manual_seed(5)
    host = composite_views(x, (1, 3, 5), IMAGE_OPS)
    monkeypatch.setattr(cocor_ops, "_draws_share_rng", lambda device: False)
    torch.manual_seed(5)
    packed = composite_views(x, (1, 3, 5), IMAGE_OPS)
    assert torch.equal(host[0], packed[0]) and torch.equal(host[1], packed[1])


def pinda_method(view: str):
    cfg = from_dict(
        {
            "dataset": {"name": "digits", "max_train": 64, "max_test": 32},
            "model": TINY_CNN,
            "view": {"name": view},
            "method": {"augment": ["pinda"]},
            "pinda": {"generator": "unet", "width": 4},
        }
    )
    data = load_dataset(cfg.dataset)
    return build_method(cfg, data), data


@pytest.mark.parametrize("view", ["identity", "simclr"])  # Alg. 1 (pair), Alg. 2 (uniform)
def test_pinda_views_make_no_copy_and_no_sync(monkeypatch, view):
    monkeypatch.setattr(pinda_module, "_selection_is_free", lambda device: False)
    method, data = pinda_method(view)
    x = data.x_train[:16].float()
    info = StepInfo(0, 0, 1)
    with DeviceSplit(x, method) as split:
        batch = Batch(x=x, views=(x + 0, x + 0), index=torch.arange(16))
        batch = method.augments[0].transform(batch, method, info)
        terms = method.augments[0].loss_terms(batch, None, method, info)
    assert torch.isfinite(terms["pinda_penalty"])
    assert not split.events, dict(split.events)


def test_pinda_weighted_noise_is_the_selected_noise(monkeypatch):
    """Alg. 2 on an accelerator weights the noises instead of selecting them: the same penalty and
    diagnostics up to rounding."""
    method, data = pinda_method("simclr")
    aug = method.augments[0]
    x = data.x_train[:64].float()
    batch = Batch(x=x, views=(x + 0, x + 0), index=torch.arange(64))
    info = StepInfo(0, 0, 1)
    torch.manual_seed(1)
    picked = aug.transform(batch, method, info)
    monkeypatch.setattr(pinda_module, "_selection_is_free", lambda device: False)
    torch.manual_seed(1)
    weighted = aug.transform(batch, method, info)
    assert torch.equal(picked.views[0], weighted.views[0]) and torch.equal(
        picked.views[1], weighted.views[1]
    )
    a = aug.loss_terms(picked, None, method, info)["pinda_penalty"]
    b = aug.loss_terms(weighted, None, method, info)["pinda_penalty"]
    assert b.item() == pytest.approx(a.item(), rel=1e-6)


def test_a_training_step_waits_for_the_device_once_and_copies_nothing():
    """The whole SimCLR step on images (batch gather, views, forward, backward, optimiser): no
    copy, and one wait per step (the loss's finiteness, asked one step late)."""
    cfg = from_dict(
        {
            "model": TINY_CNN,
            "view": {"blur_p": 0.5},
            "train": {"epochs": 3, "batch_size": 32, "device": "cpu", "num_threads": 1},
            "eval": {"every": 0, "metrics": [], "epoch_metrics": [], "references": False},
        }
    )
    x = torch.randint(
        0, 256, (128, 3, 16, 16), dtype=torch.uint8
    )  # CIFAR's form, smaller: colour views
    y = torch.randint(0, 10, (128,))
    data = DataSplit(
        "synthetic",
        "image",
        (3, 16, 16),
        10,
        x,
        y,
        x[:32],
        y[:32],
        (0.5,) * 3,
        (0.25,) * 3,
        tuple("0123456789"),
    )
    t = Trainer(cfg, data, log=lambda s: None)
    t.train_epoch()  # the optimisers' state exists
    order = t._order(1)
    t._order = lambda epoch: order  # the epoch's permutation: one copy per epoch, made before
    t.device = DEVICE
    with DeviceSplit(t.x_train, t.y_train, t.method, order, *t.optimizers.values()) as split:
        t.train_epoch()  # the first: the views' constants and the uint8 table reach the device
        split.events.clear()
        t.train_epoch()
    # a wait per step (the finiteness of the loss), and the epoch's mean loss read once at its end
    assert dict(split.events) == {("d2h", "__bool__"): t.steps_per_epoch, ("d2h", "item"): 1}


@pytest.mark.parametrize("cfg, shape", [(ViewConfig(), (3, 16, 16)), (ViewConfig(blur_p=0.5), (3, 16, 16)),
                                        (ViewConfig(), (1, 8, 8)), (ViewConfig(name="noise_mask"), (20,))])
def test_a_steps_two_views_are_the_same_in_one_pass_and_in_two(cfg, shape):
    """The loop's two views: one pass over the batch twice over (an accelerator's way) and two passes (the
    CPU's) give the same pixels, bitwise, for the whole batch and for each DDP rank's rows, over seeds."""
    view = build_view(cfg, "vector" if len(shape) == 1 else "image", shape)
    for seed in range(8):
        x = torch.rand(12, *shape, generator=torch.Generator().manual_seed(100 + seed))
        for mine in (slice(0, 12), slice(0, 4), slice(4, 8), slice(8, 12)):
            torch.manual_seed(seed)
            two = two_views(view, x[mine], 12, mine, one_pass=False)
            torch.manual_seed(seed)
            one = two_views(view, x[mine], 12, mine, one_pass=True)
            assert all(torch.equal(a, b) for a, b in zip(two, one)), (seed, mine)
            assert not torch.equal(one[0], one[1])  # two views, not one twice
        torch.manual_seed(seed)  # a rank's rows are the single process's rows
        whole = two_views(view, x, 12, slice(0, 12), one_pass=True)
        torch.manual_seed(seed)
        rank = two_views(view, x[4:8], 12, slice(4, 8), one_pass=True)
        assert torch.equal(whole[0][4:8], rank[0]) and torch.equal(whole[1][4:8], rank[1])


def test_one_pass_views_make_no_copy_and_no_sync():
    view = SimCLRView(blur_p=0.5)
    x = images(c=3, side=16)
    with DeviceSplit(x) as split:
        view(x)  # the colour constants reach the device once
        split.events.clear()
        a, b = two_views(view, x, 32, slice(0, 16), one_pass=True)  # a DDP rank's half of 32
    assert a.shape == b.shape == x.shape
    assert not split.events, dict(split.events)


def test_batched_views_are_the_per_sample_views_bitwise():
    """The same random parameters, applied to the whole batch, to a DDP rank's rows, and to each
    sample alone: the same pixels (no op mixes samples)."""
    view = build_view(ViewConfig(blur_p=0.5), "image", (3, 16, 16))
    x = images(b=12)
    torch.manual_seed(2)
    p = view.sample(12, x)
    whole = view.apply(x, p)
    rank = view.apply(x[4:8], {k: v[4:8] for k, v in p.items()})
    alone = torch.cat(
        [view.apply(x[i : i + 1], {k: v[i : i + 1] for k, v in p.items()}) for i in range(12)]
    )
    assert torch.equal(whole[4:8], rank)
    assert torch.equal(whole, alone)


@needs_gpu
def test_views_on_the_gpu_match_the_cpu_for_the_same_parameters():
    """Parameters drawn once on the CPU, the views made on the CPU and on the GPU: the same samples
    are flipped, jittered, greyed and blurred, and the pixels agree to float32 rounding. The GPU's
    kernels contract multiply-adds and sum in other orders, so bitwise equality across devices is
    not a property of these kernels (TF32 is off here: with it the blur's convolution rounds to
    10-bit mantissas)."""
    conv, mm = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        view = SimCLRView(blur_p=0.5)
        for c, side in ((3, 32), (1, 8), (3, 96)):
            x = images(b=64, c=c, side=side)
            torch.manual_seed(4)
            p = view.sample(64, x)
            cpu = view.apply(x, p)
            gpu = view.apply(x.cuda(), {k: v.cuda() for k, v in p.items()}).cpu()
            # a 96 px grid's float32 coordinates are exact to ~1e-5 px, and random images change by
            # up to 1 a pixel: 1e-4 is that rounding with room, 40x below one 8-bit level (1/255)
            assert (gpu - cpu).abs().max().item() <= 1e-4, (c, side)
            frac = (gpu == cpu).float().mean().item()
            print(f"{c}x{side}x{side}: {frac:.1%} of the pixels bitwise equal")
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = conv, mm


@needs_gpu
def test_views_on_the_gpu_copy_nothing_to_the_device():
    """The profiler's count of host-to-device copies while the views of a GPU batch are made."""
    from torch.profiler import ProfilerActivity, profile

    view = SimCLRView(blur_p=0.5)
    x = images(b=64).cuda()
    view(x)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        view(x)
        torch.cuda.synchronize()
    copies = [e for e in prof.events() if "Memcpy HtoD" in e.name]
    assert not copies, [e.name for e in copies]
