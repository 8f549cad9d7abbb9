"""P ranks as P threads of this process: a `Comm` for fast in-process tests of collective code.

`run_ranks(P, fn)` calls ``fn(comm)`` on P threads, each with its own `ThreadComm`, and returns
the P results (re-raising the first exception). Collectives meet at a barrier with a timeout,
so a rank that stops calling them makes the others raise `CommError` instead of hanging.
The real engines (torch.distributed, mpi4py) are tested in test_multiprocess.py.
"""

from __future__ import annotations

import threading

import numpy as np

from cuscikit.parallel.comm import Comm, CommError, _check_counts, _rows_as_words


class _Shared:
    def __init__(self, size: int, timeout: float):
        self.barrier = threading.Barrier(size, timeout=timeout)
        self.slots: list = [None] * size


class ThreadComm(Comm):
    backend = "threads"

    def __init__(self, shared: _Shared, rank: int, size: int):
        self._shared, self.rank, self.size = shared, rank, size

    def _wait(self) -> None:
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

    def alltoallv(self, x, counts):
        x = np.asarray(x)
        c = _check_counts(counts, self.size, x.shape[0])
        _rows_as_words(x)
        got = self._exchange((x.copy(), np.concatenate([[0], np.cumsum(c)])))
        parts = [xs[starts[self.rank] : starts[self.rank + 1]] for xs, starts in got]
        rc = np.array([len(p) for p in parts], dtype=np.int64)
        return np.concatenate(parts) if parts else x[:0], rc


def run_ranks(size: int, fn, timeout: float = 60.0) -> list:
    """``[fn(comm_0), ..., fn(comm_{P-1})]``, each on its own thread."""
    shared = _Shared(size, timeout)
    results: list = [None] * size
    errors: list = [None] * size

    def target(r: int) -> None:
        try:
            results[r] = fn(ThreadComm(shared, r, size))
        except BaseException as e:  # noqa: BLE001 - handed to the caller below
            errors[r] = e
            shared.barrier.abort()  # wake the others instead of leaving them waiting

    threads = [threading.Thread(target=target, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    first = next((e for e in errors if e is not None and not isinstance(e, CommError)), None)
    first = first or next((e for e in errors if e is not None), None)
    if first is not None:
        raise first
    return results
