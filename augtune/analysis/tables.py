"""A `load_runs` frame -> the comparison table papers print -> CSV, Markdown or LaTeX.

`comparison_table` groups the runs by two columns (`rows` x `cols`, any column: `method`,
`dataset`, `train.lr`, `pinda.mu`, ...) and gives, per cell and metric, the mean, the sample
standard deviation over the runs in it (ddof=1; undefined, so left blank, when n = 1) and n.
An axis may combine columns, `method,pinda.mu`: rows `simclr+pinda (pinda.mu=zero)`, and `simclr`
for the runs that do not read `pinda.mu`.

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
                                    UnknownColumnError, UnknownMetricError, metric_columns,
                                    reference_key_columns)

FRACTION_SUFFIXES = ("_acc", "_nmi", "_ari")  # in [0, 1]; printed as percentages
# mode="auto": higher is better, except these (None: no "best" to mark, e.g. a cluster count).
AUTO_MODES: dict[str, str | None] = {"loss": "min", "epoch_time_s": "min", "cluster_k": None}
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
                    lines.append({self.rows: _label(r, blank_none=True), self.cols: _label(c, blank_none=True),
                                  "metric": m, "mean": cell.mean, "std": cell.std, "n": cell.n,
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
        return f"{', '.join(self.metrics)}{unit}: mean ± std (n runs){bold}"

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
            out.append(" & ".join([_latex(self.rows), *(_latex(self._header(c)) for c in self.col_labels)]) + " \\\\")
        else:
            out.append(" & ".join(["", *(f"\\multicolumn{{{k}}}{{c}}{{{_latex(self._header(c))}}}"
                                         for c in self.col_labels)]) + " \\\\")
            out.append(" ".join(f"\\cmidrule(lr){{{2 + i * k}-{1 + (i + 1) * k}}}" for i in range(ncols)))
            out.append(" & ".join([_latex(self.rows), *(_latex(m) for _ in self.col_labels for m in self.metrics)])
                       + " \\\\")
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
    if value is None:
        return "" if blank_none else "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, tuple):
        return "[" + ", ".join(_label(v) for v in value) + "]"
    return str(value)


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
# The table


def _check_column(df: pd.DataFrame, axis: str, key: str) -> None:
    if key in df.columns:
        return
    close = difflib.get_close_matches(key, [str(c) for c in df.columns], n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    raise UnknownColumnError(f"{axis}: no column {key!r} in these runs{hint}; use method, dataset, seed, "
                             f"experiment or a dotted config key such as train.lr")


def _combined_column(df: pd.DataFrame, axis: str, spec: str) -> tuple[pd.DataFrame, str]:
    """`method,pinda.mu` -> a column of labels such as `simclr+pinda (pinda.mu=zero)`.

    The first key names the group; each further key is added as `key=value` where the run reads it
    (`config.key_applies`: `pinda.*` only for runs with PiNDA), so that a plain SimCLR row is not split
    by a default it ignores. A single key is checked and returned as it is.
    """
    keys = [k.strip() for k in spec.split(",") if k.strip()]
    if not keys:
        raise UnknownColumnError(f"{axis}: no column named")
    for key in keys:
        _check_column(df, axis, key)
    if len(keys) == 1:
        return df, keys[0]
    from augtune.config import key_applies

    def label(row: pd.Series) -> Any:
        head = _plain(row[keys[0]])
        method = str(row.get("method", ""))
        extra = [f"{k}={_label(_plain(row[k]))}" for k in keys[1:]
                 if _plain(row[k]) is not None and key_applies(k, method)]
        if head is None or not extra:
            return head
        return f"{_label(head)} ({', '.join(extra)})"

    name = ",".join(keys)
    df = df.copy()
    df[name] = [label(row) for _, row in df.iterrows()]
    return df, name


def _leads_with_method(spec: str) -> bool:
    return spec.split(",")[0] == "method"


def _unfinished(runs: pd.DataFrame) -> str:
    experiments = ", ".join(dict.fromkeys(str(e) for e in runs["experiment"]))
    counts = Counter("unknown" if _plain(s) is None else str(s) for s in runs["status"])
    order = ["running", "failed", *sorted(s for s in counts if s not in ("running", "failed"))]
    parts = ", ".join(f"{counts[s]} {s}" for s in order if counts[s])
    return f"no finished runs in {experiments}: {parts}"


def _resolve_mode(mode: Mode, metric: str) -> str | None:
    m = mode.get(metric, "auto") if isinstance(mode, Mapping) else mode
    if m == "auto":
        m = "min" if metric.startswith("loss_") else AUTO_MODES.get(metric, "max")
    if m not in ("max", "min", None):
        raise ValueError(f"mode for {metric}: expected 'max', 'min', 'auto' or None, got {m!r}")
    return m


def _stats(values: Iterable[Any]) -> Cell | None:
    # statistics.mean/stdev sum exactly (fractions): three runs at 0.95 give 0.95 and 0, not 0.9499... and 1e-16.
    vals = [float(v) for v in map(_plain, values)  # a non-number in `final` is no score
            if isinstance(v, Number) and not isinstance(v, bool) and not math.isnan(v)]
    if not vals:
        return None
    return Cell(float(statistics.mean(vals)), statistics.stdev(vals) if len(vals) > 1 else math.nan, len(vals))


def _distinct_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per distinct run: two runs whose configs differ only in keys neither reads (a grid's
    `nrcc.negatives` crossed with a plain SimCLR run, `pinda.mu` with a CLAE run) trained the same
    thing with the same seed, so the table counts it once (the first by run folder)."""
    from augtune.config import key_applies

    keys = [c for c in runs.columns if "." in c]
    if runs.empty or not keys:
        return runs
    ordered = runs.sort_values("run") if "run" in runs.columns else runs
    seen, keep = set(), []
    for i, (_, row) in enumerate(ordered.iterrows()):
        method = str(row.get("method", ""))
        signature = (method, repr(_plain(row.get("dataset"))), repr(_plain(row.get("seed"))),
                     tuple((k, repr(_plain(row[k]))) for k in keys if key_applies(k, method)))
        if signature not in seen:
            seen.add(signature)
            keep.append(i)
    return ordered.iloc[keep].sort_index()


def comparison_table(df: pd.DataFrame, rows: str = "method", cols: str = "dataset",
                     metrics: Iterable[str] | str = ("knn_acc",), only_completed: bool = True,
                     mode: Mode = "auto") -> ComparisonTable:
    """Mean, std and n of each metric over the runs in each (rows, cols) group of a `load_runs` frame.

    `metrics`: names, or one comma-separated string. `only_completed`: leave out running and failed
    runs (and references measured only by them). `mode`: "auto" (higher is better except
    `AUTO_MODES` and `loss_*`), "max", "min", None (no bold), or a mapping metric -> one of these.
    """
    if isinstance(metrics, str):
        metrics = [m.strip() for m in metrics.split(",")]
    metrics = tuple(dict.fromkeys(m for m in metrics if m))
    df, rows = _combined_column(df, "rows", rows)
    df, cols = _combined_column(df, "cols", cols)
    if rows == cols:
        raise AnalysisError(f"rows and cols are both {rows!r}: pick two different columns")
    kind = df["kind"] if "kind" in df.columns else pd.Series("run", index=df.index)
    runs, refs = df[kind == "run"], df[kind == "reference"]
    if runs.empty:
        raise NoFinishedRunsError("no runs to tabulate (only reference rows)")
    if only_completed:
        if not (runs["status"] == "completed").any():
            raise NoFinishedRunsError(_unfinished(runs))
        runs, refs = runs[runs["status"] == "completed"], refs[refs["status"] == "completed"]
    runs = _distinct_runs(runs)
    available = [m for m in metric_columns(df) if runs[m].notna().any()]
    for m in metrics:
        if m not in available:
            raise UnknownMetricError(f"no run reports metric {m!r} (available: {', '.join(available) or 'none'})")
    if not metrics:
        raise UnknownMetricError(f"no metric asked for (available: {', '.join(available) or 'none'})")
    if not {rows, cols} & {"dataset", "dataset.name"}:
        datasets = sorted({str(d) for d in runs["dataset"] if _plain(d) is not None})
        if len(datasets) > 1:
            raise MixedDatasetsError(f"these runs span datasets {', '.join(datasets)}: put dataset in --rows or "
                                     f"--cols, or pass one experiment per dataset")
    for m in metrics:
        _resolve_mode(mode, m)  # refuse a bad mode before any work

    # Method rows x columns.
    groups: dict[tuple, list[int]] = {}
    for i, (r, c) in enumerate(zip(runs[rows], runs[cols])):
        groups.setdefault((_plain(r), _plain(c)), []).append(i)
    row_labels = sorted({r for r, _ in groups}, key=_sort_key)
    col_labels = sorted({c for _, c in groups}, key=_sort_key)
    cells: dict[tuple, Cell] = {}
    for (r, c), idx in groups.items():
        for m in metrics:
            cell = _stats(runs[m].iloc[idx])
            if cell is not None:
                cells[(r, c, m)] = cell

    # References, along the axis of `method`; grouped on the other axis when they depend on its key.
    def depends(key: str, name: str = "random-init") -> bool:
        return key in reference_key_columns(name, [key])

    if _leads_with_method(cols):
        axis = "cols"
    elif _leads_with_method(rows):
        axis = "rows"
    else:
        axis = "cols" if depends(rows) and not depends(cols) else "rows"
    other_key, others = (cols, col_labels) if axis == "rows" else (rows, row_labels)
    names = sorted({str(n) for n in refs["method"]},
                   key=lambda n: (REFERENCES.index(n) if n in REFERENCES else len(REFERENCES), n))
    for name in names:
        mine = refs[refs["method"] == name]
        for o in others:
            part = mine[[_plain(v) == o for v in mine[other_key]]] if depends(other_key, name) else mine
            for m in metrics:
                cell = _stats(part[m]) if m in part.columns else None
                if cell is not None:
                    cells[(name, o, m) if axis == "rows" else (o, name, m)] = cell
    present = tuple(n for n in names if any((k[0] if axis == "rows" else k[1]) == n for k in cells))
    if axis == "rows":
        row_labels += list(present)
    else:
        col_labels += list(present)

    # Best per column and metric, among method rows, at the printed precision.
    best = set()
    run_rows = [r for r in row_labels if not (axis == "rows" and r in present)]
    run_cols = [c for c in col_labels if not (axis == "cols" and c in present)]
    for c in run_cols:
        for m in metrics:
            direction = _resolve_mode(mode, m)
            shown = {r: float(_number(m, cells[(r, c, m)].mean)) for r in run_rows if (r, c, m) in cells}
            if direction is None or len(shown) < 2:
                continue
            target = (max if direction == "max" else min)(shown.values())
            best |= {(r, c, m) for r, v in shown.items() if v == target}

    return ComparisonTable(rows=rows, cols=cols, metrics=metrics, row_labels=row_labels, col_labels=col_labels,
                           references=present, reference_axis=axis, cells=cells, best=frozenset(best))
