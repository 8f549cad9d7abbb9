"""The `cuscikit` command line.

Every command prints a human-readable report; with `--json` the last line of stdout is one JSON
object, for scripts and batch jobs. Bad input exits with status 2 and a one-line message.

`nnqs` and `demo` run unchanged on several ranks: ``mpirun -n 4 cuscikit nnqs N2`` or
``torchrun --nproc-per-node 4 -m cuscikit nnqs N2`` (the ranks are found from the launcher's
environment). Rank 0 alone prints and writes files; a rank that dies makes the others stop with
a one-line error (exit status 1).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

# The demo's N2 run with the default settings, shortened to a few minutes on 2 CPU cores: 400
# iterations took 315 s and ended at +0.310 mHa (within 1.6 mHa from iteration 313; 2026-11-30).
DEMO_ITERS = 400
# Plain numbers, so that building the parser does not import PyTorch.
from cuscikit.nnqs.defaults import (  # noqa: E402
    DEFAULT_INNER_STEPS,
    DEFAULT_ITERATIONS,
    DEFAULT_LR_DECAY_FROM,
    DEFAULT_LR_FINAL,
    DEFAULT_MAX_SPACE,
    DEFAULT_TOPK,
)


class UsageError(Exception):
    """An error in what the user asked for: reported in one line, exit status 2."""


def _load_molecule(spec: str):
    """A Molecule from an FCIDUMP path or a bundled dataset name."""
    from cuscikit.chem import Molecule
    from cuscikit.chem.datasets import UnknownDatasetError

    path = Path(spec)
    if path.exists():
        return Molecule.from_fcidump(path)
    try:
        return Molecule.load(spec)
    except UnknownDatasetError as exc:
        raise UsageError(f"{spec!r} is neither a file nor a bundled dataset: {exc}") from None


def _rank(args) -> int:
    comm = getattr(args, "comm", None)
    return comm.rank if comm is not None else 0


def _emit(args, report: dict, lines: list[str]) -> None:
    if _rank(args) != 0:  # on several ranks, rank 0 reports
        return
    for line in lines:
        print(line)
    if getattr(args, "json", False):
        print(json.dumps(report))


# --- commands -------------------------------------------------------------------------------------
def cmd_info(args) -> int:
    import platform

    import numpy
    import scipy

    import cuscikit
    from cuscikit.backends.cpu import core

    info: dict = {
        "cuscikit": cuscikit.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "numpy": numpy.__version__,
        "scipy": scipy.__version__,
    }
    for mod in ("torch", "cupy", "pyscf", "mpi4py"):
        try:
            info[mod] = __import__(mod).__version__
        except Exception:  # noqa: BLE001 - optional, any import failure means "absent"
            info[mod] = None
    build = dict(core().build_info())
    info["extension"] = build
    gpus = []
    if info["torch"]:
        import torch

        if torch.cuda.is_available():
            for d in range(torch.cuda.device_count()):
                p = torch.cuda.get_device_properties(d)
                gpus.append(f"{p.name} ({p.total_memory / 2**30:.0f} GiB, sm_{p.major}{p.minor})")
    info["gpus"] = gpus
    try:  # built only where nvcc and a driver were present at install time
        from cuscikit import _cuda

        info["cuda_kernels"] = f"built for sm_{_cuda.build_arch()}"
    except ImportError:
        info["cuda_kernels"] = None
    lines = [f"cuscikit {info['cuscikit']}  (python {info['python']}, {info['platform']})"]
    for mod in ("numpy", "scipy", "torch", "cupy", "pyscf", "mpi4py"):
        lines.append(f"  {mod:8s} {info[mod] or 'not installed'}")
    lines.append(f"  extension: {build['flags']}")
    lines.append(
        f"  OpenMP: {build['openmp']}, threads: {build['max_threads']}, "
        f"max words: {build['max_words']} ({64 * build['max_words']} spin orbitals)"
    )
    lines.append("  GPUs: " + (", ".join(gpus) if gpus else "none"))
    lines.append("  CUDA kernels: " + (info["cuda_kernels"] or "not built (see README: On a GPU)"))
    _emit(args, info, lines)
    return 0


def cmd_fcidump(args) -> int:
    from cuscikit.chem import Molecule

    if args.cas is not None and (args.cas[0] < 0 or args.cas[1] <= 0):
        raise UsageError(
            f"--cas needs a non-negative electron and positive orbital count, got {args.cas}"
        )
    t0 = time.perf_counter()
    try:
        mol = Molecule(
            args.atom,
            basis=args.basis,
            charge=args.charge,
            spin=args.spin,
            frozen_core=args.frozen_core,
            cas=tuple(args.cas) if args.cas else None,
            symmetry=args.symmetry,
        )
    except ImportError as exc:
        raise UsageError(f"building integrals from atoms needs PySCF: {exc}") from None
    mol.to_fcidump(args.output)
    report = {
        "output": str(args.output),
        "norb": mol.norb,
        "nelec": list(mol.nelec),
        "e_hf": mol.e_hf,
        "e_core": mol.e_core,
        "wall_s": time.perf_counter() - t0,
    }
    _emit(args, report, [f"wrote {args.output}: {mol!r}, E_HF = {mol.e_hf:.10f}"])
    return 0


def cmd_fci(args) -> int:
    from cuscikit.sci.space import SCISpace

    if args.nroots < 1:
        raise UsageError(f"--nroots must be at least 1, got {args.nroots}")
    mol = _load_molecule(args.system)
    n_det = mol.n_determinants
    if n_det > args.max_det:
        raise UsageError(
            f"{mol.name}: the FCI space has {n_det:.3e} determinants, above --max-det "
            f"{args.max_det:.0e}; use a selected-CI method instead"
        )
    if args.nroots > n_det:
        raise UsageError(f"--nroots {args.nroots} exceeds the {n_det} determinants")
    t0 = time.perf_counter()
    space = SCISpace.full(mol)
    e = space.exact_energy(nroots=args.nroots)
    energies = [float(e)] if args.nroots == 1 else [float(v) for v in e]
    wall = time.perf_counter() - t0
    report = {
        "system": mol.name,
        "e_tot": energies[0],
        "energies": energies,
        "n_det": len(space),
        "norb": mol.norb,
        "nelec": list(mol.nelec),
        "e_hf": mol.e_hf,
        "wall_s": wall,
        "solver": "cuscikit SCISpace.full().exact_energy",
    }
    ref = (getattr(mol, "metadata", None) or {}).get("reference") or {}
    lines = [f"{mol.name}: {len(space)} determinants, norb={mol.norb}, nelec={mol.nelec}"]
    lines += [f"  root {k}: E = {v:.12f} Ha" for k, v in enumerate(energies)]
    if ref.get("energy") is not None:
        report["e_reference"] = ref["energy"]
        lines.append(
            f"  reference {ref['energy']:.10f} ({ref.get('method', '?')}): "
            f"error {energies[0] - ref['energy']:+.2e} Ha"
        )
    lines.append(f"  wall time {wall:.2f} s")
    _emit(args, report, lines)
    return 0


def _parse_bytes(text: str) -> int:
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
    if not value > 0 or value != int(value):
        raise argparse.ArgumentTypeError(f"a byte count must be a positive integer, got {text!r}")
    return int(value)


def _communicator(args):
    """The ranks of this run (one process outside a launcher); kept on `args` for reporting."""
    from cuscikit.parallel import get_comm

    try:
        comm = get_comm("auto")
    except ImportError as exc:  # e.g. mpirun without mpi4py
        raise UsageError(f"started by a launcher, but its engine is missing: {exc}") from None
    args.comm = comm
    return comm


def _nnqs_run(mol, args, *, out_dir: Path | None = None) -> dict:
    """Build the ansatz and runner from command-line settings and run NNQS-SCI (on every
    rank when started by mpirun or torchrun; rank 0 writes the files)."""
    try:
        import torch
    except ImportError:
        raise UsageError(
            "NNQS-SCI needs PyTorch: pip install torch (see the README's quick start)"
        ) from None

    from cuscikit.nnqs import Ansatz, Runner

    if args.iters < 0:
        raise UsageError(f"--iters must be non-negative, got {args.iters}")
    if args.topk < 1:
        raise UsageError(f"--topk must be at least 1, got {args.topk}")
    if not args.lr_final > 0:
        raise UsageError(f"--lr-final must be positive, got {args.lr_final}")
    if not 0 <= args.lr_decay_from < 1:
        raise UsageError(f"--lr-decay-from must be in [0, 1), got {args.lr_decay_from}")
    if args.inner_steps < 0:
        raise UsageError(f"--inner-steps must be non-negative, got {args.inner_steps}")
    if args.device not in ("cpu", "cuda") and not args.device.startswith("cuda:"):
        raise UsageError(f"unknown --device {args.device!r}: use cpu or cuda")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise UsageError("--device cuda asked for, but no CUDA GPU is available")
    comm = _communicator(args)
    dtype = {"float32": torch.float32, "float64": torch.float64}[args.dtype]
    ansatz = Ansatz.for_molecule(mol, seed=args.seed, dtype=dtype, device=args.device)
    runner = Runner(
        mol,
        ansatz,
        topk=args.topk,
        estimator=args.estimator,
        seed=args.seed,
        max_space=args.max_space,
        device=args.device,
        pipeline=args.pipeline,
        max_gpu_memory=args.max_gpu_memory,
        compile_inference=args.compile,
        inner_steps=args.inner_steps,
        comm=comm,
    )
    if args.resume:
        runner.load(args.resume)
    t0 = time.perf_counter()
    callbacks = []
    if not args.constant_lr:  # by absolute iteration: a resumed run keeps the schedule
        from cuscikit.nnqs import LearningRateDecay

        callbacks.append(
            LearningRateDecay.over_tail(args.iters, args.lr_decay_from, args.lr_final))
    runner.run(
        max(0, args.iters - runner.iteration),
        callbacks,
        progress=not args.json,
        checkpoint=args.checkpoint,
        checkpoint_every=args.checkpoint_every,
    )
    wall = time.perf_counter() - t0
    h = runner.history
    if h.empty:
        raise UsageError("no iteration ran (is --iters above the resumed iteration?)")
    last = h.iloc[-1]
    report = {
        "system": mol.name,
        "e_tot": float(last["e_coupled"]),
        "e_variational": float(last["e_variational"]),
        "estimator": args.estimator,
        "n_space": int(last["n_space"]),
        "iterations": int(runner.iteration),
        "wall_s": wall,
        "device": str(runner.device),
        "pipeline": runner.pipeline,
        "ranks": comm.size,
        "seed": args.seed,
        "e_reference": runner.reference,
    }
    if runner.reference is not None:
        report["error"] = report["e_tot"] - runner.reference
        report["error_variational"] = report["e_variational"] - runner.reference
    if out_dir is not None and comm.rank == 0:
        out_dir.mkdir(parents=True, exist_ok=True)
        csv = out_dir / "nnqs_history.csv"
        h.to_csv(csv, index=False)
        import matplotlib

        matplotlib.use("Agg")
        from cuscikit.viz import plot_convergence

        ax = plot_convergence(h, reference=runner.reference, title=f"NNQS-SCI on {mol.name}")
        png = out_dir / "nnqs_convergence.png"
        ax.figure.savefig(png, dpi=120, bbox_inches="tight")
        report["history_csv"], report["plot_png"] = str(csv), str(png)
    return report


def _report_lines(report: dict) -> list[str]:
    lines = [
        f"NNQS-SCI on {report['system']}: {report['iterations']} iterations, "
        f"|S| = {report['n_space']}, {report['wall_s']:.1f} s on {report['device']}"
        + (f" x {report['ranks']} ranks" if report.get("ranks", 1) > 1 else ""),
        f"  E (coupled)     = {report['e_tot']:.10f} Ha",
        f"  E (variational) = {report['e_variational']:.10f} Ha",
    ]
    if report.get("e_reference") is not None:
        lines.append(f"  E_FCI           = {report['e_reference']:.10f} Ha")
        for key, label in (("error", "coupled"), ("error_variational", "variational")):
            ok = "within" if abs(report[key]) < 1.6e-3 else "outside"
            lines.append(
                f"  error ({label:11s}) {report[key] * 1e3:+.4f} mHa ({ok} chemical accuracy)"
            )
    if "plot_png" in report:
        lines.append(f"  wrote {report['history_csv']} and {report['plot_png']}")
    return lines


def cmd_nnqs(args) -> int:
    mol = _load_molecule(args.system)
    out_dir = Path(args.output_dir) if args.output_dir else None
    report = _nnqs_run(mol, args, out_dir=out_dir)
    _emit(args, report, _report_lines(report))
    return 0


def cmd_demo(args) -> int:
    """NNQS-SCI on bundled N2/STO-3G with the default settings: error vs FCI, CSV and plot."""
    mol = _load_molecule(args.system)
    if args.device is None:
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    report = _nnqs_run(mol, args, out_dir=Path(args.output_dir))
    _emit(args, report, _report_lines(report))
    return 0


def _add_nnqs_options(s: argparse.ArgumentParser, *, iters: int) -> None:

    s.add_argument("--iters", type=int, default=iters, help="total iterations")
    s.add_argument("--topk", type=int, default=DEFAULT_TOPK, help="configurations added per step")
    s.add_argument("--estimator", choices=("coupled", "variational"), default="coupled")
    s.add_argument("--max-space", type=int, default=DEFAULT_MAX_SPACE, help="cap on |S|")
    s.add_argument("--inner-steps", type=int, default=DEFAULT_INNER_STEPS,
                   help="extra optimiser steps per iteration on the energy within S")
    s.add_argument("--lr-final", type=float, default=DEFAULT_LR_FINAL, metavar="LR",
                   help="the learning rate falls geometrically to LR at the last iteration")
    s.add_argument("--lr-decay-from", type=float, default=DEFAULT_LR_DECAY_FROM,
                   metavar="FRACTION", help="the fall starts after this fraction of --iters")
    s.add_argument("--constant-lr", action="store_true",
                   help="keep the learning rate constant (no fall at the end)")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    s.add_argument(
        "--pipeline",
        choices=("auto", "gpu", "baseline"),
        default="auto",
        help="gpu: every stage on the GPU; baseline: generation and de-dup on the CPU; "
        "auto: gpu on a CUDA device with the kernels built, on one rank",
    )
    s.add_argument(
        "--max-gpu-memory",
        type=_parse_bytes,
        metavar="BYTES",
        help="cap on GPU memory for the gpu pipeline (e.g. 8e9, 16GiB); larger problems run "
        "in smaller batches",
    )
    s.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile the inference over the unique set (about 2x faster on an H200 "
        "after a few seconds of compilation)",
    )
    s.add_argument("--checkpoint", help="HDF5 file written every --checkpoint-every steps")
    s.add_argument("--checkpoint-every", type=int, default=10)
    s.add_argument("--resume", help="continue from this checkpoint")
    s.add_argument("--json", action="store_true")


# --- parser ---------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cuscikit", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("info", help="versions, build flags, threads and GPUs")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_info)

    s = sub.add_parser("fcidump", help="write integrals of a molecule built with PySCF")
    s.add_argument("--atom", required=True, help='geometry, e.g. "N 0 0 0; N 0 0 1.1"')
    s.add_argument("--basis", default="sto-3g")
    s.add_argument("--charge", type=int, default=0)
    s.add_argument("--spin", type=int, default=0, help="2S = n_alpha - n_beta")
    s.add_argument("--frozen-core", action="store_true")
    s.add_argument("--symmetry", action="store_true")
    s.add_argument("--cas", type=int, nargs=2, metavar=("NE", "NO"))
    s.add_argument("-o", "--output", required=True, type=Path)
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_fcidump)

    s = sub.add_parser("fci", help="exact (FCI) energy with cuscikit's own solver")
    s.add_argument("system", help="FCIDUMP path or bundled dataset name (e.g. N2, LiH)")
    s.add_argument("--nroots", type=int, default=1)
    s.add_argument("--max-det", type=float, default=5e6, help="refuse larger FCI spaces")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_fci)

    s = sub.add_parser("nnqs", help="NNQS-SCI ground-state energy")
    s.add_argument("system", help="FCIDUMP path or bundled dataset name")
    s.add_argument("--device", default="cpu", help="cpu or cuda")
    s.add_argument("--output-dir", help="write the history CSV and convergence plot here")
    _add_nnqs_options(s, iters=DEFAULT_ITERATIONS)
    s.set_defaults(func=cmd_nnqs)

    s = sub.add_parser("demo", help="NNQS-SCI on bundled N2/STO-3G: error vs FCI, CSV, plot")
    s.add_argument("--system", default="N2")
    s.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    s.add_argument("--output-dir", default="cuscikit-demo")
    _add_nnqs_options(s, iters=DEMO_ITERS)
    s.set_defaults(func=cmd_demo)
    return p


def _error(args, exc: BaseException) -> None:
    comm = getattr(args, "comm", None)
    where = f" (rank {comm.rank} of {comm.size})" if comm is not None and comm.size > 1 else ""
    print(f"cuscikit {args.command}{where}: error: {exc}", file=sys.stderr)


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


def main(argv: list[str] | None = None) -> int:
    from cuscikit.parallel.comm import CommError

    args = build_parser().parse_args(argv)
    try:
        status = args.func(args)
    except UsageError as exc:
        _error(args, exc)
        status = 2
    except (ValueError, OSError) as exc:  # bad files, inconsistent input: one clear line
        _error(args, exc)
        status = 2
    except CommError as exc:  # another rank died or stopped answering
        _error(args, exc)
        status = 1
    except Exception:
        comm = getattr(args, "comm", None)
        if comm is None or comm.size == 1:
            raise
        import traceback

        traceback.print_exc()  # then end every rank instead of leaving them waiting
        status = 1
    return _finish(args, status)


if __name__ == "__main__":
    sys.exit(main())
