"""Checks of a typed config against what is registered: one floor above `config`.

`config` checks types and ranges and imports no other augtune module; what needs a registry (data
sets, base and augmentation methods, metrics, figure kinds) or a parser of its own (phase schedules)
is checked here, by the one function the CLI and the search planner call before anything runs
(:func:`check_config`), and what needs the data's size by :func:`check_against_data`, once the data
is loaded and before a network is built.

Sizes are estimated before anything is allocated: the model's parameters are counted from the config
(`augtune.models.backbones.model_parameters`, in Python integers) and, with the data, the whole
method's networks are built on PyTorch's `meta` device (shapes only, no memory); a model whose
weights, gradients and optimiser state cannot fit is one line naming the key that makes it so.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Collection, Optional

from augtune.config import METHOD_SECTIONS, Config, ConfigError
from augtune.phases import parse_phases, phase_names

# Bytes of training state (fp32 weights, gradients, the optimiser's moments) no config may ask for
# before its data is known: 1 TiB, beyond any one node this project trains on. With the data, the
# bound is the memory this machine has left (:func:`check_against_data`).
MAX_MODEL_BYTES = 1 << 40
# The model's keys that size its networks, in the order a culprit is looked for.
_MODEL_SIZE_KEYS = ("width", "hidden_dim", "num_layers", "embed_dim", "proj_hidden_dim", "proj_dim",
                    "pred_hidden_dim")


def check_config(cfg: Config, figure_kinds: Optional[Collection[str]] = None) -> Config:
    """Refuse, with one line naming the key, what the registries do not know; `cfg` when all is well.

    `figure_kinds`: the figure kinds `eval.figures` may name (the plots' registry, passed down by
    the caller that owns it); None leaves `eval.figures` unchecked.
    """
    _check_registries(cfg)
    _check_phases(cfg)
    check_knobs(cfg, {f"schedule[{i}].set.{k}": k for i, step in enumerate(cfg.schedule) for k in step.set})
    if cfg.eval.figures and figure_kinds is not None:
        for i, kind in enumerate(cfg.eval.figures):
            if kind not in figure_kinds:
                known = ", ".join(figure_kinds) or "none yet"
                raise ConfigError(f"eval.figures[{i}]: unknown figure {kind!r} (known: {known})")
    if cfg.dataset.name == "arrays" and not cfg.dataset.path:
        raise ConfigError(
            "dataset.path: the `arrays` dataset needs the .npz or .csv file of features and labels"
        )
    _check_model_size(cfg)
    return cfg


def check_knobs(cfg: Config, keys: dict[str, str]) -> None:
    """Every key of `keys` ({where it is written: dotted key}) is one this run reads at every epoch
    (`augtune.methods.knobs`): a key read only at set-up (a network's width) cannot change mid-run."""
    from augtune.methods import knobs

    allowed = knobs(cfg)
    for where, key in keys.items():
        if key not in allowed:
            label = "+".join((cfg.method.base, *cfg.method.augment))
            raise ConfigError(f"{where}: {key} is read only at set-up, or not by {label}; it cannot change "
                              f"during a run (per-epoch knobs of {label}: {', '.join(allowed)})")


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


# -- sizes ------------------------------------------------------------------------------------

def bytes_to_train(parameters: int, optimizer: str) -> int:
    """Bytes of fp32 training state for `parameters`: weights and gradients, and Adam's two moments
    (SGD's one momentum buffer). Activations come on top: this is a floor, not a forecast."""
    return parameters * 4 * (3 if optimizer == "sgd" else 4)


def _sci(n: int) -> str:
    """A count of any size in a few characters: 620,256 / 3.8e+26 / 10^1234."""
    if n < 10**7:
        return f"{n:,}"
    return f"{n:.2g}" if n.bit_length() < 1000 else f"10^{int(n.bit_length() * 0.30103)}"


def _size(n: int) -> str:
    if n >= 1000 << 50:
        return f"{_sci(n)} bytes"
    for unit, scale in (("PiB", 1 << 50), ("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n / 1024:.1f} KiB"


def _shown(value: Any) -> str:
    return _sci(value) if type(value) is int else str(value)


def _least_parameters(model) -> int:
    """The fewest parameters the model section can give on any data (a lower bound at config time):
    on the smallest input each backbone `model.backbone` may resolve to takes (one feature, one 8x8
    channel; a ResNet counts only its projector, its own size being fixed)."""
    from augtune.models.backbones import mlp_params, model_parameters

    name, found = model.backbone, []
    if name in ("auto", "mlp"):
        mlp = dataclasses.replace(model, backbone="mlp")
        found.append(model_parameters(mlp, "vector", (1,)))
    if name in ("auto", "cnn"):
        cnn = dataclasses.replace(model, backbone="cnn")
        found.append(model_parameters(cnn, "image", (1, 8, 8)))
    if name == "auto" or name.startswith("resnet"):
        found.append(mlp_params(512, model.proj_hidden_dim, model.proj_dim, model.norm))
    return min(found)


def _check_model_size(cfg: Config) -> None:
    """Refuse a model section whose networks no machine can train (a width of 10^12), counted on
    the smallest data it could meet, before the data is read."""
    need = bytes_to_train(_least_parameters(cfg.model), cfg.train.optimizer)
    if need <= MAX_MODEL_BYTES:
        return
    default = type(cfg.model)()
    options = [(_least_parameters(dataclasses.replace(cfg.model, **{k: getattr(default, k)})), k)
               for k in _MODEL_SIZE_KEYS if getattr(cfg.model, k) != getattr(default, k)]
    key = min(options)[1] if options else "backbone"
    raise ConfigError(f"model.{key}: {_shown(getattr(cfg.model, key))} makes a model that needs at "
                      f"least {_size(need)} to train (weights, gradients, optimiser state); at "
                      f"most {_size(MAX_MODEL_BYTES)} is allowed")


def check_against_data(cfg: Config, data: Any) -> None:
    """What only the data's size can tell, checked once it is loaded, before a network is built or a
    file written: `eval.knn_k` below the number of training samples (k-NN over all of them gives
    every test sample the same vote: chance, without a word), and the method's networks within the
    memory left. One ConfigError line naming the key."""
    n = len(data.y_train)
    e = cfg.eval
    if n == 0:  # data without labels: only the label-free scores
        from augtune.records import LABEL_FREE

        for section in ("metrics", "epoch_metrics"):
            needs = [m for m in getattr(e, section) if m not in LABEL_FREE]
            if needs:
                raise ConfigError(f"eval.{section}: {needs[0]} needs labels and this data has none "
                                  f"({len(data.x_unlabeled)} unlabelled rows); score it by "
                                  f"{', '.join(sorted(LABEL_FREE))}")
        if "cocor" in cfg.method.augment and cfg.cocor.mmnn:
            raise ConfigError("cocor.mmnn: MMNN learns its targets from labelled rows and this data has "
                              "none: set cocor.mmnn: false (one constant target per length)")
    if "knn" in (*e.metrics, *e.epoch_metrics) and e.knn_k >= n > 0:
        raise ConfigError(f"eval.knn_k: {_sci(e.knn_k)} is not below the {n} training samples; "
                          f"k-NN over every sample gives each test sample the same vote (PiNDA: 5)")
    monitored = min(n, e.monitor_size or n)
    if "knn" in e.epoch_metrics and e.knn_k >= monitored:
        raise ConfigError(f"eval.knn_k: {e.knn_k} is not below eval.monitor_size ({monitored}), "
                          f"the training samples the per-epoch k-NN votes among")
    _check_method_size(cfg, data)


_UNCOUNTABLE = -1  # a network with more elements than one tensor can index (int64 overflows)


def _method_bytes(cfg: Config, data: Any) -> Optional[int]:
    """Bytes of training state of every network `cfg` builds on `data` (backbone, heads, the
    augmentation methods' generators; buffers such as MoCo's queue held once), counted on the `meta`
    device: nothing is allocated. `_UNCOUNTABLE` past what a tensor can index; None when a method
    cannot be built without real data (the model section is counted from the config instead)."""
    import torch

    from augtune.methods import build_method

    state = torch.get_rng_state()
    try:
        with torch.device("meta"):
            method = build_method(cfg, data)
    except RuntimeError as err:
        if "overflow" in str(err):  # "Storage size calculation overflowed", "numel: ... overflow"
            return _UNCOUNTABLE
        return None
    except Exception:  # a method that reads its data while building (CoCor's labelled subset)
        return None
    finally:
        torch.set_rng_state(state)  # the real build draws the same weights as if this had not run
    trained = sum(p.numel() for p in method.parameters() if p.requires_grad)
    held = sum(p.numel() for p in method.parameters() if not p.requires_grad)
    held += sum(b.numel() for b in method.buffers())
    return bytes_to_train(trained, cfg.train.optimizer) + 4 * held


def _model_bytes(cfg: Config, data: Any) -> int:
    """`_method_bytes`, else the model section's networks counted from the config."""
    from augtune.models.backbones import model_parameters

    found = _method_bytes(cfg, data)
    if found is not None:
        return found
    predictor = cfg.method.base in ("byol", "simsiam")
    count = model_parameters(cfg.model, data.modality, tuple(data.shape), predictor)
    return bytes_to_train(count, cfg.train.optimizer)


def _check_method_size(cfg: Config, data: Any) -> None:
    from augtune.data.formats import available_memory

    need, free, where = _model_bytes(cfg, data), available_memory(), "of memory is available"
    gpu = _gpu_free(cfg)
    if gpu is not None:
        free, where = gpu, "of GPU memory is free"
    if free is None or 0 <= need <= free:
        return
    key, value = _size_culprit(cfg, data)
    size = "more than a tensor can index" if need == _UNCOUNTABLE else f"at least {_size(need)}"
    raise ConfigError(f"{key}: {_shown(value)} makes networks that need {size} to train (weights, "
                      f"gradients, optimiser state); only {_size(free)} {where}")


def _gpu_free(cfg: Config) -> Optional[int]:
    """Free bytes of the GPU the run will train on, or None on the CPU."""
    if cfg.train.device == "cpu":
        return None
    import torch

    if not torch.cuda.is_available():
        return None
    return int(torch.cuda.mem_get_info()[0])


def _size_culprit(cfg: Config, data: Any) -> tuple[str, Any]:
    """The integer key whose default shrinks the networks most, and its value: the one to name."""
    from augtune.config import from_dict, set_values, to_dict

    base, default = to_dict(cfg), to_dict(Config())
    found = []
    for section in ("model", "method", *METHOD_SECTIONS):
        for k, v in base[section].items():
            if type(v) is not int or v == default[section][k]:
                continue
            smaller = from_dict(set_values(base, {f"{section}.{k}": default[section][k]}))
            need = _model_bytes(smaller, data)
            found.append((need if need != _UNCOUNTABLE else float("inf"), f"{section}.{k}", v))
    if not found:
        return "model.backbone", cfg.model.backbone
    _, key, value = min(found, key=lambda f: f[0])
    return key, value
