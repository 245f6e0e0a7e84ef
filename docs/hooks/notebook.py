"""MkDocs hook: `examples/quickstart.ipynb` rendered as the Quickstart page, with its outputs.

`docs/quickstart.md` holds the marker below; this hook replaces it with the notebook's cells: markdown as
it is, code in fences, and each output (printed text, a DataFrame's table, a figure as an inline PNG, an
object's `_repr_markdown_`). The notebook stays in git without outputs; the outputs come from running it:

- `AUGTUNE_DOCS_EXECUTE=1 mkdocs build` executes it (nbclient; a small compare on a local Ray, about a
  minute) and renders what it printed: how the published site is built;
- `AUGTUNE_DOCS_NOTEBOOK=path.ipynb` renders an executed copy made elsewhere;
- otherwise the page shows the code and says how to see the outputs (the suite's docs build, which
  must not start Ray).

tests/test_notebook.py renders the executed notebook with `render` and checks the verdict is in it.
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

MARKER = "<!-- augtune:notebook -->"
PAGE = "quickstart.md"
ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "examples" / "quickstart.ipynb"


def _text(value) -> str:
    return "".join(value) if isinstance(value, list) else str(value)


def _output(out: dict) -> str:
    if out.get("output_type") == "stream":
        return f"```text\n{_text(out.get('text', '')).rstrip()}\n```"
    if out.get("output_type") == "error":
        return f"```text\n{out.get('ename')}: {out.get('evalue')}\n```"
    data = out.get("data", {})
    if "image/png" in data:
        return f'<img alt="figure" src="data:image/png;base64,{_text(data["image/png"]).strip()}">'
    if "text/markdown" in data:
        return _text(data["text/markdown"])
    if "text/html" in data:
        return f'<div class="nb-output">{_text(data["text/html"])}</div>'
    if "text/plain" in data:
        return f"```text\n{_text(data['text/plain']).rstrip()}\n```"
    return ""


def render(nb: dict, executed: bool = True) -> str:
    """The notebook `nb` (its JSON) as Markdown; `executed`: False adds a line on how to see outputs."""
    parts = []
    if not executed:
        parts.append("!!! note \"Outputs\"\n    This build did not run the notebook: build the site with "
                     "`AUGTUNE_DOCS_EXECUTE=1` (as the published site is) to see the verdict, the figure, "
                     "`best()` and `trials()` here, or run `examples/quickstart.ipynb` yourself.")
    for cell in nb.get("cells", []):
        source = _text(cell.get("source", ""))
        if cell.get("cell_type") == "markdown":
            parts.append(source)
        elif cell.get("cell_type") == "code":
            parts.append(f"```python\n{source.rstrip()}\n```")
            parts += [text for text in map(_output, cell.get("outputs", [])) if text]
    return "\n\n".join(parts) + "\n"


def _executed() -> tuple[dict, bool]:
    given = os.environ.get("AUGTUNE_DOCS_NOTEBOOK")
    if given:
        return json.loads(Path(given).read_text(encoding="utf-8")), True
    nb = json.loads(NOTEBOOK.read_text(encoding="utf-8"))
    if os.environ.get("AUGTUNE_DOCS_EXECUTE") != "1":
        return nb, False
    import nbclient
    import nbformat

    notebook = nbformat.reads(json.dumps(nb), as_version=4)
    with tempfile.TemporaryDirectory() as folder:  # its results/ folder goes with it
        nbclient.NotebookClient(notebook, timeout=900, kernel_name="python3",
                                resources={"metadata": {"path": folder}}).execute()
    return json.loads(nbformat.writes(notebook)), True


def on_page_markdown(markdown_text: str, page, config, files) -> str:
    if page.file.src_uri != PAGE or MARKER not in markdown_text:
        return markdown_text
    nb, executed = _executed()
    return markdown_text.replace(MARKER, render(nb, executed))
