"""MkDocs hook: the tables whose names the code defines, generated when the site is built, so that a
name changed in the code changes the page (or stops the build, saying which name):

- the bases and the augmentation methods (`docs/methods/index.md`), from the registries `BASES` and
  `AUGMENTATIONS` in augtune/methods/__init__.py: each entry's class (a cross-reference, so a renamed
  class breaks `mkdocs build --strict`), its line in `augtune methods` (the class's docstring, else its
  module's), the data it applies to (`modalities`), the search spaces registered for it (`SPACES`,
  by the `method.base` / `method.augment` each fixes) and its end-of-run figures (`figures`);
- the figure kinds (`docs/reference/evaluation.md`), from `PLOTS` in augtune/plots/__init__.py: each
  kind's module docstring (its help) and the methods that draw it at the end of a run;
- the fields of a run's `record.json` (the same page): the names are those the code writes into a
  record (found below, in `WRITERS`); what each holds is said once, in
  `augtune.records.RECORD_FIELDS`. A field the code writes that `RECORD_FIELDS` does not describe, or
  one it describes that the code no longer writes, stops the build with its name;
- the code reference of those classes (`docs/reference/methods.md`): one mkdocstrings directive per
  registered class, so that every class the tables and the method pages cross-reference is rendered;
- the `eval.metrics` entries (`docs/reference/evaluation.md`), from `METRICS`, `OUTPUTS` (their record
  keys) and `DESCRIPTIONS` (what each measures) in augtune/eval/evaluate.py; entries the three do not
  all name stop the build;
- the README's table of the four papers' methods, which GitHub shows without this hook: the registered
  augmentations with a page in docs/methods/, each with its paper (the citation that opens its page),
  its class's line and its page. `python docs/hooks/tables.py` rewrites it between the README's
  `<!-- methods: begin -->` and `<!-- methods: end -->`; tests/test_docs_tables.py holds them equal;
- the main job's answer in the results page's "Current answers" table: the first metric's column and
  the "Plainly" paragraph of the verdict the run generated (docs/snippets/main-job-verdict.md).

It also includes a snippet inside a line, where pymdownx.snippets (which includes whole lines) cannot:
`--8<-- "docs/snippets/answers/NAME.md"` within a table cell or a sentence becomes that file's one line.
An answer stated both in `docs/results.md`'s "Current answers" table and in the section below it is
written once so, in docs/snippets/answers/.

Everything is read with `ast`, as docs/hooks/reference.py reads the config: nothing of augtune is
imported, so building the docs needs neither torch nor Ray. tests/test_docs_tables.py imports this file
by path and checks each table against the registries as Python sees them, and the fields against a
record that a run writes.
"""

import ast
import importlib.util
import re
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
METHODS = Path("augtune/methods/__init__.py")
SPACES = Path("augtune/spaces/__init__.py")
PLOTS = Path("augtune/plots/__init__.py")
EVALUATE = Path("augtune/eval/evaluate.py")
README = Path("README.md")
README_METHODS = ("<!-- methods: begin -->\n", "\n<!-- methods: end -->")  # the generated table between
VERDICT = Path("docs/snippets/main-job-verdict.md")  # written by benchmarks/verdict_snippet.py
SNIPPETS = Path("docs/snippets")
# the modules that write a run's record: a key they set is a field of record.json
WRITERS = (Path("augtune/records.py"), Path("augtune/trainables/run.py"),
           Path("augtune/trainables/ray_trainable.py"), Path("augtune/plots/__init__.py"),
           Path("augtune/search/callbacks.py"))
# (page, marker): each marker is replaced by its table
BASES_MARKER = ("methods/index.md", "<!-- augtune:bases -->")
METHODS_MARKER = ("methods/index.md", "<!-- augtune:methods -->")
FIGURES_MARKER = ("reference/evaluation.md", "<!-- augtune:figures -->")
FIELDS_MARKER = ("reference/evaluation.md", "<!-- augtune:record-fields -->")
BASE_CLASSES_MARKER = ("reference/methods.md", "<!-- augtune:base-classes -->")
METHOD_CLASSES_MARKER = ("reference/methods.md", "<!-- augtune:method-classes -->")
METRICS_MARKER = ("reference/evaluation.md", "<!-- augtune:eval-metrics -->")
MAIN_JOB_MARKER = ("results.md", "<!-- augtune:main-job-answer -->")
HOME_METHODS_MARKER = ("index.md", "<!-- augtune:papers-methods -->")  # the README's table, on the site


# ---------------------------------------------------------------------------------------------
# Reading the registries


@dataclass
class Entry:
    """One registry entry: its name and what the code says of it."""

    name: str
    qualname: str = ""  # augtune.methods.pinda.PiNDA (classes) or augtune.plots.pinda (figure kinds)
    doc: str = ""  # the first line of its docstring (its module's, without one)
    modalities: tuple[str, ...] = ()
    figures: tuple[str, ...] = ()
    momentum: bool = False  # a base with an EMA target network
    spaces: list[str] = field(default_factory=list)


def _parse(root: Path, path: Path) -> ast.Module:
    return ast.parse((root / path).read_text(encoding="utf-8"))


def _assigned(tree: ast.Module, name: str) -> ast.AST | None:
    """The value a module-level statement binds to `name` (`X = ...` or `X: T = ...`)."""
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        if any(isinstance(t, ast.Name) and t.id == name for t in targets) and node.value is not None:
            return node.value
    return None


def _registry(tree: ast.Module, name: str) -> list[tuple[str, ast.AST]]:
    """(key, value node) of the dict literal bound to `name`, in order."""
    value = _assigned(tree, name)
    if not isinstance(value, ast.Dict):
        raise RuntimeError(f"{name} is no longer a dict literal: the docs cannot list it")
    return [(k.value, v) for k, v in zip(value.keys, value.values) if isinstance(k, ast.Constant)]


def _first_line(text: str | None) -> str:
    return text.strip().splitlines()[0].strip() if text and text.strip() else ""


def _first_paragraph(text: str | None) -> str:
    return " ".join(line.strip() for line in (text or "").strip().split("\n\n")[0].splitlines())


def _strings(node: ast.AST | None) -> tuple[str, ...]:
    if isinstance(node, (ast.Tuple, ast.List)):
        return tuple(e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str))
    return ()


def _class_attr(cls: ast.ClassDef, name: str) -> ast.AST | None:
    for node in cls.body:
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            return node.value
    return None


def _imports(tree: ast.Module) -> dict[str, str]:
    """{name: the module it is imported from} of `from augtune.x import Name` statements."""
    return {a.asname or a.name: node.module for node in tree.body if isinstance(node, ast.ImportFrom)
            and node.module for a in node.names}


def _entries(root: Path, registry: str) -> list[Entry]:
    """BASES or AUGMENTATIONS, each class read from its module."""
    tree = _parse(root, METHODS)
    where = _imports(tree)
    default_modalities = _strings(_assigned(tree, "MODALITIES"))
    out = []
    for key, value in _registry(tree, registry):
        cls_name = value.id if isinstance(value, ast.Name) else ast.unparse(value)
        module = where.get(cls_name)
        if module is None:
            raise RuntimeError(f"{registry}[{key!r}]: {cls_name} is not imported from a module of augtune")
        mod_tree = _parse(root, Path(*module.split(".")).with_suffix(".py"))
        cls = next((n for n in mod_tree.body if isinstance(n, ast.ClassDef) and n.name == cls_name), None)
        if cls is None:
            raise RuntimeError(f"{registry}[{key!r}]: no class {cls_name} in {module}")
        out.append(Entry(
            key, f"{module}.{cls_name}",
            _first_line(ast.get_docstring(cls)) or _first_line(ast.get_docstring(mod_tree)),
            _strings(_class_attr(cls, "modalities")) or default_modalities,
            _strings(_class_attr(cls, "figures")),
            any(getattr(b, "id", "") == "MomentumObjective" for b in cls.bases)))
    return out


def _dict_value(tree: ast.Module, node: ast.AST | None, key: str):
    """The constant (or list of constants) at `key` of a dict literal, following `**NAME` and `NAME`
    to the module's dicts."""
    if isinstance(node, ast.Name):
        return _dict_value(tree, _assigned(tree, node.id), key)
    if not isinstance(node, ast.Dict):
        return None
    found = None
    for k, v in zip(node.keys, node.values):
        if k is None:  # {**OTHER, ...}: what OTHER holds, unless a later key replaces it
            inner = _dict_value(tree, v, key)
            found = inner if inner is not None else found
        elif isinstance(k, ast.Constant) and k.value == key:
            try:
                found = ast.literal_eval(v)
            except ValueError:
                found = None
    return found


def spaces(root: Path = ROOT) -> dict[str, tuple[str | None, tuple[str, ...]]]:
    """{registered space: (the method.base it fixes, the method.augment it fixes)}."""
    tree = _parse(root, SPACES)
    out = {}
    for name, value in _registry(tree, "SPACES"):
        if not (isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name)):
            raise RuntimeError(f"SPACES[{name!r}]: not a module's space (`module.SPACE`)")
        mod_tree = _parse(root, SPACES.parent / f"{value.value.id}.py")
        call = _assigned(mod_tree, value.attr)
        params = next((k.value for k in getattr(call, "keywords", []) if k.arg == "params"), None)
        augment = _dict_value(mod_tree, params, "method.augment") or []
        out[name] = (_dict_value(mod_tree, params, "method.base"), tuple(augment))
    return out


def bases(root: Path = ROOT) -> list[Entry]:
    found = spaces(root)
    entries = _entries(root, "BASES")
    for e in entries:
        e.spaces = [s for s, (base, augment) in found.items() if base == e.name and not augment]
    return entries


def methods(root: Path = ROOT) -> list[Entry]:
    found = spaces(root)
    entries = _entries(root, "AUGMENTATIONS")
    for e in entries:
        e.spaces = [s for s, (_, augment) in found.items() if e.name in augment]
    return entries


def figures(root: Path = ROOT) -> list[Entry]:
    """The figure kinds of `PLOTS`, each with its module's docstring and the methods that draw it."""
    drawn_by: dict[str, list[str]] = {}
    for e in methods(root):
        for kind in e.figures:
            drawn_by.setdefault(kind, []).append(e.name)
    out = []
    for kind, value in _registry(_parse(root, PLOTS), "PLOTS"):
        module = value.value if isinstance(value, ast.Constant) else ast.unparse(value)
        doc = ast.get_docstring(_parse(root, Path(*module.split(".")).with_suffix(".py")))
        out.append(Entry(kind, module, _first_paragraph(doc), figures=tuple(drawn_by.get(kind, ()))))
    return out


# ---------------------------------------------------------------------------------------------
# The record's fields, as the code writes them


def _loop_strings(tree: ast.AST) -> dict[str, set[str]]:
    """{name: the strings a loop or comprehension binds it to} for loops over literal tuples:
    `for key in ("seconds", "nodes")`, `for name, key in (("candidate", X), ("round", Y))`."""
    bound: dict[str, set[str]] = {}
    for node in ast.walk(tree):
        loop = isinstance(node, (ast.For, ast.comprehension))
        if not loop or not isinstance(node.iter, (ast.Tuple, ast.List)):
            continue
        for item in node.iter.elts:
            if isinstance(node.target, ast.Name) and isinstance(item, ast.Constant):
                bound.setdefault(node.target.id, set()).add(item.value)
            elif isinstance(node.target, ast.Tuple) and isinstance(item, ast.Tuple):
                for t, v in zip(node.target.elts, item.elts):
                    if isinstance(t, ast.Name) and isinstance(v, ast.Constant) and isinstance(v.value, str):
                        bound.setdefault(t.id, set()).add(v.value)
    return bound


_RECORDS = ("record", "data", "about")  # the names a writer keeps a record (or its parts) under


def _is_record(node: ast.AST) -> bool:
    """`record`, `data`, `about`, or any `X.data` (a RunRecord's dict)."""
    return (isinstance(node, ast.Name) and node.id in _RECORDS) or \
        (isinstance(node, ast.Attribute) and node.attr == "data")


def _keys(node: ast.AST | None, bound: dict[str, set[str]], dicts: dict[str, ast.AST]) -> set[str]:
    """The string keys of a dict literal or comprehension (`**name` followed to its dict)."""
    if isinstance(node, ast.Dict):
        out: set[str] = set()
        for k, v in zip(node.keys, node.values):
            if k is None and isinstance(v, ast.Name):
                out |= _keys(dicts.get(v.id), bound, dicts)
            elif isinstance(k, ast.Constant) and isinstance(k.value, str):
                out.add(k.value)
        return out
    if isinstance(node, ast.DictComp) and isinstance(node.key, ast.Name):
        return set(bound.get(node.key.id, ()))
    return set()


def _written(tree: ast.Module) -> set[str]:
    """The keys a module sets in a record: `record[...] = `, `record.update(k=...)`,
    `record.setdefault("k", ...)`, `about = {...}` and what `new_record` returns."""
    bound = _loop_strings(tree)
    dicts = {n.targets[0].id: n.value for n in ast.walk(tree) if isinstance(n, ast.Assign)
             and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name)}
    out = _keys(dicts.get("about"), bound, dicts)
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "new_record":
            returns = (r.value for r in ast.walk(node) if isinstance(r, ast.Return))
            out |= {k for value in returns for k in _keys(value, bound, dicts)}
        elif isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Subscript) and _is_record(t.value):
                    key = t.slice  # a constant, or a loop's name over literal strings
                    loop = bound.get(getattr(key, "id", ""), set())
                    out |= {key.value} if isinstance(key, ast.Constant) else loop
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                _is_record(node.func.value):
            if node.func.attr == "update":
                out |= {k.arg for k in node.keywords if k.arg}
            elif node.func.attr == "setdefault" and node.args and isinstance(node.args[0], ast.Constant):
                out.add(node.args[0].value)
    return out


def written_fields(root: Path = ROOT) -> set[str]:
    """Every key the code writes into a run's record."""
    return set().union(*(_written(_parse(root, path)) for path in WRITERS))


def described_fields(root: Path = ROOT) -> dict[str, tuple[str, str]]:
    """`augtune.records.RECORD_FIELDS`, read with `ast` (a literal: nothing of augtune is imported)."""
    value = _assigned(_parse(root, Path("augtune/records.py")), "RECORD_FIELDS")
    if value is None:
        raise RuntimeError("docs/hooks/tables.py: augtune/records.py defines no RECORD_FIELDS")
    return ast.literal_eval(value)


def record_fields(root: Path = ROOT) -> list[str]:
    """`RECORD_FIELDS`' names, checked against the ones the code writes: a difference stops the build."""
    code, described = written_fields(root), described_fields(root)
    if set(described) != code:
        raise RuntimeError(
            "augtune/records.py: RECORD_FIELDS and the fields the code writes into record.json differ: "
            f"written but not described {sorted(code - set(described))}, described but not written "
            f"{sorted(set(described) - code)}")
    return list(described)


# ---------------------------------------------------------------------------------------------
# The evaluation's metrics


def eval_metrics(root: Path = ROOT) -> list[tuple[str, tuple[str, ...], str]]:
    """(entry, its record keys, what it measures) of every `eval.metrics` entry, in `METRICS`' order:
    `OUTPUTS` and `DESCRIPTIONS` must name the same entries, or the build stops with the difference."""
    tree = _parse(root, EVALUATE)
    names = [name for name, _ in _registry(tree, "METRICS")]
    found = {}
    for dict_name in ("OUTPUTS", "DESCRIPTIONS"):
        value = _assigned(tree, dict_name)
        if value is None:
            raise RuntimeError(f"docs/hooks/tables.py: {EVALUATE} defines no {dict_name}")
        found[dict_name] = ast.literal_eval(value)
        if set(found[dict_name]) != set(names):
            raise RuntimeError(
                f"{EVALUATE}: {dict_name} and METRICS name different entries: only in METRICS "
                f"{sorted(set(names) - set(found[dict_name]))}, only in {dict_name} "
                f"{sorted(set(found[dict_name]) - set(names))}")
    return [(n, tuple(found["OUTPUTS"][n]), found["DESCRIPTIONS"][n]) for n in names]


# ---------------------------------------------------------------------------------------------
# Markdown


def _sibling(name: str):
    """Another hook of this folder, loaded by its path (the hooks are files, not a package)."""
    path = Path(__file__).with_name(f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"augtune_docs_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_cell = _sibling("reference")._cell  # text escaped for a table cell: one definition, in reference.py


def _code(names) -> str:
    return ", ".join(f"`{n}`" for n in names) or "–"


def _ref(e: Entry) -> str:
    """A cross-reference to the class's entry in the code reference (docs/reference/methods.md)."""
    return f"[`{e.qualname.rsplit('.', 1)[1]}`][{e.qualname}]"


def _data(modalities: tuple[str, ...]) -> str:
    return ", ".join({"vector": "vectors", "image": "images"}.get(m, m) for m in
                     sorted(modalities, key=lambda m: m != "vector"))


def bases_markdown(root: Path = ROOT) -> str:
    rows = ["| base | class | what (`augtune methods`) | target network | its space |",
            "| --- | --- | --- | --- | --- |"]
    rows += [f"| `{e.name}` | {_ref(e)} | {_cell(e.doc)} | {'EMA' if e.momentum else '–'} | "
             f"{_code(e.spaces)} |" for e in bases(root)]
    return "\n".join(rows)


def methods_markdown(root: Path = ROOT) -> str:
    pages = root / "docs" / "methods"
    rows = ["| method | class | what (`augtune methods`) | data | its spaces | figures | page |",
            "| --- | --- | --- | --- | --- | --- | --- |"]
    for e in methods(root):
        page = f"[{e.qualname.rsplit('.', 1)[1]}]({e.name}.md)" if (pages / f"{e.name}.md").is_file() else "–"
        spaces_ = _code(e.spaces) if e.spaces else "its base's"
        rows.append(f"| `{e.name}` | {_ref(e)} | {_cell(e.doc)} | {_data(e.modalities)} | {spaces_} | "
                    f"{_code(e.figures)} | {page} |")
    return "\n".join(rows)


def figures_markdown(root: Path = ROOT) -> str:
    rows = ["| kind | what (its module's docstring) | drawn at the end of a run of |", "| --- | --- | --- |"]
    rows += [f"| `{e.name}` | {_cell(e.doc)} | {_code(e.figures)} |" for e in figures(root)]
    return "\n".join(rows)


def fields_markdown(root: Path = ROOT) -> str:
    rows = ["| field | in | what |", "| --- | --- | --- |"]
    described = described_fields(root)
    rows += [f"| `{name}` | {described[name][0]} | {described[name][1]} |" for name in record_fields(root)]
    return "\n".join(rows)


def metrics_markdown(root: Path = ROOT) -> str:
    rows = ["| `eval.metrics` entry | record keys | what |", "| --- | --- | --- |"]
    rows += [f"| `{name}` | {_code(keys)} | {what} |" for name, keys, what in eval_metrics(root)]
    return "\n".join(rows)


def base_classes_markdown(root: Path = ROOT) -> str:
    """mkdocstrings' directives for the bases: each module (its docstring is the base's line) with its
    class, which the tables and the method pages cross-reference."""
    blocks = []
    for e in bases(root):
        module, cls = e.qualname.rsplit(".", 1)
        blocks.append(f"::: {module}\n    options:\n      members: [{cls}]\n      show_root_heading: false\n"
                      "      heading_level: 3")
    return "\n\n".join(blocks)


def method_classes_markdown(root: Path = ROOT) -> str:
    """mkdocstrings' directives for the augmentation methods' classes, in the registry's order."""
    return "\n\n".join(f"::: {e.qualname}\n    options:\n      heading_level: 3" for e in methods(root))


def _paper(page: Path) -> str:
    """The citation a method page opens with (`Zhang, Xu, Huang and Li, *Title*`), its authors cut to the
    first: `Zhang et al., *Title*`."""
    paragraphs = [p for p in page.read_text(encoding="utf-8").split("\n\n") if not p.startswith("#")]
    first = " ".join(paragraphs[0].split()) if paragraphs else ""
    found = re.match(r"(?P<authors>[^*]+?),\s+\*(?P<title>[^*]+)\*", first)
    if found is None:
        raise RuntimeError(f"{page}: its first paragraph does not open with its paper (`Authors, *Title*`)")
    authors = re.split(r",\s*|\s+and\s+", found["authors"])
    return f"{authors[0]}{' et al.' if len(authors) > 1 else ''}, *{found['title']}*"


def readme_methods_markdown(root: Path = ROOT, pages: str = "docs/methods") -> str:
    """The README's table of the papers' methods: every registered augmentation with a page of its own
    (docs/methods/NAME.md), its paper, its line in `augtune methods` and its page (linked under `pages`:
    the site's home page links `methods/NAME.md`)."""
    rows = ["| method | paper | what (`augtune methods`) | docs |", "| --- | --- | --- | --- |"]
    for e in methods(root):
        page = root / "docs" / "methods" / f"{e.name}.md"
        if page.is_file():
            name = e.qualname.rsplit(".", 1)[1]
            rows.append(f"| {name} | {_paper(page)} | {_cell(e.doc)} | [{name}]({pages}/{e.name}.md) |")
    return "\n".join(rows)


def write_readme(root: Path = ROOT) -> bool:
    """Rewrite the README's methods table from the code; True if it changed."""
    path = root / README
    text = path.read_text(encoding="utf-8")
    begin, end = README_METHODS
    if begin not in text or end not in text:
        raise RuntimeError(f"{README} lost its markers {begin.strip()} / {end.strip()}")
    head, rest = text.split(begin, 1)
    new = head + begin + readme_methods_markdown(root) + end + rest.split(end, 1)[1]
    if new != text:
        path.write_text(new, encoding="utf-8")
    return new != text


def _row(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def main_job_answer(root: Path = ROOT) -> str:
    """One table cell: the main job's first metric, entrant by entrant, and its verdict's "Plainly"
    paragraph, both as the run wrote them into docs/snippets/main-job-verdict.md."""
    lines = (root / VERDICT).read_text(encoding="utf-8").splitlines()
    table = lines[:next((i for i, line in enumerate(lines) if not line.startswith("|")), len(lines))]
    plainly = [line for line in lines if line.startswith("Plainly: ")]
    if len(table) < 3 or _row(table[0])[0] != "entrant" or not plainly:
        raise RuntimeError(f"{VERDICT}: no verdict table (`| entrant | METRIC | ...`) or no `Plainly:` line")
    metric = _row(table[0])[1]
    means = ", ".join(f"{row[0]} {row[1]}" for row in map(_row, table[2:]))
    return f"{metric}, mean ± sd (seeds): {means}. {plainly[0]}".replace("|", "\\|")


TABLES = {BASES_MARKER: bases_markdown, METHODS_MARKER: methods_markdown, FIGURES_MARKER: figures_markdown,
          FIELDS_MARKER: fields_markdown, BASE_CLASSES_MARKER: base_classes_markdown,
          METHOD_CLASSES_MARKER: method_classes_markdown, METRICS_MARKER: metrics_markdown,
          MAIN_JOB_MARKER: main_job_answer,
          HOME_METHODS_MARKER: lambda root: readme_methods_markdown(root, pages="methods")}


# ---------------------------------------------------------------------------------------------
# Snippets inside a line

_INLINE = re.compile(r'(?<!`)--8<-- "(?P<path>docs/snippets/[^"\n]+)"')
_BLOCK = re.compile(r'\s*-+8<-+\s+"[^"\n]+"\s*')  # a line that is only an include: pymdownx's


def snippet_line(root: Path, path: str) -> str:
    """The text of a snippet included inside a line: one line, or the build stops naming it."""
    file = root / path
    if not file.is_file():
        raise RuntimeError(f"--8<-- {path!r}: no such snippet")
    text = file.read_text(encoding="utf-8").strip()
    if "\n" in text or "--8<--" in text:
        raise RuntimeError(f"--8<-- {path!r}: a snippet included inside a line must be one line, "
                           "with no include of its own")
    return text


def inline_snippets(markdown_text: str, root: Path = ROOT) -> str:
    """Each `--8<-- "docs/snippets/..."` inside a line replaced by the snippet's line; lines that are only
    an include (pymdownx.snippets') and fenced code are left as they are, and so is one written as code
    (a backtick before it)."""
    out, fenced = [], False
    for line in markdown_text.split("\n"):
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
        elif not fenced and not _BLOCK.fullmatch(line):
            line = _INLINE.sub(lambda m: snippet_line(root, m["path"]), line)
        out.append(line)
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------
# MkDocs hook events


def on_page_markdown(markdown_text: str, page, config, files) -> str:
    root = Path(config["config_file_path"]).resolve().parent
    for (uri, marker), make in TABLES.items():
        if page.file.src_uri == uri:
            if marker not in markdown_text:
                raise RuntimeError(f"{uri} lost its marker {marker}")
            markdown_text = markdown_text.replace(marker, make(root))
    return inline_snippets(markdown_text, root)


def on_serve(server, config, builder):
    root = Path(config["config_file_path"]).resolve().parent
    for path in {METHODS.parent, SPACES.parent, PLOTS.parent, EVALUATE, SNIPPETS, *WRITERS}:
        server.watch(str(root / path))
    return server


if __name__ == "__main__":  # python docs/hooks/tables.py: the README's methods table from the code
    print(f"{README}: {'rewritten' if write_readme() else 'already up to date'}")
