"""The seam the four papers' methods share: figures (`augtune plot`, end of run), epoch diagnostics
and evaluation of a momentum base's target encoder."""
from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest
import torch

from augtune.checks import check_config
from augtune.cli import main
from augtune.config import ConfigError, from_dict, load_config
from augtune.data import load_dataset
from augtune.methods import AUGMENTATIONS, Augmentation, build_method
from augtune.plots import PLOTS, PlotError, find_runs, load_run
from augtune.records import read_record
from augtune.trainables import train_run
from augtune.plots import end_of_run_figures

TINY = {
    "dataset": {"name": "digits", "as_vectors": True, "max_train": 200, "max_test": 100},
    "model": {"hidden_dim": 32, "embed_dim": 16, "proj_hidden_dim": 16, "proj_dim": 8, "pred_hidden_dim": 16},
    "train": {"epochs": 2, "batch_size": 64},
    "eval": {"metrics": ["knn"], "references": False},
}


def tiny(**sections):
    data = {k: dict(v) for k, v in TINY.items()}
    for k, v in sections.items():
        data.setdefault(k, {}).update(v)
    return from_dict(data)


@pytest.fixture
def fake_kinds(monkeypatch):
    """Two figure kinds in a throw-away module: one that draws the features' norms, one that fails."""
    mod = types.ModuleType("augtune_test_figures")
    mod.__doc__ = "Test figure: feature norms of every run."

    def plot(runs, out):
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots()
        for run in runs:
            ax.hist(run.features("test").norm(dim=1).numpy(), label=run.label)
        path = out / "norms.png"
        fig.savefig(path)
        plt.close(fig)
        return [path]

    broken = types.ModuleType("augtune_test_broken")

    def fail(runs, out):
        raise RuntimeError("no ink")

    mod.plot, broken.plot = plot, fail
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    monkeypatch.setitem(sys.modules, broken.__name__, broken)
    monkeypatch.setitem(PLOTS, "norms", mod.__name__)
    monkeypatch.setitem(PLOTS, "broken", broken.__name__)


def test_end_of_run_figures_are_drawn_recorded_and_redrawn_by_the_cli(tmp_path, fake_kinds, capsys):
    cfg = tiny(eval={"figures": ["norms", "broken"]})
    record = train_run(cfg, load_dataset(cfg.dataset), tmp_path / "run", log=lambda s: None,
        on_completed=end_of_run_figures)
    assert record["status"] == "completed"  # a failing figure does not fail a finished run ...
    assert record["figures"] == ["figures/norms.png"]
    assert record["figure_errors"] == {"broken": "RuntimeError: no ink"}  # ... and says why
    assert read_record(tmp_path / "run")["figures"] == ["figures/norms.png"]
    assert (tmp_path / "run" / "figures" / "norms.png").stat().st_size > 0

    # later, from disk: the trained weights come back from the checkpoint
    assert main(["plot", "norms", str(tmp_path / "run"), "--out", str(tmp_path / "again")]) == 0
    assert (tmp_path / "again" / "norms.png").is_file()
    assert "wrote" in capsys.readouterr().out


def test_loaded_run_has_the_trained_weights(tmp_path):
    cfg = tiny()
    data = load_dataset(cfg.dataset)
    train_run(cfg, data, tmp_path / "run", log=lambda s: None, on_completed=end_of_run_figures)
    run = load_run(tmp_path / "run")
    state = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=True)["method"]
    for k, v in run.method.state_dict().items():
        assert torch.equal(v.cpu(), state[k]), k
    assert not run.method.training
    assert run.features("test").shape == (len(data.x_test), 16)


def test_plot_refuses_bad_input_with_one_line_and_exit_2(tmp_path, fake_kinds, capsys):
    assert main(["plot", "nope", str(tmp_path)]) == 2
    assert "unknown figure 'nope'" in capsys.readouterr().err
    assert main(["plot", "norms", str(tmp_path / "missing")]) == 2
    assert "no such file or folder" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["plot", "norms", str(tmp_path / "empty")]) == 2
    assert "no record.json under it" in capsys.readouterr().err
    with pytest.raises(ConfigError, match=r"eval.figures\[0\]: unknown figure 'nope'"):
        check_config(load_config(None, ["eval.figures=[nope]"]), PLOTS)


def test_a_run_without_checkpoint_cannot_give_its_networks(tmp_path):
    cfg = tiny()
    train_run(cfg, load_dataset(cfg.dataset), tmp_path / "run", log=lambda s: None,
        on_completed=end_of_run_figures)
    (tmp_path / "run" / "checkpoint.pt").unlink()
    (run,) = find_runs([tmp_path])
    assert run.record["status"] == "completed"
    with pytest.raises(PlotError, match="no checkpoint.pt"):
        run.method


def test_a_run_whose_checkpoints_tune_keeps_apart_gives_its_networks_from_there(tmp_path):
    """A repeat run's (or a compare trial's) record is in the repeat's folder, its checkpoints in Tune's
    folder of the trial: the record names that folder, relative to itself."""
    import json
    import shutil

    cfg = tiny()
    train_run(cfg, load_dataset(cfg.dataset), tmp_path / "run", log=lambda s: None)
    tune_folder = tmp_path / "exp" / "tune_trial_a" / "checkpoint_000001"
    tune_folder.mkdir(parents=True)
    shutil.move(tmp_path / "run" / "checkpoint.pt", tune_folder / "checkpoint.pt")
    record_folder = tmp_path / "exp" / "repeat_best" / "tune_trial_a"
    record_folder.mkdir(parents=True)
    record = json.loads((tmp_path / "run" / "record.json").read_text())
    (record_folder / "record.json").write_text(json.dumps({**record, "checkpoints": "../../tune_trial_a"}))
    run = load_run(record_folder)
    assert run.checkpoint == record_folder / "../../tune_trial_a/checkpoint_000001/checkpoint.pt"
    state = torch.load(tune_folder / "checkpoint.pt", weights_only=True)["method"]
    assert all(torch.equal(v.cpu(), state[k]) for k, v in run.method.state_dict().items())


class _Counter(Augmentation):
    """Counts the samples it saw in the epoch: a diagnostic, not a loss term."""

    name = "counter"
    figures = ("norms",)

    def on_epoch_start(self, method, info):
        self.seen = 0

    def transform(self, batch, method, info):
        self.seen += len(batch.x)
        return batch

    def epoch_metrics(self):
        return {"counter_seen": float(self.seen)}


def test_epoch_metrics_and_default_figures_come_from_the_augmentations(tmp_path, monkeypatch, fake_kinds):
    monkeypatch.setitem(AUGMENTATIONS, "counter", _Counter)
    cfg = tiny(method={"augment": ["counter"]})
    record = train_run(cfg, load_dataset(cfg.dataset), tmp_path / "run", log=lambda s: None,
        on_completed=end_of_run_figures)
    assert [e["counter_seen"] for e in record["epochs"]] == [192.0, 192.0]  # 3 full batches of 64
    assert "loss_counter_seen" not in record["epochs"][0]
    assert record["figures"] == ["figures/norms.png"]  # eval.figures None: the method's own


@pytest.mark.parametrize("base", ["byol", "moco"])
def test_eval_encoder_target_evaluates_the_ema_copy(base):
    cfg = tiny(method={"base": base}, eval={"encoder": "target"})
    data = load_dataset(cfg.dataset)
    torch.manual_seed(0)
    method = build_method(cfg, data).eval()
    x = data.x_test[:8]
    assert torch.equal(method.features(x), method.objective.target_encoder(x))
    with torch.no_grad():  # move the online encoder only: the evaluated features must not follow
        for p in method.objective.encoder.parameters():
            p.add_(1.0)
    assert torch.equal(method.features(x), method.objective.target_encoder(x))
    assert not torch.allclose(method.features(x), method.objective.encoder(x))


def test_eval_encoder_target_needs_a_momentum_base():
    with pytest.raises(ConfigError, match="eval.encoder: simclr has no target encoder"):
        check_config(load_config(None, ["eval.encoder=target"]))
    check_config(load_config(None, ["eval.encoder=target", "method.base=byol"]))


def test_eval_encoder_target_if_any_reads_the_target_of_a_momentum_base_only():
    for base, target in (("byol", True), ("simclr", False)):
        cfg = tiny(method={"base": base}, eval={"encoder": "target_if_any"})
        data = load_dataset(cfg.dataset)
        method = build_method(cfg, data).eval()
        with torch.no_grad():
            for p in method.objective.encoder.parameters():
                p.add_(1.0)  # online and target differ now
        x = data.x_test[:8]
        expected = method.objective.target_encoder(x) if target else method.objective.encoder(x)
        assert torch.equal(method.features(x), expected)


def test_method_sections_exist_with_the_design_names():
    cfg = from_dict({})
    assert (cfg.pinda.mu, cfg.nrcc.lam, cfg.cocor.lengths, cfg.diffaug.lam) == ("zero", 0.1, (1, 2, 3), 0.1)
    with pytest.raises(ConfigError, match="nrcc.delta1: expected a number <= 1"):
        from_dict({"nrcc": {"delta1": 2}})


def test_variants_pool_seeds_and_name_only_the_settings_a_run_reads(tmp_path):
    from augtune.plots import Run, variants

    def run(method, seed, mmnn, lr=1e-3):
        config = {"method": {"base": method.split("+")[0], "augment": method.split("+")[1:]},
                  "train": {"seed": seed, "lr": lr}, "cocor": {"mmnn": mmnn}}
        return Run(tmp_path, {"method": method, "seed": seed, "config": config})

    runs = [run(m, s, mmnn) for s in (0, 1) for m in ("moco", "moco+cocor") for mmnn in (True, False)]
    groups = variants(runs)
    # plain MoCo never reads cocor.mmnn: its two runs per seed are one run of one variant
    assert {k: [r.record["seed"] for r in g] for k, g in groups.items()} == {
        "moco": [0, 1], "moco+cocor (cocor.mmnn=true)": [0, 1], "moco+cocor (cocor.mmnn=false)": [0, 1]}
    # a setting every run shares is not named; one that differs is, for every method that reads it
    assert list(variants([run("moco", 0, True, lr=0.1), run("moco", 0, True, lr=0.01)])) == [
        "moco (train.lr=0.1)", "moco (train.lr=0.01)"]
    assert list(variants([run("moco", 0, True), run("moco", 1, True)])) == ["moco"]


# -- a search's own figures (augtune plot search) -------------------------------------------------


def fake_search(exp: Path, n: int = 12, seed: int = 0, entrants: tuple[str, ...] = ("simclr",)) -> Path:
    """A search folder as augtune leaves it (one per entrant in a compare experiment): trial records with
    the parameters each was given; only the learning rate moves the metric. Plus a repeat run."""
    import numpy as np

    from augtune.config import set_values, to_dict
    from augtune.records import new_record, write_record

    rng = np.random.default_rng(seed)
    for entrant in entrants:
        folder = exp / entrant if len(entrants) > 1 else exp
        for i in range(n):
            params = {"train.lr": float(10 ** rng.uniform(-4, -2)),
                      "train.weight_decay": float(10 ** rng.uniform(-7, -3)),
                      "view.jitter": float(rng.choice([0.2, 0.4, 0.8]))}
            value = 0.9 - 0.2 * (np.log10(params["train.lr"]) + 3) ** 2 + 0.001 * rng.normal()
            base, *augment = entrant.split("+")
            dotted = {**params, "method.base": base, "method.augment": augment, "search.metric": "knn_acc"}
            config = to_dict(from_dict(set_values({}, dotted)))
            record = new_record(config, method=entrant, dataset="digits", seed=0)
            record.update(status="completed" if i % 4 else "stopped", params=params, phase="search",
                          entrant=entrant, started=f"2026-01-01T00:{i:02d}:00",
                          final={"knn_acc": float(value)},
                          epochs=[{"epoch": 1, "knn_acc": float(value) - 0.05},
                                  {"epoch": 2, "knn_acc": float(value)}])
            (folder / f"trial_{i:05d}").mkdir(parents=True)
            write_record(folder / f"trial_{i:05d}", record)
    repeat = exp / "repeat_best" / "trial_00000"
    repeat.mkdir(parents=True)
    write_record(repeat, {**record, "phase": "repeat", "seed": 1, "epochs": [{"epoch": 1, "knn_acc": 0.0}]})
    return exp


def test_plot_search_draws_optunas_figures_from_the_records(tmp_path, capsys):
    exp = fake_search(tmp_path / "exp")
    assert main(["plot", "search", str(exp)]) == 0
    written = sorted(p.name for p in (exp / "figures").iterdir())
    assert written == ["search_history.png", "search_importances.png", "search_parallel.png"]
    assert all((exp / "figures" / w).stat().st_size > 10_000 for w in written)
    assert capsys.readouterr().out.count("wrote ") == 3
    assert main(["methods"]) == 0
    assert "  search " in capsys.readouterr().out  # listed with the figures


def test_the_search_study_is_the_records_and_the_importances_are_the_commands(tmp_path, monkeypatch):
    """The study the figures draw holds every search trial (not the repeat run) in the order they
    started, with the last value each reported; its importances are `augtune importance`'s."""
    import matplotlib

    matplotlib.use("Agg")
    from optuna.visualization import matplotlib as ovm

    from augtune.analysis.importance import importances
    from augtune.plots import search

    exp = fake_search(tmp_path / "exp", n=16, seed=3)
    seen = {}
    real = ovm.plot_optimization_history

    def spy(study, **kw):
        seen["values"] = [t.value for t in study.trials]
        return real(study, **kw)

    monkeypatch.setattr(ovm, "plot_optimization_history", spy)
    search.plot(find_runs([exp]), tmp_path)
    runs = sorted((r for r in find_runs([exp]) if r.record["phase"] == "search"),
                  key=lambda r: r.record["started"])
    assert seen["values"] == [r.record["epochs"][-1]["knn_acc"] for r in runs]
    values, how = importances([r.record for r in runs], "knn_acc")
    assert max(values, key=values.get) == "train.lr" and how == "fANOVA"


def test_plot_search_refuses_runs_that_are_no_search(tmp_path, capsys):
    from augtune.config import to_dict
    from augtune.records import new_record, write_record

    (tmp_path / "run").mkdir()  # a run of `augtune train`: no parameters given by a search
    write_record(tmp_path / "run", {**new_record(to_dict(tiny()), method="simclr", dataset="digits", seed=0),
                                    "status": "completed", "final": {"knn_acc": 0.9}})
    assert main(["plot", "search", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no search trials among these runs" in err[0]
