"""Real multi-process runs: torchrun (torch.distributed, gloo) and mpiexec (mpi4py), 2 and 4 ranks.

Each launch runs `_worker.py`, which checks the communicator primitives and runs every case of
`_cases.py` through the sampling de-dup (with and without rebalancing) and the centralised
baseline; this process then rebuilds each rank's input and compares the slices, the routing and
the fetched values with the single-process numpy de-dup of the union.

Where torchrun or MPI is missing the tests skip, except under CI (``CI`` set), where they fail
(`_launch.py`).
"""

from __future__ import annotations

import importlib.util
import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from _cases import CASES, case_keys, check_partition
from _launch import env as _env
from _launch import launch as _launch
from _launch import missing as _missing
from _launch import mpiexec as _mpiexec
from _launch import torchrun

from cuscikit.backends.keys import dedup_numpy

pytestmark = pytest.mark.mpi

WORKER = Path(__file__).with_name("_worker.py")
METHODS = ("sampling", "sampling-norebalance", "centralised")


def _verify(out: Path, P: int, backend: str) -> None:
    reports = [json.loads((out / f"rank{r}.json").read_text()) for r in range(P)]
    for r, rep in enumerate(reports):
        assert rep["status"] == "ok", rep.get("traceback")
        assert (rep["rank"], rep["size"]) == (r, P)
        assert rep["backend"] == backend
    checked = 0
    for case in CASES:
        for words in (1, 2, 3, 4) if case != "coupled" else (1, 2):
            inputs = [case_keys(case, words, r, P).reshape(-1, words) for r in range(P)]
            ref = dedup_numpy(np.concatenate(inputs))[0]
            for method in METHODS:
                parts = [np.load(out / f"{case}-{words}-{method}-r{r}.npz") for r in range(P)]
                what = f"{case}, {words} words, {method}, P={P}"
                sizes = check_partition(parts, inputs, ref, what)
                for p in parts:
                    assert np.array_equal(p["offsets"], parts[0]["offsets"]), what
                    assert p["counts"].tolist() == sizes, what
                if method != "sampling-norebalance":  # exact equal shares
                    assert max(sizes) - min(sizes) <= 1, (what, sizes)
                else:
                    assert parts[0]["merged"].tolist() == sizes, what
                checked += 1
    assert checked == len(METHODS) * (4 * (len(CASES) - 1) + 2)


@pytest.mark.parametrize("P", [2, 4])
def test_torchrun_gloo(P, tmp_path):
    _launch(torchrun(P) + [str(WORKER), str(tmp_path), "check"], tmp_path)
    _verify(tmp_path, P, "gloo")


@pytest.mark.parametrize("P", [2, 4])
def test_mpiexec(P, tmp_path):
    cmd = _mpiexec() + ["-n", str(P), sys.executable, "-m", "mpi4py"]
    _launch(cmd + [str(WORKER), str(tmp_path), "check"], tmp_path)
    _verify(tmp_path, P, "mpi")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("mode", ["dead", "hang"])
def test_torch_rank_failure_raises_instead_of_hanging(mode, tmp_path):
    """A rank that is killed (or alive but silent) makes rank 0 raise CommError in time."""
    if importlib.util.find_spec("torch") is None:
        _missing("PyTorch")
    timeout = 3
    env = _env(
        WORLD_SIZE="2",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(_free_port()),
        CUSCIKIT_COMM_TIMEOUT=str(timeout),
    )
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), str(tmp_path), mode],
            env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for r in range(2)
    ]
    try:
        t0 = time.monotonic()
        procs[0].wait(timeout=60)
        elapsed = time.monotonic() - t0
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
            p.wait()
    rep = json.loads((tmp_path / "rank0.json").read_text())
    assert rep["status"] == "CommError", rep
    assert "rank 0 of 2" in rep["message"] and "another rank died" in rep["message"]
    assert rep["seconds"] < timeout + 10
    assert elapsed < 45  # start-up included
    assert (tmp_path / "started-r1").exists()
    if mode == "dead":
        assert procs[1].returncode == -signal.SIGKILL


def test_mpi_rank_failure_ends_the_job(tmp_path):
    """Under mpiexec a killed rank brings the job down instead of leaving rank 0 waiting."""
    cmd = _mpiexec() + ["-n", "2", sys.executable, "-m", "mpi4py"]
    t0 = time.monotonic()
    proc = subprocess.run(
        cmd + [str(WORKER), str(tmp_path), "dead"],
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(),
    )
    assert (tmp_path / "started-r0").exists(), proc.stdout + proc.stderr  # it got going
    assert proc.returncode != 0
    assert time.monotonic() - t0 < 60
    assert not (tmp_path / "rank0.json").exists()  # rank 0 did not get past the collective
