"""The verdict of `augtune compare`, made from records on disk: which entrant wins and whether the win
is real.

One row per entrant: mean ± std over the repeat seeds (n), per metric. Each row is tested against the
best row of that metric: a paired t-test over the seeds both share (scipy.stats.ttest_rel) when every
row shares at least two seeds with the best, else Welch's t-test (ttest_ind, equal_var=False); two-sided;
the p-values of a metric are corrected across the tested rows with Holm's step-down method. Bold goes
to the best row and to the rows a test finds not significantly worse than it (Holm p >= alpha). A row
with n = 1 (or every row, when the best has n = 1) can carry no test: it says "untested (n = 1)" and is
not bold. An entrant whose own diagnostics say it did not train (the SANITY rules) is flagged with the
reason, never bold, never named the winner, and not tested: it is not in Holm's family. Reference rows
(`raw`, `random-init`) come below; the sentence says whether anything beats the raw input.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np
import pandas as pd
from scipy import stats

# (diagnostic key in a record's final metrics, predicate on its value that means "did not train", reason)
SANITY: list[tuple[str, Callable[[float], bool], str]] = [
    ("diffaug_gen_std_ratio", lambda v: not 0.5 <= v <= 2.0,
     "generated positives' spread {v:.2f}x the data's"),
    ("diffaug_generator_steps", lambda v: v < 200, "generator barely trained: {v:.0f} updates"),
    ("pinda_noise_norm", lambda v: v < 1e-3, "pi-noise collapsed (mean norm {v:.2g})"),
]


def holm(p: list[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the input's order (monotone, capped at 1)."""
    order = sorted(range(len(p)), key=lambda i: p[i])
    out, running = [1.0] * len(p), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(p) - rank) * p[i]))
        out[i] = running
    return out


@dataclass
class Cell:
    mean: float
    std: float
    n: int
    seeds: dict[int, float] = field(default_factory=dict)
    p: Optional[float] = None  # raw p-value against the best row (None: the best itself, or untested)
    p_holm: Optional[float] = None
    bold: bool = False
    note: str = ""  # "best", "untested (n = 1)", "p = 0.003" ...


@dataclass
class Row:
    entrant: str
    cells: dict[str, Cell]
    flag: str = ""  # why the entrant's own diagnostics say it did not train ("" when fine)
    epoch_time: float = float("nan")  # mean seconds per epoch over its repeat runs
    relative_cost: float = float("nan")  # epoch time / the plain base's
    compute_s: float = float("nan")  # seconds of training over all its runs (search and repeat)


@dataclass
class Verdict:
    rows: list[Row]
    references: dict[str, dict[str, float]]
    metrics: tuple[str, ...]
    test: str  # "paired t-test over the shared seeds" or "Welch's t-test"
    alpha: float = 0.05
    unfinished: bool = False

    def best(self, metric: str) -> Optional[Row]:
        ok = [r for r in self.rows
              if not r.flag and metric in r.cells and math.isfinite(r.cells[metric].mean)]
        return max(ok, key=lambda r: r.cells[metric].mean) if ok else None

    # -- words ------------------------------------------------------------------------------------

    def sentences(self) -> list[str]:
        return [self._sentence(m) for m in self.metrics]

    def _sentence(self, m: str) -> str:
        best = self.best(m)
        if best is None:
            return f"{m}: no entrant has a value."
        c = best.cells[m]
        text = f"{m}: {best.entrant} is best ({100 * c.mean:.2f} ± {100 * c.std:.2f}, n = {c.n})"
        text += "; with n = 1 nothing can be tested" if c.n < 2 else self._others(best, m)
        text += self._against_raw(c, m)
        flagged = [f"{r.entrant} ({r.flag})" for r in self.rows if r.flag]
        return text + (f". Not ranked: {'; '.join(flagged)}" if flagged else "") + "."

    def _others(self, best: Row, m: str) -> str:
        # flagged entrants are said apart
        others = [r for r in self.rows if r is not best and m in r.cells and not r.flag]
        tied = [r.entrant for r in others if r.cells[m].bold]
        worse = [r.entrant for r in others if r.cells[m].p_holm is not None and not r.cells[m].bold]
        untested = [r.entrant for r in others if r.cells[m].note.startswith("untested")]
        text = ""
        if tied:
            verb = "is" if len(tied) == 1 else "are"
            text += f"; {', '.join(tied)} {verb} not distinguishable from it (Holm p >= {self.alpha:g})"
        if worse:
            text += f"; {', '.join(worse)} {'is' if len(worse) == 1 else 'are'} significantly worse"
        if untested:
            text += f"; {', '.join(untested)} cannot be tested (n = 1)"
        return text

    def _against_raw(self, c: Cell, m: str) -> str:
        raw = self.references.get("raw", {}).get(m)
        if raw is None or not math.isfinite(raw):
            return ""
        if c.mean <= raw:
            return f"; nothing beats the raw input ({100 * raw:.2f})"
        if c.n >= 2 and _one_sample_p(c, raw) < self.alpha:
            return f"; it beats the raw input ({100 * raw:.2f}, p < {self.alpha:g})"
        return f"; it is above the raw input ({100 * raw:.2f}) but not significantly"

    def caption(self) -> str:
        head = "unfinished experiment: " if self.unfinished else ""
        return (f"{head}mean ± std over the repeat seeds (n), in %; each row against the best of its column "
                f"by a {self.test}, two-sided, Holm-corrected across the tested rows; bold: the best and the "
                f"rows not significantly worse than it (alpha = {self.alpha:g}); a row with n = 1 is "
                "untested and not bold; a flagged entrant (its own diagnostics say it did not train) is "
                "neither tested nor bold; cost: epoch time relative to the plain base, and total training "
                "time of all the entrant's runs")

    # -- tables -----------------------------------------------------------------------------------

    def table(self) -> list[list[str]]:
        """Header and rows as strings (bold marked with **), references last."""
        head = ["entrant", *self.metrics, "cost (x base)", "compute", "note"]
        body = []
        for r in self.rows:
            cells = [_show(r.cells.get(m)) for m in self.metrics]
            note = r.flag or "; ".join(c.note for c in r.cells.values() if c.note.startswith("untested"))
            body.append([r.entrant, *cells, _num(r.relative_cost, "{:.2f}x"),
                         _num(r.compute_s / 60, "{:.1f} min"), note])
        for name, values in self.references.items():
            body.append([f"*{name}*", *[_num(100 * values[m], "{:.2f}") if m in values else "–"
                                        for m in self.metrics], "", "", "reference"])
        return [head, *body]

    def render(self, fmt: str = "md") -> str:
        rows = self.table()
        if fmt == "csv":
            import csv
            import io

            buf = io.StringIO()
            csv.writer(buf).writerows([[c.replace("**", "") for c in row] for row in rows])
            return buf.getvalue()
        if fmt == "latex":
            return _latex(rows, self.caption())
        lines = ["| " + " | ".join(rows[0]) + " |", "| :--- |" + " ---: |" * (len(rows[0]) - 2) + " :--- |"]
        lines += ["| " + " | ".join(row) + " |" for row in rows[1:]]
        return "\n".join([f"Table: {self.caption()}", "", *lines, "", *self.sentences()]) + "\n"


def _one_sample_p(c: Cell, value: float) -> float:
    x = np.array(list(c.seeds.values()))
    if len(x) < 2 or np.allclose(x, x[0]):
        return 0.0 if len(x) >= 2 and x[0] > value else 1.0
    return float(stats.ttest_1samp(x, value).pvalue)


def _show(c: Optional[Cell]) -> str:
    if c is None or not math.isfinite(c.mean):
        return "–"
    text = f"{100 * c.mean:.2f} ± {100 * c.std:.2f} ({c.n})"
    return f"**{text}**" if c.bold else text


def _num(v: float, fmt: str) -> str:
    return fmt.format(v) if isinstance(v, (int, float)) and math.isfinite(v) else "–"


def _latex(rows: list[list[str]], caption: str) -> str:
    def tex(cell: str) -> str:
        cell = cell.replace("±", r"$\pm$").replace("%", r"\%").replace("_", r"\_").replace("*reference*", "")
        if cell.startswith("**") and cell.endswith("**"):
            return r"\textbf{" + cell[2:-2] + "}"
        return cell.replace("*", "")

    cols = "l" + "r" * (len(rows[0]) - 2) + "l"
    out = ["% needs \\usepackage{booktabs}", r"\begin{table}", r"\centering", f"\\caption{{{tex(caption)}}}",
           f"\\begin{{tabular}}{{{cols}}}", r"\toprule", " & ".join(tex(c) for c in rows[0]) + r" \\",
           r"\midrule"]
    out += [" & ".join(tex(c) for c in row) + r" \\" for row in rows[1:]]
    out += [r"\bottomrule", r"\end{tabular}", r"\end{table}"]
    return "\n".join(out) + "\n"


# -- from records --------------------------------------------------------------------------------------

def _sanity(final: dict) -> str:
    for key, bad, reason in SANITY:
        v = final.get(key)
        if isinstance(v, (int, float)) and math.isfinite(v) and bad(v):
            return reason.format(v=v)
    return ""


def verdict(repeat: list[dict], metrics: tuple[str, ...], *, alpha: float = 0.05, search: list[dict] = (),
            unfinished: bool = False) -> Verdict:
    """The verdict from the repeat runs' records (and the search trials' records, for the cost)."""
    by_entrant: dict[str, list[dict]] = {}
    for r in repeat:
        if r.get("status") == "completed":
            by_entrant.setdefault(r.get("entrant") or r["method"], []).append(r)
    rows = [_row(name, runs, metrics) for name, runs in by_entrant.items()]
    seed_sets = [set(r.cells[m].seeds) for r in rows for m in metrics if m in r.cells]
    paired = bool(seed_sets) and len(set.intersection(*seed_sets)) >= 2  # every pair of rows shares them
    test = "paired t-test over the shared seeds" if paired else "Welch's t-test"
    for m in metrics:
        _mark(rows, m, alpha, paired)
    _costs(rows, repeat, list(search))
    refs = _references(repeat, metrics)
    return Verdict(sorted(rows, key=lambda r: r.entrant), refs, tuple(metrics), test, alpha, unfinished)


def _row(name: str, runs: list[dict], metrics: tuple[str, ...]) -> Row:
    cells = {}
    for m in metrics:
        seeds = {int(r["seed"]): float(r["final"][m]) for r in runs
                 if isinstance(r.get("final", {}).get(m), (int, float)) and math.isfinite(r["final"][m])}
        x = np.array(list(seeds.values()))
        cells[m] = Cell(float(x.mean()) if len(x) else float("nan"),
                        float(x.std(ddof=1)) if len(x) > 1 else 0.0, len(x), seeds)
    flag = next((f for f in (_sanity(r.get("final", {})) for r in runs) if f), "")
    return Row(name, cells, flag)


def _mark(rows: list[Row], m: str, alpha: float, paired: bool) -> None:
    """Bold, notes and p-values of metric `m`: the best row against every other ranked row; Holm's
    family is the rows actually tested (flagged entrants are not ranked, n = 1 rows cannot be tested)."""
    ok = [r for r in rows if not r.flag and m in r.cells and math.isfinite(r.cells[m].mean)]
    if not ok:
        return
    best = max(ok, key=lambda r: r.cells[m].mean)
    b = best.cells[m]
    b.bold, b.note = True, "best"
    tested = []
    for r in ok:
        c = r.cells[m]
        if r is best:
            continue
        if c.n < 2 or b.n < 2:
            c.bold, c.note = False, "untested (n = 1)"
            continue
        c.p = _p_value(b, c, paired)
        tested.append(c)
    for c, q in zip(tested, holm([c.p for c in tested])):
        c.p_holm = q
        c.bold = q >= alpha
        c.note = f"Holm p = {q:.3g}"


def _p_value(best: Cell, other: Cell, paired: bool) -> float:
    if paired:
        shared = sorted(set(best.seeds) & set(other.seeds))
        a, b = np.array([best.seeds[s] for s in shared]), np.array([other.seeds[s] for s in shared])
        if np.allclose(a - b, (a - b)[0]):  # a constant difference: the t statistic is undefined
            return 1.0 if np.allclose(a, b) else 0.0
        return float(stats.ttest_rel(a, b).pvalue)
    a, b = np.array(list(best.seeds.values())), np.array(list(other.seeds.values()))
    if np.allclose(a.std(), 0) and np.allclose(b.std(), 0):
        return 1.0 if np.isclose(a.mean(), b.mean()) else 0.0
    return float(stats.ttest_ind(a, b, equal_var=False).pvalue)


def _costs(rows: list[Row], repeat: list[dict], search: list[dict]) -> None:
    def epoch_times(records: list[dict], name: str) -> list[float]:
        return [e["epoch_time_s"] for r in records if (r.get("entrant") or r["method"]) == name
                for e in r.get("epochs", []) if isinstance(e.get("epoch_time_s"), (int, float))]

    for row in rows:
        t = epoch_times(repeat, row.entrant)
        row.epoch_time = float(np.mean(t)) if t else float("nan")
        row.compute_s = float(sum(t) + sum(epoch_times(search, row.entrant)))
    for row in rows:
        plain = next((r for r in rows if r.entrant == row.entrant.split("+")[0]), None)
        if plain is not None and plain.epoch_time > 0:
            row.relative_cost = row.epoch_time / plain.epoch_time


def _references(repeat: list[dict], metrics: tuple[str, ...]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, list[float]]] = {}
    for r in repeat:
        for name, values in (r.get("references") or {}).items():
            for m in metrics:
                if isinstance(values.get(m), (int, float)):
                    out.setdefault(name, {}).setdefault(m, []).append(float(values[m]))
    return {name: {m: float(np.mean(v)) for m, v in d.items()} for name, d in out.items()}


def load_compare_records(exp_dir) -> tuple[list[dict], list[dict]]:
    """(repeat records, search records) of a compare experiment folder, read without Ray."""
    import json
    from pathlib import Path

    def read(paths) -> list[dict]:
        out = []
        for p in sorted(paths):
            try:
                out.append(json.loads(Path(p).read_text()))
            except (OSError, ValueError):
                continue
        return out

    from augtune.records import COMPARE_REPEAT

    exp = Path(exp_dir)  # each entrant's search records are in <exp>/<entrant>/<trial>/
    search = [p for p in exp.glob("*/*/record.json") if p.parent.parent.name != COMPARE_REPEAT]
    return read(exp.glob(f"{COMPARE_REPEAT}/*/record.json")), read(search)


def frame(rows: list[Row], metrics: tuple[str, ...]) -> pd.DataFrame:
    """The verdict as a DataFrame (one row per entrant), for the report and for users' own plots."""
    return pd.DataFrame([{"entrant": r.entrant,
                          **{f"{m}_mean": r.cells[m].mean for m in metrics if m in r.cells},
                          **{f"{m}_std": r.cells[m].std for m in metrics if m in r.cells},
                          "epoch_time_s": r.epoch_time, "relative_cost": r.relative_cost, "flag": r.flag}
                         for r in rows])
