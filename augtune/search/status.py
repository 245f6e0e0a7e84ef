"""`augtune status`: an experiment's trials, a row each, from their records alone (imports neither torch nor
Ray, and reads nothing of Tune's).

A trial writes its `record.json` after every epoch, straight to its folder: a search's trials in the
search's folder, a compare's in their entrant's, the repeat runs in `repeat_best/` (a compare's `repeat/`:
`records.phase_folders`); the search settles it when Tune ends the trial (`callbacks.SettleRecords`). A row
shows the trial (Tune's id, which begins its folder's name), a compare trial's entrant, the record's status
(`completed`; `stopped` early by the scheduler; `failed`, with its reason; `running`), the epochs it
finished, the last value it reported of the search metric (the one Tune selects on: a trial that peaked
early and fell back is shown where it ended), a PBT trial's exploits and its parameters. A trial whose
record says `running` while no driver holds the experiment's lock (`.augtune.lock`: none, or one left by
a process that is gone) is `interrupted`, and the last line says how to continue it. A trial not yet
started has no record, and no row. An experiment in cloud storage (`s3://...`) is read from a temporary
copy of its records (`storage.local_copy`).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from augtune.config import ConfigError, safe_load
from augtune.records import (COMPARE_FILE, ENTRANT, RECORD_FILE, last_reported, phase_folders, read_record,
                             read_search_file, searched_schedule)
from augtune.search.experiment import holder_alive
from augtune.search.resume import tune_id
from augtune.storage import is_uri, local_copy

INTERRUPTED = "interrupted"  # a trial whose record says `running` when no driver runs its experiment
SAID = {"stopped": "stopped early by the scheduler"}  # a status as the summary says it


@dataclass(frozen=True)
class Row:
    trial: str  # Tune's id of the trial, from its folder's name (else the name)
    status: str  # the record's
    epochs: int  # finished
    value: Optional[float]  # the last value reported of the search metric
    params: dict
    error: str = ""
    entrant: str = ""
    exploits: Optional[int] = None  # a PBT trial's copies of others; None: not a PBT trial
    started: str = ""


def read_row(path: Path, metric: str, interrupted: bool) -> Row:
    """The row of the record at `path`; `interrupted`: no driver runs the experiment."""
    trial = tune_id(path.parent.name) or path.parent.name
    try:
        r = read_record(path)
    except (OSError, ValueError) as e:  # cut short, foreign: shown, not guessed
        return Row(trial, "unreadable", 0, None, {}, str(e).splitlines()[0][:200])
    status = str(r.get("status") or "running")
    status = INTERRUPTED if status == "running" and interrupted else status
    epochs = [e for e in r.get("epochs") or [] if isinstance(e, dict)]
    params = r["params"] if isinstance(r.get("params"), dict) else {}
    error = str(r.get("error") or "")[:200] if status == "failed" else ""
    return Row(trial, status, len(epochs), last_reported(r, metric), params, error,
               str(r.get("entrant") or r.get("method") or ""), exploits(r), str(r.get("started") or ""))


def exploits(record: dict) -> Optional[int]:
    """A PBT trial's copies of other trials (its record's `exploits`); None for another scheduler's."""
    if not searched_schedule(record.get("config")):
        return None
    return record["exploits"] if isinstance(record.get("exploits"), int) else 0


def _summary(rows: list[Row]) -> str:
    counts: dict[str, int] = {}
    for r in rows:
        counts[r.status] = counts.get(r.status, 0) + 1
    return ", ".join(f"{n} {SAID.get(s, s)}" for s, n in sorted(counts.items())) or "no trials yet"


def _section(title: str, rows: list[Row], metric: str, compare: bool) -> list[str]:
    lines = [f"{title}: {_summary(rows)}"]
    if not rows:
        return lines
    width = max([len(r.entrant) for r in rows] + [7]) + 2 if compare else 0
    who = f"{'entrant':<{width}}" if compare else ""
    lines.append(f"  {'trial':<16}{who}{'status':<13}{'epochs':>7}  {'last ' + metric:>14}  params / error")
    hidden = (ENTRANT, "method.base", "method.augment") if compare else ()
    for r in rows:
        value = f"{r.value:.4f}" if r.value is not None else "-"
        params = " ".join(f"{k}={v}" for k, v in r.params.items() if k not in hidden)
        if r.exploits is not None:
            params = f"[{r.exploits} exploit{'s' if r.exploits != 1 else ''}] {params}"
        tail = f"{params}  {r.error}".strip()
        who = f"{r.entrant:<{width}}" if compare else ""
        lines.append(f"  {r.trial:<16}{who}{r.status:<13}{r.epochs:>7}  {value:>14}  {tail}")
    return lines


def status_lines(exp_dir: Path, shown: str, local: bool = True) -> list[str]:
    """The status of the experiment folder `exp_dir`, naming it `shown` (its path or URI); an entrant's
    folder of a compare shows that entrant's trials; `local`: the folder is the experiment itself, whose
    lock tells whether a driver runs it."""
    only = None
    if (exp_dir.parent / COMPARE_FILE).is_file() and not (exp_dir / COMPARE_FILE).is_file():
        exp_dir, shown, only = exp_dir.parent, shown.rstrip("/").rsplit("/", 1)[0], exp_dir.name
    compare = (exp_dir / COMPARE_FILE).is_file()
    metric = compare_metric(exp_dir) if compare else read_search_file(exp_dir)["config"]["search"]["metric"]
    interrupted = local and holder_alive(exp_dir) is False
    base, lines, stopped = shown.rstrip("/"), [], False
    for phase, folders in phase_folders(exp_dir).items():
        rows = [read_row(path, metric, interrupted) for folder in folders
                for path in sorted(folder.glob(f"*/{RECORD_FILE}"))]
        rows = sorted((r for r in rows if only is None or r.entrant == only),
                      key=lambda r: (r.entrant, r.started, r.trial))
        stopped |= any(r.status == INTERRUPTED for r in rows)
        if phase == "search":
            lines += _section(f"search {base}", rows, metric, compare)
        elif rows:
            lines += _section(f"{folders[0].name} {base}/{folders[0].name}", rows, metric, compare)
    if stopped:
        lines.append(f"no search is running there: its {INTERRUPTED} trials stopped with it (Ctrl-C, a lost "
                     f"driver); continue them with: augtune resume {base}")
    return lines


def compare_metric(exp_dir: Path) -> str:
    """A compare's search metric: the first of its `compare.metrics`."""
    path = exp_dir / COMPARE_FILE
    try:
        data = safe_load(path.read_text(encoding="utf-8"), str(path))
        return str(((data.get("config") or {}).get("compare") or {}).get("metrics", ["knn_acc"])[0])
    except (ConfigError, OSError, UnicodeDecodeError, AttributeError, IndexError, TypeError) as e:
        raise ValueError(f"{path}: cannot be read ({str(e).splitlines()[0][:160]})") from None


def format_status(location: str | Path) -> str:
    """`augtune status`: a local experiment folder, or a URI (s3://, gs://) read from a copy of its files."""
    shown = str(location) if is_uri(location) else str(Path(location).expanduser().resolve())
    with local_copy(shown) as folder:
        try:
            return "\n".join(status_lines(Path(folder).resolve(), shown, local=not is_uri(location)))
        except ValueError as e:  # a copy's message names the experiment, not the temporary folder
            raise ValueError(str(e).replace(str(Path(folder).resolve()), shown)) from None
