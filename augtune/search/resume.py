"""What a resume continues from: the records augtune wrote, read as data (imports neither Ray nor Optuna).

A resume never restores Tune's saved state (`tuner.pkl`, `experiment_state-*.json` and the searchers'
pickles are Tune's to write and nobody's to read): it reads each trial's `record.json` (written by the
trial itself after every epoch, straight to its folder), the newest complete checkpoint of each trial
that has not ended (model and record, loaded `weights_only`) and Optuna's journal (JSON lines), and
starts a new Tune run of the same experiment through Tune's public API (`tune_run.tune_run`):

- a trial whose record says it ended (`completed`, `stopped` by the scheduler) is what it is: its
  search's searcher counts it, the repeat chooses from it, and nothing runs it again;
- every other trial (running when the driver stopped, `interrupted`, `failed`) is made again with its
  parameters, first, as a trial of the same folder (`_resume`, `RESUME`: `adapters.trial_folder` names
  Tune's folder of it after it, so its record, its result log and its checkpoints carry on there), from
  its newest complete checkpoint (`--restart-errored`: a failed one from scratch);
- a searcher makes only the trials its search still lacks (`searchers.Continuing`): a variant generator
  replays its variants and skips each one a record holds; Optuna's study holds every trial asked, and
  its trials still RUNNING are settled here (`settle_study`): told the value of the record that ended,
  kept for the trial made again, failed when no record holds them (asked, never started);
- a repeat chooses again from the ended trials (its choosers are functions of them), and only runs no
  record holds are made (`repeat.SearchThenRepeat`);
- PBT: each trial made again keeps its clock (the epoch of its checkpoint: `multiplex.EntrantsScheduler`)
  and its lineage (its record); ASHA starts afresh, and a trial made again meets only the rungs ahead.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional

from augtune.records import (CANDIDATE, CHECKPOINT_FILE, ENTRANT, RECORD_FILE, REPEAT, RESUME, ROUND,
                             parse_json)
from augtune.storage import exists, names, read_bytes, read_tail, write_bytes

__all__ = ["RESUME", "Held", "Records", "read_records", "settle_study", "take"]
ENDED = ("completed", "stopped")
CHECKPOINT_PREFIX = "checkpoint_"
RESULT_FILE = "result.json"  # Tune's result log of a trial
TUNE_ID = re.compile(r"[A-Za-z_]+?_([0-9a-f]{5}_\d{5}|[0-9a-f]{8})(?:_|$)")  # `tune_trial_<id>_<tag>_<time>`
TRAIN_PREFIX = "train-"  # a DDP trial's Ray Train run, in its folder (it resumes from its own storage)


@dataclass(frozen=True)
class Held:
    """One trial of an experiment, as its record tells it."""

    name: str  # its folder's name: Tune's folder of the trial, and the folder of its record
    config: dict  # its Tune config, as its searcher or the repeat's chooser made it
    status: str  # the record's: completed, stopped, failed, interrupted, running
    metrics: dict = field(default_factory=dict)  # its last result as Tune had it (the last epoch's values)
    resume: dict = field(default_factory=dict)  # what `RESUME` carries when it is made again
    made: dict = field(default_factory=dict)  # the config its searcher made it with (a PBT trial's `config`
    # holds its values now, which PBT perturbed since)
    epochs: list = field(default_factory=list)  # an ended trial's record of every epoch (`complete_logs`)

    @property
    def ended(self) -> bool:
        return self.status in ENDED

    def again(self, restart_errored: bool = False) -> dict:
        """Its Tune config when made again: from its checkpoint, or from scratch (a failed trial with
        `restart_errored`), in its own folder."""
        resume = dict(self.resume)
        if restart_errored and self.status == "failed":
            resume.update(checkpoint=None, epoch=0, train=None)
        return {**self.config, RESUME: resume}


@dataclass(frozen=True)
class Records:
    """Every trial of an experiment's Tune run: each search's (by entrant; None: a search's own) and the
    repeat's."""

    search: dict = field(default_factory=dict)  # entrant -> [Held]
    repeats: list = field(default_factory=list)

    def trials(self) -> list[Held]:
        return [*(h for held in self.search.values() for h in held), *self.repeats]


# -- reading -------------------------------------------------------------------------------------------

def read_records(tune_run: str, searches: dict, repeats: Optional[str], compare: bool) -> Records:
    """The trials of the Tune run at `tune_run` (a folder or URI), from their records: each search's in
    `searches` (entrant -> the folder of its records; a search's own is None -> its folder) and the
    repeat's in `repeats`. `compare`: the trials carry their entrant in their config."""
    search = {entrant: [held_trial(tune_run, folder, name, record, entrant if compare else None)
                        for name, record in records_in(folder)]
              for entrant, folder in searches.items()}
    runs = [held_repeat(tune_run, repeats, name, record, compare) for name, record in records_in(repeats)] \
        if repeats else []
    return Records(search, runs)


def records_in(folder: str) -> list[tuple[str, dict]]:
    """(folder name, record) of every trial record directly under `folder`, by name. A record that cannot
    be read (records are written whole, so hardly ever) names no parameters to continue with: it is left
    out, and its search makes its trial anew."""
    out = []
    for name in names(folder):
        try:
            where = f"{name}/{RECORD_FILE}"
            record = parse_json(read_bytes(folder, where) or b"null", f"{folder}/{where}")
        except ValueError:  # cut short, nested past any record, not UTF-8
            continue
        if isinstance(record, dict):
            out.append((name, record))
    return out


def last_result(record: dict) -> dict:
    """A trial's last result as Tune had it: its last epoch's numbers."""
    epochs = record.get("epochs") or []
    return numbers(epochs[-1] if epochs and isinstance(epochs[-1], dict) else {})


def numbers(result: dict) -> dict:
    """The numbers of a result (an epoch's entry in a record), as Tune has them."""
    return {k: v for k, v in result.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def _held(tune_run: str, records: str, name: str, record: dict, config: dict, made: dict) -> Held:
    status = str(record.get("status") or "running")
    resume = {} if status in ENDED else checkpoint_of(tune_run, records, name, record.get("lineage"))
    epochs = [e for e in record.get("epochs") or [] if isinstance(e, dict)] if status in ENDED else []
    return Held(name, config, status, last_result(record), {"folder": name, **resume}, made, epochs)


def held_trial(tune_run: str, records: str, name: str, record: dict, entrant: Optional[str]) -> Held:
    """A search trial: its config is its parameters (searched and constant), with its entrant's name in
    a compare."""
    config = dict(record.get("params") or {})
    made = dict(record.get("variant") or config)
    if entrant is not None:
        config[ENTRANT] = made[ENTRANT] = entrant
    return _held(tune_run, records, name, record, config, made)


def held_repeat(tune_run: str, records: str, name: str, record: dict, compare: bool) -> Held:
    """A repeat run: its config as the repeat's chooser makes it (`{REPEAT: parameters}`, with its
    entrant in a compare and its candidate and round in a race)."""
    config: dict[str, Any] = {REPEAT: dict(record.get("params") or {})}
    if compare:
        config[ENTRANT] = record.get("entrant")
    for key, value in ((CANDIDATE, record.get("candidate")), (ROUND, record.get("round"))):
        if value is not None:
            config[key] = value
    return _held(tune_run, records, name, record, config, config)


# -- checkpoints ------------------------------------------------------------------------------------------

def checkpoint_of(tune_run: str, records: str, name: str, lineage: Optional[list] = None) -> dict:
    """Where a trial that did not end continues from: {"checkpoint": the checkpoint folder it continues
    from, or None, "epoch": its epoch, "index": the highest checkpoint number Tune gave it (the next
    continue after it), "train": its Ray Train run (a DDP trial, which resumes from Train's own storage)
    or None}. An in-process trial's checkpoints are in Tune's folder of it; a DDP trial's in its Train run,
    in the folder of its record.

    The checkpoint is its newest complete one of the run its record tells (`newest_checkpoint`). A PBT
    trial that copied another (`lineage`, its record's) after its last checkpoint has none of that run: it
    continues from the checkpoint it copied, while the donor's folder keeps it, else from its own newest
    (the copy is then undone, and PBT may make another)."""
    tune_folder = f"{tune_run.rstrip('/')}/{name}"
    inside = [n for n in names(tune_folder) if n.startswith(CHECKPOINT_PREFIX)]
    index = max((_index(n) for n in inside), default=-1)
    lineage = list(lineage or [])
    epoch, path = newest_checkpoint(tune_folder, inside, lineage)
    if path is None and lineage:
        epoch, path = copied_checkpoint(tune_run, name, lineage[-1]) or newest_checkpoint(tune_folder, inside)
    own = f"{records.rstrip('/')}/{name}"
    train = max((n for n in names(own) if n.startswith(TRAIN_PREFIX)), default=None)
    return {"checkpoint": path, "epoch": epoch, "index": index, "train": train}


def copied_checkpoint(tune_run: str, name: str, copied: Any) -> Optional[tuple[int, str]]:
    """(epoch, path) of the checkpoint trial `name` copied last (`copied`: its lineage's last entry) while
    the donor's folder still keeps it, else None."""
    if not isinstance(copied, dict) or copied.get("trial") != name:
        return None
    donor = f"{tune_run.rstrip('/')}/{copied.get('from')}"
    kept = sorted((f"{donor}/{n}" for n in names(donor) if n.startswith(CHECKPOINT_PREFIX)), reverse=True)
    source = next((c for c in kept if checkpoint_epoch(c) == copied.get("epoch")), None)
    return None if source is None else (int(copied["epoch"]), source)


def newest_checkpoint(folder: str, inside: list[str], lineage: Optional[list] = None) \
        -> tuple[int, Optional[str]]:
    """(epoch, path) of the checkpoint a trial continues from among the folders `inside` its Tune folder:
    the newest complete one (of the run whose copies were `lineage`, when given) whose epoch Tune's result
    log holds. A trial uploads its checkpoint before Tune logs its result, and Tune's copy of the log can
    lag: every epoch is then logged once (the ones after it are trained again). When the log holds none of
    them, the oldest, the smallest gap, which the trial's log gets from its record when it starts
    (`unlogged_results`); (0, None) when there is none."""
    complete = []
    for n in inside:
        record = checkpoint_record(f"{folder}/{n}")
        if record is not None and (lineage is None or list(record.get("lineage") or []) == lineage):
            complete.append((len(record["epochs"]), _index(n), f"{folder}/{n}"))
    logged = last_logged(read_bytes(folder, RESULT_FILE) or b"")  # Tune's result log of the trial
    oldest = min(complete, default=(0, -1, None))
    epoch, _, path = max((c for c in complete if c[0] <= logged), default=oldest)
    return epoch, path


def whole_lines(log: bytes) -> bytes:
    """Tune's result log (one JSON object per line) up to its last newline. Tune writes a result and then its
    newline: a kill can land between the two, and a line without its newline is left out even when it reads
    as JSON. What a resume continues from and what it carries over (`callbacks.ContinueResultLog`) agree."""
    return log[: log.rfind(b"\n") + 1]


def last_logged(log: bytes) -> int:
    """The last epoch a result log's whole lines hold (`whole_lines`); 0 when there is none."""
    epochs = [0]
    for line in whole_lines(log).splitlines():
        try:
            epoch = parse_json(line, RESULT_FILE).get("epoch")
        except (ValueError, AttributeError):
            continue
        if isinstance(epoch, int):
            epochs.append(epoch)
    return max(epochs)


def unlogged_results(log: bytes, resume: dict, trial_id: Optional[str]) -> bytes:
    """The result lines a trial's carried-over log (`log`) lacks up to the checkpoint it continues from
    (`resume`, its `RESUME`), one per epoch: the numbers the trial reported then, from the checkpoint's
    record, marked `from_record`. Tune keeps the newest checkpoints only, and its copy of the log can lag
    them by seconds of epochs: when it holds none of them (`newest_checkpoint`), the trial continues after
    epochs the log never got, and without these it would lack them for good."""
    record = checkpoint_record(resume["checkpoint"]) if resume.get("checkpoint") else None
    return missing_results(log, (record or {}).get("epochs", []), int(resume.get("epoch") or 0), trial_id)


def missing_results(log: bytes, epochs: list, until: int, trial_id: Optional[str]) -> bytes:
    """The result lines the whole lines of `log` lack up to epoch `until`, one per epoch of `epochs` (a
    record's), marked `from_record`."""
    logged = last_logged(log)
    lines = []
    for entry in epochs:
        epoch = entry.get("epoch") if isinstance(entry, dict) else None
        if isinstance(epoch, int) and logged < epoch <= until:
            lines.append(json.dumps({**numbers(entry), **({"trial_id": trial_id} if trial_id else {}),
                                     "from_record": True}) + "\n")
    return "".join(lines).encode()


def complete_logs(tune_run: str, held: Iterable[Held]) -> None:
    """Tune's result log of every trial that ended, made whole from its record: Tune uploads its copy of
    the log again and again while it runs, and a kill in the middle of an upload can leave a finished
    trial's log cut short (even empty), which no later run writes again."""
    for h in held:
        folder = f"{tune_run.rstrip('/')}/{h.name}"
        if not h.ended or not h.epochs or not exists(folder):
            continue
        log = whole_lines(read_bytes(folder, RESULT_FILE) or b"")
        until = max((e["epoch"] for e in h.epochs if isinstance(e.get("epoch"), int)), default=0)
        missing = missing_results(log, h.epochs, until, tune_id(h.name))
        if missing:
            write_bytes(folder, RESULT_FILE, log + missing)


def tune_id(folder: str) -> Optional[str]:
    """Tune's id of a trial, which begins the name of its folder (`tune_trial_<id>_<tag>_<time>`)."""
    found = TUNE_ID.match(folder)
    return found.group(1) if found else None


def _index(name: str) -> int:
    try:
        return int(name[len(CHECKPOINT_PREFIX):])
    except ValueError:
        return -1


# the signature of a zip archive's end record, the last 22 bytes of one without a comment: torch.save's
ZIP_END = b"PK\x05\x06"


def checkpoint_record(folder: str) -> Optional[dict]:
    """The record a checkpoint folder holds, or None unless it is complete: model and record both there and
    both whole. A kill or a full disk can cut an upload or a delete short, after the record was copied and
    before the model was: a model cut short lacks the end record that `torch.save`'s zip archive ends
    with, and would fail to load in the trial continued from it."""
    data = read_bytes(folder, RECORD_FILE)
    if not data or (read_tail(folder, CHECKPOINT_FILE, 22) or b"")[:4] != ZIP_END:
        return None
    try:
        record = parse_json(data, f"{folder}/{RECORD_FILE}")
    except ValueError:
        return None
    return record if isinstance(record, dict) and isinstance(record.get("epochs"), list) else None


def checkpoint_epoch(folder: str) -> Optional[int]:
    """The epochs a checkpoint folder holds (its record's), or None unless it is complete."""
    record = checkpoint_record(folder)
    return None if record is None else len(record["epochs"])


# -- Optuna's study ------------------------------------------------------------------------------------------

def settle_study(study, held: Iterable[Held], metric: str) -> dict[str, int]:
    """Settle the trials Optuna's `study` (`optuna.load_study` of the search's journal) still has RUNNING:
    one whose parameters a record that ended holds is told that record's value (or pruned, with none); one
    a trial made again holds stays running, and is told when that trial ends; any other was asked and never
    ran (the driver stopped first), and fails, as Optuna advises for trials left running. The trials made
    again: their folder name -> the study's trial number."""
    from optuna.trial import TrialState

    ended = [h for h in held if h.ended]
    again = [h for h in held if not h.ended]
    numbers: dict[str, int] = {}
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        match = next((h for h in ended if _same(trial.params, h.config)), None)
        if match is not None:
            ended.remove(match)
            value = match.metrics.get(metric)
            if isinstance(value, (int, float)) and math.isfinite(value):
                study.tell(trial.number, value, skip_if_finished=True)
            else:
                study.tell(trial.number, state=TrialState.PRUNED, skip_if_finished=True)
            continue
        match = next((h for h in again if _same(trial.params, h.config)), None)
        if match is not None:
            again.remove(match)
            numbers[match.name] = trial.number
            continue
        study.tell(trial.number, state=TrialState.FAIL, skip_if_finished=True)
    return numbers


def _same(params: dict, config: dict) -> bool:
    """Whether a trial's searched `params` are those of `config` (Tune's config: searched and constant)."""
    return bool(params) and all(k in config and config[k] == v for k, v in params.items())


def take(held: list[dict], config: dict) -> bool:
    """Whether `config` (a variant a searcher made, its searched and constant parameters) is one of `held`
    (the configs of the trials the records hold): if so, that one is taken from the list (a grid repeated
    `num_samples` times holds each configuration as often)."""
    for i, params in enumerate(held):
        if all(params.get(k, _MISSING) == v for k, v in config.items() if not k.startswith("_")):
            del held[i]
            return True
    return False


_MISSING = object()
