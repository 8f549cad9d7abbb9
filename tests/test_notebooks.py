"""Every tracked notebook runs top to bottom at small sizes (environment variables shrink them)."""

import os
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).parents[1] / "notebooks").glob("*.ipynb"))
SMALL = {"CUSCIKIT_NB_ITERS": "4", "CUSCIKIT_NB_MOLECULE": "LiH", "MPLBACKEND": "Agg"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs(path, monkeypatch, tmp_path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    for k, v in SMALL.items():
        monkeypatch.setenv(k, v)
    nb = nbformat.read(path, as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), (
        f"{path.name}: strip outputs before committing"
    )
    client = nbclient.NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute(env=dict(os.environ))
    text = "".join(
        o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
    )
    if path.name.startswith("01_"):  # the shrinking parameter really took effect
        assert "6 iterations in the history" in text
