"""What a killed driver leaves behind, made whole before Tune restores an experiment.

Tune writes its files into a staging folder of the driver's Ray session
(`<ray tmp>/session_*/artifacts/<stamp>/<experiment>/driver_artifacts`: its state, the searcher's, and
each trial's `result.json`, `progress.csv`, event files) and copies that folder to the experiment's
storage every few seconds, file by file, truncating each file it replaces. A driver killed during a copy
leaves storage torn: an empty `result.json` of a finished trial, a searcher state one snapshot older or
newer than the experiment state, a state file cut short (Tune then silently started the whole search
again). Restoring from storage as it is then loses or repeats work.

`prepare_restore` runs before every `Tuner.restore` (`augtune resume`, a compare's restart); its first
step, `finish_interrupted_copy`, reads and writes bytes only, so `launch.drive` runs it before the
signature check too (a copy a full disk cut short is unsigned; the staging copy was signed):

1. **The dead driver's last copy is finished** when its staging folder is still on this machine: every
   file storage lacks or holds cut short is taken from the staging copy, and Tune's state files as one
   snapshot (all of them, or none when one of the staged files is itself cut short). Files are replaced
   atomically where the storage allows (local folders; an object store writes whole objects).
2. **A state file cut short with no staging copy left** is refused in one line (resuming would start the
   search again). A `result.json` cut mid-line loses its partial last line (Tune appends to it).
3. **Checkpoints the state names but storage no longer holds are refilled** from the trial's newest
   complete one (`refill_lost_checkpoints`).

What no copy can settle, a searcher whose state disagrees with the experiment's trials, is reconciled by
the search algorithms themselves when Tune restores them (`augtune.search.searchers`), from the trial
list that `adapters.restored_trials` reads.
"""
from __future__ import annotations

import json
import os
import pickletools
import tempfile
from pathlib import Path
from typing import Optional

from augtune.config import ConfigError
from augtune.search.storage import is_uri

# Tune's own state files in an experiment folder: it restores from the newest of each kind (by name)
TUNE_STATE = ("experiment_state-*.json", "basic-variant-state-*.json", "search_gen_state-*.json",
              "searcher-state-*.pkl",
              "entrants-search-state-*.pkl",  # augtune.search.multiplex
              "search-then-repeat-state-*.pkl")  # augtune.search.repeat
EXPERIMENT_STATE = "experiment_state-"
RESULT_FILE = "result.json"  # Tune's per-trial result log, one JSON object per line, appended to


def prepare_restore(experiment: str) -> list[str]:
    """Make the experiment at `experiment` (a folder or a URI) whole for `Tuner.restore`; the paths
    written. `check_trusted` comes first: this reads Tune's state, which holds pickled objects."""
    written = finish_interrupted_copy(experiment)
    written += refuse_torn_state(experiment)
    written += trim_torn_results(experiment)
    written += refill_lost_checkpoints(experiment)
    return written


# -- 1. the dead driver's staging copy --------------------------------------------------------------------

def staging_folder(experiment: str) -> Optional[Path]:
    """The newest staging folder on this machine of the Tune runs of `experiment`, or None.

    Staging folders are named by the experiment's folder name only, which other experiments share
    (every compare's `search`): one is taken only when its trial folders are the experiment's (trial
    folder names carry a random id of their run). The newest is the one with the newest state file."""
    from augtune.search.storage import names, split

    ray_tmp = Path(os.environ.get("RAY_TMPDIR") or tempfile.gettempdir()) / "ray"
    stored = set(names(experiment))
    if not stored:
        return None
    _, name = split(experiment)
    best, best_key = None, None
    for folder in ray_tmp.glob(f"session_*/artifacts/*/{name}/driver_artifacts"):
        try:
            entries = list(folder.iterdir())
        except OSError:
            continue
        if not stored & {p.name for p in entries if p.is_dir()}:
            continue
        states = sorted(p for p in entries if p.name.startswith(EXPERIMENT_STATE))
        if not states:
            continue
        key = (states[-1].name, states[-1].stat().st_mtime)
        if best_key is None or key > best_key:
            best, best_key = folder, key
    return best


def finish_interrupted_copy(experiment: str) -> list[str]:
    """Finish the copy from the dead driver's staging folder to storage; the storage paths written.

    A file is taken when storage lacks it or holds a strict prefix of it (a copy cut short); `result.json`
    without its partial last line (the driver may have been killed mid-line). Tune's state files are one
    snapshot: taken together when the staged ones are all complete, signed by this user's augtune and at
    least as new as storage's newest, else none of them. Unsigned, they are a save the driver was killed
    in (Tune writes its state, then augtune signs it): the folder's last copy, signed, is the snapshot to
    resume from (Tune copies only after the signature: `adapters.hold_copies_while_saving`)."""
    from augtune.search.storage import names, read_bytes, write_bytes

    staged = staging_folder(experiment)
    if staged is None:
        return []
    written: list[str] = []
    state, other = [], []
    for path in sorted(p for p in staged.rglob("*") if p.is_file()):
        rel = path.relative_to(staged).as_posix()
        if any(part.startswith((".", "tmp-")) for part in rel.split("/")):  # temporary files
            continue
        (state if "/" not in rel and _is_state(rel) else other).append((rel, path))
    stored_states = sorted(n for n in names(experiment) if n.startswith(EXPERIMENT_STATE))
    staged_states = sorted(rel for rel, _ in state if rel.startswith(EXPERIMENT_STATE))
    newer = staged_states and (not stored_states or staged_states[-1] >= stored_states[-1])
    if newer and all(_complete(p) for _, p in state) and _signed(staged):
        for rel, path in state:
            data = path.read_bytes()
            if read_bytes(experiment, rel) != data:
                written.append(write_bytes(experiment, rel, data))
    for rel, path in other:
        data = path.read_bytes()
        if rel.endswith(RESULT_FILE):
            data = _whole_lines(data)
        now = read_bytes(experiment, rel)
        if now is None or (len(now) < len(data) and data.startswith(now)):
            written.append(write_bytes(experiment, rel, data))
    return written


def _signed(staged: Path) -> bool:
    """Whether this user's augtune signed the state files staged in `staged` (read, never unpickled)."""
    from augtune.search.trust import Untrusted, verify

    try:
        verify(str(staged))
    except Untrusted:
        return False
    return True


def _is_state(name: str) -> bool:
    return any(name.startswith(p.split("*")[0]) and name.endswith(p.split("*")[1]) for p in TUNE_STATE)


def _complete(path: Path) -> bool:
    """Whether a state file is whole: JSON that parses (experiment state), or a pickle whose opcodes run
    to its STOP (searcher states; read without unpickling anything)."""
    try:
        data = path.read_bytes()
        if path.name.startswith(EXPERIMENT_STATE):
            json.loads(data)
        else:
            ops = list(pickletools.genops(data))
            if not ops or ops[-1][0].name != "STOP":
                return False
        return True
    except Exception:  # cut short, empty, or not what its name says
        return False


def _whole_lines(data: bytes) -> bytes:
    return data if not data or data.endswith(b"\n") else data[: data.rfind(b"\n") + 1]


# -- 2. what no copy can mend ---------------------------------------------------------------------------

def refuse_torn_state(experiment: str) -> list[str]:
    """Refuse (one line) when the newest state file of a kind is cut short: Tune, unable to load it,
    would start the whole search again. Local folders only: an object store writes whole objects."""
    if is_uri(experiment):
        return []
    folder = Path(experiment)
    for pattern in TUNE_STATE:
        files = sorted(folder.glob(pattern))
        if files and not _complete(files[-1]):
            raise ConfigError(f"{files[-1]}: Tune's state file is truncated (its driver was killed while "
                              "Tune copied it) and no intact copy is left on this machine; resuming would "
                              "start the search again: move the folder aside and start a new search")
    return []


def trim_torn_results(experiment: str) -> list[str]:
    """Cut a trial's `result.json` back to its last whole line: Tune appends the resumed trial's results
    to it, and a partial line in the middle would make the whole log unreadable."""
    from augtune.search.storage import names, read_bytes, write_bytes

    written = []
    for name in names(experiment):
        data = read_bytes(experiment, f"{name}/{RESULT_FILE}")
        if data and not data.endswith(b"\n"):
            written.append(write_bytes(experiment, f"{name}/{RESULT_FILE}", _whole_lines(data)))
    return written


# -- 3. checkpoints -------------------------------------------------------------------------------------

def _newest_state(experiment: str) -> Optional[str]:
    from augtune.search.storage import names, read_text

    states = sorted(n for n in names(experiment) if n.startswith(EXPERIMENT_STATE) and n.endswith(".json"))
    return read_text(experiment, states[-1]) if states else None


def refill_lost_checkpoints(experiment: str) -> list[str]:
    """Put back the checkpoints a killed driver's last saved state names but storage no longer holds whole.

    Tune deletes a trial's older checkpoints as soon as it registers a newer one (`keep_checkpoints`) and
    saves its experiment state afterwards, uploading it in the background: a driver killed in between
    leaves a state that names a deleted checkpoint, and every restore attempt of that trial then fails
    ("does not exist on storage anymore"); killed while an object store deleted it file by file, it names
    a folder that still holds its record but no model (every restore failed: "not a readable checkpoint").
    Only older checkpoints are ever deleted, so the trial's complete checkpoints (model and record) left
    are newer than the one named; one of them is copied to the named path and the trial continues from
    there: the newest whose epoch the trial's result log already holds. A newer one is on storage because
    the trial uploads it before the driver sees its report: continuing from it would leave that epoch out
    of the log for good, where continuing from an older one reports the epochs after it again (Tune appends
    them). With none in the log (its copy lags), the oldest, which leaves the smallest gap.
    Returns the paths refilled. `check_trusted` comes first: Tune's state holds pickled objects, which
    this unpickles as Tune's own restore does."""
    import pyarrow.fs
    from ray.tune.utils.serialization import TuneFunctionDecoder

    text = _newest_state(experiment)
    if not text:
        return []
    refilled = []
    for _, metadata in json.loads(text).get("trial_data", []):
        manager = json.loads(metadata, cls=TuneFunctionDecoder, allow_cloudpickle=True).get(
            "checkpoint_manager"
        )
        for result in getattr(manager, "_checkpoint_results", []):
            fs, path = result.checkpoint.filesystem, result.checkpoint.path
            if _checkpoint_epoch(fs, path) is not None:
                continue
            parent, name = path.rstrip("/").rsplit("/", 1)
            newer = []  # (epoch, folder) of each complete checkpoint after the named one
            for info in fs.get_file_info(pyarrow.fs.FileSelector(parent)):
                if info.type == pyarrow.fs.FileType.Directory and info.base_name.startswith("checkpoint_") \
                        and info.base_name > name:
                    epoch = _checkpoint_epoch(fs, info.path)
                    if epoch is not None:
                        newer.append((epoch, info.path))
            if not newer:
                continue
            logged = _logged_epoch(fs, f"{parent}/{RESULT_FILE}")
            _, source = max((c for c in newer if c[0] <= logged), default=min(newer))
            fs.create_dir(path, recursive=True)
            pyarrow.fs.copy_files(source, path, source_filesystem=fs, destination_filesystem=fs)
            refilled.append(path)
    return refilled


def _checkpoint_epoch(fs, folder: str) -> Optional[int]:
    """The epoch a checkpoint folder was saved after (its record's epochs), or None unless it is complete:
    model and record there (a kill can cut an upload or a delete short)."""
    import pyarrow.fs

    from augtune.records import CHECKPOINT_FILE, RECORD_FILE

    files = [fs.get_file_info(f"{folder}/{file}") for file in (CHECKPOINT_FILE, RECORD_FILE)]
    if not all(f.type == pyarrow.fs.FileType.File and f.size > 0 for f in files):
        return None
    try:
        with fs.open_input_stream(f"{folder}/{RECORD_FILE}") as f:
            return len(json.loads(f.read())["epochs"])
    except (ValueError, KeyError, TypeError):
        return None


def _logged_epoch(fs, path: str) -> int:
    """The last epoch in a trial's result log (0 when it has none; a line that is not a result is skipped)."""
    try:
        with fs.open_input_stream(path) as f:
            lines = _whole_lines(f.read()).splitlines()
    except OSError:  # FileNotFoundError among them
        return 0
    epochs = [0]
    for line in lines:
        try:
            epoch = json.loads(line).get("epoch")
        except (ValueError, AttributeError):
            continue
        if isinstance(epoch, int):
            epochs.append(epoch)
    return max(epochs)


# -- the trials Tune restores ---------------------------------------------------------------------------


def settle_lost_records(run_path: str, record_folders: list[str]) -> list[str]:
    """Mark `failed` the records still `running` of trials that Tune's saved state never held: a trial
    made and started after Tune last saved its state, when the driver was killed. Tune does not know
    them, so the resume makes their run again as a new trial, with a record of its own; the old record,
    left `running`, would keep every table of the experiment "unfinished" and count the run twice.
    Local folders only (an object store's records are settled by the trials that own them). The
    records marked, by path."""
    from augtune.records import read_record, write_record
    from augtune.search.adapters import restored_trials

    if is_uri(run_path):
        return []
    trials = restored_trials(run_path, repeats=True) or []
    held = {t.dir_name for t in trials if t.dir_name}
    if not held:  # a state that does not name its trials' folders: nothing can be told apart
        return []
    marked = []
    for folder in record_folders:
        for path in sorted(Path(folder).glob("*/record.json")):
            try:
                record = read_record(path)
            except (OSError, ValueError):
                continue
            if record.get("status") == "running" and path.parent.name not in held:
                record.update(status="failed", error="lost: the driver was killed before Tune saved this "
                              "trial; the resume ran it again as a new trial")
                write_record(path.parent, record)
                marked.append(str(path))
    return marked
