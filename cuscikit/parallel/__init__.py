"""Communicators (single process, threads, torch.distributed, mpi4py) and the distributed de-dup.

Importing this package starts nothing: `get_comm` discovers the ranks from the environment
(torchrun or mpirun) when called.

Example:
    >>> import numpy as np
    >>> from cuscikit.parallel import get_comm, global_dedup
    >>> comm = get_comm()  # SerialComm outside a launcher
    >>> global_dedup(np.array([[4], [2], [4]], dtype=np.uint64), comm).unique.ravel().tolist()
    [2, 4]
"""

from cuscikit.parallel.comm import (
    Comm,
    CommError,
    MPIComm,
    SerialComm,
    ThreadComm,
    TorchComm,
    detect_backend,
    get_comm,
    run_ranks,
)
from cuscikit.parallel.dedup import (
    DEFAULT_SAMPLES_PER_RANK,
    DedupMetrics,
    GlobalDedup,
    centralised_dedup,
    choose_splitters,
    global_dedup,
    simulate_partition,
)

__all__ = [
    "DEFAULT_SAMPLES_PER_RANK",
    "Comm",
    "CommError",
    "DedupMetrics",
    "GlobalDedup",
    "MPIComm",
    "SerialComm",
    "ThreadComm",
    "TorchComm",
    "centralised_dedup",
    "choose_splitters",
    "detect_backend",
    "get_comm",
    "global_dedup",
    "run_ranks",
    "simulate_partition",
]
