"""π-space CASSCF of polycyclic aromatic hydrocarbons with the GUGA solver as PySCF's fcisolver.

Naphthalene CAS(10,10), anthracene CAS(14,14) and pyrene CAS(16,16) (34.8 million singlet CSFs),
all π electrons in all π orbitals, from RHF orbitals: PySCF's one-step CASSCF (``mc1step``) with
``GUGASolver(mol, device=...)`` as its fcisolver, on the CPU or the GPU. The π space is picked by
AVAS from the carbon 2p_z orbitals (E. R. Sayfutyarova, Q. Sun, G. K.-L. Chan, G. Knizia,
"Automated construction of molecular active spaces from atomic valence orbitals",
J. Chem. Theory Comput. 13, 4063 (2017), arXiv:1701.07862). Geometries are idealised: a planar
honeycomb in the xy plane, C-C 1.40 A, C-H 1.08 A.

For each run: the macro iterations, the converged energy, the wall time per macro iteration
(mean, and the first one, which builds the solver's engine), and the share of the time spent
inside the fcisolver (solves, sigma vectors for the CI response, density matrices).

Anchor: the same CASSCF with PySCF's own determinant solver (``direct_spin1``) in the same run,
for the spaces up to ``--anchor-max`` orbitals (default 10: naphthalene): the energies must
agree to 1e-7 Ha (both converge to PySCF's default CASSCF tolerances) and the times are side by
side. A determinant solve of pyrene's CAS(16,16) (165 million determinants) is not run here.

    python benchmarks/guga_casscf.py --systems naphthalene --basis sto-3g --device cpu  # minutes
    python benchmarks/guga_casscf.py --systems naphthalene pyrene --basis 6-31g --device cuda
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np
from _common import machine, print_table, write_json

CC, CH = 1.40, 1.08
_S3 = math.sqrt(3.0) * CC
# hexagon centres (pointy-top hexagons of side CC: horizontal neighbours are sqrt(3) CC apart)
RINGS = {
    "naphthalene": [(0.0, 0.0), (_S3, 0.0)],
    "anthracene": [(0.0, 0.0), (_S3, 0.0), (2 * _S3, 0.0)],
    "pyrene": [(0.0, 0.0), (_S3, 0.0), (_S3 / 2, 1.5 * CC), (_S3 / 2, -1.5 * CC)],
}
FORMULA = {"naphthalene": (10, 8), "anthracene": (14, 10), "pyrene": (16, 10)}


def pah_geometry(name: str) -> list[tuple[str, tuple[float, float, float]]]:
    """Atoms of a fused-hexagon hydrocarbon: the union of the rings' vertices, and one H on every
    carbon with two carbon neighbours, along the bisector pointing away from them."""
    carbons: list[np.ndarray] = []
    for cx, cy in RINGS[name]:
        for k in range(6):
            ang = math.radians(90.0 + 60.0 * k)
            p = np.array([cx + CC * math.cos(ang), cy + CC * math.sin(ang)])
            if all(np.linalg.norm(p - q) > 0.1 for q in carbons):
                carbons.append(p)
    atoms = [("C", (float(p[0]), float(p[1]), 0.0)) for p in carbons]
    for p in carbons:
        nb = [q for q in carbons if 0.1 < np.linalg.norm(p - q) < CC + 0.1]
        if len(nb) == 2:
            d = p - 0.5 * (nb[0] + nb[1])
            h = p + CH * d / np.linalg.norm(d)
            atoms.append(("H", (float(h[0]), float(h[1]), 0.0)))
    nc, nh = FORMULA[name]
    got = (sum(a == "C" for a, _ in atoms), sum(a == "H" for a, _ in atoms))
    if got != (nc, nh):
        raise RuntimeError(f"{name}: built C{got[0]}H{got[1]}, expected C{nc}H{nh}")
    return atoms


def _timed(solver, names, acc: dict) -> None:
    """Wrap the solver instance's methods so that their wall time adds up in acc['ci'] (the
    outermost call only: a solver's kernel may call its own contract_2e)."""
    for name in names:
        fn = getattr(solver, name, None)
        if fn is None:
            continue

        def wrapped(*a, _fn=fn, **k):
            acc["depth"] += 1
            t0 = time.perf_counter()
            try:
                return _fn(*a, **k)
            finally:
                acc["depth"] -= 1
                if acc["depth"] == 0:
                    acc["ci"] += time.perf_counter() - t0
                    acc["calls"] += 1

        setattr(solver, name, wrapped)


def run_casscf(mf, ncas: int, nelecas, mo, solver: str, device: str, max_macro: int) -> dict:
    from pyscf import mcscf

    mc = mcscf.CASSCF(mf, ncas, nelecas)
    mc.max_cycle_macro = max_macro
    if solver == "guga":
        from cuscikit.guga import GUGASolver

        mc.fcisolver = GUGASolver(mf.mol, device=device)
    acc = {"ci": 0.0, "calls": 0, "depth": 0}
    _timed(mc.fcisolver, ("kernel", "contract_2e", "make_rdm12", "make_rdm1", "absorb_h1e"), acc)
    marks: dict[int, float] = {}  # macro iteration -> time of its last callback

    def callback(envs):
        # mc1step calls back after every micro step and at the end of every macro iteration
        it = int(envs["imacro"])  # counts from 1
        if marks and it not in marks:
            prev = max(marks)
            lap = marks[prev] - (marks[prev - 1] if prev - 1 in marks else t0)
            print(f"    macro {prev:3d}  {lap:7.2f} s", flush=True)
        marks[it] = time.perf_counter()

    mc.callback = callback
    torch = None
    if device.startswith("cuda"):
        import torch

        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    mc.kernel(mo)
    wall = time.perf_counter() - t0
    peak = None if torch is None else torch.cuda.max_memory_allocated() / 2**30
    ends = [marks[k] for k in sorted(marks)]
    steps = np.diff([t0, *ends])
    print(f"    macro {len(ends):3d}  {steps[-1]:7.2f} s (last)  E = {mc.e_tot:.10f}", flush=True)
    return {
        "e_tot": float(mc.e_tot),
        "converged": bool(mc.converged),
        "macro": len(ends),
        "wall_s": wall,
        "first_macro_s": float(steps[0]) if len(steps) else float("nan"),
        "per_macro_s": float(steps.mean()) if len(steps) else float("nan"),
        "ci_s": acc["ci"],
        "ci_calls": acc["calls"],
        "peak_gib": peak,
    }


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--systems", nargs="+", default=["naphthalene", "pyrene"], choices=list(RINGS))
    ap.add_argument("--basis", default="6-31g")
    ap.add_argument("--device", default="cuda", help="the GUGA solver's device (cpu, cuda)")
    ap.add_argument(
        "--anchor-max", type=int, default=10, help="direct_spin1 up to this many π orbitals"
    )
    ap.add_argument("--max-macro", type=int, default=50, help="CASSCF macro iterations at most")
    ap.add_argument("--json-out", default=None, help="write the rows as JSON here")
    args = ap.parse_args(argv)

    from pyscf import gto, scf
    from pyscf.mcscf import avas

    from cuscikit.guga import DRT

    print(f"machine: {machine()}")
    rows, table = [], []
    for name in args.systems:
        mol = gto.M(atom=pah_geometry(name), basis=args.basis, verbose=0)
        t0 = time.perf_counter()
        mf = scf.RHF(mol).run(conv_tol=1e-10)
        t_hf = time.perf_counter() - t0
        ncas, nelecas, mo = avas.kernel(mf, ["C 2pz"], minao="minao", verbose=0)
        nelec = int(round(float(np.sum(nelecas)))) if np.ndim(nelecas) else int(nelecas)
        ncsf = DRT(ncas, nelec, 0).n_csf
        print(
            f"{name}/{args.basis}: {mol.nao} AOs, RHF {mf.e_tot:.8f} ({t_hf:.1f} s), "
            f"AVAS pi space CAS({nelec},{ncas}), {ncsf:,} CSFs",
            flush=True,
        )
        solvers = [("guga", args.device)]
        if ncas <= args.anchor_max:
            solvers.append(("direct_spin1", "cpu"))
        for solver, dev in solvers:
            print(f"  {solver} ({dev})", flush=True)
            r = run_casscf(mf, ncas, nelec, mo, solver, dev, args.max_macro)
            r.update(system=name, basis=args.basis, nao=mol.nao, cas=f"({nelec},{ncas})")
            r.update(n_csf=ncsf, solver=solver, device=dev, e_rhf=float(mf.e_tot), hf_s=t_hf)
            rows.append(r)
            table.append(
                [
                    name,
                    r["cas"],
                    f"{ncsf:,}",
                    f"{solver}/{dev}",
                    f"{r['macro']}{'' if r['converged'] else ' (not conv.)'}",
                    f"{r['e_tot']:.9f}",
                    f"{r['wall_s']:.1f}",
                    f"{r['first_macro_s']:.2f}",
                    f"{r['per_macro_s']:.2f}",
                    f"{100 * r['ci_s'] / r['wall_s']:.0f}%",
                    "" if r["peak_gib"] is None else f"{r['peak_gib']:.1f}",
                ]
            )
        same = [r for r in rows if r["system"] == name]
        if len(same) == 2:
            d = abs(same[0]["e_tot"] - same[1]["e_tot"])
            print(f"  |E(guga) - E(direct_spin1)| = {d:.2e} Ha", flush=True)
            if d > 1e-7:
                raise SystemExit(f"{name}: GUGA and direct_spin1 CASSCF energies differ by {d:.2e}")
    print_table(
        f"CASSCF (mc1step, PySCF defaults), {args.basis}; anchor: direct_spin1 in the same run",
        [
            "system",
            "CAS",
            "CSFs",
            "solver",
            "macro",
            "E_CASSCF",
            "wall s",
            "1st s",
            "s/macro",
            "in CI",
            "GPU GiB",
        ],
        table,
    )
    if args.json_out:
        write_json(
            args.json_out, "guga_casscf.py", "PySCF direct_spin1 CASSCF, same run", args, rows
        )


if __name__ == "__main__":
    main()
