"""MkDocs hook: the config reference, generated from augtune/config.py at build time, and the commands'
reference, generated from the installed `augtune` command's own help.

`docs/reference/config.md` holds the marker below; this hook replaces it with one table per config
section: every key with its type, default, allowed range (Literal values, the `_f(min=, max=)` bounds,
registry names, the one-line rules of the `_validate*` functions and of augtune/checks.py) and the
comment written beside it in config.py. Everything is read with `ast` and `tokenize`: nothing of
augtune is imported, so building the docs needs neither torch nor Ray.

tests/test_docs.py imports this file by path and checks that every key of the config dataclasses is
on the generated page, so the page cannot drift from the code.
"""


import ast
import io
import re
import tokenize
from dataclasses import dataclass, field
from pathlib import Path

MARKER = "<!-- augtune:config-reference -->"
PAGE = "reference/config.md"
CLI_MARKER = "<!-- augtune:cli-reference -->"
CLI_PAGE = "reference/cli.md"
ROOT = Path(__file__).resolve().parents[2]
CONFIG = Path("augtune/config.py")

# keys whose allowed values are the names of a registry: (file, how the registry is written, its name)
REGISTRIES = {
    "dataset.name": ("augtune/data", "decorator", "register"),
    "method.base": ("augtune/methods/__init__.py", "dict", "BASES"),
    "method.augment": ("augtune/methods/__init__.py", "dict", "AUGMENTATIONS"),
    "eval.metrics": ("augtune/eval/evaluate.py", "dict", "METRICS"),
    "eval.epoch_metrics": ("augtune/eval/evaluate.py", "dict", "METRICS"),
    "eval.figures": ("augtune/plots/__init__.py", "dict", "PLOTS"),
    "search.space": ("augtune/spaces/__init__.py", "dict", "SPACES"),
    "compare.bases": ("augtune/methods/__init__.py", "dict", "BASES"),
    "compare.methods": ("augtune/search/compare.py", "tuples", ("PAPER_METHODS", "VECTOR_BASELINES")),
}
CHECKS = Path("augtune/checks.py")  # the registry checks one floor up: their one-line rules are listed too


@dataclass
class Key:
    dotted: str
    type: str
    default: str
    allowed: list[str] = field(default_factory=list)
    why: str = ""


@dataclass
class Section:
    dotted: str
    cls: str
    doc: str
    keys: list[Key] = field(default_factory=list)


# ---------------------------------------------------------------------------------------------
# Reading config.py


def _comments(source: str) -> tuple[dict[int, str], set[int]]:
    """{line: comment text} and the lines that hold only a comment."""
    comments, own_line = {}, set()
    lines = source.splitlines()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            row = tok.start[0]
            comments[row] = tok.string.lstrip("#").strip()
            if lines[row - 1].strip().startswith("#"):
                own_line.add(row)
    return comments, own_line


def _why(node: ast.AST, comments: dict[int, str], own_line: set[int]) -> str:
    """The comment block right above a field (no blank line between) and the comment beside it."""
    above, row = [], node.lineno - 1
    while row in own_line:
        above.insert(0, comments[row])
        row -= 1
    beside = [comments[r] for r in range(node.lineno, node.end_lineno + 1)
              if r in comments and r not in own_line]
    return " ".join(t for t in above + beside if t and not t.startswith("--"))


def _plural(text: str) -> str:
    return {"integer": "integers", "number": "numbers", "string": "strings", "boolean": "booleans",
            "mapping": "mappings"}.get(text, text)


def _describe(node: ast.AST) -> tuple[str, list[str]]:
    """(a type in words, Literal values) of an annotation."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):  # a string annotation
        return _describe(ast.parse(node.value, mode="eval").body)
    if isinstance(node, ast.Name):
        return {"int": "integer", "float": "number", "str": "string", "bool": "boolean",
                "dict": "mapping"}.get(node.id, node.id), []
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):  # X | None
        return _union([node.left, node.right])
    if isinstance(node, ast.Subscript):
        head = node.value.id if isinstance(node.value, ast.Name) else ast.unparse(node.value)
        args = list(node.slice.elts) if isinstance(node.slice, ast.Tuple) else [node.slice]
        if head == "Literal":
            return "string", [repr(a.value) if not isinstance(a.value, str) else a.value
                              for a in args if isinstance(a, ast.Constant)]
        if head == "Optional":
            text, values = _describe(args[0])
            return f"{text} or null", values
        if head == "Union":
            return _union(args)
        if head in ("tuple", "Tuple", "list"):
            text, values = _describe(args[0])
            return f"list of {_plural(text)}", values
    return ast.unparse(node), []


def _union(args: list[ast.AST]) -> tuple[str, list[str]]:
    texts, values, null = [], [], False
    for a in args:
        if isinstance(a, ast.Constant) and a.value is None:
            null = True
            continue
        text, vals = _describe(a)
        texts.append(text)
        values += vals
    return " or ".join(texts) + (" or null" if null else ""), values


def _literal(node: ast.AST) -> str:
    try:
        value = ast.literal_eval(node)
    except (ValueError, SyntaxError, TypeError):
        return ast.unparse(node)
    return _yaml(value)


def _yaml(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_yaml(v) for v in value) + "]"
    if isinstance(value, str):
        return '""' if value == "" else value
    return repr(value)


def _number(value) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value)) if abs(value) >= 1e4 else f"{value:g}"
    return str(value) if isinstance(value, int) else f"{value:g}"


_OPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
        ast.Div: lambda a, b: a / b, ast.FloorDiv: lambda a, b: a // b, ast.Pow: lambda a, b: a ** b}


def _evaluate(node: ast.AST, env: dict):
    """A constant expression of literals, module-level names and arithmetic; ValueError otherwise."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name) and node.id in env:
        return env[node.id]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_evaluate(node.operand, env)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_evaluate(node.left, env), _evaluate(node.right, env))
    raise ValueError(ast.unparse(node))


def _constants(tree: ast.Module) -> dict:
    """Module-level names bound to constant expressions (`MAX_SEED = 2**32 - 1`)."""
    env: dict = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                env[node.targets[0].id] = _evaluate(node.value, env)
            except (ValueError, TypeError, ArithmeticError):
                pass
    return env


def _bound(node: ast.AST, env: dict) -> str:
    try:
        value = _number(_evaluate(node, env))
    except (ValueError, TypeError, ArithmeticError):
        return ast.unparse(node)
    return f"{node.id} = {value}" if isinstance(node, ast.Name) else value


def _bounds(call: ast.Call, env: dict) -> str:
    kw = {k.arg: k.value for k in call.keywords if k.arg in ("min", "max", "min_open", "max_open")}
    lo, hi = kw.get("min"), kw.get("max")
    lo = None if lo is None or (isinstance(lo, ast.Constant) and lo.value is None) else lo
    hi = None if hi is None or (isinstance(hi, ast.Constant) and hi.value is None) else hi

    def is_open(name: str) -> bool:
        node = kw.get(name)
        return isinstance(node, ast.Constant) and node.value is True

    if lo is None and hi is None:
        return ""
    left = "<" if is_open("min_open") else "≤"
    right = "<" if is_open("max_open") else "≤"
    if lo is not None and hi is not None:
        return f"{_bound(lo, env)} {left} x {right} {_bound(hi, env)}"
    if lo is not None:
        return f"x {'>' if is_open('min_open') else '≥'} {_bound(lo, env)}"
    return f"x {right} {_bound(hi, env)}"


def _classes(tree: ast.Module) -> dict[str, ast.ClassDef]:
    def is_dataclass(c: ast.ClassDef) -> bool:
        return any((isinstance(d, ast.Call) and getattr(d.func, "id", "") == "dataclass")
                   or getattr(d, "id", "") == "dataclass" for d in c.decorator_list)

    return {n.name: n for n in tree.body if isinstance(n, ast.ClassDef) and is_dataclass(n)}


def _nested(value: ast.AST, classes: dict) -> str | None:
    """The dataclass a `field(default_factory=X)` builds, if it is one of config.py's."""
    if isinstance(value, ast.Call) and getattr(value.func, "id", "") == "field":
        for k in value.keywords:
            if k.arg == "default_factory" and isinstance(k.value, ast.Name) and k.value.id in classes:
                return k.value.id
    return None


def _default(value: ast.AST | None, env: dict) -> tuple[str, str]:
    """(the default as YAML, the bounds) of a field's value."""
    if value is None:
        return "(required)", ""
    if isinstance(value, ast.Call) and getattr(value.func, "id", "") == "_f":
        return _literal(value.args[0]), _bounds(value, env)
    if isinstance(value, ast.Call) and getattr(value.func, "id", "") == "field":
        for k in value.keywords:
            if k.arg == "default":
                return _literal(k.value), ""
            if k.arg == "default_factory":
                return ast.unparse(k.value) + "()", ""
    return _literal(value), ""


def sections(root: Path = ROOT) -> list[Section]:
    """Every config section (nested ones too, `search.repeat_best`), in the order `Config` lists them."""
    source = (root / CONFIG).read_text(encoding="utf-8")
    tree = ast.parse(source)
    comments, own_line = _comments(source)
    classes = _classes(tree)
    env = _constants(tree)
    rules = _rules(tree, classes, root)
    registries = _registries(root)
    out: list[Section] = []

    def walk(cls: str, prefix: str) -> None:
        node = classes[cls]
        section = Section(prefix.rstrip("."), cls, ast.get_docstring(node) or "")
        out.append(section)
        later = []
        for stmt in node.body:
            if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
                continue
            name, dotted = stmt.target.id, prefix + stmt.target.id
            inner = _nested(stmt.value, classes)
            if inner is not None:
                later.append((inner, dotted + "."))
                continue
            text, values = _describe(stmt.annotation)
            default, bounds = _default(stmt.value, env)
            allowed = []
            if values:
                allowed.append("one of " + ", ".join(f"`{v}`" for v in values))
            if bounds:
                allowed.append(bounds)
            if dotted in registries:
                allowed.append("registered: " + ", ".join(f"`{v}`" for v in registries[dotted]))
            more = rules.get((cls, name), []) + rules.get(dotted, [])
            if dotted in registries:  # "unknown x (known: …)" says no more than the registered names
                more = [r for r in more if "(known: …)" not in r]
            allowed += more
            section.keys.append(Key(dotted, text, default, allowed, _why(stmt, comments, own_line)))
        for inner, inner_prefix in later:
            walk(inner, inner_prefix)

    walk("Config", "")
    # the top level holds sections only; list it first only if it ever gets keys of its own
    return [s for s in out if s.keys or s.dotted]


def keys(root: Path = ROOT) -> set[str]:
    return {k.dotted for s in sections(root) for k in s.keys}


# ---------------------------------------------------------------------------------------------
# Rules written as code: the `_validate*` functions of config.py and the checks of checks.py


def _message(node: ast.AST) -> str | None:
    """A ConfigError's message with every formatted value shown as `{name}` (prefix) or `…`."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        parts = []
        for v in node.values:
            if isinstance(v, ast.Constant):
                parts.append(str(v.value))
            elif isinstance(v, ast.FormattedValue) and getattr(v.value, "id", None) == "prefix":
                parts.append("{prefix}")
            else:
                parts.append("…")
        return "".join(parts)
    return None


def _raised_messages(node: ast.AST):
    for sub in ast.walk(node):
        if isinstance(sub, ast.Raise) and isinstance(sub.exc, ast.Call) and \
                getattr(sub.exc.func, "id", "") == "ConfigError" and sub.exc.args:
            text = _message(sub.exc.args[0])
            if text:
                yield text


def _rule_text(text: str) -> str:
    """`{prefix}.x: expected ..., got …` -> `expected ...`; "" when the rule is only placeholders."""
    rule = text.split(": ", 1)[1] if ": " in text else text
    rule = re.sub(r"[,;]? got (…|an? [\w ]+)$", "", rule).strip()
    letters = sum(ch.isalpha() for ch in rule.replace("…", ""))
    return rule if letters >= 12 else ""


def _rules(tree: ast.Module, classes: dict, root: Path) -> dict:
    """{(class, field) or dotted key: [rule, ...]} from the cross-field checks."""
    rules: dict = {}
    fields = {c: {s.target.id for s in n.body
                  if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}
              for c, n in classes.items()}

    def add(where, rule: str) -> None:
        if rule and rule not in rules.setdefault(where, []):
            rules[where].append(rule)

    for fn in (n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("_validate")):
        typed = [a.annotation.id for a in fn.args.args
                 if isinstance(a.annotation, ast.Name) and a.annotation.id in classes]
        typed += [a.annotation.value for a in fn.args.args
                  if isinstance(a.annotation, ast.Constant) and a.annotation.value in classes]
        blocks: list[tuple[ast.AST, list[str]]] = [(fn, typed)]
        for sub in ast.walk(fn):  # `if isinstance(obj, ViewConfig):` narrows the class
            if isinstance(sub, ast.If) and isinstance(sub.test, ast.Call) and \
                    getattr(sub.test.func, "id", "") == "isinstance" and len(sub.test.args) == 2 and \
                    isinstance(sub.test.args[1], ast.Name) and sub.test.args[1].id in classes:
                blocks.append((sub, [sub.test.args[1].id]))
        seen = {}
        for block, owners in reversed(blocks):  # innermost first: its class wins
            for text in _raised_messages(block):
                if not text.startswith("{prefix}.") or text in seen:
                    continue
                name = text[len("{prefix}."):].split(":", 1)[0].split("[", 1)[0]
                seen[text] = True
                owner = [c for c in owners if name in fields[c]]
                if not owner:  # no class in sight: the one class that has such a field
                    owner = [c for c, names in fields.items() if name in names]
                if len(owner) == 1:
                    add((owner[0], name), _rule_text(text))
    try:
        checks = ast.parse((root / CHECKS).read_text(encoding="utf-8"))
    except (OSError, SyntaxError):
        return rules
    for text in _raised_messages(checks):
        head = text.split(":", 1)[0]
        dotted = head.split("[", 1)[0]
        if "…" in dotted or "." not in dotted or " " in dotted:
            continue
        add(dotted, _rule_text(text))
    return rules


def _registries(root: Path) -> dict[str, list[str]]:
    """{dotted key: registered names} read from the registries' source (dict literals, decorators)."""
    out = {}
    for key, (where, how, name) in REGISTRIES.items():
        path = root / where
        files = sorted(path.glob("*.py")) if path.is_dir() else [path]
        names: list[str] = []
        for f in files:
            try:
                tree = ast.parse(f.read_text(encoding="utf-8"))
            except (OSError, SyntaxError):
                continue
            names += _registry_names(tree, how, name)
        if names:
            out[key] = list(dict.fromkeys(names))
    return out


def _registry_names(tree: ast.Module, how: str, name) -> list[str]:
    names: list[str] = []
    for node in ast.walk(tree):
        if how == "decorator" and isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            for d in node.decorator_list:
                if isinstance(d, ast.Call) and getattr(d.func, "id", "") == name and d.args and \
                        isinstance(d.args[0], ast.Constant):
                    names.append(d.args[0].value)
        target = getattr(node, "target", None) or (node.targets[0] if isinstance(node, ast.Assign) else None)
        if not isinstance(target, ast.Name) or getattr(node, "value", None) is None:
            continue
        if how == "dict" and target.id == name and isinstance(node.value, ast.Dict):
            names += [k.value for k in node.value.keys if isinstance(k, ast.Constant)]
        if how == "tuples" and target.id in name and isinstance(node.value, ast.Tuple):
            if target.id == name[0]:
                names.insert(0, "base")
            names += [e.value for e in node.value.elts if isinstance(e, ast.Constant)]
    return names


# ---------------------------------------------------------------------------------------------
# Markdown


def _cell(text: str) -> str:
    """`text` as one markdown table cell, shown as written. docs/hooks/tables.py uses this one too."""
    return (text.replace("\\", "\\\\").replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")
            .replace("*", "\\*").replace("\n", " "))


def _code(text: str) -> str:
    return "`" + text.replace("|", "\\|") + "`" if "`" not in text else _cell(text)


def markdown(root: Path = ROOT) -> str:
    """The generated part of the config reference page."""
    out = []
    for s in sections(root):
        title = s.dotted or "top level"
        out.append(f"## `{title}` {{ #{title.replace('.', '-')} }}\n")
        if s.doc:
            out.append(s.doc.replace("\n", " ") + "\n")
        out.append(f"*From `{s.cls}` in `augtune/config.py`.*\n")
        out.append("| key | type and allowed values | default | why (the comment in config.py) |")
        out.append("| --- | --- | --- | --- |")
        for k in s.keys:
            kind = _cell(k.type) + ("<br>" + "<br>".join(_allowed(a) for a in k.allowed) if k.allowed else "")
            anchor = f'<span id="{k.dotted}"></span>'
            out.append(f"| {anchor}`{k.dotted}` | {kind} | {_code(k.default)} | {_cell(k.why)} |")
        out.append("")
    return "\n".join(out)


def _allowed(text: str) -> str:
    """Keep the backticks of value lists; escape everything else."""
    parts = text.split("`")
    return "".join(_cell(p) if i % 2 == 0 else f"`{p}`" for i, p in enumerate(parts))


# ---------------------------------------------------------------------------------------------
# MkDocs hook events


def _help(argv: list[str]) -> str:
    """What `augtune ARGV --help` prints, through the console script's own entry point."""
    import contextlib
    import os

    from augtune.cli import main

    out = io.StringIO()
    columns = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"  # the same line breaks on every terminal
    try:
        with contextlib.redirect_stdout(out):
            try:
                main([*argv, "--help"])
            except SystemExit:
                pass
    finally:
        if columns is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = columns
    return out.getvalue().rstrip()


def cli_markdown() -> str:
    """Every command's `--help`, as the installed augtune prints it (importing `augtune.cli` loads
    neither torch nor Ray)."""
    top = _help([])
    match = re.search(r"\{([a-z_,-]+)\}", top)
    commands = match.group(1).split(",") if match else []
    out = ["## `augtune`\n", "```text", top, "```\n"]
    for command in commands:
        out += [f"## `augtune {command}`\n", "```text", _help([command]), "```\n"]
    return "\n".join(out)


def on_page_markdown(markdown_text: str, page, config, files) -> str:
    root = Path(config["config_file_path"]).resolve().parent
    for uri, marker, make in ((PAGE, MARKER, lambda: markdown(root)), (CLI_PAGE, CLI_MARKER, cli_markdown)):
        if page.file.src_uri == uri:
            if marker not in markdown_text:
                raise RuntimeError(f"{uri} lost its marker {marker}")
            return markdown_text.replace(marker, make())
    return markdown_text


def on_serve(server, config, builder):
    root = Path(config["config_file_path"]).resolve().parent
    server.watch(str(root / CONFIG))
    return server
