"""Tune's OptunaSearch as an augtune search runs it (imports Ray: loaded lazily).

- It is told only the results that carry the searched metric. A trial evaluates the metric where
  someone reads it (the scheduler's rungs and its last epoch: `search.plan.trial_base`) and reports
  `epoch` every epoch; Tune's OptunaSearch reads the metric from every result it is given
  (`result[metric]`, a KeyError otherwise). Optuna's intermediate values serve only its own pruners,
  which augtune does not use (ASHA stops trials); the final result always carries the metric.
- Restored, it reconciles its study with the trials Tune restores (`reconcile`): its saved state can be
  a snapshot older or newer than Tune's trials, and Optuna's journal, written at every ask and tell,
  newer than both (`augtune.search.recovery`). A trial Tune holds that it does not know is matched to
  the study's trial of the same parameters, or added to the study when it ends; a trial of the study
  that Tune never ran is marked failed. So the study holds each trial Tune ran once, with its value.
"""
from __future__ import annotations

import math
from typing import Dict, Iterable, Optional

import optuna
from optuna.trial import TrialState
from ray.tune.search.optuna import OptunaSearch

CONFIG_PREFIX = "config/"  # Tune flattens a result's config into "config/<key>" entries


class MetricResultsOptunaSearch(OptunaSearch):
    def on_trial_result(self, trial_id: str, result: Dict) -> None:
        if isinstance(self.metric, str) and self.metric not in result:
            return
        if trial_id not in self._ot_trials:  # a restored trial this state never made: told when it ends
            return
        super().on_trial_result(trial_id, result)

    def on_trial_complete(self, trial_id: str, result: Optional[Dict] = None, error: bool = False) -> None:
        if trial_id not in self._ot_trials and trial_id not in self._completed_trials:
            params = {k[len(CONFIG_PREFIX):]: v for k, v in (result or {}).items()
                      if k.startswith(CONFIG_PREFIX)}
            self._add_ended(trial_id, params, result, error)
            return
        super().on_trial_complete(trial_id, result=result, error=error)

    def reconcile(self, trials: Iterable) -> None:
        """Agree with the trials Tune restored (`recovery.RestoredTrial`: id, status, params, last result)."""
        trials = list(trials)
        held = {t.trial_id for t in trials}
        for trial_id in [t for t in self._ot_trials if t not in held]:  # made here, never a Tune trial
            ot_trial = self._ot_trials.pop(trial_id)
            if trial_id not in self._completed_trials:
                self._fail(ot_trial.number)
        known = {ot_trial._trial_id for ot_trial in self._ot_trials.values()}
        unclaimed = [t for t in self._ot_study.get_trials(deepcopy=False) if t._trial_id not in known]
        for t in trials:
            if t.trial_id not in self._ot_trials:
                match = next((f for f in unclaimed if _same(f.params, t.params)), None)
                if match is not None:
                    unclaimed.remove(match)
                    self._ot_trials[t.trial_id] = optuna.trial.Trial(self._ot_study, match._trial_id)
                    if match.state.is_finished():  # its end is in the journal already
                        self._completed_trials.add(t.trial_id)
            if t.finished and t.trial_id not in self._completed_trials:  # ended since this state was saved
                self.on_trial_complete(t.trial_id, dict(t.last_result, **_as_config(t.params)),
                                       error=t.status == "ERROR")
        for f in unclaimed:  # asked of the study (its journal is written at once), never run by Tune
            if f.state == TrialState.RUNNING:
                self._fail(f.number)

    def _add_ended(self, trial_id: str, params: dict, result: Optional[Dict], error: bool) -> None:
        """Add a trial that ended and that this searcher never made to the study, with its parameters."""
        value = (result or {}).get(self.metric) if isinstance(self.metric, str) else None
        if value is not None and not math.isfinite(value):
            value, error = None, True
        state = TrialState.COMPLETE if value is not None else TrialState.FAIL if error else TrialState.PRUNED
        try:
            params, distributions = self._distributions(params)
            self._ot_study.add_trial(optuna.trial.create_trial(
                params=params, distributions=distributions, state=state,
                value=value if state == TrialState.COMPLETE else None,
            ))
        except (ValueError, TypeError, KeyError) as e:  # parameters the space cannot take: the study skips it
            import logging

            logging.getLogger(__name__).warning("trial %s is not added to Optuna's study: %s", trial_id, e)
        self._completed_trials.add(trial_id)

    def _distributions(self, params: dict) -> tuple[dict, dict]:
        """The searched parameters among `params` and their Optuna distributions."""
        if callable(self._space):  # define-by-run: run it on the fixed values to learn what it asks
            fixed = optuna.trial.FixedTrial(params)
            self._space(fixed)
            return fixed.params, fixed.distributions
        names = [k for k in self._space if k in params]
        return {k: params[k] for k in names}, {k: self._space[k] for k in names}

    def _fail(self, number: int) -> None:
        self._ot_study.tell(number, state=TrialState.FAIL, skip_if_finished=True)


def _same(a: dict, b: dict) -> bool:
    return bool(a) and all(k in b and b[k] == v for k, v in a.items())


def _as_config(params: dict) -> dict:
    return {f"{CONFIG_PREFIX}{k}": v for k, v in params.items()}
