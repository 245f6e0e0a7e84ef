"""Figures a reader can read: nothing clipped at the default size, a class legend on the UMAP panel,
colour bars on PiNDA's maps. Each figure kind is drawn from a tiny real run and read back."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

import augtune.plots as plots  # noqa: E402
from augtune.config import from_dict  # noqa: E402
from augtune.data import load_dataset  # noqa: E402
from augtune.plots import end_of_run_figures, load_run, plot  # noqa: E402
from augtune.trainables import train_run  # noqa: E402
from conftest import TINY_CNN

SMALL = TINY_CNN


def _inside(fig, renderer) -> list[str]:
    """Texts and legends of `fig` that stick out of the area the saved PNG shows."""
    shown = fig.get_tightbbox(renderer)  # what bbox_inches="tight" saves, in inches
    out = []
    artists = [t for ax in fig.axes for t in (ax.title, ax.xaxis.label, ax.yaxis.label)] + list(fig.texts)
    artists += [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
    for a in artists:
        if not a.get_visible() or (hasattr(a, "get_text") and not a.get_text()):
            continue
        box = a.get_window_extent(renderer).transformed(fig.dpi_scale_trans.inverted())
        if (
            box.x0 < shown.x0 - 0.01
            or box.x1 > shown.x1 + 0.01
            or box.y0 < shown.y0 - 0.01
            or box.y1 > shown.y1 + 0.01
        ):
            out.append(repr(a))
    return out


@pytest.fixture
def saved(monkeypatch):
    """Every figure `save` writes, checked for clipping as it is saved."""
    figs = []
    real = plots.save

    def keep(fig, path, dpi=110):
        fig.canvas.draw()
        figs.append((path, fig, _inside(fig, fig.canvas.get_renderer())))
        return real(fig, path, dpi)

    monkeypatch.setattr(plots, "save", keep)
    for name in plots.PLOTS.values():  # every kind imports `save` by name
        monkeypatch.setattr(__import__(name, fromlist=["save"]), "save", keep)
    return figs


def _run(tmp_path, name, **sections):
    data = {"dataset": {"name": "digits", "max_train": 256, "max_test": 100}, "model": dict(SMALL),
            "train": {"epochs": 1, "batch_size": 128}, "eval": {"metrics": ["knn"], "references": False}}
    for k, v in sections.items():
        data.setdefault(k, {}).update(v)
    cfg = from_dict(data)
    return train_run(cfg, load_dataset(cfg.dataset), tmp_path / name, log=lambda s: None,
                     on_completed=end_of_run_figures)


def test_a_legend_outside_the_axes_is_saved_whole(tmp_path):
    fig, ax = plt.subplots(figsize=(3, 2))
    ax.plot([0, 1], [0, 1], label="a long legend entry that sits outside")
    ax.set_xlabel("epochs")
    ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.canvas.draw()
    tight = fig.get_tightbbox(fig.canvas.get_renderer())
    path = plots.save(fig, tmp_path / "f.png", dpi=100)
    width = plt.imread(path).shape[1]
    assert width >= 0.95 * tight.width * 100 > 300  # the legend widened the saved image past 3 inches


def test_the_search_figures_are_unclipped(tmp_path, saved):
    """Optuna's history, parallel coordinates and importances, at their default size, with long names."""
    from test_plots import fake_search

    exp = fake_search(tmp_path / "exp", entrants=("simclr+pinda", "byol"))
    files = plot("search", plots.find_runs([exp]), tmp_path / "figures")
    kinds = ("history", "parallel", "importances")
    entrants = ("byol", "simclr_pinda")
    assert sorted(p.name for p in files) == sorted(f"search_{k}_{e}.png" for k in kinds for e in entrants)
    assert len(saved) == 6
    for path, fig, clipped in saved:
        assert not clipped, (path.name, clipped)
        assert fig.axes[0].get_title(loc="left") or fig.axes[0].get_title(), path.name


def test_every_figure_kind_is_unclipped_and_labelled(tmp_path, saved):
    _run(tmp_path, "pinda", method={"augment": ["pinda"]}, pinda={"generator": "unet", "width": 4})
    _run(tmp_path, "nrcc", method={"augment": ["nrcc"]})
    _run(tmp_path, "cocor", method={"base": "moco", "augment": ["cocor"], "queue_size": 128},
         cocor={"label_fraction": 0.1})
    _run(tmp_path, "diffaug", method={"augment": ["diffaug"]}, train={"epochs": 3},
         diffaug={"schedule": "A:1,B:1,A:1", "steps": 20, "sample_steps": 5, "gen_width": 4})
    plot("diffaug", [load_run(tmp_path / "diffaug")], tmp_path / "lam")  # the lambda curve too
    kinds = {p.name.split("_")[0] for p, _, _ in saved}
    assert {"pinda", "umap", "cocor", "diffaug"} <= kinds, kinds
    for path, fig, clipped in saved:
        assert not clipped, (path.name, clipped)
    umap = [fig for p, fig, _ in saved if p.name.startswith("umap")][0]
    legend = umap.axes[0].get_legend()
    assert legend is not None and [t.get_text() for t in legend.get_texts()][:3] == ["0", "1", "2"]
    pinda = [fig for p, fig, _ in saved if p.name.startswith("pinda")][0]
    grid_axes = [ax for ax in pinda.axes if ax.images]
    assert len(pinda.axes) > len(grid_axes)  # colour bars: one per map row (Sigma, mu, noise)
    bars = [ax for ax in pinda.axes if not ax.images and ax.get_visible() and ax.axison]
    assert bars and not [(b, a) for b in bars for a in grid_axes  # no bar over an image
                         if b.get_position().overlaps(a.get_position())]
