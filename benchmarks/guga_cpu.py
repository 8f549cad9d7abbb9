"""GUGA CI on the CPU against PySCF's determinant FCI, same cores, same run.

N2/cc-pVDZ at 1.098 A, RHF orbitals, CASCI(10,10) and (12,12) (``--sizes 10 12 14``),
singlet and triplet. Every solver runs in a process of its own, one after the other and, with
``--rounds R``, R times alternating, so that a shared machine loads them alike. Each process
first solves (conv_tol 1e-10, one root, no guess; the time includes every setup: for GUGA the
DRT and the loop table, or the coupling lists with ``--sigma-method lists``; wall and CPU
seconds of the process, the latter summed over its threads and less sensitive to other jobs)
and reads its peak resident memory ("peak MiB", the process's, imports and integrals included)
and the solver's own ("solve MiB": the peak during the solve above the resident memory just
before it, measured alike for every solver on Linux) and the sigma vectors the solve took
("sigma vecs": calls of GUGA's sigma, of PySCF's contract_2e), then times one sigma vector on a
random vector (median and best of ``--repeat``). The anchor is PySCF's
direct_spin1 with fix_spin_ (to select the spin); also shown: plain direct_spin1 (no spin
penalty, the lowest state of the M sector), direct_spin0 for singlets, pyscf-forge's csf_solver
when it is installed (the script says so when it is not), and with ``--df TOL`` GUGA with the
integrals factored by pivoted Cholesky to TOL. ``--sigma-only`` skips the solves (for
CAS(14,14) on a small machine); the memory is then that of the sigma. ``--max-memory MB`` caps
GUGA's memory (with the lists: those beyond the cap are searched again on every sigma).

    python benchmarks/guga_cpu.py [--threads 2] [--sizes 10 12] [--repeat 3] [--rounds 1]
        [--json-out FILE]

``--json-out`` also writes the rows (medians, one per space and solver) as JSON, the form
notebook 05 reads from ``benchmarks/results/``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import resource
import statistics
import time

import numpy as np
from _common import machine, print_table, write_json

ANCHOR = "direct_spin1+fix_spin_"


def _integrals(ncas: int):
    from pyscf import gto, mcscf, scf

    mol = gto.M(atom="N 0 0 0; N 0 0 1.098", basis="cc-pvdz", verbose=0)
    mf = scf.RHF(mol).run()
    mc = mcscf.CASCI(mf, ncas, ncas)
    h1, ecore = mc.get_h1eff()
    return mol, h1, mc.get_h2eff(), ecore


def csf_solver_or_none():
    """pyscf-forge's csf_solver, or None when pyscf-forge is not installed."""
    try:
        from pyscf.csf_fci import csf_solver
    except ImportError:
        return None
    return csf_solver


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _status_mib(field: str) -> float:
    """A memory line of /proc/self/status (VmRSS, VmHWM) in MiB; NaN where there is none."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def _solver_base() -> float:
    """Reset the peak-RSS mark (Linux: clear_refs 5) and return the RSS now, after imports and
    integrals: the solver's own peak is then VmHWM after its solve minus this (NaN elsewhere)."""
    import gc

    gc.collect()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return float("nan")
    return _status_mib("VmRSS")


class _Counted:
    """Counts the calls of the method `name` of obj's class until `undo` (the sigma vectors of a
    solve; the class, not the instance: PySCF warns of instance attributes that shadow one)."""

    def __init__(self, obj, name: str):
        self.cls, self.name, self.calls = type(obj), name, 0
        self.own = self.cls.__dict__.get(name)
        real = getattr(self.cls, name)

        def counted(this, *args, **kwargs):
            self.calls += 1
            return real(this, *args, **kwargs)

        setattr(self.cls, name, counted)

    def undo(self) -> int:
        if self.own is None:
            delattr(self.cls, self.name)
        else:
            setattr(self.cls, self.name, self.own)
        return self.calls


def _run(method: str, ncas: int, twos: int, threads: int, repeat: int, solve: bool, opts, queue):
    from pyscf import fci, lib

    lib.num_threads(threads)
    mol, h1, eri, ecore = _integrals(ncas)
    nelec = ((ncas + twos) // 2, (ncas - twos) // 2)
    out = {"setup_s": 0.0, "solve_s": float("nan"), "e": float("nan"), "sigma_s": float("nan")}
    out["solve_cpu_s"] = float("nan")
    out["sigma_min_s"] = float("nan")
    times = []
    if method.startswith("guga"):
        from cuscikit.guga import GUGASolver

        kw = {"df": True, "df_tol": opts["df"]} if method == "guga+df" else {}
        if opts["max_memory"] is not None:
            kw["max_memory"] = opts["max_memory"]
        if opts.get("sigma_method"):
            kw["sigma_method"] = opts["sigma_method"]
        solver = GUGASolver(spin=twos, threads=threads, conv_tol=1e-10, **kw)
        base = _solver_base()
        t0, c0 = time.perf_counter(), time.process_time()
        eng, matvec = solver._hop(h1, eri, ncas, nelec)  # DRT, integrals, loop table
        if eng.method == "lists":  # every coupling list (as far as the budget keeps them)
            for i in range(len(eng.blocks)):
                eng.lists(i)
        out["setup_s"] = time.perf_counter() - t0
        out["setup_cpu_s"] = time.process_time() - c0
        out["size"] = eng.ncsf
        out["list_mib"] = (eng.list_bytes + eng.loop_bytes) / 2**20
        if solve:
            counted = _Counted(eng, "contract")  # one call per sigma vector
            t1, c1 = time.perf_counter(), time.process_time()
            e, _ = solver.kernel(h1, eri, ncas, nelec, ecore=ecore)
            out["solve_s"] = out["setup_s"] + time.perf_counter() - t1
            out["solve_cpu_s"] = out["setup_cpu_s"] + time.process_time() - c1
            out["sigma_vectors"] = counted.undo()
            out["e"] = float(e)
            out["peak_mib"] = _peak_mib()
            out["own_mib"] = _status_mib("VmHWM") - base
        c = np.random.default_rng(0).standard_normal(eng.ncsf)
        for _ in range(repeat):
            t0 = time.perf_counter()
            matvec(c)
            times.append(time.perf_counter() - t0)
    elif method == "csf_solver":
        solver = csf_solver_or_none()(mol, smult=twos + 1)
        solver.conv_tol = 1e-10
        from math import comb

        out["size"] = comb(ncas, nelec[0]) * comb(ncas, nelec[1])
        if solve:
            _timed_solve(solver, h1, eri, ncas, nelec, ecore, out)
    else:
        from math import comb

        if method == "direct_spin0":
            solver = fci.direct_spin0.FCI()
        elif method == "direct_spin1":
            solver = fci.direct_spin1.FCI()
        else:
            s = 0.5 * twos
            solver = fci.addons.fix_spin_(fci.direct_spin1.FCI(), ss=s * (s + 1))
        solver.conv_tol = 1e-10
        shape = (comb(ncas, nelec[0]), comb(ncas, nelec[1]))
        out["size"] = shape[0] * shape[1]
        if solve:
            _timed_solve(solver, h1, eri, ncas, nelec, ecore, out)
        h2 = solver.absorb_h1e(h1, eri, ncas, nelec, 0.5)
        c = np.random.default_rng(0).standard_normal(shape)
        if method == "direct_spin0":
            c = c + c.T
        contract = (fci.direct_spin0 if method == "direct_spin0" else fci.direct_spin1).contract_2e
        for _ in range(repeat):
            t0 = time.perf_counter()
            contract(h2, c, ncas, nelec)
            times.append(time.perf_counter() - t0)
    if times:
        out["sigma_s"] = statistics.median(times)
        out["sigma_min_s"] = min(times)
    if "peak_mib" not in out:
        out["peak_mib"] = _peak_mib()
    queue.put(out)


def _timed_solve(solver, h1, eri, ncas, nelec, ecore, out: dict) -> None:
    """A full solve: wall and CPU seconds, the energy and the peak memory into `out`."""
    counted = _Counted(solver, "contract_2e")  # PySCF's Davidson: one call per sigma vector
    base = _solver_base()
    t0, c0 = time.perf_counter(), time.process_time()
    e, _ = solver.kernel(h1, eri, ncas, nelec, ecore=ecore)
    out["solve_s"] = time.perf_counter() - t0
    out["solve_cpu_s"] = time.process_time() - c0
    out["sigma_vectors"] = counted.undo()
    out["e"] = float(e)
    out["peak_mib"] = _peak_mib()
    out["own_mib"] = _status_mib("VmHWM") - base


def measure(method, ncas, twos, threads, repeat, solve=True, opts=None):
    """One method's sizes, times and energy, measured in a process of its own (a dict)."""
    opts = {"df": None, "max_memory": None} if opts is None else opts
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_run, args=(method, ncas, twos, threads, repeat, solve, opts, q))
    p.start()
    out = q.get()
    p.join()
    return out


def _median(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3, help="sigma calls per process")
    ap.add_argument("--rounds", type=int, default=1, help="anchor/GUGA alternations")
    ap.add_argument("--sizes", type=int, nargs="*", default=[10, 12])
    ap.add_argument("--spins", type=int, nargs="*", default=[0, 2], help="2S values")
    ap.add_argument("--sigma-only", action="store_true", help="no full solves")
    ap.add_argument("--df", type=float, default=None, help="also GUGA with Cholesky to TOL")
    ap.add_argument("--no-others", action="store_true", help="only the anchor and GUGA")
    ap.add_argument(
        "--sigma-method",
        choices=("loops", "lists"),
        default=None,
        help="GUGA's sigma: loop-driven or per-ket lists (default: the solver's)",
    )
    ap.add_argument(
        "--max-memory",
        type=float,
        default=None,
        help="GUGA's max_memory in MB (lists beyond "
        "half of what the vectors leave are searched again on every sigma)",
    )
    ap.add_argument("--json-out", default=None, help="also write the rows to this JSON file")
    ap.add_argument("--note", default="", help="how the machine was loaded (into the JSON)")
    args = ap.parse_args()
    opts = {"df": args.df, "max_memory": args.max_memory, "sigma_method": args.sigma_method}
    solve = not args.sigma_only
    # every BLAS of every solver on the same number of threads (numpy's OpenBLAS would take
    # all cores otherwise); the spawned processes inherit this before they import numpy
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(args.threads)
    print(f"machine: {machine()}; threads: {args.threads}")
    have_csf = csf_solver_or_none() is not None
    if not have_csf:
        print("csf_solver: pyscf-forge is not installed here; its row is left out")
    rows, records = [], []
    for ncas in args.sizes:
        for twos in args.spins:
            pair = [ANCHOR, "guga"] + (["guga+df"] if args.df is not None else [])
            runs: dict[str, list] = {m: [] for m in pair}
            for _ in range(max(1, args.rounds)):
                for m in pair:
                    r = measure(m, ncas, twos, args.threads, args.repeat, solve, opts)
                    runs[m].append(r)
            others = [] if args.no_others else ["direct_spin1"]
            others += ["direct_spin0"] if twos == 0 and not args.no_others else []
            others += ["csf_solver"] if have_csf and solve and not args.no_others else []
            for m in others:
                runs[m] = [measure(m, ncas, twos, args.threads, args.repeat, solve, opts)]
            keys = ("sigma_s", "solve_s", "solve_cpu_s", "e")
            anchor = {k: _median(runs[ANCHOR], k) for k in keys}
            for m, rs in runs.items():
                r = {k: _median(rs, k) for k in rs[0] if isinstance(rs[0][k], (int, float))}
                records.append(
                    {"ncas": ncas, "twos": twos, "solver": m, "rounds": len(rs)}
                    | r
                    | {
                        "sigma_min_s": min(x["sigma_min_s"] for x in rs),
                        "size": rs[0]["size"],
                        "anchor": ANCHOR,
                        "sigma_speedup": anchor["sigma_s"] / r["sigma_s"],
                        "solve_speedup": anchor["solve_s"] / r["solve_s"],
                        "de": r["e"] - anchor["e"],
                    }
                )
                rows.append(
                    [
                        f"({ncas},{ncas}) 2S={twos}",
                        m,
                        f"{rs[0]['size']:,}",
                        f"{r['sigma_s']:.3f}",
                        f"{min(x['sigma_min_s'] for x in rs):.3f}",
                        f"{anchor['sigma_s'] / r['sigma_s']:.2f}x",
                        f"{r['setup_s']:.2f}",
                        f"{r['solve_s']:.2f}",
                        f"{anchor['solve_s'] / r['solve_s']:.2f}x",
                        f"{r['solve_cpu_s']:.2f}",
                        f"{anchor['solve_cpu_s'] / r['solve_cpu_s']:.2f}x",
                        f"{r['e']:.10f}",
                        f"{r['e'] - anchor['e']:+.1e}",
                        f"{r['peak_mib']:.0f}",
                        f"{r.get('own_mib', float('nan')):.1f}",
                        f"{r.get('list_mib', float('nan')):.0f}",
                        f"{r.get('sigma_vectors', float('nan')):.0f}",
                    ]
                )
            print_table(
                f"GUGA CI vs PySCF (anchor: {ANCHOR} in this run; medians of {args.rounds} "
                "alternating rounds)",
                [
                    "space",
                    "solver",
                    "dim",
                    "sigma s",
                    "min s",
                    "vs anchor",
                    "setup s",
                    "solve s",
                    "vs anchor",
                    "solve CPU s",
                    "vs anchor",
                    "E (Ha)",
                    "dE",
                    "peak MiB",
                    "solve MiB",
                    "tables MiB",
                    "sigma vecs",
                ],
                rows,
            )
    if args.json_out:
        anchor_text = f"PySCF {ANCHOR} (determinant FCI, spin fixed), same cores, same run"
        write_json(args.json_out, "guga_cpu.py", anchor_text, args, records, args.note)


if __name__ == "__main__":
    main()
