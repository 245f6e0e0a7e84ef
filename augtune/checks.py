"""Checks of a typed config against what is registered: one floor above `config`.

`config` checks types and ranges and imports no other augtune module; what needs a registry (data
sets, base and augmentation methods, metrics, figure kinds) or a parser of its own (phase schedules)
is checked here, by the one function the CLI and the search planner call before anything runs.
"""
from __future__ import annotations

from typing import Collection, Optional

from augtune.config import Config, ConfigError
from augtune.phases import parse_phases, phase_names


def check_config(cfg: Config, figure_kinds: Optional[Collection[str]] = None) -> Config:
    """Refuse, with one line naming the key, what the registries do not know; `cfg` when all is well.

    `figure_kinds`: the figure kinds `eval.figures` may name (the plots' registry, passed down by
    the caller that owns it); None leaves `eval.figures` unchecked.
    """
    _check_registries(cfg)
    _check_phases(cfg)
    if cfg.eval.figures and figure_kinds is not None:
        for i, kind in enumerate(cfg.eval.figures):
            if kind not in figure_kinds:
                known = ", ".join(figure_kinds) or "none yet"
                raise ConfigError(f"eval.figures[{i}]: unknown figure {kind!r} (known: {known})")
    if cfg.dataset.name == "arrays" and not cfg.dataset.path:
        raise ConfigError(
            "dataset.path: the `arrays` dataset needs the .npz or .csv file of features and labels"
        )
    return cfg


def _check_registries(cfg: Config) -> None:
    from augtune.data import DATASETS
    from augtune.eval import METRICS
    from augtune.methods import AUGMENTATIONS, BASES, MomentumObjective

    if cfg.dataset.name not in DATASETS:
        raise ConfigError(
            f"dataset.name: unknown dataset {cfg.dataset.name!r} (known: {', '.join(sorted(DATASETS))})"
        )
    if cfg.method.base not in BASES:
        raise ConfigError(
            f"method.base: unknown base method {cfg.method.base!r} (known: {', '.join(sorted(BASES))})"
        )
    for i, name in enumerate(cfg.method.augment):
        if name not in AUGMENTATIONS:
            known = ", ".join(sorted(AUGMENTATIONS)) or "none yet"
            raise ConfigError(f"method.augment[{i}]: unknown augmentation method {name!r} (known: {known})")
    if len(set(cfg.method.augment)) != len(cfg.method.augment):
        raise ConfigError(f"method.augment: lists a method twice: {list(cfg.method.augment)}")
    for section in ("metrics", "epoch_metrics"):
        for m in getattr(cfg.eval, section):
            if m not in METRICS:
                raise ConfigError(f"eval.{section}: unknown metric {m!r} (known: {', '.join(METRICS)})")
    if cfg.eval.encoder == "target" and not issubclass(BASES[cfg.method.base], MomentumObjective):
        momentum = ", ".join(n for n, c in BASES.items() if issubclass(c, MomentumObjective))
        raise ConfigError(
            f"eval.encoder: {cfg.method.base} has no target encoder (only {momentum} do); use online"
        )


def _check_phases(cfg: Config) -> None:
    """`train.phases` parses; DiffAug's schedule names A (encoder) and B (generator) phases only."""
    if cfg.train.phases:
        try:
            parse_phases(cfg.train.phases, cfg.train.epochs)
        except ValueError as e:
            raise ConfigError(f"train.phases: {e}") from None
    schedule = cfg.diffaug.schedule.strip()
    if schedule == "sync":
        return
    if not schedule:
        raise ConfigError(
            "diffaug.schedule: expected NAME:EPOCHS[,NAME:EPOCHS...] such as A:200,B:400,A:800, "
            "or sync; got an empty string"
        )
    try:
        parse_phases(schedule, 1)
    except ValueError as e:
        raise ConfigError(f"diffaug.schedule: {e}, or sync") from None
    names = phase_names(schedule)
    if names - {"A", "B"}:
        raise ConfigError(f"diffaug.schedule: phases are A (encoder) and B (generator), got "
                          f"{sorted(names - {'A', 'B'})} in {schedule!r}; or sync (both every step)")
    if "A" not in names:
        raise ConfigError(f"diffaug.schedule: {schedule!r} has no A phase, so the encoder would never train")
