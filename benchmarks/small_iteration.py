"""Seconds per NNQS-SCI iteration of a small system on one GPU: the eager optimiser stage
against the CUDA-graph one (`Runner(graphs=...)`), same seed, in one process.

Defaults are the command line's (topk, inner steps, |S| cap, rate with its tail decay, float32
ansatz); the table gives the median seconds per stage over iterations --from..--iterations and
the largest difference of the energies from the first variant's run (float32: they agree to float32
rounding, which the optimisation amplifies slowly; --float64 for the 1e-10 comparison).

    python benchmarks/small_iteration.py [--systems N2] [--iterations 200] [--from 20] [--float64]
        [--variants eager graph eager-compiled]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from _common import machine, print_table

from cuscikit import Ansatz, Molecule, Runner
from cuscikit.nnqs.runner import STAGES, LearningRateDecay

VARIANTS = {  # label: Runner options
    "eager": {"graphs": False},
    "graph": {"graphs": True},
    "eager-compiled": {"graphs": False, "compile_inference": True},
}


def run(mol, options: dict, iterations: int, dtype):
    ansatz = Ansatz.for_molecule(mol, seed=0, dtype=dtype, device="cuda")
    runner = Runner(mol, ansatz, seed=0, verbose=0, **options)
    t0 = time.perf_counter()
    runner.run(iterations, [LearningRateDecay.over_tail(iterations)], progress=False)
    torch.cuda.synchronize()
    return runner, time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--systems", nargs="+", default=["N2"])
    ap.add_argument("--iterations", type=int, default=200)
    ap.add_argument("--from", dest="first", type=int, default=20)
    ap.add_argument("--float64", action="store_true")
    ap.add_argument("--variants", nargs="+", default=["eager", "graph"], choices=list(VARIANTS))
    args = ap.parse_args()
    dtype = torch.float64 if args.float64 else torch.float32
    print(f"# {machine()}, torch {torch.__version__}, {dtype}")
    rows = []
    for name in args.systems:
        mol = Molecule.load(name)
        hist = {}
        for variant in args.variants:
            runner, wall = run(mol, VARIANTS[variant], args.iterations, dtype)
            h = runner.history
            hist[variant] = h
            tail = h[h["iteration"] >= args.first]
            med = {s: float(np.median(tail[f"t_{s}"])) * 1e3 for s in STAGES}
            label = variant
            if runner._graph_stage is not None:
                label += f" ({runner._graph_stage.captures} captures)"
            if runner._graphs_off is not None:
                label += " (graphs failed: eager)"
                print("#", runner._graphs_off)
            rows.append(
                [
                    name,
                    label,
                    int(tail["n_space"].median()),
                    f"{float(np.median(tail['t_total'])) * 1e3:.2f}",
                    *(f"{med[s]:.2f}" for s in STAGES),
                    f"{wall:.1f}",
                    f"{h['e_tot'].iloc[-1]:.10f}",
                ]
            )
            print(rows[-1], flush=True)
        ref = hist[args.variants[0]][["e_coupled", "e_variational"]]
        for variant in args.variants[1:]:
            d = (hist[variant][["e_coupled", "e_variational"]] - ref).abs().max(axis=1)
            first = float(d.iloc[: args.first].max())
            worst_it = int(hist[variant]["iteration"].iloc[int(np.argmax(d.to_numpy()))])
            rows.append(
                [
                    name,
                    f"max |dE| {variant} - {args.variants[0]}",
                    "",
                    f"{first:.1e} (it<{args.first})",
                    *[""] * len(STAGES),
                    "",
                    f"{float(d.max()):.1e} (all; iteration {worst_it})",
                ]
            )
    print_table(
        f"Milliseconds per iteration (median over iterations {args.first}..{args.iterations}), "
        f"{dtype}",
        ["system", "optimiser stage", "|S|", "total ms", *STAGES, "run s", "final E"],
        rows,
    )


if __name__ == "__main__":
    main()
