"""The house has one-way stairs: every import of the package points down the floors of DESIGN.md, and
no module imports itself back through others. The test walks every module's imports with `ast`
(including imports inside functions, which are still dependencies; TYPE_CHECKING-only imports are
annotations, not dependencies, and are left out)."""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "augtune"

# floor of each top-level part (a module or a package); an import may point to the same or a lower floor
FLOORS = {"__init__": 0, "config": 0, "records": 0, "phases": 0,
          "data": 1, "models": 1, "methods": 1, "eval": 1,
          "checks": 2, "trainables": 2,
          "spaces": 3, "search": 4, "analysis": 5, "plots": 5, "cli": 6}
FORBIDDEN = {("analysis", "trainables"), ("analysis", "search"), ("config", "*")}


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
    mods = modules()
    return {name: {m for m in imports(name, path) if m in mods and m != name} for name, path in mods.items()}


def test_every_import_points_down_the_floors():
    upward = []
    for name, targets in graph().items():
        here = part(name)
        for t in targets:
            there = part(t)
            if (
                FLOORS[there] > FLOORS[here]
                or (here, there) in FORBIDDEN
                or (here == "config" and there != "config")
            ):
                if here != there:
                    upward.append(f"{name} -> {t}")
    assert not upward, "imports that point up the floors:\n" + "\n".join(sorted(upward))


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
