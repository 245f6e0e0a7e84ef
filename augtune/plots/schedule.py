"""The schedules of a population: each knob's value per epoch, one line per run, exploits marked.

`augtune plot schedule EXP_DIR` draws `schedule.png` from the records alone (no checkpoint, no data); the
drawing is `augtune.analysis.schedules`' (a compare's report draws it too).
"""
from __future__ import annotations

from pathlib import Path

from augtune.analysis.frame import AnalysisError
from augtune.plots import PlotError, Run, save


def plot(runs: list[Run], out: Path) -> list[Path]:
    """The knobs' values per epoch of every run (a PBT population's schedules), exploits marked."""
    return [save(fig, Path(out) / f"{name}.png") for name, fig in figures(runs).items()]


def figures(runs: list[Run]) -> dict:
    """The one figure of the schedules, by name (`schedule`)."""
    from augtune.analysis.schedules import figure

    try:
        return {"schedule": figure([r.record for r in runs],
                                   [str(r.record.get("trial") or r.path.name) for r in runs])}
    except AnalysisError as e:
        raise PlotError(str(e)) from None
