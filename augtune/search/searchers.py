"""From a space (data, `augtune.spaces`) to what Ray Tune and Optuna run: the one adapter.

How a space runs under each `search.algorithm` (param_space is the flat {dotted key: ...} dict at
the top level of the Tuner's param_space, so that points_to_evaluate line up with it):

- optuna: `OptunaSearch(**to_optuna_search_kwargs(space), metric=..., mode=...,
  sampler=TPESampler(seed=search.seed))`, param_space `constants(space)`. The searcher holds the
  space, so Tune does not pass it metric and mode: they go to the constructor. Optuna cannot
  enumerate a grid: a `grid([...])` entry under optuna is refused with one line (use choice([...]),
  or algorithm random/grid, which cross grid entries with sampled ones).
- random: a Tune-domain space runs on Tune's `BasicVariantGenerator(points_to_evaluate=
  space.points_to_evaluate, random_state=search.seed)` over `space.params`; its `grid([...])`
  entries are crossed with the sampled ones (num_samples x grid size trials, Tune's rule). A
  define-by-run space runs as optuna with `optuna.samplers.RandomSampler(seed=search.seed)`.
- grid: `BasicVariantGenerator` over `grid_params(space)`, without points (num_samples repeats the
  whole grid). A named space crosses its "default" grid preset and holds every other searched key
  at its first point (the paper default); an inline mapping crosses its `grid([...])` and
  `choice([...])` entries and refuses a continuous one, naming the key.
"""
from __future__ import annotations

import copy
import math
from typing import Any, Optional

import numpy as np
from ray import tune
from ray.tune.search import (BasicVariantGenerator, ConcurrencyLimiter, SearchAlgorithm, SearchGenerator,
                             Searcher)
from ray.tune.search.sample import Categorical, Integer

from augtune.config import Config, ConfigError
from augtune.search.resume import RESUME, take
from augtune.search.adapters import MetricResultsOptunaSearch, Whole, experiment_of, trial_from_spec
from augtune.spaces import Space, constants, define_by_run_values, quiet_study, searched
from augtune.spaces.grammar import describe, is_grid, kind


def grid_params(space: Space, preset: str = "default") -> dict:
    """The param_space for `algorithm: grid` (Tune's BasicVariantGenerator; num_samples repeats it).

    With the preset: its keys are crossed, every other searched key is held at the first point (the
    paper default), constants stay. Without one (inline mappings): `grid([...])` and `choice([...])`
    entries are crossed and a continuous entry is an error naming its key.
    """
    grid = space.grid_presets.get(preset)
    if grid is None and (preset != "default" or space.define_by_run is not None):
        have = ", ".join(space.grid_presets) or "none"
        raise ConfigError(f"search.algorithm: grid needs a grid preset {preset!r} in space "
                          f"{space.name!r} (presets: {have}); a define-by-run space has no grid of its own")
    default = space.points_to_evaluate[0] if space.points_to_evaluate else {}
    out: dict[str, Any] = {key: _grid_entry(key, value, grid, default, preset)
                           for key, value in space.params.items()}
    if grid is not None and space.define_by_run is not None:  # its keys live in the function
        out.update({k: v for k, v in default.items() if k not in out})
        out.update({k: tune.grid_search(list(v)) for k, v in grid.items()})
    return out


def _grid_entry(key: str, value: Any, grid: Optional[dict], default: dict, preset: str) -> Any:
    """What `grid_params` makes of one entry of a space: crossed (the preset's keys; an inline grid or
    choice), kept (a constant), held at the first point (a preset's other keys), or refused."""
    if grid is not None and key in grid:
        return tune.grid_search(list(grid[key]))
    if kind(key, value) == "constant":
        return value
    if grid is not None:
        if key not in default:
            raise ConfigError(f"search.space.{key}: not in grid preset {preset!r} and no first point "
                              "to hold it at")
        return default[key]
    if is_grid(value):
        return value
    if isinstance(value, Categorical):
        return tune.grid_search(list(value.categories))
    raise ConfigError(f"search.space.{key}: algorithm grid cannot enumerate {describe(value)}; "
                      "use grid([...]) or choice([...]) here, or algorithm optuna or random")


def to_optuna_search_kwargs(space: Space) -> dict:
    """`space` and `points_to_evaluate` for `ray.tune.search.optuna.OptunaSearch`.

    A define-by-run space passes its function; a Tune-domain space passes its searched entries as
    Optuna distributions (grid entries as categoricals), so that OptunaSearch neither warns about an
    unconverted space nor meets a grid, which it refuses. Constants are not in it: OptunaSearch drops
    them, so they go into the Tuner's param_space (`constants(space)`). Each point names exactly the
    searched keys, as OptunaSearch checks for a dict space.
    """
    points = [dict(p) for p in space.points_to_evaluate]
    if space.define_by_run is not None:
        return {"space": space.define_by_run, "points_to_evaluate": points}
    from ray.tune.search.optuna import OptunaSearch

    domains = {
        k: tune.choice(list(v["grid_search"])) if is_grid(v) else v for k, v in searched(space).items()
    }
    return {"space": OptunaSearch.convert_search_space(domains), "points_to_evaluate": points}


def edges(space: Space) -> list[tuple[str, Any, str]]:
    """(key, value, which) for every value at the edge of each searched key's domain: each choice of a
    choice or grid; a number domain's lowest value and its highest drawable one (a quantized domain's
    last step within its bound; else the float just below the bound, or the integer below it). A
    config rule is a bound, so a domain whose edges pass holds no value the rule refuses; samples alone
    can miss a sliver at the edge."""
    if space.define_by_run is not None:
        return []
    out: list[tuple[str, Any, str]] = []
    for key, value in space.params.items():
        k = kind(key, value)
        if k == "grid":
            out += [(key, v, "a value of its grid") for v in value["grid_search"]]
        elif isinstance(value, Categorical):
            out += [(key, v, "a choice") for v in value.categories]
        elif k == "domain":
            q = getattr(value.get_sampler(), "q", None)
            if q is not None:  # Tune rounds a draw to a multiple of q: the highest one within the bound
                top = math.floor(value.upper / q + 1e-9) * q
                top = int(top) if isinstance(value, Integer) else top
            elif isinstance(value, Integer):
                top = value.upper - 1
            else:
                top = math.nextafter(float(value.upper), float(value.lower))
            out += [(key, value.lower, "its domain's lowest value"), (key, top, "its domain's highest value")]
    return out


def sample_values(space: Space, seed: int) -> dict:
    """One concrete flat sample {dotted key: value}, constants included; seeded, no Ray runtime.

    The search module checks `from_dict(set_values(base, sample_values(space, seed)))` before
    launching, so that a domain that gives invalid values fails before Ray starts.
    """
    if space.define_by_run is not None:
        from optuna.samplers import RandomSampler

        values = define_by_run_values(space.define_by_run, quiet_study(RandomSampler(seed=seed)))
        return {**copy.deepcopy(constants(space)), **values}
    rng = np.random.default_rng(seed)
    out: dict[str, Any] = {}
    for key, value in space.params.items():
        k = kind(key, value)
        if k == "constant":
            out[key] = copy.deepcopy(value)
        elif k == "grid":
            values = list(value["grid_search"])
            out[key] = values[int(rng.integers(len(values)))]
        else:
            out[key] = value.sample(random_state=rng)
        if isinstance(out[key], np.generic):
            out[key] = out[key].item()
    return out


def check_algorithm(search_cfg: Any, space: Space) -> None:
    """A space `search.algorithm` can run: grid needs an enumerable space; optuna cannot run a grid."""
    s = search_cfg
    if s.algorithm == "grid":
        grid_params(space)
    elif s.algorithm == "optuna" and space.define_by_run is None:
        grids = [k for k, v in space.params.items() if is_grid(v)]
        if grids:
            raise ConfigError(
                f"search.space.{grids[0]}: grid([...]) with algorithm optuna: Optuna samples, it "
                "cannot enumerate a grid; use choice([...]) to let it sample, or algorithm "
                "random (grid entries crossed with sampled ones) or grid"
            )


def searcher(cfg: Config, space: Space, storage: Any = None, done: Optional[list[dict]] = None,
             asked: int = 0):
    """(search algorithm, param_space) for `search.algorithm`; `storage`: Optuna's study storage; `done`:
    the configs of the trials a resumed search holds (its study's first points are not asked again);
    `asked`: the trials its study holds already, which seed its sampler on from `search.seed` (a sampler
    seeded as before would draw the draws it drew before again). The algorithm is a Searcher (Optuna) or a
    variant generator; `limited` makes it what Tune runs."""
    s = cfg.search
    if s.algorithm == "grid":
        return VariantGenerator(), grid_params(space)
    if s.algorithm == "random" and space.define_by_run is None:
        return VariantGenerator(points_to_evaluate=space.points_to_evaluate or None,
                                random_state=s.seed), dict(space.params)
    import optuna

    seed = s.seed + asked
    sampler = (optuna.samplers.TPESampler(seed=seed) if s.algorithm == "optuna"
               else optuna.samplers.RandomSampler(seed=seed))
    extra = {} if storage is None else {"storage": storage, "study_name": "augtune"}
    kwargs = to_optuna_search_kwargs(space)
    held = [dict(c) for c in done or ()]
    kwargs["points_to_evaluate"] = [p for p in kwargs["points_to_evaluate"] if not take(held, p)] or None
    return MetricResultsOptunaSearch(**kwargs, metric=s.metric, mode=s.mode, sampler=sampler, **extra), \
        constants(space)


def limited(algorithm, max_concurrent: int):
    """The search algorithm Tune runs for `algorithm` (from `searcher`), at most `max_concurrent` trials
    at a time (0: no limit; Tune's own `max_concurrent_trials` is left unset: this holds the limit)."""
    if isinstance(algorithm, Searcher):
        return SearchGenerator(ConcurrencyLimiter(algorithm, max_concurrent=max_concurrent))
    algorithm.max_concurrent = max_concurrent
    return algorithm


class VariantGenerator(BasicVariantGenerator):
    """Tune's BasicVariantGenerator (grid and random search; its variants are deterministic: the grid,
    and the sampler seeded with `search.seed`) where a preset point's list value (a choice of lists:
    CoCor's `cocor.lengths`) goes in wrapped (`adapters.Whole`): Tune reads a list in a preset as nested
    keys and failed on it; the trial's config gets the list."""

    def __init__(self, *args, points_to_evaluate: Optional[list] = None, **kwargs):
        points = [{k: Whole(v) if isinstance(v, (list, tuple)) else v for k, v in p.items()}
                  for p in points_to_evaluate or ()]
        super().__init__(*args, points_to_evaluate=points or None, **kwargs)

    def next_trial(self):
        trial = super().next_trial()
        if trial is not None:
            trial.config = {k: Whole.unwrap(v) for k, v in trial.config.items()}
            trial.evaluated_params = {k: Whole.unwrap(v) for k, v in trial.evaluated_params.items()}
        return trial


class Wrapping(SearchAlgorithm):
    """A search algorithm around another (`inner`): what Tune asks of its metric, its search properties,
    its trials in all and its end, the inner one answers."""

    inner: Any

    @property
    def metric(self):
        return getattr(self.inner, "metric", None)

    def set_search_properties(self, metric: Optional[str], mode: Optional[str], config: dict, **spec) -> bool:
        return self.inner.set_search_properties(metric, mode, config, **spec)

    @property
    def total_samples(self) -> int:
        return self.inner.total_samples

    def set_finished(self) -> None:
        self.inner.set_finished()


class Continuing(Wrapping):
    """A search's algorithm (`limited`), continued by a resume (`augtune.search.resume`): first the
    trials its records hold unfinished, made again (`again`: their configs, `RESUME` included), then only
    the trials the search still lacks: a variant generator's variants a record holds (`held`: the configs
    the searcher made each recorded trial with) are skipped; an Optuna searcher is asked for its budget
    less the trials recorded (`recorded`), and told of each trial made again when it ends (`numbers`: its
    folder -> the study's trial still running for it). At most `max_concurrent` trials at a time (0: no
    limit), the trials made again included. New, nothing held: the algorithm as it is."""

    def __init__(self, inner, max_concurrent: int = 0, again: tuple = (), held: tuple = (),
                 recorded: int = 0, optuna: Optional[MetricResultsOptunaSearch] = None,
                 numbers: Optional[dict] = None):
        self.inner, self.max_concurrent = inner, max_concurrent
        self._again = [dict(c) for c in again]
        self._held = [dict(c) for c in held]
        self._recorded, self._optuna, self._numbers = recorded, optuna, dict(numbers or {})
        self._experiment = None
        self._live: set[str] = set()
        self._mine: set[str] = set()  # the trials made again
        self._inner_done = False

    def add_configurations(self, experiments) -> None:
        self._experiment = experiment_of(experiments)
        if self._optuna is None or not self._recorded:
            self.inner.add_configurations(experiments)
            return
        left = int(self._experiment.spec.get("num_samples", 1)) - self._recorded
        if left <= 0:
            self._inner_done = True
            return
        own = copy.copy(self._experiment)
        own.spec = {**self._experiment.spec, "num_samples": left}
        self.inner.add_configurations([own])

    def next_trial(self):
        if self.max_concurrent and len(self._live) >= self.max_concurrent:
            return None
        if self._again:
            config = self._again.pop(0)
            trial = trial_from_spec(self._experiment.spec, config, "resumed")
            self._mine.add(trial.trial_id)
            if self._optuna is not None and config[RESUME]["folder"] in self._numbers:
                self._optuna.adopt(trial.trial_id, self._numbers[config[RESUME]["folder"]])
        else:
            trial = self._next_new()
        if trial is not None:
            self._live.add(trial.trial_id)
        return trial

    def _next_new(self):
        while not self._inner_done:
            trial = self.inner.next_trial()
            if trial is None or self._optuna is not None or not take(self._held, trial.config):
                return trial
            self.inner.on_trial_complete(trial.trial_id)  # a variant a record holds: its slot is free again
        return None

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        if trial_id not in self._mine:
            self.inner.on_trial_result(trial_id, result)

    def on_trial_complete(self, trial_id: str, result: Optional[dict] = None, error: bool = False) -> None:
        self._live.discard(trial_id)
        if trial_id in self._mine:
            if self._optuna is not None:  # straight to the study: the limiter never saw it
                self._optuna.on_trial_complete(trial_id, result=result, error=error)
            return
        self.inner.on_trial_complete(trial_id, result=result, error=error)

    def is_finished(self) -> bool:
        return not self._again and (self._inner_done or self.inner.is_finished())

