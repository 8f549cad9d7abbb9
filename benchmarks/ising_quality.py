"""dSB solution quality on MAX-CUT benchmarks (G-set, K2000) at equal wall time, against a plain
simulated annealing and the PyPI package simulated-bifurcation (discrete mode without early
stopping, and its defaults), with the best-known cut as the anchor.

Plain simulated annealing (baselines, not tuned): single-spin Metropolis sweeps with a geometric
temperature schedule (beta 0.1 -> 3 / mean|J|), the number of sweeps fitted to the time, on the CPU
(``sa``: numpy and scipy.sparse, ``--sa-replicas`` replicas) and on the GPU (``sa-gpu``:
PyTorch, float32, ``--agents`` replicas). Both sweep the spins by colour class of a greedy
colouring of the graph, so the spins updated together are never coupled and each sweep is an
exact sequential Metropolis sweep in class order (a dense graph has one spin per class).

dSB runs first (``--steps`` steps, or restarts within ``--time-budget``); each GPU or package
baseline then gets the same wall time. The CPU SA runs in a second process at the same time as
dSB and the other baselines of its graph (it needs one core), for the same wall time (the time
budget, or dSB's wall time without one). Graphs are read from ``--gset-dir`` (default:
$CUSCIKIT_GSET_DIR), a folder holding the G-set files and a ``best_known.json`` with each
graph's file and best-known cut; nothing is copied.

``--reduce auto|on|off`` is `solve`'s reduce option (the exact degree <= 2 kernel); ``--json-out
FILE`` also writes the rows (one dict each, keys `JSON_KEYS`) and the settings as JSON, the form
`benchmarks/results/` keeps and notebook 05 reads.

Several values of --agents, --steps and --dt run every combination (the baselines get the wall
time of the first). ``t_found_s`` is the end of the run (restart) that first reached the final
best. On CUDA one tiny solve first loads the module and creates the context, outside the timings.

    python benchmarks/ising_quality.py --graphs G1 G43 --agents 32 --steps 1000 --device cpu
    python benchmarks/ising_quality.py --device cuda --graphs K2000 --agents 1024 \\
        --steps 1000 2000 --dt 0.5 1.0 --time-budget 1 --baselines sa sa-gpu sb-default
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import time
import warnings
from pathlib import Path

import numpy as np
from _common import machine, print_table, write_json

from cuscikit.ising import IsingModel, solve

JSON_KEYS = [  # the printed table's columns, in order
    "graph", "n", "best_known", "agents", "steps", "dt", "dsb_cut", "gap_pct", "runs",
    "t_found_s", "wall_s", "kernel_n", "sa_cpu_cut", "sa_gpu_cut", "sb_pkg_dsb_cut",
    "sb_pkg_default_cut",
]  # fmt: skip


def simulated_annealing(model: IsingModel, replicas: int, seconds: float, seed: int) -> float:
    """Best energy of plain Metropolis SA on the CPU (numpy) in `seconds`: the sweeps of
    `simulated_annealing_gpu` (class by class of `colour_classes`) with sparse products."""
    rng = np.random.default_rng(seed)
    J = model.J.tocsc().astype(np.float64)
    h = model.h.astype(np.float64)[:, None]
    classes = colour_classes(model)
    Jc = [J[:, c].tocsr() for c in classes]
    s = rng.choice([-1.0, 1.0], (model.n, replicas))
    a = np.asarray(J @ s) + h  # local fields
    scale = np.abs(J.data).mean() if J.nnz else 1.0

    def sweep(beta):
        for c, Jcol in zip(classes, Jc, strict=True):
            sc = s[c]
            d = 2 * sc * a[c]  # energy change of each flip
            u = rng.random(d.shape)
            flip = (d <= 0) | (u < np.exp(-beta * np.maximum(d, 0)))
            delta = np.where(flip, -2 * sc, 0.0)
            s[c] = sc + delta
            np.add(a, Jcol @ delta, out=a)

    def energy():
        return float((-0.5 * (s * (a + h)).sum(0)).min())

    t0 = time.perf_counter()
    sweep(0.1 / scale)
    per_sweep = time.perf_counter() - t0
    sweeps = max(1, int((seconds - per_sweep) / per_sweep))
    best = energy()
    for beta in np.geomspace(0.1 / scale, 3.0 / scale, sweeps):
        sweep(beta)
        best = min(best, energy())
    return best


def colour_classes(model: IsingModel) -> list[np.ndarray]:
    """Greedy colouring in index order: classes of mutually uncoupled spins."""
    J = model.J.tocsr()
    colour = np.full(model.n, -1, np.int64)
    for i in range(model.n):
        used = colour[J.indices[J.indptr[i] : J.indptr[i + 1]]]
        free = np.ones(len(used) + 1, bool)
        free[used[(used >= 0) & (used <= len(used))]] = False
        colour[i] = int(np.argmax(free))
    return [np.flatnonzero(colour == c) for c in range(colour.max() + 1)]


def simulated_annealing_gpu(
    model: IsingModel, replicas: int, seconds: float, seed: int, device: str = "cuda"
):
    """Best energy of plain Metropolis SA on the GPU (PyTorch) in `seconds`, or None without
    a CUDA PyTorch. Sweeps go class by class (`colour_classes`); fields a = J s + h are kept up
    to date with one product per class. float32 with integer couplings: exact sums."""
    try:
        import torch
    except ImportError:
        return None
    if device == "cuda" and not torch.cuda.is_available():
        return None
    dev = torch.device(device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    torch.backends.cuda.matmul.allow_tf32 = False  # exact integer sums in float32
    gen = torch.Generator(device=dev).manual_seed(seed)
    classes = colour_classes(model)
    J = torch.tensor(model.J.toarray(), dtype=torch.float32, device=dev)
    h = torch.tensor(model.h, dtype=torch.float32, device=dev)[:, None]
    cols = [torch.tensor(c, device=dev) for c in classes]
    Jc = [J[:, c].contiguous() for c in cols]
    del J
    s = torch.randint(0, 2, (model.n, replicas), generator=gen, device=dev).float() * 2 - 1
    a = torch.zeros_like(s)
    for c, Jcol in zip(cols, Jc, strict=True):
        a += Jcol @ s[c]
    a += h
    data = model.J.data
    scale = float(np.abs(data).mean()) if len(data) else 1.0

    def sweep(beta):
        for c, Jcol in zip(cols, Jc, strict=True):
            sc = s[c]
            d = 2 * sc * a[c]  # energy change of each flip
            u = torch.rand(d.shape, generator=gen, device=dev)
            flip = (d <= 0) | (u < torch.exp(-beta * d.clamp(min=0)))
            delta = torch.where(flip, -2 * sc, torch.zeros_like(sc))
            s[c] = sc + delta
            a.addmm_(Jcol, delta)

    def energy():
        return float((-0.5 * (s * (a + h)).sum(0)).min())

    sync()
    t0 = time.perf_counter()
    sweep(0.1 / scale)
    sync()
    per_sweep = time.perf_counter() - t0
    sweeps = max(1, int((seconds - per_sweep) / per_sweep))
    best = energy()
    for k, beta in enumerate(np.geomspace(0.1 / scale, 3.0 / scale, sweeps)):
        sweep(float(beta))
        if k % 16 == 15 or k == sweeps - 1:
            best = min(best, energy())
    return best


def _sa_worker(path, replicas, seconds, seed):
    return simulated_annealing(IsingModel.from_gset(path), replicas, seconds, seed)


def sb_package(model: IsingModel, seconds: float, discrete: bool, agents: int, device: str):
    """Best energy from the simulated-bifurcation package under a timeout, or None."""
    try:
        import simulated_bifurcation as sb
        import torch
    except ImportError:
        return None
    J = torch.tensor(model.J.toarray(), dtype=torch.float32)
    h = torch.tensor(model.h, dtype=torch.float32)
    kw = dict(domain="spin", device=device, verbose=False, timeout=seconds)
    if discrete:
        kw |= dict(mode="discrete", early_stopping=False, agents=agents, max_steps=10**7)
    with warnings.catch_warnings():  # "no agent has converged": expected under a timeout
        warnings.simplefilter("ignore")
        spins, _ = sb.minimize(-J / 2, -h, **kw)
    return model.energy(spins.cpu().numpy().astype(np.int64))


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--gset-dir", default=os.environ.get("CUSCIKIT_GSET_DIR", ""))
    ap.add_argument("--graphs", nargs="+", default=["G1", "G22", "G43", "K2000"])
    ap.add_argument("--agents", type=int, nargs="+", default=[100])
    ap.add_argument("--steps", type=int, nargs="+", default=[1000])
    ap.add_argument("--dt", type=float, nargs="+", default=[0.5])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument(
        "--time-budget",
        type=float,
        default=None,
        help="dSB restarts within this many seconds (and every method gets it)",
    )
    ap.add_argument("--polish", action="store_true", help="finish with greedy single flips")
    ap.add_argument("--sa-replicas", type=int, default=16)
    ap.add_argument(
        "--baselines",
        nargs="*",
        default=["sa", "sa-gpu", "sb-dsb", "sb-default"],
        choices=["sa", "sa-gpu", "sb-dsb", "sb-default"],
        help="baselines run at the wall time of the graph's first dSB setting",
    )
    ap.add_argument("--reduce", choices=("auto", "on", "off"), default="auto")
    ap.add_argument("--no-baselines", action="store_true", help="the same as --baselines alone")
    ap.add_argument(
        "--json-out", default=None, help="also write the rows (one dict each) to this JSON file"
    )
    args = ap.parse_args()
    baselines = set() if args.no_baselines else set(args.baselines)
    gdir = Path(args.gset_dir)
    if not (gdir / "best_known.json").is_file():
        raise SystemExit(f"no best_known.json in {gdir}: give the graphs' folder with --gset-dir")
    best_known = json.loads((gdir / "best_known.json").read_text())
    reduce = {"auto": "auto", "on": True, "off": False}[args.reduce]
    if args.device == "cuda":  # CUDA context and module load, once, outside every timing
        solve(IsingModel.from_edges(2, [(0, 1, 1)]), agents=1, steps=2, device="cuda")
        tiny = IsingModel.from_edges(3, [(0, 1, 1), (1, 2, 1)])
        if "sa-gpu" in baselines:
            simulated_annealing_gpu(tiny, 4, 0.05, 0)
        if baselines & {"sb-dsb", "sb-default"}:
            sb_package(tiny, 0.05, True, 4, "cuda")
    pool = mp.get_context("spawn").Pool(1) if "sa" in baselines else None
    rows = []
    settings = [(a, s, d) for a in args.agents for s in args.steps for d in args.dt]
    for g in args.graphs:
        model = IsingModel.from_gset(gdir / best_known[g]["file"])
        wtot = -model.offset

        def cut(e, wtot=wtot):
            return None if e is None else int(round((wtot - e) / 2))

        ref = best_known[g]["best_cut"]
        first_wall = None
        sa_job = None
        if pool is not None:  # the CPU SA runs beside the GPU work, for the same time
            sa_seconds = args.time_budget if args.time_budget else None
            if sa_seconds is not None:
                sa_job = pool.apply_async(
                    _sa_worker,
                    (gdir / best_known[g]["file"], args.sa_replicas, sa_seconds, args.seed),
                )
        for agents, steps, dt in settings:
            r = solve(
                model,
                agents=agents,
                steps=steps,
                dt=dt,
                seed=args.seed,
                device=args.device,
                time_limit=args.time_budget,
                polish=args.polish,
                reduce=reduce,
            )
            if model.energy(r.spins) != r.energy:  # the reported energy must be the spins'
                raise SystemExit(f"{g}: reported energy {r.energy} is not that of the spins")
            t = r.wall_s
            first_wall = t if first_wall is None else first_wall
            # the first spin vector reaching the final best (restart, step) and its time
            hist = r.history
            at = int(np.argmax(hist["e_best"] <= r.energy)) if not r.polished else len(hist) - 1
            t_best = float(np.cumsum(r.timings["runs_s"])[hist["restart"][at]])
            rows.append(
                [
                    g,
                    model.n,
                    ref,
                    agents,
                    steps,
                    dt,
                    r.cut,
                    f"{100 * (ref - r.cut) / ref:.2f}",
                    r.restarts,
                    f"{t_best:.2f}",
                    f"{t:.2f}",
                    r.kernel_n,
                    None,
                    None,
                    None,
                    None,
                ]
            )
        row = rows[-len(settings)]
        if "sa-gpu" in baselines and args.device == "cuda":
            row[-3] = cut(simulated_annealing_gpu(model, settings[0][0], first_wall, args.seed))
        if "sb-dsb" in baselines:
            row[-2] = cut(sb_package(model, first_wall, True, settings[0][0], args.device))
        if "sb-default" in baselines:
            row[-1] = cut(sb_package(model, first_wall, False, 128, args.device))
        if "sa" in baselines:
            if sa_job is None:  # no time budget: after dSB, for dSB's wall time
                e_sa = simulated_annealing(model, args.sa_replicas, first_wall, args.seed)
            else:
                e_sa = sa_job.get()
            row[-4] = cut(e_sa)
        print(" ".join(str(v) for v in row), flush=True)
    if pool is not None:
        pool.close()
    header = [
        "graph",
        "n",
        "best_known",
        "agents",
        "steps",
        "dt",
        "dSB",
        "gap%",
        "runs",
        "t_found_s",
        "wall_s",
        "kernel_n",
        "SA cpu",
        "SA gpu",
        "sb-pkg dSB",
        "sb-pkg default",
    ]
    where = (
        f"machine: {machine()}; dSB on {args.device}, seed {args.seed}, polish {args.polish}, "
        f"reduce {args.reduce}, time budget {args.time_budget}"
    )
    print(where)
    print_table("MAX-CUT at equal wall time (best cut; gap to best known in %)", header, rows)
    if args.json_out:  # the table's rows, one dict each (numbers as printed)
        records = [dict(zip(JSON_KEYS, r, strict=True)) for r in rows]
        args.gset_dir = None  # a path of this machine's, not a setting
        write_json(args.json_out, "ising_quality.py", "best-known cut", args, records, where)


if __name__ == "__main__":
    main()
