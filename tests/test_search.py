"""`augtune search`: bad input refused before Ray starts; a real search, its status and its table."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from augtune.cli import main
from conftest import TINY_CNN

ROOT = Path(__file__).resolve().parents[1]

SEARCH = {
    "dataset": {"name": "digits", "max_train": 256, "max_test": 128},
    "model": TINY_CNN,
    "train": {"epochs": 2, "batch_size": 64},
    "eval": {"metrics": ["knn"], "references": True},
    "search": {"space": {"method.base": "grid([simclr, byol])", "train.lr": "loguniform(1e-4, 1e-2)"},
               "algorithm": "random", "num_samples": 2, "max_concurrent": 2},
}
# The real search adds early stopping and the repeat of each method's best setting over two seeds.
REAL = {**SEARCH, "search": {**SEARCH["search"], "scheduler": "asha", "grace_period": 1,
                             "repeat_best": {"top": 1, "per": "method.base", "seeds": [1, 2]}}}


@pytest.fixture
def config(tmp_path) -> Path:
    path = tmp_path / "search.yaml"
    path.write_text(yaml.safe_dump(SEARCH))
    return path


@pytest.mark.parametrize("overrides,message", [
    (["method.base=nope"], "method.base: unknown base method 'nope'"),
    (["search.spcae=simclr"], "search.spcae: unknown key"),
    (["search.num_samples=many"], "search.num_samples: expected an integer"),
    (["train.epochs=-1"], "train.epochs: expected a number >= 1"),
    (["search.space={}"], "search.space"),
    (["search.space=null"], "search.space: a search needs a space"),
    (["search.space=nope"], "search.space: unknown space 'nope'"),
    (["search.metric=sr_acc"], "search.metric: no trial reports 'sr_acc'"),
    (["search.space={train.lr: 'loguniform(1, 0.1)'}"], "search.space.train.lr"),
    (["search.space={train.lrr: 'uniform(0.1, 1)'}"], "search.space.train.lrr"),
    (["search.space={resources.num_workers: 'choice([1, 2])'}"], "search.space.resources.num_workers"),
    (["search.space={train.epochs: 'randint(-5, -1)'}"], "train.epochs: expected a number >= 1"),
    (["search.algorithm=bayes"], "search.algorithm: expected one of"),
    (["search.scheduler=hyperband"], "search.scheduler: expected one of"),
    (["search.scheduler=pbt", "search.algorithm=random", "train.epochs=4", "search.pbt.mutate=[model.width]"],
     "search.pbt.mutate[0]: model.width is not searched"),
    (["search.repeat_best.seeds=[a]"], "search.repeat_best.seeds[0]: expected an integer"),
    (["dataset.name=fashion_mnist", "dataset.root=/nonexistent/fm"], "/nonexistent/fm"),
    (["resources.use_gpu=true", "resources.num_workers=2"], "resources.use_gpu"),
])
def test_bad_search_input_exits_2_before_ray_with_one_line(config, tmp_path, capsys, overrides, message):
    import ray

    storage = tmp_path / "storage"
    args = ["search", str(config), "--storage", str(storage), "--name", "exp"]
    for o in overrides:
        args += ["--set", o]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err
    assert not storage.exists()  # nothing written
    assert not ray.is_initialized()  # no Ray started


def test_storage_that_is_not_writable_or_not_a_folder(config, tmp_path, capsys):
    a_file = tmp_path / "file"
    a_file.write_text("")
    assert main(["search", str(config), "--storage", str(a_file / "sub")]) == 2
    assert "is a file, not a folder" in capsys.readouterr().err
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        if os.access(locked, os.W_OK):  # root ignores permissions
            pytest.skip("running as root: permissions are not enforced")
        assert main(["search", str(config), "--storage", str(locked)]) == 2
        assert "not writable" in capsys.readouterr().err
    finally:
        locked.chmod(0o700)
    assert main(["search", str(config), "--storage", "nosuchscheme://bucket/x"]) == 2
    assert "--storage: cannot use" in capsys.readouterr().err


def test_existing_experiment_is_not_overwritten(config, tmp_path, capsys):
    (tmp_path / "storage" / "exp").mkdir(parents=True)
    (tmp_path / "storage" / "exp" / "keep.txt").write_text("results")
    assert main(["search", str(config), "--storage", str(tmp_path / "storage"), "--name", "exp"]) == 2
    assert "already exists" in capsys.readouterr().err
    assert (tmp_path / "storage" / "exp" / "keep.txt").read_text() == "results"


def test_status_refuses_a_folder_that_is_not_a_search(tmp_path, capsys):
    assert main(["status", str(tmp_path)]) == 2
    assert "not an augtune search folder" in capsys.readouterr().err


@pytest.mark.ray
@pytest.mark.slow
def test_real_search_then_status_and_export(tmp_path):
    """2 methods x 2 trials x 2 epochs on digits under ASHA, each method's best repeated over two
    seeds, in a real Ray; then status and export."""
    config = tmp_path / "real.yaml"
    config.write_text(yaml.safe_dump(REAL))
    env = {**os.environ, "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.5"}
    storage = tmp_path / "storage"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "augtune.cli",
            "search",
            str(config),
            "--storage",
            str(storage),
            "--name",
            "exp",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    exp = storage / "exp"
    records = [json.loads(p.read_text()) for p in exp.glob("*/record.json")]
    assert len(records) == 4
    assert sorted(r["method"] for r in records) == ["byol", "byol", "simclr", "simclr"]
    for r in records:  # ASHA may stop a trial after its first epoch; its record says so
        assert (r["status"], len(r["epochs"])) in (("completed", 2), ("stopped", 1)), r["status"]
    assert sum(r["status"] == "completed" for r in records) >= 2
    assert list(exp.glob("*/events.out.tfevents*"))  # TensorBoard logs
    repeats = [json.loads(p.read_text()) for p in (exp / "repeat_best").glob("*/record.json")]
    assert sorted((r["method"], r["seed"]) for r in repeats) == [("byol", 1), ("byol", 2), ("simclr", 1),
                                                                  ("simclr", 2)]
    assert all(r["status"] == "completed" for r in repeats)
    assert "| simclr |" in run.stdout and "| byol |" in run.stdout and "(2)" in run.stdout  # the table

    status = subprocess.run([sys.executable, "-m", "augtune.cli", "status", str(exp)], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert status.returncode == 0, status.stdout + status.stderr
    assert f"repeat_best {exp.resolve()}/repeat_best: 4 completed" in status.stdout, status.stdout
    assert "ray" not in status.stderr.lower()

    export = subprocess.run(
        [
            sys.executable,
            "-m",
            "augtune.cli",
            "export",
            str(exp / "repeat_best"),
            "--rows",
            "method",
            "--cols",
            "dataset",
            "--metric",
            "knn_acc",
            "--format",
            "md",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert export.returncode == 0, export.stderr
    assert "| byol |" in export.stdout and "(2)" in export.stdout and "raw" in export.stdout


def _repeated(folder: Path, search: dict, trials: list[tuple[dict, float, str]]) -> list[dict]:
    """What a search's repeat (`choosers.RepeatBest`) runs, once per seed, from its trials' records in
    `folder`: (parameters, the last value of knn_acc, status) of each, in the order they were made."""
    from augtune.config import from_dict, to_dict
    from augtune.records import REPEAT
    from augtune.search.choosers import RepeatBest

    for i, (params, acc, status) in enumerate(trials):
        (folder / f"t{i}").mkdir(parents=True)
        (folder / f"t{i}" / "record.json").write_text(json.dumps(
            {"status": status, "params": params, "epochs": [{"epoch": 1, "knn_acc": acc}]}))
    runs, finished = RepeatBest(str(folder), to_dict(from_dict({"search": search})))()
    assert finished and all(r[REPEAT]["train.seed"] == 1 for r in runs)
    return [{k: v for k, v in r[REPEAT].items() if k != "train.seed"} for r in runs]


def test_the_repeat_takes_the_top_distinct_parameter_sets_per_group(tmp_path):
    def trial(base, lr, acc, status="completed"):
        return {"method.base": base, "train.lr": lr}, acc, status

    trials = [trial("simclr", 1, 0.9), trial("simclr", 2, 0.95), trial("byol", 3, 0.8),
              trial("byol", 4, 0.99, "failed"), trial("simclr", 2, 0.94), trial("byol", 5, 0.5, "stopped")]
    seeds = {"seeds": [1]}
    assert _repeated(tmp_path / "a", {"repeat_best": {"top": 2, **seeds}}, trials) == [
        {"method.base": "simclr", "train.lr": 2}, {"method.base": "simclr", "train.lr": 1}]
    assert _repeated(tmp_path / "b", {"repeat_best": {"top": 1, "per": "method.base", **seeds}}, trials) == [
        {"method.base": "simclr", "train.lr": 2}, {"method.base": "byol", "train.lr": 3}]
    assert _repeated(tmp_path / "c", {"repeat_best": {"top": 1, **seeds}, "mode": "min"}, trials) == [
        {"method.base": "byol", "train.lr": 5}]  # stopped early by the scheduler: it ended, and counts


def test_the_repeat_runs_once_what_differs_only_in_keys_the_run_never_reads(tmp_path):
    def trial(augment, mu, acc):
        return {"method.augment": augment, "pinda.mu": mu}, acc, "completed"

    trials = [trial(["pinda"], "zero", 0.9), trial(["pinda"], "learned", 0.8),
              trial(["clae"], "zero", 0.7), trial(["clae"], "learned", 0.75)]  # CLAE never reads pinda.mu
    assert _repeated(tmp_path, {"repeat_best": {"top": 10, "seeds": [1]}}, trials) == [
        {"method.augment": ["pinda"], "pinda.mu": "zero"},
        {"method.augment": ["pinda"], "pinda.mu": "learned"},
        {"method.augment": ["clae"], "pinda.mu": "learned"}]


def test_a_search_evaluates_its_metric_only_where_the_scheduler_reads_it(tmp_path):
    from augtune.config import load_config
    from augtune.search.plan import rung_epochs, trial_base

    cfg = load_config(None, ["train.epochs=20", "search.scheduler=asha", "search.grace_period=2",
                             "search.reduction_factor=3"])  # eval.every left at its default
    assert rung_epochs(cfg) == (2, 6, 18)  # ASHA's milestones 2 * 3^k below max_t
    base = trial_base(cfg, str(tmp_path))
    assert base["eval"]["at"] == [2, 6, 18] and base["eval"]["every"] == 0  # and the last epoch, always
    mine = trial_base(load_config(None, ["train.epochs=20", "eval.every=5"]), str(tmp_path))
    assert mine["eval"]["every"] == 5  # the user's own choice is kept
    assert base["eval"]["reference_cache"] == str(tmp_path / ".augtune" / "references")
    odd = load_config(None, ["train.epochs=20", "search.scheduler=asha", "search.reduction_factor=3.5"])
    assert rung_epochs(odd) == (1, 4, 13)  # ASHA takes the first result at or past 3.5 and 12.25
    assert rung_epochs(load_config(None, ["search.scheduler=none"])) == ()
