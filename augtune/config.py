"""Typed, frozen experiment config: YAML in, dotted overrides, errors that name the key.

Every section is a frozen dataclass; a field's metadata carries its range or choices. Loading
refuses unknown keys, wrong types and out-of-range values with one line such as
``train.lr: expected a number > 0, got -1``. This module is the ground floor: it imports no other
augtune module. Names that live in registries (datasets, methods, metrics, figures) and rules that
need a parser of their own (phase schedules) are checked one floor up, by :mod:`augtune.checks`.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import reprlib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Optional, Union

import yaml


class ConfigError(ValueError):
    """A config problem, phrased as one line that names the dotted key."""


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxdict, _REPR.maxstring, _REPR.maxother = 2, 4, 4, 40, 40
_REPR.maxlong = 40  # an integer of 70 digits (a seed of 2e70) is shown by its ends

# The largest seed: numpy's and scikit-learn's `random_state` (the split, k-means, UMAP, Optuna's
# sampler) take 0 .. 2^32 - 1; torch takes more, but one seed feeds them all.
MAX_SEED = 2**32 - 1


def short(value: Any) -> str:
    """A bounded repr for error messages: a value can be huge (a YAML anchor bomb expands to billions)."""
    return _REPR.repr(value)


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
    # the stratified split does not move with train.seed: seeds vary training only
    split_seed: int = _f(0, min=0, max=MAX_SEED)
    # redraw the train/test split from split_seed (stratified, the same sizes) even where the data comes
    # split (Fashion-MNIST's files, a folder with train/ and test/): `compare.vary: [init, split]` sets it
    # in each repeat run, with split_seed = its train.seed
    resplit: bool = False
    # a validation split carved from the training split (stratified, by split_seed): a search's trials
    # train on the rest and are scored on it, so choosing a configuration never reads the test split;
    # its repeat runs and `augtune train` train on the whole training split and are scored on the test
    # split (a race's repeat runs: on the rest, scored on both). 0: none (a search then selects on the
    # test split, and its tables say so)
    val_fraction: float = _f(0.2, min=0, max=1, max_open=True)
    # the held-out split this run is scored on: test, or val (the split above; the test split is then not
    # read at all), or both (trained without the validation split, scored on the test split, and on the
    # validation split as val_<metric>: a compare's race chooses on those). A search sets it per trial
    # (val for its trials when val_fraction > 0, test for repeats, both for a race's repeats)
    evaluate_on: Literal["test", "val", "both"] = "test"
    download: bool = False  # never touch the network unless asked
    max_train: Optional[int] = _f(None, min=1)  # stratified, seeded subsample (smoke runs, budgets)
    max_test: Optional[int] = _f(None, min=1)
    standardize: bool = True  # vectors: z-score each feature with train statistics (PiNDA B.2 "rescale")
    # imagefolder: side in px of the square every image is resized (shorter side) and centre-cropped to;
    # training views are random resized crops at this size. 64: Tiny-ImageNet's own; ImageNet-100 (CoCor): 224
    image_size: int = _f(64, min=8)
    # imagefolder: memory decodes every image once into uint8 (N x 3 x S x S bytes, shared per node);
    # none streams them from the files, decoded per batch in `workers` processes (sets larger than memory)
    cache: Literal["memory", "none"] = "memory"
    workers: int = _f(2, min=0, max=256)  # imagefolder: DataLoader processes decoding images; 0: in the trial
    # stl10: pre-train on train + the 100k unlabelled images (evaluation: labelled splits)
    unlabeled: bool = False
    # Rows without a label train beside the labelled ones and are never scored nor split into test or
    # validation: a CSV row whose label cell is empty or NA, an .npz's x_unlabeled, an image folder's
    # unlabeled/ folder beside its class folders, or the folder named here (imagefolder; absolute, or
    # relative to dataset.path)
    unlabeled_dir: Optional[str] = None
    # keep this many labels per class of the training split (seeded by split_seed, the same rows in every
    # run) and train on the rest as unlabelled rows: "what if I had only 10 labels per class". What the
    # scores fit on (k-NN's neighbours, the probes) is then those labels; the validation and test splits
    # keep theirs (a score needs them). None: every label
    labels_per_class: Optional[int] = _f(None, min=1)
    # one memory-mapped copy of the prepared data per node, shared by concurrent trials (and reused by the
    # next run) instead of one copy per trial; false: each process reads and holds its own
    shared: bool = True
    # where that copy lives (absolute); None: $XDG_CACHE_HOME/augtune/shared. Point it at a node-local disk
    # when the home folder is a network share
    shared_dir: Optional[str] = None


@dataclass(frozen=True)
class ViewConfig:
    # auto: `simclr` for images, `noise` for vectors (PiNDA's "Random Noise" baseline view)
    name: Literal["auto", "simclr", "identity", "noise", "mask", "noise_mask"] = "auto"
    # SimCLR uses 0.08 on ImageNet; 8x8 digits lose the digit below ~0.2
    crop_scale: tuple[float, ...] = (0.2, 1.0)
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
    # DDP on GPUs: BatchNorm statistics over the global batch (SyncBatchNorm) instead of each rank's slice
    sync_bn: bool = False


@dataclass(frozen=True)
class MethodConfig:
    base: str = "simclr"
    augment: tuple[str, ...] = ()  # augmentation methods stacked on the base, in order
    momentum: Optional[float] = _f(None, min=0, max=1)  # EMA start; None: BYOL 0.99, MoCo 0.99 (short runs)
    queue_size: int = _f(4096, min=1)  # MoCo negatives; MoCo v2 uses 65536 on ImageNet
    # BYOL/MoCo target's BatchNorm running statistics: own, updated by the target's own forward passes as
    # in BYOL's, MoCo's and lightly's code; online, copied from the online network after every step. They
    # matter only where the target runs in eval mode (eval.encoder: target, NRCC's SGHMC density)
    target_bn: Literal["own", "online"] = "own"


@dataclass(frozen=True)
class TrainConfig:
    epochs: int = _f(20, min=1)
    batch_size: int = _f(256, min=2)  # global: split across DDP ranks
    lr: float = _f(1e-3, min=0, max=100, min_open=True)  # PiNDA B.4: Adam 1e-3
    optimizer: Literal["adam", "adamw", "sgd"] = "adam"
    weight_decay: float = _f(1e-6, min=0)
    momentum: float = _f(0.9, min=0, max=1)  # SGD only
    schedule: Literal["cosine", "constant"] = "cosine"
    warmup_epochs: float = _f(0.0, min=0)  # linear ramp; a short smoke run may end inside it
    min_lr_ratio: float = _f(0.0, min=0, max=1)  # cosine ends at lr * min_lr_ratio
    temperature: float = _f(0.1, min=0, min_open=True)  # PiNDA B.4 and NRCC: tau = 0.1
    phases: str = ""  # e.g. "A:200,B:400,A:800", scaled to `epochs`; empty: one phase
    seed: int = _f(0, min=0, max=MAX_SEED)
    device: Literal["auto", "cpu", "cuda"] = "auto"
    precision: Literal["auto", "fp32", "bf16"] = "auto"  # auto: bf16 autocast on CUDA, fp32 on CPU
    grad_clip: Optional[float] = _f(None, min=0, min_open=True)
    # epochs between checkpoints (0: only the last), or a wall time such as "5min", "30s", "1h" (a checkpoint
    # when that long has passed since the last one; the last epoch always gets one); None: 1 epoch for
    # `augtune train`, 5min for a search's trials (a checkpoint of a short epoch can cost more than the epoch)
    checkpoint_every: Union[int, str, None] = _f(None, min=0)
    num_threads: Optional[int] = _f(None, min=1)  # torch intra-op threads; None: torch's choice
    # knobs (dotted keys) recorded per epoch beside the ones `schedule` sets; a PBT search's trials get the
    # keys PBT mutates here (`search.pbt.mutate`), so that their record keeps the values each epoch used
    track: tuple[str, ...] = ()
    # GPU switches, the same training up to rounding (tested on the CPU; their speed-up measured on a GPU):
    channels_last: bool = False  # images in NHWC memory order: faster convolutions on tensor cores
    # torch.compile of the backbone (nn.Module.compile: checkpoints keep their keys); true is torch's default
    # mode, a mode name passes it on (reduce-overhead: CUDA graphs, for a step bound by kernel launches)
    compile: Union[bool, Literal["default", "reduce-overhead", "max-autotune"]] = False


@dataclass(frozen=True)
class EvalConfig:
    # epochs between `epoch_metrics`; 0: only at the end (and `at`). None: every epoch in `augtune train`
    # (its progress lines), only where a scheduler reads them in a search (its rungs; see `at`)
    every: Optional[int] = _f(None, min=0)
    epoch_metrics: tuple[str, ...] = ("knn",)  # cheap ones, reported per epoch (schedulers use them)
    metrics: tuple[str, ...] = ("knn", "sr", "linear", "kmeans")  # at the end of the run
    references: bool = True  # also evaluate the `raw` input and the `random-init` backbone
    knn_k: int = _f(5, min=1)  # PiNDA B.3
    sr_epochs: int = _f(50, min=1)  # PiNDA B.3: softmax regression, Adam 1e-3, 50 epochs, batch 256
    sr_lr: float = _f(1e-3, min=0, min_open=True)
    sr_batch_size: int = _f(256, min=1)
    linear_val_fraction: float = _f(0.2, min=0, max=1, min_open=True, max_open=True)
    # feature extraction; None: 256 on a CPU (measured 1.7-1.9x faster than 1024 there), 1024 on a GPU
    batch_size: Optional[int] = _f(None, min=1)
    # epochs (1-based) at which `epoch_metrics` are evaluated besides every `every`: a scheduler's rungs
    # (a search sets them; the last epoch always gets the full evaluation)
    at: tuple[int, ...] = ()
    # per-epoch metrics on a fixed, seeded subsample of at most this many train and test samples (the
    # end-of-run evaluation uses all of them); None: every sample every time
    monitor_size: Optional[int] = _f(10000, min=1)
    # folder where `raw` (per data set) and `random-init` (per data set, model and seed) are kept once
    # computed, for every later run with the same inputs; None: computed in every run
    reference_cache: Optional[str] = None
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
    # GridShift cell side / MeanShift radius; None: auto
    cluster_bandwidth: Optional[float] = _f(None, min=0, min_open=True)
    # auto bandwidth: below the smallest class share
    cluster_quantile: float = _f(0.05, min=0, max=1, min_open=True, max_open=True)
    # rankme / alignment / uniformity (label-free): on a fixed subsample of at most this many held-out rows
    # (the same rows in every run: the effective rank grows with the rows until it reaches the dimension)
    label_free_samples: int = _f(2048, min=2)


# -- the augmentation methods' own sections, one per paper (names: docs/contributing.md) --------

@dataclass(frozen=True)
class PiNDAConfig:
    mu: Literal["zero", "learned"] = "zero"  # PiNDA Fig. 1: mu fixed at 0, only Sigma learned
    noise: Literal["gaussian", "uniform"] = "gaussian"  # N(mu, Sigma) or U(-u, u) pi-noise (3.4)
    # auto: mlp for vectors, resnet18 for images (4.2)
    generator: Literal["auto", "mlp", "resnet18", "unet"] = "auto"
    # weight of 1 / mean ||eps|| (App. B.4); 0 lets the noise shrink to nothing
    penalty: float = _f(1.0, min=0)
    # Which view slots get the pi-noise view x + eps. pair: Alg. 1, view 1 is x + eps, view 2 is a(x)
    # (PiNDA as the only augmentation); uniform: Alg. 2, each slot draws one member of {a, PiNDA}
    # (probability 1/2 each); auto: pair when view.name is identity, else uniform.
    draw: Literal["auto", "pair", "uniform"] = "auto"
    width: int = _f(32, min=1)  # unet generator: channels of its first level (Table 6 uses a U-Net)
    # The paper's non-vision baselines (App. B.2), augmentation methods of their own:
    # simcl: norm of the added unit-direction noise as a fraction of ||h|| (B.2 gives no scale)
    simcl_eta: float = _f(0.5, min=0)
    # clae: L-inf budget in input units (standardised vectors; images in [0, 1]: try 8/255)
    clae_eps: float = _f(0.1, min=0, min_open=True)
    # clae: ascent steps (1: FGSM as CLAE; more: PGD with step eps / steps * 2.5)
    clae_steps: int = _f(1, min=1)


@dataclass(frozen=True)
class NRCCConfig:
    lam: float = _f(0.1, min=0)  # lambda, weight of the regulariser (paper's choice from {0.1, 0.5, 1})
    tau: float = _f(0.1, min=0, min_open=True)  # temperature of the regulariser (from {0.1, 1, 10})
    delta1: float = _f(0.1, min=0, max=1)  # SGHMC friction (official code: 0.1)
    delta2: float = _f(0.05, min=0)  # SGHMC step (0.05)
    delta3: float = _f(0.99, min=0)  # SGHMC noise scale (0.99)
    steps: int = _f(1, min=0)  # zeta, SGHMC iterations (1)
    negatives: Literal["sghmc", "augment"] = "sghmc"  # augment: the "NRCC w/o SGHMC" ablation (Table 2)
    # momentum_first: move with the updated momentum, as the official code and textbook SGHMC do;
    # paper: eq. 18 read literally moves with the momentum *before* its update, so with steps: 1 the
    # gradient of eq. 17 is never used (s1 = s0 + delta2 r0)
    order: Literal["paper", "momentum_first"] = "momentum_first"
    # the density's gradient is clipped element-wise to [-grad_clip, grad_clip] (official code: 1); null: not
    grad_clip: Optional[float] = _f(1.0, min=0, min_open=True)


@dataclass(frozen=True)
class CoCorConfig:
    lengths: tuple[int, ...] = (1, 2, 3)  # composite lengths, one view each (5.4)
    pool: Literal["all", "color", "affine"] = "all"  # basic augmentations the composites draw from (5.4)
    consistency: Literal["softplus", "abs"] = "softplus"  # App. A (batch means) or eq. 2 (per sample)
    mmnn: bool = True  # false: one constant target per length (App. F, Table 9)
    # how the MMNN's hypergradient is computed, exactly either way: forward_mode (App. B's central difference
    # taken in its limit eps -> 0 by forward-mode differentiation: no second-order graph of the encoder) or
    # exact (autograd through the look-ahead step)
    meta: Literal["forward_mode", "exact"] = "forward_mode"
    # labelled part of train for the MMNN update
    label_fraction: float = _f(0.01, min=0, max=1, min_open=True)
    # samples per length in the MMNN update: its gradient is a batch mean, a subsample keeps it cheap
    meta_batch: int = _f(64, min=1)
    meta_every: int = _f(1, min=1)  # MMNN + classifier update every this many steps (Alg. 1: every step)
    # part of each batch given composite views (paper: all); < 1 trades the loss's batch means for time
    view_fraction: float = _f(1.0, min=0, max=1, min_open=True)


@dataclass(frozen=True)
class DiffAugConfig:
    lam: float = _f(0.1, min=0, max=1)  # probability a positive is replaced by a generated one (3.6)
    # A: encoder steps, B: generator steps (Alg. 1); sync: both every step
    schedule: str = "A:200,B:400,A:800"
    steps: int = _f(1000, min=1)  # diffusion steps T (DDPM)
    nu_y: float = _f(100.0, min=0, min_open=True)  # t-kernel degrees of freedom on the high-dimensional y
    nu_z: float = _f(0.01, min=0, min_open=True)  # ... and on the low-dimensional z
    # R_ij = e^alpha on same-sample pairs (App. B eq. 15); the paper bounds it to [0, 1] (2.1) and gives no
    # value: 1 makes e^alpha kappa_100(0) = 1.08 >= 1, so positives get P = 1 (clamped), as the official
    # code's normalisation gives them
    alpha: float = _f(1.0, min=0)
    # evenly strided steps of the ancestral sampler (a DDPM on the respaced chain, not DDIM) for the
    # generation during training and in figures; None: all T steps
    sample_steps: Optional[int] = _f(50, min=1)
    # sigma_t^2 of each ancestral step (eq. 7 leaves it open; DDPM's two choices): beta, the respaced chain's
    # beta ("fixed large"); posterior, q(x_prev | x_t, x0)'s beta_tilde ("fixed small", = DDIM eta 1). On a
    # strided chain beta can be ~60x beta_tilde: with an exact predictor beta spreads samples wider than
    # the data, posterior narrower (README: DiffAug, sampler)
    sample_variance: Literal["beta", "posterior"] = "beta"
    # clamp the predicted clean sample to the data's range while sampling (DDPM's clip_denoised): images
    # [0, 1], vectors each feature's training min..max; false lets sampling error carry samples anywhere
    clip: bool = True
    # auto: App. E residual MLP for vectors, App. D U-Net for images
    denoiser: Literal["auto", "mlp", "unet"] = "auto"
    gen_hidden: int = _f(2000, min=1)  # residual MLP's hidden width (App. E Listing 2: mid_dim=2000)
    gen_width: int = _f(16, min=1)  # U-Net channels of the first stage (App. D Listing 1: 16)
    # Generator updates per batch in B-steps, each with fresh t and noise. 1 is Alg. 1. More train the
    # generator more on a small data set at gen_steps times the B-phase's cost; in the main job's 6
    # epochs its positives kept their anchor's class at chance at any total up to 576 updates, and the
    # encoder learnt the same (DiffAug method page, "gen_steps")
    gen_steps: int = _f(1, min=1)
    gen_lr: Optional[float] = _f(None, min=0, min_open=True)  # generator's Adam lr; None: train.lr
    # EMA of the generator used for sampling (warm-up (1+n)/(10+n))
    ema: float = _f(0.999, min=0, max=1, max_open=True)
    # A-step loss: scl, the soft contrastive loss (eq. 2, the paper's default); base, the base objective's
    # own loss (Table 5 B3, "DiffAug w/o L_scl", InfoNCE with SimCLR)
    objective: Literal["scl", "base"] = "scl"


@dataclass(frozen=True)
class RepeatBestConfig:
    top: int = _f(0, min=0)  # re-run the best `top` configurations after the search ...
    seeds: tuple[int, ...] = (1, 2, 3)  # ... once per seed, so tables have mean +- std
    per: Optional[str] = None  # a dotted key (e.g. method.base): the best `top` of each of its values


@dataclass(frozen=True)
class PBTConfig:
    """`search.scheduler: pbt | pb2`: when trials exploit and explore (Jaderberg et al., 2017)."""
    interval: int = _f(2, min=1)  # epochs between perturbations (each trial checkpoints at these epochs)
    # dotted keys perturbed at each exploit: keys of the searched space that the method reads at every
    # epoch (`augtune methods` lists them); empty: every such key of the space
    mutate: tuple[str, ...] = ()
    # fraction of the population in the bottom quantile (copies a top one) and in the top (is copied)
    quantile: float = _f(0.25, min=0, max=0.5, min_open=True)
    # pbt: probability that a mutated key is drawn anew from its domain instead of perturbed
    resample_probability: float = _f(0.25, min=0, max=1)


@dataclass(frozen=True)
class SearchConfig:
    # a registered space (`simclr`, `pinda`, ...) or an inline mapping {dotted key: domain}, e.g.
    # {train.lr: "loguniform(1e-4, 1e-1)", method.base: "choice([simclr, byol])"}
    space: Union[str, dict, None] = None
    # dotted keys the space must not vary: they keep this config's value in every trial (e.g. a registered
    # space's batch size, or method.base to put a method's space on another base)
    hold: tuple[str, ...] = ()
    algorithm: Literal["optuna", "random", "grid"] = "optuna"  # optuna: TPE, seeded by `seed`
    seed: int = _f(0, min=0, max=MAX_SEED)
    num_samples: int = _f(4, min=1)  # trials (grid: repeats of the whole grid)
    metric: str = "knn_acc"
    mode: Literal["max", "min"] = "max"
    # asha: stop weak trials early; pbt: Population Based Training (Ray Tune's PopulationBasedTraining):
    # every `pbt.interval` epochs a weak trial copies a strong one's whole run and perturbs its `pbt.mutate`
    # keys, so each trial trains under a schedule of values; pb2: the same, the new values chosen by PB2's
    # GP bandit (Parker-Holder et al., 2020) within the space's bounds (numeric keys only)
    scheduler: Literal["none", "asha", "pbt", "pb2"] = "none"
    grace_period: int = _f(1, min=1)  # ASHA: epochs before a trial may be stopped
    reduction_factor: float = _f(2.0, min=1, min_open=True)
    pbt: PBTConfig = field(default_factory=PBTConfig)
    max_concurrent: Optional[int] = _f(None, min=1)  # None: as many as the resources allow
    max_failures: int = _f(2, min=0)  # retries of a failed trial (a lost node), from its checkpoint
    keep_checkpoints: int = _f(1, min=1)  # a trial's newest checkpoints kept (earlier ones deleted)
    # Ray Tune's logger callbacks: tensorboard (Tune's default), wandb and mlflow (extras augtune[wandb],
    # augtune[mlflow]); trials and repeat runs are named by method and phase. []: Tune's CSV/JSON only
    loggers: tuple[Literal["tensorboard", "wandb", "mlflow"], ...] = ("tensorboard",)
    repeat_best: RepeatBestConfig = field(default_factory=RepeatBestConfig)


# search.scheduler values under which each trial trains under a schedule of values (a PBT population)
SCHEDULES = ("pbt", "pb2")
VARY = ("init", "split")  # what a compare's repeat seeds may vary (compare.vary)
MAX_TIME_BUDGET_S = 30 * 24 * 3600  # compare.time_budget: at most 30 days
SPLIT_VARIES_BELOW = 5000  # compare.vary's default varies the split of test splits smaller than this


@dataclass(frozen=True)
class RaceConfig:
    """`compare.race`: the repeat phase as a race (F-Race, irace): seeds go, round by round, only to the
    candidates no paired test has shown worse than the best (see augtune/analysis/race.py)."""
    # off: each entrant's best re-run on `compare.seeds` fixed seeds. Off by default: a race runs up to
    # finalists x max_seeds / seeds times the repeat runs of the fixed design (the main job turns it on)
    enabled: bool = False
    min_seeds: int = _f(3, min=2)  # round 1: every candidate on seeds 1..min_seeds (a paired test needs 2)
    # the race stops here at the latest: at most entrants x finalists x max_seeds repeat runs
    max_seeds: int = _f(10, min=2)
    # candidates per entrant: its search's best `finalists` distinct configurations, each re-run (one
    # search run is too noisy to pick the best one from: the winner's curse)
    finalists: int = _f(2, min=1, max=50)


@dataclass(frozen=True)
class CompareConfig:
    """`augtune compare`: every entrant searched under the same budget, its best re-run on new seeds."""
    # entrants by augmentation method, `base` for the base alone; None: every method that applies to the
    # data's modality (images: base, pinda, nrcc, cocor, diffaug; vectors add random_noise, simcl, clae)
    methods: Optional[tuple[str, ...]] = None
    bases: Optional[tuple[str, ...]] = None  # None: (method.base,); [simclr, byol, moco, simsiam] for all
    trials: int = _f(4, min=1)  # per entrant: Optuna TPE over its own space, the papers' defaults first
    # the fewest search trials time_budget may leave an entrant (or trials, when fewer): one trial is no
    # search, only the defaults; a budget that cannot give this many is refused, naming one that can
    min_trials: int = _f(4, min=1)
    # what the equal budget holds equal: epochs (every entrant train.epochs, the papers' protocol) or
    # compute (every entrant about the CPU/GPU seconds of the cheapest one's train.epochs, measured before
    # Ray starts: a method whose epoch costs 3x trains a third of the epochs; the verdict says so)
    equal: Literal["epochs", "compute"] = "epochs"
    seeds: int = _f(3, min=1)  # the best configuration re-run on train.seed + 1 .. + seeds (shared by all)
    # how each entrant's search runs: asha (TPE, weak trials stopped early), none (TPE to the end), pbt or
    # pb2 (a population under `search.pbt`, each trial trained under a schedule of its per-epoch knobs; the
    # repeat replays the best trial's schedule from scratch). Several: every method is entered once under
    # each, a schedule against a constant (its label gets @pbt), and the verdict says which wins
    scheduler: tuple[Literal["asha", "none", "pbt", "pb2"], ...] = ("asha",)
    alpha: float = _f(0.05, min=0, max=1, min_open=True, max_open=True)  # significance level of the verdict
    metrics: tuple[str, ...] = ("knn_acc",)  # the verdict's columns; the first one is what is searched
    # what differs between the repeat runs' seeds: init (weights, views, batches) or [init, split] (each
    # seed also redraws the train/test split, stratified, same sizes; the references are measured on each
    # seed's split and paired with it). None: [init, split] when the test split has fewer than 5000
    # samples, where which samples land in it moves accuracy by about as much as a method does; [init] on
    # larger ones, whose split (often a published one) then stays the one results are reported on
    vary: Optional[tuple[str, ...]] = None
    # a wall-time budget such as 20m, 90s, 1.5h: trials and epochs shrink together (trials not below
    # min_trials; then seeds, to 2) until the compare's estimate fits, from each entrant's first epoch timed
    # before Ray starts; the values above and train.epochs are the most it runs. None: no budget
    time_budget: Optional[str] = None
    race: RaceConfig = field(default_factory=RaceConfig)
    # equivalence margin in the metric's units (0.01 = 1 point of an accuracy): the race stops when every
    # remaining pair is shown within it (paired TOST), and the verdict names pairs shown equivalent;
    # None: no equivalence is claimed
    margin: Optional[float] = _f(None, min=0, min_open=True)


@dataclass(frozen=True)
class ResourcesConfig:
    # DDP workers per trial; 1: the loop runs inside the trial itself
    num_workers: int = _f(1, min=1, max=4096)
    use_gpu: bool = False
    # a bound: Ray and torch take it as given
    cpus_per_worker: float = _f(1.0, min=0, max=1024, min_open=True)
    gpus_per_worker: float = _f(0.0, min=0, max=64)  # 0 with use_gpu: one GPU per worker


_METHOD = {"method_section": True}  # field metadata of a section named after an augmentation method


@dataclass(frozen=True)
class ScheduleStep:
    """One step of `schedule`: from epoch `epoch` (1-based) on, the keys of `set` take these values."""
    epoch: int = _f(1, min=1)  # the first epoch (1-based, as a record's epochs) trained with these values
    set: dict = _f({})  # {dotted key: value}: per-epoch knobs only (`augtune methods` lists them)


@dataclass(frozen=True)
class Config:
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    view: ViewConfig = field(default_factory=ViewConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    method: MethodConfig = field(default_factory=MethodConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    # an augmentation method's own section (`_METHOD`): only runs of that method read its keys
    pinda: PiNDAConfig = field(default_factory=PiNDAConfig, metadata=_METHOD)
    nrcc: NRCCConfig = field(default_factory=NRCCConfig, metadata=_METHOD)
    cocor: CoCorConfig = field(default_factory=CoCorConfig, metadata=_METHOD)
    diffaug: DiffAugConfig = field(default_factory=DiffAugConfig, metadata=_METHOD)
    search: SearchConfig = field(default_factory=SearchConfig)
    compare: CompareConfig = field(default_factory=CompareConfig)
    resources: ResourcesConfig = field(default_factory=ResourcesConfig)
    # values that change during the run, piecewise constant: [{epoch: 5, set: {pinda.penalty: 0.5}}, ...]
    # (epochs 1-based and increasing, at most train.epochs); before the first step the keys keep the
    # values above. `augtune export --schedule` writes the one a PBT trial followed
    schedule: tuple[ScheduleStep, ...] = ()


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
    if dataclasses.is_dataclass(tp):
        return "a mapping {" + ", ".join(f.name for f in dataclasses.fields(tp)) + "}"
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
    """`value` as the type `tp` of the field `key`, or a one-line ConfigError naming both."""
    if dataclasses.is_dataclass(tp):  # a list of sections (schedule steps)
        return _build(tp, value, key)
    origin = typing.get_origin(tp)
    bad = ConfigError(f"{key}: expected {_describe(tp)}, got {short(value)}")
    if origin in (typing.Union, types.UnionType):
        return _coerce_union(key, value, typing.get_args(tp), bad)
    if origin is Literal:
        if value not in typing.get_args(tp):
            raise bad
        return value
    if origin is tuple:
        return _coerce_tuple(key, value, typing.get_args(tp)[0], bad)
    if tp is float:
        return _coerce_float(key, value, bad)
    if tp in _PLAIN:
        if not _PLAIN[tp](value):
            raise bad
        return value
    if tp is dict:  # a free mapping (an inline search space), checked by its own reader
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise bad
        return _freeze(value)
    raise TypeError(f"unsupported config type {tp} for {key}")


# the types a value must already have (YAML gives them): no bool for an int, no number for a string
_PLAIN = {
    bool: lambda v: isinstance(v, bool),
    int: lambda v: isinstance(v, int) and not isinstance(v, bool),
    str: lambda v: isinstance(v, str),
}


def _coerce_union(key: str, value: Any, args: tuple, bad: ConfigError) -> Any:
    if value is None and _NONE in args:
        return None
    for a in args:
        if a is not _NONE:
            try:
                return _coerce(key, value, a)
            except ConfigError:
                pass
    raise bad


def _coerce_tuple(key: str, value: Any, item: Any, bad: ConfigError) -> tuple:
    if isinstance(value, (str, int, float)) and not isinstance(value, bool) and item is not float:
        value = [value]  # `augment: pinda` means `[pinda]`
    if not isinstance(value, (list, tuple)):
        raise bad
    return tuple(_coerce(f"{key}[{i}]", v, item) for i, v in enumerate(value))


def _coerce_float(key: str, value: Any, bad: ConfigError) -> float:
    if isinstance(value, str):  # PyYAML reads `1e-3` (no dot) as a string
        try:
            value = float(value)
        except ValueError:
            raise bad from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise bad
    try:
        value = float(value)
    except OverflowError:  # an int beyond float's range
        raise bad from None
    if not math.isfinite(value):  # .inf trains nothing, NaN compares false with every bound
        raise ConfigError(f"{key}: expected a finite number, got {value}")
    return value


def _check_range(key: str, value: Any, meta: dict) -> None:
    if value is None or isinstance(value, (tuple, str, bool)):
        return
    lo, hi = meta.get("min"), meta.get("max")
    if lo is not None and (value <= lo if meta.get("min_open") else value < lo):
        bound = ">" if meta.get("min_open") else ">="
        raise ConfigError(f"{key}: expected a number {bound} {lo}, got {short(value)}")
    if hi is not None and (value >= hi if meta.get("max_open") else value > hi):
        bound = "<" if meta.get("max_open") else "<="
        raise ConfigError(f"{key}: expected a number {bound} {hi}, got {short(value)}")


@functools.lru_cache(maxsize=None)
def _hints(cls: type) -> dict[str, Any]:
    """A config dataclass's field types, resolved once (`typing.get_type_hints` compiles every
    annotation string again on each call: 8 ms of every `from_dict`)."""
    return typing.get_type_hints(cls)


def _build(cls: type, data: Any, prefix: str) -> Any:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix or 'config'}: expected a mapping of keys, got {short(data)}")
    hints = _hints(cls)
    known = {f.name: f for f in dataclasses.fields(cls)}
    for k in data:
        if k not in known:
            where = f"{prefix}.{k}" if prefix else str(k)
            raise ConfigError(f"{where[:80]}: unknown key (known: {', '.join(known)})")
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


_DURATION = {"s": 1.0, "sec": 1.0, "min": 60.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: str) -> float:
    """`"5min"` -> 300.0 seconds; `"30s"`, `"1.5h"`; ValueError for anything else."""
    import re

    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(s|sec|min|m|h)\s*", text)
    if not m:
        raise ValueError(
            f"expected a number of epochs or a duration such as 30s, 5min, 1h; got {short(text)}"
        )
    return float(m.group(1)) * _DURATION[m.group(2)]


def _check_time_budget(text: str, prefix: str) -> None:
    try:
        seconds = parse_duration(text)
    except ValueError:
        raise ConfigError(f"{prefix}.time_budget: expected a duration such as 90s, 20m, 1.5h; got "
                          f"{short(text)}") from None
    if seconds > MAX_TIME_BUDGET_S:
        raise ConfigError(f"{prefix}.time_budget: {short(text)} is more than 30 days, the longest budget "
                          f"(plan a compare that long by its trials and epochs, without a budget)")


def _validate_section(obj: Any, prefix: str) -> None:
    """Cross-field rules that a single field's type and range cannot say."""
    if isinstance(obj, TrainConfig) and isinstance(obj.checkpoint_every, str):
        try:
            parse_duration(obj.checkpoint_every)
        except ValueError as e:
            raise ConfigError(f"{prefix}.checkpoint_every: {e}") from None
    if isinstance(obj, DatasetConfig):
        _validate_dataset(obj, prefix)
    if isinstance(obj, RepeatBestConfig):
        for i, seed in enumerate(obj.seeds):
            _check_range(f"{prefix}.seeds[{i}]", seed, {"min": 0, "max": MAX_SEED})
    if isinstance(obj, CompareConfig) and obj.time_budget is not None:
        _check_time_budget(obj.time_budget, prefix)
    if isinstance(obj, CompareConfig) and obj.vary is not None:
        unknown = [v for v in obj.vary if v not in VARY]
        if unknown or "init" not in obj.vary or len(set(obj.vary)) != len(obj.vary):
            raise ConfigError(f"{prefix}.vary: expected [init] or [init, split] (the seed always varies the "
                              f"initialisation), got {list(obj.vary)}")
    if isinstance(obj, RaceConfig) and obj.min_seeds > obj.max_seeds:
        raise ConfigError(f"{prefix}.min_seeds: {obj.min_seeds} is above {prefix}.max_seeds "
                          f"({obj.max_seeds})")
    if isinstance(obj, ScheduleStep):
        _validate_step(obj, prefix)
    if isinstance(obj, Config):
        _validate_schedule(obj)
    if isinstance(obj, ViewConfig):
        lo_hi = obj.crop_scale
        if len(lo_hi) != 2 or not 0 < lo_hi[0] <= lo_hi[1] <= 1:
            raise ConfigError(
                f"{prefix}.crop_scale: expected [lo, hi] with 0 < lo <= hi <= 1, got {list(lo_hi)}"
            )


def key_field(key: str) -> tuple[Any, dict]:
    """(the type, the field's metadata) of dotted `key`; KeyError when no config key is called so."""
    cls: Any = Config
    parts = key.split(".")
    for i, part in enumerate(parts):
        fields = {f.name: f for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else {}
        if part not in fields:
            raise KeyError(key)
        tp = _hints(cls)[part]
        if i == len(parts) - 1:
            if dataclasses.is_dataclass(tp):
                raise KeyError(key)  # a section, not a key
            return tp, dict(fields[part].metadata)
        cls = tp
    raise KeyError(key)


def _validate_step(step: ScheduleStep, prefix: str) -> None:
    """A schedule step's keys are config keys that say what a run trains; its values obey their fields."""
    if not step.set:
        raise ConfigError(f"{prefix}.set: expected at least one {{dotted key: value}}")
    values = {}
    for key, value in step.set.items():
        where = f"{prefix}.set.{key}"
        if key.startswith(("search.", "compare.", "resources.", "schedule")) or not changes_results(key):
            raise ConfigError(f"{where}: not a setting of the training itself; a schedule sets per-epoch "
                              "knobs such as train.lr or pinda.penalty")
        try:
            tp, meta = key_field(key)
        except KeyError:
            raise ConfigError(f"{where[:120]}: unknown key (a dotted config key such as train.lr)") from None
        values[key] = _coerce(where, value, tp)
        _check_range(where, values[key], meta)
    object.__setattr__(step, "set", FrozenDict(values))  # still being built: the coerced values stay


def _validate_schedule(cfg: Config) -> None:
    """Steps at increasing epochs within the run; the knobs `train.track` records are config keys."""
    for i, key in enumerate(cfg.train.track):
        try:
            key_field(key)
        except KeyError:
            raise ConfigError(f"train.track[{i}]: {key[:120]!r} is not a config key (a dotted key such as "
                              "train.lr)") from None
    last = 0
    for i, step in enumerate(cfg.schedule):
        if step.epoch <= last:
            raise ConfigError(f"schedule[{i}].epoch: {step.epoch} does not follow the step before "
                              f"(epoch {last}); steps go in increasing epochs")
        if step.epoch > cfg.train.epochs:
            raise ConfigError(f"schedule[{i}].epoch: {step.epoch} is past the run's last epoch "
                              f"(train.epochs {cfg.train.epochs})")
        last = step.epoch


# Keys the training loop itself reads at every epoch (the methods declare theirs as `knobs`): train.lr is
# the peak the warm-up and cosine scale, so a new value keeps the schedule's position
LOOP_KNOBS = ("train.lr",)


def scheduled_keys(cfg: Config) -> tuple[str, ...]:
    """The keys `schedule` sets, in the order they first appear."""
    return tuple(dict.fromkeys(k for step in cfg.schedule for k in step.set))


def values_at(cfg: Config, epoch: int) -> dict[str, Any]:
    """{key: value} that `schedule` puts in force at 1-based `epoch` (its keys not yet set: absent)."""
    out: dict[str, Any] = {}
    for step in cfg.schedule:
        if step.epoch > epoch:
            break
        out.update(step.set)
    return out


def value_of(cfg: Any, key: str) -> Any:
    """The value of dotted `key` in `cfg` (`value_of(cfg, "train.lr")`)."""
    for part in key.split("."):
        cfg = getattr(cfg, part)
    return cfg


def replace_values(cfg: Any, values: typing.Mapping[str, Any]) -> Any:
    """`cfg` with dotted keys set to values already validated (a schedule's, a PBT trial's): no parsing."""
    nested: dict[str, dict] = {}
    direct = {}
    for key, value in values.items():
        head, _, rest = key.partition(".")
        if rest:
            nested.setdefault(head, {})[rest] = value
        else:
            direct[head] = value
    for head, inner in nested.items():
        direct[head] = replace_values(getattr(cfg, head), inner)
    return dataclasses.replace(cfg, **direct) if direct else cfg


def _validate_dataset(d: DatasetConfig, prefix: str) -> None:
    # the names below are data sets the keys only make sense for; the registry check is checks.py's
    if d.cache == "none" and d.name != "imagefolder":
        raise ConfigError(
            f"{prefix}.cache: none (streaming from files) is for imagefolder; {d.name} is held in memory"
        )
    if d.cache == "none" and d.as_vectors:
        raise ConfigError(f"{prefix}.as_vectors: needs the images in memory (dataset.cache: memory)")
    if d.unlabeled and d.name != "stl10":
        raise ConfigError(
            f"{prefix}.unlabeled: only stl10 has an unlabelled split (dataset.name is {d.name})"
        )
    if d.unlabeled_dir is not None and d.name != "imagefolder":
        raise ConfigError(f"{prefix}.unlabeled_dir: is for imagefolder (a CSV marks unlabelled rows by an "
                          f"empty label, an .npz by x_unlabeled); dataset.name is {d.name}")
    if d.evaluate_on in ("val", "both") and d.val_fraction == 0:
        raise ConfigError(f"{prefix}.evaluate_on: {d.evaluate_on} needs a validation split "
                          f"({prefix}.val_fraction > 0)")
    if d.resplit and d.cache == "none":
        raise ConfigError(f"{prefix}.resplit: needs the images in memory (dataset.cache: memory)")
    if d.shared_dir is not None and not Path(d.shared_dir).expanduser().is_absolute():
        raise ConfigError(f"{prefix}.shared_dir: expected an absolute path (a trial runs in its own folder), "
                          f"got {short(d.shared_dir)}")


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


def flatten(data: dict) -> dict[str, Any]:
    """A config as a dict (`to_dict`, a record's "config") -> {dotted key: value} over every settable key
    it holds (`{"train": {"lr": 0.1}}` -> `{"train.lr": 0.1}`); a free mapping (an inline space) is one
    value."""
    out: dict[str, Any] = {}
    for key in sorted(dotted_keys()):
        node: Any = data
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                break
            node = node[part]
        else:
            out[key] = node
    return out


def parse_override(text: str) -> tuple[str, Any]:
    """`train.lr=0.01` -> ("train.lr", 0.01); the value is read as a YAML scalar or list."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(f"--set {text!r}: expected KEY=VALUE with a dotted key, e.g. train.lr=0.01")
    try:
        value = safe_load(raw, key) if raw.strip() else None
    except ConfigError:
        raise ConfigError(f"{key}: could not read value {short(raw)} as YAML") from None
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


class _UniqueKeyLoader(yaml.SafeLoader):
    """`safe_load` that refuses a key given twice in one mapping (PyYAML keeps the later silently)."""

    def construct_mapping(self, node, deep=False):
        seen: dict = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                hash(key)
            except TypeError:
                continue  # PyYAML itself refuses an unhashable key, with its own message
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"duplicate key {short(key)} (first at line {seen[key] + 1})",
                    key_node.start_mark,
                )
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


MAX_NODES = 100_000  # a config is a few hundred values; YAML anchors can make a few bytes expand to 10^9


def safe_load(text: str, where: str) -> Any:
    """YAML text -> plain data, with duplicate keys and anchor bombs refused in one line naming `where`."""
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f" at line {mark.line + 1}" if mark else ""
        problem = getattr(e, "problem", None)
        raise ConfigError(f"{where}: not valid YAML{line}" + (f": {problem}" if problem else "")) from None
    except ValueError:  # Python reads no integer of more than 4300 digits (sys.int_max_str_digits)
        import re

        digits = re.search(r"[0-9]{4000,}", text)
        line = f" at line {text.count(chr(10), 0, digits.start()) + 1}" if digits else ""
        raise ConfigError(
            f"{where}: a number{line} has thousands of digits; expected a value in range"
        ) from None
    except RecursionError:  # PyYAML composes nested lists by recursion: [[[[... 100,000 deep
        raise ConfigError(f"{where}: nested too deep to read (lists or mappings inside each other "
                          f"hundreds of times)") from None
    try:
        size = _expanded_size(data, {})
    except RecursionError:
        raise ConfigError(f"{where}: nested too deep to read (lists or mappings inside each other "
                          f"hundreds of times)") from None
    if size > MAX_NODES:
        raise ConfigError(f"{where}: expands to more than {MAX_NODES} values (YAML anchors and aliases?)")
    return data


def _expanded_size(node: Any, memo: dict) -> int:
    """How many values `node` holds once aliases are expanded, counted once per shared object."""
    if not isinstance(node, (dict, list)):
        return 1
    if id(node) in memo:
        return memo[id(node)]
    memo[id(node)] = MAX_NODES + 1  # a cycle (a recursive alias) counts as too large
    children = node.values() if isinstance(node, dict) else node
    total = 1
    for child in children:
        total += _expanded_size(child, memo)
        if total > MAX_NODES:
            break
    memo[id(node)] = total
    return total


def read_yaml(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found" if not path.exists() else f"{path}: not a file")
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise ConfigError(f"{path}: cannot read it ({e.strerror})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start}); "
                          "save it as UTF-8") from None
    data = safe_load(text, str(path))
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of sections at the top level")
    return data


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Read YAML (or defaults when ``path`` is None), apply ``--set`` overrides, validate types and
    ranges. Names that refer to registries are checked by :func:`augtune.checks.check_config`."""
    data = read_yaml(path) if path is not None else {}
    return from_dict(apply_overrides(data, overrides))


def method_label(cfg: Config) -> str:
    """`simclr`, `byol+pinda`: the row name tables group by."""
    return "+".join((cfg.method.base, *cfg.method.augment))


def method_of(label: str) -> str:
    """The method label of a compare entrant's label (`simclr+pinda@pbt`: the method searched by PBT)."""
    return label.split("@", 1)[0]


# Sections named after an augmentation method (marked `_METHOD` on `Config`): their keys matter only to
# runs of that method (a plain SimCLR run's `pinda.mu` is a default it never reads).
METHOD_SECTIONS = tuple(f.name for f in dataclasses.fields(Config) if f.metadata.get("method_section"))


# Keys of a method's section that another augmentation reads instead (PiNDA's baselines, B.2).
_KEY_READERS = {"pinda.clae_eps": ("clae",), "pinda.clae_steps": ("clae",), "pinda.simcl_eta": ("simcl",)}

# Settings that say where, how fast or how often a run was computed or reported, never what it
# computed: two runs apart only in these trained and scored the same thing. (The search and compare
# sections are the plan that launched the run; a DDP run equals the one-process run, and resuming from
# a checkpoint is bitwise equal; the dataset's cache, workers and shared copy hold the same samples;
# eval.metrics / eval.epoch_metrics choose which scores exist, not their values; eval.monitor_size,
# eval.at and eval.every touch only the per-epoch scores.)
_NOT_WHAT_RUNS = ("search.", "compare.", "resources.")
_NOT_WHAT_KEYS = frozenset({
    "dataset.download", "dataset.cache", "dataset.workers", "dataset.shared", "dataset.shared_dir",
    "train.device", "train.num_threads", "train.checkpoint_every", "train.channels_last", "train.compile",
    "train.track",
    "eval.every", "eval.epoch_metrics", "eval.metrics", "eval.references", "eval.batch_size", "eval.at",
    "eval.monitor_size", "eval.reference_cache", "eval.figures"})


def changes_results(key: str) -> bool:
    """Whether dotted `key` can change what a run trains or scores (not where, how fast, how often)."""
    return key not in _NOT_WHAT_KEYS and not key.startswith(_NOT_WHAT_RUNS)


def key_applies(key: str, method: str) -> bool:
    """Whether dotted `key` is read by a run whose method label is `method` (`byol+nrcc`)."""
    section = key.split(".")[0]
    if section not in METHOD_SECTIONS:
        return True
    parts = method_of(method).split("+")
    return any(reader in parts for reader in _KEY_READERS.get(key, (section,)))


def run_signature(flat: typing.Mapping[str, Any], method: str, ignore: typing.Iterable[str] = ()) -> tuple:
    """What a run reads: the sorted (key, value) pairs of its flattened config (`{"train.lr": 0.01}`)
    that change what it trains or scores, among the keys its method label (`byol+nrcc`) reads
    (:func:`key_applies`) and not in `ignore`. Two runs with equal signatures (and seeds) are the same
    run; values are made hashable (lists as tuples), so signatures can be set members."""
    skip = set(ignore)
    read = ((k, _hashable(v)) for k, v in flat.items()
            if k not in skip and changes_results(k) and key_applies(k, method))
    return tuple(sorted(read, key=lambda kv: kv[0]))


def _hashable(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((str(k), _hashable(v)) for k, v in value.items()))
    return value


def format_value(value: Any, digits: int | None = 4) -> str:
    """How a setting shows in labels, tables and progress lines: `true`, `[1, 2, 3]`, `0.001`, `none`.

    Floats keep `digits` significant digits (None: the shortest text that reads back as the same
    float, for labels that must tell every value apart)."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(format_value(v, digits) for v in value) + "]"
    if isinstance(value, float):
        return repr(value) if digits is None else f"{value:.{digits}g}"
    return str(value)


def dotted_keys(cls: type = Config, prefix: str = "") -> set[str]:
    """Every settable dotted key (`train.lr`, `search.repeat_best.top`, ...)."""
    keys: set[str] = set()
    hints = _hints(cls)
    for f in dataclasses.fields(cls):
        key = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(hints[f.name]):
            keys |= dotted_keys(hints[f.name], key + ".")
        else:
            keys.add(key)
    return keys
