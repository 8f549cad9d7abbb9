"""Every tracked notebook runs top to bottom at small sizes (environment variables shrink them).

Notebooks that start ipyparallel MPI engines need ipyparallel and mpiexec (skipped without them,
except under CI, where the test extras install Open MPI from PyPI); each runs with its own
IPython directory, so that any cluster it leaves running (a failed cell skips the notebook's own
shutdown cell) is found and stopped here.
"""

import os
import shutil
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).parents[1] / "notebooks").glob("*.ipynb"))
SMALL = {
    "CUSCIKIT_NB_ITERS": "4",
    "CUSCIKIT_NB_MOLECULE": "LiH",
    "CUSCIKIT_NB_ENGINES": "2",
    "MPLBACKEND": "Agg",
}


def _missing(what: str):
    if os.environ.get("CI"):
        pytest.fail(f"{what} is missing on CI; .ci/run and the test extras should provide it")
    pytest.skip(f"{what} is missing")


def _stop_clusters(ipython_dir: Path) -> list[str]:
    """Stop the ipyparallel clusters whose files remain under `ipython_dir`; returns their ids."""
    import ipyparallel as ipp

    stopped = []
    for f in sorted(ipython_dir.glob("profile_*/security/cluster-*.json")):
        cluster = ipp.Cluster.from_file(str(f))
        cluster.stop_cluster_sync()
        stopped.append(cluster.cluster_id)
    return stopped


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
    engines = any("ipyparallel" in c.source for c in nb.cells if c.cell_type == "code")
    if engines:
        try:
            import ipyparallel  # noqa: F401
        except ImportError:
            _missing("ipyparallel")
        if not shutil.which("mpiexec"):
            _missing("an MPI launcher (mpiexec)")
        if hasattr(os, "geteuid") and os.geteuid() == 0:  # Open MPI refuses root by default
            monkeypatch.setenv("OMPI_ALLOW_RUN_AS_ROOT", "1")
            monkeypatch.setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    ipython_dir = tmp_path / "ipython"
    monkeypatch.setenv("IPYTHONDIR", str(ipython_dir))
    client = nbclient.NotebookClient(
        nb,
        timeout=180 if engines else 600,  # a hung collective fails in minutes, not ten
        kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path)}},
    )
    try:
        client.execute(env=dict(os.environ))
    finally:
        left_running = _stop_clusters(ipython_dir) if engines else []
    assert not left_running, f"{path.name} left ipyparallel clusters running: {left_running}"
    text = "".join(
        o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
    )
    if path.name.startswith("01_"):  # the shrinking parameter really took effect
        assert "6 iterations in the history" in text
    if path.name.startswith("02_"):
        assert "2 engines running" in text
        assert "agree with the single-process de-dup" in text
        assert "largest difference from the single-process run" in text  # the Runner cells ran
