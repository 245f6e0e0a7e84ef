"""examples/quickstart.ipynb: kept without outputs in git, and executed for real (a small compare)."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

NOTEBOOK = Path(__file__).resolve().parents[1] / "examples" / "quickstart.ipynb"


def test_the_notebook_is_kept_without_outputs():
    nbformat = pytest.importorskip("nbformat", reason="nbformat is in the test extra")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(not c.outputs and c.execution_count is None for c in code)


@pytest.mark.ray
@pytest.mark.slow
def test_the_quickstart_notebook_runs(tmp_path):
    nbclient = pytest.importorskip("nbclient", reason="nbclient and ipykernel are in the test extra")
    import nbformat

    shutil.copy(NOTEBOOK, tmp_path / NOTEBOOK.name)
    nb = nbformat.read(tmp_path / NOTEBOOK.name, as_version=4)
    nbclient.NotebookClient(nb, timeout=900, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    text = "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert "knn_acc:" in text  # the verdict printed
    assert any("image/png" in o.get("data", {}) for c in nb.cells for o in c.get("outputs", []))
    assert list((tmp_path / "results").glob("compare-digits-*/repeat/*/record.json"))
