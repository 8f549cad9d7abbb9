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
    18: ("F2", "F 0 0 0; F 0 0 1.412", 18),
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


def _n_csf(ncas: int, nelec: int) -> int:
    from cuscikit.guga.drt import DRT

    return int(DRT.weyl(ncas, nelec, 0))


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
    """Seconds of the three phases of one GPU sigma (gather of E c, GEMM, gather or scatter of
    sigma) with the engine's plan (G whole, chunks of rows, or tiles with the scatter) and its
    choice of one CSF per warp or per thread."""
    import torch

    k, s = eng.kernels, eng._stream()
    T_all, G_all = eng._buffers()
    out = torch.empty_like(c)
    t = {"gather": 0.0, "gemm": 0.0, "sigma": 0.0}

    def timed(key, fn):
        torch.cuda.synchronize()
        a = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        t[key] += time.perf_counter() - a

    if eng.mode == "scatter":
        e = eng.fixed_exponent(c, Vh)
        timed("sigma", eng._acc.zero_)
        for t0 in range(0, eng.ncsf, eng.rows):
            tc = min(eng.rows, eng.ncsf - t0)
            T, G = T_all[:tc], G_all[:tc]
            timed(
                "gather",
                lambda T=T, t0=t0: k.gather(
                    eng.core, t0, eng._symmap, eng.npair, c, T, False, None, True, s
                ),
            )
            timed("gemm", lambda T=T, G=G: eng._gemm(T, Vh, G))
            timed(
                "sigma", lambda G=G, t0=t0: k.scatter(eng.core, t0, eng._symmap, G, e, eng._acc, s)
            )
        timed("sigma", lambda: k.fixed_values(eng._acc, e, out, s))
        return t
    for g0 in range(0, eng.ncsf, eng.g_rows):
        gc = min(eng.g_rows, eng.ncsf - g0)
        G = G_all[:gc]
        for t0 in range(g0, g0 + gc, eng.rows):
            tc = min(eng.rows, g0 + gc - t0)
            order = eng.order()
            timed(
                "gather",
                lambda t0=t0, tc=tc, order=order: k.gather(
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
                ),
            )
            timed(
                "gemm",
                lambda t0=t0, tc=tc, G=G, g0=g0: eng._gemm(
                    T_all[:tc], Vh, G[t0 - g0 : t0 - g0 + tc]
                ),
            )
        so = None if eng.split_sigma else eng.order()
        timed(
            "sigma",
            lambda G=G, g0=g0, so=so: k.sigma(
                eng.core, 0, eng._symmap, G, g0, out, g0 > 0, eng.split_sigma, so, s
            ),
        )
    return t


# (one CSF per warp, tiles sorted by work, G by tiles with the scatter form of sigma)
VARIANTS = {
    "thread": (False, False, False),
    "sorted": (False, True, False),
    "warp": (True, False, False),
    "scatter": (False, False, True),
}


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
        for v in variants:
            eng.release()
            eng._plan(0, rows)
            if v is not None:
                eng.split_gather = eng.split_sigma = v[0]
                eng.balance = v[1]
                if v[2]:
                    eng.use_scatter(min(rows, eng.ncsf))
            t0 = time.perf_counter()
            eng.order()  # made once per table and tiling
            t_order = time.perf_counter() - t0
            ph = _gpu_phases(eng, c, Vh)
            kind = "warp" if eng.split_gather else "thread"
            kind += ", tiles sorted by work" if eng._balanced() and not eng.split_gather else ""
            kind += f", G {eng.mode}" + (f" ({eng.n_chunks} chunks)" if eng.mode == "rows" else "")
            text = ", ".join(f"{k} {v:.4f}" for k, v in ph.items())
            print(
                f"{label} GPU phases, tile {eng.rows}, one CSF per {kind} (s): {text}"
                f" (order made in {t_order:.3f} s)"
            )
            if eng.mode != "scatter" and sum(ph.values()) < best[0]:
                best = (sum(ph.values()), (eng.split_gather, eng.balance, eng.rows))
    if tune_rows and best[1] is not None:  # the timings and the solve use the fastest order
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
        psize = 400
        if ":" in precond:  # pspace:N, a P space of N CSFs
            precond, psize = precond.split(":")[0], int(precond.split(":")[1])
        if gpu:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        solver = GUGASolver(precond=precond, pspace_size=psize, **opts)
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
            f"{name} CAS({nelecas},{ncas}) {'GPU' if gpu else 'CPU'} solve, precond {precond} "
            f"({psize} CSFs): "
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


def _synced(fn, table, key, torch):
    """fn wrapped: the device is synchronised around each call and the seconds are added to
    table[key] (inclusive of what it calls)."""

    def wrapped(*a, **k):
        torch.cuda.synchronize()
        t = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            torch.cuda.synchronize()
            table[key] = table.get(key, 0.0) + time.perf_counter() - t

    return wrapped


def _patch_timed(patches, table, torch) -> list:
    """Each (obj, attr, key) of `patches` replaced by its `_synced` form (seconds into
    table[key]); returns the originals for `_restore`."""
    saved = [(obj, attr, getattr(obj, attr)) for obj, attr, _ in patches]
    for obj, attr, key in patches:
        setattr(obj, attr, _synced(getattr(obj, attr), table, key, torch))
    return saved


def _restore(saved) -> None:
    for obj, attr, fn in saved:
        setattr(obj, attr, fn)


def first_solves(ncas, folder, solves: int, profile=False, small_first=False) -> None:
    """The first GPU solves of a fresh process, each split into its steps (synchronised timers):
    the operator on the host, the engine, the diagonal, the P space, the start vectors, the
    sigma vectors, the preconditioner, Davidson's own work, and the device allocations
    (cudaMalloc calls of PyTorch's allocator). With ``profile`` the first solve runs under
    torch.profiler and its slowest operators are printed; with ``small_first`` a CAS(8,8) GPU
    solve runs before them. Then the time of fresh device allocations of 1 and 4 GiB."""
    import importlib

    import torch

    import cuscikit.guga.pspace as pspace_mod
    import cuscikit.guga.solver as solver_mod
    from cuscikit.guga import GUGASolver
    from cuscikit.guga.gpu import GpuEngine

    # the module (the package exports the function under the same name)
    dav_mod = importlib.import_module("cuscikit.linalg.davidson")
    t0 = time.perf_counter()
    torch.zeros(1, device="cuda")
    print(f"CUDA context: {time.perf_counter() - t0:.3f} s", flush=True)
    if small_first:  # a small GPU solve first: what stays of the first solve's costs is per size
        rng = np.random.default_rng(0)
        h = rng.standard_normal((8, 8))
        g = rng.standard_normal((36, 36))
        t0 = time.perf_counter()
        GUGASolver(device="cuda").kernel(h + h.T, g @ g.T / 36, 8, (4, 4))
        torch.cuda.synchronize()
        print(f"a CAS(8,8) GPU solve first: {time.perf_counter() - t0:.3f} s", flush=True)
    name, h1, eri, ecore, nelecas = _integrals(ncas, folder)
    nelec = (nelecas // 2, nelecas // 2)
    label = f"{name} CAS({nelecas},{ncas})"
    table: dict = {}
    its: list = []
    patches = [
        (GUGASolver, "_operator", "operator (host)"),
        (GUGASolver, "_engine", "engine"),
        (GpuEngine, "diagonal_device", "diagonal"),
        (GUGASolver, "_pspace", "P space (all)"),
        (pspace_mod, "pspace_hamiltonian", "P space H_PP"),
        (pspace_mod.PSpacePreconditioner, "__init__", "P space eigh"),
        (solver_mod, "_start_vectors", "start vectors"),
        (GpuEngine, "sigma", "sigma"),
        (pspace_mod.PSpacePreconditioner, "__call__", "preconditioner"),
    ]
    saved = _patch_timed(patches, table, torch)
    plain_dav = dav_mod.davidson

    def dav(*a, **k):
        def cb(it, e, r):
            torch.cuda.synchronize()
            its.append(time.perf_counter())

        k["callback"] = cb
        return plain_dav(*a, **k)

    dav_mod.davidson = _synced(dav, table, "davidson", torch)
    count = {"n": 0}
    plain_sigma = GpuEngine.sigma

    def counted(self, c, Vh):
        count["n"] += 1
        return plain_sigma(self, c, Vh)

    GpuEngine.sigma = counted
    try:
        for i in range(solves):
            table.clear()
            its.clear()
            count["n"] = 0
            stats0 = torch.cuda.memory_stats()
            solver = GUGASolver(conv_tol=1e-10, device="cuda")
            prof = None
            if profile and i == 0:
                from torch.profiler import ProfilerActivity
                from torch.profiler import profile as tprofile

                prof = tprofile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
                prof.__enter__()
            torch.cuda.synchronize()
            t = time.perf_counter()
            e, _ = solver.kernel(h1, eri, ncas, nelec, ecore=ecore)
            torch.cuda.synchronize()
            dt = time.perf_counter() - t
            if prof is not None:
                prof.__exit__(None, None, None)
            stats1 = torch.cuda.memory_stats()
            mallocs = stats1["segment.all.allocated"] - stats0["segment.all.allocated"]
            steps = ", ".join(f"{k} {v:.3f}" for k, v in table.items())
            gaps = np.diff(its) if len(its) > 1 else []
            print(
                f"{label} solve {i + 1} of the process: {dt:.3f} s, {count['n']} sigma vectors, "
                f"E = {float(e):.12f}, device allocations {mallocs}; steps (s, inclusive): "
                f"{steps}; Davidson iterations (s): {' '.join(f'{g:.3f}' for g in gaps)}",
                flush=True,
            )
            if prof is not None:
                print(
                    prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25),
                    flush=True,
                )
                slow = sorted(prof.events(), key=lambda ev: -ev.cpu_time_total)
                slow = [ev for ev in slow if ev.cpu_time_total > 5000][:40]
                for ev in sorted(slow, key=lambda ev: ev.time_range.start):
                    print(
                        f"  slow op at {ev.time_range.start / 1e6:.3f} s: {ev.name} "
                        f"{ev.cpu_time_total / 1e3:.1f} ms",
                        flush=True,
                    )
            del solver
    finally:
        GpuEngine.sigma = plain_sigma
        _restore(saved)
        dav_mod.davidson = plain_dav
    for gib in (1, 4, 1, 4):
        torch.cuda.empty_cache()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        x = torch.empty(gib << 30, dtype=torch.uint8, device="cuda")
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        x.fill_(1)
        torch.cuda.synchronize()
        print(
            f"fresh device allocation of {gib} GiB: {t1 - t0:.4f} s, first fill "
            f"{time.perf_counter() - t1:.4f} s",
            flush=True,
        )
        del x


def big_solve(ncas, folder, limit: float, args) -> None:
    """One GPU solve of a space whose G does not fit (the scatter form), with the Davidson space
    partly spilled to pinned host memory (``--gpu-space`` columns resident). Every step and every
    sigma vector is timed (synchronised) and every Davidson iteration printed (energy, its
    change, residual norm, seconds since the start); the solve stops, unconverged, when the next
    sigma vector would end past ``limit`` seconds after the start (so that a run within a time
    limit still reports where it got)."""
    import importlib

    import torch

    import cuscikit.guga.pspace as pspace_mod
    from cuscikit.guga import GUGASolver
    from cuscikit.guga.gpu import GpuEngine

    dav_mod = importlib.import_module("cuscikit.linalg.davidson")
    name, h1, eri, ecore, nelecas = _integrals(ncas, folder)
    nelec = (nelecas // 2, nelecas // 2)
    label = f"{name} CAS({nelecas},{ncas})"
    if args.tile_rows:
        GpuEngine.tile_rows = args.tile_rows
    GpuEngine.fixed_bits = args.fixed_bits[0]
    table: dict = {}
    sig: list = []
    patches = [
        (GUGASolver, "_engine", "engine"),
        (GpuEngine, "diagonal_device", "diagonal"),
        (GUGASolver, "_pspace", "P space (all)"),
        (pspace_mod, "pspace_hamiltonian", "P space H_PP"),
        (pspace_mod.PSpacePreconditioner, "__call__", "preconditioner"),
    ]
    saved = _patch_timed(patches, table, torch)
    plain_sigma = GpuEngine.sigma

    def timed_sigma(self, c, Vh):
        torch.cuda.synchronize()
        t = time.perf_counter()
        out = plain_sigma(self, c, Vh)
        torch.cuda.synchronize()
        sig.append(time.perf_counter() - t)
        print(
            f"  sigma {len(sig)}: {sig[-1]:.2f} s (mode {self.mode}, tiles of {self.rows})",
            flush=True,
        )
        return out

    GpuEngine.sigma = timed_sigma
    plain_dav = dav_mod.davidson
    t_start = time.perf_counter()
    last = [np.inf]

    def dav(*a, **k):
        def cb(it, e, r):
            now = time.perf_counter() - t_start
            de = float(np.max(np.abs(e - last[0]))) if np.all(np.isfinite(last[0])) else np.inf
            last[0] = np.array(e)
            print(
                f"  iteration {it}: E = {float(e[0]) + ecore:.12f}, |dE| {de:.2e}, residual "
                f"{float(np.max(r)):.2e}, {now:.1f} s",
                flush=True,
            )
            return bool(sig) and now + 1.1 * max(sig) > limit

        k["callback"] = cb
        return plain_dav(*a, **k)

    dav_mod.davidson = dav
    try:
        torch.cuda.reset_peak_memory_stats()
        solver = GUGASolver(
            conv_tol=args.conv_tol,
            device="cuda",
            max_space=args.max_space,
            gpu_space=args.gpu_space,
            gpu_memory=args.gpu_memory,
        )
        t_start = time.perf_counter()
        e, _ = solver.kernel(h1, eri, ncas, nelec, ecore=ecore)
        dt = time.perf_counter() - t_start
    finally:
        GpuEngine.sigma = plain_sigma
        dav_mod.davidson = plain_dav
        _restore(saved)
    eng = next(iter(solver._engines.values()))
    steps = ", ".join(f"{k} {v:.2f}" for k, v in table.items())
    print(
        f"{label} GPU solve: {eng.ncsf:,} CSFs, {dt:.1f} s, {len(sig)} sigma vectors "
        f"(median {statistics.median(sig):.2f} s), E = {float(e):.12f}, converged "
        f"{solver.converged} (conv_tol {args.conv_tol:g}), max_space {args.max_space}, "
        f"columns of V and of AV on the GPU {eng.davidson_resident} (None: all), "
        f"fixed_bits {GpuEngine.fixed_bits}, GPU peak "
        f"{torch.cuda.max_memory_allocated() / 2**30:.1f} GiB; steps (s): {steps}",
        flush=True,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sizes", type=int, nargs="*", default=[12, 14, 16], choices=[12, 14, 16, 18])
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
        help="orders to time with --tune-rows (thread, sorted, warp; scatter: G by tiles)",
    )
    ap.add_argument(
        "--precond",
        nargs="*",
        default=["pspace"],
        help="solve with each of these Davidson preconditioners (the table shows the first): "
        "pspace, pspace:N (a P space of N CSFs, default 400), diagonal",
    )
    ap.add_argument(
        "--tune-rows",
        type=int,
        nargs="*",
        default=[],
        help="time the phases for these tile sizes, both orders, and solve with the fastest",
    )
    ap.add_argument(
        "--first-solve",
        type=int,
        default=0,
        help="only time this many solves of a fresh process, step by step (the first size)",
    )
    ap.add_argument("--profile", action="store_true", help="with --first-solve: torch.profiler")
    ap.add_argument(
        "--small-first", action="store_true", help="with --first-solve: a CAS(8,8) solve first"
    )
    ap.add_argument(
        "--sigma-only",
        action="store_true",
        help="only the phases of one GPU sigma per size (--tune-rows, --variants; CAS(18,18))",
    )
    ap.add_argument(
        "--big-solve",
        type=float,
        default=0,
        help="only one GPU solve per size, stopped before this many seconds (CAS(18,18): "
        "--gpu-space, --max-space, --tile-rows, --conv-tol)",
    )
    ap.add_argument("--gpu-space", type=int, default=None, help="Davidson columns on the GPU")
    ap.add_argument("--max-space", type=int, default=12, help="Davidson space (--big-solve)")
    ap.add_argument("--tile-rows", type=int, default=0, help="kets per tile (--big-solve)")
    ap.add_argument("--conv-tol", type=float, default=1e-10, help="with --big-solve")
    ap.add_argument(
        "--fixed-bits",
        type=int,
        nargs="*",
        default=[62],
        help="the scatter's fixed-point margin (GpuEngine.fixed_bits); --sigma-only times each",
    )
    args = ap.parse_args()
    if args.big_solve:
        print(f"machine: {machine()}")
        for ncas in args.sizes:
            big_solve(ncas, args.integrals, args.big_solve, args)
        return
    if args.sigma_only:
        from cuscikit.guga import GUGASolver

        print(f"machine: {machine()}")
        for ncas in args.sizes:
            name, h1, eri, _, nelecas = _integrals(ncas, args.integrals)
            label = f"{name} CAS({nelecas},{ncas}) {_n_csf(ncas, nelecas):,} CSFs"
            # a small Davidson reserve: the engine's budget is what the phases need
            solver = GUGASolver(device="cuda", max_space=2, gpu_memory=args.gpu_memory)
            nelec = (nelecas // 2, nelecas // 2)
            from cuscikit.guga.gpu import GpuEngine

            for bits in args.fixed_bits:
                GpuEngine.fixed_bits = bits
                print(f"{label}: scatter fixed_bits {bits}", flush=True)
                _tune(solver, h1, eri, ncas, nelec, label, args.tune_rows, args.variants)
        return
    if args.first_solve:
        first_solves(
            args.sizes[0], args.integrals, args.first_solve, args.profile, args.small_first
        )
        return
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
