"""`EXP_DIR/report.html`: one self-contained page of a compare experiment, made from records on
disk.

The verdict table and its sentences, every entrant's seeds as points (paired across entrants, with
random-init's and the raw input), the race's rounds (who was eliminated when) when the repeat was a
race, each entrant's hyperparameter importances, accuracy against cost (one point per entrant,
error bars over the seeds), learning curves (mean over the repeat seeds with a band), the search
history (the metric per trial in order, with the best so far), and the methods' own figures of each
entrant's best repeat run. Images are inlined as base64 PNG data URIs; no script, no external
resource: the file can be mailed or opened from a copied folder.
"""
from __future__ import annotations

import base64
import html
import io
import math
from pathlib import Path

import numpy as np

from augtune.analysis.race import RaceState
from augtune.analysis.verdict import Verdict
from augtune.records import (COMPARE_REPEAT, FRACTION_SUFFIXES, RECORD_FILE, REPORT_FILE, searched_schedule,
                             write_atomic)


def _png(fig) -> str:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _img(src: str, alt: str) -> str:
    alt = html.escape(alt)
    return f'<figure><img src="{src}" alt="{alt}"><figcaption>{alt}</figcaption></figure>'


def _cost_figure(v: Verdict, metric: str) -> str:
    import matplotlib.pyplot as plt

    scale = 100 if metric.endswith(FRACTION_SUFFIXES) else 1  # in %, as the table; rankme is not
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    for r in v.rows:
        c = r.cells.get(metric)
        if c is None or not math.isfinite(c.mean) or not math.isfinite(r.epoch_time):
            continue
        ax.errorbar(r.epoch_time, scale * c.mean, yerr=scale * c.std, fmt="o", capsize=3,
                    label=r.entrant)
    ax.set_xlabel("seconds per epoch")
    ax.set_ylabel(f"{metric} (%)" if scale == 100 else metric)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False)
    return _png(fig)


def _seeds_figure(v: Verdict) -> str:
    """Every entrant's seeds as points, per metric: its mean as a bar, each seed at the same offset
    in every column and its values linked across the columns by a faint line (the tests pair them
    by seed), random-init's seeds beside them and the raw input as a dashed line. The entrant named
    best is drawn filled, the others hollow; an eliminated entrant's label says when."""
    import matplotlib.pyplot as plt

    metrics = list(v.metrics[:3])
    fig, axes = plt.subplots(1, len(metrics), figsize=(5.2 * len(metrics), 3.9), squeeze=False)
    for ax, m in zip(axes[0], metrics):
        scale = 100 if m.endswith(FRACTION_SUFFIXES) else 1
        columns = [(r.entrant + (f"\n(out: round {r.out_round})" if r.out_round else ""),
                    r.cells[m], r.cells[m].bold, f"C{i % 10}") for i, r in enumerate(v.rows)
                   if m in r.cells and r.cells[m].n]
        ref = v.reference_cells.get("random-init", {}).get(m)
        if ref is not None and ref.n:
            columns.append(("random-init", ref, False, "0.45"))
        seeds = sorted({s for _, c, _, _ in columns for s in c.seeds})
        offset = {s: (i / (len(seeds) - 1) - 0.5) * 0.3 if len(seeds) > 1 else 0.0
                  for i, s in enumerate(seeds)}
        for s in seeds:  # the pairing: one seed's values across the columns
            xs = [i for i, (_, c, _, _) in enumerate(columns) if s in c.seeds]
            ax.plot([i + offset[s] for i in xs], [scale * columns[i][1].seeds[s] for i in xs],
                    color="0.88", lw=0.6, zorder=1)
        for i, (_, c, bold, color) in enumerate(columns):
            ax.scatter([i + offset[s] for s in c.seeds], [scale * y for y in c.seeds.values()],
                       s=22, zorder=3, facecolors=color if bold else "none", edgecolors=color)
            ax.hlines(scale * c.mean, i - 0.25, i + 0.25, color=color, lw=2, zorder=2)
        raw = v.references.get("raw", {}).get(m)
        if raw is not None and math.isfinite(raw):
            ax.axhline(scale * raw, color="0.3", ls="--", lw=1,
                       label=f"raw input ({scale * raw:.2f})")
            ax.legend(fontsize=7, loc="best", frameon=False)
        ax.set_xticks(range(len(columns)))
        ax.set_xticklabels([name for name, _, _, _ in columns], rotation=30, ha="right",
                           fontsize=8)
        ax.set_ylabel(f"{m} (%)" if scale == 100 else m)
        ax.set_title(f"{m}: one point per seed, a bar at the mean", fontsize=9)
    return _png(fig)


def _race_figure(race: RaceState) -> str:
    """Each candidate's running mean after every round it raced, an x where it was eliminated; one
    colour per entrant (as in the seeds' figure), solid for its best configuration, dashed for the
    next."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    s = race.settings
    scale = 100 if s.metric.endswith(FRACTION_SUFFIXES) else 1
    colour = {e: f"C{i % 10}" for i, e in enumerate(sorted({c.entrant for c in race.candidates}))}
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    for c in race.candidates:
        got = race.results.get(c.id, {})
        last = race.rounds[c.out_round - 1].n if c.out_round else race.n
        ns = [r.n for r in race.rounds if r.n <= last and all(k in got for k in s.seeds[:r.n])]
        if not ns:
            continue
        ys = [scale * np.mean([got[k] for k in s.seeds[:n]]) for n in ns]
        rank = c.id.rsplit("#", 1)[-1]
        ax.plot(ns, ys, marker=".", color=colour[c.entrant], label=c.id,
                ls="-" if rank in ("1", c.id) else "--")
        if c.status == "eliminated":
            ax.plot(ns[-1], ys[-1], "x", color=colour[c.entrant], ms=9, mew=2)
    ax.set_xlabel("seeds (n) at each round's test")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel(f"mean {s.metric}" + (" (%)" if scale == 100 else ""))
    ax.set_title("the race: x marks an elimination", fontsize=9)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False)
    return _png(fig)


def _race_html(race: RaceState) -> list[str]:
    from augtune.analysis.race import history

    return ["<h2>The race</h2>",
            "<ol>" + "".join(f"<li>{html.escape(line)}</li>" for line in history(race)) + "</ol>",
            _img(_race_figure(race), "each candidate's mean after every round")]


def _curves_figure(repeat: list[dict], metric: str) -> str:
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    groups: dict[str, list[dict]] = {}
    for r in repeat:
        groups.setdefault(r.get("entrant") or r["method"], []).append(r)
    percent = metric.endswith(FRACTION_SUFFIXES)  # in %, as the table is
    scale = {"loss": 1.0, metric: 100.0 if percent else 1.0}
    for name, runs in sorted(groups.items()):
        for ax, key in zip(axes, ("loss", metric)):
            curves = [[scale[key] * v if isinstance(v := e.get(key), (int, float)) else np.nan
                       for e in r.get("epochs", [])] for r in runs]
            n = min(len(c) for c in curves) if curves else 0
            if n == 0:
                continue
            y = np.array([c[:n] for c in curves], dtype=float)
            x = np.arange(1, n + 1)
            mask = ~np.all(np.isnan(y), axis=0)
            mean, std = np.nanmean(y[:, mask], axis=0), np.nanstd(y[:, mask], axis=0)
            ax.plot(x[mask], mean, marker=".", label=name)
            ax.fill_between(x[mask], mean - std, mean + std, alpha=0.2)
    for ax, key in zip(axes, ("loss", metric)):
        ax.set_xlabel("epoch")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel(f"{key} (%)" if key == metric and percent else key)
    axes[1].legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False)
    return _png(fig)


def _history_figure(search: list[dict], metric: str, mode: str) -> str:
    """One small panel per entrant (a shared y axis): each trial's value and the best so far. In one
    shared panel, entrants whose best-so-far lines coincide hid each other (NRCC's under PiNDA's)."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    groups: dict[str, list[tuple[str, float]]] = {}
    for r in search:
        values = [e[metric] for e in r.get("epochs", [])
                  if isinstance(e.get(metric), (int, float))]
        if values:
            groups.setdefault(r.get("entrant") or r["method"], []).append(
                (r.get("started", ""), values[-1]))
    if not groups:  # trials that reported no value of the metric: nothing to draw
        fig, ax = plt.subplots(figsize=(5.5, 3.6))
        ax.set_xlabel("trial (in the order it started)")
        ax.set_ylabel(f"{metric} (last reported)")
        return _png(fig)
    cols = min(len(groups), 4)
    rows = -(-len(groups) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(2.6 * cols, 2.3 * rows), sharey=True, squeeze=False)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for k, (name, trials) in enumerate(sorted(groups.items())):
        ax = axes[k // cols, k % cols]
        y = [v for _, v in sorted(trials)]
        best = np.maximum.accumulate(y) if mode == "max" else np.minimum.accumulate(y)
        x = range(1, len(y) + 1)
        colour = colours[k % len(colours)]
        ax.plot(x, y, "o", alpha=0.5, color=colour, label="a trial")
        ax.plot(x, best, "-", color=colour, label="best so far")
        ax.set_title(name, fontsize=9)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # trials are counted: no 1.25th trial
        if k // cols == rows - 1 or k + cols >= len(groups):
            ax.set_xlabel("trial (in order)", fontsize=8)
        if k % cols == 0:
            ax.set_ylabel(f"{metric} (last reported)", fontsize=8)
    for k in range(len(groups), rows * cols):
        axes[k // cols, k % cols].axis("off")
    axes[0, 0].legend(fontsize=7, frameon=False)
    fig.tight_layout()  # a panel's title clear of the tick labels of the row above
    return _png(fig)


def _schedule_figures(search: list[dict]) -> list[str]:
    """Each PBT entrant's population: its knobs' values per epoch, one line per trial, exploits marked
    (`augtune.analysis.schedules`); nothing when no entrant searched for a schedule."""
    from augtune.analysis.frame import AnalysisError
    from augtune.analysis.schedules import figure

    groups: dict[str, list] = {}
    for r in search:
        if searched_schedule(r.get("config")):
            groups.setdefault(str(r.get("entrant") or r.get("method")), []).append(r)
    out = []
    for name, records in groups.items():
        try:
            out.append(_img(_png(figure(records)), f"{name}: each trial's schedule (a triangle: it copied "
                                                   "another after this epoch)"))
        except AnalysisError as e:
            out.append(f"<p>{html.escape(name)}: {html.escape(str(e))}</p>")
    return ["<h2>Schedules</h2>", *out] if out else []


def _own_figures(exp_dir: Path, repeat: list[dict]) -> list[str]:
    """Each entrant's figures of its first repeat run (the records list them relative to their
    folder)."""
    out, seen = [], set()
    for folder in sorted((exp_dir / COMPARE_REPEAT).glob("*/")):
        record_path = folder / RECORD_FILE
        if not record_path.is_file():
            continue
        from augtune.records import read_record

        try:
            record = read_record(record_path)
        except (OSError, ValueError):
            continue
        name = record.get("entrant") or record.get("method")
        if name in seen:
            continue
        for rel in record.get("figures", []):
            path = folder / rel
            if path.suffix == ".png" and path.is_file():
                src = "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode()
                out.append(_img(src, f"{name}: {Path(rel).name}"))
                seen.add(name)
    return out


STYLE = """body{font-family:sans-serif;max-width:1100px;margin:2em auto;color:#222}
table{border-collapse:collapse;font-size:14px}
td,th{border-bottom:1px solid #ccc;padding:4px 8px;text-align:right}
td:first-child,th:first-child{text-align:left}
figure{display:inline-block;margin:1em}img{max-width:100%}
.note{color:#555;font-size:13px}
.answer{font-size:17px;font-weight:600;max-width:60em}"""


def write_report(exp_dir: Path, verdict: Verdict, repeat: list[dict], search: list[dict],
                 importances: dict[str, str], *, title: str = "", mode: str = "max",
                 out: Path | None = None) -> Path:
    """The report of a compare experiment; returns its path (`exp_dir/report.html` by default)."""
    import matplotlib

    matplotlib.use("Agg")
    exp_dir = Path(exp_dir)
    metric = verdict.metrics[0]
    parts = [f"<h1>{html.escape(title or exp_dir.name)}</h1>",
             f'<p class="answer">{html.escape(verdict.plainly())}</p>',  # the answer first, then its table
             verdict.table_html(), f'<p class="note">{html.escape(verdict.caption())}</p>',
             "<ul>" + "".join(f"<li>{html.escape(s)}</li>" for s in verdict.sentences()) + "</ul>",
             "<h2>Every seed</h2>", _img(_seeds_figure(verdict), "each entrant's seeds as points"),
             *(_race_html(verdict.race) if verdict.race is not None else []),
             "<h2>Which hyperparameters mattered</h2>",
             "<ul>" + "".join(f"<li>{html.escape(t)}</li>" for t in importances.values())
             + "</ul>",
             f"<h2>{'Accuracy' if metric.endswith(FRACTION_SUFFIXES) else metric.capitalize()} "
             "against cost</h2>",
             _img(_cost_figure(verdict, metric), f"{metric} against epoch time"),
             "<h2>Learning curves</h2>",
             _img(_curves_figure(repeat, metric), "loss and metric per epoch"),
             "<h2>Search history</h2>",
             _img(_history_figure(search, metric, mode), "each entrant's trials") if search
             else "<p>no search trial recorded</p>",
             *_schedule_figures(search),
             "<h2>The methods' own figures</h2>",
             *(_own_figures(exp_dir, repeat) or ["<p>none drawn</p>"])]
    name = html.escape(title or exp_dir.name)
    page = (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{name}"
            f"</title><style>{STYLE}</style></head><body>{''.join(parts)}</body></html>")
    path = Path(out or exp_dir / REPORT_FILE)
    write_atomic(path, page)  # a link planted at report.html is refused, never written through
    return path
