"""Adapters where Ray Tune's, Optuna's and MLflow's callback's public API stops: the one module that
touches their private names.

Everything else in augtune uses the libraries' public API (`Tuner`, `TuneConfig`'s
`trial_dirname_creator`, `ResultGrid`, `SearchAlgorithm`/`Searcher`, `Callback`, Optuna's studies and
storages). What the public API does not offer, and why augtune needs it anyway (five names):

- `ray.tune.experiment.config_parser._create_trial_from_spec`, `_make_parser` (`trial_from_spec`): the
  repeat phase and a resume make Tune trials whose config is a whole parameter set, outside the
  space's variant generator; Tune has no public trial factory.
- `StorageContext.current_checkpoint_index` (`trial_folder`): a trial made again by a resume
  (`augtune.search.resume`) writes into its folder of the run before, whose checkpoints Tune numbered;
  Tune numbers a new trial's from 0 and would write over them. It continues the numbering instead.
- `PopulationBasedTraining._trial_state` (`resume_pbt_clock`): Tune's PBT starts every trial's clock at
  0, so a trial a resume made again at epoch 6 of interval 2 would be perturbed at its first result.
  No public hook sets that state; this sets a resumed trial's last perturbation to its checkpoint's
  epoch.
- `mlflow_run_of` reads `MLflowLoggerCallback._trial_runs` (trial -> MLflow run id): the callback names
  an MLflow run after Tune's trial and offers no way to know which run it started, which augtune renames
  by method and phase (`augtune.search.loggers.mlflow_logger`).

Beside them, `trial_folders` reads where a trial's files are from Tune's developer API (`Trial.storage`,
`Trial.local_path`), as Tune's own logger callbacks do.

The versions these were written against are `SUPPORTED` (the same ranges as pyproject.toml's
dependencies; a test checks they agree): importing this module outside them fails with one line.
"""
from __future__ import annotations

import copy
import math
from typing import Any, Dict, Optional

SUPPORTED = {"ray": (">=2.59", "<2.61"), "optuna": (">=3.5", "<5.1")}


class UnsupportedVersion(ImportError):
    """An installed Ray or Optuna outside the range augtune was tested on."""


def check_versions(installed: Optional[dict[str, str]] = None) -> None:
    """Refuse, in one line naming the range, a Ray or Optuna augtune was not tested on (`installed`:
    {package: version}, the installed ones by default)."""
    from importlib.metadata import PackageNotFoundError, version

    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    for name, bounds in SUPPORTED.items():
        spec = SpecifierSet(",".join(bounds))
        try:
            have = (installed or {}).get(name) or version(name)
        except PackageNotFoundError:
            raise UnsupportedVersion(f"{name} is not installed; augtune needs {name}{spec}") from None
        if Version(have) not in spec:
            raise UnsupportedVersion(
                f"{name} {have} is installed; augtune is tested with {name}{','.join(bounds)} "
                f"(pip install '{name}{','.join(bounds)}')"
            )


check_versions()

import optuna  # noqa: E402  (after the version check: its message, not an AttributeError, first)
from optuna.trial import TrialState  # noqa: E402
from ray.tune.search.optuna import OptunaSearch  # noqa: E402

CONFIG_PREFIX = "config/"  # Tune flattens a result's config into "config/<key>" entries


# -- trials outside Tune's variant generator ---------------------------------------------------------------

def experiment_of(experiments) -> Any:
    """Tune's one experiment, from what `SearchAlgorithm.add_configurations` is given (Tune gives a list
    of one `Experiment`)."""
    (experiment,) = experiments if isinstance(experiments, (list, tuple)) else [experiments]
    return experiment


def trial_from_spec(spec: dict, config: dict, tag: str) -> Any:
    """A Tune trial of `spec` (an experiment's) whose config is `config`, tagged `tag`."""
    from ray.tune.experiment import Trial
    from ray.tune.experiment.config_parser import _create_trial_from_spec, _make_parser
    from ray.tune.utils import flatten_dict

    spec = copy.deepcopy(spec)
    spec["config"] = config
    return _create_trial_from_spec(spec, _make_parser(), evaluated_params=flatten_dict(config),
                                   experiment_tag=tag, trial_id=Trial.generate_id())


class Whole:
    """A list given whole in a preset point of Tune's variant generator (which recurses into lists): equal
    to the list, so Tune's check that a preset lies in its choice's domain holds."""

    def __init__(self, value):
        self.value = list(value)

    def __eq__(self, other) -> bool:
        return self.value == (other.value if isinstance(other, Whole) else other)

    def __hash__(self) -> int:
        return hash(repr(self.value))

    def __repr__(self) -> str:
        return repr(self.value)

    @staticmethod
    def unwrap(value):
        return value.value if isinstance(value, Whole) else value


# -- a trial a resume makes again ---------------------------------------------------------------------------

def trial_folder(trial) -> str:
    """Tune's `trial_dirname_creator` of every augtune run: a trial a resume makes again
    (`augtune.search.resume.RESUME` in its config) keeps its folder, and its checkpoints are numbered on
    from the highest there; any other is named as Tune names it (`<trainable>_<id>_<tag>_<time>`)."""
    import datetime as dt
    import re

    from augtune.search.resume import RESUME

    again = (trial.config or {}).get(RESUME)
    if again:
        trial.storage.current_checkpoint_index = int(again.get("index", -1))
        return str(again["folder"])
    name = f"{trial}_{trial.experiment_tag}"[:130] + f"_{dt.datetime.now():%Y-%m-%d_%H-%M-%S}"
    return re.sub(r'[/()<>:"\\|?*]', "_", name)


def trial_folders(trial) -> tuple[Any, str, Any]:
    """(storage file system, the trial's folder on it, Tune's local staging copy of it as a Path): where
    Tune's logger callbacks read and write a trial's result log (Tune's developer API, `Trial.storage`)."""
    from pathlib import Path

    return trial.storage.storage_filesystem, trial.storage.trial_fs_path, Path(trial.local_path)


class MetricResultsOptunaSearch(OptunaSearch):
    """Tune's OptunaSearch as an augtune search runs it (public API only: it keeps its own handle on the
    study, in `storage`; an in-memory one when none is given).

    - It is told only the results that carry the searched metric. A trial evaluates the metric where
      someone reads it (the scheduler's rungs and its last epoch: `search.plan.trial_base`) and reports
      `epoch` every epoch; Tune's OptunaSearch reads the metric from every result it is given
      (`result[metric]`, a KeyError otherwise). Optuna's intermediate values serve only its own
      pruners, which augtune does not use (ASHA stops trials); the final result always carries it.
    - A trial it did not ask for (a trial a resume made again: `augtune.search.resume`) is told to the
      study when it ends: to the study's trial still running for it (`adopt`), or added as a new one.
    """

    def __init__(self, space=None, *args, storage=None, study_name: Optional[str] = None, **kwargs):
        storage = storage if storage is not None else optuna.storages.InMemoryStorage()
        study_name = study_name or "augtune"
        super().__init__(space, *args, storage=storage, study_name=study_name, **kwargs)
        self.searched, self.study_where = space, (storage, study_name)
        self.asked: set[str] = set()
        self.adopted: dict[str, int] = {}

    def study(self) -> optuna.Study:
        storage, name = self.study_where
        return optuna.load_study(study_name=name, storage=storage)

    def adopt(self, trial_id: str, number: int) -> None:
        """Tell the study's trial `number` (asked before a resume, still running) the end of `trial_id`."""
        self.adopted[trial_id] = number

    def suggest(self, trial_id: str):
        config = super().suggest(trial_id)
        if isinstance(config, dict):
            self.asked.add(trial_id)
        return config

    def on_trial_result(self, trial_id: str, result: Dict) -> None:
        if isinstance(self.metric, str) and self.metric not in result:
            return
        if trial_id not in self.asked:  # a trial made again by a resume: told when it ends
            return
        super().on_trial_result(trial_id, result)

    def on_trial_complete(self, trial_id: str, result: Optional[Dict] = None, error: bool = False) -> None:
        if trial_id in self.asked:
            self.asked.discard(trial_id)
            super().on_trial_complete(trial_id, result=result, error=error)
            return
        params = {k[len(CONFIG_PREFIX):]: v for k, v in (result or {}).items() if k.startswith(CONFIG_PREFIX)}
        self.add_ended(trial_id, params, result, error)

    def add_ended(self, trial_id: str, params: dict, result: Optional[Dict], error: bool) -> None:
        """Tell the study the end of a trial this searcher never asked for: to its adopted trial, or as a
        new one with its parameters."""
        value = (result or {}).get(self.metric) if isinstance(self.metric, str) else None
        if value is not None and not math.isfinite(value):
            value, error = None, True
        state = TrialState.COMPLETE if value is not None else TrialState.FAIL if error else TrialState.PRUNED
        number = self.adopted.pop(trial_id, None)
        try:
            if number is not None:
                self.study().tell(number, value if state == TrialState.COMPLETE else None, state=state,
                                  skip_if_finished=True)
            else:
                params, distributions = self.distributions(params)
                self.study().add_trial(optuna.trial.create_trial(
                    params=params, distributions=distributions, state=state,
                    value=value if state == TrialState.COMPLETE else None,
                ))
        except (ValueError, TypeError, KeyError) as e:  # parameters the space cannot take: the study skips it
            import logging

            logging.getLogger(__name__).warning("trial %s is not added to Optuna's study: %s", trial_id, e)

    def distributions(self, params: dict) -> tuple[dict, dict]:
        """The searched parameters among `params` and their Optuna distributions."""
        if callable(self.searched):  # define-by-run: run it on the fixed values to learn what it asks
            fixed = optuna.trial.FixedTrial(params)
            self.searched(fixed)
            return fixed.params, fixed.distributions
        names = [k for k in self.searched if k in params]
        return {k: params[k] for k in names}, {k: self.searched[k] for k in names}


# -- PBT's per-trial state, after a resume ------------------------------------------------------------

def resume_pbt_clock(pbt, trial, epoch: int) -> None:
    """Give a trial a resume made again from its checkpoint at `epoch` the PBT clock it had: its last
    perturbation at that epoch (a PBT trial checkpoints at the multiples of the interval, where it is
    perturbed: `schedulers.PBT`), so the next comes an interval later."""
    pbt._trial_state[trial].last_perturbation_time = int(epoch)


def mlflow_run_of(callback, trial) -> Optional[str]:
    """The MLflow run id Ray's `MLflowLoggerCallback` started for `trial` (None before it has)."""
    return callback._trial_runs.get(trial)
