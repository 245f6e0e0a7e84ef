"""Adapters where Ray Tune's, Optuna's and MLflow's callback's public API stops: the one module that
touches their private names.

Everything else in augtune uses the two libraries' public API (`Tuner`, `Tuner.restore`,
`Tuner.can_restore`, `ResultGrid`, `SearchAlgorithm`/`Searcher` and their `save_to_dir` /
`restore_from_dir`, `Callback`, Optuna's studies and storages). What the public API does not offer,
and why augtune needs it anyway:

- `Tuner._local_tuner.get_run_config()`, `._tune_config.search_alg` (`run_config_of`,
  `search_algorithm_of`): `Tuner.restore` rebuilds the run's config and search algorithm from its
  pickled state and exposes neither; augtune needs the search algorithm to tell a finished search
  from an interrupted one (`is_finished`), and the run config to attach the callback that records
  each trial's status at Tune's last step.
- `ray.tune.experiment._convert_to_experiment_list` (`experiment_of`): a search algorithm receives
  Tune's experiment in whatever form `add_configurations` was given; a compare splits it into one per
  entrant and the repeat phase makes trials from its spec.
- `ray.tune.experiment.config_parser._create_trial_from_spec`, `_make_parser` (`trial_from_spec`):
  the repeat phase makes Tune trials whose config is a whole parameter set, outside the space's
  variant generator; Tune has no public trial factory.
- `ray.tune.utils.serialization._loads_with_cloudpickle` (`load_experiment_state`): reads Tune's
  experiment state (`experiment_state-*.json`) to learn which trials Tune restored, before Tune
  itself does.
- `ReplayingVariantGenerator` writes `BasicVariantGenerator`'s `_iterators`, `_trial_generator`,
  `_trial_iter`, `_finished`, `_live_trials`; `ReconcilingSearchGenerator` writes
  `SearchGenerator._counter` and `ConcurrencyLimiter.live_trials`; `MetricResultsOptunaSearch`
  reads and writes `OptunaSearch._ot_trials`, `_ot_study`, `_completed_trials`, `_space` and
  Optuna's `FrozenTrial._trial_id`. Tune saves its trials and its search algorithm's state in
  separate files, one after the other: a driver killed in between leaves an algorithm one snapshot
  older or newer than the trials, which restored as it is runs a finished trial twice or never runs
  one. No public hook lets a search algorithm agree with the trials Tune restored; these three do.

- `resume_pbt_clock` writes `PopulationBasedTraining._trial_state[trial]` (`last_perturbation_time`,
  `last_score`, `last_result`, `last_checkpoint`) and reads its `_time_attr`, `_perturbation_interval`,
  `_metric`, `_metric_op`. Tune does not save a scheduler with its experiment: a restored PBT search
  starts every trial's PBT state afresh, so each trial perturbed at its first result (its clock at 0)
  and the population's scores were forgotten. No public hook sets that state; this gives a restored
  trial the state it had, from its last result and checkpoint (Tune restores both).

- `hold_copies_while_saving` wraps `TuneController.checkpoint` (reading its `_storage.syncer` and the
  syncer's `_should_continue_existing_sync`): Tune writes its experiment state into a staging folder
  while the background copy it launched at the last save may still be copying that folder to the
  experiment's, so the copy can carry a state file written but not yet signed (`augtune.search.trust`:
  the search algorithm's `save_to_dir` signs, after Tune's own write); a driver killed then leaves a
  folder `resume` rightly refuses (the CI saw it). Saving only when no copy is in flight means every
  copy starts from a signed folder. Tune has no hook before its save.

- `mlflow_run_of` reads `MLflowLoggerCallback._trial_runs` (trial -> MLflow run id): the callback names
  an MLflow run after Tune's trial and offers no way to know which run it started, which augtune renames
  by method and phase (`augtune.search.loggers.mlflow_logger`).

The versions these were written against are `SUPPORTED` (the same ranges as pyproject.toml's
dependencies; a test checks they agree): importing this module outside them fails with one line.
"""
from __future__ import annotations

import copy
import functools
import itertools
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterable, Optional

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
from ray.tune.search import (BasicVariantGenerator, ConcurrencyLimiter,  # noqa: E402
                             SearchGenerator, Searcher)
from ray.tune.search.optuna import OptunaSearch  # noqa: E402

CONFIG_PREFIX = "config/"  # Tune flattens a result's config into "config/<key>" entries


# -- a Tuner's restored run -------------------------------------------------------------------------------

def run_config_of(tuner) -> Any:
    """The RunConfig a Tuner runs with (a restored one's, rebuilt from its state)."""
    return tuner._local_tuner.get_run_config()


def search_algorithm_of(tuner) -> Any:
    """The search algorithm a Tuner runs (a restored one's, unpickled from its state)."""
    return tuner._local_tuner._tune_config.search_alg


# -- trials outside Tune's variant generator ---------------------------------------------------------------

def experiment_of(experiments) -> Any:
    """Tune's one experiment, from what `SearchAlgorithm.add_configurations` is given."""
    from ray.tune.experiment import _convert_to_experiment_list

    (experiment,) = _convert_to_experiment_list(experiments)
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


def load_experiment_state(text: str) -> dict:
    """Tune's experiment state (`experiment_state-*.json`), as Tune itself reads it."""
    from ray.tune.utils.serialization import _loads_with_cloudpickle

    return _loads_with_cloudpickle(text)


# -- the trials Tune restored ------------------------------------------------------------------------

@dataclass(frozen=True)
class RestoredTrial:
    """One trial of an experiment's saved state, as Tune restores it."""

    trial_id: str
    status: str  # TERMINATED, ERROR, or PENDING (Tune restores a running trial as pending)
    params: dict = field(default_factory=dict)  # the searched parameters (Tune's evaluated_params)
    last_result: dict = field(default_factory=dict)
    config: dict = field(default_factory=dict)  # the whole trial config (searched and constant)
    dir_name: Optional[str] = None  # its folder's name (where its record is), when the state says

    @property
    def finished(self) -> bool:
        return self.status in ("TERMINATED", "ERROR")


def restored_trials(folder: str, repeats: bool = False) -> Optional[list[RestoredTrial]]:
    """The trials of the newest experiment state in `folder` (Tune's driver staging folder, into which
    Tune downloads the state it restores from), or None when there is none; a search's own trials only,
    unless `repeats` (the repeat runs of its best, `augtune.search.repeat`, share its Tune run)."""
    states = sorted(Path(folder).glob("experiment_state-*.json"))
    if not states:
        return None
    from ray.tune.experiment.trial import Trial

    from augtune.records import REPEAT

    state = load_experiment_state(states[-1].read_text())
    out = []
    for trial_json, metadata in state.get("trial_data", []):
        trial = Trial.from_json_state(trial_json, stub=True)
        trial.restore_run_metadata(metadata)
        if not repeats and REPEAT in (trial.config or {}):
            continue
        try:
            dir_name = trial.storage.trial_dir_name if trial.storage is not None else None
        except (AttributeError, RuntimeError):
            dir_name = None
        out.append(RestoredTrial(trial.trial_id, trial.status, dict(trial.evaluated_params or {}),
                                 dict(trial.last_result or {}), dict(trial.config or {}), dir_name))
    return out


# -- search algorithms that agree with the trials Tune restored ----------------------------------------------

class ReplayingVariantGenerator(BasicVariantGenerator):
    """Tune's BasicVariantGenerator (grid and random search) that, restored, replays its variants from the
    start and skips those Tune already holds: the variants are deterministic (the grid, and the sampler
    seeded with `search.seed`) and so are their trial ids, whichever snapshot its saved state was.

    A preset point's list value (a choice of lists: CoCor's `cocor.lengths`) goes in wrapped (`Whole`):
    Tune reads a list in a preset as nested keys and failed on it; the trial's config gets the list."""

    def __init__(self, *args, points_to_evaluate: Optional[list] = None, **kwargs):
        points = [{k: Whole(v) if isinstance(v, (list, tuple)) else v for k, v in p.items()}
                  for p in points_to_evaluate or ()]
        super().__init__(*args, points_to_evaluate=points or None, **kwargs)

    def add_configurations(self, experiments) -> None:
        super().add_configurations(experiments)
        self._fresh = copy.deepcopy(self._iterators)  # before any variant is drawn (saved with the state)

    def restore_from_dir(self, dirpath: str) -> None:
        super().restore_from_dir(dirpath)
        trials = restored_trials(dirpath)
        if trials is None or not getattr(self, "_fresh", None):
            return
        self._iterators = copy.deepcopy(self._fresh)
        self._trial_generator, self._trial_iter = itertools.chain(*self._iterators), None
        self._finished = False
        self._held = {t.trial_id for t in trials}
        self._live_trials = {t.trial_id for t in trials if not t.finished}

    def next_trial(self):
        while True:
            live = set(self._live_trials)
            trial = super().next_trial()
            if trial is None or trial.trial_id not in getattr(self, "_held", ()):
                if trial is not None:
                    trial.config = {k: Whole.unwrap(v) for k, v in trial.config.items()}
                    trial.evaluated_params = {k: Whole.unwrap(v) for k, v in trial.evaluated_params.items()}
                return trial
            self._live_trials = live  # a replayed trial Tune holds: live only if it was


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


class ReconcilingSearchGenerator(SearchGenerator):
    """Tune's SearchGenerator over a ConcurrencyLimiter over an Optuna searcher
    (`MetricResultsOptunaSearch`) that, restored, counts the trials Tune holds, takes the unfinished
    ones as the live ones, and has the searcher reconcile its study with them. A completion of a trial
    the limiter never saw (a restored or restarted trial) still reaches the searcher."""

    def restore_from_dir(self, dirpath: str) -> None:
        super().restore_from_dir(dirpath)
        trials = restored_trials(dirpath)
        if trials is not None:
            self.reconcile(trials)

    def reconcile(self, trials: list) -> None:
        """Agree with `trials`, the trials of this search that Tune restored (`recovery.RestoredTrial`)."""
        self._counter = len(trials)
        unfinished = {t.trial_id for t in trials if not t.finished}
        limiter = self._limiter()
        if limiter is not None:
            limiter.live_trials = set(unfinished)
            limiter.num_unfinished_live_trials = len(unfinished)
        reconcile = getattr(self._base(), "reconcile", None)
        if reconcile is not None:
            reconcile(trials)

    def on_trial_complete(self, trial_id: str, result=None, error: bool = False) -> None:
        limiter = self._limiter()
        if limiter is not None and trial_id not in limiter.live_trials:
            self._base().on_trial_complete(trial_id, result=result, error=error)
            return
        super().on_trial_complete(trial_id, result=result, error=error)

    def _limiter(self):
        return self.searcher if isinstance(self.searcher, ConcurrencyLimiter) else None

    def _base(self):
        s = self.searcher
        while hasattr(s, "searcher"):
            s = s.searcher
        return s


def restorable(algorithm, max_concurrent: int):
    """The search algorithm Tune runs for `algorithm` (from `searchers.searcher`), at most
    `max_concurrent` trials at a time (pass `max_concurrent_trials=None` to Tune: this holds the
    limit)."""
    if isinstance(algorithm, Searcher):
        return ReconcilingSearchGenerator(ConcurrencyLimiter(algorithm, max_concurrent=max_concurrent))
    algorithm.max_concurrent = max_concurrent
    return algorithm


class MetricResultsOptunaSearch(OptunaSearch):
    """Tune's OptunaSearch as an augtune search runs it.

    - It is told only the results that carry the searched metric. A trial evaluates the metric where
      someone reads it (the scheduler's rungs and its last epoch: `search.plan.trial_base`) and reports
      `epoch` every epoch; Tune's OptunaSearch reads the metric from every result it is given
      (`result[metric]`, a KeyError otherwise). Optuna's intermediate values serve only its own
      pruners, which augtune does not use (ASHA stops trials); the final result always carries it.
    - Restored, it reconciles its study with the trials Tune restores (`reconcile`): its saved state
      can be a snapshot older or newer than Tune's trials, and Optuna's journal, written at every ask
      and tell, newer than both (`augtune.search.recovery`). A trial Tune holds that it does not know
      is matched to the study's trial of the same parameters, or added to the study when it ends; a
      trial of the study that Tune never ran is marked failed. So the study holds each trial Tune ran
      once, with its value.
    """

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


# -- Tune's saves and its background copies -------------------------------------------------------------

def hold_copies_while_saving(controller: Optional[type] = None) -> None:
    """Make Tune's driver save its state only when no copy of its staging folder is in flight (`controller`:
    the class to wrap, Tune's `TuneController` by default): a step's save is put off to a later step (Tune
    would not have copied it now either), the final one waits for the copy. Every copy then starts from
    files the save has finished and signed. Idempotent."""
    if controller is None:
        from ray.tune.execution.tune_controller import TuneController as controller
    checkpoint = controller.checkpoint
    if getattr(checkpoint, "holds_copies", False):
        return

    @functools.wraps(checkpoint)
    def held(self, force: bool = False, wait: bool = False):
        syncer = getattr(getattr(self, "_storage", None), "syncer", None)
        if syncer is not None and syncer._should_continue_existing_sync():
            if not force:
                return None
            try:
                syncer.wait()
            except Exception as e:  # Tune says so when it launches the next copy; wait() forgets it
                logging.getLogger(__name__).warning("copying the experiment state to %s failed: %s",
                                                    getattr(self._storage, "experiment_fs_path", "?"), e)
        return checkpoint(self, force=force, wait=wait)

    held.holds_copies = True
    controller.checkpoint = held


# -- PBT's per-trial state, after a restore -------------------------------------------------------------

def resume_pbt_clock(pbt, trial) -> None:
    """Give a trial Tune restored (its `last_result` and `checkpoint` are back) the PBT state it had: its
    last perturbation at the last multiple of the interval its last result reached (perturbations come
    at every multiple: each trial reports every epoch), its score, result and checkpoint that result's
    (a donor PBT may copy). A trial with no result yet keeps the fresh state PBT gave it."""
    last = trial.last_result or {}
    when = last.get(pbt._time_attr)
    if when is None:
        return
    state = pbt._trial_state[trial]
    state.last_perturbation_time = int(when) // pbt._perturbation_interval * pbt._perturbation_interval
    if pbt._metric in last:
        state.last_score = pbt._metric_op * last[pbt._metric]
        state.last_result = dict(last)
        state.last_checkpoint = trial.checkpoint


def mlflow_run_of(callback, trial) -> Optional[str]:
    """The MLflow run id Ray's `MLflowLoggerCallback` started for `trial` (None before it has)."""
    return callback._trial_runs.get(trial)
