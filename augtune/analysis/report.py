"""`EXP_DIR/report.html`: one self-contained page of a compare experiment, made from records on disk.

The verdict table and its sentences, each entrant's hyperparameter importances, accuracy against
cost (one point per entrant, error bars over the seeds), learning curves (mean over the repeat seeds
with a band), the search history (the metric per trial in order, with the best so far), and the
methods' own figures of each entrant's best repeat run. Images are inlined as base64 PNG data URIs;
no script, no external resource: the file can be mailed or opened from a copied folder.
"""
from __future__ import annotations

import base64
import html
import io
import math
from pathlib import Path

import numpy as np

from augtune.analysis.verdict import Verdict
from augtune.records import COMPARE_REPEAT, RECORD_FILE, REPORT_FILE


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

    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    for r in v.rows:
        c = r.cells.get(metric)
        if c is None or not math.isfinite(c.mean) or not math.isfinite(r.epoch_time):
            continue
        ax.errorbar(r.epoch_time, 100 * c.mean, yerr=100 * c.std, fmt="o", capsize=3, label=r.entrant)
    ax.set_xlabel("seconds per epoch")
    ax.set_ylabel(f"{metric} (%)")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False)
    return _png(fig)


def _curves_figure(repeat: list[dict], metric: str) -> str:
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    groups: dict[str, list[dict]] = {}
    for r in repeat:
        groups.setdefault(r.get("entrant") or r["method"], []).append(r)
    for name, runs in sorted(groups.items()):
        for ax, key in zip(axes, ("loss", metric)):
            curves = [[e.get(key, np.nan) for e in r.get("epochs", [])] for r in runs]
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
        ax.set_ylabel(key)
    axes[1].legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False)
    return _png(fig)


def _history_figure(search: list[dict], metric: str, mode: str) -> str:
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    groups: dict[str, list[tuple[str, float]]] = {}
    for r in search:
        values = [e[metric] for e in r.get("epochs", []) if isinstance(e.get(metric), (int, float))]
        if values:
            groups.setdefault(r.get("entrant") or r["method"], []).append((r.get("started", ""), values[-1]))
    for name, trials in sorted(groups.items()):
        y = [v for _, v in sorted(trials)]
        best = np.maximum.accumulate(y) if mode == "max" else np.minimum.accumulate(y)
        line = ax.plot(range(1, len(y) + 1), y, "o", alpha=0.5)[0]
        ax.plot(range(1, len(y) + 1), best, "-", color=line.get_color(), label=name)
    ax.set_xlabel("trial (in the order it started)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # trials are counted: no 1.25th trial
    ax.set_ylabel(f"{metric} (last reported)")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False)
    return _png(fig)


def _table_html(v: Verdict) -> str:
    rows = v.table()
    out = ["<table>", "<tr>" + "".join(f"<th>{html.escape(c)}</th>" for c in rows[0]) + "</tr>"]
    for row in rows[1:]:
        cells = []
        for c in row:
            bold = c.startswith("**") and c.endswith("**")
            text = html.escape(c.strip("*"))
            cells.append(f"<td><b>{text}</b></td>" if bold else f"<td>{text}</td>")
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</table>")
    return "\n".join(out)


def _own_figures(exp_dir: Path, repeat: list[dict]) -> list[str]:
    """Each entrant's figures of its first repeat run (the records list them relative to their folder)."""
    out, seen = [], set()
    for folder in sorted((exp_dir / COMPARE_REPEAT).glob("*/")):
        record_path = folder / RECORD_FILE
        if not record_path.is_file():
            continue
        import json

        try:
            record = json.loads(record_path.read_text())
        except ValueError:
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
td:first-child,th:first-child{text-align:left}figure{display:inline-block;margin:1em}img{max-width:100%}
.note{color:#555;font-size:13px}"""


def write_report(exp_dir: Path, verdict: Verdict, repeat: list[dict], search: list[dict],
                 importances: dict[str, str], *, title: str = "", mode: str = "max",
                 out: Path | None = None) -> Path:
    """The report of a compare experiment; returns its path (`exp_dir/report.html` by default)."""
    import matplotlib

    matplotlib.use("Agg")
    exp_dir = Path(exp_dir)
    metric = verdict.metrics[0]
    parts = [f"<h1>{html.escape(title or exp_dir.name)}</h1>",
             f'<p class="note">{html.escape(verdict.caption())}</p>', _table_html(verdict),
             "<ul>" + "".join(f"<li>{html.escape(s)}</li>" for s in verdict.sentences()) + "</ul>",
             "<h2>Which hyperparameters mattered</h2>",
             "<ul>" + "".join(f"<li>{html.escape(t)}</li>" for t in importances.values()) + "</ul>",
             "<h2>Accuracy against cost</h2>",
             _img(_cost_figure(verdict, metric), f"{metric} against epoch time"),
             "<h2>Learning curves</h2>", _img(_curves_figure(repeat, metric), "loss and metric per epoch"),
             "<h2>Search history</h2>", _img(_history_figure(search, metric, mode), "each entrant's trials"),
             "<h2>The methods' own figures</h2>", *(_own_figures(exp_dir, repeat) or ["<p>none drawn</p>"])]
    page = (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title or exp_dir.name)}"
            f"</title><style>{STYLE}</style></head><body>{''.join(parts)}</body></html>")
    path = Path(out or exp_dir / REPORT_FILE)
    path.write_text(page, encoding="utf-8")
    return path
