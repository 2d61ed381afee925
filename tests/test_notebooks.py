"""Every notebook runs, top to bottom, in its small mode (CAPTIONER_NOTEBOOK_SMALL=1), so none can rot."""

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))


def test_the_notebooks_are_found():
    assert {p.name for p in NOTEBOOKS} >= {"quickstart.ipynb", "attention_anatomy.ipynb"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_in_small_mode(path, monkeypatch, tmp_path):
    monkeypatch.setenv("CAPTIONER_NOTEBOOK_SMALL", "1")
    monkeypatch.setenv("CAPTIONER_NOTEBOOK_WORK", str(tmp_path))   # pytest removes it; a mkdtemp folder would stay
    monkeypatch.setenv("MPLBACKEND", "Agg")
    notebook = nbformat.read(path, as_version=4)
    NotebookClient(notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
    errors = [output for cell in notebook.cells if cell.cell_type == "code" for output in cell.get("outputs", [])
              if output.get("output_type") == "error"]
    assert not errors
    assert any(tmp_path.iterdir()), "the notebook wrote nowhere under CAPTIONER_NOTEBOOK_WORK"
