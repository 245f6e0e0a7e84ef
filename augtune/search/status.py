"""`augtune status EXP`: the trials of a search, read from Tune's state files without Ray.

Tune keeps `experiment_state-<time>.json` in the experiment folder: per trial a JSON document
(id, status, config, relative folder) and a runtime state (last result, failures, error file, and
`metric_analysis`: per metric its max, min, average and last reported value); a resume is a new Tune
run of the experiment, with a state file of its own (`merged_states`). This module reads only those
files, as JSON (their pickled fields are never loaded), the trials' `error.txt` and augtune's
`record.json`. The value shown for the search
metric is the one Tune selects on: the last one the trial reported (a trial that peaked early and
fell back is shown where it ended, not at its peak). A trial the scheduler stopped early is TERMINATED
to Tune; its record says `stopped`, and its row says so. An experiment kept in cloud storage
(`s3://...`) is read from a temporary copy of these files (`augtune.search.storage.local_copy`).
A search's repeat runs (in the search's Tune run: `augtune.search.repeat`) are listed after its trials; a
compare experiment shows its search (every entrant's trials) and its repeat, with the entrant of each
trial.

Tune's state says RUNNING for the trials that ran when its driver stopped (Ctrl-C, a killed
process): a local experiment whose lock (`.augtune.lock`, held by the driver while it runs) is
absent, or was left by a process that is gone, has no driver, and those trials are shown
INTERRUPTED, with the command that continues them. A state file that cannot be read (cut short by a
full disk, say) is one line naming it, exit 2: a table guessed from a file that lost its end would
show trials as they were before, without a word.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional

from augtune.records import (COMPARE_FILE, COMPARE_REPEAT, COMPARE_SEARCH, ENTRANT, ERROR_FILE, RECORD_FILE,
                             REPEAT, REPEAT_DIR, RESUME, JSONFileError, read_json, read_search_file,
                             searched_schedule)
from augtune.search.experiment import holder_alive

STOPPED = "STOPPED"  # shown for a TERMINATED trial whose record says `stopped` (early, by the scheduler)
INTERRUPTED = "INTERRUPTED"  # a trial Tune left RUNNING when no driver runs its experiment


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
    repeat: bool = False  # a repeat run of the search's best (`augtune.search.repeat`)
    interrupted: bool = False  # RUNNING to Tune, but no driver runs the experiment any more
    # a PBT trial's copies of other trials (its record's `exploits`); None: not a PBT trial. Its params
    # are its values now (the last a copy perturbed)
    exploits: Optional[int] = None

    @property
    def shown_status(self) -> str:
        if self.interrupted and self.status == "RUNNING":
            return INTERRUPTED
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
        data = read_json(trial_dir / RECORD_FILE)
    except ValueError:  # absent, cut short, foreign: the trial's row comes from Tune's state alone
        return {}
    return data if isinstance(data, dict) else {}


def _error(trial_dir: Path, record: dict) -> str:
    line = error_line(trial_dir / ERROR_FILE)
    if line:
        return line
    if record.get("status") == "failed":
        return str(record.get("error") or "")[:200]
    return ""


def _state(path: Path) -> list[tuple[dict, dict]]:
    """(trial document, runtime state) of each trial in Tune's state file `path`; a file that is not
    one (cut short while the disk was full, hand-edited) is a ValueError naming it, in one line."""
    state = read_json(path)  # JSONFileError: the file's name and what is wrong with it
    rows = state.get("trial_data") if isinstance(state, dict) else None
    if not isinstance(rows, list):
        raise JSONFileError(path, "not a Tune experiment state (no trial_data list)")
    out = []
    for i, row in enumerate(rows):
        try:
            doc, runtime = row
            trial = json.loads(doc) if isinstance(doc, str) else doc
            run = json.loads(runtime) if isinstance(runtime, str) else runtime
        except (TypeError, ValueError, RecursionError) as e:
            why = (str(e).splitlines() or [""])[0][:100] or type(e).__name__
            what = f"trial {i + 1} of trial_data cannot be read ({why})"
            raise JSONFileError(path, what) from None
        out.append((trial if isinstance(trial, dict) else {}, run if isinstance(run, dict) else {}))
    return out


def merged_states(exp_dir: Path) -> list[tuple[dict, dict]]:
    """Every trial of the Tune runs in `exp_dir`, oldest state file first: a resume is a new Tune run of the
    experiment, which writes a state of its own, and a trial it made again keeps its folder, so each folder's
    trial is the one of the newest state that names it; a trial no folder was made for yet (pending) counts
    only in the newest state."""
    files = sorted(exp_dir.glob("experiment_state-*.json"))
    trials: dict[str, tuple[dict, dict]] = {}
    for i, path in enumerate(files):
        for trial, run in _state(path):
            key = trial.get("relative_logdir") or (f"pending {trial.get('trial_id')}" if i == len(files) - 1
                                                   else None)
            if key:
                trials[key] = (trial, run)
    return list(trials.values())


def read_trials(exp_dir: Path, metric: str, entrants: Optional[Path] = None,
                repeats: Optional[Path] = None) -> list[TrialStatus]:
    """The trials of the Tune experiment in `exp_dir`; `entrants`: the compare folder whose entrant
    folders hold the records of a Tune run that several searches share (`<entrants>/<entrant>/<trial>`);
    `repeats`: the folder of the repeat runs' records (`<repeats>/<trial>`)."""
    out = []
    for trial, run in merged_states(exp_dir):
        folder = exp_dir / trial.get("relative_logdir", "")
        config = trial.get("config") if isinstance(trial.get("config"), dict) else {}
        config = {k: v for k, v in config.items() if k != RESUME}
        repeat = isinstance(config.get(REPEAT), dict)
        params = config[REPEAT] if repeat else config
        entrant = config.get(ENTRANT)
        if repeat and repeats is not None:
            params, where = {**params, **({ENTRANT: entrant} if entrant else {})}, repeats / folder.name
        elif entrants is not None and entrant:
            where = entrants / str(entrant) / folder.name
        else:
            where = folder
        record = _record(where)
        last = run.get("last_result") or {}
        out.append(TrialStatus(
            trial_id=trial.get("trial_id", "?"), status=trial.get("status", "?"),
            epochs=int(last.get("epoch", 0) or 0), metric=last_value(run, metric),
            params=params, error=_error(folder, record), folder=folder.name,
            stopped=record.get("status") == "stopped", repeat=repeat, exploits=_exploits(record)))
    return out


def _exploits(record: dict) -> Optional[int]:
    if not searched_schedule(record.get("config")):
        return None
    count = record.get("exploits") or 0
    return count if isinstance(count, int) else 0


def _summary(trials: list[TrialStatus]) -> str:
    counts: dict[str, int] = {}
    for t in trials:
        status = INTERRUPTED if t.shown_status == INTERRUPTED else t.status
        counts[status] = counts.get(status, 0) + 1
    text = ", ".join(f"{n} {s.lower()}" for s, n in sorted(counts.items())) or "no trials yet"
    stopped = sum(t.stopped and t.status == "TERMINATED" for t in trials)
    return text + (f" ({stopped} stopped early by the scheduler)" if stopped else "")


def _entrant(params: dict) -> str:
    """A compare trial's entrant: named in a search trial's parameters, made of a repeat run's method."""
    if params.get(ENTRANT):
        return str(params[ENTRANT])
    augment = params.get("method.augment") or []
    return "+".join([str(params.get("method.base", "?")), *map(str, augment)])


def _section(title: str, trials: list[TrialStatus], metric: str, compare: bool) -> list[str]:
    lines = [f"{title}: {_summary(trials)}"]
    if not trials:
        return lines
    width = max([len(_entrant(t.params)) for t in trials] + [7]) + 2 if compare else 0
    who = f"{'entrant':<{width}}" if compare else ""
    lines.append(f"  {'trial':<14}{who}{'status':<12}{'epochs':>7}  {'last ' + metric:>14}  params / error")
    hidden = (ENTRANT, "method.base", "method.augment") if compare else ()
    for t in trials:
        value = f"{t.metric:.4f}" if t.metric is not None else "-"
        params = " ".join(f"{k}={v}" for k, v in t.params.items() if k not in hidden)
        if t.exploits is not None:
            params = f"[{t.exploits} exploit{'s' if t.exploits != 1 else ''}] {params}"
        tail = f"{params}  {t.error}".strip() if t.error else params
        who = f"{_entrant(t.params):<{width}}" if compare else ""
        lines.append(f"  {t.trial_id:<14}{who}{t.shown_status:<12}{t.epochs:>7}  {value:>14}  {tail}")
    return lines


def status_lines(exp_dir: Path, shown: str, local: bool = True) -> list[str]:
    """The status of the experiment folder `exp_dir`, naming it `shown` (its path or URI);
    `local`: the folder is the experiment itself, whose lock tells whether a driver runs it."""
    if (exp_dir / COMPARE_FILE).is_file():
        return compare_status_lines(exp_dir, shown, local=local)
    if (exp_dir.parent / COMPARE_FILE).is_file() and _latest_state(exp_dir) is None:
        # an entrant of a compare: its trials are in the compare's one search run
        parent = shown.rstrip("/").rsplit("/", 1)[0]
        return compare_status_lines(exp_dir.parent, parent, only=exp_dir.name, local=local)
    plan = read_search_file(exp_dir)  # one line when missing, corrupt or foreign
    metric = plan["config"]["search"]["metric"]
    trials = read_trials(exp_dir, metric, repeats=exp_dir / REPEAT_DIR)
    trials += read_trials(exp_dir / REPEAT_DIR, metric)  # an augtune 0.2 experiment's own repeat run
    return _phases(trials, metric, f"search {shown}", f"{REPEAT_DIR} {shown.rstrip('/')}/{REPEAT_DIR}",
                   compare=False, driver=exp_dir if local else None, resume=shown)


def _phases(trials: list[TrialStatus], metric: str, search: str, repeat: str, compare: bool,
            driver: Optional[Path] = None, resume: str = "") -> list[str]:
    """The search's trials, then its repeat runs' when there are any. `driver`: the folder whose
    lock says whether a driver runs them (None: it cannot be told); `resume`: what `augtune resume`
    takes."""
    gone = driver is not None and holder_alive(driver) is False
    if gone:
        trials = [replace(t, interrupted=True) if t.status == "RUNNING" else t for t in trials]
    lines = _section(search, [t for t in trials if not t.repeat], metric, compare)
    repeats = [t for t in trials if t.repeat]
    lines += _section(repeat, repeats, metric, compare) if repeats else []
    if any(t.shown_status == INTERRUPTED for t in trials):
        lines.append(f"no search is running there: its {INTERRUPTED} trials stopped with it "
                     f"(Ctrl-C, a lost driver); continue them with: augtune resume "
                     f"{resume.rstrip('/')}")
    return lines


def compare_status_lines(exp_dir: Path, shown: str, only: Optional[str] = None,
                         local: bool = True) -> list[str]:
    """A compare experiment: its search (every entrant's trials) and its repeat, trial by trial; `only`:
    one entrant's trials; `local` as in `status_lines`."""
    from augtune.config import ConfigError, safe_load

    path = exp_dir / COMPARE_FILE
    try:
        data = safe_load(path.read_text(encoding="utf-8"), str(path))
        metric = str(((data.get("config") or {}).get("compare") or {}).get("metrics", ["knn_acc"])[0])
    except (ConfigError, OSError, UnicodeDecodeError, AttributeError, IndexError, TypeError) as e:
        raise ValueError(f"{path}: cannot be read ({str(e).splitlines()[0][:160]})") from None
    if not (exp_dir / COMPARE_SEARCH).is_dir():
        return [f"compare {shown}: no trials yet"]
    trials = read_trials(exp_dir / COMPARE_SEARCH, metric, entrants=exp_dir, repeats=exp_dir / COMPARE_REPEAT)
    # an augtune 0.2 compare's own repeat run
    trials += read_trials(exp_dir / COMPARE_REPEAT, metric)
    if only is not None:
        trials = [t for t in trials if _entrant(t.params) == only]
    base = shown.rstrip("/")
    return _phases(trials, metric, f"{COMPARE_SEARCH} {base}/{COMPARE_SEARCH}",
                   f"{COMPARE_REPEAT} {base}/{COMPARE_REPEAT}", compare=True,
                   driver=exp_dir if local else None, resume=base)


def format_status(location: str | Path) -> str:
    """`augtune status`: a local experiment folder, or a URI (s3://, gs://) read from a copy of its files."""
    from augtune.search.storage import is_uri, local_copy

    shown = str(location) if is_uri(location) else str(Path(location).expanduser().resolve())
    with local_copy(shown) as folder:
        try:
            lines = status_lines(Path(folder).resolve(), shown, local=not is_uri(location))
            return "\n".join(lines)
        except ValueError as e:  # a copy's message names the experiment, not the temporary folder
            raise ValueError(str(e).replace(str(Path(folder).resolve()), shown)) from None
