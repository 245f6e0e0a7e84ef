"""CoCor: latent similarity per composite length (Figure 4a) and feature-covariance spectrum (Figure 4b).

Three files:
- ``cocor_similarity.png`` (Figure 4a): mean latent similarity f(x)^T f(A(x)) of composites of each
  length on the test split, measured now with each run's trained method; runs without CoCor (MoCo
  alone) are measured the same way, so with/without consistency compare.
- ``cocor_similarity_epochs.png``: the same per epoch during training (``cocor_sim_l<l>`` in the
  record), for the runs that trained with CoCor.
- ``cocor_spectrum.png`` (Figure 4b): singular values of the covariance of the test features, sorted,
  log scale; a collapsed dimension shows as a drop.

One line per variant (`plots.variants`: method and the settings that differ, seeds pooled): the mean
over its seeds, with their standard deviation as error bars (4a) or a band (4b).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from augtune.data.batches import as_float
from augtune.plots import PlotError, Run, save, variants

MAX_SAMPLES = 1024  # test samples the similarities are measured on


@torch.no_grad()
def measured_similarity(run: Run, lengths: tuple[int, ...], seed: int = 0) -> list[float]:
    """Mean latent similarity per length on (up to MAX_SAMPLES) test samples, with the run's method."""
    from augtune.methods.cocor import CoCor
    from augtune.methods.cocor_ops import composite_views, pool_ops

    method, data = run.method, run.data
    obj = method.objective
    x = as_float(data.x_test[:MAX_SAMPLES].to(run.device))
    ops = pool_ops(run.cfg.cocor.pool, data.modality)
    state = torch.get_rng_state()
    torch.manual_seed(seed)  # the same composites for every run
    try:
        views, _ = composite_views(x, lengths, ops, data.modality)
    finally:
        torch.set_rng_state(state)
    z0 = torch.nn.functional.normalize(obj.embed(x), dim=1)  # (B, D)
    z = CoCor.embed(obj, views).view(len(lengths), x.shape[0], -1)  # (L, B, D)
    return (z * z0).sum(-1).mean(1).float().cpu().tolist()


def _legend(ax) -> None:
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)


def _label(name: str, group: list[Run]) -> str:
    return f"{name}, {len(group)} seeds" if len(group) > 1 else f"{name}, seed {group[0].record['seed']}"


def spectrum(run: Run) -> np.ndarray:
    """Singular values of the covariance of the run's test features, largest first."""
    f = run.features("test")  # (N, F)
    f = f - f.mean(0)
    cov = f.T @ f / max(1, f.shape[0] - 1)  # (F, F)
    return torch.linalg.svdvals(cov.double()).clamp_min(1e-12).numpy()


def plot(runs: list[Run], out: Path) -> list[Path]:
    """CoCor's latent similarity per composite length (Fig. 4a) and feature spectrum (Fig. 4b)."""
    return [save(fig, out / f"{name}.png", dpi=120) for name, fig in figures(runs).items()]


def figures(runs: list[Run]) -> dict:
    """The similarity per length, per epoch (runs that trained with CoCor) and the spectrum, by name."""
    import matplotlib.pyplot as plt

    if not runs:
        raise PlotError("cocor: no runs given")
    lengths = tuple(sorted({l for r in runs for l in r.cfg.cocor.lengths} | {1, 2, 3}))
    groups = variants(runs)
    drawn = {}

    fig, ax = plt.subplots(figsize=(7.5, 3.5))
    for i, (name, group) in enumerate(groups.items()):
        sims = np.array([measured_similarity(run, lengths) for run in group])  # (runs, L)
        ax.errorbar(np.array(lengths) + 0.03 * (i - len(groups) / 2), sims.mean(0), yerr=sims.std(0),
                    marker="o", capsize=3, label=_label(name, group))
    ax.set_xlabel("composite length l")
    ax.set_ylabel("mean latent similarity f(x)ᵀf(A(x))")
    ax.set_xticks(lengths)
    ax.set_title("Latent similarity per length (CoCor Fig. 4a)")
    _legend(ax)
    drawn["cocor_similarity"] = fig

    trained = {
        name: group
        for name, group in groups.items()
        if any(k.startswith("cocor_sim_l") for r in group for e in r.record.get("epochs", []) for k in e)
    }
    if trained:
        fig, ax = plt.subplots(figsize=(7.5, 3.5))
        for i, (name, group) in enumerate(trained.items()):
            for l in group[0].cfg.cocor.lengths:
                curves = [
                    dict(
                        (e["epoch"], e[f"cocor_sim_l{l}"])
                        for e in r.record["epochs"]
                        if f"cocor_sim_l{l}" in e
                    )
                    for r in group
                ]
                epochs = sorted(set.intersection(*(set(c) for c in curves)))  # the epochs every seed has
                if epochs:
                    ax.plot(epochs, [np.mean([c[e] for c in curves]) for e in epochs], color=f"C{i}",
                            alpha=0.4 + 0.6 * l / max(lengths), label=f"{_label(name, group)}, l={l}")
        ax.set_xlabel("epoch")
        ax.set_ylabel("mean latent similarity (training)")
        _legend(ax)
        drawn["cocor_similarity_epochs"] = fig

    fig, ax = plt.subplots(figsize=(7.5, 3.5))
    for i, (name, group) in enumerate(groups.items()):
        spectra = [spectrum(run) for run in group]
        n = min(len(sv) for sv in spectra)
        logs = np.log10(np.stack([sv[:n] for sv in spectra]))  # (runs, n): seeds pooled in log space
        ranks = np.arange(1, n + 1)
        ax.semilogy(ranks, 10 ** logs.mean(0), color=f"C{i}", label=_label(name, group))
        if len(group) > 1:
            ax.fill_between(ranks, 10 ** (logs.mean(0) - logs.std(0)), 10 ** (logs.mean(0) + logs.std(0)),
                            color=f"C{i}", alpha=0.2, linewidth=0)
    ax.set_xlabel("singular value rank")
    ax.set_ylabel("singular value of feature covariance")
    ax.set_title("Dimensional collapse (CoCor Fig. 4b)")
    _legend(ax)
    drawn["cocor_spectrum"] = fig
    return drawn
