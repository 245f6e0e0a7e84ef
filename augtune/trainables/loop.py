"""The one training loop: the in-process CLI and the Ray Train wrapper both call `Trainer`.

Epochs of optimisation steps over a shuffled training set held on the device, views made by whole
batches, several optimisers active by named phase, warm-up + cosine learning rates that are a pure
function of the global step, bf16 autocast on CUDA, evaluation every `eval.every` epochs, and
checkpoints that continue a run exactly (models, optimisers, RNG states, MoCo's queue, history).
"""
from __future__ import annotations

import contextlib
import math
import time
import warnings
from pathlib import Path
from typing import Callable, Optional, Protocol

import torch
import torch.utils.serialization.config as serialization
from torch import nn

from augtune.config import Config, parse_duration, replace_values, to_dict, value_of, values_at
from augtune.data.batches import batches, on_device, sequential
from augtune.data.views import build_view
from augtune.eval import evaluate, extract_features
from augtune.methods import Batch, OptimizerSpec, StepInfo, build_method
from augtune.methods.base import Update
from augtune.methods.losses import allreduce_gradients
from augtune.phases import parse_phases, phase_names
from augtune.records import LABEL_FREE, VAL_PREFIX, atomic_file


class NonFiniteLoss(RuntimeError):
    """The loss became NaN or infinite; the message names the epoch and the step."""


class CheckpointError(ValueError):
    """A checkpoint that cannot continue this run (truncated, foreign, another model); one line."""


class EpochCallback(Protocol):
    def __call__(self, trainer: "Trainer", metrics: dict, checkpoint: Optional[Path]) -> None: ...


def _first_line(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}".strip().splitlines()[0]
    return text[:200]


def checkpoint_due(epoch: int, last: int, every: int | str | None, since_last_s: float = 0.0,
                   default: int | str = 1) -> bool:
    """The one checkpoint rule: after the run's last epoch (or the last one asked for), and every
    `every` epochs, or once `every` (a duration, "5min") has passed since the last checkpoint
    (`train.checkpoint_every`; 0: only the last; None: `default`)."""
    every = default if every is None else every
    if epoch == last:
        return True
    if isinstance(every, str):
        return since_last_s >= parse_duration(every)
    return bool(every and epoch % every == 0)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("train.device: cuda was asked for but torch sees no GPU")
    return torch.device(name)


def lr_factor(step: int, total: int, warmup: int, min_ratio: float, schedule: str) -> float:
    """Linear warm-up over `warmup` steps, then cosine from 1 down to `min_ratio` (or constant)."""
    if step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    t = (step - warmup) / max(1, total - warmup)
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, t)))


def make_optimizer(spec: OptimizerSpec, train) -> torch.optim.Optimizer:
    kind = spec.kind or train.optimizer
    lr = spec.lr if spec.lr is not None else train.lr
    wd = spec.weight_decay if spec.weight_decay is not None else train.weight_decay
    if kind == "sgd":
        return torch.optim.SGD(spec.params, lr=lr, momentum=train.momentum, weight_decay=wd)
    cls = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[kind]
    return cls(spec.params, lr=lr, weight_decay=wd, **({} if spec.eps is None else {"eps": spec.eps}))


def tracked_keys(cfg: Config) -> tuple[str, ...]:
    """The knobs a run records per epoch: the keys its `schedule` sets and `train.track`'s (in a PBT
    search's trial, the keys PBT mutates: the plan puts them there)."""
    return tuple(dict.fromkeys([*(k for step in cfg.schedule for k in step.set), *cfg.train.track]))


def two_views(view: torch.nn.Module, x: torch.Tensor, batch: int, mine: slice,
              one_pass: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Two views of this rank's rows `x` (`mine`) of a global batch of `batch`: every rank draws the random
    parameters of the whole global batch (the stream one process would draw) and makes only its own rows'
    views, so DDP reproduces one big batch at 1/world of the view work.

    The parameters of both views are drawn at once (2 x `batch` rows: the first view's, then the
    second's). `one_pass` (the loop's choice on an accelerator) then makes both views in one pass over
    the batch twice over: half the kernel launches of two passes, and a GPU's views are bound by
    launches, not arithmetic (docs/results.md#gpu). On the CPU two passes are faster at large batches
    (the doubled batch leaves the cache: `benchmarks/views.py`). Both give the same views, bitwise."""
    params = view.sample(2 * batch, x)
    rows = (mine, slice(batch + mine.start, batch + mine.stop))  # this rank's rows of each view
    if not one_pass:
        first, second = (view.apply(x, {k: v[r] for k, v in params.items()}) for r in rows)
        return first, second
    if (mine.start, mine.stop) != (0, batch):
        params = {k: torch.cat([v[rows[0]], v[rows[1]]]) for k, v in params.items()}
    both = view.apply(torch.cat([x, x]), params)
    return both[: x.shape[0]], both[x.shape[0]:]


class _ParametersLeftToLoad(torch.overrides.TorchFunctionMode):
    """Skips the initial fills of parameters (`nn.init`'s, and the tensor fills they call) while a model
    is built whose every parameter a checkpoint is about to overwrite: drawing 2.7 M random weights took
    18 ms of a 36 ms restart in a PBT exploit. Anything else (buffers, plain tensors) is drawn as usual,
    so what no checkpoint holds is still there; only parameters are skipped, and a strict load fills
    every one of them (the exploit's bitwise contract test holds for every method and base)."""

    # nn.init's functions that dispatch (the others call the tensor fills below); trunc_normal_'s steps
    FILLS = frozenset({
        nn.init.uniform_, nn.init.normal_, nn.init.constant_, nn.init.kaiming_uniform_,
        torch.Tensor.uniform_, torch.Tensor.normal_, torch.Tensor.fill_, torch.Tensor.zero_,
        torch.Tensor.copy_, torch.Tensor.erfinv_, torch.Tensor.mul_, torch.Tensor.add_, torch.Tensor.clamp_,
    })

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in self.FILLS:
            target = args[0] if args else kwargs.get("tensor")  # nn.init passes its tensor by name
            if isinstance(target, nn.Parameter):
                return target
        return func(*args, **kwargs)


class Trainer:
    """Trains `cfg`'s method on `data` (a DataSplit). Rank/world describe a DDP process group.

    `restoring`: the caller loads a checkpoint of this run next (a resumed or PBT-exploited trial), so the
    parameters' initial values are not drawn (see `_ParametersLeftToLoad`)."""

    def __init__(self, cfg: Config, data, *, rank: int = 0, world_size: int = 1,
                 log: Callable[[str], None] = print, restoring: bool = False):
        self.cfg, self.data, self.rank, self.world_size, self.log = cfg, data, rank, world_size, log
        t = cfg.train
        if t.num_threads:
            torch.set_num_threads(t.num_threads)
        self.device = resolve_device(t.device)
        self.bf16 = self.device.type == "cuda" and t.precision in ("auto", "bf16")
        if t.batch_size % world_size:
            raise ValueError(f"train.batch_size: {t.batch_size} does not split over {world_size} workers")
        x_fit, y_fit = data.pretrain()  # x_train, then any unlabelled images (STL-10's): what is trained on
        n = len(x_fit)
        if n < t.batch_size:
            raise ValueError(
                f"train.batch_size: {t.batch_size} is larger than the training set ({n} samples)"
            )
        self.steps_per_epoch = n // t.batch_size  # drop_last: every step sees a full global batch
        self.total_steps = self.steps_per_epoch * t.epochs

        torch.manual_seed(t.seed)  # weights, MoCo's queue and the first views follow from the seed
        with _ParametersLeftToLoad() if restoring else contextlib.nullcontext():
            self.method = build_method(cfg, data)
        self.method = self.method.to(self.device)
        self.memory_format = torch.channels_last if t.channels_last and data.modality == "image" else None
        if self.memory_format is not None:
            self.method = self.method.to(memory_format=self.memory_format)
        if t.compile:
            mode = {} if t.compile is True else {"mode": t.compile}
            self.method.objective.encoder.backbone.compile(**mode)
        # CUDA graphs (reduce-overhead): each step opens a new generation of the graphs' memory
        self.graphs = t.compile == "reduce-overhead" and self.device.type == "cuda"
        self.method.objective.encoder.clone_outputs = self.graphs
        self.view = build_view(cfg.view, data.modality, tuple(data.shape)).to(self.device)
        self.x_train = on_device(x_fit, self.device)  # uint8 images: float per batch; streamed files stay
        self.y_train = y_fit.to(self.device)

        schedule = t.phases or self.method.default_phases()
        self.phases = parse_phases(schedule, t.epochs)
        self.forward = self._wrap_ddp() if world_size > 1 else self.method
        self.specs = self.method.optimizer_specs()
        known = {p for s in self.specs if s.phases for p in s.phases}
        unknown = phase_names(schedule) - known
        if known and unknown:
            raise ValueError(f"train.phases: no part of this method trains in phase(s) {sorted(unknown)} "
                             f"(known: {sorted(known)})")
        self.optimizers = {s.name: make_optimizer(s, t) for s in self.specs}
        for opt in self.optimizers.values():
            for g in opt.param_groups:
                g.setdefault("base_lr", g["lr"])
        self._lr_follows = [s.name for s in self.specs if s.lr is None]  # the optimisers train.lr sets
        # the per-epoch knobs this run records in every epoch (and a schedule or PBT may change)
        self.tracked = tracked_keys(cfg)
        self.knobs: dict = {}  # their values in force in the epoch being trained
        self.warmup_steps = round(t.warmup_epochs * self.steps_per_epoch)
        self.epoch = 0  # epochs finished
        self.global_step = 0
        self.history: list[dict] = []
        self.references: dict[str, dict] = {}
        self.diagnostics: dict[str, float] = {}  # the method's diagnostics of the last epoch trained
        self.final: dict = {}  # end-of-run evaluation + the method's diagnostics of the last epoch
        # wall and CPU seconds this process spent on each part of the run (the record keeps them: where the
        # time went; CPU is this process's, all its threads, which a busy machine does not inflate)
        parts = ("references", "train", "eval", "checkpoint", "figures")
        self.seconds: dict[str, float] = dict.fromkeys(parts, 0.0)
        self.cpu_seconds: dict[str, float] = dict(self.seconds)

    # -- one epoch ------------------------------------------------------------------------------

    def _order(self, epoch: int) -> torch.Tensor:
        """This epoch's permutation: a pure function of (seed, epoch), identical on every rank."""
        g = torch.Generator().manual_seed(self.cfg.train.seed * 1_000_003 + epoch)
        return torch.randperm(len(self.x_train), generator=g)

    def visits(self, epoch: int) -> torch.Tensor:
        """The samples `epoch`'s steps train on, in order (its permutation less the last partial batch)."""
        return self._order(epoch)[:self.steps_per_epoch * self.cfg.train.batch_size]

    def _set_lr(self) -> None:
        t = self.cfg.train
        f = lr_factor(self.global_step, self.total_steps, self.warmup_steps, t.min_lr_ratio, t.schedule)
        for opt in self.optimizers.values():
            for g in opt.param_groups:
                g["lr"] = g["base_lr"] * f

    def _wrap_ddp(self) -> nn.Module:
        """The method under DistributedDataParallel: gradients are averaged in buckets while the backward
        pass still runs (overlapped), instead of one all-reduce after it. Phases leave whole networks
        without gradients (find_unused_parameters); each rank keeps its own BatchNorm statistics, as a
        single process of the global batch keeps one set (broadcast_buffers off)."""
        from torch.nn.parallel import DistributedDataParallel

        if self.cfg.model.sync_bn:
            self.method = nn.SyncBatchNorm.convert_sync_batchnorm(self.method)
        device_ids = (
            [self.device.index] if self.device.type == "cuda" and self.device.index is not None else None
        )
        with warnings.catch_warnings():  # broadcast_buffers=False is still the way to keep rank-local buffers
            warnings.simplefilter("ignore", FutureWarning)
            # an augmentation's own networks (CoCor's MMNN, a generator outside its phase) miss the forward
            unused = bool(self.method.augments) or len(set(self.phases)) > 1
            return DistributedDataParallel(self.method, device_ids=device_ids, find_unused_parameters=unused,
                                           broadcast_buffers=False)

    def _step(self, optimizers: list[torch.optim.Optimizer], params: list[torch.Tensor],
              reduced: bool = False) -> None:
        """Every optimiser step goes through here: gradients averaged over ranks (unless DDP's backward
        already did: `reduced`), clipped, applied."""
        if self.world_size > 1 and not reduced:
            allreduce_gradients(params, self.world_size)
        if self.cfg.train.grad_clip:
            nn.utils.clip_grad_norm_(params, self.cfg.train.grad_clip)
        for opt in optimizers:
            opt.step()

    def _update(self, name: str, *, loss: Optional[torch.Tensor] = None,
                grads: Optional[list[Optional[torch.Tensor]]] = None) -> None:
        """An augmentation's own update of optimiser `name` (see :class:`augtune.methods.base.Update`)."""
        opt = self.optimizers[name]
        params = [p for g in opt.param_groups for p in g["params"]]
        if loss is not None:
            loss.backward()
        if grads is not None:
            for p, g in zip(params, grads, strict=True):
                p.grad = None if g is None else g.to(p.dtype)
        self._step([opt], params)
        opt.zero_grad(set_to_none=True)

    def _views(self, x: torch.Tensor, batch: int, mine: slice) -> tuple[torch.Tensor, torch.Tensor]:
        """Two views of this rank's rows `x` of a global batch of `batch` (:func:`two_views`)."""
        return two_views(self.view, x, batch, mine, one_pass=x.device.type != "cpu")

    def apply_knobs(self) -> None:
        """Put in force the knob values of the epoch about to be trained: the run's config with its
        `schedule`'s steps up to this epoch, handed to the method, and train.lr as the peak of the
        optimisers that follow it (the warm-up and cosine keep their position). Called at the start of
        every epoch, also after a checkpoint is loaded (a PBT exploit's optimisers hold the donor's)."""
        if not self.tracked:
            return
        values = {k: value_of(self.cfg, k) for k in self.tracked}
        values.update(values_at(self.cfg, self.epoch + 1))
        in_force = replace_values(self.cfg, values)
        self.method.apply_knobs(in_force)
        for name in self._lr_follows:
            for g in self.optimizers[name].param_groups:
                g["base_lr"] = in_force.train.lr
        self.knobs = {k: list(v) if isinstance(v, tuple) else v for k, v in values.items()}

    def train_epoch(self) -> dict:
        t, epoch = self.cfg.train, self.epoch
        phase = self.phases[epoch]
        self.apply_knobs()
        active = [self.optimizers[s.name] for s in self.specs
                  if not s.manual and (s.phases is None or phase in s.phases)]
        params = [p for o in active for g in o.param_groups for p in g["params"]]
        update: Update = self._update
        self.method.train()
        order = self.visits(epoch)
        opening = StepInfo(epoch, self.global_step, self.total_steps, phase, autocast=self.bf16, visits=order)
        self.method.on_epoch_start(opening)
        order = order.to(self.device)
        b_local = t.batch_size // self.world_size
        mine = slice(self.rank * b_local, (self.rank + 1) * b_local)
        # global
        steps = [order[i * t.batch_size:(i + 1) * t.batch_size] for i in range(self.steps_per_epoch)]
        rows = batches(self.x_train, [idx[mine] for idx in steps], self.device, self.cfg.dataset.workers)
        sums: dict[str, torch.Tensor] = {}
        pending = None  # the last step's loss: checked one step late (see _check_finite)
        start = time.perf_counter()
        for i, (idx, x) in enumerate(zip(steps, rows)):  # x: this rank's rows only, float on the device
            if self.memory_format is not None:
                x = x.contiguous(memory_format=self.memory_format)
            batch = Batch(
                x=x, views=self._views(x, t.batch_size, mine), index=idx[mine], y=self.y_train[idx[mine]]
            )
            self._set_lr()
            info = StepInfo(epoch, self.global_step, self.total_steps, phase, lr=self._encoder_lr(),
                            autocast=self.bf16)
            self._check_finite(pending)  # the last step's, now that this step's views are queued
            if self.graphs:
                torch.compiler.cudagraph_mark_step_begin()
            with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16):
                loss, terms, batch = self.forward(batch, info)
            pending = (loss.detach(), epoch, i, self.global_step)
            loss.backward()
            self._step(active, params, reduced=self.forward is not self.method)
            for opt in self.optimizers.values():
                opt.zero_grad(set_to_none=True)
            self.method.after_step(batch, info, update)
            self.global_step += 1
            for k, v in {"loss": loss.detach(), **terms}.items():
                sums[k] = sums.get(k, 0) + v.float()
        self._check_finite(pending)
        elapsed = time.perf_counter() - start
        metrics = {"epoch": epoch + 1}
        if phase:
            metrics["phase"] = phase
        if self.knobs:
            metrics["knobs"] = dict(self.knobs)  # the values this epoch trained with
        metrics.update(self._epoch_losses(sums))
        self.diagnostics = self.method.epoch_metrics()  # this rank's (rank 0 reports)
        metrics.update(self.diagnostics)
        metrics["epoch_time_s"] = elapsed
        metrics["samples_per_s"] = self.steps_per_epoch * t.batch_size / elapsed
        self.epoch += 1
        return metrics

    @staticmethod
    def _check_finite(step: Optional[tuple[torch.Tensor, int, int, int]]) -> None:
        """NonFiniteLoss if the loss of `step` (loss, epoch, step in the epoch, global step; all
        0-based) was NaN or infinite. The loop asks one step late, once the next step's views are
        queued: the host then waits for the step before while the device has work, instead of
        draining the device's queue after every forward. That step's update has run (the run fails
        all the same, with the same message); no forward pass ever sees weights it made."""
        if step is None:
            return
        loss, epoch, i, global_step = step
        if not torch.isfinite(loss):
            raise NonFiniteLoss(f"loss became {loss.item()} at epoch {epoch + 1}, step {i + 1} "
                                f"(global step {global_step + 1})")

    def _encoder_lr(self) -> float:
        opt = self.optimizers.get("encoder")
        return opt.param_groups[0]["lr"] if opt is not None else self.cfg.train.lr

    def _epoch_losses(self, sums: dict[str, torch.Tensor]) -> dict[str, float]:
        """Mean loss and terms over the epoch's steps (the mean over ranks, as one process would)."""
        if self.world_size > 1:
            import torch.distributed as dist

            keys = sorted(sums)
            flat = torch.stack([sums[k] for k in keys])
            dist.all_reduce(flat)
            sums = dict(zip(keys, flat / self.world_size))
        out = {}
        for k, v in sums.items():
            name = k if k == "loss" else f"loss_{k}"
            if name != "loss_contrast" or len(sums) > 2:  # the only term equals `loss` itself
                out[name] = v.item() / self.steps_per_epoch
        return out

    # -- evaluation ------------------------------------------------------------------------------

    def _eval_batch(self) -> int:
        return self.cfg.eval.batch_size or (1024 if self.device.type == "cuda" else 256)

    def _monitor_index(self, n: int, split: str) -> Optional[torch.Tensor]:
        """A fixed, seeded subsample of a split for per-epoch monitoring (None: the whole split)."""
        size = self.cfg.eval.monitor_size
        if size is None or n <= size:
            return None
        # the same samples every epoch and run
        g = torch.Generator().manual_seed(0 if split == "train" else 1)
        return torch.sort(torch.randperm(n, generator=g)[:size]).values

    def evaluate(
        self, metrics: tuple[str, ...], fn=None, monitor: bool = False, seed: Optional[int] = None
    ) -> dict:
        """Metrics of the features `fn` (default: the method's backbone) on train/test; `monitor`: on
        the per-epoch subsample of each split. With a validation split beside the test split
        (`dataset.evaluate_on: both`), a full evaluation also scores that one, as `val_<metric>`
        (the same training features, the same seed)."""
        if not metrics:
            return {}
        d = self.data
        x_tr, y_tr = d.x_train, d.y_train
        held = [("", d.x_test, d.y_test)]
        if d.x_val is not None and not monitor:
            held.append((VAL_PREFIX, d.x_val, d.y_val))
        if len(y_tr) == 0:  # data without labels: the label-free scores of the unlabelled rows (checked),
            # which are also its validation rows (there is no other split; RankMe scores training rows too)
            held = [("", d.x_unlabeled, None)]
            if self.cfg.dataset.evaluate_on == "both" and not monitor:
                held.append((VAL_PREFIX, d.x_unlabeled, None))
        i_tr = self._monitor_index(len(x_tr), "train") if monitor else None  # rows evaluated (None: all)
        y_tr = y_tr if i_tr is None else y_tr[i_tr]
        label_free = len(y_tr) == 0 or all(m in LABEL_FREE for m in metrics)
        was_training = self.method.training
        self.method.eval()
        try:
            with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16):
                fn = fn or self.method.features
                bs, workers = self._eval_batch(), self.cfg.dataset.workers
                train_f = None if label_free else extract_features(fn, x_tr, bs, self.device, index=i_tr,
                                                                   workers=workers)
                parts = []
                for prefix, x, y in held:
                    i = self._monitor_index(len(x), "test") if monitor else None
                    f = extract_features(fn, x, bs, self.device, index=i, workers=workers)
                    pairs = self._view_pairs(fn, x, i) if "alignment" in metrics else None
                    parts.append((prefix, f, y if y is None or i is None else y[i], pairs))
        finally:
            self.method.train(was_training)
        out = {}
        for prefix, f, y, pairs in parts:
            scores = evaluate(train_f, y_tr, f, y, d.num_classes, self.cfg.eval, metrics,
                              seed=self.cfg.train.seed if seed is None else seed, pairs=pairs)
            out.update({prefix + k: v for k, v in scores.items()})
        return out

    def _view_pairs(self, fn, x, index: Optional[torch.Tensor]):
        """pairs(rows) -> the features of two training views of the rows `rows` of x[index] (alignment's
        positive pairs). The views are drawn from seed 0 in a forked RNG, so scoring changes neither the
        training's random stream nor with it: every run's pairs are the same draws of its own views."""
        def pairs(rows: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
            chosen = torch.arange(len(x)) if index is None else index
            chosen = chosen if rows is None else chosen[rows]
            a, b = [], []
            devices = [self.device] if self.device.type == "cuda" else []
            with torch.no_grad(), torch.random.fork_rng(devices=devices):
                torch.manual_seed(0)
                for xb in batches(x, sequential(len(x), self._eval_batch(), chosen), self.device,
                                  self.cfg.dataset.workers):
                    v1, v2 = two_views(self.view, xb, len(xb), slice(0, len(xb)), one_pass=False)
                    a.append(fn(v1).float().cpu())
                    b.append(fn(v2).float().cpu())
            return torch.cat(a), torch.cat(b)
        return pairs

    def evaluate_references(self) -> dict[str, dict]:
        """`raw`: the input itself as the feature; `random-init`: the untrained backbone (call first).
        Each is read from `eval.reference_cache` when a run with the same inputs computed it before."""
        from augtune.trainables.references import cached

        metrics, cfg = self.cfg.eval.metrics, self.cfg
        return cached(cfg, {  # raw does not depend on the seed: evaluated with seed 0, once per data set
            "raw": lambda: self.evaluate(metrics, fn=lambda x: x.flatten(1), seed=0),
            "random-init": lambda: self.evaluate(metrics),
        })

    # -- checkpoints -----------------------------------------------------------------------------

    def state_dict(self) -> dict:
        state = {
            "epoch": self.epoch,
            "global_step": self.global_step,
            "method": self.method.state_dict(),
            "optimizers": {k: o.state_dict() for k, o in self.optimizers.items()},
            "rng_cpu": torch.get_rng_state(),
            "history": self.history,
            "references": self.references,
            "final": self.final,
            "config": to_dict(self.cfg),
        }
        if self.device.type == "cuda":
            state["rng_cuda"] = torch.cuda.get_rng_state(self.device)
        return state

    def load_state_dict(self, state: dict) -> None:
        self.method.load_state_dict(state["method"])
        for k, opt in self.optimizers.items():
            opt.load_state_dict(state["optimizers"][k])
        torch.set_rng_state(state["rng_cpu"])
        if self.device.type == "cuda" and "rng_cuda" in state:
            torch.cuda.set_rng_state(state["rng_cuda"], self.device)
        self.epoch, self.global_step = state["epoch"], state["global_step"]
        self.history, self.references = list(state["history"]), dict(state["references"])
        self.final = dict(state.get("final", {}))

    @contextlib.contextmanager
    def timed(self, part: str):
        """Adds the wall and CPU time of the block to `self.seconds[part]` and `self.cpu_seconds[part]`."""
        start, cpu = time.perf_counter(), time.process_time()
        try:
            yield
        finally:
            self.seconds[part] = self.seconds.get(part, 0.0) + time.perf_counter() - start
            self.cpu_seconds[part] = self.cpu_seconds.get(part, 0.0) + time.process_time() - cpu

    def save_checkpoint(self, path: Path) -> Path:
        with self.timed("checkpoint"):
            return self._save_checkpoint(Path(path))

    def _save_checkpoint(self, path: Path) -> Path:
        try:
            # our own file: its errors reach torch's writer as OSError. No zip CRC: it cost a third of
            # writing 32 MB, and the (mapped) load never checks it; a torn file still fails to load.
            # Atomic (a crash mid-save keeps the previous checkpoint); a half-written temporary is
            # removed, which would otherwise keep a full disk full
            with atomic_file(path) as f, serialization.patch({"save.compute_crc32": False}):
                torch.save(self.state_dict(), f)
        except RuntimeError as e:
            if isinstance(e.__context__, OSError):
                raise e.__context__ from None  # torch says "unexpected pos"; the file said "no space left"
            raise
        return path

    def load_checkpoint(self, path: Path) -> None:
        """Continue from `path`; anything but a checkpoint of this very run is a CheckpointError."""
        try:
            # mapped, not read: the load copies each tensor where it belongs once (10 ms less of 32 MB)
            state = torch.load(path, map_location=self.device, weights_only=True, mmap=True)
        except Exception as e:  # truncated, not a torch file, or objects weights_only refuses
            raise CheckpointError(f"{path}: not a readable checkpoint ({_first_line(e)})") from None
        if not isinstance(state, dict) or not {"method", "optimizers", "epoch", "global_step"} <= set(state):
            raise CheckpointError(f"{path}: not an augtune checkpoint (no method, optimiser and epoch state)")
        try:
            self.load_state_dict(state)
        except (RuntimeError, KeyError, ValueError, TypeError) as e:  # another model, method or optimiser
            raise CheckpointError(
                f"{path}: does not fit this config's model and method ({_first_line(e)})"
            ) from None

    # -- the run -----------------------------------------------------------------------------------

    def fit(self, checkpoint_path: Optional[Path] = None, on_epoch_end: Optional[EpochCallback] = None,
            stop_after: Optional[int] = None) -> dict:
        """Train from `self.epoch` to the end (or to `stop_after` epochs) and return final metrics.

        `checkpoint_path`: where checkpoints are written (rank 0 only). `on_epoch_end` gets the
        epoch's metrics and the checkpoint written (or None), after it is on disk.
        """
        c, t = self.cfg, self.cfg.train
        lead = self.rank == 0
        if self.epoch == 0 and c.eval.references and not self.references:
            with self.timed("references"):
                self.references = self.evaluate_references() if lead else {}
        last = t.epochs if stop_after is None else min(t.epochs, stop_after)
        every = 1 if c.eval.every is None else c.eval.every  # None: every epoch (a search sets 0)
        last_ckpt = time.monotonic()
        while self.epoch < last:
            with self.timed("train"):
                metrics = self.train_epoch()
            e = self.epoch
            with self.timed("eval"):
                if e == t.epochs:
                    evaluated = self.evaluate(c.eval.metrics) if lead else {}
                    metrics.update(evaluated)
                    self.final = {**evaluated, **self.diagnostics} if lead else {}
                elif lead and (e in c.eval.at or (every and e % every == 0)):
                    metrics.update(self.evaluate(c.eval.epoch_metrics, monitor=True))
            self.history.append(metrics)
            ckpt = None
            if lead and checkpoint_path is not None and checkpoint_due(e, last, t.checkpoint_every,
                                                                       time.monotonic() - last_ckpt):
                ckpt = self.save_checkpoint(checkpoint_path)
                last_ckpt = time.monotonic()
            if on_epoch_end is not None:
                on_epoch_end(self, metrics, ckpt)
        return self.final
