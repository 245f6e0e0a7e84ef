"""Which hyperparameters mattered: Optuna's fANOVA over a search's trials, rebuilt from records on disk.

No unpickling: each search trial's record holds the parameters it was given (`params`) and the
metric it reported; an in-memory Optuna study is rebuilt from them (:func:`study_from_records`:
`optuna.trial.create_trial`, the distributions inferred from the values seen: numbers over
[min, max], log-scaled when all positive and spanning two decades; anything else categorical) and
`optuna.importance` evaluates it (fANOVA, seeded; PED-ANOVA when fANOVA cannot run) over the
parameters every trial has. A trial's value is the last value of the metric it reported: a trial
ASHA stopped counts with its last rung, as Tune ranks it. The same study feeds Optuna's figures
(`augtune plot search`).
"""
from __future__ import annotations

from typing import Any, Optional

from augtune.records import last_reported


def _distribution(values: list[Any]):
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        lo, hi = min(values), max(values)
        log = lo > 0 and hi / lo >= 100
        if all(isinstance(v, int) for v in values):
            return IntDistribution(int(lo), int(hi), log=log)
        return FloatDistribution(float(lo), float(hi), log=log)
    return CategoricalDistribution(sorted({_shown(v) for v in values}, key=repr))


def _shown(value: Any) -> Any:
    """A parameter value as Optuna can hold it: lists and mappings as their text."""
    return repr(value) if isinstance(value, (list, tuple, dict)) else value


def _search_trials(records: list[dict], metric: str) -> list[tuple[dict, float]]:
    """(params, value) of the search trials that reported `metric`, in the order they started."""
    trials = [r for r in records if isinstance(r, dict) and r.get("phase", "search") == "search"
              and isinstance(r.get("params"), dict) and r["params"]]
    trials.sort(key=lambda r: str(r.get("started") or ""))
    return [(r["params"], v) for r in trials if (v := last_reported(r, metric)) is not None]


def study_from_records(records: list[dict], metric: str, mode: str = "max"):
    """(an in-memory Optuna study of the search trials in `records`, the parameters that varied), or
    (None, the reason) when there are fewer than two trials with a value or nothing varied."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # no "A new study created" line per entrant
    trials = _search_trials(records, metric)
    if len(trials) < 2:
        return None, f"not enough trials ({len(trials)} with a {metric})"
    keys = sorted({k for p, _ in trials for k in p})
    varying = [k for k in keys if len({repr(p[k]) for p, _ in trials if k in p}) > 1]
    if not varying:
        return None, "no hyperparameter varied between the trials"
    dists = {k: _distribution([p[k] for p, _ in trials if k in p]) for k in varying}
    study = optuna.create_study(direction="maximize" if mode == "max" else "minimize", study_name=metric)
    study.add_trials([optuna.trial.create_trial(params={k: _shown(p[k]) for k in varying if k in p},
                                                distributions={k: dists[k] for k in varying if k in p},
                                                value=v) for p, v in trials])
    return study, varying


def everywhere(study) -> list[str]:
    """The study's parameters that every trial has (a define-by-run space leaves some out)."""
    trials = study.get_trials(deepcopy=False)
    return sorted(set.intersection(*(set(t.params) for t in trials))) if trials else []


def param_importances(study, params: list[str], seed: int = 0):
    """({parameter: importance}, how, the evaluator used): fANOVA (seeded), or PED-ANOVA when its forest
    cannot be fitted (too few distinct points); both through `optuna.importance`."""
    import optuna

    get = optuna.importance.get_param_importances
    fanova = optuna.importance.FanovaImportanceEvaluator(seed=seed)
    try:
        return dict(get(study, evaluator=fanova, params=params)), "fANOVA", fanova
    except Exception:  # fANOVA's forest needs distinct points; PED-ANOVA needs no model
        ped = optuna.importance.PedAnovaImportanceEvaluator()
        return dict(get(study, evaluator=ped, params=params)), "PED-ANOVA", ped


def importances(records: list[dict], metric: str, mode: str = "max",
                seed: int = 0) -> tuple[dict[str, float], str]:
    """({parameter: importance}, how) from a search's records; an empty dict and the reason when there
    are too few trials or nothing varied."""
    study, varying = study_from_records(records, metric, mode)
    if study is None:
        return {}, varying
    params = [k for k in everywhere(study) if k in varying]
    if not params:
        return {}, "no hyperparameter varied that every trial has"
    values, how, _ = param_importances(study, params, seed)
    return values, how


def format_importances(name: str, result: tuple[dict[str, float], str]) -> str:
    values, how = result
    if not values:
        return f"{name}: {how}"
    return f"{name} ({how}): " + ", ".join(f"{k} {v:.2f}" for k, v in values.items())


def trial_value(record: dict, metric: str) -> Optional[float]:
    """The value of `metric` a trial is ranked by, as the study above holds it: the last it reported (None
    when it reported none)."""
    return last_reported(record, metric)


def importance_frame(searches: dict[str, list[dict]], metric: str, mode: str = "max", seed: int = 0):
    """The importances of each search (`searches`: {entrant: its trials' records}) as a pandas DataFrame,
    one row per entrant and parameter, most important first: `entrant`, `key` (the dotted parameter),
    `importance` (a float; an entrant's sum to 1) and `method` (fANOVA or PED-ANOVA). An entrant with too
    few trials or nothing varied has no row; `attrs["skipped"]` says why ({entrant: reason})."""
    import pandas as pd

    rows, skipped = [], {}
    for entrant, records in sorted(searches.items()):
        values, how = importances(records, metric, mode, seed)
        if not values:
            skipped[entrant] = how
        rows += [{"entrant": entrant, "key": k, "importance": float(v), "method": how}
                 for k, v in values.items()]
    df = pd.DataFrame(rows, columns=["entrant", "key", "importance", "method"]).astype({"importance": float})
    df.attrs["skipped"] = skipped
    return df
