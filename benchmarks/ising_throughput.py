"""dSB throughput: exact coupling operations per second, n^2 * agents * steps / time, for +-1
(bit planes), ternary (two planes) and int8 couplings, on the CPU (C++/OpenMP) or the GPU.

Random couplings are built directly as the kernels' arrays (no IsingModel, so large n fit).
CUDA times are kernel times (CUDA events); CPU times are wall times of the call.

    python benchmarks/ising_throughput.py --device cpu --n 1024 4096 --agents 8 --steps 50
    python benchmarks/ising_throughput.py --device cuda --n 2048 8192 --agents 128 1024 --steps 200

``--json-out FILE`` also writes the rows as JSON (the form notebook 05 reads from
``benchmarks/results/``).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from _common import machine, print_table, write_json

KINDS = {"binary": 0, "ternary": 1, "int8": 2}


def arrays(kind: str, n: int, seed: int) -> dict:
    """Random couplings of n spins as the kernels take them (symmetry does not affect speed)."""
    rng = np.random.default_rng(seed)
    W = (n + 31) // 32
    pad = np.uint32(0xFFFFFFFF >> (32 * W - n)) if n % 32 else np.uint32(0xFFFFFFFF)
    out = {
        "plus": np.zeros(0, np.uint32),
        "minus": np.zeros(0, np.uint32),
        "degree": np.zeros(0, np.int32),
        "j8": np.zeros(0, np.int8),
        "h": np.zeros(n, np.int32),
    }
    if kind == "int8":
        j8 = rng.integers(-127, 128, (n, 32 * W), dtype=np.int8)
        j8[:, n:] = 0
        j8[np.arange(n), np.arange(n)] = 0
        out["j8"] = j8.ravel()
        return out
    plus = rng.integers(0, 2**32, (n, W), dtype=np.uint32)
    plus[:, -1] &= pad
    plus.reshape(-1)[np.arange(n) * W + np.arange(n) // 32] &= ~(
        np.uint32(1) << (np.arange(n) % 32).astype(np.uint32)
    )
    out["plus"] = plus.ravel()
    if kind == "ternary":
        minus = rng.integers(0, 2**32, (n, W), dtype=np.uint32) & ~plus
        out["minus"] = minus.ravel()
        out["degree"] = (np.bitwise_count(plus).sum(1) - np.bitwise_count(minus).sum(1)).astype(
            np.int32
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--n", type=int, nargs="+", default=[1024, 4096])
    ap.add_argument("--agents", type=int, nargs="+", default=[8])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--kinds", nargs="+", default=list(KINDS), choices=list(KINDS))
    ap.add_argument("--json-out", default=None, help="also write the rows to this JSON file")
    ap.add_argument("--note", default="", help="how the machine was loaded (into the JSON)")
    args = ap.parse_args()
    if args.device == "cpu":
        from cuscikit.backends.loader import core

        ext = core().ising
    else:
        from cuscikit.backends.loader import cuda

        ext = cuda().ising
    rows, records = [], []
    for n in args.n:
        for kind in args.kinds:
            a = arrays(kind, n, seed=n)
            c0 = float(np.float32(0.5 / np.sqrt(n)))
            for agents in args.agents:

                def call(steps, a=a, kind=kind, n=n, c0=c0, agents=agents):
                    return ext.run_exact(
                        KINDS[kind],
                        n,
                        a["plus"],
                        a["minus"],
                        a["degree"],
                        a["j8"],
                        a["h"],
                        agents,
                        steps,
                        0.5,
                        1.0,
                        c0,
                        1,
                        0,
                    )

                call(2)  # warm-up (first CUDA call, page faults)
                t0 = time.perf_counter()
                call(args.steps)
                t = time.perf_counter() - t0
                if args.device == "cuda":
                    t = ext.last_kernel_ms() / 1e3
                ops = float(n) * n * agents * (args.steps + 1) / t
                rows.append([n, kind, agents, args.steps, f"{t:.4f}", f"{ops / 1e12:.4g}"])
                records.append(
                    {"n": n, "kind": kind, "agents": agents, "steps": args.steps, "time_s": t}
                    | {"ops_per_s": ops, "device": args.device}
                )
    print(f"machine: {machine()}; device {args.device}")
    print_table(
        "dSB exact coupling throughput (n^2 x agents x (steps + 1) passes / s)",
        ["n", "couplings", "agents", "steps", "time_s", "Tops/s"],
        rows,
    )
    anchor = (
        "as published (not re-measured here): FPGA simulated-bifurcation machine "
        "(Tatsumura et al., FPL 2019) 2.0 Tops/s; the same paper's V100 GPU 0.18 Tops/s."
    )
    print("\nanchors " + anchor)
    if args.json_out:
        write_json(args.json_out, "ising_throughput.py", anchor, args, records, args.note)


if __name__ == "__main__":
    main()
