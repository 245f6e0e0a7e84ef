"""Every method as a Ray trainable: one Tune trial runs the one training loop.

Two paths, with the same checkpoints, reports and records:

- ``resources.num_workers == 1`` on the CPU: the loop runs inside the Tune function trainable
  itself (no worker group: Ray's per-trial start-up is the expensive part on small machines);
  checkpoints go through ``ray.tune.report`` and come back from ``ray.tune.get_checkpoint``.
- otherwise: the Tune function is a *driver* that builds a Ray Train ``TorchTrainer`` (Train V2)
  with ``TuneReportCallback``; each worker runs the loop on its slice of every global batch,
  gradients are averaged over ranks (gloo on CPU, NCCL on GPU), rank 0 evaluates, reports and
  checkpoints; a restarted run continues from ``ray.train.get_checkpoint()``.

A checkpoint folder holds ``checkpoint.pt`` and the run's ``record.json`` so far; the trial folder
gets the final ``record.json`` (the one `augtune.analysis` reads).
"""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Callable

from augtune.config import Config, from_dict, set_values, to_dict
from augtune.plots import end_of_run_figures
from augtune.records import CHECKPOINT_FILE, RECORD_FILE, now, read_record, write_record

def trial_config(params: dict, base: dict) -> Config:
    """The Config of one trial: the search's base config (a dict) with the trial's dotted parameters."""
    return from_dict(set_values(base, params))


def _report_checkpoint(trainer, record: dict, report: Callable, metrics: dict, Checkpoint) -> None:
    """Write checkpoint.pt + record.json into a temporary folder and report it with the metrics."""
    with tempfile.TemporaryDirectory(prefix="augtune-ckpt-") as tmp:
        trainer.save_checkpoint(Path(tmp) / CHECKPOINT_FILE)
        write_record(Path(tmp), record)
        report(metrics, checkpoint=Checkpoint.from_directory(tmp))


def _tune_metrics(metrics: dict) -> dict:
    return {k: v for k, v in metrics.items() if isinstance(v, (int, float))}


def run_loop(cfg: Config, *, rank: int, world_size: int, get_checkpoint: Callable, report: Callable,
             Checkpoint, trial_dir: str | None = None) -> None:
    """The loop under Ray: resume from the reported checkpoint, report every epoch (rank 0).

    With `trial_dir` (the in-trial path, where this process owns the trial folder), the record is
    also kept up to date there, including a NaN failure's reason.
    """
    import ray

    from augtune.data import load_dataset
    from augtune.trainables.loop import NonFiniteLoss, Trainer
    from augtune.trainables.run import start_record

    data = load_dataset(cfg.dataset)
    trainer = Trainer(cfg, data, rank=rank, world_size=world_size, log=lambda s: None)
    record = start_record(cfg)
    ckpt = get_checkpoint()
    if ckpt is not None:
        with ckpt.as_directory() as d:
            trainer.load_checkpoint(Path(d) / CHECKPOINT_FILE)
            if (Path(d) / RECORD_FILE).exists():
                record = read_record(Path(d))
    # Where each (re)start of the trial ran: Ray node ids, for provenance and fault analysis.
    record.setdefault("nodes", []).append(ray.get_runtime_context().get_node_id())

    def on_epoch_end(tr, metrics: dict, _ckpt) -> None:
        record["epochs"] = list(tr.history)
        record["references"] = tr.references
        if tr.epoch == cfg.train.epochs:
            record.update(status="completed", final={k: metrics[k] for k in _final_keys(metrics)},
                          finished=now())
            if trial_dir:  # the in-trial path owns its folder; a DDP worker has none to draw into
                end_of_run_figures(tr, Path(trial_dir), record, log=print)
        if trial_dir:  # before the report: a scheduler may stop the trial right there
            write_record(Path(trial_dir), record)
        every = cfg.train.checkpoint_every
        wants_ckpt = tr.epoch == cfg.train.epochs or (every and tr.epoch % every == 0)
        if rank == 0 and wants_ckpt:
            _report_checkpoint(tr, record, report, _tune_metrics(metrics), Checkpoint)
        else:
            report(_tune_metrics(metrics) if rank == 0 else {})

    try:
        trainer.fit(None, on_epoch_end)
    except NonFiniteLoss as e:
        record.update(status="failed", error=str(e), finished=now(), epochs=list(trainer.history))
        if trial_dir:
            write_record(Path(trial_dir), record)
        raise


_FINAL_SKIP = {"epoch", "phase", "loss", "epoch_time_s", "samples_per_s"}


def _final_keys(metrics: dict) -> list[str]:
    return [k for k in metrics if k not in _FINAL_SKIP and not k.startswith("loss_")]


def tune_trial(params: dict, base: dict) -> None:
    """The Tune function trainable of every augtune trial (see the module docstring).

    `params`: the trial's sampled {dotted key: value}; `base`: the search's resolved config as a
    dict (bound with `tune.with_parameters`, so it is not part of every result row).
    """
    params = params.get("_repeat", params)  # repeat-best trials carry their whole parameter set
    cfg = trial_config(params, base)
    r = cfg.resources
    if r.num_workers == 1 and not r.use_gpu:
        return _in_trial(cfg)
    return _train_driver(cfg)


def _in_trial(cfg: Config) -> None:
    import ray.tune

    if cfg.train.num_threads is None:  # as many threads as CPUs the trial holds: no oversubscription
        import torch

        torch.set_num_threads(max(1, int(cfg.resources.cpus_per_worker)))
    run_loop(cfg, rank=0, world_size=1, get_checkpoint=ray.tune.get_checkpoint, report=ray.tune.report,
             Checkpoint=ray.tune.Checkpoint, trial_dir=ray.tune.get_context().get_trial_dir())


def _fail_record(cfg: Config, trial_dir: str, error: str) -> None:
    from augtune.trainables.run import start_record

    record = start_record(cfg)
    record.update(status="failed", error=error, finished=now())
    write_record(Path(trial_dir), record)


def _train_worker(config: dict) -> None:
    """Per-worker entry point of the TorchTrainer (Ray Train V2)."""
    import ray.train

    cfg = from_dict(config["cfg"])
    ctx = ray.train.get_context()
    if cfg.train.num_threads is None:
        import torch

        torch.set_num_threads(max(1, int(cfg.resources.cpus_per_worker)))
    run_loop(cfg, rank=ctx.get_world_rank(), world_size=ctx.get_world_size(),
             get_checkpoint=ray.train.get_checkpoint, report=ray.train.report, Checkpoint=ray.train.Checkpoint)


def _train_driver(cfg: Config) -> None:
    import ray.train
    import ray.tune
    from ray.train.torch import TorchTrainer
    from ray.tune.integration.ray_train import TuneReportCallback

    ctx = ray.tune.get_context()
    r = cfg.resources
    per_worker = {"CPU": r.cpus_per_worker}
    if r.use_gpu:
        per_worker["GPU"] = r.gpus_per_worker or 1.0
    trainer = TorchTrainer(
        _train_worker,
        train_loop_config={"cfg": to_dict(cfg)},
        scaling_config=ray.train.ScalingConfig(num_workers=r.num_workers, use_gpu=r.use_gpu,
                                               resources_per_worker=per_worker),
        run_config=ray.train.RunConfig(
            # A stable name and storage path (the trial's) is what lets a restarted trial resume.
            name=f"train-{ctx.get_trial_id()}",
            storage_path=str(Path(ctx.get_trial_dir()).resolve()),
            callbacks=[TuneReportCallback()],
            failure_config=ray.train.FailureConfig(max_failures=cfg.search.max_failures),
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=2),
        ),
    )
    try:
        result = trainer.fit()
    except Exception as e:  # the worker's error, with its reason, marks the trial errored
        _fail_record(cfg, ctx.get_trial_dir(), f"{type(e).__name__}: {e}".splitlines()[0])
        raise
    if result.checkpoint is not None:
        with result.checkpoint.as_directory() as d:
            write_record(Path(ctx.get_trial_dir()), read_record(Path(d)))
