"""Population Based Training over a method's per-epoch knobs (`search.scheduler: pbt | pb2`).

Ray Tune's public `PopulationBasedTraining` and `PB2` run the population: every `search.pbt.interval`
epochs a trial in the bottom `quantile` copies the checkpoint of one in the top (the whole run: model,
target networks, optimisers and their learning-rate position, each augmentation's own state, the RNG
streams, the epoch counter) and continues it under perturbed values of the `mutate` keys, from the next
epoch on (the trial's record keeps the lineage: `augtune.trainables.ray_trainable.run_loop`).

How a key is perturbed follows its domain in the entrant's own space (:class:`Explore`, handed to Tune
as its `custom_explore_fn`, so the rules are augtune's and seeded by `search.seed`):

- a log domain (`loguniform`, `lograndint`): multiplied by 1.2 or 0.8 (PBT's factors), in its bounds;
- a linear domain (`uniform`, `randint`): moved by a tenth of its range up or down, in its bounds (a
  multiplicative step could never leave 0, e.g. DiffAug's lambda);
- a choice (or a grid's values): the next value to the left or right (the one inward at an end);
- any of them, with probability `resample_probability`: drawn anew from the domain.

Integers are rounded and quantized domains kept on their step. PB2 chooses the new values itself (a GP
bandit within each numeric domain's bounds); :class:`Explore` then only rounds and clips them.

Everything that can be wrong is refused by :func:`check_pbt` at planning, in one line naming the key:
a mutated key the space does not search, or that the method reads only at set-up; Optuna (TPE would
credit a trial's last score to its first values, which PBT replaced: Tune refuses a Searcher under PBT
too); a define-by-run space (its domains are conditional); a repeat of the best (a PBT trial's values
are a schedule: `augtune export --schedule` and `augtune train` replay it).
"""
from __future__ import annotations

import math
import random
from dataclasses import replace
from typing import Any

from ray.tune.search.sample import Categorical, Float, Integer

from augtune.checks import check_knobs
from augtune.config import Config, ConfigError, format_value, from_dict, set_values
from augtune.spaces import Space, constants, searched
from augtune.spaces.grammar import describe, is_grid

FACTORS = (1.2, 0.8)  # PBT's multiplicative perturbations (Jaderberg et al., 2017; Tune's default)
LINEAR_STEP = 0.1  # a linear domain's perturbation: this fraction of its range


def _is_log(domain: Any) -> bool:
    sampler = domain.get_sampler()
    inner = getattr(sampler, "sampler", sampler)  # a quantized sampler wraps the plain one
    return "log" in type(inner).__name__.lower()


def _step(domain: Any) -> float | None:
    return getattr(domain.get_sampler(), "q", None)


def values_of(domain: Any) -> list | None:
    """The values of a choice or a grid entry; None for a numeric domain."""
    if is_grid(domain):
        return list(domain["grid_search"])
    if isinstance(domain, Categorical):
        return list(domain.categories)
    return None


class Explore:
    """PBT's explore step over `domains` ({dotted key: Tune domain or grid entry}); Tune calls it with a
    copy of the donor's config (`custom_explore_fn`). A resumed search makes it anew: it draws its later
    perturbations from the seed again (as Tune's PBT, whose population state also starts afresh on a
    resume; the trials continue from their checkpoints, their records keep their lineage, and each keeps
    its clock: `multiplex.EntrantsScheduler`). `perturb` False (PB2): only round and clip the values PB2
    chose."""

    def __init__(self, domains: dict[str, Any], resample_probability: float, seed: int,
                 perturb: bool = True):
        self.domains = dict(domains)
        self.resample_probability = resample_probability
        self.perturb = perturb
        self.rng = random.Random(seed)

    def __call__(self, config: dict) -> dict:
        out = dict(config)
        for key, domain in self.domains.items():
            if key in out:
                out[key] = self.explore(domain, out[key]) if self.perturb else self.clip(domain, out[key])
        return out

    def explore(self, domain: Any, value: Any) -> Any:
        choices = values_of(domain)
        if choices is not None:
            if value not in choices or self.rng.random() < self.resample_probability:
                return self.rng.choice(choices)
            i = choices.index(value)
            j = i + self.rng.choice((-1, 1))
            if not 0 <= j < len(choices):
                j = i - (j - i)  # at an end: inward
            return choices[min(max(j, 0), len(choices) - 1)]
        if self.rng.random() < self.resample_probability:
            return self.clip(domain, self.sample(domain))
        up = self.rng.random() < 0.5
        if _is_log(domain):
            new = value * (max(FACTORS) if up else min(FACTORS))
        else:
            hi = domain.upper - (1 if isinstance(domain, Integer) else 0)
            new = value + (1 if up else -1) * LINEAR_STEP * (hi - domain.lower)
        new = self.clip(domain, new)
        if isinstance(domain, Integer) and new == value:  # a step below one integer: one, that way
            new = self.clip(domain, value + (1 if up else -1))
        return new

    def sample(self, domain: Any) -> float:
        lo, hi = domain.lower, domain.upper - (1 if isinstance(domain, Integer) else 0)
        if _is_log(domain):
            return math.exp(self.rng.uniform(math.log(lo), math.log(hi)))
        return self.rng.uniform(lo, hi)

    @staticmethod
    def clip(domain: Any, value: Any) -> Any:
        """`value` inside a numeric domain's bounds (Tune's integer upper bound is exclusive), on its
        quantization step and rounded for an integer one; a choice's value as it is."""
        if not isinstance(domain, (Float, Integer)):
            return value
        hi = domain.upper - 1 if isinstance(domain, Integer) else domain.upper
        q = _step(domain)
        if q:
            value = round(value / q) * q
        value = min(max(value, domain.lower), hi)
        return int(round(value)) if isinstance(domain, Integer) else float(value)


def _trial_cfg(base: dict, space: Space) -> Config:
    """A trial's config (what its method reads): the space's first point, a choice's first value and a
    numeric domain's lower bound for the keys it does not name."""
    point = space.points_to_evaluate[0] if space.points_to_evaluate else {}
    first = {k: (values_of(d) or [d.lower])[0] for k, d in searched(space).items()}
    return from_dict(set_values(base, {**first, **constants(space), **point}))


def mutated_keys(cfg: Config, space: Space, base: dict) -> tuple[str, ...]:
    """`search.pbt.mutate`, checked against the space and the method's per-epoch knobs (one line naming
    the key); empty: every searched key that is a per-epoch knob."""
    from augtune.methods import knobs

    pbt = cfg.search.pbt
    domains = searched(space)
    trial = _trial_cfg(base, space)
    if not pbt.mutate:
        keys = tuple(k for k in domains if k in knobs(trial))
        if not keys:
            raise ConfigError(f"search.pbt.mutate: space {space.name!r} searches no key that its method "
                              f"reads at every epoch (per-epoch knobs: {', '.join(knobs(trial))})")
        return keys
    for i, key in enumerate(pbt.mutate):
        if key not in domains:
            raise ConfigError(f"search.pbt.mutate[{i}]: {key} is not searched by space {space.name!r} "
                              f"(searched: {', '.join(domains) or 'none'})")
    check_knobs(trial, {f"search.pbt.mutate[{i}]": key for i, key in enumerate(pbt.mutate)})
    if len(set(pbt.mutate)) != len(pbt.mutate):
        raise ConfigError(f"search.pbt.mutate: lists a key twice: {list(pbt.mutate)}")
    return tuple(pbt.mutate)


def check_pbt(cfg: Config, space: Space, base: dict) -> Config:
    """`cfg` (a PBT or PB2 search) with `search.pbt.mutate` resolved, or a ConfigError naming the key (see
    the module doc)."""
    s = cfg.search
    if s.algorithm == "optuna":
        raise ConfigError(f"search.algorithm: optuna with scheduler {s.scheduler}: TPE would credit a "
                          "trial's last score to its first values, which PBT replaces; use random (PBT's own "
                          "initial population) or grid")
    if space.define_by_run is not None:
        raise ConfigError(f"search.scheduler: {s.scheduler} perturbs a space of Tune domains; space "
                          f"{space.name!r} is define-by-run (its domains are conditional)")
    if s.repeat_best.top:
        raise ConfigError(f"search.repeat_best.top: a {s.scheduler} trial's values are a schedule, which a "
                          "repeat of constant values would not replay; set 0 and replay the best with "
                          "`augtune export --schedule` and `augtune train`")
    if s.num_samples < 2:
        raise ConfigError(f"search.num_samples: {s.scheduler} needs a population of at least 2 trials")
    if s.pbt.interval >= cfg.train.epochs:
        raise ConfigError(f"search.pbt.interval: {s.pbt.interval} epochs is not below train.epochs "
                          f"({cfg.train.epochs}): no trial would ever be perturbed")
    keys = mutated_keys(cfg, space, base)
    if s.scheduler == "pb2":
        for key in keys:
            if values_of(searched(space)[key]) is not None:
                raise ConfigError(f"search.pbt.mutate: pb2 chooses numbers within bounds; {key} is "
                                  f"{describe(searched(space)[key])} (use scheduler pbt)")
    return replace(cfg, search=replace(s, pbt=replace(s.pbt, mutate=keys)))


def pbt_scheduler(cfg: Config, space: Space):
    """Tune's PopulationBasedTraining (or PB2) for a planned `cfg` (its `mutate` resolved) and `space`.
    Perturbations happen on `epoch` (Tune's training_iteration restarts after a restore), where every
    trial reports a checkpoint and the metric (the plan's `rung_epochs`); metric and mode come from
    the TuneConfig."""
    s = cfg.search
    domains = {k: searched(space)[k] for k in s.pbt.mutate}
    if s.scheduler == "pb2":
        from ray.tune.schedulers.pb2 import PB2

        bounds = {k: [d.lower, d.upper - (1 if isinstance(d, Integer) else 0)] for k, d in domains.items()}
        return PB2(time_attr="epoch", perturbation_interval=s.pbt.interval, hyperparam_bounds=bounds,
                   quantile_fraction=s.pbt.quantile, require_attrs=False, log_config=False,
                   custom_explore_fn=Explore(domains, 0.0, s.seed, perturb=False))
    from ray.tune.schedulers import PopulationBasedTraining

    # no hyperparam_mutations: Explore applies the rules above, Tune's own would not know log domains
    return PopulationBasedTraining(
        time_attr="epoch", perturbation_interval=s.pbt.interval, quantile_fraction=s.pbt.quantile,
        resample_probability=s.pbt.resample_probability, require_attrs=False, log_config=False,
        custom_explore_fn=Explore(domains, s.pbt.resample_probability, s.seed))


def describe_pbt(cfg: Config) -> str:
    p = cfg.search.pbt
    keys = ", ".join(p.mutate) or "every searched per-epoch knob"
    return (f"{cfg.search.scheduler.upper()} every {p.interval} epoch(s), quantile {format_value(p.quantile)}"
            + (f", resample {format_value(p.resample_probability)}" if cfg.search.scheduler == "pbt" else "")
            + f": mutates {keys}")
