"""A search's own figures: its history, parallel coordinates and hyperparameter importances (Optuna's).

`augtune plot search EXP_DIR` draws, per search (a compare experiment has one per entrant), Optuna's
matplotlib visualisations of an in-memory study rebuilt from the trials' records
(`augtune.analysis.importance.study_from_records`: no unpickling, a copied results folder works):

- `search_history[_<entrant>].png`: the metric of each trial in the order they started, and the best
  so far (`plot_optimization_history`);
- `search_parallel[_<entrant>].png`: one line per trial across the parameters that varied, coloured
  by the metric (`plot_parallel_coordinate`);
- `search_importances[_<entrant>].png`: fANOVA importances (PED-ANOVA when fANOVA cannot run) of the
  parameters every trial has (`plot_param_importances`).

The metric and its direction are the search's (`search.metric`, `search.mode` in the trials' config);
a trial's value is the last value of the metric it reported (a trial ASHA stopped counts with its last
rung). Repeat-best runs are not trials of the search and are left out.
"""
from __future__ import annotations

import warnings
from pathlib import Path

from augtune.plots import PlotError, Run, save


def _searches(runs: list[Run]) -> dict[Path, list[Run]]:
    """The search trials (records with the parameters they were given), by the folder of their search."""
    out: dict[Path, list[Run]] = {}
    for run in runs:
        if run.record.get("phase", "search") == "search" and isinstance(run.record.get("params"), dict):
            out.setdefault(run.path.parent, []).append(run)
    return out


def _goal(trials: list[Run]) -> tuple[str, str]:
    """The search's metric and mode, as its trials' config says (one search has one)."""
    goals = set()
    for t in trials:
        config = t.record.get("config")
        search = config.get("search") if isinstance(config, dict) else None
        goals.add((search.get("metric"), search.get("mode")) if isinstance(search, dict) else (None, None))
    metric, mode = next(iter(goals))
    if len(goals) != 1 or not isinstance(metric, str) or mode not in ("max", "min"):
        raise PlotError(f"{trials[0].path.parent}: its trials' config does not name one metric and mode "
                        f"searched (search.metric, search.mode: {sorted(map(str, goals))})")
    return metric, mode


def _draw(study, varying: list[str], metric: str, stem: str) -> dict:
    from matplotlib.ticker import MaxNLocator
    from optuna.visualization import matplotlib as ovm

    from augtune.analysis.importance import everywhere, param_importances

    drawn = {}
    ax = ovm.plot_optimization_history(study, target_name=metric)
    ax.set_xlabel("trial (in the order it started)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    drawn[f"search_history{stem}"] = ax.figure
    ax = ovm.plot_parallel_coordinate(study, params=varying, target_name=metric)
    ax.figure.set_size_inches(max(6.4, 1.6 * (len(varying) + 1)), 4.8)  # room for each parameter's ticks
    drawn[f"search_parallel{stem}"] = ax.figure
    params = [k for k in everywhere(study) if k in varying]
    if params:
        _, how, evaluator = param_importances(study, params)
        ax = ovm.plot_param_importances(study, evaluator=evaluator, params=params, target_name=metric)
        ax.set_title(f"Hyperparameter importances ({how})", loc="left")  # replaces Optuna's own title
        drawn[f"search_importances{stem}"] = ax.figure
    return drawn


def figures(runs: list[Run]) -> dict:
    """Search history, parallel coordinates and importances of each search among the runs, by name."""
    import matplotlib
    from optuna.exceptions import ExperimentalWarning

    from augtune.analysis.importance import study_from_records

    searches = _searches(runs)
    if not searches:
        raise PlotError("no search trials among these runs (records with the parameters a search gave them); "
                        "give an augtune search or compare folder")
    drawn: dict = {}
    skipped = []
    for folder, trials in sorted(searches.items()):
        metric, mode = _goal(trials)
        study, varying = study_from_records([t.record for t in trials], metric, mode)
        if study is None:
            skipped.append(f"{folder.name}: {varying}")
            continue
        stem = "" if len(searches) == 1 else "_" + folder.name.replace("+", "_")
        # Optuna marks its matplotlib plots experimental, and switches matplotlib to its ggplot style:
        # keep both inside this block, so the next figure drawn in this process looks as before
        with warnings.catch_warnings(), matplotlib.rc_context():
            warnings.simplefilter("ignore", ExperimentalWarning)
            drawn.update(_draw(study, varying, metric, stem))
    if not drawn:
        raise PlotError("nothing to draw: " + "; ".join(skipped))
    if skipped:  # one short line: each reason can list many parameters
        names = ", ".join(s.split(":", 1)[0] for s in skipped)
        warnings.warn(f"not drawn for {len(skipped)} search(es) with fewer than two trials or nothing "
                      f"varied: {names[:300]}", PlotWarning, stacklevel=2)
    return drawn


def plot(runs: list[Run], out: Path) -> list[Path]:
    """Search history, parallel coordinates and importances of the searches among the runs (Optuna)."""
    return [save(fig, out / f"{name}.png") for name, fig in figures(runs).items()]


class PlotWarning(UserWarning):
    """A search among several that has too little to draw (fewer than two trials, nothing varied)."""
