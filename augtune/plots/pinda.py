"""PiNDA's noise grid (paper Figs. 1 and 4): originals, learned Sigma and mu, a noise, x + noise.

One PNG per run, `pinda_noise_<label>.png`: a column per test image (the first of each class, up to
eight), rows original / Sigma (or u) / mu when learned / noise / x + noise. Sigma and the noise are
shown on their own colour scale (noted in the row title); images are clipped to [0, 1] for display.
"""
from __future__ import annotations

from pathlib import Path

import torch

from augtune.data.batches import as_float
from augtune.plots import PlotError, Run, run_stem, save


def _columns(y: torch.Tensor, n: int = 8) -> torch.Tensor:
    """Indices of the first test sample of each class, up to n."""
    first = [int((y == c).nonzero()[0]) for c in torch.unique(y)[:n]]
    return torch.tensor(first)


def _show(ax, img: torch.Tensor, symmetric: bool = False, vmax: float = 1.0):
    """Draw one image; a symmetric map (Sigma, mu, noise) on [-vmax, vmax], shared by its row."""
    img = img.float().cpu()
    if img.shape[0] == 1:
        if symmetric:
            shown = ax.imshow(img[0].numpy(), cmap="RdBu_r", vmin=-vmax, vmax=vmax)
        else:  # images on their own [0, 1] scale, clipped: the noise must not rescale the picture
            shown = ax.imshow(img[0].clamp(0, 1).numpy(), cmap="gray", vmin=0, vmax=1)
    else:  # colour: a map is rescaled to [0, 1] for display (grey = 0)
        if symmetric:
            img = 0.5 + img / (2 * vmax)
        shown = ax.imshow(img.clamp(0, 1).permute(1, 2, 0).numpy())
    ax.set_xticks([])
    ax.set_yticks([])
    return shown


def plot(runs: list[Run], out: Path) -> list[Path]:
    """Noise grid of each run with PiNDA on image data: originals, Sigma, mu, noise, x + noise."""
    return [save(fig, out / f"{name}.png") for name, fig in figures(runs).items()]


def figures(runs: list[Run]) -> dict:
    """Each run's noise grid, by name (`pinda_noise_<run>`)."""
    import matplotlib.pyplot as plt

    drawn = {}
    for run in runs:
        aug = run.augmentation("pinda")
        if run.data.modality != "image":
            raise PlotError(f"{run.path}: the noise grid needs image data ({run.data.name} gives vectors)")
        cols = _columns(run.data.y_test)
        x = as_float(run.data.x_test[cols].to(run.device))  # (n, C, H, W)
        torch.manual_seed(run.cfg.train.seed)
        with torch.no_grad():
            mu, scale = aug.generator.params(x)
            noise = aug.generator.sample(mu, scale)
        rows = [("original", x, False), ("Σ" if aug.cfg.pinda.noise == "gaussian" else "u", scale, True)]
        if mu is not None:
            rows.append(("μ", mu, True))
        rows += [("noise ε", noise, True), ("x + ε", x + noise, False)]
        # a narrow last column holds each row's colour bar: taken from the images' own axes, as
        # `colorbar(ax=...)` does, it sat on top of the last column's image once laid out
        n = len(cols)
        fig, axes = plt.subplots(len(rows), n + 1, figsize=(1.3 * n + 0.5, 1.4 * len(rows)), squeeze=False,
                                 gridspec_kw={"width_ratios": [1.0] * n + [0.08]})
        for r, (title, imgs, symmetric) in enumerate(rows):
            vmax = float(imgs.abs().max().clamp_min(1e-8))  # one scale per row, so its colour bar is true
            shown = [_show(axes[r, c], imgs[c], symmetric, vmax) for c in range(n)]
            axes[r, 0].set_ylabel(title, fontsize=9)
            if x.shape[1] == 1 and symmetric:  # RGB maps have none: grey is 0, the extremes +-vmax
                fig.colorbar(shown[-1], cax=axes[r, n])
            else:  # images are on [0, 1]
                axes[r, n].axis("off")
        fig.suptitle(f"{run.label}: π-noise (‖ε‖ mean {noise.flatten(1).norm(dim=1).mean():.2f})", fontsize=9)
        drawn[f"pinda_noise_{run_stem(run)}"] = fig
    return drawn
