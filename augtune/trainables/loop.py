"""The one training loop: the in-process CLI and the Ray Train wrapper both call `Trainer`.

Epochs of optimisation steps over a shuffled training set held on the device, views made by whole
batches, several optimisers active by named phase, warm-up + cosine learning rates that are a pure
function of the global step, bf16 autocast on CUDA, evaluation every `eval.every` epochs, and
checkpoints that continue a run exactly (models, optimisers, RNG states, MoCo's queue, history).
"""
from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Callable, Optional, Protocol

import torch
from torch import nn

from augtune.config import Config, to_dict
from augtune.data.views import build_view
from augtune.eval import evaluate
from augtune.methods import Batch, OptimizerSpec, StepInfo, build_method
from augtune.trainables.phases import parse_phases, phase_names


class NonFiniteLoss(RuntimeError):
    """The loss became NaN or infinite; the message names the epoch and the step."""


class EpochCallback(Protocol):
    def __call__(self, trainer: "Trainer", metrics: dict, checkpoint: Optional[Path]) -> None: ...


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
    return cls(spec.params, lr=lr, weight_decay=wd)


@torch.no_grad()
def allreduce_gradients(params: list[torch.Tensor], world_size: int) -> None:
    """Average gradients over DDP ranks in one flat all-reduce (a missing gradient counts as 0).

    Done by hand rather than by wrapping in DistributedDataParallel: phases leave whole networks
    without gradients, and one flat buffer keeps every rank's reduction identical and in one call.
    """
    import torch.distributed as dist

    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= world_size
    offset = 0
    for p in params:
        n = p.numel()
        p.grad = flat[offset:offset + n].view_as(p).clone()
        offset += n


@torch.no_grad()
def extract_features(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, batch_size: int,
                     device: torch.device) -> torch.Tensor:
    """fn over x in batches on `device`; features come back as float32 on the CPU."""
    return torch.cat([fn(x[i:i + batch_size].to(device)).float().cpu() for i in range(0, len(x), batch_size)])


class Trainer:
    """Trains `cfg`'s method on `data` (a DataSplit). Rank/world describe a DDP process group."""

    def __init__(self, cfg: Config, data, *, rank: int = 0, world_size: int = 1,
                 log: Callable[[str], None] = print):
        self.cfg, self.data, self.rank, self.world_size, self.log = cfg, data, rank, world_size, log
        t = cfg.train
        if t.num_threads:
            torch.set_num_threads(t.num_threads)
        self.device = resolve_device(t.device)
        self.bf16 = self.device.type == "cuda" and t.precision in ("auto", "bf16")
        if t.batch_size % world_size:
            raise ValueError(f"train.batch_size: {t.batch_size} does not split over {world_size} workers")
        n = len(data.x_train)
        if n < t.batch_size:
            raise ValueError(f"train.batch_size: {t.batch_size} is larger than the training set ({n} samples)")
        self.steps_per_epoch = n // t.batch_size  # drop_last: every step sees a full global batch
        self.total_steps = self.steps_per_epoch * t.epochs

        torch.manual_seed(t.seed)  # weights, MoCo's queue and the first views follow from the seed
        self.method = build_method(cfg, data).to(self.device)
        self.view = build_view(cfg.view, data.modality, tuple(data.shape)).to(self.device)
        self.x_train = data.x_train.to(self.device)
        self.y_train = data.y_train.to(self.device)

        schedule = t.phases or self.method.default_phases()
        self.phases = parse_phases(schedule, t.epochs)
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
        self.warmup_steps = round(t.warmup_epochs * self.steps_per_epoch)
        self.epoch = 0  # epochs finished
        self.global_step = 0
        self.history: list[dict] = []
        self.references: dict[str, dict] = {}

    # -- one epoch ------------------------------------------------------------------------------

    def _order(self, epoch: int) -> torch.Tensor:
        """This epoch's permutation: a pure function of (seed, epoch), identical on every rank."""
        g = torch.Generator().manual_seed(self.cfg.train.seed * 1_000_003 + epoch)
        return torch.randperm(len(self.x_train), generator=g)

    def _set_lr(self) -> None:
        t = self.cfg.train
        f = lr_factor(self.global_step, self.total_steps, self.warmup_steps, t.min_lr_ratio, t.schedule)
        for opt in self.optimizers.values():
            for g in opt.param_groups:
                g["lr"] = g["base_lr"] * f

    def train_epoch(self) -> dict:
        t, epoch = self.cfg.train, self.epoch
        phase = self.phases[epoch]
        active = [self.optimizers[s.name] for s in self.specs
                  if not s.manual and (s.phases is None or phase in s.phases)]
        self.method.train()
        self.method.on_epoch_start(StepInfo(epoch, self.global_step, self.total_steps, phase))
        order = self._order(epoch).to(self.device)
        b_local = t.batch_size // self.world_size
        sums: dict[str, torch.Tensor] = {}
        start = time.perf_counter()
        for i in range(self.steps_per_epoch):
            idx = order[i * t.batch_size:(i + 1) * t.batch_size]  # the global batch
            x = self.x_train[idx]
            # Views of the whole global batch on every rank, then this rank's slice: the RNG stream
            # is the same on every rank and as in one process, so DDP reproduces one big batch.
            views = [self.view(x), self.view(x)]
            mine = slice(self.rank * b_local, (self.rank + 1) * b_local)
            batch = Batch(x=x[mine], views=[v[mine] for v in views], index=idx[mine], y=self.y_train[idx][mine])
            info = StepInfo(epoch, self.global_step, self.total_steps, phase)
            self._set_lr()
            with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16):
                loss, terms = self.method(batch, info)
            if not torch.isfinite(loss):
                raise NonFiniteLoss(f"loss became {loss.item()} at epoch {epoch + 1}, step {i + 1} "
                                    f"(global step {self.global_step + 1})")
            loss.backward()
            params = [p for o in active for g in o.param_groups for p in g["params"]]
            if self.world_size > 1:
                allreduce_gradients(params, self.world_size)
            if t.grad_clip:
                nn.utils.clip_grad_norm_(params, t.grad_clip)
            for opt in active:
                opt.step()
            for opt in self.optimizers.values():
                opt.zero_grad(set_to_none=True)
            self.method.after_step(batch, info, self.optimizers)
            self.global_step += 1
            for k, v in {"loss": loss.detach(), **terms}.items():
                sums[k] = sums.get(k, 0) + v.float()
        elapsed = time.perf_counter() - start
        if self.world_size > 1:  # report the mean over ranks, as one process would
            import torch.distributed as dist

            keys = sorted(sums)
            flat = torch.stack([sums[k] for k in keys])
            dist.all_reduce(flat)
            sums = dict(zip(keys, flat / self.world_size))
        metrics = {"epoch": epoch + 1}
        if phase:
            metrics["phase"] = phase
        for k, v in sums.items():
            name = k if k == "loss" else f"loss_{k}"
            if name != "loss_contrast" or len(sums) > 2:  # the only term equals `loss` itself
                metrics[name] = v.item() / self.steps_per_epoch
        metrics.update(self.method.epoch_metrics())  # this rank's diagnostics (rank 0 reports)
        metrics["epoch_time_s"] = elapsed
        metrics["samples_per_s"] = self.steps_per_epoch * t.batch_size / elapsed
        self.epoch += 1
        return metrics

    # -- evaluation ------------------------------------------------------------------------------

    def _eval_features(self, fn) -> tuple[torch.Tensor, torch.Tensor]:
        bs = self.cfg.eval.batch_size
        return (extract_features(fn, self.data.x_train, bs, self.device),
                extract_features(fn, self.data.x_test, bs, self.device))

    def evaluate(self, metrics: tuple[str, ...], fn=None) -> dict:
        """Metrics of the features `fn` (default: the method's backbone) on train/test."""
        if not metrics:
            return {}
        was_training = self.method.training
        self.method.eval()
        try:
            with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16):
                train_f, test_f = self._eval_features(fn or self.method.features)
        finally:
            self.method.train(was_training)
        return evaluate(train_f, self.data.y_train, test_f, self.data.y_test, self.data.num_classes,
                        self.cfg.eval, metrics, seed=self.cfg.train.seed)

    def evaluate_references(self) -> dict[str, dict]:
        """`raw`: the input itself as the feature; `random-init`: the untrained backbone (call first)."""
        metrics = self.cfg.eval.metrics
        return {"raw": self.evaluate(metrics, fn=lambda x: x.flatten(1)),
                "random-init": self.evaluate(metrics)}

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

    def save_checkpoint(self, path: Path) -> Path:
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        torch.save(self.state_dict(), tmp)
        tmp.replace(path)  # atomic: a crash mid-save keeps the previous checkpoint
        return path

    def load_checkpoint(self, path: Path) -> None:
        self.load_state_dict(torch.load(path, map_location=self.device, weights_only=True))

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
            self.references = self.evaluate_references() if lead else {}
        last = t.epochs if stop_after is None else min(t.epochs, stop_after)
        final: dict = {}
        while self.epoch < last:
            metrics = self.train_epoch()
            e = self.epoch
            if e == t.epochs:
                final = self.evaluate(c.eval.metrics) if lead else {}
                metrics.update(final)
            elif c.eval.every and e % c.eval.every == 0 and lead:
                metrics.update(self.evaluate(c.eval.epoch_metrics))
            self.history.append(metrics)
            ckpt = None
            if lead and checkpoint_path is not None and (
                    e == last or (t.checkpoint_every and e % t.checkpoint_every == 0)):
                ckpt = self.save_checkpoint(checkpoint_path)
            if on_epoch_end is not None:
                on_epoch_end(self, metrics, ckpt)
        return final
