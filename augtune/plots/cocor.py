"""CoCor: latent similarity per composite length (Figure 4a) and feature-covariance spectrum (Figure 4b).

Three files:
- ``cocor_similarity.png`` (Figure 4a): mean latent similarity f(x)^T f(A(x)) of composites of each
  length on the test split, measured now with each run's trained method, one line per run; runs
  without CoCor (MoCo alone) are measured the same way, so with/without consistency compare.
- ``cocor_similarity_epochs.png``: the same per epoch during training (``cocor_sim_l<l>`` in the
  record), for the runs that trained with CoCor.
- ``cocor_spectrum.png`` (Figure 4b): singular values of the covariance of the test features, sorted,
  log scale; a collapsed dimension shows as a drop.
"""
from __future__ import annotations

from pathlib import Path

import torch

from augtune.plots import PlotError, Run, save

MAX_SAMPLES = 1024  # test samples the similarities are measured on


@torch.no_grad()
def measured_similarity(run: Run, lengths: tuple[int, ...], seed: int = 0) -> list[float]:
    """Mean latent similarity per length on (up to MAX_SAMPLES) test samples, with the run's method."""
    from augtune.methods.cocor import CoCor
    from augtune.methods.cocor_ops import composite_views, pool_ops

    method, data = run.method, run.data
    obj = method.objective
    x = data.x_test[:MAX_SAMPLES].to(run.device)
    ops = pool_ops(run.cfg.cocor.pool, data.modality)
    state = torch.get_rng_state()
    torch.manual_seed(seed)  # the same composites for every run
    try:
        views, _ = composite_views(x, lengths, ops, data.modality)
    finally:
        torch.set_rng_state(state)
    z0 = torch.nn.functional.normalize(obj.project(x), dim=1)  # (B, D)
    z = CoCor.embed(obj, views).view(len(lengths), x.shape[0], -1)  # (L, B, D)
    return (z * z0).sum(-1).mean(1).float().cpu().tolist()


def plot(runs: list[Run], out: Path) -> list[Path]:
    """CoCor's latent similarity per composite length (Fig. 4a) and feature spectrum (Fig. 4b)."""
    import matplotlib.pyplot as plt

    if not runs:
        raise PlotError("cocor: no runs given")
    lengths = tuple(sorted({l for r in runs for l in r.cfg.cocor.lengths} | {1, 2, 3}))
    files: list[Path] = []

    fig, ax = plt.subplots(figsize=(5, 3.5))
    for run in runs:
        ax.plot(lengths, measured_similarity(run, lengths), marker="o", label=run.label)
    ax.set_xlabel("composite length l")
    ax.set_ylabel("mean latent similarity f(x)ᵀf(A(x))")
    ax.set_xticks(lengths)
    ax.set_title("Latent similarity per length (CoCor Fig. 4a)")
    ax.legend(fontsize=7)
    files.append(save(fig, out / "cocor_similarity.png", dpi=120))

    trained = [r for r in runs if any(k.startswith("cocor_sim_l") for e in r.record.get("epochs", []) for k in e)]
    if trained:
        fig, ax = plt.subplots(figsize=(5, 3.5))
        for i, run in enumerate(trained):
            epochs = run.record["epochs"]
            for l in run.cfg.cocor.lengths:
                pts = [(e["epoch"], e[f"cocor_sim_l{l}"]) for e in epochs if f"cocor_sim_l{l}" in e]
                if pts:
                    ax.plot(*zip(*pts), color=f"C{i}", alpha=0.4 + 0.6 * l / max(lengths),
                            label=f"{run.label} l={l}")
        ax.set_xlabel("epoch")
        ax.set_ylabel("mean latent similarity (training)")
        ax.legend(fontsize=6)
        files.append(save(fig, out / "cocor_similarity_epochs.png", dpi=120))

    fig, ax = plt.subplots(figsize=(5, 3.5))
    for run in runs:
        f = run.features("test")  # (N, F)
        f = f - f.mean(0)
        cov = f.T @ f / max(1, f.shape[0] - 1)  # (F, F)
        sv = torch.linalg.svdvals(cov.double()).clamp_min(1e-12)
        ax.semilogy(range(1, len(sv) + 1), sv.numpy(), label=run.label)
    ax.set_xlabel("singular value rank")
    ax.set_ylabel("singular value of feature covariance")
    ax.set_title("Dimensional collapse (CoCor Fig. 4b)")
    ax.legend(fontsize=7)
    files.append(save(fig, out / "cocor_spectrum.png", dpi=120))
    return files
