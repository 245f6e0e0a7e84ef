"""Search spaces: one file per method, as data, and the registry the search module looks names up in.

`search.space` is a registered name (`simclr`, `byol`, `moco`, `simsiam`) or an inline mapping
{dotted key: domain} in the grammar of :mod:`augtune.spaces.grammar`. A named space fixes
`method.base` to its method (a constant), so `space: byol` always searches BYOL. A new space is one
file holding `SPACE = Space(...)` and one line in `SPACES`; a conditional space (PiNDA's learned-mu
settings exist only when `pinda.mu == "learned"`) is a `Space(define_by_run=fn)` whose `fn(trial)`
only calls `trial.suggest_*` with dotted keys as names.

How a space runs under each `search.algorithm` (param_space is the flat {dotted key: ...} dict at
the top level of the Tuner's param_space, so that points_to_evaluate line up with it):

- optuna: `OptunaSearch(**to_optuna_search_kwargs(space), metric=..., mode=...,
  sampler=TPESampler(seed=search.seed))`, param_space `constants(space)`. The searcher holds the
  space, so Tune does not pass it metric and mode: they go to the constructor. `grid([...])`
  entries become categoricals (Optuna cannot grid).
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
import difflib
from collections.abc import Mapping
from typing import Any, Callable

import numpy as np
from ray import tune
from ray.tune.search.sample import Categorical

from augtune.config import ConfigError, dotted_keys
from augtune.spaces import byol, cocor, diffaug, moco, nrcc, pinda, simclr, simsiam
from augtune.spaces.common import Space
from augtune.spaces.grammar import GRAMMAR, contains, describe, is_grid, kind, parse_domain

SPACES: dict[str, Space] = {
    "simclr": simclr.SPACE,
    "byol": byol.SPACE,
    "moco": moco.SPACE,  # MoCo v2
    "simsiam": simsiam.SPACE,
    "pinda": pinda.SPACE,  # PiNDA on SimCLR; the generator is the modality's default
    "pinda_vision": pinda.VISION_SPACE,  # ... with the image generator (ResNet-18 or U-Net) searched
    "nrcc": nrcc.SPACE,  # NRCC on InfoNCE; lambda x tau is the paper's 3x3 grid preset
    "cocor": cocor.SPACE,  # on MoCo v2
    "diffaug": diffaug.SPACE,  # on SimCLR's backbone
}

_NOT_SEARCHABLE = ("search", "resources")  # they set up the search itself, before any trial
_DISCOVERY_TRIALS = 32  # define-by-run: sampled trials (plus the points) whose keys are checked

__all__ = ["GRAMMAR", "SPACES", "Space", "check_keys", "constants", "grid_params", "parse_domain",
           "resolve_space", "sample_values", "searched", "to_optuna_search_kwargs"]


def constants(space: Space) -> dict:
    """The entries every trial gets as they are: the Tuner's param_space under optuna."""
    return {k: v for k, v in space.params.items() if kind(k, v) == "constant"}


def searched(space: Space) -> dict:
    """The entries a searcher varies (Tune domains and grid_search dicts)."""
    return {k: v for k, v in space.params.items() if kind(k, v) != "constant"}


def _define_by_run_values(fn: Callable, study: Any) -> dict:
    trial = study.ask()
    returned = fn(trial)
    if returned is not None and not isinstance(returned, Mapping):
        raise ConfigError(f"search.space: the define-by-run function returned {type(returned).__name__}, "
                          "expected a dict of constants or None")
    return {**trial.params, **(returned or {})}


def _study(sampler: Any) -> Any:
    import optuna

    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # no "A new study created" line per check
    try:
        return optuna.create_study(sampler=sampler)
    finally:
        optuna.logging.set_verbosity(verbosity)


def _keys(space: Space) -> list[str]:
    keys = dict.fromkeys(space.params)
    for point in space.points_to_evaluate:
        keys.update(dict.fromkeys(point))
    for grid in space.grid_presets.values():
        keys.update(dict.fromkeys(grid))
    if space.define_by_run is not None:  # the keys it suggests: sampled trials and each point's branch
        from optuna.samplers import RandomSampler

        study = _study(RandomSampler(seed=0))
        for point in space.points_to_evaluate:
            study.enqueue_trial(dict(point))
        for _ in range(len(space.points_to_evaluate) + _DISCOVERY_TRIALS):
            keys.update(dict.fromkeys(_define_by_run_values(space.define_by_run, study)))
    return list(keys)


def check_keys(space: Space) -> None:
    """Every key is a real dotted config key, and never a `search.*` or `resources.*` one."""
    known = dotted_keys()
    for key in _keys(space):
        if not isinstance(key, str) or key not in known:
            close = difflib.get_close_matches(str(key), known, n=1)
            hint = f" (did you mean {close[0]}?)" if close else " (keys are dotted config keys such as train.lr)"
            raise ConfigError(f"search.space.{key}: unknown config key{hint}")
        if key.split(".")[0] in _NOT_SEARCHABLE:
            raise ConfigError(f"search.space.{key}: search.* and resources.* keys cannot be searched "
                              "(they set up the search before any trial runs)")


def _check_contents(space: Space) -> None:
    """Points and grid presets fit the space; a define-by-run space keeps only constants in params."""
    todo = searched(space)
    if space.define_by_run is not None:
        if todo:
            key = next(iter(todo))
            raise ConfigError(f"search.space.{key}: a define-by-run space suggests its values in the "
                              "function; params hold constants only")
    elif not todo:
        raise ConfigError(f"search.space: every entry is a constant, nothing to search (grammar: {GRAMMAR})")
    for i, point in enumerate(space.points_to_evaluate):
        if space.define_by_run is not None:
            continue  # partial points are fine; Optuna samples the rest
        for key in point:
            if key not in todo:
                raise ConfigError(f"search.space.{key}: points_to_evaluate[{i}] sets a key that is not searched")
        for key, value in todo.items():
            if key not in point:
                raise ConfigError(f"search.space.{key}: points_to_evaluate[{i}] gives no value "
                                  "(Optuna needs every searched key in a point)")
            if not contains(value, point[key]):
                raise ConfigError(f"search.space.{key}: points_to_evaluate[{i}] value {point[key]!r} "
                                  f"is outside {describe(value)}")
    for name, grid in space.grid_presets.items():
        for key, values in grid.items():
            if not isinstance(values, (list, tuple)) or not values:
                raise ConfigError(f"search.space.{key}: grid preset {name!r} needs a non-empty list")
            if space.define_by_run is None:
                if key not in todo:
                    raise ConfigError(f"search.space.{key}: grid preset {name!r} sets a key that is not searched")
                bad = [v for v in values if not contains(todo[key], v)]
                if bad:
                    raise ConfigError(f"search.space.{key}: grid preset {name!r} values {bad} are "
                                      f"outside {describe(todo[key])}")


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
    out: dict[str, Any] = {}
    for key, value in space.params.items():
        if grid is not None and key in grid:
            out[key] = tune.grid_search(list(grid[key]))
        elif kind(key, value) == "constant":
            out[key] = value
        elif grid is not None:
            if key not in default:
                raise ConfigError(f"search.space.{key}: not in grid preset {preset!r} and no first point "
                                  "to hold it at")
            out[key] = default[key]
        elif is_grid(value):
            out[key] = value
        elif isinstance(value, Categorical):
            out[key] = tune.grid_search(list(value.categories))
        else:
            raise ConfigError(f"search.space.{key}: algorithm grid cannot enumerate {describe(value)}; "
                              "use grid([...]) or choice([...]) here, or algorithm optuna or random")
    if grid is not None and space.define_by_run is not None:  # its keys live in the function
        out.update({k: v for k, v in default.items() if k not in out})
        out.update({k: tune.grid_search(list(v)) for k, v in grid.items()})
    return out


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

    domains = {k: tune.choice(list(v["grid_search"])) if is_grid(v) else v for k, v in searched(space).items()}
    return {"space": OptunaSearch.convert_search_space(domains), "points_to_evaluate": points}


def sample_values(space: Space, seed: int) -> dict:
    """One concrete flat sample {dotted key: value}, constants included; seeded, no Ray runtime.

    The search module checks `from_dict(set_values(base, sample_values(space, seed)))` before
    launching, so that a domain that gives invalid values fails before Ray starts.
    """
    if space.define_by_run is not None:
        from optuna.samplers import RandomSampler

        values = _define_by_run_values(space.define_by_run, _study(RandomSampler(seed=seed)))
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


def resolve_space(search_cfg: Any) -> Space:
    """`search.space` (a registered name or an inline mapping) -> a checked Space.

    Unknown names, empty mappings, unknown keys, bad domains and (under `algorithm: grid`) spaces
    that cannot be enumerated raise ConfigError naming the key.
    """
    spec = search_cfg.space
    if spec is None or (isinstance(spec, str) and not spec.strip()):
        raise ConfigError(f"search.space: no space given (a registered name: {', '.join(SPACES)}; "
                          f"or a mapping {{dotted key: domain}} in the grammar {GRAMMAR})")
    if isinstance(spec, Space):
        space = spec
    elif isinstance(spec, str):
        if spec not in SPACES:
            raise ConfigError(f"search.space: unknown space {spec!r} (known: {', '.join(SPACES)}; "
                              "or a mapping {dotted key: domain})")
        space = SPACES[spec]
    elif isinstance(spec, Mapping):
        if not spec:
            raise ConfigError(f"search.space: the mapping is empty; give at least one dotted key, e.g. "
                              f"{{train.lr: loguniform(1e-4, 1e-2)}} (grammar: {GRAMMAR})")
        space = Space(name="inline", params={str(k): parse_domain(str(k), v) for k, v in spec.items()})
    else:
        raise ConfigError(f"search.space: expected a space name or a mapping, got {spec!r}")
    check_keys(space)
    _check_contents(space)
    if getattr(search_cfg, "algorithm", None) == "grid":
        grid_params(space)
    return space
