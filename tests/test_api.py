"""The Python API (`augtune.api`): what a notebook calls. Its jobs share the CLI's code; what they
return is checked against the CLI on a real compare in test_compare."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import augtune
from augtune.config import ConfigError

ROOT = Path(__file__).resolve().parents[1]


def test_import_augtune_loads_neither_torch_nor_ray():
    code = "import sys, augtune; print(sorted({'torch', 'ray', 'pandas'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr


def test_the_api_is_what_the_package_exports():
    assert set(augtune.__all__) >= {"config_from", "train", "search", "compare", "resume", "load",
                                    "Experiment", "Run"}
    for name in augtune.__all__:
        assert getattr(augtune, name) is not None


def test_a_config_from_a_file_a_dict_dotted_keys_sections_and_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"train": {"epochs": 4}, "dataset": {"name": "digits"}}))
    from_file = augtune.config_from(path)
    assert from_file.train.epochs == 4
    nested = augtune.config_from({"train": {"epochs": 5}})
    dotted = augtune.config_from({"train.epochs": 5})
    assert nested == dotted and nested.train.epochs == 5
    assert augtune.config_from(path, ["train.lr=0.01"]).train.lr == 0.01
    assert augtune.config_from(path, {"train.lr": 0.02}).train.lr == 0.02
    kw = augtune.config_from(from_file, train={"batch_size": 32}, compare={"trials": 2})
    assert (kw.train.epochs, kw.train.batch_size, kw.compare.trials) == (4, 32, 2)


@pytest.mark.parametrize("bad, key", [({"train": {"epochs": 0}}, "train.epochs"),
                                      ({"train.nope": 1}, "train.nope"),
                                      ({"method": {"base": "nope"}}, "method.base")])
def test_a_bad_config_raises_one_line_naming_the_key(bad, key):
    with pytest.raises(ConfigError) as e:
        augtune.config_from(bad)
    assert key in str(e.value) and "\n" not in str(e.value)


def test_loading_a_folder_that_is_no_experiment_says_so(tmp_path):
    with pytest.raises(ConfigError, match="not an augtune experiment"):
        augtune.load(tmp_path)


def test_a_search_folder_is_no_compare(tmp_path):
    (tmp_path / "augtune_search.yaml").write_text("{}")
    exp = augtune.load(tmp_path)
    assert not exp.is_compare and exp.records() == []
    with pytest.raises(ConfigError, match="a search, not a compare"):
        exp.verdict()


def test_train_runs_in_this_process_and_returns_its_record(tmp_path, capsys):
    from conftest import TINY_MLP

    run = augtune.train({"dataset": {"name": "digits", "as_vectors": True, "max_train": 256,
                                     "max_test": 128},
                         "model": TINY_MLP, "train": {"epochs": 1, "batch_size": 64, "num_threads": 1},
                         "eval": {"metrics": ["knn"], "references": False}}, out=tmp_path / "run")
    assert run.record["status"] == "completed" and 0.0 <= run.final["knn_acc"] <= 1.0
    assert (tmp_path / "run" / "record.json").is_file()
    from augtune.trainables.run import RunFolderError, final_table

    assert capsys.readouterr().out.rstrip().endswith(final_table(run.record))  # it ends as `augtune train`

    with pytest.raises(RunFolderError):  # the folder holds a run now: refused, not overwritten
        augtune.train({"dataset": {"name": "digits"}}, out=tmp_path / "run")
