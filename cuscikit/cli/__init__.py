"""The `cuscikit` command line: one module per subcommand, registered in `COMMANDS`.

Every command prints a human-readable report (``CUSCIKIT_DEBUG=1`` adds the traceback of an
unexpected failure to its one-line message); with `--json` the last line of stdout is one JSON
object with a ``"status"`` ("ok", "stopped" or "error"), for scripts and batch jobs, whatever
happens. Exit statuses (`cuscikit.cli.common`): 0 done, 2 bad input (a one-line message before
any work), 3 stopped early but resumable (non-finite energies, SIGINT or SIGTERM: the checkpoint
holds the last good iteration), 1 a failure while running, 130 Ctrl-C outside a run.

`nnqs` and `demo` run unchanged on several ranks: ``mpirun -n 4 cuscikit nnqs N2`` or
``torchrun --nproc-per-node 4 -m cuscikit nnqs N2`` (the ranks are found from the launcher's
environment). Rank 0 alone prints and writes files; a rank that dies makes the others stop with
a one-line error (exit status 1).

A subcommand is a module of this package with ``register(subparsers)``, which adds its parser
and sets ``func`` (called with the parsed arguments, returning the exit status).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from cuscikit.cli.common import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    UsageError,
    emit_error,
)

# The subcommand modules, in the order `cuscikit --help` lists them ("nnqs" adds "demo" too).
COMMANDS = ("nnqs", "info", "fcidump", "fci", "guga", "ising")


class _Parser(argparse.ArgumentParser):
    """argparse, plus the JSON error line when the command line asked for --json."""

    json_requested = False

    def error(self, message: str):
        if _Parser.json_requested:
            import json

            print(
                json.dumps(
                    {
                        "status": "error",
                        "command": self.prog.split()[-1],
                        "error": message,
                        "error_type": "UsageError",
                    }
                ),
                flush=True,
            )
        super().error(message)


def build_parser() -> argparse.ArgumentParser:
    from cuscikit import __version__

    p = _Parser(
        prog="cuscikit",
        description="GPU-accelerated configuration interaction: NNQS-SCI, GUGA CI and dSB "
        "Ising from the command line.",
    )
    p.add_argument("--version", action="version", version=f"cuscikit {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"cuscikit.cli.{name}").register(sub)
    return p


def _finish(args, status: int) -> int:
    """Release the communicator. On several ranks a failure ends this rank at once: under MPI
    it aborts the job (MPI has no timeouts, a rank left waiting in a collective would hang);
    under torch.distributed the process exits without tearing down a group whose peers may
    be gone."""
    comm = getattr(args, "comm", None)
    if comm is not None and comm.size > 1 and status != 0:
        sys.stdout.flush()
        sys.stderr.flush()
        if comm.backend == "mpi":
            comm.comm.Abort(status)
        os._exit(status)
    if comm is not None:
        comm.close()
    return status


class _RecordWarnings:
    """Warnings are shown on stderr as usual and also collected (``"warnings"`` in the JSON
    report), so that a script reading only the JSON still sees them."""

    def __init__(self, seen: list[str]):
        self.seen = seen

    def __enter__(self):
        import warnings

        self.show = warnings.showwarning

        def record(message, category, filename, lineno, file=None, line=None):
            self.seen.append(f"{category.__name__}: {message}")
            self.show(message, category, filename, lineno, file, line)

        warnings.showwarning = record
        return self

    def __exit__(self, *exc):
        import warnings

        warnings.showwarning = self.show


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if len(argv) >= 2 and argv[0] == "ising" and argv[1] in ("serve", "load"):
        argv = [f"ising {argv[1]}", *argv[2:]]  # `cuscikit ising serve`: a parser of its own
    _Parser.json_requested = "--json" in argv
    args = build_parser().parse_args(argv)
    args.warnings = []
    with _RecordWarnings(args.warnings):
        return _run(args)


def _run(args) -> int:
    from cuscikit.parallel.comm import CommError

    try:
        status = args.func(args)
    except UsageError as exc:
        emit_error(args, exc)
        status = EXIT_USAGE
    except (ValueError, OSError, MemoryError) as exc:  # bad files, too big: one clear line
        emit_error(args, exc)
        status = EXIT_USAGE
    except CommError as exc:  # another rank died or stopped answering
        emit_error(args, exc)
        status = EXIT_FAILED
    except KeyboardInterrupt:
        emit_error(args, KeyboardInterrupt("interrupted (Ctrl-C)"), status="stopped")
        status = EXIT_INTERRUPTED
    except Exception as exc:  # a failure while running: one line (a traceback on request)
        comm = getattr(args, "comm", None)
        emit_error(args, exc)
        if os.environ.get("CUSCIKIT_DEBUG") or (comm is not None and comm.size > 1):
            import traceback

            traceback.print_exc()  # on several ranks, then end every rank
        status = EXIT_FAILED
    return _finish(args, status)


if __name__ == "__main__":
    sys.exit(main())
