"""What the subcommands share: the one-line error, the report (text and the JSON last line),
loading a system from a file or a dataset name, byte counts, the communicator."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path


class UsageError(Exception):
    """An error in what the user asked for: reported in one line, exit status 2."""


# Exit statuses: every command ends with one of these (and, with --json, a last stdout line
# {"status": "ok" | "stopped" | "error", ...}).
EXIT_OK = 0
EXIT_FAILED = 1  # a failure while running (another rank died, an unexpected error)
EXIT_USAGE = 2  # bad input, reported before any work
EXIT_STOPPED = 3  # the run stopped early (non-finite energies, a signal); it can be resumed
EXIT_INTERRUPTED = 130  # Ctrl-C outside an iteration loop


def finite_float(text: str) -> float:
    """An argparse type: a float that is neither NaN nor infinite."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def positive_int(text: str) -> int:
    value = non_negative_int(text)
    if value == 0:
        raise argparse.ArgumentTypeError("must be >= 1, got 0")
    return value


def writable_folder(path: str | Path) -> Path:
    """Create `path` if needed and check that files can be written there (before any work)."""
    import tempfile

    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=path, suffix=".probe")
    except OSError as exc:
        raise UsageError(f"cannot write to {path}: {exc.strerror or exc}") from None
    import os

    os.close(fd)
    os.remove(probe)
    return path


def rank_of(args) -> int:
    comm = getattr(args, "comm", None)
    return comm.rank if comm is not None else 0


def _finite(obj):
    """JSON has no NaN or infinity: such numbers become null."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def emit(args, report: dict, lines: list[str]) -> None:
    """Print the report's lines and, with --json, the report as the last line (rank 0 only);
    the JSON carries ``"status"`` ("ok" unless the report says otherwise) and the run's
    ``"warnings"`` when there were any."""
    if rank_of(args) != 0:  # on several ranks, rank 0 reports
        return
    for line in lines:
        print(line)
    if getattr(args, "json", False):
        report = {"status": "ok", **report}
        if getattr(args, "warnings", None):
            report["warnings"] = list(args.warnings)
        print(json.dumps(_finite(report), allow_nan=False), flush=True)
    args.reported = True


def emit_error(args, exc: BaseException, status: str = "error") -> None:
    """The one-line error on stderr and, with --json, ``{"status": ..., "error": ...}`` as the
    last stdout line (rank 0 only)."""
    error_line(args, exc)
    if getattr(args, "json", False) and rank_of(args) == 0 and not getattr(args, "reported", False):
        report = {
            "status": status,
            "command": getattr(args, "command", None),
            "error": str(exc) or type(exc).__name__,
            "error_type": type(exc).__name__,
        }
        if getattr(args, "warnings", None):
            report["warnings"] = list(args.warnings)
        print(json.dumps(_finite(report), allow_nan=False), flush=True)


def error_line(args, exc: BaseException) -> None:
    comm = getattr(args, "comm", None)
    where = f" (rank {comm.rank} of {comm.size})" if comm is not None and comm.size > 1 else ""
    print(f"cuscikit {args.command}{where}: error: {exc}", file=sys.stderr)


FCI_MAX_DET = 5e6
"""The largest determinant space the command line solves by FCI unasked (`cuscikit fci`'s
--max-det default, `cuscikit nnqs --reference fci`)."""

SYSTEM_HELP = (
    "FCIDUMP path, bundled dataset name (e.g. N2, LiH) or Hubbard lattice (e.g. "
    "Hubbard-8-chain-U4, Hubbard-4x3-open-U8; half filling)"
)


def load_molecule(spec: str):
    """A Molecule from an FCIDUMP path, a bundled dataset name or a Hubbard lattice name
    (`cuscikit.chem.lattice.LATTICE_NAMES`)."""
    from cuscikit.chem import Molecule
    from cuscikit.chem.datasets import UnknownDatasetError

    path = Path(spec)
    if path.exists():
        return Molecule.from_fcidump(path)
    try:
        return Molecule.load(spec)
    except UnknownDatasetError as exc:
        raise UsageError(
            f"{spec!r} is neither a file, a bundled dataset nor a lattice name: {exc}"
        ) from None
    except ValueError as exc:  # a malformed lattice name
        raise UsageError(str(exc)) from None


def parse_bytes(text: str) -> int:
    """A byte count: an integer, optionally in scientific notation or with a binary suffix
    (``8000000000``, ``8e9``, ``16GiB``, ``512MiB``)."""
    units = {"KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
    scale = 1
    for unit, factor in units.items():
        if text.endswith(unit):
            text, scale = text[: -len(unit)], factor
            break
    try:
        value = float(text) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a byte count: {text!r} (e.g. 8000000000, 8e9, 16GiB)"
        ) from None
    if not (math.isfinite(value) and value > 0) or value != int(value):
        raise argparse.ArgumentTypeError(f"a byte count must be a positive integer, got {text!r}")
    return int(value)


def require_cuda(device: str) -> None:
    """`--device DEVICE` needs the CUDA kernels and a GPU: a UsageError before any work if not."""
    from cuscikit.backends.loader import CudaUnavailableError, cuda

    try:
        cuda()
    except CudaUnavailableError as exc:
        raise UsageError(f"--device {device}: {exc}") from None


def communicator(args):
    """The ranks of this run (one process outside a launcher); kept on `args` for reporting."""
    from cuscikit.parallel import get_comm

    try:
        comm = get_comm("auto")
    except ImportError as exc:  # e.g. mpirun without mpi4py
        raise UsageError(f"started by a launcher, but its engine is missing: {exc}") from None
    args.comm = comm
    return comm


def add_json(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--json", action="store_true", help="print one JSON object as the last line of stdout"
    )
