"""A `load_runs` frame -> the comparison table papers print -> CSV, Markdown or LaTeX.

`comparison_table` groups the runs by two columns (`rows` x `cols`, any column: `method`,
`dataset`, `train.lr`, `pinda.mu`, ...) and gives, per cell and metric, the mean, the sample
standard deviation over the runs in it (ddof=1; undefined, so left blank, when n = 1) and n.
An axis may combine columns, `method,pinda.mu`: rows `simclr+pinda (pinda.mu=zero)`, and `simclr`
for the runs that do not read `pinda.mu`.

A cell never pools runs that read different settings (`config.run_signature`: every config key the
run reads and that changes what it trains or scores), only seeds: when the runs that would share a
cell differ in other settings, the axis that holds `method` (rows by default) is split, and each of
its labels names the settings that tell its runs apart, `simclr (train.lr=0.01)`, with as many
digits as tell the values apart. `pool` (`augtune export --pool KEY`) lets chosen settings be
averaged over instead (said in the caption). Two runs that read the same settings with the same
seed are one run, counted once. A table with runs still running or interrupted (or, from `export`,
of a search that has not finished) says so at the head of its caption.

Rendering:
- Markdown and LaTeX cells read `mean ± std (n)`. Metrics that are fractions (`*_acc`, `*_nmi`,
  `*_ari`) are printed as percentages with 2 decimals, as the papers print them (`79.35 ± 0.61 (3)`);
  other metrics (`cluster_k`, `loss`, ...) with 4 significant digits. A cell with n = 1 reads
  `75.19 (1)`. The best mean of each column (per metric; ties at the printed precision all count) is
  bold, among the method rows only and only when at least two of them have a value there.
- CSV is the data, one line per cell and metric (row label, column label, `metric`, `mean`, `std`,
  `n`, `kind`, `best`), values as recorded (fractions, full precision), no bold.

References (`raw`, `random-init`) are placed along the axis that holds `method` (rows by
default), after the method rows (under a rule in LaTeX, a `*references*` line in Markdown, which
has no rules). On the other axis they are grouped by its key when the reference depends on it
(`dataset`, `seed`, `dataset.*`, ...: see `frame.reference_key_columns`); otherwise (`train.lr`)
the same reference value stands in every column, since it does not depend on that key.
"""
from __future__ import annotations

import difflib
import math
import statistics
from collections import Counter
from dataclasses import dataclass, field
from numbers import Number
from typing import Any, Iterable, Mapping, Union

import numpy as np
import pandas as pd

from augtune.analysis.frame import (REFERENCES, AnalysisError, MixedDatasetsError, NoFinishedRunsError,
                                    UnknownColumnError, UnknownMetricError, is_config_column,
                                    metric_columns, reference_key_columns)
from augtune.config import format_value, key_applies, run_signature
from augtune.records import FRACTION_SUFFIXES, LOWER_IS_BETTER

# mode="auto": higher is better, except these (None: no "best" to mark, e.g. a cluster count).
AUTO_MODES: dict[str, str | None] = {"loss": "min", "epoch_time_s": "min", "cluster_k": None,
                                     **{m: "min" for m in sorted(LOWER_IS_BETTER)}}
Mode = Union[str, None, Mapping[str, Union[str, None]]]


@dataclass(frozen=True)
class Cell:
    mean: float
    std: float  # sample std (ddof=1); NaN when n == 1
    n: int


@dataclass
class ComparisonTable:
    """Cells keyed by (row label, column label, metric); labels are the column values themselves."""

    rows: str
    cols: str
    metrics: tuple[str, ...]
    row_labels: list
    col_labels: list
    references: tuple[str, ...]  # the reference labels present, on `reference_axis`
    reference_axis: str  # "rows" or "cols"
    cells: dict[tuple, Cell] = field(default_factory=dict)
    best: frozenset = frozenset()  # keys of `cells` shown bold
    unfinished: str = ""  # why the table is not final (a search still running, runs left out); "" when it is
    pooled: tuple[str, ...] = ()  # settings asked to be pooled (`--pool`): their runs may share a cell

    # -- data ---------------------------------------------------------------------------------

    def is_reference(self, row: Any, col: Any) -> bool:
        return (row if self.reference_axis == "rows" else col) in self.references

    @property
    def data(self) -> pd.DataFrame:
        """Long form: one line per (row, column, metric) with mean, std, n, kind and best."""
        lines = []
        for r in self.row_labels:
            for c in self.col_labels:
                for m in self.metrics:
                    cell = self.cells.get((r, c, m))
                    if cell is None:
                        continue
                    lines.append({self.rows: _label(r, blank_none=True),
                                  self.cols: _label(c, blank_none=True), "metric": m, "mean": cell.mean,
                                  "std": cell.std, "n": cell.n,
                                  "kind": "reference" if self.is_reference(r, c) else "run",
                                  "best": (r, c, m) in self.best})
        columns = [self.rows, self.cols, "metric", "mean", "std", "n", "kind", "best"]
        return pd.DataFrame(lines, columns=columns)

    # -- rendering ------------------------------------------------------------------------------

    def to_csv(self) -> str:
        return self.data.to_csv(index=False)

    def caption(self) -> str:
        unit = " in %" if all(_is_fraction(m) for m in self.metrics) else ""
        bold = "; best per column in bold" if self.best else ""
        head = f"unfinished ({self.unfinished}): " if self.unfinished else ""
        pooled = f", pooled over {', '.join(self.pooled)}" if self.pooled else ""
        return f"{head}{', '.join(self.metrics)}{unit}: mean ± std (n runs{pooled}){bold}"

    def _header(self, c: Any) -> str:
        text = _label(c)
        if self.cols in ("dataset", "method") or (self.reference_axis == "cols" and c in self.references):
            return text
        return f"{self.cols}={text}"

    def _text(self, r: Any, c: Any, m: str, pm: str) -> str | None:
        cell = self.cells.get((r, c, m))
        if cell is None:
            return None
        text = _number(m, cell.mean)
        if cell.n > 1:
            text += f" {pm} {_number(m, cell.std)}"
        return f"{text} ({cell.n})"

    def _body(self) -> tuple[list, list]:
        """Method rows and reference rows (the latter empty when references are columns)."""
        if self.reference_axis == "rows":
            return ([r for r in self.row_labels if r not in self.references],
                    [r for r in self.row_labels if r in self.references])
        return list(self.row_labels), []

    def to_markdown(self) -> str:
        def esc(s: str) -> str:
            return s.replace("|", "\\|")

        heads = [esc(self._header(c)) + (f" {m}" if len(self.metrics) > 1 else "")
                 for c in self.col_labels for m in self.metrics]
        out = [f"Table: {self.caption()}", "", "| " + " | ".join([esc(self.rows), *heads]) + " |",
               "| " + " | ".join([":---", *["---:"] * len(heads)]) + " |"]

        def line(r: Any) -> str:
            cells = []
            for c in self.col_labels:
                for m in self.metrics:
                    t = self._text(r, c, m, "±")
                    cells.append("–" if t is None else f"**{t}**" if (r, c, m) in self.best else t)
            return "| " + " | ".join([esc(_label(r)), *cells]) + " |"

        runs, refs = self._body()
        out += [line(r) for r in runs]
        if refs:
            out.append("| *references* |" + " |" * len(heads))
            out += [line(r) for r in refs]
        return "\n".join(out) + "\n"

    def to_latex(self) -> str:
        k, ncols = len(self.metrics), len(self.col_labels)
        out = [f"% {_latex(self.caption())}",
               "\\begin{tabular}{l" + "c" * (ncols * k) + "}", "\\toprule"]
        if k == 1:
            heads = (_latex(self._header(c)) for c in self.col_labels)
            out.append(" & ".join([_latex(self.rows), *heads]) + " \\\\")
        else:
            out.append(" & ".join(["", *(f"\\multicolumn{{{k}}}{{c}}{{{_latex(self._header(c))}}}"
                                         for c in self.col_labels)]) + " \\\\")
            out.append(" ".join(f"\\cmidrule(lr){{{2 + i * k}-{1 + (i + 1) * k}}}" for i in range(ncols)))
            names = (_latex(m) for _ in self.col_labels for m in self.metrics)
            out.append(" & ".join([_latex(self.rows), *names]) + " \\\\")
        out.append("\\midrule")

        def line(r: Any) -> str:
            cells = []
            for c in self.col_labels:
                for m in self.metrics:
                    t = self._text(r, c, m, "$\\pm$")
                    cells.append("--" if t is None else f"\\textbf{{{t}}}" if (r, c, m) in self.best else t)
            return " & ".join([_latex(_label(r)), *cells]) + " \\\\"

        runs, refs = self._body()
        out += [line(r) for r in runs]
        if refs:
            out.append("\\midrule")
            out += [line(r) for r in refs]
        out += ["\\bottomrule", "\\end{tabular}"]
        return "\n".join(out) + "\n"

    def render(self, fmt: str) -> str:
        """`csv`, `md` (or `markdown`) or `latex`."""
        renderers = {"csv": self.to_csv, "md": self.to_markdown, "markdown": self.to_markdown,
                     "latex": self.to_latex}
        if fmt not in renderers:
            raise ValueError(f"unknown table format {fmt!r} (known: csv, md, latex)")
        return renderers[fmt]()


# ---------------------------------------------------------------------------------------------
# Formatting


def _is_fraction(metric: str) -> bool:
    return metric.endswith(FRACTION_SUFFIXES)


def _number(metric: str, x: float) -> str:
    return f"{100 * x:.2f}" if _is_fraction(metric) else f"{x:.4g}"


def _label(value: Any, blank_none: bool = False) -> str:
    if value is None and blank_none:
        return ""
    return format_value(value, digits=6)


_LATEX_SPECIAL = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                  "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}",
                  "±": r"$\pm$"}


def _latex(text: str) -> str:
    return "".join(_LATEX_SPECIAL.get(ch, ch) for ch in text)


def _plain(value: Any) -> Any:
    """A grouping label: numpy scalars as Python ones, every kind of missing as None."""
    if value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)):
        return None
    if isinstance(value, np.generic):
        value = value.item()
        return None if isinstance(value, float) and math.isnan(value) else value
    return value


def _sort_key(value: Any) -> tuple:
    if value is None:
        return (2, 0, "")
    if isinstance(value, Number) and not isinstance(value, bool):
        return (0, value, "")
    return (1, 0, _label(value))


# ---------------------------------------------------------------------------------------------
# The table: select the runs, check the request, label the variants, group, reference rows, best


def comparison_table(df: pd.DataFrame, rows: str = "method", cols: str = "dataset",
                     metrics: Iterable[str] | str = ("knn_acc",), only_completed: bool = True,
                     mode: Mode = "auto", pool: Iterable[str] = (), unfinished: str = "") -> ComparisonTable:
    """Mean, std and n of each metric over the runs in each (rows, cols) group of a `load_runs` frame.

    `metrics`: names, or one comma-separated string. `only_completed`: leave out running and failed
    runs (and references measured only by them). `mode`: "auto" (higher is better except
    `AUTO_MODES` and `loss_*`), "max", "min", None (no bold), or a mapping metric -> one of these.
    `pool`: dotted config keys whose values may differ inside a cell (the seed always may); any other
    setting that differs between the runs of a cell splits its row (see the module docstring).
    `unfinished`: why the runs are not all there yet (an unfinished search), said in the caption.
    """
    metrics, pool = _metric_names(metrics), tuple(pool)
    row_keys, col_keys = _axis_keys(df, "rows", rows), _axis_keys(df, "cols", cols)
    if row_keys == col_keys:
        raise AnalysisError(f"rows and cols are both {rows!r}: pick two different columns")
    runs, refs, left_out = _select(df, only_completed)
    _check_request(df, runs, row_keys, col_keys, metrics, mode)
    split = "cols" if _leads_with_method(col_keys) and not _leads_with_method(row_keys) else "rows"
    fixed = _fixed_keys(df, row_keys + col_keys, pool)
    axes = _Axes.of(_distinct_runs(runs), row_keys, col_keys, split, fixed)
    cells = _run_cells(axes, metrics)
    axis, present = _reference_cells(refs, axes, metrics, cells)
    ref_rows, ref_cols = (list(present), []) if axis == "rows" else ([], list(present))
    return ComparisonTable(rows=",".join(row_keys), cols=",".join(col_keys), metrics=metrics,
                           row_labels=axes.row_labels + ref_rows, col_labels=axes.col_labels + ref_cols,
                           references=present, reference_axis=axis, cells=cells,
                           best=_best(cells, axes, metrics, mode),
                           unfinished="; ".join(t for t in (unfinished, left_out) if t),
                           pooled=tuple(k for k in dict.fromkeys(pool) if k not in ("seed", "train.seed")))


# -- select and check


def _metric_names(metrics: Iterable[str] | str) -> tuple[str, ...]:
    if isinstance(metrics, str):
        metrics = [m.strip() for m in metrics.split(",")]
    return tuple(dict.fromkeys(m for m in metrics if m))


def _check_column(df: pd.DataFrame, axis: str, key: str) -> None:
    if key in df.columns:
        return
    close = difflib.get_close_matches(key, [str(c) for c in df.columns], n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    raise UnknownColumnError(f"{axis}: no column {key!r} in these runs{hint}; use method, dataset, seed, "
                             f"experiment or a dotted config key such as train.lr")


def _axis_keys(df: pd.DataFrame, axis: str, spec: str) -> list[str]:
    """`method,pinda.mu` -> ["method", "pinda.mu"]: the first key names the group, the others are added
    to its label where the run reads them (`config.key_applies`)."""
    keys = [k.strip() for k in spec.split(",") if k.strip()]
    if not keys:
        raise UnknownColumnError(f"{axis}: no column named")
    for key in keys:
        _check_column(df, axis, key)
    return keys


def _leads_with_method(keys: list[str]) -> bool:
    return keys[0] == "method"


_LEFT_OUT = ("running", "interrupted")  # runs that have not ended: the table is not final while they exist


def _select(df: pd.DataFrame, only_completed: bool) -> tuple[pd.DataFrame, pd.DataFrame, str]:
    """(runs, references) to tabulate, and which unended runs there are (for the caption)."""
    kind = df["kind"] if "kind" in df.columns else pd.Series("run", index=df.index)
    runs, refs = df[kind == "run"], df[kind == "reference"]
    if runs.empty:
        raise NoFinishedRunsError("no runs to tabulate (only reference rows)")
    counts = Counter(str(s) for s in runs["status"] if s in _LEFT_OUT)
    unended = ", ".join(f"{counts[s]} {s}" for s in _LEFT_OUT if counts[s])
    if only_completed:
        if not (runs["status"] == "completed").any():
            raise NoFinishedRunsError(_unfinished(runs))
        runs, refs = runs[runs["status"] == "completed"], refs[refs["status"] == "completed"]
        unended = f"{unended} run{'s' if sum(counts.values()) > 1 else ''} left out" if unended else ""
    return runs, refs, unended


def _unfinished(runs: pd.DataFrame) -> str:
    experiments = ", ".join(dict.fromkeys(str(e) for e in runs["experiment"]))
    counts = Counter("unknown" if _plain(s) is None else str(s) for s in runs["status"])
    order = ["running", "failed", *sorted(s for s in counts if s not in ("running", "failed"))]
    parts = ", ".join(f"{counts[s]} {s}" for s in order if counts[s])
    return f"no finished runs in {experiments}: {parts}"


def _check_request(df: pd.DataFrame, runs: pd.DataFrame, row_keys: list[str], col_keys: list[str],
                   metrics: tuple[str, ...], mode: Mode) -> None:
    """Metrics that some run reports, one data set unless it is an axis, and a known mode: before any work."""
    available = [m for m in metric_columns(df) if runs[m].notna().any()]
    for m in metrics:
        if m not in available:
            raise UnknownMetricError(f"no run reports metric {m!r} "
                                     f"(available: {', '.join(available) or 'none'})")
    if not metrics:
        raise UnknownMetricError(f"no metric asked for (available: {', '.join(available) or 'none'})")
    if not {row_keys[0], col_keys[0]} & {"dataset", "dataset.name"}:
        datasets = sorted({str(d) for d in runs["dataset"] if _plain(d) is not None})
        if len(datasets) > 1:
            raise MixedDatasetsError(f"these runs span datasets {', '.join(datasets)}: put dataset in --rows "
                                     f"or --cols, or pass one experiment per dataset")
    for m in metrics:
        _resolve_mode(mode, m)


def _resolve_mode(mode: Mode, metric: str) -> str | None:
    m = mode.get(metric, "auto") if isinstance(mode, Mapping) else mode
    if m == "auto":
        m = "min" if metric.startswith("loss_") else AUTO_MODES.get(metric, "max")
    if m not in ("max", "min", None):
        raise ValueError(f"mode for {metric}: expected 'max', 'min', 'auto' or None, got {m!r}")
    return m


# -- which runs are the same run, and which may share a cell


def _flat(row: pd.Series) -> dict[str, Any]:
    return {k: _plain(row[k]) for k in row.index if is_config_column(k) and not str(k).startswith("_")}


def _distinct_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per distinct run: two runs that read the same settings (`config.run_signature`: a grid's
    `nrcc.negatives` crossed with a plain SimCLR run, `pinda.mu` with a CLAE run, or `eval.metrics`)
    with the same seed trained the same thing, so the table counts it once: the first by run folder,
    its missing metrics taken from the others (a run that asked for fewer metrics)."""
    if runs.empty:
        return runs
    ordered = runs.sort_values("run") if "run" in runs.columns else runs
    ids: dict[tuple, int] = {}
    group = [ids.setdefault(_identity(row), len(ids)) for _, row in ordered.iterrows()]
    if len(ids) == len(ordered):
        return runs
    return ordered.groupby(group, sort=False).first().reset_index(drop=True)


def _identity(row: pd.Series) -> tuple:
    """What makes a run this run: its method, data set, seed and the settings it reads."""
    method = str(row.get("method"))
    seed, dataset = repr(_plain(row.get("seed"))), repr(_plain(row.get("dataset")))
    return method, dataset, seed, run_signature(_flat(row), method)


_AXIS_KEYS = {"method": ("method.base", "method.augment"), "dataset": ("dataset.name", "dataset.path",
              "dataset.root"), "seed": ("train.seed",)}


def _fixed_keys(df: pd.DataFrame, axis_keys: list[str], pool: Iterable[str]) -> set[str]:
    """Keys that never split a row: the seed, the keys the axes show, and the ones asked to be pooled."""
    fixed = {"train.seed"}
    for key in axis_keys:
        fixed |= {key, *_AXIS_KEYS.get(key, ())}
    for key in pool:
        if key != "seed" and key not in df.columns:
            close = difflib.get_close_matches(key, [str(c) for c in df.columns if is_config_column(c)], n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise UnknownColumnError(f"--pool: no config key {key!r} in these runs{hint}")
        fixed |= {key, *_AXIS_KEYS.get(key, ())}
    return fixed


_UNREAD = object()  # a setting the run does not read: differs from every value


@dataclass
class _Axes:
    """Each run's row and column label, with the order of the labels and the value each one stands for."""

    runs: pd.DataFrame  # with `_row` and `_col`: the labels
    row_labels: list
    col_labels: list
    heads: dict  # label -> the value of the axis's first key it stands for (references are matched on it)
    row_keys: list[str]
    col_keys: list[str]

    @classmethod
    def of(cls, runs: pd.DataFrame, row_keys: list[str], col_keys: list[str], split: str,
           fixed: set[str]) -> "_Axes":
        flats = [_flat(row) for _, row in runs.iterrows()]
        methods = [str(m) for m in runs["method"]]
        sigs = [dict(run_signature(f, m, ignore=fixed)) for f, m in zip(flats, methods)]
        heads = {}
        labels = {}
        for axis, keys, other in (("rows", row_keys, col_keys), ("cols", col_keys, row_keys)):
            head = [_plain(v) for v in runs[keys[0]]]
            vary = _varying(head, [_plain(v) for v in runs[other[0]]], sigs) if axis == split else {}
            settings = [_settings(keys[1:], flats[i], methods[i], sorted(vary.get(h, ())), sigs[i])
                        for i, h in enumerate(head)]
            labels[axis], order = _texts(head, settings)
            heads.update({labels[axis][i]: h for i, h in enumerate(head)})
            labels[axis + "_order"] = sorted(set(labels[axis]), key=order.get)
        runs = runs.assign(_row=labels["rows"], _col=labels["cols"])
        return cls(runs, labels["rows_order"], labels["cols_order"], heads, row_keys, col_keys)


def _varying(head: list, other: list, sigs: list[dict]) -> dict[Any, set[str]]:
    """head value -> the settings that differ between runs that would share a cell of its row."""
    cells: dict[tuple, list[int]] = {}
    for i, key in enumerate(zip(head, other)):
        cells.setdefault(key, []).append(i)
    out: dict[Any, set[str]] = {}
    for (h, _), idx in cells.items():
        keys = {k for i in idx for k in sigs[i]}
        differ = {k for k in keys if len({sigs[i].get(k, _UNREAD) for i in idx}) > 1}
        if differ:
            out.setdefault(h, set()).update(differ)
    return out


def _settings(shown: list[str], flat: dict, method: str, vary: list[str], sig: dict) -> tuple:
    """((key, value), ...) added to a run's label: the axis's own further keys the run reads (when set),
    then the settings that tell it apart from the other runs of its cell."""
    own = [(k, flat.get(k)) for k in shown if flat.get(k) is not None and key_applies(k, method)]
    return (*own, *((k, sig[k]) for k in vary if k in sig and k not in shown))


def _setting(key: str, value: Any, digits: int | None) -> str:
    """A setting in a label; a `schedule` (a PBT trial's, a replay's) as its number of steps and a short
    digest of them: the row is its own, and the schedule itself is in the record."""
    if key != "schedule":
        return format_value(value, digits)
    if not value:
        return "none"
    import hashlib
    import json

    try:
        steps = json.loads(value) if isinstance(value, str) else value
    except ValueError:
        steps = [value]
    digest = hashlib.sha1(repr(value).encode()).hexdigest()[:6]
    return f"{len(steps)} step{'s' if len(steps) != 1 else ''} #{digest}"


def _texts(head: list, settings: list[tuple]) -> tuple[list, dict]:
    """Labels (the value itself when nothing is added) with as many digits as tell them apart, and their
    sort keys (by value, then by the settings' values)."""
    distinct = set(zip(head, settings))
    for digits in (6, None):
        def text(h: Any, s: tuple) -> Any:
            settings = ", ".join(f"{k}={_setting(k, v, digits)}" for k, v in s)
            return f"{_label(h)} ({settings})" if s else h

        if len({text(h, s) for h, s in distinct}) == len(distinct) or digits is None:
            break
    order = {text(h, s): (_sort_key(h), tuple((k, _sort_key(v)) for k, v in s)) for h, s in distinct}
    return [text(h, s) for h, s in zip(head, settings)], order


# -- cells


def _stats(values: Iterable[Any]) -> Cell | None:
    # statistics.mean/stdev sum exactly (fractions): three runs at 0.95 give 0.95 and 0, not 0.9499... and
    # 1e-16.
    vals = [float(v) for v in map(_plain, values)  # a non-number in `final` is no score
            if isinstance(v, Number) and not isinstance(v, bool) and not math.isnan(v)]
    if not vals:
        return None
    std = statistics.stdev(vals) if len(vals) > 1 else math.nan
    return Cell(float(statistics.mean(vals)), std, len(vals))


def _run_cells(axes: _Axes, metrics: tuple[str, ...]) -> dict[tuple, Cell]:
    cells: dict[tuple, Cell] = {}
    for (r, c), group in axes.runs.groupby(["_row", "_col"], sort=False, dropna=False):
        for m in metrics:
            cell = _stats(group[m])
            if cell is not None:
                cells[(_plain(r), _plain(c), m)] = cell
    return cells


def _depends(key: str, name: str = "random-init") -> bool:
    """Whether reference `name` changes with `key` (a data set does; a learning rate does not)."""
    return key in reference_key_columns(name, [key])


def _reference_cells(refs: pd.DataFrame, axes: _Axes, metrics: tuple[str, ...],
                     cells: dict[tuple, Cell]) -> tuple[str, tuple[str, ...]]:
    """References along the axis of `method`, grouped on the other axis when they depend on its key;
    adds their cells and returns (that axis, the references present)."""
    rows, cols = axes.row_keys[0], axes.col_keys[0]
    if _leads_with_method(axes.col_keys):
        axis = "cols"
    elif _leads_with_method(axes.row_keys):
        axis = "rows"
    else:
        axis = "cols" if _depends(rows) and not _depends(cols) else "rows"
    other_key, others = (cols, axes.col_labels) if axis == "rows" else (rows, axes.row_labels)
    names = sorted({str(n) for n in refs["method"]},
                   key=lambda n: (REFERENCES.index(n) if n in REFERENCES else len(REFERENCES), n))
    for name in names:
        mine = refs[refs["method"] == name]
        for o in others:
            part = mine
            if _depends(other_key, name):
                part = mine[[_plain(v) == axes.heads[o] for v in mine[other_key]]]
            for m in metrics:
                cell = _stats(part[m]) if m in part.columns else None
                if cell is not None:
                    cells[(name, o, m) if axis == "rows" else (o, name, m)] = cell
    present = tuple(n for n in names if any((k[0] if axis == "rows" else k[1]) == n for k in cells))
    return axis, present


def _best(cells: dict[tuple, Cell], axes: _Axes, metrics: tuple[str, ...], mode: Mode) -> frozenset:
    """Best per column and metric, among the method rows, at the printed precision (ties all count)."""
    best = set()
    for c in axes.col_labels:
        for m in metrics:
            direction = _resolve_mode(mode, m)
            shown = {r: float(_number(m, cells[(r, c, m)].mean))
                     for r in axes.row_labels if (r, c, m) in cells}
            if direction is None or len(shown) < 2:
                continue
            target = (max if direction == "max" else min)(shown.values())
            best |= {(r, c, m) for r, v in shown.items() if v == target}
    return frozenset(best)
