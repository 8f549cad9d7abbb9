"""GUGA CI on the GPU against the CPU GUGA solver of the same machine.

Singlet CASCI spaces from RHF orbitals: N2/cc-pVDZ at 1.098 A CAS(12,12) and (14,14) (every
electron of N2 in the 14 lowest orbitals), and F2/cc-pVDZ at 1.412 A CAS(16,16) (N2 has only
14 electrons; F2's ground state is a non-degenerate singlet, its 1s core pair frozen). For each
space: the median time of one sigma vector (H c, a random vector, after a warm-up), the time of
a full solve (one root, conv_tol 1e-10, no guess, engine set-up included), the energy, and the
peak GPU memory of the solve. The CPU GUGA solver runs on every core of the machine up to
--cpu-max CSFs (its solve only up to --cpu-solve-max).

Anchor: PySCF's direct_spin1 on the 16 cores of the GPU machine, measured there for N2/cc-pVDZ
CAS(14,14) singlet: sigma 2.87 s, solve 43 s (PySCF is not installed on that machine; the
numbers are quoted, not measured in this run).

Integrals come from PySCF (``--save DIR`` writes them as compressed .npz files) or from such
files (``--integrals DIR``), so that a machine without PySCF can run the benchmark:

    python benchmarks/guga_gpu.py --save out/guga-integrals          # where PySCF is
    python benchmarks/guga_gpu.py --integrals out/guga-integrals     # on the GPU machine

Before the timings, the phases of one GPU sigma (gather of E c, GEMM, gather of sigma) are
printed; with ``--tune-rows 65536 262144 ...`` for each tile size and both orders (one CSF per
thread or per warp), and the timings and the solve then use the fastest (printed).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
from _common import machine, print_table

SPACES = {
    12: ("N2", "N 0 0 0; N 0 0 1.098", 12),
    14: ("N2", "N 0 0 0; N 0 0 1.098", 14),
    16: ("F2", "F 0 0 0; F 0 0 1.412", 16),
}
ANCHOR = {14: (2.87, 43.0)}  # PySCF direct_spin1, 16 cores of the GPU machine: sigma s, solve s


def _pyscf_integrals(ncas: int):
    from pyscf import gto, mcscf, scf

    name, atom, nelecas = SPACES[ncas]
    mol = gto.M(atom=atom, basis="cc-pvdz", verbose=0)
    mf = scf.RHF(mol).run(conv_tol=1e-10)
    mc = mcscf.CASCI(mf, ncas, nelecas)
    h1, ecore = mc.get_h1eff()
    return name, np.asarray(h1), np.asarray(mc.get_h2eff()), float(ecore), nelecas


def _integrals(ncas: int, folder: str | None):
    if folder is None:
        return _pyscf_integrals(ncas)
    z = np.load(os.path.join(folder, f"cas{ncas}.npz"))
    return str(z["name"]), z["h1"], z["eri"], float(z["ecore"]), int(z["nelec"])


def _sigma_time(solver, h1, eri, ncas, nelec, repeat: int, gpu: bool) -> tuple[float, float]:
    """(set-up seconds, median sigma seconds) of this solver's operator."""
    t0 = time.perf_counter()
    eng, matvec = solver._hop(h1, eri, ncas, nelec)
    c = np.random.default_rng(0).standard_normal(eng.ncsf)
    if gpu:
        import torch

        c = torch.as_tensor(c, device=eng.device)
        sync = torch.cuda.synchronize
    else:
        eng.lists(0)

        def sync():
            return None

    setup = time.perf_counter() - t0
    matvec(c)  # warm-up
    sync()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        matvec(c)
        sync()
        times.append(time.perf_counter() - t0)
    return setup, statistics.median(times)


def _gpu_phases(eng, c, Vh) -> dict:
    """Seconds of the three phases of one GPU sigma (gather of E c, GEMM, gather of sigma) with
    the engine's choice of one CSF per warp or per thread."""
    import torch

    k, s = eng.kernels, eng._stream()
    T_all, G_all = eng._buffers()
    out = torch.empty_like(c)
    t = {"gather": 0.0, "gemm": 0.0, "sigma": 0.0}
    for g0 in range(0, eng.ncsf, eng.g_rows):
        gc = min(eng.g_rows, eng.ncsf - g0)
        G = G_all[:gc]
        for t0 in range(g0, g0 + gc, eng.rows):
            tc = min(eng.rows, g0 + gc - t0)
            torch.cuda.synchronize()
            a = time.perf_counter()
            order = eng.order()
            k.gather(
                eng.core,
                t0,
                eng._symmap,
                eng.npair,
                c,
                T_all[:tc],
                eng.split_gather,
                order,
                True,
                s,
            )
            torch.cuda.synchronize()
            b = time.perf_counter()
            torch.matmul(T_all[:tc], Vh, out=G[t0 - g0 : t0 - g0 + tc])
            torch.cuda.synchronize()
            t["gather"] += b - a
            t["gemm"] += time.perf_counter() - b
        a = time.perf_counter()
        so = None if eng.split_sigma else eng.order()
        k.sigma(eng.core, 0, eng._symmap, G, g0, out, g0 > 0, eng.split_sigma, so, s)
        torch.cuda.synchronize()
        t["sigma"] += time.perf_counter() - a
    return t


VARIANTS = {"thread": (False, False), "sorted": (False, True), "warp": (True, False)}


def _tune(solver, h1, eri, ncas, nelec, label, tune_rows, variants=tuple(VARIANTS)) -> None:
    """Print the phases of one GPU sigma for each tile size in `tune_rows` and three orders (one
    CSF per thread with the tiles sorted by work or not, one CSF per warp), and make the fastest
    the GpuEngine defaults; without tile sizes, print the phases of the defaults."""
    import torch

    from cuscikit.guga.gpu import GpuEngine

    eng, _ = solver._hop(h1, eri, ncas, nelec)
    c = torch.as_tensor(np.random.default_rng(0).standard_normal(eng.ncsf), device=eng.device)
    Vh = eng.operator(0.5 * np.eye(eng.npair))
    best = (np.inf, None)
    variants = [VARIANTS[v] for v in variants] if tune_rows else [None]
    for rows in tune_rows or [eng.rows]:
        eng.release()
        eng._plan(0, rows)
        for v in variants:
            if v is not None:
                eng.split_gather = eng.split_sigma = v[0]
                eng.balance = v[1]
            t0 = time.perf_counter()
            eng.order()  # made once per table and tiling
            t_order = time.perf_counter() - t0
            ph = _gpu_phases(eng, c, Vh)
            kind = "warp" if eng.split_gather else "thread"
            kind += ", tiles sorted by work" if eng._balanced() and not eng.split_gather else ""
            text = ", ".join(f"{k} {v:.4f}" for k, v in ph.items())
            print(
                f"{label} GPU phases, tile {eng.rows}, one CSF per {kind} (s): {text}"
                f" (order made in {t_order:.3f} s)"
            )
            if sum(ph.values()) < best[0]:
                best = (sum(ph.values()), (eng.split_gather, eng.balance, eng.rows))
    if tune_rows:  # the timings and the solve after this run with the fastest order
        GpuEngine.split_gather, GpuEngine.balance, GpuEngine.tile_rows = best[1]
        GpuEngine.split_sigma = GpuEngine.split_gather
    print(
        f"{label}: split_gather, balance, tile_rows, split_sigma = "
        f"{GpuEngine.split_gather, GpuEngine.balance, GpuEngine.tile_rows, GpuEngine.split_sigma}",
        flush=True,
    )
    eng.release()


def run_case(
    ncas,
    folder,
    device,
    threads,
    repeat,
    solve=True,
    gpu_memory=None,
    tune_rows=(),
    precs=None,
    variants=tuple(VARIANTS),
):
    precs = precs or ["pspace"]
    from cuscikit.guga import GUGASolver

    name, h1, eri, ecore, nelecas = _integrals(ncas, folder)
    nelec = (nelecas // 2, nelecas // 2)
    gpu = device != "cpu"
    out = {"name": name}
    if gpu:
        import torch

    opts = dict(conv_tol=1e-10, device=device, threads=threads)
    if gpu:
        opts["gpu_memory"] = gpu_memory
    if gpu:
        label = f"{name} CAS({nelecas},{ncas})"
        _tune(GUGASolver(**opts), h1, eri, ncas, nelec, label, tune_rows, variants)
    solver = GUGASolver(**opts)
    out["setup_s"], out["sigma_s"] = _sigma_time(solver, h1, eri, ncas, nelec, repeat, gpu)
    del solver
    if gpu:
        from cuscikit.guga.gpu import GpuEngine

        out["orders"] = (GpuEngine.split_gather, GpuEngine.tile_rows, GpuEngine.split_sigma)
    if not solve:
        return out
    from cuscikit.guga import pspace as pspace_mod

    for precond in precs:  # the first is the table's; the others are printed
        if gpu:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        solver = GUGASolver(precond=precond, **opts)
        calls, t_ps = [0], [0.0]
        if gpu:  # count the sigma vectors of the solve
            from cuscikit.guga import gpu as gpu_mod

            plain = gpu_mod.GpuEngine.sigma

            def counted(self, c, Vh, plain=plain, calls=calls):
                calls[0] += 1
                return plain(self, c, Vh)

            gpu_mod.GpuEngine.sigma = counted
        plain_ps = pspace_mod.pspace_hamiltonian

        def timed_ps(*a, plain_ps=plain_ps, t_ps=t_ps, **k):
            t = time.perf_counter()
            r = plain_ps(*a, **k)
            t_ps[0] += time.perf_counter() - t
            return r

        pspace_mod.pspace_hamiltonian = timed_ps
        t0 = time.perf_counter()
        e, _ = solver.kernel(h1, eri, ncas, nelec, ecore=ecore)
        dt = time.perf_counter() - t0
        pspace_mod.pspace_hamiltonian = plain_ps
        if gpu:
            gpu_mod.GpuEngine.sigma = plain
        print(
            f"{name} CAS({nelecas},{ncas}) {'GPU' if gpu else 'CPU'} solve, precond {precond}: "
            f"{dt:.2f} s, {calls[0] if gpu else '-'} sigma vectors, P space {t_ps[0]:.2f} s, "
            f"E = {float(e):.12f}, converged {solver.converged}",
            flush=True,
        )
        if "solve_s" not in out:
            out["solve_s"], out["e"] = dt, float(e)
            if gpu:
                out["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    e = out["e"]
    out["e"] = float(e)
    out["converged"] = bool(solver.converged)
    out["n_csf"] = next(iter(solver._engines.values())).ncsf
    if gpu:
        eng = next(iter(solver._engines.values()))
        out["chunks"] = eng.n_chunks
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sizes", type=int, nargs="*", default=[12, 14, 16], choices=[12, 14, 16])
    ap.add_argument("--integrals", help="folder of cas<N>.npz files (else PySCF)")
    ap.add_argument("--save", help="write cas<N>.npz integrals to this folder and exit")
    ap.add_argument("--threads", type=int, default=0, help="CPU threads (0: all)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cpu-max", type=float, default=3e6, help="CPU sigma up to this many CSFs")
    ap.add_argument("--cpu-solve-max", type=float, default=3e5, help="CPU solve up to this")
    ap.add_argument("--gpu-memory", type=float, default=None, help="GPU cap in MB")
    ap.add_argument(
        "--variants",
        nargs="*",
        default=list(VARIANTS),
        choices=list(VARIANTS),
        help="kernel orders to time with --tune-rows (per thread, per thread sorted, per warp)",
    )
    ap.add_argument(
        "--precond",
        nargs="*",
        default=["pspace"],
        choices=["pspace", "diagonal"],
        help="solve with each of these Davidson preconditioners (the table shows the first)",
    )
    ap.add_argument(
        "--tune-rows",
        type=int,
        nargs="*",
        default=[],
        help="time the phases for these tile sizes, both orders, and solve with the fastest",
    )
    args = ap.parse_args()
    if args.save:
        os.makedirs(args.save, exist_ok=True)
        for ncas in args.sizes:
            name, h1, eri, ecore, nelecas = _pyscf_integrals(ncas)
            path = os.path.join(args.save, f"cas{ncas}.npz")
            np.savez_compressed(path, name=name, h1=h1, eri=eri, ecore=ecore, nelec=nelecas)
            print("wrote", path)
        return
    from cuscikit.guga.drt import DRT

    print(f"machine: {machine()}; CPU threads: {args.threads or os.cpu_count()}")
    rows = []
    for ncas in args.sizes:
        n_csf = DRT.weyl(ncas, SPACES[ncas][2], 0)
        g = run_case(
            ncas,
            args.integrals,
            "cuda",
            args.threads,
            args.repeat,
            gpu_memory=args.gpu_memory,
            tune_rows=args.tune_rows,
            precs=args.precond,
            variants=args.variants,
        )
        c = None
        if n_csf <= args.cpu_max:
            solve = n_csf <= args.cpu_solve_max
            c = run_case(
                ncas, args.integrals, "cpu", args.threads, args.repeat, solve, precs=args.precond
            )
        anchor = ANCHOR.get(ncas)
        space = f"{g['name']} CAS({SPACES[ncas][2]},{ncas})"
        rows.append(
            [
                space,
                f"{g['n_csf']:,}",
                f"{g['sigma_s']:.4f}",
                f"{c['sigma_s']:.3f}" if c else "-",
                f"{anchor[0]:.2f}" if anchor else "-",
                f"{g['solve_s']:.2f}",
                f"{c['solve_s']:.2f}" if c and "solve_s" in c else "-",
                f"{anchor[1]:.0f}" if anchor else "-",
                f"{anchor[1] / g['solve_s']:.0f}x" if anchor else "-",
                f"{g['e']:.10f}",
                f"{g['e'] - c['e']:+.1e}" if c and "e" in c else "-",
                f"{g['peak_gib']:.1f}",
                str(g["chunks"]),
            ]
        )
        print_table(
            "GUGA CI: GPU vs CPU GUGA (same machine) vs PySCF direct_spin1 (16 cores, quoted)",
            [
                "space",
                "CSFs",
                "GPU sigma s",
                "CPU sigma s",
                "PySCF sigma s",
                "GPU solve s",
                "CPU solve s",
                "PySCF solve s",
                "vs PySCF",
                "E GPU (Ha)",
                "E GPU - CPU",
                "GPU peak GiB",
                "G chunks",
            ],
            rows,
        )


if __name__ == "__main__":
    main()
