"""The schedules of a population: each knob's value per epoch, one line per run, exploits marked.

Drawn from the records alone (no checkpoint, no data), for `augtune plot schedule EXP_DIR`
(`augtune.plots.schedule`) and a compare's report (each PBT entrant's population): one panel per knob
a run recorded per epoch (a PBT search's mutated keys, a `schedule:`'s keys), one
step line per run (its values in force epoch by epoch, along its lineage), and a marker where the run
copied another (PBT's exploit: from the next epoch on it trains under its own perturbed values). A
knob whose values span more than a decade is drawn on a log axis.
"""
from __future__ import annotations

import re

from augtune.analysis.frame import AnalysisError


def _series(record: dict) -> dict[str, tuple[list[int], list[float]]]:
    """{knob: (epochs, values)} of the numeric knobs the run recorded per epoch."""
    out: dict[str, tuple[list[int], list[float]]] = {}
    for entry in record.get("epochs") or []:
        knobs = entry.get("knobs") if isinstance(entry, dict) else None
        if not isinstance(knobs, dict):
            continue
        for key, value in knobs.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                xs, ys = out.setdefault(key, ([], []))
                xs.append(int(entry["epoch"]))
                ys.append(float(value))
    return out


def figure(records: list[dict], names: list[str] | None = None):
    """The knobs' values per epoch of every run (a PBT population's schedules), exploits marked: a
    matplotlib figure (`names`: each run's, its record's `trial` by default)."""
    import matplotlib.pyplot as plt

    names = names or [str(r.get("trial") or i) for i, r in enumerate(records)]
    series = [_series(r) for r in records]
    keys = sorted({k for s in series for k in s})
    if not keys:
        raise AnalysisError("no run here recorded knob values per epoch (a PBT search's trials or a run with "
                            "a schedule: do)")
    fig, axes = plt.subplots(len(keys), 1, figsize=(7, 2.4 * len(keys)), sharex=True, squeeze=False)
    for ax, key in zip(axes[:, 0], keys):
        values = []
        for record, name, own_series in zip(records, names, series):
            if key not in own_series:
                continue
            xs, ys = own_series[key]
            values += ys
            short = re.search(r"_(\d{5})_", name)  # Tune's trial number in its folder's name
            label = short.group(1) if short else name[:40]
            (line,) = ax.step(xs, ys, where="post", label=label, linewidth=1.2)
            own = [step["epoch"] for step in record.get("lineage") or []
                   if isinstance(step, dict) and step.get("trial") == record.get("trial")]
            marks = [(x, y) for x, y in zip(xs, ys) if x in own]
            if marks:
                ax.plot(*zip(*marks), "v", color=line.get_color(), markersize=7)
        positive = [v for v in values if v > 0]
        if positive and len(positive) == len(values) and max(positive) > 10 * min(positive):
            ax.set_yscale("log")
        ax.set_ylabel(key)
    axes[-1, 0].set_xlabel("epoch (a triangle: the run copied another after this epoch)")
    if len(records) <= 12:
        axes[0, 0].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return fig
