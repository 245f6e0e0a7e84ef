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


def test_the_metrics_table_is_exactly_the_evaluation_registry(hook):
    """docs/reference/evaluation.md's `eval.metrics` table: every entry of `METRICS`, its record keys
    (`OUTPUTS`) and what it measures (`DESCRIPTIONS`), in the registry's order."""
    from augtune.eval.evaluate import DESCRIPTIONS, METRICS, OUTPUTS

    table = hook.metrics_markdown(ROOT)
    assert names(table) == list(METRICS) and set(DESCRIPTIONS) == set(METRICS) == set(OUTPUTS)
    assert hook.eval_metrics(ROOT) == [(n, OUTPUTS[n], DESCRIPTIONS[n]) for n in METRICS]
    for name in METRICS:
        assert f"| `{name}` | {', '.join(f'`{k}`' for k in OUTPUTS[name])} | {DESCRIPTIONS[name]} |" in table
    page = (ROOT / "docs" / "reference" / "evaluation.md").read_text(encoding="utf-8")
    assert hook.METRICS_MARKER[1] in page and "| `knn` |" not in page  # generated, not typed


def test_a_metric_without_a_description_stops_the_build(hook, tmp_path):
    source, entry = (ROOT / hook.EVALUATE).read_text(encoding="utf-8"), '    "rankme": "effective rank'
    assert entry in source
    (tmp_path / hook.EVALUATE).parent.mkdir(parents=True)
    (tmp_path / hook.EVALUATE).write_text(source.replace(entry, '    "rank_me": "x'), encoding="utf-8")
    with pytest.raises(RuntimeError, match=r"DESCRIPTIONS and METRICS name different entries.*rank_me"):
        hook.eval_metrics(tmp_path)


def test_the_readmes_methods_table_is_the_generated_one(hook):
    """GitHub shows the README without the docs hook: its table of the papers' methods is the one the hook
    generates from the registry (`python docs/hooks/tables.py` rewrites it), so it cannot drift."""
    from augtune.methods import AUGMENTATIONS

    text = (ROOT / "README.md").read_text(encoding="utf-8")
    begin, end = hook.README_METHODS
    copy = text.split(begin, 1)[1].split(end, 1)[0]
    assert copy == hook.readme_methods_markdown(ROOT), "run `python docs/hooks/tables.py`"
    paged = [n for n in AUGMENTATIONS if (ROOT / "docs" / "methods" / f"{n}.md").is_file()]
    assert paged == ["pinda", "nrcc", "cocor", "diffaug"]
    rows = copy.splitlines()[2:]
    assert [row.split(" | ")[0] for row in rows] == [f"| {AUGMENTATIONS[n].__name__}" for n in paged]
    for name, row in zip(paged, rows):
        cells = row.strip("|").split(" | ")
        assert cells[2].replace("\\*", "*") == doc_line(AUGMENTATIONS[name])
        title = re.search(r"\*([^*]+)\*", cells[1])[1]
        page = " ".join((ROOT / "docs" / "methods" / f"{name}.md").read_text(encoding="utf-8").split())
        assert f"*{title}*" in page
        assert cells[3].strip() == f"[{AUGMENTATIONS[name].__name__}](docs/methods/{name}.md)"
    # the site's home page shows the same table, its links relative to docs/
    home = hook.TABLES[hook.HOME_METHODS_MARKER](ROOT)
    assert home == copy.replace("](docs/methods/", "](methods/")
    assert hook.HOME_METHODS_MARKER[1] in (ROOT / "docs" / "index.md").read_text(encoding="utf-8")


def test_the_paper_is_the_citation_its_page_opens_with(hook, tmp_path):
    page = tmp_path / "m.md"
    page.write_text("# M\n\nSmith, Jones and Wu, *A Long\nTitle: Here* (2024). It does.\n", encoding="utf-8")
    assert hook._paper(page) == "Smith et al., *A Long Title: Here*"
    page.write_text("# M\n\nSmith, *Alone*. Text.\n", encoding="utf-8")
    assert hook._paper(page) == "Smith, *Alone*"
    page.write_text("# M\n\nNo citation here.\n", encoding="utf-8")
    with pytest.raises(RuntimeError, match="does not open with its paper"):
        hook._paper(page)


def test_the_main_jobs_answer_is_taken_from_its_generated_verdict(hook):
    """The results page's first answer is the verdict the run generated (its first metric's column and its
    "Plainly" paragraph), not a copy typed from it."""
    verdict = (ROOT / hook.VERDICT).read_text(encoding="utf-8").splitlines()
    answer = hook.main_job_answer(ROOT)
    header = [c.strip() for c in verdict[0].strip("|").split("|")]
    assert answer.startswith(f"{header[1]}, mean ± sd (seeds): ")
    for line in verdict[2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert f"{cells[0]} {cells[1]}" in answer
    assert answer.endswith(next(line for line in verdict if line.startswith("Plainly: ")))
    assert "\n" not in answer
    results = (ROOT / "docs" / "results.md").read_text(encoding="utf-8")
    current = results.split("## Current answers\n", 1)[1].split("\n## ", 1)[0]
    assert hook.MAIN_JOB_MARKER[1] in current
    assert not [c for c in re.findall(r"\d+\.\d+ ± \d+\.\d+", answer) if c in current]  # none typed again


def test_a_snippet_is_included_inside_a_line(hook, tmp_path):
    (tmp_path / "docs" / "snippets").mkdir(parents=True)
    (tmp_path / "docs" / "snippets" / "a.md").write_text("one line\n", encoding="utf-8")
    (tmp_path / "docs" / "snippets" / "two.md").write_text("two\nlines\n", encoding="utf-8")
    include = '--8<-- "docs/snippets/a.md"'
    text = "\n".join([f"| q | {include}; more |", f"In one line, {include}.", include,
                      f"`{include}`", "```", f"x {include}", "```"])
    assert hook.inline_snippets(text, tmp_path).splitlines() == [
        "| q | one line; more |", "In one line, one line.", include,  # a whole line is pymdownx's
        f"`{include}`", "```", f"x {include}", "```"]
    with pytest.raises(RuntimeError, match="must be one line"):
        hook.inline_snippets('x --8<-- "docs/snippets/two.md"', tmp_path)
    with pytest.raises(RuntimeError, match="no such snippet"):
        hook.inline_snippets('x --8<-- "docs/snippets/none.md"', tmp_path)


def test_each_current_answer_is_written_once_and_included_where_it_is_stated():
    """A line of docs/results.md's "Current answers" that a section below states too is one file of
    docs/snippets/answers/, included in the table and in that section, and typed nowhere else."""
    results = (ROOT / "docs" / "results.md").read_text(encoding="utf-8")
    current, below = results.split("## Current answers\n", 1)[1].split("\n## ", 1)
    answers = sorted((ROOT / "docs" / "snippets" / "answers").glob("*.md"))
    assert answers
    pages = [ROOT / "README.md", *(p for p in (ROOT / "docs").rglob("*.md") if "snippets" not in p.parts)]
    for path in answers:
        include = f'--8<-- "docs/snippets/answers/{path.name}"'
        assert include in current and include in below, path.name
        line = path.read_text(encoding="utf-8").strip()
        assert "\n" not in line
        typed = [str(p.relative_to(ROOT)) for p in pages if line in p.read_text(encoding="utf-8")]
        assert not typed, f"{path.name} is typed again in {typed}: include it"


def test_the_table_cell_has_one_definition(hook):
    """tables.py escapes table cells with docs/hooks/reference.py's `_cell`, not a copy of it."""
    assert hook._cell.__code__.co_filename == str(ROOT / "docs" / "hooks" / "reference.py")
    assert hook._cell("a|b<c>*\\") == "a\\|b&lt;c&gt;\\*\\\\"
