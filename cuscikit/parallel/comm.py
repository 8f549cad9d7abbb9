"""Communicators: one small interface, four engines (single process, threads of one process,
torch.distributed, mpi4py).

The distributed algorithms (`cuscikit.parallel.dedup`, the NNQS-SCI iteration) are written once
against `Comm`:

=========================  =======================================================================
``rank``, ``size``         this process and the number of processes
``barrier()``              wait for every rank
``allreduce(x, op)``       elementwise sum / max / min of a scalar or array over ranks
``bcast(x, root)``         the root's array on every rank (other ranks may pass None)
``gather(x, root)``        a list of every rank's array on the root (None elsewhere)
``allgather(x)``           a list of every rank's array on every rank
``alltoallv(x, counts)``   rows ``x[sum(counts[:d]) : sum(counts[:d+1])]`` go to rank d; returns
                           the received rows (in source-rank order) and the per-source counts
=========================  =======================================================================

Arrays have any number of rows; the rows of ``gather``, ``allgather`` and ``alltoallv`` may
differ in number between ranks but must agree in shape and dtype otherwise. ``alltoallv`` takes
numpy arrays or torch tensors of any dtype and returns the same kind: `TorchComm` moves tensors
on their device (GPU to GPU on NCCL), the other engines through host memory.

Nothing is initialised at import time: `get_comm` (or a backend's constructor) starts the engine.

Launch (ranks discover each other from the environment)::

    torchrun --nproc-per-node 4 script.py          # RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    mpiexec -n 4 python -m mpi4py script.py        # OMPI_COMM_WORLD_SIZE or PMI_SIZE

Failure behaviour:
    torch.distributed: every collective has a timeout (``CUSCIKIT_COMM_TIMEOUT`` seconds,
    default 300, or ``timeout=``). A rank that dies or stops answering makes the others raise
    `CommError` (gloo: when its socket closes or the timeout expires; NCCL: the watchdog aborts
    the communicator after the timeout, with ``TORCH_NCCL_ASYNC_ERROR_HANDLING`` at its default).
    MPI has no collective timeouts: a rank that exits abnormally makes ``mpiexec``/``mpirun`` kill
    the whole job. Run scripts as ``python -m mpi4py script.py`` so that an uncaught exception on
    one rank calls ``MPI_Abort`` instead of leaving the others waiting in a collective.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from typing import Any

import numpy as np

__all__ = [
    "DEFAULT_TIMEOUT",
    "Comm",
    "CommError",
    "MPIComm",
    "SerialComm",
    "ThreadComm",
    "TorchComm",
    "comm_timeout",
    "detect_backend",
    "get_comm",
    "local_rank",
    "run_ranks",
]

DEFAULT_TIMEOUT = 300.0
"""Seconds a torch.distributed collective may wait (overridden by ``CUSCIKIT_COMM_TIMEOUT``)."""

_OPS = ("sum", "max", "min")


class CommError(RuntimeError):
    """A collective failed: another rank died, or did not answer within the timeout."""


def comm_timeout(timeout: float | None = None) -> float:
    """The collective timeout in seconds: `timeout`, else ``$CUSCIKIT_COMM_TIMEOUT``, else 300."""
    if timeout is None:
        timeout = float(os.environ.get("CUSCIKIT_COMM_TIMEOUT", DEFAULT_TIMEOUT))
    if not timeout > 0:
        raise ValueError(f"the communicator timeout must be positive, got {timeout}")
    return float(timeout)


def _rows_as_words(x: np.ndarray) -> np.ndarray:
    """An array with any number of rows as (n, k) uint64 words (C order; rows whose byte size is
    not a multiple of 8 are zero-padded, which `_words_as_rows` undoes)."""
    x = np.ascontiguousarray(x)
    n = x.shape[0] if x.ndim else 1
    per_row = int(np.prod(x.shape[1:])) if x.ndim > 1 else 1
    row_bytes = x.dtype.itemsize * per_row
    raw = x.reshape(n, per_row).view(np.uint8).reshape(n, row_bytes)
    if row_bytes % 8 or row_bytes == 0:
        padded = np.zeros((n, max(8, -(-row_bytes // 8) * 8)), np.uint8)
        padded[:, :row_bytes] = raw
        raw = padded
    return raw.view(np.uint64)


def _words_as_rows(w: np.ndarray, like: np.ndarray) -> np.ndarray:
    per_row = int(np.prod(like.shape[1:])) if like.ndim > 1 else 1
    row_bytes = like.dtype.itemsize * per_row
    raw = np.ascontiguousarray(w).view(np.uint8).reshape(w.shape[0], 8 * w.shape[1])
    raw = raw[:, :row_bytes]
    return np.ascontiguousarray(raw).view(like.dtype).reshape((w.shape[0], *like.shape[1:]))


def _is_tensor(x) -> bool:
    return type(x).__module__.startswith("torch")


def _check_counts(counts, size: int, n: int) -> np.ndarray:
    c = np.asarray(counts, dtype=np.int64).reshape(-1)
    if c.shape != (size,) or (c < 0).any() or int(c.sum()) != n:
        raise ValueError(
            f"alltoallv counts must be {size} non-negative numbers summing to the {n} rows sent, "
            f"got {c.tolist()}"
        )
    return c


class Comm(ABC):
    """The communicator interface (see the module docstring for the semantics of each call)."""

    rank: int = 0
    size: int = 1
    backend: str = ""

    @abstractmethod
    def barrier(self) -> None: ...

    @abstractmethod
    def allreduce(self, x, op: str = "sum"): ...

    @abstractmethod
    def bcast(self, x, root: int = 0): ...

    @abstractmethod
    def gather(self, x, root: int = 0) -> list | None: ...

    @abstractmethod
    def allgather(self, x) -> list: ...

    def alltoallv(self, x, counts) -> tuple[Any, np.ndarray]:
        """Rows ``x[sum(counts[:d]) : sum(counts[:d+1])]`` to rank d; returns the received rows
        (source-rank order, the kind and device of `x`) and the per-source counts."""
        if _is_tensor(x):
            import torch

            home, dtype = x.device, x.dtype
            t = x.detach()
            if t.is_complex():
                t = torch.view_as_real(t)
            a = t.cpu().numpy()
            recv, rc = self._alltoallv(a, counts)
            out = torch.from_numpy(np.ascontiguousarray(recv)).to(home)
            if dtype.is_complex:
                out = torch.view_as_complex(out.contiguous())
            return out, rc
        return self._alltoallv(np.asarray(x), counts)

    @abstractmethod
    def _alltoallv(self, x: np.ndarray, counts) -> tuple[np.ndarray, np.ndarray]: ...

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release what this object started (a torch process group it created)."""

    def __enter__(self) -> Comm:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(rank={self.rank}, size={self.size}, backend={self.backend!r})"
        )

    def _check_op(self, op: str) -> str:
        if op not in _OPS:
            raise ValueError(f"op must be one of {_OPS}, got {op!r}")
        return op

    def _check_root(self, root: int) -> int:
        if not 0 <= root < self.size:
            raise ValueError(f"root {root} is not a rank of a {self.size}-rank communicator")
        return root


class SerialComm(Comm):
    """A single process: every collective returns its own input.

    Example:
        >>> c = SerialComm()
        >>> recv, counts = c.alltoallv(np.arange(3, dtype=np.uint64)[:, None], [3])
        >>> recv.ravel().tolist(), counts.tolist()
        ([0, 1, 2], [3])
    """

    backend = "serial"

    def barrier(self) -> None:
        pass

    def allreduce(self, x, op: str = "sum"):
        self._check_op(op)
        return np.array(x, copy=True) if isinstance(x, np.ndarray) else x

    def bcast(self, x, root: int = 0):
        self._check_root(root)
        return np.array(x, copy=True)

    def gather(self, x, root: int = 0) -> list:
        self._check_root(root)
        return [np.array(x, copy=True)]

    def allgather(self, x) -> list:
        return [np.array(x, copy=True)]

    def _alltoallv(self, x, counts) -> tuple[np.ndarray, np.ndarray]:
        c = _check_counts(counts, 1, x.shape[0])
        return x.copy(), c


# --- torch.distributed ---------------------------------------------------------------------------


def _torch():
    try:
        import torch
        import torch.distributed as dist
    except ImportError as e:  # pragma: no cover - torch is a test dependency
        raise ImportError(
            "TorchComm needs PyTorch: pip install torch (see the README for the CPU build)"
        ) from e
    if not dist.is_available():  # pragma: no cover
        raise RuntimeError("this PyTorch build has no torch.distributed")
    return torch, dist


def default_torch_backend() -> str:
    """ "nccl" when every process on this host can have a GPU of its own (``LOCAL_WORLD_SIZE``
    from torchrun, default 1), else "gloo": NCCL refuses two ranks on one GPU.

    Example:
        >>> default_torch_backend() in ("nccl", "gloo")
        True
    """
    torch, _ = _torch()
    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    fits = torch.cuda.is_available() and local_ranks <= torch.cuda.device_count()
    return "nccl" if fits else "gloo"


class TorchComm(Comm):
    """torch.distributed: gloo for CPU tensors, NCCL for CUDA tensors.

    Takes an existing default process group, or creates one from the environment that torchrun
    sets (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``) with a collective timeout.

    Collectives accept numpy arrays or torch tensors and return the same kind: numpy arrays are
    moved to the group's device (the CPU for gloo, ``cuda:LOCAL_RANK`` for NCCL) and back; torch
    tensors stay on the device (so GPU data never leaves it on NCCL). 64-bit unsigned data travel
    as int64 bit patterns (the engines have no uint64 reductions).

    Args:
        backend: "gloo" or "nccl" (default: nccl when every process of this host can have a
            GPU of its own, else gloo: NCCL refuses two ranks on one GPU).
        timeout: collective timeout in seconds (default `comm_timeout()`).
        init_method, rank, world_size: passed to ``init_process_group`` when no group exists
            (default: ``env://``, i.e. the torchrun variables).

    Example:
        >>> # torchrun --nproc-per-node 2 script.py
        >>> comm = TorchComm()  # doctest: +SKIP
        >>> comm.allreduce(comm.rank + 1)  # doctest: +SKIP
        3
    """

    def __init__(
        self,
        backend: str | None = None,
        timeout: float | None = None,
        init_method: str | None = None,
        rank: int | None = None,
        world_size: int | None = None,
    ):
        torch, dist = _torch()
        self.timeout = comm_timeout(timeout)
        self._owns_group = False
        if not dist.is_initialized():
            import datetime

            if backend is None:
                backend = default_torch_backend()
            kw: dict[str, Any] = {"timeout": datetime.timedelta(seconds=self.timeout)}
            if init_method is not None:
                kw["init_method"] = init_method
            if rank is not None:
                kw["rank"] = rank
            if world_size is not None:
                kw["world_size"] = world_size
            if backend == "nccl":
                local = int(os.environ.get("LOCAL_RANK", rank if rank is not None else 0))
                torch.cuda.set_device(local % max(1, torch.cuda.device_count()))
            try:
                dist.init_process_group(backend, **kw)
            except (RuntimeError, ValueError) as e:
                raise CommError(
                    f"torch.distributed could not start ({backend}): {e}. Launch with torchrun, "
                    "or set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT"
                ) from e
            self._owns_group = True
        self.backend = str(dist.get_backend())
        self.rank = dist.get_rank()
        self.size = dist.get_world_size()
        if "nccl" in self.backend:
            self.device = torch.device("cuda", torch.cuda.current_device())
        else:
            self.device = torch.device("cpu")

    def close(self) -> None:
        _, dist = _torch()
        if self._owns_group and dist.is_initialized():
            dist.destroy_process_group()
        self._owns_group = False

    # conversion: numpy <-> tensor on the group's device
    def _tensor(self, x):
        torch, _ = _torch()
        if isinstance(x, torch.Tensor):
            t = x.to(self.device).contiguous()
            if t.dtype == torch.uint64:
                t = t.view(torch.int64)
            return t, False, x.dtype
        a = np.ascontiguousarray(np.asarray(x))
        dt = a.dtype
        if dt == np.uint64:
            a = a.view(np.int64)
        return torch.from_numpy(a).to(self.device), True, dt

    def _back(self, t, was_numpy: bool, dtype):
        torch, _ = _torch()
        if was_numpy:
            a = t.cpu().numpy()
            return a.view(dtype) if a.dtype != dtype else a
        return t.view(torch.uint64) if dtype == torch.uint64 else t

    def _run(self, what: str, fn, *args, **kw):
        try:
            return fn(*args, **kw)
        except RuntimeError as e:  # DistBackendError and gloo/NCCL errors derive from it
            raise CommError(
                f"rank {self.rank} of {self.size}: {what} failed on torch.distributed "
                f"({self.backend}, timeout {self.timeout:g} s): another rank died or did not "
                f"answer in time. Cause: {e}"
            ) from e

    def _counts(self, values) -> list[int]:
        """Allgather one int64 vector per rank; returns the (size, len) table as lists."""
        torch, dist = _torch()
        v = torch.as_tensor(np.asarray(values, dtype=np.int64)).to(self.device)
        out = [torch.empty_like(v) for _ in range(self.size)]
        self._run("allgather", dist.all_gather, out, v)
        return [o.cpu().tolist() for o in out]

    def barrier(self) -> None:
        _, dist = _torch()
        if "nccl" in self.backend:
            self._run("barrier", dist.barrier, device_ids=[self.device.index])
        else:
            self._run("barrier", dist.barrier)

    def allreduce(self, x, op: str = "sum"):
        torch, dist = _torch()
        self._check_op(op)
        scalar = np.ndim(x) == 0 and not isinstance(x, torch.Tensor)
        t, was_np, dt = self._tensor(np.asarray(x) if scalar else x)
        if isinstance(dt, np.dtype) and dt == np.uint64 and op != "sum":
            raise TypeError("max/min of uint64 data are not supported; use int64")
        t = t.clone()
        red = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}[op]
        self._run("allreduce", dist.all_reduce, t, op=red)
        out = self._back(t, was_np, dt)
        return out.item() if scalar else out

    def bcast(self, x, root: int = 0):
        torch, dist = _torch()
        self._check_root(root)
        # header: dtype code and shape, so that non-root ranks may pass None
        hdr = np.full(8, -1, dtype=np.int64)
        if self.rank == root:
            if isinstance(x, torch.Tensor):
                raise TypeError("bcast takes numpy arrays")
            a = np.ascontiguousarray(np.asarray(x))
            if a.ndim > 6:
                raise ValueError("bcast supports up to 6 dimensions")
            hdr[0] = ord(a.dtype.char)
            hdr[1] = a.ndim
            hdr[2 : 2 + a.ndim] = a.shape
        h = torch.from_numpy(hdr).to(self.device)
        self._run("bcast", dist.broadcast, h, src=root)
        hdr = h.cpu().numpy()
        dtype = np.dtype(chr(int(hdr[0])))
        shape = tuple(int(s) for s in hdr[2 : 2 + int(hdr[1])])
        if self.rank == root:
            buf = a.copy()
        else:
            buf = np.empty(shape, dtype=dtype)
        nbytes = buf.nbytes
        raw = buf.reshape(-1).view(np.uint8)
        t = torch.from_numpy(raw).to(self.device) if nbytes else None
        if t is not None:
            self._run("bcast", dist.broadcast, t, src=root)
            raw[:] = t.cpu().numpy()
        return buf

    def alltoallv(self, x, counts):
        """As `Comm.alltoallv`; tensors move on this group's device (NCCL: GPU to GPU) and come
        back on their own device, any dtype (complex as pairs of reals, bool as bytes)."""
        torch, dist = _torch()
        if not isinstance(x, torch.Tensor):
            return self._alltoallv(np.asarray(x), counts)
        home, dtype = x.device, x.dtype
        c = _check_counts(counts, self.size, x.shape[0])
        t = x.detach().to(self.device)
        if t.is_complex():
            t = torch.view_as_real(t)
        if t.dtype == torch.bool:
            t = t.to(torch.uint8)
        t = t.contiguous()
        shape = tuple(t.shape[1:])
        per = int(np.prod(shape)) if shape else 1
        send = torch.as_tensor(c).to(self.device)
        recv = torch.empty_like(send)
        self._run("alltoallv (counts)", dist.all_to_all_single, recv, send)
        rc = recv.cpu().numpy().astype(np.int64)
        out = torch.empty(int(rc.sum()) * per, dtype=t.dtype, device=self.device)
        self._run(
            "alltoallv",
            dist.all_to_all_single,
            out,
            t.reshape(-1),
            output_split_sizes=(rc * per).tolist(),
            input_split_sizes=(c * per).tolist(),
        )
        out = out.reshape(-1, *shape)
        if dtype.is_complex:
            out = torch.view_as_complex(out.contiguous())
        elif out.dtype != dtype:
            out = out.to(dtype)
        return out.to(home), rc

    def _alltoallv(self, x, counts):
        torch, dist = _torch()
        like = np.asarray(x)
        c = _check_counts(counts, self.size, like.shape[0])
        t = torch.from_numpy(_rows_as_words(like).view(np.int64)).to(self.device)
        send = torch.as_tensor(c).to(self.device)
        recv = torch.empty_like(send)
        self._run("alltoallv (counts)", dist.all_to_all_single, recv, send)
        rc = recv.cpu().numpy().astype(np.int64)
        out = torch.empty((int(rc.sum()), *t.shape[1:]), dtype=t.dtype, device=self.device)
        self._run(
            "alltoallv",
            dist.all_to_all_single,
            out,
            t,
            output_split_sizes=rc.tolist(),
            input_split_sizes=c.tolist(),
        )
        words = out.cpu().numpy().view(np.uint64)
        return _words_as_rows(words, like), rc

    def gather(self, x, root: int = 0):
        self._check_root(root)
        a = np.asarray(x)
        counts = np.zeros(self.size, np.int64)
        counts[root] = a.shape[0]
        recv, rc = self.alltoallv(a, counts)
        if self.rank != root:
            return None
        return np.split(recv, np.cumsum(rc)[:-1])

    def allgather(self, x) -> list:
        torch, dist = _torch()
        a = np.ascontiguousarray(np.asarray(x))
        rows = self._counts([a.shape[0] if a.ndim else -1])
        n_max = max(max(r[0], 1) for r in rows)
        if a.ndim == 0:
            pad = a.reshape(1)
        else:
            pad = np.zeros((n_max, *a.shape[1:]), dtype=a.dtype)
            pad[: a.shape[0]] = a
        raw = pad.reshape(pad.shape[0], -1).view(np.uint8) if pad.size else pad
        t = torch.from_numpy(np.ascontiguousarray(raw)).to(self.device)
        out = [torch.empty_like(t) for _ in range(self.size)]
        self._run("allgather", dist.all_gather, out, t)
        res = []
        for r, o in zip(rows, out, strict=True):
            got = o.cpu().numpy()
            if a.ndim == 0:
                res.append(got.view(a.dtype).reshape(()))
            else:
                res.append(got.view(a.dtype).reshape(pad.shape)[: r[0]].copy())
        return res


# --- mpi4py --------------------------------------------------------------------------------------


class MPIComm(Comm):
    """mpi4py over ``MPI.COMM_WORLD`` (or a given communicator).

    ``alltoallv`` uses ``Alltoallv`` with counts and displacements in 8-byte words on uint64
    buffers. MPI has no collective timeouts: under ``mpiexec``/``mpirun`` a rank that exits
    abnormally aborts the job; run scripts as ``python -m mpi4py script.py`` so that an uncaught
    exception calls ``MPI_Abort``.

    Example:
        >>> # mpiexec -n 2 python -m mpi4py script.py
        >>> comm = MPIComm()  # doctest: +SKIP
        >>> comm.allreduce(comm.rank + 1)  # doctest: +SKIP
        3
    """

    backend = "mpi"

    def __init__(self, comm=None):
        try:
            from mpi4py import MPI
        except ImportError as e:
            raise ImportError(
                "MPIComm needs mpi4py and an MPI library (Debian: apt-get install mpich "
                "libmpich-dev; then pip install --no-binary mpi4py mpi4py)"
            ) from e
        self._MPI = MPI
        self.comm = MPI.COMM_WORLD if comm is None else comm
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()

    def barrier(self) -> None:
        self.comm.Barrier()

    def allreduce(self, x, op: str = "sum"):
        MPI = self._MPI
        self._check_op(op)
        mop = {"sum": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN}[op]
        if np.ndim(x) == 0 and not isinstance(x, np.ndarray):
            return self.comm.allreduce(x, op=mop)
        a = np.ascontiguousarray(x)
        out = np.empty_like(a)
        self.comm.Allreduce(a, out, op=mop)
        return out

    def bcast(self, x, root: int = 0):
        self._check_root(root)
        hdr = None
        if self.rank == root:
            a = np.ascontiguousarray(np.asarray(x))
            hdr = (a.dtype.str, a.shape)
        dtype, shape = self.comm.bcast(hdr, root=root)
        buf = a.copy() if self.rank == root else np.empty(shape, dtype=np.dtype(dtype))
        if buf.nbytes:
            self.comm.Bcast(buf.reshape(-1).view(np.uint8), root=root)
        return buf

    def gather(self, x, root: int = 0):
        self._check_root(root)
        a = np.asarray(x)
        w = _rows_as_words(a)
        rows = self.comm.gather(a.shape[0], root=root)
        if self.rank != root:
            self.comm.Gatherv([w.reshape(-1), self._MPI.UINT64_T], None, root=root)
            return None
        k = w.shape[1]
        counts = np.asarray(rows, np.int64) * k
        buf = np.empty((int(np.sum(rows)), k), np.uint64)
        displs = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
        U = self._MPI.UINT64_T
        self.comm.Gatherv([w.reshape(-1), U], [buf.reshape(-1), (counts, displs), U], root=root)
        return np.split(_words_as_rows(buf, a), np.cumsum(rows)[:-1])

    def allgather(self, x) -> list:
        a = np.asarray(x)
        if a.ndim == 0:
            return [np.asarray(v) for v in self.comm.allgather(a)]
        w = _rows_as_words(a)
        rows = self.comm.allgather(a.shape[0])
        k = w.shape[1]
        counts = np.asarray(rows, np.int64) * k
        displs = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
        buf = np.empty((int(np.sum(rows)), k), np.uint64)
        U = self._MPI.UINT64_T
        self.comm.Allgatherv([w.reshape(-1), U], [buf.reshape(-1), (counts, displs), U])
        return np.split(_words_as_rows(buf, a), np.cumsum(rows)[:-1])

    def _alltoallv(self, x, counts):
        a = np.asarray(x)
        c = _check_counts(counts, self.size, a.shape[0])
        w = _rows_as_words(a)
        k = w.shape[1]
        rc = np.empty(self.size, np.int64)
        self.comm.Alltoall(c, rc)
        recv = np.empty((int(rc.sum()), k), np.uint64)
        sd = np.concatenate([[0], np.cumsum(c)[:-1]]).astype(np.int64)
        rd = np.concatenate([[0], np.cumsum(rc)[:-1]]).astype(np.int64)
        U = self._MPI.UINT64_T
        self.comm.Alltoallv(
            [w.reshape(-1), (c * k, sd * k), U], [recv.reshape(-1), (rc * k, rd * k), U]
        )
        return _words_as_rows(recv, a), rc


# --- threads of one process ----------------------------------------------------------------------


class _ThreadShared:
    def __init__(self, size: int, timeout: float):
        import threading

        self.barrier = threading.Barrier(size, timeout=timeout)
        self.slots: list = [None] * size


class ThreadComm(Comm):
    """One of P ranks that are threads of this process (see `run_ranks`): the collectives meet
    at a barrier with a timeout, so a rank that stops calling them makes the others raise
    `CommError` instead of hanging. For in-process studies of the distributed algorithms
    (`cuscikit.parallel.dedup.simulate_partition`) and for fast tests of collective code."""

    backend = "threads"

    def __init__(self, shared: _ThreadShared, rank: int, size: int):
        self._shared, self.rank, self.size = shared, rank, size

    def _wait(self) -> None:
        import threading

        try:
            self._shared.barrier.wait()
        except threading.BrokenBarrierError as e:
            raise CommError(f"rank {self.rank} of {self.size}: another rank stopped") from e

    def _exchange(self, payload) -> list:
        """Every rank's payload, on every rank."""
        self._shared.slots[self.rank] = payload
        self._wait()
        got = list(self._shared.slots)
        self._wait()  # nobody overwrites a slot before everyone has read it
        return got

    def barrier(self) -> None:
        self._exchange(None)

    def allreduce(self, x, op: str = "sum"):
        self._check_op(op)
        got = self._exchange(np.array(x, copy=True))
        red = {"sum": np.sum, "max": np.max, "min": np.min}[op](np.stack(got), axis=0)
        if isinstance(x, np.ndarray):
            return red.astype(got[0].dtype)
        return red.item()

    def bcast(self, x, root: int = 0):
        self._check_root(root)
        got = self._exchange(None if x is None else np.array(x, copy=True))
        return np.array(got[root], copy=True)

    def gather(self, x, root: int = 0):
        self._check_root(root)
        got = self._exchange(np.array(x, copy=True))
        return [np.array(g, copy=True) for g in got] if self.rank == root else None

    def allgather(self, x) -> list:
        return [np.array(g, copy=True) for g in self._exchange(np.array(x, copy=True))]

    def _alltoallv(self, x, counts):
        c = _check_counts(counts, self.size, x.shape[0])
        got = self._exchange((np.ascontiguousarray(x), np.concatenate([[0], np.cumsum(c)])))
        parts = [xs[starts[self.rank] : starts[self.rank + 1]] for xs, starts in got]
        rc = np.array([len(p) for p in parts], dtype=np.int64)
        out = np.concatenate(parts) if parts else x[:0]
        self._wait()  # the senders' arrays stay untouched until every rank has copied
        return out, rc


def run_ranks(size: int, fn, timeout: float = 60.0) -> list:
    """``[fn(comm_0), ..., fn(comm_{P-1})]``, each call on its own thread with a `ThreadComm`;
    re-raises the first exception of any rank (the others then stop with `CommError`).

    Example:
        >>> run_ranks(3, lambda comm: comm.allreduce(comm.rank + 1))
        [6, 6, 6]
    """
    import threading

    if int(size) != size or size < 1:
        raise ValueError(f"the number of ranks must be a positive integer, got {size}")
    shared = _ThreadShared(size, timeout)
    results: list = [None] * size
    errors: list = [None] * size

    def target(r: int) -> None:
        try:
            results[r] = fn(ThreadComm(shared, r, size))
        except BaseException as e:  # noqa: BLE001 - handed to the caller below
            errors[r] = e
            shared.barrier.abort()  # wake the others instead of leaving them waiting

    threads = [threading.Thread(target=target, args=(r,)) for r in range(size)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    first = next((e for e in errors if e is not None and not isinstance(e, CommError)), None)
    first = first or next((e for e in errors if e is not None), None)
    if first is not None:
        raise first
    return results


# --- discovery -----------------------------------------------------------------------------------

_MPI_ENV = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS")


def detect_backend(environ=None) -> str:
    """Which engine the environment asks for: "torch", "mpi" or "serial" (starts nothing).

    torch.distributed when a default process group already exists or torchrun's variables are
    set (``WORLD_SIZE`` with ``MASTER_ADDR``); MPI when a launcher's variables are set
    (Open MPI: ``OMPI_COMM_WORLD_SIZE``; MPICH/Hydra and Intel MPI: ``PMI_SIZE``; PMIx:
    ``PMIX_RANK``); otherwise a single process.

    Example:
        >>> detect_backend({"OMPI_COMM_WORLD_SIZE": "4"})
        'mpi'
        >>> detect_backend({})
        'serial'
    """
    env = os.environ if environ is None else environ
    if environ is None:
        import sys

        dist = sys.modules.get("torch.distributed")
        if dist is not None and dist.is_available() and dist.is_initialized():
            return "torch"
    if "WORLD_SIZE" in env and "MASTER_ADDR" in env:
        return "torch"
    if any(k in env for k in _MPI_ENV):
        return "mpi"
    return "serial"


_LOCAL_RANK_ENV = (
    "LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "MPI_LOCALRANKID",
    "PMI_LOCAL_RANK",
    "SLURM_LOCALID",
)


def local_rank(environ=None) -> int:
    """This process's rank among the ranks of its host, from the launcher's environment
    (torchrun, Open MPI, MPICH/Hydra, Slurm); 0 outside a launcher. One rank per GPU uses
    ``cuda:local_rank``.

    Example:
        >>> local_rank({"OMPI_COMM_WORLD_LOCAL_RANK": "3"})
        3
        >>> local_rank({})
        0
    """
    env = os.environ if environ is None else environ
    for key in _LOCAL_RANK_ENV:
        if key in env:
            return int(env[key])
    return 0


def get_comm(backend: str = "auto", **kw) -> Comm:
    """The communicator of this process.

    Args:
        backend: "auto" (from the environment, see `detect_backend`), "serial", "torch" or "mpi".
        **kw: passed to the backend's constructor (e.g. ``timeout=`` for torch).

    Returns:
        A `Comm`. ``get_comm()`` outside any launcher gives a `SerialComm`.

    Example:
        >>> get_comm("serial").size
        1
    """
    if backend == "auto":
        backend = detect_backend()
    if backend == "serial":
        return SerialComm()
    if backend in ("torch", "gloo", "nccl"):
        if backend != "torch":
            kw.setdefault("backend", backend)
        return TorchComm(**kw)
    if backend == "mpi":
        return MPIComm(**kw)
    raise ValueError(
        f"unknown communicator backend {backend!r}: auto, serial, torch, gloo, nccl, mpi"
    )
