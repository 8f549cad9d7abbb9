"""`cuscikit fci`: the exact (FCI) energy of a system with cuscikit's own solver."""

from __future__ import annotations

import argparse
import time

from cuscikit.cli.common import (
    FCI_MAX_DET,
    SYSTEM_HELP,
    UsageError,
    add_json,
    emit,
    finite_float,
    load_molecule,
    positive_int,
)


def register(sub) -> None:
    s = sub.add_parser(
        "fci",
        help="exact (FCI) energy with cuscikit's own solver",
        description="Exact (FCI) energies in the determinant space of a system.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    s.add_argument("system", help=SYSTEM_HELP)
    s.add_argument("--nroots", type=positive_int, default=1, help="number of lowest roots")
    s.add_argument(
        "--max-det", type=finite_float, default=FCI_MAX_DET, help="refuse larger FCI spaces"
    )
    add_json(s)
    s.set_defaults(func=run)


def run(args) -> int:
    from cuscikit.sci import FCI

    if args.nroots < 1:
        raise UsageError(f"--nroots must be at least 1, got {args.nroots}")
    mol = load_molecule(args.system)
    n_det = mol.n_determinants
    if n_det > args.max_det:
        raise UsageError(
            f"{mol.name}: the FCI space has {n_det:.3e} determinants, above --max-det "
            f"{args.max_det:.0e}; use a selected-CI method instead"
        )
    if args.nroots > n_det:
        raise UsageError(f"--nroots {args.nroots} exceeds the {n_det} determinants")
    t0 = time.perf_counter()
    # energies to 1e-11 Ha; vectors only to the residual a report of energies needs
    solver = FCI(mol, nroots=args.nroots, conv_tol=1e-11, conv_tol_residual=1e-6)
    e, _ = solver.kernel()
    energies = [float(e)] if args.nroots == 1 else [float(v) for v in e]
    wall = time.perf_counter() - t0
    report = {
        "system": mol.name,
        "e_tot": energies[0],
        "energies": energies,
        "n_det": n_det,
        "norb": mol.norb,
        "nelec": list(mol.nelec),
        "e_hf": mol.e_hf,
        "wall_s": wall,
        "solver": "cuscikit.sci.FCI",
        "energy_unit": mol.energy_unit,
    }
    ref = (getattr(mol, "metadata", None) or {}).get("reference") or {}
    lines = [f"{mol.name}: {n_det} determinants, norb={mol.norb}, nelec={mol.nelec}"]
    unit = report["energy_unit"]
    lines += [f"  root {k}: E = {v:.12f} {unit}" for k, v in enumerate(energies)]
    if ref.get("energy") is not None:
        report["e_reference"] = ref["energy"]
        lines.append(
            f"  reference {ref['energy']:.10f} ({ref.get('method', '?')}): "
            f"error {energies[0] - ref['energy']:+.2e} {unit}"
        )
    lines.append(f"  wall time {wall:.2f} s")
    emit(args, report, lines)
    return 0
