"""GUGA CI on the CPU against PySCF's determinant FCI, same cores, same run.

N2/cc-pVDZ at 1.098 A, RHF orbitals, CASCI(10,10) and (12,12) (``--big``: also (14,14)),
singlet and triplet. For each solver: the median (and the best) time of one sigma vector (H c)
on a random vector, the time of a full solve (conv_tol 1e-10, one root, no guess), its energy
and the peak resident memory of a process that ran only that solve. The anchor is PySCF's
direct_spin1 with fix_spin_ (to select the spin), measured in this same run; also shown: plain
direct_spin1 (no spin penalty, the lowest state of the M sector) and, for singlets,
direct_spin0.

    python benchmarks/guga_cpu.py [--threads 2] [--big] [--repeat 3]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import resource
import statistics
import time

import numpy as np
from _common import machine, print_table


def _integrals(ncas: int):
    from pyscf import gto, mcscf, scf

    mol = gto.M(atom="N 0 0 0; N 0 0 1.098", basis="cc-pvdz", verbose=0)
    mf = scf.RHF(mol).run()
    mc = mcscf.CASCI(mf, ncas, ncas)
    h1, ecore = mc.get_h1eff()
    return h1, mc.get_h2eff(), ecore


def _run(method: str, ncas: int, twos: int, threads: int, repeat: int, queue) -> None:
    from pyscf import fci, lib

    lib.num_threads(threads)
    h1, eri, ecore = _integrals(ncas)
    nelec = ((ncas + twos) // 2, (ncas - twos) // 2)
    out = {}
    if method == "guga":
        from cuscikit.guga import GUGASolver

        solver = GUGASolver(spin=twos, threads=threads, conv_tol=1e-10)
        t0 = time.perf_counter()
        eng, matvec = solver._hop(h1, eri, ncas, nelec)
        eng.lists(0)
        out["setup_s"] = time.perf_counter() - t0
        c = np.random.default_rng(0).standard_normal(eng.ncsf)
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            matvec(c)
            times.append(time.perf_counter() - t0)
        out["size"] = eng.ncsf
        solver = GUGASolver(spin=twos, threads=threads, conv_tol=1e-10)
        t0 = time.perf_counter()
        e, _ = solver.kernel(h1, eri, ncas, nelec, ecore=ecore)
    else:
        from math import comb

        if method == "direct_spin0":
            solver = fci.direct_spin0.FCI()
        elif method == "direct_spin1":
            solver = fci.direct_spin1.FCI()
        else:
            solver = fci.direct_spin1.FCI()
            s = 0.5 * twos
            solver = fci.addons.fix_spin_(solver, ss=s * (s + 1))
        solver.conv_tol = 1e-10
        h2 = solver.absorb_h1e(h1, eri, ncas, nelec, 0.5)
        shape = (comb(ncas, nelec[0]), comb(ncas, nelec[1]))
        c = np.random.default_rng(0).standard_normal(shape)
        if method == "direct_spin0":
            c = c + c.T
        out["size"] = shape[0] * shape[1]
        out["setup_s"] = 0.0
        contract = (fci.direct_spin0 if method == "direct_spin0" else fci.direct_spin1).contract_2e
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            contract(h2, c, ncas, nelec)
            times.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        e, _ = solver.kernel(h1, eri, ncas, nelec, ecore=ecore)
    out["solve_s"] = time.perf_counter() - t0
    out["sigma_s"] = statistics.median(times)
    out["sigma_min_s"] = min(times)
    out["e"] = float(e)
    out["peak_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    queue.put(out)


def measure(method, ncas, twos, threads, repeat):
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_run, args=(method, ncas, twos, threads, repeat, q))
    p.start()
    out = q.get()
    p.join()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--big", action="store_true", help="add CAS(14,14)")
    ap.add_argument("--sizes", type=int, nargs="*", default=[10, 12])
    args = ap.parse_args()
    sizes = list(args.sizes) + ([14] if args.big else [])
    print(f"machine: {machine()}; threads: {args.threads}")
    rows = []
    for ncas in sizes:
        for twos in (0, 2):
            methods = ["direct_spin1+fix_spin_", "guga", "direct_spin1"]
            methods += ["direct_spin0"] if twos == 0 else []
            res = {m: measure(m, ncas, twos, args.threads, args.repeat) for m in methods}
            anchor = res["direct_spin1+fix_spin_"]
            for m in methods:
                r = res[m]
                rows.append(
                    [
                        f"({ncas},{ncas}) 2S={twos}",
                        m,
                        f"{r['size']:,}",
                        f"{r['sigma_s']:.3f}",
                        f"{r['sigma_min_s']:.3f}",
                        f"{anchor['sigma_s'] / r['sigma_s']:.2f}x",
                        f"{r['setup_s']:.2f}",
                        f"{r['solve_s']:.2f}",
                        f"{anchor['solve_s'] / r['solve_s']:.2f}x",
                        f"{r['e']:.10f}",
                        f"{r['e'] - anchor['e']:+.1e}",
                        f"{r['peak_mib']:.0f}",
                    ]
                )
            print_table(
                "GUGA CI vs PySCF (anchor: direct_spin1 + fix_spin_ in this run)",
                [
                    "space",
                    "solver",
                    "dim",
                    "sigma s",
                    "min s",
                    "vs spin1",
                    "setup s",
                    "solve s",
                    "vs spin1",
                    "E (Ha)",
                    "dE",
                    "peak MiB",
                ],
                rows,
            )


if __name__ == "__main__":
    main()
