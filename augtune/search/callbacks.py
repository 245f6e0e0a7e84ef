"""Tune callbacks of an augtune search (imports Ray: only `launch` loads it, lazily)."""
from __future__ import annotations

import json
from pathlib import Path

from ray.tune import Callback

from augtune.records import ENTRANT, RECORD_FILE, REPEAT, RESUME, now, parse_json
from augtune.search.adapters import trial_folders
from augtune.search.resume import RESULT_FILE, unlogged_results, whole_lines
from augtune.storage import read_bytes, write_bytes


class StepStatuses(Callback):
    """Each trial's status as Tune's last step left it. After a stop signal (Ctrl-C), Tune's clean-up
    marks every running and pending trial TERMINATED before `fit` returns, so its results alone cannot
    tell an interrupted grid search (every trial created up front) from a finished one."""

    def __init__(self):
        self.statuses: dict[str, str] = {}

    def setup(self, **info):
        self.statuses = {}

    def on_step_end(self, iteration, trials, **info):
        self.statuses = {t.trial_id: t.status for t in trials}


class ContinueResultLog(Callback):
    """A trial a resume made again (`augtune.search.resume`) writes into its folder of the run before, whose
    result log (`result.json`) Tune would replace with this run's results: at its first start, the log so
    far (its whole lines), then the results of the epochs up to its checkpoint that the log lacks
    (`resume.unlogged_results`), go into Tune's local copy of the folder first, and Tune appends to it."""

    def __init__(self):
        self._started: set[str] = set()

    def on_trial_start(self, iteration: int, trials: list, trial, **info) -> None:
        if RESUME not in (trial.config or {}) or trial.trial_id in self._started:
            return
        self._started.add(trial.trial_id)
        fs, stored, local = trial_folders(trial)
        try:
            with fs.open_input_stream(f"{stored}/{RESULT_FILE}") as f:
                data = whole_lines(f.read())  # a line cut short by the kill is left out
        except (OSError, FileNotFoundError):
            data = b""
        data += unlogged_results(data, trial.config[RESUME], trial.trial_id)  # where Tune's copy lagged
        if not data:
            return
        local.mkdir(parents=True, exist_ok=True)
        with open(local / RESULT_FILE, "ab") as f:  # appended: Tune may have opened it already, empty
            f.write(data)


class SettleRecords(Callback):
    """Settles the record of a trial that Tune ended: a trial stopped early by the scheduler says
    `stopped` (not `running` forever), an errored one `failed` with Tune's reason. A record that
    already says how it ended (completed, or failed with the loop's own reason) is left alone.

    A trial's record is in the folder of its search, `folders[entrant]` (a search of its own is the
    entrant None: its Tune run), a repeat run's (`augtune.search.repeat`) in `repeats`, each in a folder
    named as Tune's folder of the trial; read and written through `storage` (a folder or a URI)."""

    def __init__(self, folders: dict, repeats: str):
        self.folders, self.repeats = folders, repeats

    def _settle(self, trial, status: str, error: str | None) -> None:
        config = getattr(trial, "config", None) or {}
        where = f"{(self.repeats if REPEAT in config else self.folders[config.get(ENTRANT)]).rstrip('/')}/" \
                f"{Path(trial.path).name}"
        try:
            record = parse_json(read_bytes(where, RECORD_FILE) or b"null", f"{where}/{RECORD_FILE}")
        except (OSError, ValueError):  # cut short, or a store out of reach: nothing to settle
            return
        if isinstance(record, dict) and record.get("status") == "running":
            record.update(status=status, error=error, finished=now())
            try:
                write_bytes(where, RECORD_FILE, json.dumps(record, indent=1).encode() + b"\n")
            except OSError:  # a full disk: the record stays `running`, and a resume makes the trial again
                pass

    def on_trial_complete(self, iteration: int, trials: list, trial, **info) -> None:
        self._settle(trial, "stopped", None)

    def on_trial_error(self, iteration: int, trials: list, trial, **info) -> None:
        self._settle(trial, "failed", _reason(trial))


def error_line(path: Path) -> str:
    """The telling line of a Tune error file: the last one that reads "Type: message" ("" if none)."""
    if not path.is_file():
        return ""
    lines = [line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()]
    for line in reversed(lines):
        if ": " in line and not line.startswith("File "):
            return line[:200]
    return lines[-1][:200] if lines else ""


def _reason(trial) -> str:
    """The exception line of the trial's error file, or a generic reason."""
    line = error_line(Path(trial.error_file)) if trial.error_file else ""
    return line or "the trial errored (see its error.txt)"
