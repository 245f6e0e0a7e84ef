"""`augtune status EXP_DIR`: the trials of a search, read from Tune's state files without Ray.

Tune keeps `experiment_state-<time>.json` in the experiment folder: per trial a JSON document
(id, status, config, relative folder) and a runtime state (last result, failures, error file).
This module reads only those files, the trials' `error.txt` and augtune's `record.json`.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from augtune.search.launch import REPEAT_DIR, SEARCH_FILE


@dataclass(frozen=True)
class TrialStatus:
    trial_id: str
    status: str  # PENDING, RUNNING, PAUSED, TERMINATED, ERROR
    epochs: int  # epochs finished, from the last result
    metric: Optional[float]  # best value of the search metric reported so far
    params: dict
    error: str  # first line of the reason, "" when none
    folder: str


def _latest_state(exp_dir: Path) -> Path | None:
    files = sorted(exp_dir.glob("experiment_state-*.json"))
    return files[-1] if files else None


def _best(trial_dir: Path, metric: str, mode: str) -> Optional[float]:
    """Best value of `metric` over the trial's results (progress.csv), or None."""
    import csv

    progress = trial_dir / "progress.csv"
    if not progress.is_file():
        return None
    values = []
    with progress.open(newline="") as f:
        for row in csv.DictReader(f):
            try:
                values.append(float(row.get(metric, "")))
            except ValueError:
                pass
    if not values:
        return None
    return max(values) if mode == "max" else min(values)


def error_line(path: Path) -> str:
    """The telling line of a Tune error file: the last one that reads "Type: message" ("" if none)."""
    if not path.is_file():
        return ""
    lines = [line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()]
    for line in reversed(lines):
        if ": " in line and not line.startswith("File "):
            return line[:200]
    return lines[-1][:200] if lines else ""


def _error(trial_dir: Path) -> str:
    line = error_line(trial_dir / "error.txt")
    if line:
        return line
    record = trial_dir / "record.json"
    if record.is_file():
        data = json.loads(record.read_text())
        if data.get("status") == "failed":
            return str(data.get("error") or "")[:200]
    return ""


def read_trials(exp_dir: Path, metric: str, mode: str) -> list[TrialStatus]:
    state_file = _latest_state(exp_dir)
    if state_file is None:
        return []
    state = json.loads(state_file.read_text())
    out = []
    for doc, runtime in state.get("trial_data", []):
        trial = json.loads(doc) if isinstance(doc, str) else doc
        run = json.loads(runtime) if isinstance(runtime, str) else runtime
        folder = exp_dir / trial.get("relative_logdir", "")
        last = (run or {}).get("last_result") or {}
        params = trial.get("config") or {}
        if isinstance(params, dict) and "_repeat" in params:
            params = params["_repeat"]
        out.append(TrialStatus(
            trial_id=trial.get("trial_id", "?"), status=trial.get("status", "?"),
            epochs=int(last.get("epoch", 0) or 0), metric=_best(folder, metric, mode),
            params=params if isinstance(params, dict) else {}, error=_error(folder), folder=folder.name))
    return out


def format_status(exp_dir: Path) -> str:
    exp_dir = Path(exp_dir).expanduser().resolve()
    if not (exp_dir / SEARCH_FILE).is_file():
        raise ValueError(f"{exp_dir}: not an augtune search folder (no {SEARCH_FILE})")
    import yaml

    plan = yaml.safe_load((exp_dir / SEARCH_FILE).read_text())
    search = plan["config"]["search"]
    metric, mode = search["metric"], search["mode"]
    lines = []
    for title, folder in (("search", exp_dir), ("repeat_best", exp_dir / REPEAT_DIR)):
        if not folder.is_dir():
            continue
        trials = read_trials(folder, metric, mode)
        counts: dict[str, int] = {}
        for t in trials:
            counts[t.status] = counts.get(t.status, 0) + 1
        summary = ", ".join(f"{n} {s.lower()}" for s, n in sorted(counts.items())) or "no trials yet"
        lines.append(f"{title} {folder}: {summary}")
        if not trials:
            continue
        header = f"  {'trial':<14}{'status':<12}{'epochs':>7}  {metric:>12}  params / error"
        lines.append(header)
        for t in trials:
            value = f"{t.metric:.4f}" if t.metric is not None else "-"
            params = " ".join(f"{k}={v}" for k, v in t.params.items())
            tail = f"{params}  {t.error}".strip() if t.error else params
            lines.append(f"  {t.trial_id:<14}{t.status:<12}{t.epochs:>7}  {value:>12}  {tail}")
    return "\n".join(lines)
