"""`augtune status EXP`: the trials of a search, read from Tune's state files without Ray.

Tune keeps `experiment_state-<time>.json` in the experiment folder: per trial a JSON document
(id, status, config, relative folder) and a runtime state (last result, failures, error file, and
`metric_analysis`: per metric its max, min, average and last reported value). This module reads
only those files, the trials' `error.txt` and augtune's `record.json`. The value shown for the search
metric is the one Tune selects on: the last one the trial reported (a trial that peaked early and
fell back is shown where it ended, not at its peak). A trial the scheduler stopped early is TERMINATED
to Tune; its record says `stopped`, and its row says so. An experiment kept in cloud storage
(`s3://...`) is read from a temporary copy of these files (`augtune.search.storage.local_copy`).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from augtune.records import ERROR_FILE, RECORD_FILE, REPEAT_DIR, read_search_file

STOPPED = "STOPPED"  # shown for a TERMINATED trial whose record says `stopped` (early, by the scheduler)


@dataclass(frozen=True)
class TrialStatus:
    trial_id: str
    status: str  # Tune's: PENDING, RUNNING, PAUSED, TERMINATED, ERROR
    epochs: int  # epochs finished, from the last result
    metric: Optional[float]  # the last reported value of the search metric (what Tune selects on)
    params: dict
    error: str  # first line of the reason, "" when none
    folder: str
    stopped: bool = False  # stopped early by the scheduler (its record says `stopped`)

    @property
    def shown_status(self) -> str:
        return STOPPED if self.stopped and self.status == "TERMINATED" else self.status


def _latest_state(exp_dir: Path) -> Path | None:
    files = sorted(exp_dir.glob("experiment_state-*.json"))
    return files[-1] if files else None


def last_value(run: dict, metric: str) -> Optional[float]:
    """The last value of `metric` the trial reported: Tune's `metric_analysis[metric]["last"]` (kept
    over every result, so a last result that skipped the metric still has it), else the last result's."""
    analysis = (run.get("metric_analysis") or {}).get(metric) or {}
    value = analysis.get("last", (run.get("last_result") or {}).get(metric))
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def error_line(path: Path) -> str:
    """The telling line of a Tune error file: the last one that reads "Type: message" ("" if none)."""
    if not path.is_file():
        return ""
    lines = [line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()]
    for line in reversed(lines):
        if ": " in line and not line.startswith("File "):
            return line[:200]
    return lines[-1][:200] if lines else ""


def _record(trial_dir: Path) -> dict:
    try:
        data = json.loads((trial_dir / RECORD_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _error(trial_dir: Path, record: dict) -> str:
    line = error_line(trial_dir / ERROR_FILE)
    if line:
        return line
    if record.get("status") == "failed":
        return str(record.get("error") or "")[:200]
    return ""


def _loads(value):
    return json.loads(value) if isinstance(value, str) else value


def read_trials(exp_dir: Path, metric: str) -> list[TrialStatus]:
    state_file = _latest_state(exp_dir)
    if state_file is None:
        return []
    state = json.loads(state_file.read_text())
    out = []
    for doc, runtime in state.get("trial_data", []):
        trial, run = _loads(doc) or {}, _loads(runtime) or {}
        folder = exp_dir / trial.get("relative_logdir", "")
        record = _record(folder)
        last = run.get("last_result") or {}
        params = trial.get("config") or {}
        if isinstance(params, dict) and "_repeat" in params:
            params = params["_repeat"]
        out.append(TrialStatus(
            trial_id=trial.get("trial_id", "?"), status=trial.get("status", "?"),
            epochs=int(last.get("epoch", 0) or 0), metric=last_value(run, metric),
            params=params if isinstance(params, dict) else {}, error=_error(folder, record),
            folder=folder.name, stopped=record.get("status") == "stopped"))
    return out


def _summary(trials: list[TrialStatus]) -> str:
    counts: dict[str, int] = {}
    for t in trials:
        counts[t.status] = counts.get(t.status, 0) + 1
    text = ", ".join(f"{n} {s.lower()}" for s, n in sorted(counts.items())) or "no trials yet"
    stopped = sum(t.stopped and t.status == "TERMINATED" for t in trials)
    return text + (f" ({stopped} stopped early by the scheduler)" if stopped else "")


def status_lines(exp_dir: Path, shown: str) -> list[str]:
    """The status of the local experiment folder `exp_dir`, naming it `shown` (its path or URI)."""
    plan = read_search_file(exp_dir)  # one line when missing, corrupt or foreign
    metric = plan["config"]["search"]["metric"]
    lines = []
    for title, folder, name in (("search", exp_dir, shown), ("repeat_best", exp_dir / REPEAT_DIR,
                                                              f"{shown.rstrip('/')}/{REPEAT_DIR}")):
        if not folder.is_dir():
            continue
        trials = read_trials(folder, metric)
        lines.append(f"{title} {name}: {_summary(trials)}")
        if not trials:
            continue
        lines.append(f"  {'trial':<14}{'status':<12}{'epochs':>7}  {'last ' + metric:>14}  params / error")
        for t in trials:
            value = f"{t.metric:.4f}" if t.metric is not None else "-"
            params = " ".join(f"{k}={v}" for k, v in t.params.items())
            tail = f"{params}  {t.error}".strip() if t.error else params
            lines.append(f"  {t.trial_id:<14}{t.shown_status:<12}{t.epochs:>7}  {value:>14}  {tail}")
    return lines


def format_status(location: str | Path) -> str:
    """`augtune status`: a local experiment folder, or a URI (s3://, gs://) read from a copy of its files."""
    from augtune.search.storage import is_uri, local_copy

    shown = str(location) if is_uri(location) else str(Path(location).expanduser().resolve())
    with local_copy(shown) as folder:
        try:
            return "\n".join(status_lines(Path(folder).resolve(), shown))
        except ValueError as e:  # a copy's message names the experiment, not the temporary folder
            raise ValueError(str(e).replace(str(Path(folder).resolve()), shown)) from None
