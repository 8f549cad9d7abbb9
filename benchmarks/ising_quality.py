"""dSB solution quality on MAX-CUT benchmarks (G-set, K2000) at equal wall time, against a plain
simulated annealing (numpy, replicas vectorised, single-spin Metropolis sweeps with a geometric
temperature schedule) and the PyPI package simulated-bifurcation (discrete mode without early
stopping, and its defaults), with the best-known cut as the anchor.

dSB runs first (``--steps`` steps, or restarts within ``--time-budget``); each baseline then gets
the same wall time. Graphs are read from ``--gset-dir`` (default: $CUSCIKIT_GSET_DIR), a folder
holding the G-set files and a ``best_known.json`` with each graph's file and best-known cut;
nothing is copied.

Several values of --agents, --steps and --dt run every combination (the baselines get the wall
time of the first). ``t_found_s`` is the end of the run (restart) that first reached the final
best. On CUDA one tiny solve first loads the module and creates the context, outside the timings.

    python benchmarks/ising_quality.py --graphs G1 G43 --agents 32 --steps 1000 --device cpu
    python benchmarks/ising_quality.py --device cuda --graphs K2000 --agents 1024 \\
        --steps 1000 2000 --dt 0.5 1.0 --time-budget 1 --baselines

``--json-out FILE`` also writes the rows as JSON (the form notebook 05 reads from
``benchmarks/results/``).
"""

from __future__ import annotations

import argparse
import json
import os
import time
import warnings
from pathlib import Path

import numpy as np
from _common import machine, print_table, write_json

from cuscikit.ising import IsingModel, solve


def simulated_annealing(model: IsingModel, replicas: int, seconds: float, seed: int) -> float:
    """Best energy of plain Metropolis SA (beta 0.1 -> 3 / mean|J|, geometric) in `seconds`."""
    rng = np.random.default_rng(seed)
    J = model.J.tocsr()
    n = model.n
    h = model.h.astype(np.float64)
    s = rng.choice([-1.0, 1.0], (replicas, n))
    a = np.asarray(J @ s.T).T + h  # local fields
    scale = np.abs(J.data).mean() if J.nnz else 1.0

    def energy(s, a):
        return -0.5 * (s * (a + h)).sum(1)

    def sweep(beta):
        u = rng.random((replicas, n))
        for i in range(n):
            d = 2 * s[:, i] * a[:, i]  # energy change of flipping spin i
            flip = (d <= 0) | (u[:, i] < np.exp(-beta * np.maximum(d, 0)))
            if flip.any():
                s[flip, i] *= -1
                lo, hi = J.indptr[i], J.indptr[i + 1]
                a[np.ix_(flip, J.indices[lo:hi])] += 2 * s[flip, i][:, None] * J.data[lo:hi]

    t0 = time.perf_counter()
    sweep(0.1 / scale)
    per_sweep = time.perf_counter() - t0
    sweeps = max(1, int((seconds - per_sweep) / per_sweep))
    best = energy(s, a).min()
    for beta in np.geomspace(0.1 / scale, 3.0 / scale, sweeps):
        sweep(beta)
        best = min(best, energy(s, a).min())
    return float(best)


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
        default=["sa", "sb-dsb", "sb-default"],
        choices=["sa", "sb-dsb", "sb-default"],
        help="baselines run at the wall time of the graph's first dSB setting",
    )
    ap.add_argument("--no-baselines", action="store_true", help="the same as --baselines alone")
    ap.add_argument("--json-out", default=None, help="also write the rows to this JSON file")
    args = ap.parse_args()
    baselines = set() if args.no_baselines else set(args.baselines)
    gdir = Path(args.gset_dir)
    if not (gdir / "best_known.json").is_file():
        raise SystemExit(f"no best_known.json in {gdir}: give the graphs' folder with --gset-dir")
    best_known = json.loads((gdir / "best_known.json").read_text())
    if args.device == "cuda":  # CUDA context and module load, once, outside every timing
        solve(IsingModel.from_edges(2, [(0, 1, 1)]), agents=1, steps=2, device="cuda")
    rows = []
    settings = [(a, s, d) for a in args.agents for s in args.steps for d in args.dt]
    for g in args.graphs:
        model = IsingModel.from_gset(gdir / best_known[g]["file"])
        wtot = -model.offset

        def cut(e, wtot=wtot):
            return None if e is None else int(round((wtot - e) / 2))

        ref = best_known[g]["best_cut"]
        first_wall = None
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
                    None,
                    None,
                    None,
                ]
            )
        row = rows[-len(settings)]
        if "sa" in baselines:
            row[-3] = cut(simulated_annealing(model, args.sa_replicas, first_wall, args.seed))
        if "sb-dsb" in baselines:
            row[-2] = cut(sb_package(model, first_wall, True, settings[0][0], args.device))
        if "sb-default" in baselines:
            row[-1] = cut(sb_package(model, first_wall, False, 128, args.device))
    print(
        f"machine: {machine()}; dSB on {args.device}, seed {args.seed}, polish {args.polish}, "
        f"time budget {args.time_budget}"
    )
    print_table(
        "MAX-CUT at equal wall time (best cut; gap to best known in %)",
        [
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
            "SA",
            "sb-pkg dSB",
            "sb-pkg default",
        ],
        rows,
    )
    if args.json_out:  # the table's rows, one dict each (numbers as printed)
        keys = ["graph", "n", "best_known", "agents", "steps", "dt", "dsb_cut", "gap_pct"]
        keys += ["runs", "t_found_s", "wall_s", "sa_cut", "sb_pkg_dsb_cut", "sb_pkg_default_cut"]
        records = [dict(zip(keys, r, strict=True)) for r in rows]
        write_json(args.json_out, "ising_quality.py", "best-known cut", args, records)


if __name__ == "__main__":
    main()
