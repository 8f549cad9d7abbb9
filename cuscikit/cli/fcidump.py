"""`cuscikit fcidump`: integrals of a molecule built with PySCF, written as an FCIDUMP."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from cuscikit.cli.common import UsageError, add_json, emit


def register(sub) -> None:
    s = sub.add_parser(
        "fcidump",
        help="write integrals of a molecule built with PySCF",
        description="Build a molecule with PySCF (RHF/ROHF orbitals) and write its integrals "
        "as an FCIDUMP.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    s.add_argument("--atom", required=True, help='geometry in Angstrom, e.g. "N 0 0 0; N 0 0 1.1"')
    s.add_argument("--basis", default="sto-3g", help="basis set name")
    s.add_argument("--charge", type=int, default=0, help="total charge")
    s.add_argument("--spin", type=int, default=0, help="2S = n_alpha - n_beta")
    s.add_argument("--frozen-core", action="store_true", help="freeze the chemical core")
    s.add_argument("--symmetry", action="store_true", help="use point-group symmetry")
    s.add_argument(
        "--cas",
        type=int,
        nargs=2,
        metavar=("NE", "NO"),
        help="an active space of NE electrons in NO orbitals",
    )
    s.add_argument("-o", "--output", required=True, type=Path, help="the FCIDUMP to write")
    add_json(s)
    s.set_defaults(func=run)


def run(args) -> int:
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
    emit(args, report, [f"wrote {args.output}: {mol!r}, E_HF = {mol.e_hf:.10f}"])
    return 0
