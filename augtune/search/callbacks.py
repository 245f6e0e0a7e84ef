"""Tune callbacks of an augtune search (imports Ray: only `launch` loads it, lazily)."""
from __future__ import annotations

from pathlib import Path

from ray.tune import Callback

from augtune.records import now, read_record, write_record
from augtune.search.status import error_line


class SettleRecords(Callback):
    """Settles the record of a trial that Tune ended: a trial stopped early by the scheduler says
    `stopped` (not `running` forever), an errored one `failed` with Tune's reason. A record that
    already says how it ended (completed, or failed with the loop's own reason) is left alone."""

    def _settle(self, trial, status: str, error: str | None) -> None:
        path = Path(trial.local_path or "")
        try:
            record = read_record(path)
        except (OSError, ValueError):
            return
        if record["status"] == "running":
            record.update(status=status, error=error, finished=now())
            write_record(path, record)

    def on_trial_complete(self, iteration: int, trials: list, trial, **info) -> None:
        self._settle(trial, "stopped", None)

    def on_trial_error(self, iteration: int, trials: list, trial, **info) -> None:
        self._settle(trial, "failed", _reason(trial))


def _reason(trial) -> str:
    """The exception line of the trial's error file, or a generic reason."""
    line = error_line(Path(trial.error_file)) if trial.error_file else ""
    return line or "the trial errored (see its error.txt)"
