"""One run in-process: data, trainer, progress lines, the record and the resolved config on disk."""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

import yaml

from augtune.config import Config, method_label, to_dict
from augtune.plots import end_of_run_figures
from augtune.records import (CHECKPOINT_FILE, CONFIG_FILE, new_record, now, read_record,
                             write_record)
from augtune.trainables.loop import NonFiniteLoss, Trainer

_SHOWN = ("knn_acc", "sr_acc", "linear_acc", "kmeans_acc", "kmeans_nmi", "kmeans_ari")


def progress_line(metrics: dict, epochs: int) -> str:
    """`epoch  3/20  loss 4.1234  knn_acc 0.9123  1.8s (7095 samples/s)`"""
    parts = [f"epoch {metrics['epoch']:>{len(str(epochs))}}/{epochs}"]
    if metrics.get("phase"):
        parts.append(f"[{metrics['phase']}]")
    parts.append(f"loss {metrics['loss']:.4f}")
    parts += [f"{k} {metrics[k]:.4f}" for k in _SHOWN if k in metrics]
    parts.append(f"{metrics['epoch_time_s']:.1f}s ({metrics['samples_per_s']:.0f} samples/s)")
    return "  ".join(parts)


def start_record(cfg: Config) -> dict:
    """A new record for a run of `cfg` (status `running`)."""
    return new_record(to_dict(cfg), method=method_label(cfg), dataset=cfg.dataset.name, seed=cfg.train.seed)


def write_config(run_dir: Path, cfg: Config) -> None:
    (run_dir / CONFIG_FILE).write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))


def train_run(cfg: Config, data, run_dir: Path, *, resume: bool = False,
              log: Callable[[str], None] = print, stop_after: Optional[int] = None) -> dict:
    """Train `cfg` on `data` into `run_dir` and return the record (also written to disk).

    With `resume`, continues from `run_dir`'s checkpoint. A NaN/inf loss ends the run with the
    record's status `failed` and the reason; the exception is re-raised for the caller.
    """
    run_dir = Path(run_dir)
    trainer = Trainer(cfg, data, log=log)  # refuses a bad setup before anything is written
    run_dir.mkdir(parents=True, exist_ok=True)
    ckpt_path = run_dir / CHECKPOINT_FILE
    if resume and ckpt_path.exists():
        trainer.load_checkpoint(ckpt_path)
        record = read_record(run_dir)
        record.update(status="running", error=None, finished=None)
        log(f"resuming {run_dir} after epoch {trainer.epoch}")
    else:
        record = start_record(cfg)
        write_config(run_dir, cfg)
    write_record(run_dir, record)

    def on_epoch_end(tr: Trainer, metrics: dict, checkpoint) -> None:
        record["references"] = tr.references
        record["epochs"] = list(tr.history)
        write_record(run_dir, record)
        log(progress_line(metrics, cfg.train.epochs))

    try:
        final = trainer.fit(ckpt_path, on_epoch_end, stop_after=stop_after)
    except NonFiniteLoss as e:
        record.update(status="failed", error=str(e), finished=now(), epochs=list(trainer.history))
        write_record(run_dir, record)
        raise
    if trainer.epoch == cfg.train.epochs:
        record.update(status="completed", final=final, finished=now())
        end_of_run_figures(trainer, run_dir, record, log)
    write_record(run_dir, record)
    return record
