"""Records on disk -> one tidy DataFrame: a row per run, plus the reference rows they measured.

Reads only `record.json` files (`augtune.records`), never torch, ray, `trainables/` or `search/`,
so a results folder copied to a laptop can be tabulated there.

Columns, in order: `run` (the run's folder), `experiment` (the name of the path given), `kind`
(`run` or `reference`), `status`, `error`, `method`, `dataset`, `seed`, `epochs_done`, then one
column per dotted config key (`train.lr`, `method.augment`, ...; lists become tuples so that they
can be grouped on), then `measured_by` (reference rows: how many runs measured it), then the final
metrics (`knn_acc`, `sr_acc`, ...: every undotted column after the fixed ones).

Reference rows (`method` = `raw` / `random-init`, `kind` = `reference`) are deduplicated: each run
measures them at its start, and runs that differ only in what the reference does not depend on
measured the same thing. Two measurements are the same reference when they agree on
:func:`reference_key_columns`: the reference's name, `dataset`, `seed` (and `train.seed`), every
`dataset.*` key that changes the data (`config.changes_results`: not `dataset.download`, `cache`,
`workers`, `shared`...), every `eval.*` key that changes a score (all but `eval.every`,
`eval.epoch_metrics`, `eval.metrics`, `eval.references`, `eval.batch_size`, `eval.figures`,
`eval.encoder`: a reference is measured before training, when the target encoder is the online one), and for
`random-init` also every `model.*` key (the backbone is built first from the seed, so the method
does not change it). Each group becomes one row: measurements from completed runs are preferred,
then the first by run folder; a metric missing there is taken from the next measurement that has
it (runs asking for fewer metrics). The row's `status` and `run` are those of the preferred
measurement; its other config columns are left empty: the reference does not depend on them.

The `dataset` column tells data sets apart by name and location: a data set read from a file
(`dataset.path`, e.g. `arrays`) is labelled with the end of its path, `arrays (iris.csv)`, as many
folders as it takes to tell two files apart (`arrays (a/x.csv)`, `arrays (b/x.csv)`); a named data set
read from several `dataset.root` folders is labelled with the root the same way. The name alone is in
`dataset.name`.

Records are found with :func:`find_records` (`**/record.json`, checkpoint snapshots aside); a file
that is not an augtune record is skipped with a `SkippedRecordWarning`, not an error. A record whose
fields have the wrong shape (`final` not a mapping, `epochs` not a list, ...) is a `BrokenRecordError`
naming the file and the field; a metric that is not a number (`"0.93"`) is left out with one
`BadValueWarning` line naming the record, as is a completed run without final metrics.
"""
from __future__ import annotations

import json
import math
import os
import warnings
from pathlib import Path
from typing import Any, Iterable, Union

import pandas as pd

from augtune.config import changes_results, dotted_keys
from augtune.records import FORMAT, RECORD_FILE, JSONFileError, read_json

PathLike = Union[str, os.PathLike]

BASE_COLUMNS = ("run", "experiment", "kind", "status", "error", "method", "dataset", "seed", "epochs_done")
REFERENCES = ("raw", "random-init")  # the order reference rows are listed in
# Settings that change which scores are computed or how fast, not their values.
_EVAL_NOT_IN_KEY = frozenset({"eval.every", "eval.epoch_metrics", "eval.metrics", "eval.references",
                              "eval.batch_size", "eval.figures", "eval.encoder"})
_CHECKPOINT_PREFIX = "checkpoint_"  # Ray's checkpoint folders inside a trial folder
# config keys outside any section (`schedule`): config columns although they hold no dot
_TOP_KEYS = frozenset(k for k in dotted_keys() if "." not in k)


def is_config_column(name: Any) -> bool:
    """Whether a frame's column is a config key (dotted, or a top-level key such as `schedule`)."""
    return "." in str(name) or name in _TOP_KEYS


class AnalysisError(ValueError):
    """Input that cannot be tabulated, phrased as one line (the CLI turns it into a UsageError)."""


class NoRecordsError(AnalysisError):
    """No augtune record under the paths given."""


class NoFinishedRunsError(AnalysisError):
    """Records exist, but none of the runs completed."""


class UnknownMetricError(AnalysisError):
    """A metric that no run reports."""


class UnknownColumnError(AnalysisError):
    """A rows/cols key that is no column of the runs."""


class MixedDatasetsError(AnalysisError):
    """Runs on several datasets would be averaged together."""


class BrokenRecordError(AnalysisError):
    """An augtune record whose fields have the wrong shape: tabulating it would guess."""


class SkippedRecordWarning(UserWarning):
    """A `record.json` that is not an augtune record (or cannot be read) was skipped."""


class BadValueWarning(SkippedRecordWarning):
    """A record's metric that is not a number was left out (the rest of the record is used)."""


# ---------------------------------------------------------------------------------------------
# Finding records


def find_records(path: PathLike) -> list[Path]:
    """The record files under `path` (a record file, a run folder or any folder above runs), sorted.

    A `record.json` inside a folder named `checkpoint_*` is a snapshot of the run whose folder
    holds that checkpoint: it is used only when that folder has no `record.json` of its own, and
    then only the last checkpoint's (by name). Hidden folders below `path` are not searched.
    """
    path = Path(path)
    if path.is_file():
        return [path]
    own: dict[Path, Path] = {}  # run folder -> its record
    snapshots: dict[Path, Path] = {}  # run folder -> record in its last checkpoint
    for dirpath, dirnames, filenames in os.walk(path):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        if RECORD_FILE not in filenames:
            continue
        folder = Path(dirpath)
        if folder != path and folder.name.startswith(_CHECKPOINT_PREFIX):
            run = folder.parent
            if run not in snapshots or folder.name > snapshots[run].parent.name:
                snapshots[run] = folder / RECORD_FILE
        else:
            own[folder] = folder / RECORD_FILE
    for run, record in snapshots.items():
        own.setdefault(run, record)
    return sorted(own.values())


def _read(path: Path) -> tuple[dict | None, str]:
    """(the record at `path`, "") or (None, why it is skipped)."""
    try:
        data = read_json(path)  # the records' one reader: bounded depth, one line naming the file
    except JSONFileError as e:
        return None, e.reason
    if isinstance(data, dict) and data.get("format") == FORMAT:
        return data, ""
    found = data.get("format") if isinstance(data, dict) else type(data).__name__
    return None, f"not an augtune record (format {found!r}, expected {FORMAT!r})"


# ---------------------------------------------------------------------------------------------
# Flattening


def _hashable(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True)
    return value


def flatten_config(config: Any, prefix: str = "") -> dict[str, Any]:
    """{"train": {"lr": 0.01}} -> {"train.lr": 0.01}; lists become tuples."""
    out: dict[str, Any] = {}
    if not isinstance(config, dict):
        return out
    for k, v in config.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flatten_config(v, key + "."))
        else:
            out[key] = _hashable(v)
    return out


def reference_key_columns(name: str, columns: Iterable[str]) -> list[str]:
    """The columns that identify reference `name`'s measurement (see the module docstring)."""
    keys = ["dataset", "seed"]
    for c in columns:
        if not changes_results(c):
            continue
        if c.startswith("dataset.") or (c.startswith("eval.") and c not in _EVAL_NOT_IN_KEY) or \
                c == "train.seed" or (name == "random-init" and c.startswith("model.")):
            keys.append(c)
    return keys


def metric_columns(df: pd.DataFrame) -> list[str]:
    """The metric columns of a `load_runs` frame: the undotted ones after the fixed columns."""
    return [c for c in df.columns if c not in BASE_COLUMNS and c != "measured_by" and not is_config_column(c)]


def _is_missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


# ---------------------------------------------------------------------------------------------
# Loading


def _experiment_name(path: Path) -> str:
    if path.is_file():
        path = path.parent
    return path.name or path.resolve().name


def load_runs(paths: PathLike | Iterable[PathLike], *, completed_only: bool = False) -> pd.DataFrame:
    """One row per run found under `paths`, plus the deduplicated reference rows.

    Each path is an experiment folder (trial folders below it, at any depth), a folder of runs, a
    run folder or a record file. A record found twice (a folder and a folder inside it) counts
    once. Files that are not augtune records are skipped with a `SkippedRecordWarning`.
    `completed_only` keeps only completed runs (and references they measured), as `completed`.
    """
    paths = _given(paths)
    runs: list[dict] = []
    measured: list[tuple[str, dict, dict]] = []  # (reference name, its metrics, the run row)
    skipped: list[str] = []
    for file, experiment in _record_files(paths):
        record, reason = _read(file)
        if record is None:
            skipped.append(f"{file}: {reason}")
            continue
        row, references = _run_row(file, experiment, record)
        runs.append(row)
        measured += [(name, metrics, row) for name, metrics in references.items()]
    if not runs:  # one line: the first file skipped says why, a warning per file would repeat it
        where = ", ".join(str(p) for p in paths)
        more = f" and {len(skipped) - 1} more" if len(skipped) > 1 else ""
        note = f" (skipped {skipped[0]}{more})" if skipped else ""
        raise NoRecordsError(f"no augtune records (record.json) found under {where}{note}")
    for line in skipped:
        warnings.warn(f"skipped {line}", SkippedRecordWarning, stacklevel=2)
    _label_datasets(runs)
    config_columns = sorted({k for r in runs for k in r if is_config_column(k)})
    references = _dedupe_references(measured, config_columns)
    metrics = _ordered_metrics([*runs, *references], config_columns)
    columns = [*BASE_COLUMNS, *config_columns, "measured_by", *metrics]
    rows = [*runs, *references]
    df = pd.DataFrame({c: _column([r.get(c) for r in rows]) for c in columns})
    return completed(df) if completed_only else df


def _given(paths: PathLike | Iterable[PathLike]) -> list[Path]:
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    paths = [Path(p) for p in paths]
    if not paths:
        raise NoRecordsError("no paths given: name experiment folders, run folders or record files")
    for p in paths:
        if not p.exists():
            raise NoRecordsError(f"{p}: no such file or folder")
    return paths


def _record_files(paths: list[Path]) -> Iterable[tuple[Path, str]]:
    """(record file, experiment name) under the paths, each file once."""
    seen: set[Path] = set()
    for given in paths:
        experiment = _experiment_name(given)
        for file in find_records(given):
            if file.resolve() not in seen:
                seen.add(file.resolve())
                yield file, experiment


def _run_row(file: Path, experiment: str, record: dict) -> tuple[dict, dict[str, dict]]:
    """The frame's row of one record, and the reference metrics it measured (both checked)."""
    _check_shape(file, record)
    final, references = _numbers_only(file, record)
    row = {
        "run": str(file.parent), "experiment": experiment, "kind": "run",
        "status": record.get("status"), "error": record.get("error"),
        "method": record.get("method"), "dataset": record.get("dataset"), "seed": record.get("seed"),
        "epochs_done": len(record.get("epochs") or []),
        "schedule": (),  # a record written before `schedule:` existed ran without one
        **flatten_config(record.get("config")),
    }
    row.update({k: v for k, v in final.items() if k not in row})
    return row, references


# field -> (type, how to say it); fields a record needs are in _REQUIRED, the others may be absent or null
_SHAPE = {"config": (dict, "a mapping"), "method": (str, "a string"), "dataset": (str, "a string"),
          "status": (str, "a string"), "error": (str, "a string"), "final": (dict, "a mapping"),
          "references": (dict, "a mapping"), "epochs": (list, "a list")}
_REQUIRED = ("config", "method", "dataset", "status")


def _kind(value: Any) -> str:
    return "null" if value is None else f"a {type(value).__name__}"


def _check_shape(file: Path, record: dict) -> None:
    """One `BrokenRecordError` line for the first field of the wrong shape."""
    def broken(field: str, value: Any, what: str) -> BrokenRecordError:
        return BrokenRecordError(f"{file}: broken record: {field} is {_kind(value)}, expected {what}")

    for key, (tp, what) in _SHAPE.items():
        value = record.get(key)
        if not isinstance(value, tp) and (value is not None or key in _REQUIRED):
            raise broken(key, value, what)
    seed = record.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise broken("seed", seed, "an integer")
    for name, values in (record.get("references") or {}).items():
        if not isinstance(values, dict):
            raise broken(f"references.{name}", values, "a mapping")
    for i, epoch in enumerate(record.get("epochs") or []):
        if not isinstance(epoch, dict):
            raise broken(f"epochs[{i}]", epoch, "a mapping")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _numbers_only(file: Path, record: dict) -> tuple[dict, dict[str, dict]]:
    """The final and reference metrics that are numbers (or null); one warning line for the rest."""
    final = record.get("final") or {}
    references = record.get("references") or {}
    bad = [f"final.{k} = {_short(v)}" for k, v in final.items() if v is not None and not _is_number(v)]
    bad += [f"references.{n}.{k} = {_short(v)}" for n, values in references.items()
            for k, v in values.items() if v is not None and not _is_number(v)]
    if bad:
        warnings.warn(f"{file}: left out {', '.join(bad)} (not a number)", BadValueWarning, stacklevel=4)
    elif record.get("status") == "completed" and not final:
        warnings.warn(f"{file}: completed but it has no final metrics (it shows in no cell)", BadValueWarning,
                      stacklevel=4)
    final = {k: v for k, v in final.items() if v is None or _is_number(v)}
    references = {n: {k: v for k, v in values.items() if v is None or _is_number(v)}
                  for n, values in references.items()}
    return final, references


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _label_datasets(runs: list[dict]) -> None:
    """`dataset` <- the name, with the end of its file's path or of its root where that tells it apart."""
    by_name: dict[str, set[str | None]] = {}
    for r in runs:
        by_name.setdefault(str(r.get("dataset")), set()).add(_location(r))
    for r in runs:
        places = by_name[str(r.get("dataset"))]
        where = _location(r)
        if where is not None and (r.get("dataset.path") is not None or len(places) > 1):
            r["dataset"] = f"{r.get('dataset')} ({_short_path(where, places)})"


def _location(row: dict) -> str | None:
    """Where a run's data came from: its file (`dataset.path`), else its folder (`dataset.root`)."""
    for key in ("dataset.path", "dataset.root"):
        if isinstance(row.get(key), str):
            return row[key]
    return None


def _short_path(where: str, places: set[str | None]) -> str:
    """The fewest trailing parts of `where` that no other place of the same data set ends with."""
    parts = Path(where).parts
    others = [Path(p).parts for p in places if p is not None and p != where]
    for n in range(1, len(parts) + 1):
        tail = parts[-n:]
        if not any(o[-n:] == tail for o in others):
            return str(Path(*tail))
    return where


# The shared metric names (docs/contributing.md) first, in their order; the others alphabetically.
_METRIC_ORDER = ("knn_acc", "sr_acc", "linear_acc", "kmeans_acc", "kmeans_nmi", "kmeans_ari", "cluster_acc",
                 "cluster_nmi", "cluster_ari", "cluster_k", "loss", "epoch_time_s", "samples_per_s")


def _ordered_metrics(rows: list[dict], config_columns: list[str]) -> list[str]:
    fixed = {*BASE_COLUMNS, *config_columns, "measured_by"}
    found = {k for r in rows for k in r if k not in fixed and not is_config_column(k)}
    known = [m for m in _METRIC_ORDER if m in found]
    return known + sorted(found - set(known))


def _dedupe_references(measured: list[tuple[str, dict, dict]], config_columns: list[str]) -> list[dict]:
    groups: dict[tuple, list[tuple[dict, dict]]] = {}
    for name, metrics, run in measured:
        key_cols = reference_key_columns(name, config_columns)
        key = (name, *(run.get(c) for c in key_cols))
        groups.setdefault(key, []).append((metrics, run))
    out = []
    for (name, *_), members in groups.items():
        members.sort(key=lambda m: (m[1]["status"] != "completed", m[1]["run"]))
        first = members[0][1]
        keys = ("run", "experiment", "status", *reference_key_columns(name, config_columns))
        row = {c: first.get(c) for c in keys}
        row.update(kind="reference", method=name, error=None, epochs_done=None, measured_by=len(members))
        for metrics, _ in members:
            for k, v in metrics.items():
                if not is_config_column(k) and k not in row and not _is_missing(v):
                    row[k] = v
        out.append(row)
    order = {n: i for i, n in enumerate(REFERENCES)}
    out.sort(key=lambda r: (order.get(r["method"], len(order)), str(r["method"]), str(r["dataset"]),
                            r["seed"] if isinstance(r["seed"], int) else -1, r["run"]))
    return out


def _column(values: list) -> pd.Series:
    """Integers and booleans with gaps (reference rows) keep their type instead of becoming floats."""
    present = [v for v in values if not _is_missing(v)]
    if present and all(isinstance(v, bool) for v in present):
        return pd.Series(values, dtype="boolean")
    if present and all(isinstance(v, int) and not isinstance(v, bool) for v in present):
        return pd.Series(values, dtype="Int64")
    if present and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in present):
        return pd.Series([math.nan if v is None else v for v in values], dtype="float64")
    return pd.Series(values, dtype=object if any(isinstance(v, tuple) for v in present) else None)


def completed(df: pd.DataFrame) -> pd.DataFrame:
    """Only the completed runs, and the references whose kept measurement is from a completed run."""
    return df[df["status"] == "completed"].reset_index(drop=True)


# ---------------------------------------------------------------------------------------------
# Trials

_PHASES = {"search": 0, "repeat": 1}  # the order a trials frame lists them in


def trials_frame(records: list[tuple[str, dict]], metric: str) -> pd.DataFrame:
    """One row per trial of a search or compare (`records`: (trial name, record)), as Optuna's
    `trials_dataframe`: `trial`, `entrant`, `phase` (search or repeat), `state` (the record's status),
    `seed`, each searched key by its dotted name (the keys the search trials were given; a repeat run's
    values of them), `metric` (its last value reported, which ranked a search trial; a repeat run's on the
    test split), `epochs` (trained) and `seconds` (wall time over every part of the run). Listed by entrant,
    phase and start."""
    from augtune.analysis.importance import trial_value

    def params(record: dict) -> dict:
        given = record.get("params")
        return given if isinstance(given, dict) else {}

    def seconds(record: dict) -> float:
        parts = record.get("seconds")
        parts = [v for v in parts.values() if _is_number(v)] if isinstance(parts, dict) else []
        return float(sum(parts)) if parts else math.nan

    records = sorted(records, key=lambda t: (str(t[1].get("entrant") or t[1].get("method")),
                                             _PHASES.get(t[1].get("phase", "search"), 2),
                                             str(t[1].get("started") or ""), t[0]))
    searched = [p for _, r in records if r.get("phase", "search") == "search" for p in params(r)]
    if not searched:  # a repeat alone: its parameters, the seed aside (a column of its own)
        searched = [p for _, r in records for p in params(r) if p != "train.seed"]
    keys = list(dict.fromkeys(searched))
    rows = [{"trial": name, "entrant": r.get("entrant") or r.get("method"), "phase": r.get("phase", "search"),
             "state": r.get("status"), "seed": r.get("seed"),
             **{k: _hashable(params(r).get(k)) for k in keys},
             metric: trial_value(r, metric), "epochs": len(r.get("epochs") or []), "seconds": seconds(r)}
            for name, r in records]
    columns = ["trial", "entrant", "phase", "state", "seed", *keys, metric, "epochs", "seconds"]
    return pd.DataFrame({c: _column([row.get(c) for row in rows]) for c in columns})
