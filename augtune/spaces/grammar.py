"""The inline search-space grammar: one YAML value per dotted key becomes one Ray Tune domain.

    search:
      space:
        train.lr: loguniform(1e-4, 1e-1)          # float, log-uniform on [a, b]; 0 < a < b
        train.temperature: uniform(0.05, 1.0)     # float, uniform on [a, b]; a < b
        train.warmup_epochs: quniform(0, 10, 2)   # float, uniform on the multiples of q in [a, b];
                                                  #   q > 0, a and b multiples of q (Tune and Optuna
                                                  #   agree then)
        model.num_layers: randint(2, 5)           # integer in [a, b): b exclusive, as tune.randint
        model.hidden_dim: lograndint(64, 2049)    # integer, log-uniform in [a, b); 0 < a < b
        method.base: choice([simclr, byol])       # one of the values, sampled
        train.batch_size: grid([128, 256])        # every value: crossed by `random` and `grid`,
                                                  #   a categorical for `optuna` (Optuna cannot grid)
        model.proj_dim: [64, 128]                 # a bare YAML list is a choice: choice([64, 128])
        train.epochs: 50                          # any other plain value is a constant of every trial

A list-valued constant (`method.augment`) is a choice of one list: `choice([[pinda]])`.
Exponent numbers (`1e-4`), which PyYAML reads as strings, are read as numbers.
Nothing is evaluated: a call's arguments are read with `yaml.safe_load`. From Python, a mapping may
also hold Tune domains (`tune.loguniform(...)`) or `tune.grid_search([...])` dicts directly.
"""
from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

import yaml
from ray import tune
from ray.tune.search.sample import Categorical, Domain, Float, Integer

from augtune.config import ConfigError

GRAMMAR = ("loguniform(a, b) | uniform(a, b) | quniform(a, b, q) | randint(a, b) | lograndint(a, b) "
           "| choice([v, ...]) | grid([v, ...]) | [v, ...] (a choice) | a plain value (a constant)")

_CALL = re.compile(r"^\s*([A-Za-z_]\w*)\s*\((.*)\)\s*$", re.S)
_LOOKS_LIKE_CALL = re.compile(r"^\s*[A-Za-z_]\w*\s*\(")  # `loguniform(1e-4, 1e-1` is a typo, not a constant
_EXPONENT = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+$")  # YAML 1.1 reads `1e-4` as a string


def _error(key: str, message: str) -> ConfigError:
    return ConfigError(f"search.space.{key}: {message} (grammar: {GRAMMAR})")


def _number(value: Any) -> Any:
    """`1e-4` read by PyYAML as a string -> 0.0001; lists element-wise; anything else unchanged."""
    if isinstance(value, str) and _EXPONENT.match(value.strip()):
        return float(value)
    if isinstance(value, list):
        return [_number(v) for v in value]
    return value


def is_grid(value: Any) -> bool:
    """A `tune.grid_search([...])` entry: a mapping with the single key `grid_search`."""
    return isinstance(value, Mapping) and set(value) == {"grid_search"}


def kind(key: str, value: Any) -> str:
    """`grid`, `domain` (a Tune Float/Integer/Categorical) or `constant`; others are refused."""
    if is_grid(value):
        return "grid"
    if isinstance(value, (Float, Integer, Categorical)):
        return "domain"
    if isinstance(value, Domain):  # tune.sample_from: neither Optuna nor a grid can use it
        raise _error(key, f"{type(value).__name__} domains are not supported; use a define-by-run space "
                          "for values that depend on other values")
    return "constant"


def describe(value: Any) -> str:
    """`loguniform(0.0001, 0.01)`, `choice([64, 128])`, `grid([1, 2])`, `0.5`: for error messages."""
    if is_grid(value):
        return f"grid({list(value['grid_search'])})"
    if isinstance(value, Categorical):
        return f"choice({list(value.categories)})"
    if isinstance(value, (Float, Integer)):
        sampler = type(value.get_sampler()).__name__.lower()
        name = ("log" if "log" in sampler else "") + ("uniform" if isinstance(value, Float) else "randint")
        return f"{name}({value.lower}, {value.upper})"
    return repr(value)


def contains(value: Any, x: Any) -> bool:
    """Whether `x` is a value the entry can take (points and grid presets are checked with it)."""
    if is_grid(value):
        return x in list(value["grid_search"])
    if isinstance(value, Categorical):
        return x in list(value.categories)
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return False
    if isinstance(value, Integer):
        return float(x).is_integer() and value.lower <= x < value.upper  # Tune: upper exclusive
    if isinstance(value, Float):
        return value.lower <= x <= value.upper
    return x == value


MAX_STEPS = 1e12  # values a quniform may take: beyond this it is a float range with a typo in q


def _numbers(key: str, name: str, args: list, count: int, integer: bool = False) -> list:
    what = "integers" if integer else "numbers"
    if len(args) != count or any(isinstance(a, (list, dict)) for a in args):
        raise _error(key, f"{name} takes {count} {what}, got {args}")
    for a in args:
        ok = isinstance(a, int) if integer else isinstance(a, (int, float)) and math.isfinite(a)
        if isinstance(a, bool) or not ok:
            raise _error(key, f"{name} takes {count} {what}, got {a!r} in {args}")
    return args


def _values(key: str, name: str, args: list) -> list:
    if len(args) != 1 or not isinstance(args[0], list):
        raise _error(key, f"{name} takes one list, e.g. {name}([64, 128]), got {args}")
    if not args[0]:
        raise _error(key, f"{name}([]) is empty: give at least one value")
    return args[0]


def _call(key: str, name: str, args: list) -> Any:
    if name in ("choice", "grid"):
        values = _values(key, name, args)
        return tune.choice(values) if name == "choice" else tune.grid_search(values)
    if name in ("loguniform", "uniform"):
        a, b = _numbers(key, name, args, 2)
        if name == "loguniform" and a <= 0:
            raise _error(key, f"{name}({a}, {b}) needs a > 0 (log scale)")
        if not a < b:
            raise _error(key, f"{name}({a}, {b}) needs a < b")
        return tune.loguniform(a, b) if name == "loguniform" else tune.uniform(a, b)
    if name == "quniform":
        a, b, q = _numbers(key, name, args, 3)
        if q <= 0 or not a < b:
            raise _error(key, f"quniform({a}, {b}, {q}) needs a < b and q > 0")
        if not (b - a) / q <= MAX_STEPS:  # also inf and nan: an overflowing range
            raise _error(
                key, f"quniform({a}, {b}, {q}) has more than {MAX_STEPS:.0e} steps; choose a coarser q"
            )
        for bound in (a, b):  # Tune rounds to multiples of q, Optuna steps from a: agree only then
            if abs(bound / q - round(bound / q)) > 1e-9:
                raise _error(key, f"quniform({a}, {b}, {q}) needs a and b to be multiples of q")
        return tune.quniform(a, b, q)
    if name in ("randint", "lograndint"):
        a, b = _numbers(key, name, args, 2, integer=True)
        if name == "lograndint" and a <= 0:
            raise _error(key, f"{name}({a}, {b}) needs a > 0 (log scale)")
        if not a < b:
            raise _error(key, f"{name}({a}, {b}) needs a < b (b is exclusive)")
        if max(abs(a), abs(b)) > 2**63 - 1:  # the samplers draw 64-bit integers
            raise _error(key, f"{name}({a}, {b}) is beyond 64-bit integers")
        return tune.randint(a, b) if name == "randint" else tune.lograndint(a, b)
    raise _error(key, f"unknown function {name!r}")


def parse_domain(key: str, spec: Any) -> Any:
    """One inline entry -> a Tune domain, a `grid_search` dict or a constant; ConfigError naming the key."""
    if isinstance(spec, Domain):
        kind(key, spec)  # refuses sample_from
        return spec
    if isinstance(spec, Mapping):
        if is_grid(spec):
            values = spec["grid_search"]
            if not isinstance(values, (list, tuple)) or not values:
                raise _error(key, f"grid_search needs a non-empty list, got {values!r}")
            return tune.grid_search(list(values))
        raise _error(key, f"a mapping is not a domain: {dict(spec)!r}")
    if isinstance(spec, (list, tuple)):  # a bare YAML list (frozen to a tuple by the config) is a choice
        return _call(key, "choice", [_number(list(spec))])
    if isinstance(spec, str):
        match = _CALL.match(spec)
        if match is None:
            if _LOOKS_LIKE_CALL.match(spec):
                raise _error(key, f"could not read {spec!r}")
            return _number(spec)
        name, inner = match.groups()
        try:
            args = yaml.safe_load(f"[{inner}]")
        except yaml.YAMLError:
            raise _error(key, f"could not read the arguments of {spec!r}") from None
        return _call(key, name, _number(args))
    return spec
