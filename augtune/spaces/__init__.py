"""Search spaces: one file per method, as data, and the registry the search module looks names up in.

`search.space` is a registered name (`simclr`, `byol`, `moco`, `simsiam`) or an inline mapping
{dotted key: domain} in the grammar of :mod:`augtune.spaces.grammar`. A named space fixes
`method.base` to its method (a constant), so `space: byol` always searches BYOL. A new space is one
file holding `SPACE = Space(...)` and one line in `SPACES`; a conditional space (PiNDA's learned-mu
settings exist only when `pinda.mu == "learned"`) is a `Space(define_by_run=fn)` whose `fn(trial)`
only calls `trial.suggest_*` with dotted keys as names.

How a space becomes a Tune/Optuna search algorithm is `augtune.search.searchers`' business: this
package is data and the checks of that data.
"""
from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any, Callable


from augtune.config import ConfigError, dotted_keys
from augtune.spaces import byol, cocor, diffaug, moco, nrcc, pinda, simclr, simsiam
from augtune.spaces.common import Space
from augtune.spaces.grammar import GRAMMAR, contains, describe, kind, parse_domain

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

_NOT_SEARCHABLE = ("search", "compare", "resources")  # they set up the search itself, before any trial
_DISCOVERY_TRIALS = 32  # define-by-run: sampled trials (plus the points) whose keys are checked

__all__ = ["GRAMMAR", "SPACES", "Space", "check_keys", "constants", "define_by_run_values", "held",
           "on_modality", "parse_domain", "quiet_study", "resolve_space", "searched"]


def constants(space: Space) -> dict:
    """The entries every trial gets as they are."""
    return {k: v for k, v in space.params.items() if kind(k, v) == "constant"}


def searched(space: Space) -> dict:
    """The entries a searcher varies (Tune domains and grid_search dicts)."""
    return {k: v for k, v in space.params.items() if kind(k, v) != "constant"}


def define_by_run_values(fn: Callable, study: Any) -> dict:
    trial = study.ask()
    returned = fn(trial)
    if returned is not None and not isinstance(returned, Mapping):
        raise ConfigError(f"search.space: the define-by-run function returned {type(returned).__name__}, "
                          "expected a dict of constants or None")
    return {**trial.params, **(returned or {})}


def quiet_study(sampler: Any) -> Any:
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

        study = quiet_study(RandomSampler(seed=0))
        for point in space.points_to_evaluate:
            study.enqueue_trial(dict(point))
        for _ in range(len(space.points_to_evaluate) + _DISCOVERY_TRIALS):
            keys.update(dict.fromkeys(define_by_run_values(space.define_by_run, study)))
    return list(keys)


def check_keys(space: Space) -> None:
    """Every key is a real dotted config key, and never a `search.*` or `resources.*` one."""
    known = dotted_keys()
    for key in _keys(space):
        if not isinstance(key, str) or key not in known:
            close = difflib.get_close_matches(str(key), known, n=1)
            hint = (
                f" (did you mean {close[0]}?)" if close else " (keys are dotted config keys such as train.lr)"
            )
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
    if space.define_by_run is None:  # partial points are fine there: Optuna samples the rest
        for i, point in enumerate(space.points_to_evaluate):
            _check_point(i, point, todo)
    for name, grid in space.grid_presets.items():
        _check_grid(name, grid, None if space.define_by_run is not None else todo)


def _check_point(i: int, point: Mapping, todo: dict) -> None:
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


def _check_grid(name: str, grid: Mapping, todo: dict | None) -> None:
    """A grid preset's lists; against the searched domains `todo` where the space has them."""
    for key, values in grid.items():
        if not isinstance(values, (list, tuple)) or not values:
            raise ConfigError(f"search.space.{key}: grid preset {name!r} needs a non-empty list")
        if todo is None:
            continue
        if key not in todo:
            raise ConfigError(f"search.space.{key}: grid preset {name!r} sets a key that is not searched")
        bad = [v for v in values if not contains(todo[key], v)]
        if bad:
            raise ConfigError(f"search.space.{key}: grid preset {name!r} values {bad} are "
                              f"outside {describe(todo[key])}")


def resolve_space(search_cfg: Any, modality: str | None = None) -> Space:
    """`search.space` (a registered name or an inline mapping) -> a checked Space, for data of
    `modality` when given (`Space.fixed_on`).

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
    space = held(space, tuple(getattr(search_cfg, "hold", ()) or ()))
    space = on_modality(space, modality)
    check_keys(space)
    _check_contents(space)
    return space


def on_modality(space: Space, modality: str | None) -> Space:
    """`space` on data of `modality`: the keys it fixes there (`Space.fixed_on`) become constants, out of
    its points and grid presets."""
    fixed = dict(space.fixed_on.get(modality, {})) if modality else {}
    if not fixed:
        return space

    def keep(d: dict) -> dict:
        return {k: v for k, v in d.items() if k not in fixed}

    if space.define_by_run is not None:  # its function would have to learn the fixed values
        raise ConfigError(f"search.space: {space.name!r} is define-by-run; fixed_on needs a params space")
    return Space(name=space.name, params={**space.params, **fixed},
                 points_to_evaluate=[keep(p) for p in space.points_to_evaluate],
                 grid_presets={n: keep(g) for n, g in space.grid_presets.items()})


def held(space: Space, keys: tuple[str, ...]) -> Space:
    """`space` without the `keys` (`search.hold`): out of its params, points and grid presets, so every
    trial keeps the config's value for them."""
    if not keys:
        return space
    if space.define_by_run is not None:
        raise ConfigError(f"search.hold: space {space.name!r} is define-by-run; its keys cannot be held")
    known = dotted_keys()
    for key in keys:
        if key not in known:
            raise ConfigError(f"search.hold: {key!r} is not a config key")
    drop = set(keys)

    def keep(d: dict) -> dict:
        return {k: v for k, v in d.items() if k not in drop}

    return Space(name=space.name, params=keep(space.params),
                 points_to_evaluate=[keep(p) for p in space.points_to_evaluate],
                 grid_presets={n: keep(g) for n, g in space.grid_presets.items()},
                 fixed_on=space.fixed_on)
