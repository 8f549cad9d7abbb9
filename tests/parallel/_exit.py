"""How the rank scripts end: flush, then leave without the interpreter's finalization.

A rank that has written its report and closed its communicator has done everything a test
checks. What would still run is Python's finalization, during which torch's background
threads (gloo's, the autograd engine's) can race the interpreter's teardown and abort an
otherwise finished process now and then; the launcher then fails the test with nothing to show
for it. `os._exit` skips that finalization (nothing is left to flush but the standard streams,
and MPI, which must be finalised by every rank that initialised it).
"""

from __future__ import annotations

import os
import sys


def exit_now(code: int) -> None:
    """Flush stdout and stderr, finalise MPI if this rank uses it, and end the process with
    `code`, skipping the interpreter's finalization."""
    sys.stdout.flush()
    sys.stderr.flush()
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        mpi.Finalize()
    os._exit(code)
