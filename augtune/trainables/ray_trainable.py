"""Every method as a Ray trainable: one Tune trial runs the one training loop.

Two paths, with the same checkpoints, reports and records:

- ``resources.num_workers == 1`` on the CPU: the loop runs inside the Tune function trainable
  itself (no worker group: Ray's per-trial start-up is the expensive part on small machines);
  checkpoints go through ``ray.tune.report`` and come back from ``ray.tune.get_checkpoint``.
- otherwise: the Tune function is a *driver* that builds a Ray Train ``TorchTrainer`` (Train V2)
  with ``TuneReportCallback``; each worker runs the loop on its slice of every global batch,
  gradients are averaged over ranks (gloo on CPU, NCCL on GPU), rank 0 evaluates, reports and
  checkpoints; a restarted run continues from ``ray.train.get_checkpoint()``.

A checkpoint folder holds ``checkpoint.pt`` and the run's ``record.json`` so far; the trial's folder
of the experiment gets ``record.json`` itself (the one `augtune.analysis` reads), written there
directly (:class:`TrialFolder`), never through Tune's staging copy.
"""
from __future__ import annotations

import contextlib
import os
import posixpath
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from augtune import scratch
from augtune.config import Config, from_dict, method_label, set_values, to_dict, value_of
from augtune.records import (
    CANDIDATE, CHECKPOINT_FILE, ENTRANT, RECORD_FILE, REPEAT, RESUME, ROUND, RunRecord, is_uri,
    knob_schedule,
)

if TYPE_CHECKING:
    from augtune.trainables.run import OnCompleted


# a trial's default (train.checkpoint_every: None): a short epoch's checkpoint
SEARCH_CHECKPOINT_EVERY = "5min"
# can cost more than the epoch; a lost trial then restarts at most this much work earlier


# How long a trial in cloud storage waits for an object store it cannot reach, retrying, before the write
# fails the trial: an outage shorter than this pauses the trial instead of failing it (Tune's own retries,
# search.max_failures, follow at once and are spent within seconds of an outage).
STORE_PATIENCE_S = 300.0


def patiently(fn: Callable, what: str, patience_s: float | None = None, *, sleep: Callable = time.sleep,
              clock: Callable = time.monotonic, log: Callable[[str], None] = print):
    """`fn()`, called again after a growing pause (1, 2, 4, ... 30 s) while it raises OSError (pyarrow's
    error for an unreachable store) until `patience_s` (STORE_PATIENCE_S) have passed; then its error.
    For writes that can be repeated whole: an upload of a folder, a report with its checkpoint (a
    report that raised was not reported: Ray persists the checkpoint before it queues the result)."""
    patience = STORE_PATIENCE_S if patience_s is None else patience_s
    deadline, pause = clock() + patience, 1.0
    while True:
        try:
            return fn()
        except OSError as e:
            left = deadline - clock()
            if left <= 0:
                raise
            wait = min(pause, left)
            reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
            log(f"augtune: {what}: the store is unreachable ({reason}); trying again in {wait:.0f} s")
            sleep(wait)
            pause = min(2 * pause, 30.0)


def runs_in_process(cfg: Config) -> bool:
    """The one predicate: a one-worker CPU trial runs the loop inside the Tune trial itself."""
    r = cfg.resources
    return r.num_workers == 1 and not r.use_gpu


def trial_config(params: dict, base: dict) -> Config:
    """The Config of one trial: the search's base config (a dict) with the trial's dotted parameters."""
    return from_dict(set_values(base, params))


def _tune_metrics(metrics: dict) -> dict:
    return {k: v for k, v in metrics.items() if isinstance(v, (int, float))}


def run_loop(cfg: Config, *, rank: int, world_size: int, get_checkpoint: Callable, report: Callable,
             Checkpoint, folder: TrialFolder | None = None, on_completed: OnCompleted | None = None,
             about: dict | None = None) -> None:
    """The loop under Ray: resume from the reported checkpoint, report every epoch (rank 0).

    With `folder` (the in-trial path, where this process owns the trial's folder), the record is kept
    up to date there from the start, including a NaN failure's reason, and `on_completed` runs there.
    """
    import ray

    from augtune.data import load_dataset
    from augtune.trainables.loop import Trainer, checkpoint_due
    from augtune.trainables.run import RunLife, check_checkpoint_epoch, start_record

    started = _process_start_s()  # before this trial's own set-up
    start, cpu = time.perf_counter(), time.process_time()
    data = load_dataset(cfg.dataset)
    ckpt = get_checkpoint()
    trainer = Trainer(cfg, data, rank=rank, world_size=world_size, log=lambda s: None,
                      restoring=ckpt is not None)
    # data and model; and what the process spent before its first trial (CPU: see _process_start_s)
    trainer.seconds.update(setup=time.perf_counter() - start, start=started)
    trainer.cpu_seconds.update(setup=time.process_time() - cpu, start=started)
    record = start_record(cfg, data)
    record.data.update(about or {})  # what the search knows of this trial: its parameters, its phase
    remote = folder is not None and folder.uri is not None  # a trial in cloud storage: waits out outages
    copied = False  # a PBT exploit: another trial's checkpoint, continued here
    if ckpt is not None:
        with _checkpoint_folder(ckpt, remote) as d:
            trainer.load_checkpoint(Path(d) / CHECKPOINT_FILE)
            check_checkpoint_epoch(trainer, Path(d) / CHECKPOINT_FILE)  # not one of a longer run
            if (Path(d) / RECORD_FILE).exists():
                saved = RunRecord.read(Path(d))
                donor, me = saved.data.get("trial"), (about or {}).get("trial")
                if donor and me and donor != me:  # PBT's exploit: another trial's run, continued here
                    record, copied = exploited(saved, record, trainer.epoch, folder), True
                else:
                    record = saved
    done = finished_in_folder(folder, cfg) if trainer.epoch < cfg.train.epochs and not copied else None
    if done is not None:
        # The trial ended and its folder says so, but Tune's checkpoint of it is from before that (its driver
        # died, or the store was away, between the two): Tune gets the run's last result again, and
        # nothing is trained or written.
        report(_tune_metrics(done["epochs"][-1]))
        return
    finished = record.status == "completed" and trainer.epoch >= cfg.train.epochs
    if not finished:
        record.resumed()
    # Where each (re)start of the trial ran: Ray node ids, for provenance and fault analysis.
    record.data.setdefault("nodes", []).append(ray.get_runtime_context().get_node_id())
    life = RunLife(trainer, record, folder.local if folder else None, on_completed, log=print,
                   published=folder.publish if folder else None)
    # On disk at once: a trial restored from its last checkpoint trains no epoch, and its folder may hold
    # an older record than that checkpoint's (the driver died between the two).
    life.write()
    if finished:
        return
    last_ckpt = [time.monotonic()]

    def report_epoch(tr, metrics: dict, _ckpt) -> None:
        # the record is written before the report: a scheduler may stop the trial right there
        due = checkpoint_due(tr.epoch, cfg.train.epochs, cfg.train.checkpoint_every,
                             time.monotonic() - last_ckpt[0], default=SEARCH_CHECKPOINT_EVERY)
        if rank == 0 and due:
            last_ckpt[0] = time.monotonic()
            with scratch.temporary("ckpt-") as tmp:  # a trial Tune kills in `report` leaves it: swept
                tr.save_checkpoint(Path(tmp) / CHECKPOINT_FILE)
                record.write(Path(tmp))
                saved = Checkpoint.from_directory(tmp)
                if remote:
                    patiently(lambda: report(_tune_metrics(metrics), checkpoint=saved),
                              f"saving epoch {tr.epoch}'s checkpoint")
                else:
                    report(_tune_metrics(metrics), checkpoint=saved)
        else:
            report(_tune_metrics(metrics) if rank == 0 else {})

    life.fit(None, report_epoch)


def finished_in_folder(folder: TrialFolder | None, cfg: Config) -> dict | None:
    """The trial's own record in its folder when that says the run completed all its epochs (the record
    completes before the last report reaches Tune); None otherwise, or without a folder (a worker)."""
    if folder is None:
        return None
    data = folder.published_record()
    if not data or data.get("status") != "completed" or data.get("trial", folder.name) != folder.name:
        return None
    epochs = data.get("epochs") or []
    return data if len(epochs) == cfg.train.epochs else None


@contextlib.contextmanager
def _checkpoint_folder(ckpt, remote: bool):
    """The folder of a checkpoint to resume from; one in cloud storage is downloaded, patiently."""
    if not remote:
        with ckpt.as_directory() as d:
            yield d
        return
    with scratch.temporary("restore-") as tmp:
        yield patiently(lambda: ckpt.to_directory(tmp), "downloading the checkpoint to resume from")


def exploited(donor: RunRecord, own: RunRecord, epoch: int, folder: TrialFolder | None = None) -> RunRecord:
    """The record of a trial that PBT made continue `donor`'s run after `epoch` epochs: the donor's
    epochs (the run this trial now continues, each with the knob values it trained under), this
    trial's own config, parameters and identity (`own`: its fresh record), the lineage (the donor's,
    then this copy: {"epoch", "trial", "from"}) and the number of exploits this trial made (its
    folder's record counts the earlier ones). Time spent stays the trial's own: the donor's is its."""
    before = {}
    if folder is not None and (folder.local / RECORD_FILE).exists():
        try:
            before = RunRecord.read(folder.local).data
        except ValueError:
            before = {}
    data = dict(own.data)
    data.update(epochs=list(donor.data.get("epochs") or []), status="running", final={},
                references=dict(donor.data.get("references") or {}))
    copy = {"epoch": epoch, "trial": own.data.get("trial"), "from": donor.data.get("trial")}
    data["lineage"] = [*(donor.data.get("lineage") or []), copy]
    # a restart before the copy trained an epoch (Tune paused it again) loads the same checkpoint again
    again = (before.get("lineage") or [None])[-1] == copy
    data["exploits"] = int(before.get("exploits") or 0) + (0 if again else 1)
    # the values this run trained under, epoch by epoch, as the config's schedule (pooled apart from other
    # schedules; `augtune train` of the record's config replays it); then this trial's own from epoch + 1
    from augtune.trainables.loop import tracked_keys

    cfg = from_dict(data["config"])
    mine = {k: value_of(cfg, k) for k in tracked_keys(cfg)}
    if epoch < cfg.train.epochs:
        schedule = knob_schedule(data["epochs"], mine, until=epoch)
    else:  # the donor had finished when Tune saved it: the copy is its finished run, nothing left to train
        schedule = knob_schedule(data["epochs"])
        data.update(status=donor.status, final=dict(donor.final), finished=donor.data.get("finished"))
    data["config"] = {**data["config"], "schedule": schedule}
    for key in ("seconds", "cpu_seconds", "nodes", "variant"):  # the trial's own, not the donor's
        if before.get(key):
            data[key] = before[key]
    return RunRecord(data)


_TRIALS_IN_PROCESS = [0]


def _process_start_s() -> float:
    """CPU seconds this process spent before its first trial (its imports, Ray's worker start-up); 0 for a
    later trial of a reused process. CPU, not wall: Ray starts idle workers ahead of the trials they get."""
    _TRIALS_IN_PROCESS[0] += 1
    return 0.0 if _TRIALS_IN_PROCESS[0] > 1 else time.process_time()


def tune_trial(params: dict, bases: dict, experiments: dict, on_completed: OnCompleted | None = None, *,
               repeats: str | None = None, on_repeat_completed: OnCompleted | None = None,
               tune_run: str | None = None) -> None:
    """The Tune function trainable of every augtune trial (see the module docstring): a search is a Tune
    run of one entrant (None), a compare of one per method.

    `params`: the trial's sampled {dotted key: value}, or a repeat run's whole parameter set under
    `REPEAT`, with its entrant (`ENTRANT`, a compare's) and, for a trial a resume made again, where it
    continues from (`RESUME`); `bases[entrant]`: its search's resolved config as a dict;
    `experiments[entrant]`: the folder or URI where its search trials keep their records (each in a
    folder named as Tune names the trial), `repeats`: where the repeat runs keep theirs (the entrant's
    folder when not given); `on_completed`, `on_repeat_completed`: what runs in a completed search or
    repeat trial's folder (the CLI's end-of-run figures); `tune_run`: the Tune run's own folder, where Tune
    keeps the trials' checkpoints (the record names it when it is elsewhere, for `augtune plot`). A
    compare's entrant is the label its records keep (a search's, its method's label). All are bound with
    `tune.with_parameters`.
    """
    entrant = params.get(ENTRANT)
    base, experiment = bases[entrant], experiments[entrant]
    again = params.get(RESUME) or {}  # a trial a resume made again: where it continues from
    params = {k: v for k, v in params.items() if k not in (RESUME, ENTRANT)}
    repeat = REPEAT in params
    # a race's repeat run: its candidate and round, kept in its record (the race is rebuilt from these)
    race = {name: params[key] for name, key in (("candidate", CANDIDATE), ("round", ROUND)) if key in params}
    params = params[REPEAT] if repeat else params  # a repeat run carries its whole parameter set
    cfg = trial_config(repeat_params(params, base, racing=bool(race)) if repeat else params, base)
    about = {"params": dict(params), "variant": dict(params), "phase": "repeat" if repeat else "search",
             "entrant": entrant or method_label(cfg), "process": os.getpid(), **race}
    records = (repeats or experiment) if repeat else experiment
    folder = TrialFolder(records)
    about["trial"] = folder.name  # whose run a checkpoint holds (PBT copies checkpoints between trials)
    hook = on_repeat_completed if repeat else on_completed
    if runs_in_process(cfg):
        if tune_run is not None and tune_run.rstrip("/") != records.rstrip("/"):  # Tune keeps them elsewhere
            about["checkpoints"] = posixpath.relpath(f"{tune_run}/{folder.name}", f"{records}/{folder.name}")
        return _in_trial(cfg, folder, hook, about, again.get("checkpoint"))
    # Train keeps its checkpoints in the trial's folder, a resumed trial's in the Train run it had
    return _train_driver(cfg, folder, about, again.get("train"))


def repeat_params(params: dict, base: dict, racing: bool = False) -> dict:
    """What a repeat run trains with besides its parameters: it is scored on the test split (the search
    trials it repeats were scored on the validation split: `search.plan.selecting`) and, with a compare's
    `vary: [init, split]`, on the train/test split its own seed draws. A race's run (`racing`) is also
    scored on the validation split, which it then does not train on: the race chooses on that
    (`analysis.race.race_settings`), the verdict reports the test split. Its record keeps `params` alone,
    which name its configuration."""
    out = {**params, "dataset.evaluate_on": "both" if racing else "test"}
    if "split" in ((base.get("compare") or {}).get("vary") or ()):
        out.update({"dataset.resplit": True, "dataset.split_seed": params["train.seed"]})
    return out


def isolate_trial(cfg: Config) -> None:
    """Reset what one trial could leave behind for the next in a reused worker process: torch's thread
    count and default dtype, and every global random generator (the Trainer reseeds torch's own)."""
    import random

    import numpy as np
    import torch

    # as many threads as CPUs the trial holds: no oversubscription
    torch.set_num_threads(cfg.train.num_threads or max(1, int(cfg.resources.cpus_per_worker)))
    torch.set_default_dtype(torch.float32)
    torch.manual_seed(cfg.train.seed)
    random.seed(cfg.train.seed)
    np.random.seed(cfg.train.seed % 2**32)
    # numba's on-disk cache, for UMAP's kernels (`eval.clustering._umap` switches it on for umap-learn's
    # own): compiled once per machine, loaded by every later trial process that clusters
    from augtune.data.datasets import default_root

    os.environ.setdefault("NUMBA_CACHE_DIR", str(default_root().parent / "numba"))  # beside the data cache


class TrialFolder:
    """A trial's folder of the experiment, where its record and end-of-run figures go.

    Local storage: that folder itself, written (atomically) by the trial: the truth a resume reads
    (`augtune.search.resume`). Tune's own files reach the experiment from a staging folder by a periodic
    copy of the whole tree, which is not atomic and can lag. A URI (s3://, gs://): the files are written
    to a local folder and uploaded after every write (`publish`).
    """

    def __init__(self, experiment: str, name: str | None = None):
        if name is None:  # this trial's folder name, as Tune gave it
            import ray.tune

            name = Path(ray.tune.get_context().get_trial_dir()).name
        self.name = name
        if is_uri(experiment):
            self.uri: str | None = f"{experiment.rstrip('/')}/{self.name}"
            self.local = scratch.scratch_dir(f"{self.name[:40]}-")
        else:
            self.uri, self.local = None, Path(experiment) / self.name
            self.local.mkdir(parents=True, exist_ok=True)

    @property
    def target(self) -> str:
        """Where the folder is kept: the URI or the local path."""
        return self.uri or str(self.local)

    def publish(self) -> None:
        if self.uri is None:
            return
        from augtune.storage import split, upload

        parent, name = split(self.uri)
        patiently(lambda: upload(self.local, parent, name), f"uploading {self.uri}")

    def write_record(self, record: RunRecord) -> None:
        record.write(self.local)
        self.publish()

    def published_record(self) -> dict | None:
        """The record the folder holds now (a URI's: downloaded, patiently), or None."""
        if self.uri is None:
            try:
                return RunRecord.read(self.local).data if (self.local / RECORD_FILE).exists() else None
            except ValueError:
                return None
        import pyarrow.fs

        from augtune.records import parse_json

        fs, path = pyarrow.fs.FileSystem.from_uri(f"{self.uri}/{RECORD_FILE}")

        def read() -> dict | None:
            if fs.get_file_info(path).type == pyarrow.fs.FileType.NotFound:
                return None
            with fs.open_input_stream(path) as f:
                return parse_json(f.read(), f"{self.uri}/{RECORD_FILE}")

        try:
            return patiently(read, f"reading {self.uri}/{RECORD_FILE}")
        except ValueError:
            return None


def _in_trial(cfg: Config, folder: TrialFolder, on_completed: OnCompleted | None, about: dict,
              resume_from: str | None = None) -> None:
    """The loop in the Tune trial itself: from Tune's checkpoint of it, else (a trial a resume made again)
    from `resume_from`, the newest complete checkpoint of its run before."""
    import ray.tune

    def get_checkpoint():
        ckpt = ray.tune.get_checkpoint()
        if ckpt is None and resume_from:
            ckpt = ray.tune.Checkpoint(resume_from) if is_uri(resume_from) \
                else ray.tune.Checkpoint.from_directory(resume_from)
        return ckpt

    isolate_trial(cfg)
    run_loop(cfg, rank=0, world_size=1, get_checkpoint=get_checkpoint, report=ray.tune.report,
             Checkpoint=ray.tune.Checkpoint, folder=folder, on_completed=on_completed, about=about)


def _driver_record(cfg: Config, folder: TrialFolder, about: dict | None, error: str | None = None) -> None:
    """A DDP trial's record in its folder, written by its driver (its workers write theirs in their
    checkpoints): at its start, what the search knows of it (a resume reads its parameters there, and
    continues its Train run), unless the folder holds its record already; and failed, with the worker's
    reason."""
    from augtune.trainables.run import start_record

    if error is None and folder.published_record() is not None:
        return
    record = start_record(cfg)
    record.data.update(about or {})
    if error is not None:
        before = folder.published_record() or {}
        record.data.update({k: before[k] for k in ("epochs", "variant") if before.get(k)})
        record.failed(error)
    folder.write_record(record)


def _train_worker(config: dict) -> None:
    """Per-worker entry point of the TorchTrainer (Ray Train V2)."""
    import ray.train

    cfg = from_dict(config["cfg"])
    ctx = ray.train.get_context()
    isolate_trial(cfg)
    run_loop(
        cfg,
        rank=ctx.get_world_rank(),
        world_size=ctx.get_world_size(),
        get_checkpoint=ray.train.get_checkpoint,
        report=ray.train.report,
        Checkpoint=ray.train.Checkpoint,
        about=config.get("about"),
    )


def _train_driver(cfg: Config, folder: TrialFolder, about: dict | None = None,
                  run: str | None = None) -> None:
    """A DDP trial: a Ray Train run in the trial's folder (`run`: the one a resumed trial had, which Train
    continues from its own storage)."""
    import ray.train
    import ray.tune
    from ray.train.torch import TorchTrainer
    from ray.tune.integration.ray_train import TuneReportCallback

    ctx = ray.tune.get_context()
    r = cfg.resources
    per_worker = {"CPU": r.cpus_per_worker}
    if r.use_gpu:
        per_worker["GPU"] = r.gpus_per_worker or 1.0
    _driver_record(cfg, folder, about)
    trainer = TorchTrainer(
        _train_worker,
        train_loop_config={"cfg": to_dict(cfg), "about": about or {}},
        scaling_config=ray.train.ScalingConfig(num_workers=r.num_workers, use_gpu=r.use_gpu,
                                               resources_per_worker=per_worker),
        run_config=ray.train.RunConfig(
            # A stable name and storage path (the trial's folder) is what lets a restarted trial resume.
            name=run or f"train-{ctx.get_trial_id()}",
            storage_path=folder.target,
            callbacks=[TuneReportCallback()],
            failure_config=ray.train.FailureConfig(max_failures=cfg.search.max_failures),
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=cfg.search.keep_checkpoints),
        ),
    )
    try:
        result = trainer.fit()
    except Exception as e:  # the worker's error, with its reason, marks the trial errored
        _driver_record(cfg, folder, about, f"{type(e).__name__}: {e}".splitlines()[0])
        raise
    if result.checkpoint is not None:
        with result.checkpoint.as_directory() as d:
            folder.write_record(RunRecord.read(Path(d)))
