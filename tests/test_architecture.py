"""The house has one-way stairs: every import of the package points down the floors that
docs/contributing.md's table gives each part, and no module imports itself back through others. The
test walks every module's imports with `ast` (including imports inside functions, which are still
dependencies; TYPE_CHECKING-only imports are annotations, not dependencies, and are left out) and reads
the floors from the table, so the documented design and the code cannot drift apart."""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "augtune"
DESIGN = ROOT / "docs" / "contributing.md"
TABLE_MARK = "<!-- floors:"  # the comment right above the table


def floors_table(text: str | None = None) -> dict[str, int]:
    """{part: floor} from the floors table of docs/contributing.md: the first table after the marker,
    one part per row, `| floor | `part` | what it holds |`."""
    text = DESIGN.read_text(encoding="utf-8") if text is None else text
    assert TABLE_MARK in text, f"{DESIGN} lost its floors table (the line starting {TABLE_MARK!r})"
    out: dict[str, int] = {}
    started = False
    for line in text[text.index(TABLE_MARK):].splitlines()[1:]:
        if not line.startswith("|"):
            if started:
                break
            continue
        started = True
        row = re.match(r"\|\s*(\d+)\s*\|\s*`([\w]+)`\s*\|", line)
        if row:
            assert row.group(2) not in out, f"{DESIGN}: {row.group(2)} has two rows in the floors table"
            out[row.group(2)] = int(row.group(1))
    assert out, f"{DESIGN}: no rows in the floors table"
    return out


FLOORS = floors_table()
# beyond the floors: what each of these parts may import, besides itself
ONLY = {"config": set(), "analysis": {"config", "records"}}


def part(module: str) -> str:
    pieces = module.split(".")
    return pieces[1] if len(pieces) > 1 else "__init__"


def modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        name = ".".join(rel.parts)
        out[name[: -len(".__init__")] if name.endswith(".__init__") else name] = path
    return out


def _type_checking_lines(tree: ast.AST) -> set[int]:
    lines = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.If)
            and getattr(node.test, "id", getattr(node.test, "attr", "")) == "TYPE_CHECKING"
        ):
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def imports(name: str, path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    skip = _type_checking_lines(tree)
    out = set()
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in skip:
            continue
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("augtune")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                parts = name.split(".")
                package = parts if path.name == "__init__.py" else parts[:-1]  # `from .x` is a sibling
                base = package[: len(package) - (node.level - 1)]
                mod = ".".join([*base, node.module] if node.module else base)
            else:
                mod = node.module or ""
            if mod.startswith("augtune"):
                subs = {
                    f"{mod}.{a.name}"
                    for a in node.names
                    if (PACKAGE.parent / f"{mod}.{a.name}".replace(".", "/")).with_suffix(".py").is_file()
                    or (PACKAGE.parent / f"{mod}.{a.name}".replace(".", "/")).is_dir()
                }
                # `from augtune.data import formats` depends on the submodule; a name from a package, on it
                out |= subs if len(subs) == len(node.names) else {mod, *subs}
    return out


def graph() -> dict[str, set[str]]:
    """{module: the package's modules it imports}. An import of the package itself (`from augtune import
    __version__`) is left out: Python runs augtune/__init__.py before any module of the package anyway,
    so it adds no dependency (what `__init__` itself imports is kept)."""
    mods = modules()
    return {name: {m for m in imports(name, path) if m in mods and m not in (name, "augtune")}
            for name, path in mods.items()}


def part_graph() -> dict[str, set[str]]:
    """{part: the other parts it imports} (`graph`'s edges between parts)."""
    out: dict[str, set[str]] = {part(name): set() for name in modules()}
    for name, targets in graph().items():
        out[part(name)] |= {part(t) for t in targets} - {part(name)}
    return out


def layered(parts: dict[str, set[str]]) -> dict[str, int]:
    """The floors the imports give: 0 for a part that imports no other, else one above its highest import."""
    done: dict[str, int] = {}

    def floor(p: str, seen: tuple = ()) -> int:
        if p not in done:
            assert p not in seen, f"parts import each other: {' -> '.join((*seen, p))}"
            done[p] = 1 + max((floor(q, (*seen, p)) for q in parts[p]), default=-1)
        return done[p]

    for p in parts:
        floor(p)
    return done


def _table(floors: dict[str, int]) -> str:
    return "\n".join(f"| {f} | `{p}` |" for p, f in sorted(floors.items(), key=lambda kv: (kv[1], kv[0])))


def test_every_part_has_a_floor_in_the_design():
    parts = set(part_graph())
    missing, stale = sorted(parts - set(FLOORS)), sorted(set(FLOORS) - parts)
    assert not missing and not stale, (
        f"{DESIGN.relative_to(ROOT)}'s floors table: add {missing or 'nothing'}, "
        f"remove {stale or 'nothing'}; the code's floors are:\n{_table(layered(part_graph()))}")


def test_every_import_points_down_the_floors():
    upward = []
    for name, targets in graph().items():
        here = part(name)
        for t in targets:
            there = part(t)
            if here != there and (FLOORS.get(there, 99) >= FLOORS.get(here, -1)
                                  or (here in ONLY and there not in ONLY[here])):
                upward.append(f"{name} -> {t}")
    assert not upward, ("imports that do not point down the floors of docs/contributing.md:\n"
                        + "\n".join(sorted(upward)))


def test_the_floors_table_is_the_codes_layering():
    """Every part sits one floor above the highest part it imports (floor 0: it imports none), so the
    table is neither looser nor stricter than the code."""
    code = layered(part_graph())
    wrong = {p: (FLOORS[p], f) for p, f in code.items() if p in FLOORS and FLOORS[p] != f}
    assert not wrong, (
        f"floors in {DESIGN.relative_to(ROOT)} that differ from the code's (table, code): {wrong}; "
        f"the code's floors are:\n{_table(code)}")


def test_the_floors_table_reader():
    text = "x\n<!-- floors: -->\n| floor | part | holds |\n| ---: | --- | --- |\n| 0 | `config` | c |\n" \
           "| 2 | `cli` | d |\n\nnot a row | 9 | `x` |\n"
    assert floors_table(text) == {"config": 0, "cli": 2}


def test_no_import_cycles_between_modules():
    g = graph()
    index, low, stack, on, cycles = {}, {}, [], set(), []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in g.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in list(g):
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles: {cycles}"


def test_methods_never_import_ray():
    for name, path in modules().items():
        if part(name) == "methods":
            assert "import ray" not in path.read_text() and "from ray" not in path.read_text(), name


def test_a_trial_process_loads_no_library_it_does_not_use():
    """What every trial process imports (the trainable, the loop, the loaders, evaluation) pulls in neither
    plotting, UMAP, Optuna, nor scikit-learn and scipy: those come only with what uses them (a clustering
    score, a seeded split, the digits loader), and each costs every trial process seconds of CPU."""
    import subprocess
    import sys

    code = """
import sys
import augtune.eval, augtune.trainables.ray_trainable
from augtune.data import load_dataset
from augtune.trainables.loop import Trainer
heavy = ("matplotlib", "umap", "numba", "optuna", "sklearn", "scipy")
print(sorted(m for m in sys.modules if m.split(".")[0] in heavy))
"""
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=PACKAGE.parent)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip() == "[]", run.stdout


def test_ruff_check_is_clean():
    """The style the project keeps (pyproject's [tool.ruff]: lines of 110, McCabe complexity <= 15)."""
    import shutil
    import subprocess
    import sys

    ruff = shutil.which("ruff") or shutil.which("ruff", path=str(Path(sys.executable).parent))
    assert ruff, "ruff is a test dependency: pip install -e '.[test]'"
    run = subprocess.run([ruff, "check", "--no-cache", "--output-format", "concise", "."], cwd=PACKAGE.parent,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-1000:]


def test_relative_imports_resolve_against_the_importing_module(tmp_path):
    module, package = tmp_path / "launch.py", tmp_path / "__init__.py"
    module.write_text("from .plan import SearchPlan\nfrom .. import config\n")
    package.write_text("from .launch import run_search\nfrom ..data import formats\n")
    assert imports("augtune.search.launch", module) == {"augtune.search.plan", "augtune.config"}
    assert imports("augtune.search", package) == {"augtune.search.launch", "augtune.data.formats"}


def test_the_version_is_written_once_in_a_module_that_imports_nothing():
    """pyproject.toml reads `augtune.version.__version__`; nothing else writes a version."""
    import ast

    import pytest

    tomllib = pytest.importorskip("tomllib", reason="Python 3.11's TOML reader")
    import augtune
    from augtune import version

    tree = ast.parse(Path(version.__file__).read_text())
    assert not [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "augtune.version.__version__"}
    assert augtune.__version__ == version.__version__
    writes = [p for p in (ROOT / "augtune").rglob("*.py") if "__version__ =" in p.read_text()]
    assert writes == [Path(version.__file__)]
