"""`cuscikit nnqs` and `cuscikit demo`: NNQS-SCI ground-state energies."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from cuscikit.cli.common import (
    EXIT_OK,
    EXIT_STOPPED,
    FCI_MAX_DET,
    SYSTEM_HELP,
    UsageError,
    add_json,
    communicator,
    emit,
    finite_float,
    load_molecule,
    non_negative_int,
    parse_bytes,
    positive_int,
    writable_folder,
)

# Plain numbers, so that building the parser does not import PyTorch.
from cuscikit.nnqs.defaults import (
    DEFAULT_INNER_STEPS,
    DEFAULT_ITERATIONS,
    DEFAULT_LATTICE_TEACHER_INNER_STEPS,
    DEFAULT_LR_DECAY_FROM,
    DEFAULT_LR_FINAL,
    DEFAULT_MAX_SPACE,
    DEFAULT_TEACHER,
    DEFAULT_TEACHER_HOLD,
    DEFAULT_TEACHER_INNER_STEPS,
    DEFAULT_TEACHER_UNTIL,
    DEFAULT_TOPK,
)

# The demo's N2 run with the default settings, shortened to a few minutes on 2 CPU cores: 400
# iterations took 315 s and ended at +0.310 mHa (within 1.6 mHa from iteration 313; 2026-11-30).
DEMO_ITERS = 400


def register(sub) -> None:
    s = sub.add_parser(
        "demo",
        help="the main job: NNQS-SCI on bundled N2/STO-3G, error vs FCI, CSV, plot",
        description="NNQS-SCI on bundled N2/STO-3G with the default settings: the error "
        "against FCI, a history CSV and a convergence plot.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    s.add_argument("--system", default="N2", help="bundled dataset or FCIDUMP")
    s.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    s.add_argument("--output-dir", default="cuscikit-demo", help="where the CSV and plot go")
    add_nnqs_options(s, iters=DEMO_ITERS)
    s.set_defaults(func=cmd_demo)

    s = sub.add_parser(
        "nnqs",
        help="NNQS-SCI ground-state energy",
        description="NNQS-SCI: a transformer wavefunction optimised over a growing "
        "selected-CI space.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    s.add_argument("system", help=SYSTEM_HELP)
    s.add_argument("--device", default="cpu", help="cpu or cuda")
    s.add_argument("--output-dir", help="write the history CSV and convergence plot here")
    add_nnqs_options(s, iters=DEFAULT_ITERATIONS)
    s.set_defaults(func=cmd_nnqs)


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

    if not 0 < args.lr_final <= 10:
        raise UsageError(f"--lr-final must lie in (0, 10], got {args.lr_final}")
    if not 0 <= args.lr_decay_from < 1:
        raise UsageError(f"--lr-decay-from must be in [0, 1), got {args.lr_decay_from}")
    if args.teacher is not None and args.teacher < 0:
        raise UsageError(f"--teacher must be >= 0 (0: off), got {args.teacher}")
    if not 0 <= args.teacher_hold <= 1:
        raise UsageError(
            f"--teacher-hold must be a fraction in [0, 1] (0: off), got {args.teacher_hold}"
        )
    if args.device not in ("cpu", "cuda") and not args.device.startswith("cuda:"):
        raise UsageError(f"unknown --device {args.device!r}: use cpu or cuda")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise UsageError("--device cuda asked for, but no CUDA GPU is available")
    if args.resume and not Path(args.resume).is_file():
        raise UsageError(f"--resume {args.resume}: no such file")
    if out_dir is not None:  # before iteration 1, not after the last one
        writable_folder(out_dir)
    if args.checkpoint:
        from cuscikit.nnqs.checkpoint import check_writable

        check_writable(args.checkpoint)
    reference = args.reference
    if reference == "fci" and mol.n_determinants > FCI_MAX_DET:
        raise UsageError(
            f"--reference fci: {mol.name} has {mol.n_determinants:.3e} determinants, above "
            f"{FCI_MAX_DET:.0e}; give the reference energy as a number"
        )
    comm = communicator(args)
    if args.device == "cuda" and comm.size > 1:  # one GPU per rank of this host
        from cuscikit.parallel.comm import local_rank

        args.device = f"cuda:{local_rank() % torch.cuda.device_count()}"
        torch.cuda.set_device(torch.device(args.device))
    if reference == "fci":  # every rank the same number: a deterministic solve
        from cuscikit import FCI

        reference = FCI(mol, nroots=1).run().e_tot
    dtype = {"float32": torch.float32, "float64": torch.float64}[args.dtype]
    ansatz = Ansatz.for_molecule(mol, seed=args.seed, dtype=dtype, device=args.device)
    runner = Runner(
        mol,
        ansatz,
        topk=args.topk,
        estimator=args.estimator,
        seed=args.seed,
        growth=args.growth,
        max_space="auto" if args.max_space is None else args.max_space,
        prune_weight=args.prune_weight,
        add_weight=args.add_weight,
        space_memory=args.space_memory,
        device=args.device,
        pipeline=args.pipeline,
        max_gpu_memory=args.max_gpu_memory,
        compile_inference=args.compile,
        inner_steps=args.inner_steps,
        inner_batch=args.inner_batch,
        shared_prefix_training=args.shared_prefix_training,
        teacher="auto" if args.teacher is None else args.teacher,
        teacher_until=args.teacher_until,
        teacher_hold=args.teacher_hold,
        teacher_resolve=args.teacher_resolve,
        teacher_inner_steps=args.teacher_inner_steps,
        reference=reference,
        comm=comm,
    )
    # the rate schedule travels with the checkpoint; a resume under another one is warned about
    runner.schedule = (
        "constant"
        if args.constant_lr
        else f"decay from {args.lr_decay_from} of {args.iters} to {args.lr_final}"
    )
    if args.resume:
        runner.load(args.resume)
    t0 = time.perf_counter()
    callbacks = []
    if not args.constant_lr:  # by absolute iteration: a resumed run keeps the schedule
        from cuscikit.nnqs import LearningRateDecay

        callbacks.append(LearningRateDecay.over_tail(args.iters, args.lr_decay_from, args.lr_final))
    runner.kernel(
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
    st = runner.status
    report = {
        "status": "ok" if st is None or st.ok else "stopped",
        "stop_reason": None if st is None or st.ok else st.reason,
        "system": mol.name,
        "e_tot": float(last["e_coupled"]),
        "e_variational": float(last["e_variational"]),
        "e_pt2": float(last["e_pt2"]) if "e_pt2" in last else None,
        "e_tot_pt2": float(last["e_tot_pt2"]) if "e_tot_pt2" in last else None,
        "estimator": args.estimator,
        "n_space": int(last["n_space"]),
        "n_space_next": int(last.get("n_space_next", last["n_space"])),
        "growth": runner.growth_rule,
        "iterations": int(runner.iteration),
        "wall_s": wall,
        "device": str(runner.device),
        "pipeline": runner.active_pipeline,
        "ranks": comm.size,
        "seed": args.seed,
        "e_reference": runner.reference,
        "reference_from": None
        if runner.reference is None
        else {"fci": "fci", None: "dataset"}.get(args.reference, "given"),
        "energy_unit": mol.energy_unit,
    }
    if runner.teacher_on:
        report["teacher"], report["teacher_until"] = runner.teacher_on, args.teacher_until
        report["teacher_hold"] = args.teacher_hold
        report["teacher_resolve"] = args.teacher_resolve
        report["teacher_inner_steps"] = runner.teacher_inner_count
        if args.teacher_hold > 0:
            report["teacher_released"] = runner.teacher_released
    if report["status"] != "ok" and args.checkpoint:
        report["resume"] = (
            f"the checkpoint {args.checkpoint} holds iteration "
            f"{runner.iteration}: continue with --resume {args.checkpoint}"
        )
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

        title = f"NNQS-SCI on {mol.name}"
        ax = plot_convergence(h, reference=runner.reference, title=title, unit=mol.energy_unit)
        png = out_dir / "nnqs_convergence.png"
        ax.figure.savefig(png, dpi=120, bbox_inches="tight")
        report["history_csv"], report["plot_png"] = str(csv), str(png)
    return report


def _report_lines(report: dict) -> list[str]:
    unit = report.get("energy_unit", "Ha")
    lines = (
        []
        if report["status"] == "ok"
        else [
            f"NNQS-SCI stopped early: {report['stop_reason']}"
            + (f"; {report['resume']}" if report.get("resume") else "")
        ]
    )
    lines += [
        f"NNQS-SCI on {report['system']}: {report['iterations']} iterations, "
        f"|S| = {report['n_space']}"
        + (
            f" ({report['n_space_next']} after its growth)"
            if report.get("n_space_next", report["n_space"]) != report["n_space"]
            else ""
        )
        + f", {report['wall_s']:.1f} s on {report['device']}"
        + (f" x {report['ranks']} ranks" if report.get("ranks", 1) > 1 else ""),
        f"  E (coupled)     = {report['e_tot']:.10f} {unit}",
        f"  E (variational) = {report['e_variational']:.10f} {unit}",
    ]
    if report.get("e_tot_pt2") is not None and report["e_tot_pt2"] == report["e_tot_pt2"]:
        lines.append(f"  E (var. + PT2)  = {report['e_tot_pt2']:.10f} {unit}")
    if report.get("e_reference") is not None:
        label = "E_reference" if report.get("reference_from") == "given" else "E_FCI"
        lines.append(f"  {label:15s} = {report['e_reference']:.10f} {unit}")
        for key, label in (("error", "coupled"), ("error_variational", "variational")):
            if unit != "Ha":  # a model's units: no chemical accuracy to speak of
                lines.append(f"  error ({label:11s}) {report[key]:+.7f} {unit}")
                continue
            ok = "within" if abs(report[key]) < 1.6e-3 else "outside"
            lines.append(
                f"  error ({label:11s}) {report[key] * 1e3:+.4f} mHa ({ok} chemical accuracy)"
            )
    if "plot_png" in report:
        lines.append(f"  wrote {report['history_csv']} and {report['plot_png']}")
    return lines


def cmd_nnqs(args) -> int:
    mol = load_molecule(args.system)
    out_dir = Path(args.output_dir) if args.output_dir else None
    report = _nnqs_run(mol, args, out_dir=out_dir)
    emit(args, report, _report_lines(report))
    return EXIT_OK if report["status"] == "ok" else EXIT_STOPPED


def cmd_demo(args) -> int:
    """NNQS-SCI on bundled N2/STO-3G with the default settings: error vs FCI, CSV and plot."""
    mol = load_molecule(args.system)
    if args.device is None:
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    report = _nnqs_run(mol, args, out_dir=Path(args.output_dir))
    emit(args, report, _report_lines(report))
    return EXIT_OK if report["status"] == "ok" else EXIT_STOPPED


def auto_or_non_negative_int(text: str) -> int | str:
    """An argparse type: the word "auto" or an integer >= 0."""
    return "auto" if text == "auto" else non_negative_int(text)


def reference_energy(text: str) -> float | str:
    """An argparse type: "fci" or a finite energy."""
    return "fci" if text.strip().lower() == "fci" else finite_float(text)


def add_nnqs_options(s: argparse.ArgumentParser, *, iters: int) -> None:

    s.add_argument(
        "--iters",
        type=non_negative_int,
        default=iters,
        help="total iterations (a resumed run continues up to this count)",
    )
    s.add_argument(
        "--topk", type=positive_int, default=DEFAULT_TOPK, help="configurations added per step"
    )
    s.add_argument(
        "--estimator",
        choices=("coupled", "variational"),
        default="coupled",
        help="the energy the loss follows (both are reported)",
    )
    s.add_argument(
        "--growth",
        choices=("auto", "count", "weight"),
        default="auto",
        help="count: S + top-K by |psi| up to --max-space; weight: S + the top-K by "
        "first-order weight above --add-weight, the memory budget the only hard limit; "
        "auto (default): weight for a lattice model, count otherwise",
    )
    s.add_argument(
        "--max-space",
        type=positive_int,
        default=None,
        help=f"cap on |S| (default: {DEFAULT_MAX_SPACE} under --growth count, none under weight)",
    )
    s.add_argument(
        "--add-weight",
        type=finite_float,
        default=None,
        help="--growth weight: least first-order weight of a configuration added to S",
    )
    s.add_argument(
        "--space-memory",
        type=positive_int,
        default=None,
        metavar="BYTES",
        help="--growth weight: bytes S and its coupled set may take (default: what is free)",
    )
    s.add_argument(
        "--prune-weight",
        type=finite_float,
        default=None,
        help="after each growth step drop the configurations of smallest |psi| whose share of "
        "the weight on S is at most this (off by default)",
    )
    s.add_argument(
        "--inner-steps",
        type=non_negative_int,
        default=DEFAULT_INNER_STEPS,
        help="extra optimiser steps per iteration on the energy within S",
    )
    s.add_argument(
        "--inner-batch",
        type=positive_int,
        default=None,
        metavar="M",
        help="while |S| > M, each inner step takes its gradient from about M configurations "
        "drawn by the size of their coefficient (unbiased; default: all of S)",
    )
    s.add_argument(
        "--teacher",
        type=finite_float,
        default=None,
        metavar="W",
        help="weight of the selected-CI teacher at iteration 1 (0: off): the lowest "
        f"eigenvector of H within S pulls the network's amplitudes and signs (default: "
        f"{DEFAULT_TEACHER:g})",
    )
    s.add_argument(
        "--teacher-until",
        type=positive_int,
        default=DEFAULT_TEACHER_UNTIL,
        metavar="T",
        help="the teacher's weight falls linearly to 0 at iteration T",
    )
    s.add_argument(
        "--teacher-hold",
        type=finite_float,
        default=DEFAULT_TEACHER_HOLD,
        metavar="H",
        help="hold the teacher's weight at no less than H times its first (0: off) while the "
        "network trails the CI energy of S (each new S solved); released for good once the "
        "gap closes",
    )
    s.add_argument(
        "--teacher-inner-steps",
        type=auto_or_non_negative_int,
        default="auto",
        metavar="N",
        help="inner steps of an iteration while the teacher's weight is above 0 or held "
        f"(default auto: {DEFAULT_LATTICE_TEACHER_INNER_STEPS} for a lattice model; otherwise "
        f"{DEFAULT_TEACHER_INNER_STEPS} on a GPU, --inner-steps on a CPU)",
    )
    s.add_argument(
        "--no-teacher-resolve",
        dest="teacher_resolve",
        action="store_false",
        help="after T hold the teacher only while S is unchanged (no eigensolve of a new S)",
    )
    s.add_argument(
        "--lr-final",
        type=finite_float,
        default=DEFAULT_LR_FINAL,
        metavar="LR",
        help="the learning rate falls geometrically to LR at the last iteration",
    )
    s.add_argument(
        "--lr-decay-from",
        type=finite_float,
        default=DEFAULT_LR_DECAY_FROM,
        metavar="FRACTION",
        help="the fall starts after this fraction of --iters",
    )
    s.add_argument(
        "--constant-lr",
        action="store_true",
        help="keep the learning rate constant (no fall at the end)",
    )
    s.add_argument("--seed", type=int, default=0, help="random-number seed of the run")
    s.add_argument(
        "--reference",
        type=reference_energy,
        default=None,
        help="exact energy the errors are taken against: a number, or 'fci' to compute it "
        f"first (up to {FCI_MAX_DET:.0e} determinants; default: the dataset's bundled one)",
    )
    s.add_argument(
        "--dtype",
        choices=("float32", "float64"),
        default="float32",
        help="floating type of the network",
    )
    s.add_argument(
        "--pipeline",
        choices=("auto", "gpu", "baseline"),
        default="auto",
        help="gpu: every stage on the GPU; baseline: generation and de-dup on the CPU; "
        "auto: gpu on a CUDA device with the kernels built, on one rank",
    )
    s.add_argument(
        "--max-gpu-memory",
        type=parse_bytes,
        metavar="BYTES",
        help="cap on GPU memory for the gpu pipeline (e.g. 8e9, 16GiB); larger problems run "
        "in smaller batches",
    )
    s.add_argument(
        "--shared-prefix-training",
        action="store_true",
        help="run the transformer once per distinct prefix of S in the optimiser stage's "
        "passes with gradient (same values to rounding; fewer rows on lattices)",
    )
    s.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile the inference over the unique set (about 2x faster on an H200 "
        "after a few seconds of compilation)",
    )
    s.add_argument(
        "--checkpoint",
        help="HDF5 file written every --checkpoint-every steps, "
        "and when the run stops early (checked writable before iteration 1)",
    )
    s.add_argument(
        "--checkpoint-every", type=positive_int, default=10, help="iterations between checkpoints"
    )
    s.add_argument("--resume", help="continue from this checkpoint")
    add_json(s)
