"""One run's life around the training loop: the record, the progress lines, the end-of-run hook.

Both runners use :class:`RunLife`: `train_run` (in-process, `augtune train`) and the Ray trial
(`augtune.trainables.ray_trainable`). So a run leaves the same record whichever way it ran: started
or resumed, one entry per epoch, then completed with its final metrics (written to disk before any
figure is drawn), failed with the reason, or interrupted.
"""
from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Callable, Optional

import yaml

from augtune.config import Config, flatten, from_dict, method_label, to_dict
from augtune.records import CHECKPOINT_FILE, CONFIG_FILE, RECORD_FILE, RunRecord, read_record, write_atomic
from augtune.trainables.loop import CheckpointError, NonFiniteLoss, Trainer

_SHOWN = ("knn_acc", "sr_acc", "linear_acc", "kmeans_acc", "kmeans_nmi", "kmeans_ari")

# Called once a run has completed and its record is on disk: (trainer, run folder, record dict, log).
# The CLI passes `augtune.plots.end_of_run_figures`; the trainables never import the plots.
OnCompleted = Callable[[Trainer, Path, dict, Callable[[str], None]], object]


def progress_line(metrics: dict, epochs: int) -> str:
    """`epoch  3/20  loss 4.1234  knn_acc 0.9123  1.8s (7095 samples/s)`"""
    parts = [f"epoch {metrics['epoch']:>{len(str(epochs))}}/{epochs}"]
    if metrics.get("phase"):
        parts.append(f"[{metrics['phase']}]")
    parts.append(f"loss {metrics['loss']:.4f}")
    parts += [f"{k} {metrics[k]:.4f}" for k in _SHOWN if k in metrics]
    parts.append(f"{metrics['epoch_time_s']:.1f}s ({metrics['samples_per_s']:.0f} samples/s)")
    return "  ".join(parts)


def final_table(record: dict) -> str:
    """The final metrics beside the reference rows (`raw`, `random-init`): what a run ends by printing
    (`augtune train`, `augtune.train`); "" when it has none."""
    final, refs = record.get("final") or {}, record.get("references") or {}
    if not final:
        return ""
    width = max(len(k) for k in final)
    lines = [f"{'metric':<{width}}  {'trained':>8}" + "".join(f"  {r:>11}" for r in refs)]
    for k, v in final.items():
        lines.append(f"{k:<{width}}  {v:>8.4f}"
                     + "".join(f"  {refs[r].get(k, float('nan')):>11.4f}" for r in refs))
    return "\n".join(lines)


def start_record(cfg: Config, data=None) -> RunRecord:
    """A new record for a run of `cfg` (status `running`): the same keys whichever runner runs it; a search
    adds what it knows of the trial (`params`, `phase`). With its `data`, the rows it trained and was
    scored on (`rows`: labelled train, held-out, unlabelled)."""
    record = RunRecord.start(
        to_dict(cfg), method=method_label(cfg), dataset=cfg.dataset.name, seed=cfg.train.seed
    )
    record.data.update(entrant=method_label(cfg), process=os.getpid())
    if data is not None:
        record.data["rows"] = {"train": len(data.y_train), "test": len(data.y_test),
                               "unlabeled": 0 if data.x_unlabeled is None else len(data.x_unlabeled)}
    return record


def write_config(run_dir: Path, cfg: Config) -> None:
    write_atomic(run_dir / CONFIG_FILE, yaml.safe_dump(to_dict(cfg), sort_keys=False))


class RunFolderError(ValueError):
    """A run folder that cannot take this run (one line naming the folder and what to do)."""


def check_new_run_folder(out: Path) -> None:
    """`out` can become a new run's folder: nothing of the user's is in it and it can be written."""
    out = Path(out)
    for part in out.parts:
        if len(os.fsencode(part)) > 255:
            raise RunFolderError(f"--out: the name {part[:40]}... is longer than 255 bytes")
    existing = out
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise RunFolderError(f"--out: {existing} is a file, not a folder")
    if existing == out:
        if (out / RECORD_FILE).exists():
            raise RunFolderError(f"--out: {out} already holds a run; pass --resume to continue it or choose "
                                 "another folder")
        if any(out.iterdir()):
            raise RunFolderError(f"--out: {out} holds other files and no augtune run; choose an empty or new "
                                 "folder (nothing in it is touched)")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise RunFolderError(f"--out: {existing} is not writable")


def check_resume(out: Path, cfg: Config) -> Optional[str]:
    """Whether `cfg` may continue the run in `out`; returns a note for the record when it raises the
    epochs (the one change a resume may make), None otherwise."""
    out = Path(out)
    if not (out / RECORD_FILE).is_file() or not (out / CONFIG_FILE).is_file():
        raise RunFolderError(f"--resume: {out} holds no augtune run (no {RECORD_FILE} and {CONFIG_FILE})")
    try:
        record = read_record(out)
        saved = from_dict(yaml.safe_load((out / CONFIG_FILE).read_text()))
    except Exception as e:
        raise RunFolderError(
            f"--resume: {out}'s record or config cannot be read ({type(e).__name__})"
        ) from None
    before, now = flatten(to_dict(saved)), flatten(to_dict(cfg))
    changed = [
        k for k in sorted(set(before) | set(now)) if before.get(k) != now.get(k) and k != "train.epochs"
    ]
    if changed:
        raise RunFolderError(f"--resume: the config differs from the run's own in {', '.join(changed[:5])}; "
                             f"a resumed run trains what its record says (only train.epochs may be raised)")
    if cfg.train.epochs < saved.train.epochs:
        raise RunFolderError(f"--resume: train.epochs {cfg.train.epochs} is below the run's "
                             f"{saved.train.epochs}; it can only be raised")
    done = len(record.get("epochs") or [])
    if record.get("status") == "completed" and cfg.train.epochs <= done:
        raise RunFolderError(f"--resume: {out} has completed all {done} epochs; raise train.epochs "
                             f"(--set train.epochs={done * 2}) to train on, or start a new run")
    if cfg.train.epochs != saved.train.epochs:
        return f"train.epochs raised from {saved.train.epochs} to {cfg.train.epochs} at epoch {done}"
    return None


def is_disk_full(e: OSError) -> bool:
    return e.errno in (errno.ENOSPC, errno.EDQUOT)


class RunLife:
    """Keeps a run's record in step with its trainer; `run_dir` None: this process owns no folder (a
    DDP worker), so the record is kept in memory only (it travels with the checkpoints). `published`
    runs after every write (a trial kept in cloud storage uploads its folder)."""

    def __init__(self, trainer: Trainer, record: RunRecord, run_dir: Optional[Path],
                 on_completed: Optional[OnCompleted] = None, log: Callable[[str], None] = print,
                 published: Optional[Callable[[], None]] = None):
        self.trainer, self.record, self.run_dir = trainer, record, run_dir
        self.on_completed, self.log, self.published = on_completed, log, published
        # of the run's earlier processes (a resumed run adds its own)
        self.before = {k: dict(record.data.get(k) or {}) for k in ("seconds", "cpu_seconds")}

    def write(self) -> None:
        # where the run's time went, wall and CPU, over every process that ran it (setup, train, eval, ...)
        for key, now in (("seconds", self.trainer.seconds), ("cpu_seconds", self.trainer.cpu_seconds)):
            before = self.before[key]
            self.record.data[key] = {
                k: round(before.get(k, 0.0) + now.get(k, 0.0), 3) for k in {**before, **now}
            }
        # this process's peak so far (a reused one: all its runs)
        self.record.data["max_rss_mb"] = _max_rss_mb()
        if self.run_dir is not None:
            self.record.write(self.run_dir)
            if self.published is not None:
                self.published()

    def epoch_done(self, metrics: dict) -> None:
        """After every epoch: the record follows the history; at the last epoch it completes."""
        tr = self.trainer
        self.record.epoch(tr.history, tr.references)
        if tr.epoch == tr.cfg.train.epochs:
            self.record.completed(tr.final)
            self.write()  # the final metrics are on disk before any figure is drawn
            if self.on_completed is not None and self.run_dir is not None:
                with tr.timed("figures"):  # the end-of-run figures: part of where the run's time went
                    self.on_completed(tr, self.run_dir, self.record.data, self.log)
        self.write()

    def fit(self, checkpoint_path: Optional[Path] = None, on_epoch: Optional[Callable] = None,
            stop_after: Optional[int] = None) -> RunRecord:
        """Train to the end (or `stop_after`); `on_epoch(trainer, metrics, checkpoint)` after each epoch's
        record is written. A NaN/inf loss or an interruption is recorded, then re-raised."""

        def after_epoch(tr: Trainer, metrics: dict, ckpt) -> None:
            self.epoch_done(metrics)
            if on_epoch is not None:
                on_epoch(tr, metrics, ckpt)

        try:
            self.trainer.fit(checkpoint_path, after_epoch, stop_after=stop_after)
        except NonFiniteLoss as e:
            self.record.failed(str(e), self.trainer.history)
            self.write()
            raise
        except KeyboardInterrupt:
            self.record.interrupted(self.trainer.history)
            self.write()
            raise
        return self.record


def check_checkpoint_epoch(trainer: Trainer, path: Path) -> None:
    """A loaded checkpoint's epoch must be one of this run's: 0..train.epochs, a history entry
    each. One that claims more (epoch 99 of 3) would "resume" a run that trains nothing and never
    completes."""
    epoch, epochs = trainer.epoch, trainer.cfg.train.epochs
    if type(epoch) is not int or not 0 <= epoch <= epochs:
        raise CheckpointError(f"{path}: claims epoch {str(epoch)[:20]} of a run of {epochs} "
                              f"(train.epochs); not a checkpoint of this run")
    if len(trainer.history) != epoch:
        raise CheckpointError(f"{path}: claims epoch {epoch} but holds the history of "
                              f"{len(trainer.history)}; not a checkpoint of this run")


def _max_rss_mb() -> Optional[float]:
    try:
        import resource
    except ImportError:  # not on Windows
        return None
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)  # Linux: KiB


def train_run(cfg: Config, data, run_dir: Path, *, resume: bool = False,
              log: Callable[[str], None] = print, stop_after: Optional[int] = None,
              on_completed: Optional[OnCompleted] = None) -> dict:
    """Train `cfg` on `data` into `run_dir` and return the record (also written to disk).

    With `resume`, continues from `run_dir`'s checkpoint. A NaN/inf loss ends the run with the
    record's status `failed` and the reason; the exception is re-raised for the caller.
    """
    from augtune.checks import check_against_data

    run_dir = Path(run_dir)
    check_against_data(cfg, data)  # eval.knn_k, the networks' size: before a network is built
    trainer = Trainer(cfg, data, log=log)  # refuses a bad setup before anything is written
    run_dir.mkdir(parents=True, exist_ok=True)
    ckpt_path = run_dir / CHECKPOINT_FILE
    if resume and ckpt_path.exists():
        trainer.load_checkpoint(ckpt_path)
        check_checkpoint_epoch(trainer, ckpt_path)
        record = RunRecord.read(run_dir).resumed()
        if cfg.train.epochs != record.data["config"]["train"]["epochs"]:  # the one change a resume may make
            record.data.setdefault("resumed_with", []).append(
                {"train.epochs": [record.data["config"]["train"]["epochs"], cfg.train.epochs],
                 "at_epoch": trainer.epoch})
            record.data["config"] = to_dict(cfg)
            write_config(run_dir, cfg)
        log(f"resuming {run_dir} after epoch {trainer.epoch}")
    else:  # a new run, or one stopped before its first checkpoint: from the start
        record = start_record(cfg, data)
        write_config(run_dir, cfg)
    life = RunLife(trainer, record, run_dir, on_completed, log)
    life.write()
    board = _tensorboard(run_dir)

    def on_epoch(tr: Trainer, metrics: dict, _ckpt) -> None:
        log(progress_line(metrics, cfg.train.epochs))
        if board is not None:  # the same scalars a search's trials log through Ray's TBX callback
            for k, v in metrics.items():
                if isinstance(v, (int, float)) and k != "epoch":
                    board.add_scalar(k, v, metrics["epoch"])
            board.flush()

    try:
        if trainer.epoch == cfg.train.epochs and record.status != "completed":
            # its last checkpoint was written, its completed record was not (it died in between)
            life.epoch_done(trainer.history[-1])
        life.fit(ckpt_path, on_epoch, stop_after=stop_after)
    finally:
        if board is not None:
            board.close()
    return record.data


def _tensorboard(run_dir: Path):
    """A TensorBoard event writer into the run folder (tensorboardX, which Ray brings), or None."""
    try:
        from tensorboardX import SummaryWriter
    except ImportError:
        return None
    return SummaryWriter(logdir=str(run_dir), flush_secs=30)
