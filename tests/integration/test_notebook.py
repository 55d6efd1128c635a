"""Executes notebooks/analytics.ipynb at a small size; every cell must pass."""

import os
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NB = Path(__file__).resolve().parents[2] / "notebooks" / "analytics.ipynb"


@pytest.mark.timeout(600)
def test_analytics_notebook_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("TILEARRAY_NB_ROWS", "200000")
    monkeypatch.setenv("TILEARRAY_NB_DIR", str(tmp_path))
    nb = nbformat.read(NB, as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    out = tmp_path / "analytics.executed.ipynb"
    nbformat.write(nb, out)
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    pngs = [o for o in outputs if "image/png" in o.get("data", {})]
    assert pngs, "the plots must render"
    html = [o for o in outputs if "text/html" in o.get("data", {})]
    assert html, "TiledArray / Plan rich reprs must show"
    assert os.path.getsize(out) > 10_000
