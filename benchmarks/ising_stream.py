"""Streamed dSB: couplings delivered as 1-bit row tiles while the replicas' state stays put.
Prints, per instance, the passes, the coupling payload streamed per second (and, on the GPU, its
share of the pinned host-to-device ceiling measured in the same run), the energy reached and its
check: the exact ground energy for Mattis instances; for random instances small enough to hold,
whether the streamed records equal the resident runs' byte for byte (on the GPU: the resident GPU
kernel and the C++ reference). A score pass (--score N) streams one pass over a Mattis matrix of N
spins scoring the initial signs, checked against E(s) = -((xi . s)^2 - N) / 2, with the tile
size and stores of the fastest Mattis run. Columns: st = the Mattis generator's stores (nt:
non-temporal); wait s = time the GPU path's issuing thread waited for filled tiles (CPU: time
spent making tiles).

Usage:
    python benchmarks/ising_stream.py --mattis 100000 --random 10000 --agents 8 --steps 50
    python benchmarks/ising_stream.py --device cuda --mattis 100000 --random 10000 \\
        --tile-mib 4 16 64 --stores both --score 10000000 --time-limit 450

Anchor: the published streaming solver consumed 38.3 GB/s of couplings over a 400 GbE link
(78 % of its ceiling); on an H200 the pinned host-to-device ceiling is 54.8 GB/s.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

from cuscikit.ising.solver import run_kernel
from cuscikit.ising.stream import (
    MattisSource,
    RandomSource,
    h2d_rate,
    score_streamed,
    solve_streamed,
)

ANCHOR = "anchor: published streaming 38.3 GB/s (400 GbE); H200 pinned H2D ceiling 54.8 GB/s"


def _same(r, ref) -> bool:
    got = (*r.timings["raw"], r.x, r.y)
    return all(
        a.dtype == b.dtype and a.tobytes() == b.tobytes() for a, b in zip(got, ref, strict=True)
    )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--mattis", type=int, nargs="*", default=[100_000])
    p.add_argument("--random", type=int, nargs="*", default=[10_000])
    p.add_argument("--score", type=int, nargs="*", default=[],
                   help="Mattis sizes for one score pass each")  # fmt: skip
    p.add_argument("--agents", type=int, default=8)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--dt", type=float, default=0.5)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--tile-mib", type=int, nargs="+", default=None,
                   help="tile sizes (MiB; default 64 on the CPU, 16 on the GPU); Mattis runs "
                   "use each, the others the first")  # fmt: skip
    p.add_argument("--threads", type=int, default=0, help="GPU path: tile producer threads")
    p.add_argument("--stores", choices=("plain", "nt", "both"), default="plain",
                   help="GPU path: the Mattis generator's stores (nt: non-temporal); with "
                   "several Mattis configurations the score pass takes the fastest")  # fmt: skip
    p.add_argument("--time-limit", type=float, default=None, help="GPU path: seconds per run")
    p.add_argument("--compare-below", type=int, default=20_000,
                   help="compare with the resident run when n is at most this")  # fmt: skip
    args = p.parse_args(argv)
    if args.tile_mib is None:
        args.tile_mib = [16 if args.device == "cuda" else 64]
    print(ANCHOR)
    ceiling = None
    if args.device == "cuda":
        from cuscikit.backends.loader import cuda

        info = cuda().device_info()
        rates = {mib: h2d_rate(mib * 2**20, max(4, 4096 // mib)) for mib in (16, 64, 256)}
        ceiling = max(rates.values())
        print(f"{info['device']}, {len(os.sched_getaffinity(0))} host cores; pinned H2D ceiling "
              + ", ".join(f"{r:.1f} GB/s ({m} MiB copies)" for m, r in rates.items()))  # fmt: skip
    else:
        print(f"CPU, {len(os.sched_getaffinity(0))} cores")
    print(f"{args.agents} agents, {args.steps} steps")
    print(f"{'instance':>17} {'mode':>5} {'MiB':>4} {'st':>2} {'passes':>6} {'GB':>9} "
          f"{'wall s':>7} {'GB/s':>6} {'ceil%':>5} {'wait s':>6} {'energy':>17} "
          f"{'check':>20}")  # fmt: skip
    failed = 0
    kw = {"device": args.device, "threads": args.threads, "time_limit": args.time_limit}
    stores = {"plain": [False], "nt": [True], "both": [False, True]}[args.stores]
    if args.device == "cpu":
        stores = [False]
    cases = [("mattis", n, mib, nt) for n in args.mattis for mib in args.tile_mib for nt in stores]
    cases += [("random", n, args.tile_mib[0], False) for n in args.random]
    cases += [("score", n, None, None) for n in args.score]
    best = (0.0, args.tile_mib[0], stores[0])  # the fastest Mattis configuration
    for kind, n, mib, nt in cases:
        if kind == "score":
            mib, nt = best[1], best[2]
        src = RandomSource(n, args.seed) if kind == "random" else MattisSource(n, seed=args.seed)
        if args.device == "cuda":
            kw["streaming_stores"] = nt
        try:
            if kind == "score":
                r = score_streamed(src, args.agents, args.seed, tile_bytes=mib * 2**20, **kw)
            else:
                r = solve_streamed(src, args.agents, args.steps, args.dt, args.seed,
                                   tile_bytes=mib * 2**20, **kw)  # fmt: skip
        except TimeoutError as e:
            print(f"{kind + ' ' + str(n):>17} stopped: {e}", flush=True)
            failed += 1
            continue
        if kind == "mattis" and r.gb_per_s > best[0]:
            best = (r.gb_per_s, mib, nt)
        if kind == "mattis":
            check = "exact" if r.energy == src.ground_energy else f"exact {src.ground_energy}"
            failed += r.energy != src.ground_energy
        elif kind == "score":
            words = r.timings["raw"][3]
            bits = np.unpackbits(words.view(np.uint8), axis=1, bitorder="little")[:, :n]
            ok = all(
                r.timings["raw"][0][0, b] == src.energy_of(2 * bits[b].astype(np.int64) - 1)
                for b in range(args.agents)
            )
            check = "E(s) exact" if ok else "E(s) WRONG"
            failed += not ok
        elif n <= args.compare_below:
            t = time.perf_counter()
            model = src.model()
            refs = ["cpu"] if args.device == "cpu" else ["cuda", "cpu"]
            same = [_same(r, run_kernel(model, args.agents, args.steps, args.dt, args.seed,
                                        device=d)) for d in refs]  # fmt: skip
            check = "=".join(["stream", *refs]) if all(same) else "DIFFERENT " + str(same)
            check += f" ({time.perf_counter() - t:.0f} s)"
            failed += not all(same)
        else:
            check = "-"
        pct = f"{100 * r.gb_per_s / ceiling:5.1f}" if ceiling else "    -"
        wait = r.timings.get("wait_s", r.timings.get("fetch_s", 0.0))
        print(
            f"{kind + ' ' + str(n):>17} {'score' if kind == 'score' else 'run':>5} {mib:>4} "
            f"{'nt' if nt else '-':>2} {r.passes:>6} {r.bytes_streamed / 1e9:>9.2f} "
            f"{r.wall_s:>7.1f} {r.gb_per_s:>6.2f} {pct} {wait:>6.1f} {r.energy:>17} {check:>20}",
            flush=True,
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
