"""Typed, frozen experiment config: YAML in, dotted overrides, errors that name the key.

Every section is a frozen dataclass; a field's metadata carries its range or choices. Loading
refuses unknown keys, wrong types and out-of-range values with one line such as
``train.lr: expected a number > 0, got -1``. Names that live in registries (datasets, methods)
are checked by :func:`check_names`, which imports the registries lazily so that this module stays
importable from everywhere.
"""
from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Optional, Union

import yaml


class ConfigError(ValueError):
    """A config problem, phrased as one line that names the dotted key."""


def _f(default: Any, *, min: float | None = None, max: float | None = None,
       min_open: bool = False, max_open: bool = False, **kw: Any) -> Any:
    """A field with an optional numeric range (closed unless ``*_open``)."""
    meta = {"min": min, "max": max, "min_open": min_open, "max_open": max_open}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=meta, **kw)
    return field(default=default, metadata=meta, **kw)


@dataclass(frozen=True)
class DatasetConfig:
    name: str = "digits"  # the embedded default: scikit-learn's 1797 real 8x8 digits
    root: Optional[str] = None  # folder of the data files; None: the dataset's usual place
    path: Optional[str] = None  # `arrays`: the .npz or .csv file
    as_vectors: bool = False  # flatten images into vectors (the papers' non-vision setting)
    test_fraction: float = _f(0.3, min=0, max=1, min_open=True, max_open=True)  # when no split is given
    split_seed: int = 0  # the stratified split does not move with train.seed: seeds vary training only
    download: bool = False  # never touch the network unless asked
    max_train: Optional[int] = _f(None, min=1)  # stratified, seeded subsample (smoke runs, budgets)
    max_test: Optional[int] = _f(None, min=1)
    standardize: bool = True  # vectors: z-score each feature with train statistics (PiNDA B.2 "rescale")


@dataclass(frozen=True)
class ViewConfig:
    # auto: `simclr` for images, `noise` for vectors (PiNDA's "Random Noise" baseline view)
    name: Literal["auto", "simclr", "identity", "noise", "mask", "noise_mask"] = "auto"
    crop_scale: tuple[float, ...] = (0.2, 1.0)  # SimCLR uses 0.08 on ImageNet; 8x8 digits lose the digit below ~0.2
    flip_p: float = _f(0.5, min=0, max=1)
    jitter: float = _f(0.4, min=0)  # brightness/contrast/saturation strength (SimCLR CIFAR: 0.4)
    hue: float = _f(0.1, min=0, max=0.5)
    jitter_p: float = _f(0.8, min=0, max=1)
    gray_p: float = _f(0.2, min=0, max=1)
    blur_p: float = _f(0.0, min=0, max=1)  # SimCLR drops blur for 32x32 CIFAR; kernel ~10% of the side
    noise_std: float = _f(1.0, min=0)  # vectors: std of the added Gaussian, in standardised units
    mask_p: float = _f(0.2, min=0, max=1, max_open=True)  # vectors: fraction of features zeroed


@dataclass(frozen=True)
class ModelConfig:
    # auto: mlp for vectors, cnn for images up to 32 px, resnet18 above
    backbone: Literal["auto", "mlp", "cnn", "resnet18", "resnet34", "resnet50"] = "auto"
    hidden_dim: int = _f(1024, min=1)  # MLP: PiNDA's 3 layers of 1024 ...
    num_layers: int = _f(3, min=1)
    embed_dim: int = _f(256, min=1)  # ... to a 256-d embedding
    width: int = _f(32, min=1)  # CNN: channels of the first block, doubled per block
    norm: Literal["batch", "none"] = "batch"  # none: makes DDP over ranks equal one big batch exactly
    proj_hidden_dim: int = _f(256, min=1)  # projector 256 -> 128 as PiNDA B.2
    proj_dim: int = _f(128, min=1)
    pred_hidden_dim: int = _f(512, min=1)  # BYOL/SimSiam predictor bottleneck


@dataclass(frozen=True)
class MethodConfig:
    base: str = "simclr"
    augment: tuple[str, ...] = ()  # augmentation methods stacked on the base, in order
    momentum: Optional[float] = _f(None, min=0, max=1)  # EMA start; None: BYOL 0.99, MoCo 0.99 (short runs)
    queue_size: int = _f(4096, min=1)  # MoCo negatives; MoCo v2 uses 65536 on ImageNet


@dataclass(frozen=True)
class TrainConfig:
    epochs: int = _f(20, min=1)
    batch_size: int = _f(256, min=2)  # global: split across DDP ranks
    lr: float = _f(1e-3, min=0, min_open=True)  # PiNDA B.4: Adam 1e-3
    optimizer: Literal["adam", "adamw", "sgd"] = "adam"
    weight_decay: float = _f(1e-6, min=0)
    momentum: float = _f(0.9, min=0, max=1)  # SGD only
    schedule: Literal["cosine", "constant"] = "cosine"
    warmup_epochs: float = _f(0.0, min=0)  # linear ramp; a short smoke run may end inside it
    min_lr_ratio: float = _f(0.0, min=0, max=1)  # cosine ends at lr * min_lr_ratio
    temperature: float = _f(0.1, min=0, min_open=True)  # PiNDA B.4 and NRCC: tau = 0.1
    phases: str = ""  # e.g. "A:200,B:400,A:800", scaled to `epochs`; empty: one phase
    seed: int = 0
    device: Literal["auto", "cpu", "cuda"] = "auto"
    precision: Literal["auto", "fp32", "bf16"] = "auto"  # auto: bf16 autocast on CUDA, fp32 on CPU
    grad_clip: Optional[float] = _f(None, min=0, min_open=True)
    checkpoint_every: int = _f(1, min=0)  # epochs between checkpoints; 0: only the last
    num_threads: Optional[int] = _f(None, min=1)  # torch intra-op threads; None: torch's choice


@dataclass(frozen=True)
class EvalConfig:
    every: int = _f(1, min=0)  # epochs between `epoch_metrics`; 0: only at the end
    epoch_metrics: tuple[str, ...] = ("knn",)  # cheap ones, reported per epoch (schedulers use them)
    metrics: tuple[str, ...] = ("knn", "sr", "linear", "kmeans")  # at the end of the run
    references: bool = True  # also evaluate the `raw` input and the `random-init` backbone
    knn_k: int = _f(5, min=1)  # PiNDA B.3
    sr_epochs: int = _f(50, min=1)  # PiNDA B.3: softmax regression, Adam 1e-3, 50 epochs, batch 256
    sr_lr: float = _f(1e-3, min=0, min_open=True)
    sr_batch_size: int = _f(256, min=1)
    linear_val_fraction: float = _f(0.2, min=0, max=1, min_open=True, max_open=True)
    batch_size: int = _f(1024, min=1)  # feature extraction
    # Whose features are evaluated. target: the EMA copy of a momentum base (BYOL, MoCo), as NRCC
    # 3.6.2 keeps only BYOL's target encoder; the online one is what every other paper evaluates.
    # target_if_any: target for a momentum base, online otherwise (one setting for a grid of bases).
    encoder: Literal["online", "target", "target_if_any"] = "online"
    # Figures drawn at the end of a run into its folder (kinds of `augtune plot`); None: the ones
    # the method's augmentations ask for (PiNDA's noise grid, ...); []: none.
    figures: Optional[tuple[str, ...]] = None
    # `cluster` metric (cluster_acc/nmi/ari/k, k not given): UMAP to a few dimensions, then a
    # mode-seeking clustering (NRCC 3.6.2). kmeans here is UMAP + k-means with k known (the ablation's
    # other row); plain k-means on the features is the `kmeans` metric.
    cluster: Literal["gridshift", "meanshift", "kmeans"] = "gridshift"
    # UMAP settings from umap-learn's "Using UMAP for Clustering" guide (NRCC gives none): 30
    # neighbours, min_dist 0 (dense clumps), 2 components; cosine, the contrastive geometry.
    umap_components: int = _f(2, min=1, max=6)
    umap_neighbors: int = _f(30, min=2)
    umap_min_dist: float = _f(0.0, min=0)
    umap_metric: Literal["cosine", "euclidean"] = "cosine"
    cluster_bandwidth: Optional[float] = _f(None, min=0, min_open=True)  # GridShift cell side / MeanShift radius; None: auto
    cluster_quantile: float = _f(0.05, min=0, max=1, min_open=True, max_open=True)  # auto bandwidth: below the smallest class share


# -- the augmentation methods' own sections: one per paper (hyperparameter names as DESIGN.md) --------

@dataclass(frozen=True)
class PiNDAConfig:
    mu: Literal["zero", "learned"] = "zero"  # PiNDA Fig. 1: mu fixed at 0, only Sigma learned
    noise: Literal["gaussian", "uniform"] = "gaussian"  # N(mu, Sigma) or U(-u, u) pi-noise (3.4)
    generator: Literal["auto", "mlp", "resnet18", "unet"] = "auto"  # auto: mlp for vectors, resnet18 for images (4.2)
    penalty: float = _f(1.0, min=0)  # weight of 1 / mean ||eps|| (App. B.4); 0 lets the noise shrink to nothing
    # Which view slots get the pi-noise view x + eps. pair: Alg. 1, view 1 is x + eps, view 2 is a(x)
    # (PiNDA as the only augmentation); uniform: Alg. 2, each slot draws one member of {a, PiNDA}
    # (probability 1/2 each); auto: pair when view.name is identity, else uniform.
    draw: Literal["auto", "pair", "uniform"] = "auto"
    width: int = _f(32, min=1)  # unet generator: channels of its first level (Table 6 uses a U-Net)
    # The paper's non-vision baselines (App. B.2), augmentation methods of their own:
    simcl_eta: float = _f(0.5, min=0)  # simcl: norm of the added unit-direction noise as a fraction of ||h|| (B.2 gives no scale)
    clae_eps: float = _f(0.1, min=0, min_open=True)  # clae: L-inf budget in input units (standardised vectors; images in [0, 1]: try 8/255)
    clae_steps: int = _f(1, min=1)  # clae: ascent steps (1: FGSM as CLAE; more: PGD with step eps / steps * 2.5)


@dataclass(frozen=True)
class NRCCConfig:
    lam: float = _f(0.1, min=0)  # lambda, weight of the regulariser (paper's choice from {0.1, 0.5, 1})
    tau: float = _f(0.1, min=0, min_open=True)  # temperature of the regulariser (from {0.1, 1, 10})
    delta1: float = _f(0.1, min=0, max=1)  # SGHMC friction (official code: 0.1)
    delta2: float = _f(0.05, min=0)  # SGHMC step (0.05)
    delta3: float = _f(0.99, min=0)  # SGHMC noise scale (0.99)
    steps: int = _f(1, min=0)  # zeta, SGHMC iterations (1)
    negatives: Literal["sghmc", "augment"] = "sghmc"  # augment: the "NRCC w/o SGHMC" ablation (Table 2)
    # eq. 18 moves s with the momentum *before* its update, so with steps: 1 the gradient of eq. 17 is
    # never used (s1 = s0 + delta2 r0); momentum_first uses the updated momentum (textbook SGHMC).
    order: Literal["paper", "momentum_first"] = "paper"


@dataclass(frozen=True)
class CoCorConfig:
    lengths: tuple[int, ...] = (1, 2, 3)  # composite lengths, one view each (5.4)
    pool: Literal["all", "color", "affine"] = "all"  # basic augmentations the composites draw from (5.4)
    consistency: Literal["softplus", "abs"] = "softplus"  # App. A (batch means) or eq. 2 (per sample)
    mmnn: bool = True  # false: one constant target per length (App. F, Table 9)
    meta: Literal["finite_difference", "exact"] = "finite_difference"  # App. B eq. 20, or autograd through the step
    label_fraction: float = _f(0.01, min=0, max=1, min_open=True)  # labelled part of train for the MMNN update
    meta_batch: int = _f(64, min=1)  # samples per length in the MMNN update: its gradient is a batch mean, a subsample keeps it cheap
    meta_every: int = _f(1, min=1)  # MMNN + classifier update every this many steps (Alg. 1: every step)
    view_fraction: float = _f(1.0, min=0, max=1, min_open=True)  # part of each batch given composite views (paper: all); < 1 trades the loss's batch means for time


@dataclass(frozen=True)
class DiffAugConfig:
    lam: float = _f(0.1, min=0, max=1)  # probability a positive is replaced by a generated one (3.6)
    schedule: str = "A:200,B:400,A:800"  # A: encoder steps, B: generator steps (Alg. 1); sync: both every step
    steps: int = _f(1000, min=1)  # diffusion steps T (DDPM)
    nu_y: float = _f(100.0, min=0, min_open=True)  # t-kernel degrees of freedom on the high-dimensional y
    nu_z: float = _f(0.01, min=0, min_open=True)  # ... and on the low-dimensional z
    # R_ij = e^alpha on same-sample pairs (App. B eq. 15); the paper bounds it to [0, 1] (2.1) and gives no
    # value: 1 makes e^alpha kappa_100(0) = 1.08 >= 1, so positives get P = 1 (clamped), as the official
    # code's normalisation gives them
    alpha: float = _f(1.0, min=0)
    # strided (DDIM, eta = 1) steps for the generation during training; None: ancestral over all T
    sample_steps: Optional[int] = _f(50, min=1)
    # clamp the predicted clean sample to the data's range while sampling (DDPM's clip_denoised): images
    # [0, 1], vectors each feature's training min..max; false lets sampling error carry samples anywhere
    clip: bool = True
    denoiser: Literal["auto", "mlp", "unet"] = "auto"  # auto: App. E residual MLP for vectors, App. D U-Net for images
    gen_hidden: int = _f(2000, min=1)  # residual MLP's hidden width (App. E Listing 2: mid_dim=2000)
    gen_width: int = _f(16, min=1)  # U-Net channels of the first stage (App. D Listing 1: 16)
    # Generator updates per batch in B-steps (each with fresh t and noise). 1 is Alg. 1; a small data set
    # gives a B-phase too few steps for a DDPM (digits: 4 a epoch), and an under-trained denoiser's
    # samples blow up by up to 1/sqrt(abar_T) ~ 150
    gen_steps: int = _f(1, min=1)
    gen_lr: Optional[float] = _f(None, min=0, min_open=True)  # generator's Adam lr; None: train.lr
    ema: float = _f(0.999, min=0, max=1, max_open=True)  # EMA of the generator used for sampling (warm-up (1+n)/(10+n))
    # A-step loss: scl, the soft contrastive loss (eq. 2, the paper's default); base, the base objective's
    # own loss (Table 5 B3, "DiffAug w/o L_scl", InfoNCE with SimCLR)
    objective: Literal["scl", "base"] = "scl"


@dataclass(frozen=True)
class RepeatBestConfig:
    top: int = _f(0, min=0)  # re-run the best `top` configurations after the search ...
    seeds: tuple[int, ...] = (1, 2, 3)  # ... once per seed, so tables have mean +- std
    per: Optional[str] = None  # a dotted key (e.g. method.base): the best `top` of each of its values


@dataclass(frozen=True)
class SearchConfig:
    # a registered space (`simclr`, `pinda`, ...) or an inline mapping {dotted key: domain}, e.g.
    # {train.lr: "loguniform(1e-4, 1e-1)", method.base: "choice([simclr, byol])"}
    space: Union[str, dict, None] = None
    algorithm: Literal["optuna", "random", "grid"] = "optuna"  # optuna: TPE, seeded by `seed`
    seed: int = 0
    num_samples: int = _f(4, min=1)  # trials (grid: repeats of the whole grid)
    metric: str = "knn_acc"
    mode: Literal["max", "min"] = "max"
    scheduler: Literal["none", "asha"] = "none"
    grace_period: int = _f(1, min=1)  # ASHA: epochs before a trial may be stopped
    reduction_factor: float = _f(2.0, min=1, min_open=True)
    max_concurrent: Optional[int] = _f(None, min=1)  # None: as many as the resources allow
    max_failures: int = _f(2, min=0)  # retries of a failed trial (a lost node), from its checkpoint
    repeat_best: RepeatBestConfig = field(default_factory=RepeatBestConfig)


@dataclass(frozen=True)
class ResourcesConfig:
    num_workers: int = _f(1, min=1)  # DDP workers per trial; 1: the loop runs inside the trial itself
    use_gpu: bool = False
    cpus_per_worker: float = _f(1.0, min=0, min_open=True)
    gpus_per_worker: float = _f(0.0, min=0)  # 0 with use_gpu: one GPU per worker


@dataclass(frozen=True)
class Config:
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    view: ViewConfig = field(default_factory=ViewConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    method: MethodConfig = field(default_factory=MethodConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    pinda: PiNDAConfig = field(default_factory=PiNDAConfig)
    nrcc: NRCCConfig = field(default_factory=NRCCConfig)
    cocor: CoCorConfig = field(default_factory=CoCorConfig)
    diffaug: DiffAugConfig = field(default_factory=DiffAugConfig)
    search: SearchConfig = field(default_factory=SearchConfig)
    resources: ResourcesConfig = field(default_factory=ResourcesConfig)


# ---------------------------------------------------------------------------------------------
# Parsing and validation

_NONE = type(None)


def _describe(tp: Any) -> str:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not _NONE]
        return " or ".join(_describe(a) for a in inner) + (" or null" if _NONE in args else "")
    if origin is tuple:
        return f"a list of {_describe(args[0])}"
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string",
            dict: "a mapping"}.get(tp, str(tp))


class FrozenDict(dict):
    """A read-only dict, so that configs holding a mapping stay frozen and hashable."""

    def _refuse(self, *args, **kwargs):
        raise TypeError("config mappings are read-only")

    __setitem__ = __delitem__ = update = pop = popitem = clear = setdefault = _refuse  # type: ignore[assignment]

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(tuple(sorted((k, repr(v)) for k, v in self.items())))


def _freeze(value: Any) -> Any:
    if isinstance(value, dict):
        return FrozenDict({k: _freeze(v) for k, v in value.items()})
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    return value


def _coerce(key: str, value: Any, tp: Any) -> Any:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    bad = ConfigError(f"{key}: expected {_describe(tp)}, got {value!r}")
    if origin in (typing.Union, types.UnionType):
        if value is None and _NONE in args:
            return None
        for a in args:
            if a is not _NONE:
                try:
                    return _coerce(key, value, a)
                except ConfigError:
                    pass
        raise bad
    if origin is Literal:
        if value not in args:
            raise bad
        return value
    if origin is tuple:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool) and args[0] is not float:
            value = [value]  # `augment: pinda` means `[pinda]`
        if not isinstance(value, (list, tuple)):
            raise bad
        return tuple(_coerce(f"{key}[{i}]", v, args[0]) for i, v in enumerate(value))
    if tp is bool:
        if not isinstance(value, bool):
            raise bad
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad
        return value
    if tp is float:
        if isinstance(value, str):  # PyYAML reads `1e-3` (no dot) as a string
            try:
                value = float(value)
            except ValueError:
                raise bad from None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
            raise bad
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise bad
        return value
    if tp is dict:  # a free mapping (an inline search space), checked by its own reader
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise bad
        return _freeze(value)
    raise TypeError(f"unsupported config type {tp} for {key}")


def _check_range(key: str, value: Any, meta: dict) -> None:
    if value is None or isinstance(value, (tuple, str, bool)):
        return
    lo, hi = meta.get("min"), meta.get("max")
    if lo is not None and (value <= lo if meta.get("min_open") else value < lo):
        raise ConfigError(f"{key}: expected a number {'>' if meta.get('min_open') else '>='} {lo}, got {value}")
    if hi is not None and (value >= hi if meta.get("max_open") else value > hi):
        raise ConfigError(f"{key}: expected a number {'<' if meta.get('max_open') else '<='} {hi}, got {value}")


def _build(cls: type, data: Any, prefix: str) -> Any:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix or 'config'}: expected a mapping of keys, got {data!r}")
    hints = typing.get_type_hints(cls)
    known = {f.name: f for f in dataclasses.fields(cls)}
    for k in data:
        if k not in known:
            where = f"{prefix}.{k}" if prefix else str(k)
            raise ConfigError(f"{where}: unknown key (known: {', '.join(known)})")
    kwargs = {}
    for name, f in known.items():
        key = f"{prefix}.{name}" if prefix else name
        tp = hints[name]
        if dataclasses.is_dataclass(tp):
            kwargs[name] = _build(tp, data.get(name), key)
        elif name in data:
            value = _coerce(key, data[name], tp)
            _check_range(key, value, f.metadata)
            kwargs[name] = value
    obj = cls(**kwargs)
    _validate_section(obj, prefix)
    return obj


def _validate_section(obj: Any, prefix: str) -> None:
    """Cross-field rules that a single field's type and range cannot say."""
    if isinstance(obj, ViewConfig):
        lo_hi = obj.crop_scale
        if len(lo_hi) != 2 or not 0 < lo_hi[0] <= lo_hi[1] <= 1:
            raise ConfigError(f"{prefix}.crop_scale: expected [lo, hi] with 0 < lo <= hi <= 1, got {list(lo_hi)}")
    if isinstance(obj, TrainConfig):
        if obj.phases:
            from augtune.trainables.phases import parse_phases  # the parser is the loop's
            try:
                parse_phases(obj.phases, obj.epochs)
            except ValueError as e:
                raise ConfigError(f"{prefix}.phases: {e}") from None
    if isinstance(obj, DiffAugConfig) and obj.schedule.strip() != "sync":
        from augtune.trainables.phases import parse_phases, phase_names

        try:
            parse_phases(obj.schedule, 1)
        except ValueError as e:
            raise ConfigError(f"{prefix}.schedule: {e}, or sync") from None
        if not obj.schedule.strip():
            raise ConfigError(f"{prefix}.schedule: expected NAME:EPOCHS[,NAME:EPOCHS...] such as A:200,B:400,A:800, "
                              "or sync; got an empty string")
        names = phase_names(obj.schedule)
        if names - {"A", "B"}:
            raise ConfigError(f"{prefix}.schedule: phases are A (encoder) and B (generator), got "
                              f"{sorted(names - {'A', 'B'})} in {obj.schedule!r}; or sync (both every step)")
        if "A" not in names:
            raise ConfigError(f"{prefix}.schedule: {obj.schedule!r} has no A phase, so the encoder would never train")


def from_dict(data: Any) -> Config:
    return _build(Config, data, "")


def to_dict(cfg: Any) -> dict:
    """Plain, YAML/JSON-friendly dict (tuples become lists)."""
    def plain(v: Any) -> Any:
        if dataclasses.is_dataclass(v):
            return {f.name: plain(getattr(v, f.name)) for f in dataclasses.fields(v)}
        if isinstance(v, tuple):
            return [plain(x) for x in v]
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        return v
    return plain(cfg)


def parse_override(text: str) -> tuple[str, Any]:
    """`train.lr=0.01` -> ("train.lr", 0.01); the value is read as a YAML scalar or list."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(f"--set {text!r}: expected KEY=VALUE with a dotted key, e.g. train.lr=0.01")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        raise ConfigError(f"{key}: could not read value {raw!r} as YAML") from None
    return key, value


def apply_overrides(data: dict, overrides: list[str] | tuple[str, ...]) -> dict:
    """Set `--set KEY=VALUE` strings in a nested dict (not yet validated: `from_dict` does that)."""
    return set_values(data, dict(parse_override(text) for text in overrides))


def set_values(data: dict, values: dict[str, Any]) -> dict:
    """A copy of nested `data` with dotted keys set to values (a trial's parameters, overrides)."""
    data = {k: (dict(v) if isinstance(v, dict) else v) for k, v in (data or {}).items()}
    for key, value in values.items():
        parts = key.split(".")
        node = data
        for i, part in enumerate(parts[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            elif not isinstance(child, dict):
                raise ConfigError(f"{'.'.join(parts[: i + 1])}: is a value, cannot set {key}")
            else:
                child = node[part] = dict(child)
            node = child
        node[parts[-1]] = value
    return data


def read_yaml(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise ConfigError(f"{path}: not valid YAML{where}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of sections at the top level")
    return data


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Read YAML (or defaults when ``path`` is None), apply ``--set`` overrides, validate fully."""
    data = read_yaml(path) if path is not None else {}
    cfg = from_dict(apply_overrides(data, overrides))
    check_names(cfg)
    return cfg


def check_names(cfg: Config) -> None:
    """Names that refer to registries: datasets, base methods and augmentation methods."""
    from augtune.data import DATASETS
    from augtune.eval import METRICS
    from augtune.methods import AUGMENTATIONS, BASES, MomentumObjective

    if cfg.dataset.name not in DATASETS:
        raise ConfigError(f"dataset.name: unknown dataset {cfg.dataset.name!r} (known: {', '.join(sorted(DATASETS))})")
    if cfg.method.base not in BASES:
        raise ConfigError(f"method.base: unknown base method {cfg.method.base!r} (known: {', '.join(sorted(BASES))})")
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
        raise ConfigError(f"eval.encoder: {cfg.method.base} has no target encoder (only {momentum} do); use online")
    if cfg.eval.figures:
        from augtune.plots import PLOTS

        for i, kind in enumerate(cfg.eval.figures):
            if kind not in PLOTS:
                raise ConfigError(f"eval.figures[{i}]: unknown figure {kind!r} (known: {', '.join(PLOTS) or 'none yet'})")
    if cfg.dataset.name == "arrays" and not cfg.dataset.path:
        raise ConfigError("dataset.path: the `arrays` dataset needs the .npz or .csv file of features and labels")


def method_label(cfg: Config) -> str:
    """`simclr`, `byol+pinda`: the row name tables group by."""
    return "+".join((cfg.method.base, *cfg.method.augment))


# Sections named after a method: their keys matter only to runs of that method (a plain SimCLR
# run's `pinda.mu` is a default it never reads).
METHOD_SECTIONS = ("pinda", "nrcc", "cocor", "diffaug")


# Keys of a method's section that another augmentation reads instead (PiNDA's baselines, B.2).
_KEY_READERS = {"pinda.clae_eps": ("clae",), "pinda.clae_steps": ("clae",), "pinda.simcl_eta": ("simcl",)}


def key_applies(key: str, method: str) -> bool:
    """Whether dotted `key` is read by a run whose method label is `method` (`byol+nrcc`)."""
    section = key.split(".")[0]
    if section not in METHOD_SECTIONS:
        return True
    parts = method.split("+")
    return any(reader in parts for reader in _KEY_READERS.get(key, (section,)))


def dotted_keys(cls: type = Config, prefix: str = "") -> set[str]:
    """Every settable dotted key (`train.lr`, `search.repeat_best.top`, ...)."""
    keys: set[str] = set()
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        key = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(hints[f.name]):
            keys |= dotted_keys(hints[f.name], key + ".")
        else:
            keys.add(key)
    return keys
