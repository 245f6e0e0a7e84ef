"""The documentation: the site builds with `mkdocs build --strict` (no broken link, no missing page), the
generated config reference holds every config key, the cluster examples are well formed (the KubeRay
manifest against the RayJob CRD's required structure, the SLURM script by `bash -n`), the README stays
short and keeps its two commands, and nothing cites the design document that docs/contributing.md
replaced."""
from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
HOOK = ROOT / "docs" / "hooks" / "reference.py"
RAYJOB = ROOT / "examples" / "cluster" / "rayjob.yaml"
SLURM = ROOT / "examples" / "cluster" / "slurm.sh"
README = ROOT / "README.md"
TEST_COMMAND = "python -m pip install -e '.[test]' && python -m pytest -q"
MAIN_JOB = "pip install -e . && augtune compare examples/compare_digits.yaml"


def _hook():
    spec = importlib.util.spec_from_file_location("augtune_docs_reference", HOOK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---------------------------------------------------------------------------------------------
# The site


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    for package in ("mkdocs", "material", "mkdocstrings_handlers.python"):
        top = package.split(".")[0]
        if importlib.util.find_spec(top) is None or importlib.util.find_spec(package) is None:
            pytest.skip(f"{package} is not installed (pip install -e '.[docs]')")
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"),
               "-d", str(out)]
    run = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-6000:]
    return out


def test_the_site_builds_strict_with_every_page(site):
    for page in ("index.html", "getting-started/index.html", "reference/config/index.html",
                 "results/index.html", "contributing/index.html", "changelog/index.html", "api/index.html",
                 "reference/methods/index.html",
                 *(f"methods/{m}/index.html" for m in ("pinda", "nrcc", "cocor", "diffaug"))):
        assert (site / page).is_file(), page


def test_the_built_config_reference_shows_every_key(site):
    from augtune.config import dotted_keys

    html = (site / "reference" / "config" / "index.html").read_text(encoding="utf-8")
    missing = sorted(k for k in dotted_keys() if f"<code>{k}</code>" not in html)
    assert not missing, f"config keys missing from the built config reference: {missing}"


def test_the_built_api_reference_shows_the_public_surface_only(site):
    html = (site / "api" / "index.html").read_text(encoding="utf-8")
    import augtune

    for name in [*(n for n in augtune.__all__ if n != "__version__"), "Best", "Verdict", "Row", "Cell",
                 "plainly", "ConfigError", "DataError", "SearchInterrupted", "SearchFailed"]:
        assert 'id="augtune.' in html and name in html, name
    for internal in ("run_job", "write_json_atomic", "json_depth", "log_file", "time_budget_of"):
        assert internal not in html, internal


def test_the_built_pages_hold_the_tables_generated_from_the_code(site):
    """The docs hook docs/hooks/tables.py fills its markers (tests/test_docs_tables.py checks the tables
    against the code); the method pages' names of classes link to the code reference, which the strict
    build resolves, so a renamed class breaks it."""
    from augtune.methods import AUGMENTATIONS, BASES
    from augtune.plots import PLOTS

    methods = (site / "methods" / "index.html").read_text(encoding="utf-8")
    evaluation = (site / "reference" / "evaluation" / "index.html").read_text(encoding="utf-8")
    results = (site / "results" / "index.html").read_text(encoding="utf-8")
    for page in (methods, evaluation, results):
        assert "<!-- augtune:" not in page and "--8&lt;--" not in page and "--8<--" not in page  # all filled
    assert "<code>knn_acc</code>" in evaluation and "<code>cluster_k</code>" in evaluation  # eval.metrics
    for name, cls in [*BASES.items(), *AUGMENTATIONS.items()]:
        assert f"<code>{name}</code>" in methods
        assert f'href="../reference/methods/#{cls.__module__}.{cls.__qualname__}"' in methods
    for kind in PLOTS:
        assert f"<code>{kind}</code>" in evaluation
    assert "<code>max_rss_mb</code>" in evaluation and "<code>lineage</code>" in evaluation
    reference = (site / "reference" / "methods" / "index.html").read_text(encoding="utf-8")
    for cls in [*BASES.values(), *AUGMENTATIONS.values()]:  # every class, rendered from the registries
        assert f'id="{cls.__module__}.{cls.__qualname__}"' in reference
    for page in ("pinda", "nrcc", "cocor", "diffaug"):
        html = (site / "methods" / page / "index.html").read_text(encoding="utf-8")
        cls = AUGMENTATIONS[page]
        anchor = f"{cls.__module__}.{cls.__qualname__}"
        assert f'href="../../reference/methods/#{anchor}"' in html and f'id="{anchor}"' in reference


def test_the_quickstart_page_renders_the_notebook(site):
    """Built without running it (the suite's build starts no Ray): its code, and how to see its outputs;
    tests/test_notebook.py renders the executed notebook and finds the verdict in it."""
    import html as html_lib

    page = (site / "quickstart" / "index.html").read_text(encoding="utf-8")
    text = html_lib.unescape(re.sub(r"<[^>]+>", "", page))
    assert "augtune.compare(cfg" in text and "exp.best()" in text and "AUGTUNE_DOCS_EXECUTE=1" in text


def test_the_built_commands_reference_shows_every_command(site):
    html = (site / "reference" / "cli" / "index.html").read_text(encoding="utf-8")
    commands = ("train", "search", "compare", "resume", "status", "export", "importance", "plot", "methods")
    for command in commands:
        assert f"usage: augtune {command}" in html, command


def test_the_results_page_has_the_gpu_section_waiting(site):
    html = (site / "results" / "index.html").read_text(encoding="utf-8")
    assert 'id="gpu"' in html and "benchmarks/gpu_check.py" in html


# ---------------------------------------------------------------------------------------------
# The config reference, generated from augtune/config.py (no mkdocs needed)


def test_the_config_reference_holds_every_key_of_the_config_dataclasses():
    """Generated by reading config.py's source (`ast`, `tokenize`): compared here with the keys the
    dataclasses themselves give, so neither a new key nor a bug in the generator goes unseen."""
    from augtune.config import dotted_keys

    hook = _hook()
    page = hook.markdown(ROOT)
    keys = dotted_keys()
    assert hook.keys(ROOT) == keys, (sorted(keys - hook.keys(ROOT)), sorted(hook.keys(ROOT) - keys))
    missing = sorted(k for k in keys if f"`{k}`" not in page)
    assert not missing, f"config keys missing from the generated page: {missing}"


def test_the_config_reference_shows_defaults_ranges_choices_and_comments():
    hook = _hook()
    rows = {k.dotted: k for s in hook.sections(ROOT) for k in s.keys}
    lr = rows["train.lr"]
    assert lr.default == "0.001" and any(a.startswith("0 < x") for a in lr.allowed)
    assert "PiNDA B.4" in lr.why
    assert "one of `adam`, `adamw`, `sgd`" in rows["train.optimizer"].allowed
    assert any("`pinda`" in a for a in rows["method.augment"].allowed)  # the registry, read statically
    assert any("0 < lo <= hi <= 1" in a for a in rows["view.crop_scale"].allowed)  # a _validate rule
    assert rows["search.repeat_best.top"].default == "0"  # a nested section
    assert rows["nrcc.order"].why.startswith("momentum_first:")  # the comment block above the field


# ---------------------------------------------------------------------------------------------
# The cluster examples

# The parts of KubeRay's RayJob CRD (ray.io/v1) that a manifest must get right: the required structure,
# the types of the fields used, and no misspelt key where the CRD's set of keys is known.
_CONTAINER = {
    "type": "object",
    "required": ["name", "image"],
    "properties": {"name": {"type": "string", "minLength": 1}, "image": {"type": "string", "minLength": 1},
                   "command": {"type": "array", "items": {"type": "string"}},
                   "args": {"type": "array", "items": {"type": "string"}},
                   "env": {"type": "array"}, "envFrom": {"type": "array"}, "ports": {"type": "array"},
                   "resources": {"type": "object",
                                 "properties": {"requests": {"type": "object"},
                                                "limits": {"type": "object"}}},
                   "volumeMounts": {"type": "array"}},
}
_POD_TEMPLATE = {
    "type": "object",
    "required": ["spec"],
    "properties": {"metadata": {"type": "object"},
                   "spec": {"type": "object", "required": ["containers"],
                            "properties": {"containers": {"type": "array", "minItems": 1,
                                                          "items": _CONTAINER}}}},
}
_START_PARAMS = {"type": "object", "additionalProperties": {"type": "string"}}  # KubeRay: string values
RAYJOB_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "ray.io/v1"},
        "kind": {"const": "RayJob"},
        "metadata": {"type": "object", "required": ["name"],
                     "properties": {"name": {"type": "string",
                                             "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"}}},
        "spec": {
            "type": "object",
            "required": ["entrypoint", "rayClusterSpec"],
            "additionalProperties": False,
            "properties": {
                "entrypoint": {"type": "string", "minLength": 1},
                "runtimeEnvYAML": {"type": "string"},
                "jobId": {"type": "string"},
                "metadata": {"type": "object"},
                "shutdownAfterJobFinishes": {"type": "boolean"},
                "ttlSecondsAfterFinished": {"type": "integer", "minimum": 0},
                "activeDeadlineSeconds": {"type": "integer", "minimum": 0},
                "backoffLimit": {"type": "integer", "minimum": 0},
                "submissionMode": {"enum": ["K8sJobMode", "HTTPMode", "InteractiveMode", "SidecarMode"]},
                "entrypointNumCpus": {"type": "number"},
                "entrypointNumGpus": {"type": "number"},
                "entrypointResources": {"type": "string"},
                "clusterSelector": {"type": "object"},
                "submitterPodTemplate": _POD_TEMPLATE,
                "submitterConfig": {"type": "object"},
                "suspend": {"type": "boolean"},
                "managedBy": {"type": "string"},
                "deletionStrategy": {"type": "object"},
                "rayClusterSpec": {
                    "type": "object",
                    "required": ["headGroupSpec"],
                    "additionalProperties": False,
                    "properties": {
                        "rayVersion": {"type": "string"},
                        "enableInTreeAutoscaling": {"type": "boolean"},
                        "autoscalerOptions": {"type": "object"},
                        "headServiceAnnotations": {"type": "object"},
                        "gcsFaultToleranceOptions": {"type": "object"},
                        "suspend": {"type": "boolean"},
                        "managedBy": {"type": "string"},
                        "headGroupSpec": {
                            "type": "object",
                            "required": ["template"],
                            "additionalProperties": False,
                            "properties": {"rayStartParams": _START_PARAMS, "template": _POD_TEMPLATE,
                                           "serviceType": {"type": "string"},
                                           "headService": {"type": "object"},
                                           "enableIngress": {"type": "boolean"}},
                        },
                        "workerGroupSpecs": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "required": ["groupName", "template"],
                                "additionalProperties": False,
                                "properties": {
                                    "groupName": {"type": "string", "minLength": 1},
                                    "replicas": {"type": "integer", "minimum": 0},
                                    "minReplicas": {"type": "integer", "minimum": 0},
                                    "maxReplicas": {"type": "integer", "minimum": 0},
                                    "numOfHosts": {"type": "integer", "minimum": 1},
                                    "idleTimeoutSeconds": {"type": "integer", "minimum": 0},
                                    "suspend": {"type": "boolean"},
                                    "rayStartParams": _START_PARAMS,
                                    "scaleStrategy": {"type": "object"},
                                    "template": _POD_TEMPLATE,
                                },
                            },
                        },
                    },
                },
            },
        },
    },
}


def _validate(manifest: dict) -> None:
    import jsonschema

    jsonschema.validate(manifest, RAYJOB_SCHEMA)


def test_the_rayjob_manifest_matches_the_crd():
    manifest = yaml.safe_load(RAYJOB.read_text(encoding="utf-8"))
    _validate(manifest)
    spec = manifest["spec"]
    for group in spec["rayClusterSpec"]["workerGroupSpecs"]:
        assert group.get("minReplicas", 0) <= group.get("replicas", 0) <= group.get("maxReplicas", 1 << 30)
    # the entrypoint is an augtune command on a config of the repository, into a bucket every pod reaches
    words = spec["entrypoint"].split()
    assert words[0] == "augtune" and words[1] in ("search", "compare")
    assert (ROOT / words[2].removeprefix("/opt/augtune/")).is_file(), words[2]
    assert "--address" in words and words[words.index("--address") + 1] == "auto"
    assert words[words.index("--storage") + 1].startswith(("s3://", "gs://"))


@pytest.mark.parametrize("break_it", ["entrypoint", "apiVersion", "containers", "rayStartParams", "typo"])
def test_the_rayjob_schema_refuses_broken_manifests(break_it):
    import jsonschema

    manifest = yaml.safe_load(RAYJOB.read_text(encoding="utf-8"))
    spec = manifest["spec"]
    if break_it == "entrypoint":
        del spec["entrypoint"]
    elif break_it == "apiVersion":
        manifest["apiVersion"] = "ray.io/v1alpha1"
    elif break_it == "containers":
        spec["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"] = []
    elif break_it == "rayStartParams":
        spec["rayClusterSpec"]["headGroupSpec"]["rayStartParams"] = {"num-cpus": 2}  # must be a string
    else:
        spec["rayClusterSpec"]["workerGroupSpec"] = spec["rayClusterSpec"].pop("workerGroupSpecs")
    with pytest.raises(jsonschema.ValidationError):
        _validate(manifest)


def test_the_slurm_script_parses():
    bash = shutil.which("bash")
    assert bash, "bash is needed to check the SLURM example"
    run = subprocess.run([bash, "-n", str(SLURM)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    text = SLURM.read_text(encoding="utf-8")
    assert text.startswith("#!/usr/bin/env bash\n") and "#SBATCH --nodes=" in text
    assert "augtune compare" in text and "augtune resume" in text and "--address auto" in text


# ---------------------------------------------------------------------------------------------
# README and citations


def test_the_readme_is_short_and_keeps_its_two_commands():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 200
    assert TEST_COMMAND in text  # what .ci/run runs
    assert MAIN_JOB in text
    assert TEST_COMMAND in (ROOT / ".ci" / "run").read_text(encoding="utf-8")


def test_the_readmes_verdict_is_the_one_the_main_job_generated():
    """One source: the main job's verdict is generated into a snippet (`benchmarks/verdict_snippet.py`)
    that the docs include; the README, which GitHub shows without includes, holds a copy equal to it."""
    snippet = (ROOT / "docs" / "snippets" / "main-job-verdict.md").read_text(encoding="utf-8").rstrip()
    text = README.read_text(encoding="utf-8")
    copy = text.split("<!-- verdict: begin -->\n", 1)[1].split("\n<!-- verdict: end -->", 1)[0]
    assert copy == snippet
    assert snippet.splitlines()[-1].startswith("Plainly: ")  # the verdict's own answer, not hand-written
    include = '--8<-- "docs/snippets/main-job-verdict.md"'
    for page in ("getting-started.md", "results.md"):
        assert include in (ROOT / "docs" / page).read_text(encoding="utf-8")


def test_the_cluster_images_tag_is_the_packages_version():
    """The KubeRay manifest, the Dockerfile and the cluster guide build and run the image of this version."""
    from augtune import __version__

    tags = set()
    for path in (ROOT / "docs" / "guides" / "cluster.md", ROOT / "examples" / "cluster" / "rayjob.yaml",
                 ROOT / "examples" / "cluster" / "Dockerfile"):
        tags |= set(re.findall(r"augtune:(\d+\.\d+\.\d+)", path.read_text(encoding="utf-8")))
    assert tags == {__version__}


def _text_files():
    skip = {".git", "site", "augtune.egg-info", "__pycache__", "results", "runs"}
    for path in ROOT.rglob("*"):
        if not path.is_file() or skip & set(path.relative_to(ROOT).parts) or path == Path(__file__).resolve():
            continue
        if path.suffix in {".py", ".md", ".yaml", ".yml", ".toml", ".txt", ".sh", ".cfg", ""}:
            yield path


def test_nothing_cites_the_old_design_document():
    """The design lives in docs/contributing.md; nothing may point to a file outside the repository."""
    old = "DESIGN" + ".md"
    citing = sorted(str(p.relative_to(ROOT)) for p in _text_files()
                    if old in p.read_text(encoding="utf-8", errors="replace"))
    assert not citing, f"files that cite {old} (cite docs/contributing.md or a docs page instead): {citing}"


def test_every_example_the_docs_name_exists():
    named = set()
    for page in [README, *(ROOT / "docs").rglob("*.md")]:
        named |= set(re.findall(r"examples/[\w/.-]+\.(?:yaml|sh)\b", page.read_text(encoding="utf-8")))
    assert named, "the docs name no example"
    missing = sorted(n for n in named if not (ROOT / n).is_file())
    assert not missing, f"examples the docs name that do not exist: {missing}"
