"""`cuscikit guga`: exact CI in spin-adapted CSFs (GUGA) of a system, or the sizes of a DRT.

cuscikit guga N2 --spin 0 --nroots 2 --json
cuscikit guga N2 --device cuda
cuscikit guga --drt 12 12 0
"""

from __future__ import annotations

import argparse
import time

from cuscikit.chem.molecule import check_state_symmetry
from cuscikit.cli.common import (
    SYSTEM_HELP,
    UsageError,
    add_json,
    emit,
    finite_float,
    load_molecule,
    non_negative_int,
    positive_int,
    require_cuda,
)


def register(sub) -> None:
    s = sub.add_parser(
        "guga",
        help="exact CI in spin-adapted CSFs (GUGA)",
        description="Exact CI energies of one spin in the CSF basis of the unitary group "
        "approach, or (--drt) the sizes of a distinct row table.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    s.add_argument("system", nargs="?", help=SYSTEM_HELP)
    s.add_argument("--spin", type=non_negative_int, default=None, help="2S (default: na - nb)")
    s.add_argument("--nroots", type=positive_int, default=1, help="number of lowest roots")
    s.add_argument("--threads", type=non_negative_int, default=0, help="OpenMP threads (0: all)")
    s.add_argument("--max-csf", type=finite_float, default=5e7, help="refuse larger CSF spaces")
    s.add_argument(
        "--device",
        default="cpu",
        help="cpu (the reference) or a CUDA device (cuda, cuda:1): sigma and Davidson on the GPU",
    )
    s.add_argument(
        "--gpu-memory",
        type=finite_float,
        default=None,
        help="MB the solve may hold on the GPU (default: what is free)",
    )
    s.add_argument(
        "--drt",
        nargs=3,
        type=non_negative_int,
        metavar=("NORB", "NELEC", "2S"),
        help="print the sizes of this DRT and exit",
    )
    add_json(s)
    s.set_defaults(func=run)


def run(args) -> int:
    from cuscikit.guga import DRT, GUGASolver

    if args.drt is not None:
        norb, nelec, twos = args.drt
        try:
            drt = DRT(norb, nelec, twos)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        sizes = drt.sizes()
        lines = [f"DRT(norb={norb}, nelec={nelec}, 2S={twos})"]
        lines += [f"  {k}: {v:,}" for k, v in sizes.items() if k not in ("norb", "nelec", "twos")]
        emit(args, sizes, lines)
        return 0
    if args.system is None:
        raise UsageError("give a system (FCIDUMP or dataset) or --drt NORB NELEC 2S")
    mol = load_molecule(args.system)
    check_state_symmetry(mol)  # ISYM other than 1: a request the solver cannot honour
    na, nb = mol.nelec
    twos = abs(na - nb) if args.spin is None else args.spin
    try:
        drt = DRT(mol.norb, na + nb, twos)
    except ValueError as exc:
        raise UsageError(f"{mol.name}: {exc}") from None
    if twos < abs(na - nb):
        raise UsageError(f"--spin {twos} cannot hold n_alpha - n_beta = {na - nb}")
    if drt.n_csf > args.max_csf:
        raise UsageError(f"{mol.name}: {drt.n_csf:.3e} CSFs, above --max-csf {args.max_csf:.0e}")
    if args.nroots > drt.n_csf:
        raise UsageError(f"--nroots {args.nroots} exceeds the {drt.n_csf} CSFs")
    if args.device != "cpu" and args.device != "cuda" and not args.device.startswith("cuda:"):
        raise UsageError(f"--device must be cpu or a CUDA device (cuda, cuda:0), got {args.device}")
    if args.device != "cpu":
        require_cuda(args.device)
    t0 = time.perf_counter()
    solver = GUGASolver(
        spin=twos,
        nroots=args.nroots,
        threads=args.threads,
        conv_tol=1e-11,
        device=args.device,
        gpu_memory=args.gpu_memory,
    )
    e, _ = solver.kernel(mol.h1e, mol.eri, mol.norb, (na, nb), ecore=mol.e_core)
    energies = [float(e)] if args.nroots == 1 else [float(v) for v in e]
    wall = time.perf_counter() - t0
    report = {
        "system": mol.name,
        "e_tot": energies,
        "n_csf": drt.n_csf,
        "norb": mol.norb,
        "nelec": [na, nb],
        "twos": twos,
        "converged": bool(all(solver.converged) if args.nroots > 1 else solver.converged),
        "wall_s": wall,
        "solver": "cuscikit.guga.GUGASolver",
        "device": args.device,
        "energy_unit": mol.energy_unit,
    }
    lines = [f"{mol.name}: {drt.n_csf} CSFs (2S = {twos}), norb={mol.norb}, nelec={(na, nb)}"]
    lines += [f"  root {k}: E = {v:.12f} {report['energy_unit']}" for k, v in enumerate(energies)]
    lines.append(f"  wall time {wall:.2f} s")
    emit(args, report, lines)
    return 0
