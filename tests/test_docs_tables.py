"""The tables the docs hook `docs/hooks/tables.py` generates from the code, against the code as Python
sees it: the bases and methods tables list exactly the registries' entries (their classes, data, spaces
and figures), the figure kinds exactly `PLOTS`, and the record's fields exactly the keys the code writes
into a record, which hold every key of a record a real run writes. The hook reads the source with `ast`
(the docs build imports neither torch nor Ray); these tests import the registries themselves."""
from __future__ import annotations

import ast
import importlib.util
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HOOK = ROOT / "docs" / "hooks" / "tables.py"


@pytest.fixture(scope="module")
def hook():
    spec = importlib.util.spec_from_file_location("augtune_docs_tables", HOOK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def names(markdown: str) -> list[str]:
    """The first column of a generated table's rows (each a `code` name)."""
    return re.findall(r"^\| `([^`]+)` \|", markdown, flags=re.M)


def doc_line(cls) -> str:
    """What `augtune methods` prints for a class: its docstring's first line, else its module's."""
    text = cls.__doc__ or sys.modules[cls.__module__].__doc__ or ""
    return text.strip().splitlines()[0] if text.strip() else ""


def qualname(cls) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def test_the_bases_table_lists_exactly_the_registered_bases(hook):
    from augtune.methods import BASES, MomentumObjective
    from augtune.spaces import SPACES

    assert names(hook.bases_markdown(ROOT)) == list(BASES)
    for e in hook.bases(ROOT):
        cls = BASES[e.name]
        assert (e.qualname, e.doc) == (qualname(cls), doc_line(cls))
        assert e.momentum == issubclass(cls, MomentumObjective)
        assert e.spaces == [s for s, space in SPACES.items() if space.params.get("method.base") == e.name
                            and not space.params.get("method.augment")]
        assert f"[`{cls.__name__}`][{qualname(cls)}]" in hook.bases_markdown(ROOT)  # a cross-reference


def test_the_methods_table_lists_exactly_the_registered_augmentations(hook):
    from augtune.methods import AUGMENTATIONS, modalities
    from augtune.spaces import SPACES

    assert names(hook.methods_markdown(ROOT)) == list(AUGMENTATIONS)
    for e in hook.methods(ROOT):
        cls = AUGMENTATIONS[e.name]
        assert (e.qualname, e.doc) == (qualname(cls), doc_line(cls))
        assert set(e.modalities) == set(modalities(e.name))
        assert e.figures == tuple(cls.figures)
        assert e.spaces == [s for s, space in SPACES.items()
                            if e.name in (space.params.get("method.augment") or [])]
    page = hook.methods_markdown(ROOT)
    assert "[PiNDA](pinda.md)" in page and "| `random_noise` |" in page and "its base's" in page


def test_the_code_reference_renders_every_registered_class(hook):
    """docs/reference/methods.md's mkdocstrings directives come from the registries: a new method's class
    is rendered, and so the cross-references to it resolve."""
    from augtune.methods import AUGMENTATIONS, BASES

    directives = re.findall(r"^::: (\S+)\n    options:\n(?:      members: \[(\w+)\])?",
                            hook.base_classes_markdown(ROOT) + "\n\n" + hook.method_classes_markdown(ROOT),
                            flags=re.M)
    rendered = [f"{where}.{member}" if member else where for where, member in directives]
    assert rendered == [qualname(cls) for cls in [*BASES.values(), *AUGMENTATIONS.values()]]


def test_the_figure_kinds_are_exactly_plots_with_the_methods_that_draw_them(hook):
    from augtune.methods import AUGMENTATIONS
    from augtune.plots import PLOTS, describe

    assert names(hook.figures_markdown(ROOT)) == list(PLOTS)
    for e in hook.figures(ROOT):
        assert e.qualname == PLOTS[e.name] and e.doc.startswith(describe(e.name))  # its whole first paragraph
        assert e.figures == tuple(m for m, cls in AUGMENTATIONS.items() if e.name in cls.figures)


def test_the_record_fields_are_exactly_the_keys_the_code_writes(hook):
    from augtune.records import RECORD_FIELDS

    written = hook.written_fields(ROOT)
    assert names(hook.fields_markdown(ROOT)) == hook.record_fields(ROOT) == list(RECORD_FIELDS)
    assert set(RECORD_FIELDS) == written and hook.described_fields(ROOT) == RECORD_FIELDS
    # where each kind of run adds its own: a search's trial, a race, PBT, a resume, the figures
    assert {"params", "phase", "trial", "nodes", "candidate", "round", "lineage", "exploits", "resumed_with",
            "figures", "figure_errors", "seconds", "cpu_seconds"} <= written


def test_a_record_a_run_writes_holds_only_described_fields(hook, tmp_path):
    import augtune
    from augtune.records import RECORD_FIELDS
    from conftest import TINY_MLP

    run = augtune.train({"dataset": {"name": "digits", "as_vectors": True, "max_train": 128, "max_test": 64},
                         "model": TINY_MLP, "train": {"epochs": 1, "batch_size": 64, "num_threads": 1},
                         "eval": {"metrics": ["knn"]}}, out=tmp_path / "run")
    assert run.record["status"] == "completed"
    assert set(run.record) <= set(RECORD_FIELDS), sorted(set(run.record) - set(RECORD_FIELDS))
    assert {"format", "rows", "references", "seconds", "max_rss_mb"} <= set(run.record)


def test_the_field_finder_reads_every_way_a_writer_sets_a_key(hook):
    """A rename in any of these forms changes what the docs list (and the build stops until `RECORD_FIELDS`
    describes the new name)."""
    source = '''
def new_record():
    return {"a": 1, "b": 2}
def run(record, about_extra):
    record.data["c"] = 1
    record.data.update(d=1, **about_extra)
    record.data.setdefault("e", []).append(1)
    for key in ("f", "g"):
        record.data[key] = 0
    race = {name: 1 for name, other in (("h", X), ("i", Y))}
    about = {"j": 1, **race}
    about["k"] = 2
    record.update(l=1)
    record["m"] = 1
    data = {}
    data["n"] = 1
    unrelated = {}
    unrelated["not_a_field"] = 1
'''
    assert hook._written(ast.parse(source)) == set("abcdefghijklmn")
