"""Where the host's time goes in a recorded (CUDA-graph) NNQS-SCI iteration, without a profiler.

Wraps the iteration's pieces (Runner, Pipeline, OptimizerGraph, the engine's kernels, the
selection, the teacher) with wall-clock accumulators, runs a default N2/STO-3G run, and prints
per piece the median milliseconds per iteration (inclusive: a piece's time contains the
pieces it calls) over two windows: with the teacher and after it. A piece that waits for the
device shows that wait as its own time. One process, no synchronisation added.

    python tools/host_breakdown.py [--system N2] [--iterations 260] [--windows 20:60 230:260]
        [--device cuda] [--cprofile-first K]

``--cprofile-first K`` runs the first K iterations under cProfile and prints the functions
that took the most time in them (cumulative and own), then the remaining iterations as
before: where a run's first iterations (initialisation, kernel loading, recordings) go.
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import pstats
import time

import numpy as np
import torch

from cuscikit import Ansatz, Molecule, Runner
from cuscikit.nnqs import graphs, pipeline, runner, teacher, topk
from cuscikit.parallel import dedup

ACC: dict = collections.defaultdict(float)  # (piece, iteration) -> seconds
STATE = {"it": 0}


def wrap(owner, name: str, label: str | None = None) -> None:
    fn = getattr(owner, name)
    label = label or f"{getattr(owner, '__name__', owner)}.{name}"

    def timed(*a, **kw):
        t0 = time.perf_counter()
        try:
            return fn(*a, **kw)
        finally:
            ACC[(label, STATE["it"])] += time.perf_counter() - t0

    setattr(owner, name, timed)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--system", default="N2")
    ap.add_argument("--iterations", type=int, default=260)
    ap.add_argument("--windows", nargs="+", default=["20:60", "230:260"])
    ap.add_argument("--device", default="cuda", help="cuda, or cpu (a check of the script)")
    ap.add_argument("--cprofile-first", type=int, default=0, metavar="K")
    args = ap.parse_args()
    mol = Molecule.load(args.system)
    ansatz = Ansatz.for_molecule(mol, seed=0, device=args.device)
    r = Runner(mol, ansatz, seed=0, verbose=0)
    eng = type(r._pipeline.engine)
    for owner, names in (
        (runner.Runner, ["_step", "_sync_options", "_graphed_stage", "_grow_by_count",
                         "_load_columns", "_teacher_solution", "_held_weight", "_inner_count",
                         "_allreduce", "_set_graph_inference", "_graphs_reason"]),
        (pipeline.Pipeline, ["run", "_cached_space", "_graphed", "_clock", "_zeros_complex",
                             "_exp", "_to_engine", "_replay"]),
        (pipeline, ["gather_selection", "_host"]),
        (topk.TorchTopK, ["update", "indices", "scores"]),
        (eng, ["numerators", "diagonal", "to_host"]),
        (dedup.GlobalDedup, ["fetch", "reduce"]),
        (graphs.OptimizerGraph, ["run", "_state", "key_for", "_write_space"]),
        (graphs.InferenceGraph, ["__call__"]),
        (torch.cuda.CUDAGraph, ["replay"]),
        (teacher, ["pull_and_loss"]),
        (runner, ["_with_teacher"]),
    ):  # fmt: skip
        for name in names:
            if hasattr(owner, name):
                wrap(owner, name)

    class Count(runner.Callback):
        def on_step_end(self, run, row):
            STATE["it"] = run.iteration + 1
            return False

    STATE["it"] = 1
    t0 = time.perf_counter()
    first = min(max(args.cprofile_first, 0), args.iterations)
    if first:
        prof = cProfile.Profile()
        prof.runcall(r.run, first, [Count()], progress=False)
        if args.device != "cpu":
            torch.cuda.synchronize()
        print(f"# iterations 1-{first} under cProfile: {time.perf_counter() - t0:.2f} s")
        for key in ("cumulative", "tottime"):
            print(f"\n## iterations 1-{first}, by {key} time")
            pstats.Stats(prof).sort_stats(key).print_stats(30)
    if args.iterations > first:
        r.run(args.iterations - first, [Count()], progress=False)
    if args.device != "cpu":
        torch.cuda.synchronize()
    print(f"# {args.system}: {args.iterations} iterations in {time.perf_counter() - t0:.1f} s")
    h = r.history
    for w in args.windows:
        lo, hi = (int(x) for x in w.split(":"))
        its = range(lo, hi + 1)
        total = float(np.median(h[(h.iteration >= lo) & (h.iteration <= hi)]["t_total"])) * 1e3
        print(
            f"\n## iterations {lo}-{hi}: median t_total {total:.2f} ms; per piece, median ms "
            "an iteration (inclusive)"
        )
        labels = sorted({k for k, _ in ACC})
        rows = []
        for lab in labels:
            v = [ACC.get((lab, i), 0.0) * 1e3 for i in its]
            rows.append((float(np.median(v)), lab, float(np.mean(v))))
        for med, lab, mean in sorted(rows, reverse=True):
            if mean > 0.005:
                print(f"{med:8.3f} {mean:8.3f}  {lab}")


if __name__ == "__main__":
    main()
