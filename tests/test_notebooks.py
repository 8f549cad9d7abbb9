"""Every tracked notebook runs top to bottom at small sizes (environment variables shrink them).

Notebooks that start ipyparallel engines need ipyparallel, and MPI engines mpiexec too (skipped
without them, except under CI, where the test extras install Open MPI from PyPI); each runs with
its own IPython directory, so that any cluster it leaves running (a failed cell skips the
notebook's own shutdown cell) is found and stopped here.
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
# Per notebook: 01's system must grow its space within the few iterations CI runs.
SMALL_FOR = {"01_": {"CUSCIKIT_NB_MOLECULE": "N2"}}


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
    small = dict(SMALL)
    for prefix, extra in SMALL_FOR.items():
        if path.name.startswith(prefix):
            small.update(extra)
    for k, v in small.items():
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
        mpi = any('engines="mpi"' in c.source for c in nb.cells if c.cell_type == "code")
        if mpi and not shutil.which("mpiexec"):
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
        assert "6 iterations in the history; the run ok" in text
    if path.name[:3] in ("01_", "05_", "06_"):  # each states its run time
        assert "this notebook ran in" in text
    if path.name.startswith("05_"):
        assert "energy on 2 ranks vs 1: |dE|" in text  # the live benchmark runs took place
        for script in ("guga_cpu", "ising_throughput", "ising_service", "ising_quality"):
            assert f"{script}.py: " in text, script  # run live, its JSON read back
    if path.name.startswith("06_"):
        assert "2 engines running" in text
        assert "largest difference from the single-process run" in text
    if path.name.startswith("02_"):
        assert "2 engines running" in text
        assert "agree with the single-process de-dup" in text
        assert "largest difference from the single-process run" in text  # the Runner cells ran
