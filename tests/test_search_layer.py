"""The search layer's shape (docs/contributing.md, "The search layer"): one door to Ray's and Optuna's
private names with a version check, no private name imported across augtune's modules, entrants from the
registry (a method added through the seam enters a compare by itself), `--plan`, experiment names."""
from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from augtune.config import ConfigError, from_dict, load_config, set_values, to_dict

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "augtune"
DOOR = PACKAGE / "search" / "adapters.py"
# private attributes of Ray Tune's and Optuna's objects that augtune touches or once touched (adapters'
# docstring lists those it touches now)
PRIVATE = re.compile(r"\._(local_tuner|experiment_analysis|tune_config|trial_generator|trial_iter|iterators|"
                     r"live_trials|finished|counter|ot_trials|ot_study|completed_trials|space|trial_id|"
                     r"trial_runs|trial_state|perturbation_interval|time_attr|metric_op|storage)\b"
                     r"|\.current_checkpoint_index\b")
TINY = {"backbone": "mlp", "hidden_dim": 16, "num_layers": 2, "embed_dim": 8, "proj_hidden_dim": 8,
        "proj_dim": 8, "pred_hidden_dim": 8}


def _modules():
    return sorted(PACKAGE.rglob("*.py"))


def test_no_module_imports_another_modules_private_name():
    found = []
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("augtune")):
                found += [f"{path.relative_to(ROOT)}: {a.name}" for a in node.names
                          if a.name.startswith("_") and not a.name.startswith("__")]
    assert not found, found


def test_ray_and_optuna_private_names_are_touched_in_one_module_only():
    touching = set()
    for path in _modules():
        text = path.read_text()
        tree = ast.parse(text)
        imports = [a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                   and (n.module or "").split(".")[0] in ("ray", "optuna") for a in n.names]
        attrs = [m.group(0) for m in PRIVATE.finditer(text)
                 if not text[:m.start()].endswith(("self", "cls"))]
        if any(name.startswith("_") for name in imports) or (attrs and path != DOOR):
            touching.add(path.relative_to(ROOT).as_posix())
    assert touching <= {DOOR.relative_to(ROOT).as_posix()}, touching


def test_the_door_lists_every_private_name_it_touches_and_they_are_five_at_most():
    text = DOOR.read_text()
    doc = ast.get_docstring(ast.parse(text))
    code = text[text.index('"""', 3) + 3:]
    attrs = {m.group(0)[1:] for m in PRIVATE.finditer(code)}
    imported = {a.name for n in ast.walk(ast.parse(text)) if isinstance(n, ast.ImportFrom)
                and (n.module or "").split(".")[0] in ("ray", "optuna")
                for a in n.names if a.name.startswith("_")}
    for name in attrs | imported:
        assert name in doc, f"{name} is touched but not listed in adapters' docstring"
    assert len(attrs | imported) <= 5, sorted(attrs | imported)


def test_versions_outside_the_tested_range_are_refused_in_one_line():
    from augtune.search.adapters import SUPPORTED, UnsupportedVersion, check_versions

    check_versions()  # the installed ones are in range
    for name in SUPPORTED:
        with pytest.raises(UnsupportedVersion) as e:
            check_versions({name: "99.0.0"})
        message = str(e.value)
        assert "\n" not in message and f"{name} 99.0.0 is installed" in message
        assert ",".join(SUPPORTED[name]) in message


def test_the_tested_ranges_are_pyprojects():
    import tomllib

    from augtune.search.adapters import SUPPORTED

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    for name, bounds in SUPPORTED.items():
        spec = next(d for d in deps if re.match(rf"{name}\b", d))
        assert spec.split("]")[-1].removeprefix(name) == ",".join(bounds), spec


# -- entrants from the registry -----------------------------------------------------------------------------

@pytest.fixture
def feature_dropout(monkeypatch):
    """A method a user adds through the seam: one class, one registry line, no space of its own."""
    from augtune.methods import AUGMENTATIONS

    sys.path.insert(0, str(Path(__file__).parent))
    try:
        from test_contract import FeatureDropout
    finally:
        sys.path.remove(str(Path(__file__).parent))
    monkeypatch.setitem(AUGMENTATIONS, "feature_dropout", FeatureDropout)
    return FeatureDropout


def test_a_method_added_through_the_seam_enters_a_default_compare(feature_dropout, tmp_path):
    from augtune.search.compare import entrants, plan_compare

    cfg = load_config(None, ["dataset.as_vectors=true", "compare.trials=1", "compare.seeds=1"])
    for modality in ("image", "vector"):
        labels = [e.label for e in entrants(cfg, modality)]
        assert "simclr+feature_dropout" in labels
    named = load_config(None, ["compare.methods=[base, feature_dropout]"])
    assert [e.label for e in entrants(named, "vector")] == ["simclr", "simclr+feature_dropout"]
    plan = plan_compare(named, "vector", storage=str(tmp_path), name="c")
    assert plan.labels == ("simclr", "simclr+feature_dropout")
    assert plan.plans[1].cfg.search.space == "simclr"  # no space of its own: its base's
    assert not any(tmp_path.iterdir())  # planning writes nothing


def test_compare_methods_are_checked_against_the_registry():
    from augtune.search.compare import entrants

    with pytest.raises(ConfigError, match="compare.methods: unknown 'mymethod'"):
        entrants(load_config(None, ["compare.methods=[mymethod]"]), "image")
    with pytest.raises(ConfigError, match="simcl applies to vector data"):
        entrants(load_config(None, ["compare.methods=[simcl]"]), "image")


def test_every_registered_space_on_every_modality_it_claims_samples_valid_configs():
    """A trial never fails on a configuration error: every registered space, on each modality its
    method applies to, sampled many times, passes the checks a trial would meet (CoCor's image pools
    on vectors among them)."""
    from augtune.checks import check_config
    from augtune.methods import AUGMENTATIONS, check_modality, modalities
    from augtune.search.plan import check_trials
    from augtune.search.searchers import sample_values
    from augtune.spaces import SPACES, resolve_space

    for name, space in SPACES.items():
        claims = modalities(name) if name in AUGMENTATIONS else ("image", "vector")
        for modality in claims:
            base = to_dict(load_config(None, [f"search.space={name}"]))
            s = resolve_space(from_dict(base).search, modality)
            for seed in range(64):
                cfg = check_config(from_dict(set_values(base, sample_values(s, seed))))
                check_modality(cfg, modality)
            check_trials(base, s, modality=modality)  # every domain's edges too


@pytest.mark.parametrize("domain, says", [
    ("uniform(0.0, 1.0000001)", "view.flip_p = 1.00000009"),  # a sliver past the bound no sample hits
    ("uniform(-0.0000001, 1.0)", "view.flip_p = -1e-07, its domain's lowest value"),
    ("choice([" + ", ".join(f"{i / 100:g}" for i in range(40)) + ", 1.5])", "view.flip_p"),  # 1 bad of 41
    ("grid([0.5, 2])", "view.flip_p"),
])
def test_a_domain_reaching_past_a_keys_bounds_is_refused_at_planning_naming_the_key(domain, says):
    """Every key's domain edges are checked with the samples (issue 26.5): a range that allows an invalid
    value is refused in one line, naming the key and the value, wherever the samples land."""
    from augtune.search.plan import check_trials
    from augtune.spaces import resolve_space

    base = to_dict(load_config(None, []))
    base["search"]["space"] = {"view.flip_p": domain}
    space = resolve_space(from_dict(base).search, "image")
    with pytest.raises(ConfigError) as e:
        check_trials(base, space)
    assert says in str(e.value) and "expected a number" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("domain", ["uniform(0.0, 1.0)", "quniform(0.0, 1.0, 0.1)", "choice([0, 1])"])
def test_a_domain_within_a_keys_bounds_passes_at_its_edges(domain):
    """uniform draws below its upper bound (the float just below it is checked); quniform reaches it."""
    from augtune.search.plan import check_trials
    from augtune.search.searchers import edges
    from augtune.spaces import resolve_space

    base = to_dict(load_config(None, []))
    base["search"]["space"] = {"view.flip_p": domain}
    space = resolve_space(from_dict(base).search, "image")
    check_trials(base, space)
    assert max(v for _, v, _ in edges(space)) <= 1


def test_cocor_samples_only_the_vector_pool_on_vectors():
    from augtune.search.searchers import sample_values
    from augtune.spaces import resolve_space

    search = load_config(None, ["search.space=cocor"]).search
    assert {sample_values(resolve_space(search, "vector"), s)["cocor.pool"] for s in range(50)} == {"all"}
    assert len({sample_values(resolve_space(search, "image"), s)["cocor.pool"] for s in range(50)}) == 3


# -- --plan, names ------------------------------------------------------------------------------------------

def _config(tmp_path: Path, extra: dict | None = None) -> Path:
    cfg = {"dataset": {"name": "digits", "as_vectors": True, "max_test": 100},
           "model": TINY, "train": {"epochs": 2, "batch_size": 64, "num_threads": 1},
           "eval": {"metrics": ["knn"]},
           "search": {"space": "simclr", "algorithm": "optuna", "num_samples": 2, "metric": "knn_acc",
                      "repeat_best": {"top": 1, "seeds": [1, 2]}},
           "compare": {"methods": ["base", "nrcc"], "trials": 2, "seeds": 2, "metrics": ["knn_acc"]},
           **(extra or {})}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.mark.parametrize("command", ["search", "compare"])
def test_plan_prints_what_would_run_without_ray_or_writing(command, tmp_path, capsys):
    import ray

    from augtune.cli import main

    storage = tmp_path / "res"
    assert main([command, str(_config(tmp_path)), "--storage", str(storage), "--plan"]) == 0
    out = capsys.readouterr().out
    assert "not started: --plan" in out and "epochs" in out and "knn_acc" in out
    if command == "compare":
        assert "2 entrants" in out and "simclr+nrcc" in out and "seeds [1, 2]" in out
    else:
        assert "2 trial(s)" in out and "repeat: 2 run(s)" in out
    assert not ray.is_initialized() and not storage.exists()


@pytest.mark.parametrize("command", ["search", "compare"])
def test_plan_refuses_a_bad_config_as_a_launch_would(command, tmp_path, capsys):
    from augtune.cli import main

    bad = _config(tmp_path, {"train": {"epochs": 0}})
    codes, errors = [], []
    for extra in ([], ["--plan"]):
        codes.append(main([command, str(bad), "--storage", str(tmp_path / "res"), *extra]))
        errors.append(capsys.readouterr().err.strip())
    assert codes == [2, 2] and errors[0] == errors[1] and errors[0].count("\n") == 0
    assert "train.epochs" in errors[0]
    assert not (tmp_path / "res").exists()


def test_default_names_say_what_ran_and_never_collide(tmp_path):
    from augtune.search.experiment import data_subject, default_name

    cfg = load_config(None, ["dataset.name=arrays", "dataset.path=/data/breast_cancer.csv"])
    assert data_subject(cfg) == "breast_cancer"
    first = default_name("compare", data_subject(cfg), str(tmp_path))
    assert first.startswith("compare-breast_cancer-")
    (tmp_path / first).mkdir()
    second = default_name("compare", data_subject(cfg), str(tmp_path))
    assert second != first and second.startswith(first)


@pytest.mark.parametrize("name", ["a\nb", "with space", "-x", ".hidden", "a/b", "", "é"])
def test_unsafe_names_are_refused(name):
    from augtune.search.experiment import check_name

    with pytest.raises(ConfigError, match="--name"):
        check_name(name)


# -- a plugin method in a real compare ---------------------------------------------------------------

PLUGIN = textwrap.dedent('''
    """A user's method, outside augtune: one class, one registry line."""
    import torch

    from augtune.methods import AUGMENTATIONS, Augmentation


    class FeatureDropout(Augmentation):
        name = "feature_dropout"

        def transform(self, batch, method, info):
            keep = [(torch.rand_like(v) > 0.2).to(v.dtype) for v in batch.views]
            return batch.with_views([v * k for v, k in zip(batch.views, keep)])


    AUGMENTATIONS["feature_dropout"] = FeatureDropout
''')


@pytest.mark.ray
@pytest.mark.slow
def test_a_plugin_method_runs_in_a_one_trial_compare(tmp_path):
    (tmp_path / "my_methods.py").write_text(PLUGIN)
    config = _config(tmp_path, {"compare": {"methods": ["feature_dropout"], "trials": 1, "seeds": 1,
                                            "metrics": ["knn_acc"], "scheduler": "none"},
                                "train": {"epochs": 1, "batch_size": 64, "num_threads": 1}})
    env = {**os.environ, "AUGTUNE_PLUGINS": "my_methods",
           "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, "-m", "augtune.cli", "compare", str(config), "--storage",
                          str(tmp_path / "res"), "--name", "plug"], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    records = list((tmp_path / "res" / "plug").glob("simclr+feature_dropout/*/record.json"))
    assert len(records) == 1 and "simclr+feature_dropout" in run.stdout
    again = subprocess.run([sys.executable, "-m", "augtune.cli", "resume", str(tmp_path / "res" / "plug")],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and "has finished" in again.stdout, again.stdout + again.stderr
    assert "resuming" not in again.stdout  # answered from the records: no Ray started


def test_random_search_starts_from_a_preset_whose_choice_is_a_list():
    """CoCor's defaults name `cocor.lengths: [1, 2, 3]`, a choice of lists: Tune's variant generator read
    a list in a preset as nested keys and failed (a compare's PBT entrant of CoCor died on it); every
    preset point is the first trials' config, the lists whole."""
    from ray.tune.experiment import Experiment

    from augtune.config import load_config
    from augtune.search.searchers import searcher
    from augtune.spaces import resolve_space

    cfg = load_config(None, ["search.space=cocor", "search.algorithm=random", "dataset.as_vectors=true"])
    space = resolve_space(cfg.search, "vector")
    algorithm, params = searcher(cfg, space)
    algorithm.add_configurations([Experiment("e", run=lambda c: None, config=params,
                                             num_samples=len(space.points_to_evaluate) + 2)])
    trials = [algorithm.next_trial() for _ in range(len(space.points_to_evaluate) + 2)]
    for trial, point in zip(trials, space.points_to_evaluate):
        assert {k: trial.config[k] for k in point} == point
        assert type(trial.config["cocor.lengths"]) is list
    assert all(t.config["cocor.lengths"] in ([1, 2, 3], [1], [2], [3], [1, 2, 3, 5]) for t in trials)
