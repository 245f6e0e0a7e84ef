"""Figures: `augtune plot KIND PATH... [--out DIR]`, and the ones a run draws at its end.

A kind is one module here (its docstring's first line is its help) holding
``figures(runs: list[Run]) -> dict[str, Figure]`` (each matplotlib figure by its file's name, without
``.png``) and ``plot(runs, out) -> list[Path]`` (those figures written into `out`), and one line in
:data:`PLOTS` (``"pinda": "augtune.plots.pinda"``). :func:`figures` and :func:`figure` hand the figures
back (a notebook shows them; ``path=`` writes one too), :func:`plot` writes them (``augtune plot``, the
end of a run); a kind with ``plot`` alone (a plugin's) is drawn into files only. A :class:`Run` is a
finished (or interrupted) run: its folder, record and config; its data and trained method are loaded
on first use, from ``checkpoint.pt`` with ``weights_only=True`` (an in-process run's folder, a Ray
trial's newest ``checkpoint_*`` folder), or handed over by the run that has just finished, so that
the figure drawn at the end of a run and the one ``augtune plot`` draws later are the same code.

A figure that does not apply to a run (PiNDA's noise grid of a run without PiNDA) raises
:class:`PlotError` with one line saying why; the CLI prints it and exits 2.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from augtune.config import Config, from_dict
from augtune.records import CHECKPOINT_FILE, RECORD_FILE, read_record

# kind -> the module that holds `plot(runs, out)` (imported when the figure is drawn)
PLOTS: dict[str, str] = {
    "cocor": "augtune.plots.cocor",  # latent similarity per length (Fig. 4a), feature spectrum (4b)
    "diffaug": "augtune.plots.diffaug",  # originals + generated positives; the lambda curve
    "pinda": "augtune.plots.pinda",  # originals, Sigma, mu, noise, x + noise (PiNDA Figs. 1, 4)
    "schedule": "augtune.plots.schedule",  # each knob per epoch, one line per run, PBT's exploits marked
    "search": "augtune.plots.search",  # a search's history, parallel coordinates, importances (Optuna's)
    "umap": "augtune.plots.umap",  # UMAP of the features by class and by found cluster (NRCC Fig. 1)
}

FIGURES_DIR = "figures"  # a run's figures, inside its folder


class PlotError(ValueError):
    """A figure cannot be drawn from these runs; the message says why in one line."""


def save(fig, path: Path, dpi: int = 110) -> Path:
    """Lay out, write and close a matplotlib figure; the path written."""
    from augtune.records import atomic_file

    _let_go(fig)
    path = Path(path)
    with atomic_file(path) as f:  # legends and labels outside the axes are kept whole
        fig.savefig(f, format=path.suffix.lstrip(".") or "png", dpi=dpi, bbox_inches="tight")
    return path


def _let_go(fig) -> None:
    """Lay a figure out and close it in pyplot: the Figure still draws and saves, but pyplot no longer
    holds it (a notebook would show it a second time at the end of the cell, a loop would keep it)."""
    import warnings

    import matplotlib.pyplot as plt

    # colour bars make tight_layout warn; the tight bounding box `save` writes suffices
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fig.tight_layout()
    plt.close(fig)


def run_stem(run: "Run") -> str:
    """`simclr_pinda_seed0`: a run's part of a figure's file name."""
    return f"{run.record['method']}_seed{run.record['seed']}".replace("+", "_")


def _newest_checkpoint(folder: Path, record: Optional[dict] = None) -> Optional[Path]:
    """A run's newest checkpoint: in its folder, in Ray's `checkpoint_*` folders of it (Train's under its
    `train-*` folder), or in Tune's folder of the trial that the record names (`checkpoints`: Tune keeps a
    repeat run's or a compare trial's apart from its record)."""
    if (folder / CHECKPOINT_FILE).is_file():
        return folder / CHECKPOINT_FILE
    where = [folder]
    if isinstance((record or {}).get("checkpoints"), str):
        where.append(folder / record["checkpoints"])
    for place in where:  # Ray names them checkpoint_000012
        for pattern in (f"checkpoint_*/{CHECKPOINT_FILE}", f"train-*/checkpoint_*/{CHECKPOINT_FILE}"):
            ray_ckpts = sorted(place.glob(pattern), key=lambda p: p.parent.name)
            if ray_ckpts:
                return ray_ckpts[-1]
    return None


@dataclass
class Run:
    """One run for a figure: its record and config now, its data and trained method when asked."""

    path: Path  # the run's folder
    record: dict
    checkpoint: Optional[Path] = None
    _data: Any = field(default=None, repr=False)
    _method: Any = field(default=None, repr=False)

    @property
    def cfg(self) -> Config:
        return from_dict(self.record["config"])

    @property
    def label(self) -> str:
        """`byol+nrcc seed 1`: how a figure names the run."""
        return f"{self.record['method']} seed {self.record['seed']}"

    @property
    def data(self):
        if self._data is None:
            from augtune.data import load_dataset

            self._data = load_dataset(self.cfg.dataset)
        return self._data

    @property
    def method(self):
        """The trained method in eval mode, on the CPU or the GPU when there is one."""
        if self._method is None:
            import torch

            from augtune.methods import build_method

            if self.checkpoint is None:
                raise PlotError(f"{self.path}: no {CHECKPOINT_FILE} here or in a checkpoint_* folder; "
                                "this figure needs the trained networks")
            from augtune.checks import check_config

            try:
                check_config(self.cfg)  # a name no registry knows now (a base, a method, a metric)
            except ValueError as e:
                raise PlotError(
                    f"{self.path / RECORD_FILE}: the recorded config is not valid: {e}"
                ) from None
            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            torch.manual_seed(self.cfg.train.seed)
            method = build_method(self.cfg, self.data)
            try:
                state = torch.load(self.checkpoint, map_location="cpu", weights_only=True)
                method.load_state_dict(state["method"])
            except Exception as e:  # truncated, foreign, or another model's: one line, not a traceback
                reason = f"{type(e).__name__}: {e}".splitlines()[0][:160]
                raise PlotError(f"{self.checkpoint}: not a usable checkpoint of this run "
                                f"({reason})") from None
            self._method = method.to(device).eval()
        return self._method

    def augmentation(self, name: str):
        """The trained method's augmentation `name` (its generator, its MMNN, ...)."""
        for aug in self.method.augments:
            if aug.name == name:
                return aug
        raise PlotError(f"{self.path}: the run has no {name} augmentation (method.augment: "
                        f"{list(self.cfg.method.augment)})")

    @property
    def device(self):
        return next(self.method.parameters()).device

    @property
    def encoder(self):
        """The trained network evaluation sees (`eval.encoder`): the input normalisation and the backbone,
        the momentum target's copy under `eval.encoder: target` (as `MomentumObjective.features`)."""
        objective = self.method.objective
        target = getattr(objective, "target_encoder", None)
        if target is not None and self.cfg.eval.encoder in ("target", "target_if_any"):
            return target
        return objective.encoder

    def features(self, split: str = "test"):
        """(N, F) float32 CPU features of the split (`train`, `test` or `val`) under `eval.encoder`."""
        from augtune.eval import extract_features

        x = getattr(self.data, f"x_{split}", None)
        if x is None:
            raise PlotError(f"{self.path}: the run's data has no {split} split")
        return extract_features(self.method.features, x, self.cfg.eval.batch_size or 256, self.device)


_NOT_A_VARIANT = ("train.seed", "method.base", "method.augment")  # the seed; the method is in the label


def variants(runs: list[Run]) -> dict[str, list[Run]]:
    """The runs grouped by what they are apart from their seed: {"moco+cocor (cocor.mmnn=true)": [...]}.

    A label is the method plus every setting that differs between the runs and that the run reads
    (`config.run_signature`); so plain MoCo from a grid over `cocor.mmnn` is one variant, and its
    twin (same variant, same seed, a key it never reads apart) is kept once. Groups keep the order
    in which their first run came.
    """
    from augtune.analysis.frame import flatten_config
    from augtune.config import format_value, run_signature

    sigs = [dict(run_signature(flatten_config(r.record.get("config", {})), r.record["method"],
                               ignore=_NOT_A_VARIANT)) for r in runs]
    keys = sorted({k for sig in sigs for k in sig})
    varying = [k for k in keys if len({sig[k] for sig in sigs if k in sig}) > 1]
    distinct = {(r.record["method"], tuple(sorted(sig.items()))) for r, sig in zip(runs, sigs)}
    for digits in (4, None):  # as many digits as tell the variants apart
        def label(method: str, sig: dict) -> str:
            own = [f"{k}={format_value(sig[k], digits)}" for k in varying if k in sig]
            return f"{method} ({', '.join(own)})" if own else method

        if len({label(m, dict(s)) for m, s in distinct}) == len(distinct):
            break
    groups: dict[str, list[Run]] = {}
    seen: set[tuple] = set()
    for run, sig in zip(runs, sigs):
        twin = (run.record["method"], tuple(sorted(sig.items())), run.record.get("seed"))
        if twin not in seen:
            seen.add(twin)
            groups.setdefault(label(run.record["method"], sig), []).append(run)
    return groups


def load_run(path: Path) -> Run:
    """The run in `path`: a run folder, a Ray trial folder or a record.json file."""
    path = Path(path)
    folder = path.parent if path.name == RECORD_FILE else path
    if not (folder / RECORD_FILE).is_file():
        raise PlotError(f"{path}: no {RECORD_FILE} here (give a run folder or a Ray trial folder)")
    try:
        record = read_record(folder)
    except ValueError as e:
        raise PlotError(str(e)) from None
    check_record(folder / RECORD_FILE, record)
    return Run(folder, record, _newest_checkpoint(folder, record))


def check_record(path: Path, record: dict) -> None:
    """A record a figure can be drawn from: its config valid as a config file would be (a
    hand-edited or foreign record is one line naming the file and the key, not a traceback from
    deep in a figure), and the run's method and seed, which name the figure's files."""
    if not isinstance(record.get("config"), dict):
        raise PlotError(f"{path}: the record holds no config (a mapping under \"config\")")
    try:
        from_dict(record["config"])
    except ValueError as e:  # ConfigError: one line naming the key
        raise PlotError(f"{path}: the recorded config is not valid: {e}") from None
    for key, kind, what in (("method", str, "a string"), ("seed", int, "an integer")):
        if type(record.get(key)) is not kind:
            raise PlotError(f"{path}: the record's {key!r} should be {what}, got "
                            f"{str(record.get(key))[:40]!r}")


def find_runs(paths: list[Path]) -> list[Run]:
    """Every run under the paths (run folders, experiment folders, record files), in path order."""
    from augtune.analysis import find_records

    runs: list[Run] = []
    for p in paths:
        p = Path(p)
        if not p.exists():
            raise PlotError(f"{p}: no such file or folder")
        found = find_records(p)
        if not found:
            raise PlotError(f"{p}: no {RECORD_FILE} under it")
        runs += [load_run(r) for r in found]
    return runs


def plot(kind: str, runs: list[Run], out: Path) -> list[Path]:
    """Draw figure `kind` of `runs` into folder `out`; returns the files written."""
    if kind not in PLOTS:
        raise PlotError(f"unknown figure {kind!r} (known: {', '.join(PLOTS) or 'none yet'})")
    import matplotlib

    matplotlib.use("Agg")  # files only, never a window
    out = Path(out)
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    try:
        return importlib.import_module(PLOTS[kind]).plot(runs, out)
    except BaseException:
        if created and not any(out.iterdir()):  # a figure that failed leaves no empty folder behind
            out.rmdir()
        raise


def figures(kind: str, runs: list[Run]) -> dict[str, Any]:
    """Figure `kind` of `runs` as matplotlib Figures, by name (the file `plot` writes is the name +
    `.png`), laid out and let go by pyplot: each draws, shows in a notebook and saves (`fig.savefig`)."""
    if kind not in PLOTS:
        raise PlotError(f"unknown figure {kind!r} (known: {', '.join(PLOTS) or 'none yet'})")
    module = importlib.import_module(PLOTS[kind])
    if not hasattr(module, "figures"):  # a plugin's kind that writes its files itself
        raise PlotError(f"figure {kind!r} is drawn into files only: plot({kind!r}, runs, out)")
    drawn = module.figures(runs)
    for fig in drawn.values():
        _let_go(fig)
    return drawn


def figure(kind: str, runs: list[Run], which: Optional[str] = None, path: Optional[Path] = None):
    """One figure of kind `kind` (a matplotlib Figure): the first it draws, or the first whose name holds
    `which` (`"parallel"` of a search's three); `path`: written there too."""
    drawn = figures(kind, runs)
    names = [name for name in drawn if which is None or which in name]
    if not names:
        raise PlotError(f"{kind}: no figure named like {which!r} among {', '.join(drawn) or 'none'}")
    fig = drawn[names[0]]  # the others go with `drawn`: pyplot holds none of them
    if path is not None:
        save(fig, Path(path))
    return fig


def describe(kind: str) -> str:
    doc = importlib.import_module(PLOTS[kind]).__doc__ or ""
    return doc.strip().splitlines()[0] if doc.strip() else ""


def end_of_run_figures(trainer, run_dir: Path, record: dict, log: Callable[[str], None] = print) -> list[str]:
    """The figures of a run that has just finished, drawn from the live trainer into `run_dir/figures`.

    Which: `eval.figures`, or (None) the ones the method's augmentations ask for. A figure that
    fails is reported on the log and in the record (`figure_errors`); it does not fail a run whose
    training has finished. Returns the files written, relative to `run_dir`.
    """
    cfg = trainer.cfg
    kinds = cfg.eval.figures if cfg.eval.figures is not None else trainer.method.figures
    if not kinds:
        return []
    run = Run(Path(run_dir), record, None, _data=trainer.data, _method=trainer.method)
    written: list[str] = []
    was_training = trainer.method.training
    trainer.method.eval()
    try:
        for kind in kinds:
            try:
                files = plot(kind, [run], Path(run_dir) / FIGURES_DIR)
            except Exception as e:  # a figure must not cost a finished run; the reason is kept
                reason = f"{type(e).__name__}: {e}".splitlines()[0]
                record.setdefault("figure_errors", {})[kind] = reason
                log(f"figure {kind} failed: {reason}")
                continue
            written += [str(Path(f).relative_to(run_dir)) if Path(f).is_relative_to(run_dir) else str(f)
                        for f in files]
    finally:
        trainer.method.train(was_training)
    if written:
        record["figures"] = written
        log("figures: " + ", ".join(written))
    return written
