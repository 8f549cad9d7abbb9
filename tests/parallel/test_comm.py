"""The communicator layer in one process: SerialComm, discovery, TorchComm on a 1-rank group."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import numpy as np
import pytest
import torch

from cuscikit.parallel import SerialComm, detect_backend, get_comm
from cuscikit.parallel.comm import comm_timeout


def test_serial_comm_returns_its_own_input():
    c = SerialComm()
    assert (c.rank, c.size) == (0, 1)
    assert c.allreduce(5) == 5
    a = np.array([[1, 2]], dtype=np.uint64)
    for got in (c.bcast(a), c.gather(a)[0], c.allgather(a)[0]):
        assert np.array_equal(got, a) and got is not a
    recv, counts = c.alltoallv(a, [1])
    assert np.array_equal(recv, a) and counts.tolist() == [1]
    c.barrier()


def test_alltoallv_rejects_bad_counts():
    c = SerialComm()
    with pytest.raises(ValueError, match="summing to the 2 rows"):
        c.alltoallv(np.zeros((2, 1), np.uint64), [1])
    with pytest.raises(ValueError, match="non-negative"):
        c.alltoallv(np.zeros((0, 1), np.uint64), [-1])
    with pytest.raises(ValueError, match="op must be"):
        c.allreduce(1, op="prod")
    with pytest.raises(ValueError, match="root 1"):
        c.bcast(np.zeros(1), root=1)


@pytest.mark.parametrize(
    "env, expected",
    [
        ({}, "serial"),
        ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"}, "torch"),
        ({"WORLD_SIZE": "2"}, "serial"),  # not torchrun without a rendezvous address
        ({"OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_RANK": "1"}, "mpi"),
        ({"PMI_SIZE": "4", "PMI_RANK": "0"}, "mpi"),  # MPICH / Hydra, Intel MPI
    ],
)
def test_detect_backend(env, expected):
    assert detect_backend(env) == expected


def test_get_comm():
    assert isinstance(get_comm("serial"), SerialComm)
    with pytest.raises(ValueError, match="unknown communicator backend"):
        get_comm("carrier-pigeon")


def test_timeout_from_environment(monkeypatch):
    monkeypatch.delenv("CUSCIKIT_COMM_TIMEOUT", raising=False)
    assert comm_timeout() == 300
    monkeypatch.setenv("CUSCIKIT_COMM_TIMEOUT", "7.5")
    assert comm_timeout() == 7.5
    assert comm_timeout(2) == 2
    with pytest.raises(ValueError, match="positive"):
        comm_timeout(0)


def test_import_starts_nothing():
    """Importing cuscikit.parallel loads neither torch nor mpi4py; get_comm() is serial."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("OMPI_", "PMI_", "PMIX_")) and k not in ("WORLD_SIZE", "RANK")
    }
    code = (
        "import sys, cuscikit.parallel as p; "
        "print(sorted(m for m in ('torch', 'mpi4py') if m in sys.modules), "
        "type(p.get_comm()).__name__)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    ).stdout
    assert out.split() == ["[]", "SerialComm"]


def test_torch_comm_single_rank_group():
    """TorchComm on a 1-rank gloo group: numpy in -> numpy out, torch tensors stay tensors."""
    torch = pytest.importorskip("torch")
    import torch.distributed as dist

    from cuscikit.parallel import TorchComm

    if dist.is_initialized():
        pytest.skip("a process group already exists in this process")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    comm = TorchComm(
        backend="gloo", timeout=30, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1
    )
    try:
        assert (comm.rank, comm.size, comm.backend) == (0, 1, "gloo")
        assert detect_backend() == "torch"  # an existing group wins
        keys = np.array([[2**64 - 1, 3], [0, 2**63]], dtype=np.uint64)
        recv, counts = comm.alltoallv(keys, [2])
        assert recv.dtype == np.uint64 and np.array_equal(recv, keys) and counts.tolist() == [2]
        t = torch.tensor([[1, 2], [3, 4]], dtype=torch.int64)
        rt, _ = comm.alltoallv(t, [2])
        assert isinstance(rt, torch.Tensor) and torch.equal(rt, t)
        assert comm.allreduce(np.array([2**64 - 1], np.uint64)).tolist() == [2**64 - 1]
        assert comm.allreduce(3.5) == 3.5
        assert np.array_equal(comm.bcast(keys), keys)
        assert np.array_equal(comm.allgather(keys)[0], keys)
        assert np.array_equal(comm.gather(keys)[0], keys)
        comm.barrier()
    finally:
        comm.close()
    assert not dist.is_initialized()


@pytest.mark.parametrize(
    ("cuda", "gpus", "local_ranks", "expected"),
    [
        (False, 0, "2", "gloo"),
        (True, 2, "2", "nccl"),
        (True, 2, "4", "gloo"),  # NCCL refuses two ranks on one GPU
        (True, 1, None, "nccl"),  # without torchrun: one process
    ],
)
def test_default_torch_backend(monkeypatch, cuda, gpus, local_ranks, expected):
    from cuscikit.parallel.comm import default_torch_backend

    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    if local_ranks is None:
        monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    else:
        monkeypatch.setenv("LOCAL_WORLD_SIZE", local_ranks)
    assert default_torch_backend() == expected


@pytest.mark.parametrize("dtype", [np.float32, np.bool_, np.int16, np.complex128, np.uint64])
def test_rows_of_any_dtype_travel_between_thread_ranks(dtype):
    """Rows whose size is not a multiple of 8 bytes are padded for the engines and come back
    exactly (numpy arrays and torch tensors alike)."""
    import torch

    from cuscikit.parallel import run_ranks

    rng = np.random.default_rng(3)
    data = [(rng.random((5 + r, 3)) * 100).astype(dtype) for r in range(3)]

    def rank(comm):
        mine = data[comm.rank]
        counts = [1, 2, len(mine) - 3]
        got, rc = comm.alltoallv(mine, counts)
        tgot, trc = comm.alltoallv(torch.from_numpy(mine.copy()), counts)
        return got, rc, tgot, trc

    out = run_ranks(3, rank)
    for d, (got, rc, tgot, trc) in enumerate(out):
        starts = [np.concatenate([[0], np.cumsum([1, 2, len(x) - 3])]) for x in data]
        expect = np.concatenate([x[s[d] : s[d + 1]] for x, s in zip(data, starts, strict=True)])
        assert np.array_equal(got, expect) and got.dtype == expect.dtype
        assert isinstance(tgot, torch.Tensor) and np.array_equal(tgot.numpy(), expect)
        assert rc.tolist() == trc.tolist()
