"""Does any result of a GPU run depend on memory that was never written?

Runs the Runner twice on one system with torch's deterministic algorithms: once as usual, once
with ``torch.utils.deterministic.fill_uninitialized_memory`` (every tensor torch allocates
without initialising it starts as NaN, or the largest integer), then prints both energy
histories and their largest difference. A result that reads memory nobody wrote turns NaN (or
an index turns huge) in the second run; identical histories say no result does, on this path.

    python tools/uninit_check.py C2 --iters 8 [--graphs off] [--float64]
"""

from __future__ import annotations

import argparse
import sys
import traceback
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from accuracy_small import build_system  # noqa: E402

from cuscikit.nnqs import Ansatz, Runner  # noqa: E402


def run(name: str, iters: int, graphs, dtype, fill: bool, cache) -> np.ndarray:
    import torch.utils.deterministic as det

    det.fill_uninitialized_memory = fill
    mol = build_system(name, cache)[0]
    ansatz = Ansatz.for_molecule(mol, seed=0, device="cuda", dtype=dtype)
    runner = Runner(mol, ansatz, seed=0, device="cuda", graphs=graphs)
    try:
        runner.run(iters, progress=False)
    except Exception:  # noqa: BLE001 - the point is to see it
        traceback.print_exc()
        print(f"fill={fill}: FAILED after {runner.iteration} iterations", flush=True)
    h = runner.history
    return np.stack([h["e_coupled"].to_numpy(), h["e_variational"].to_numpy()], 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("system")
    ap.add_argument("--iters", type=int, default=8)
    ap.add_argument("--graphs", choices=["auto", "off"], default="auto")
    ap.add_argument("--float64", action="store_true")
    ap.add_argument("--cache", default=None)
    a = ap.parse_args()
    torch.use_deterministic_algorithms(True, warn_only=True)
    graphs = "auto" if a.graphs == "auto" else False
    dtype = torch.float64 if a.float64 else torch.float32
    e = [run(a.system, a.iters, graphs, dtype, fill, a.cache) for fill in (False, True)]
    print(f"{a.system}, graphs={a.graphs}, {dtype}: iteration, energy (coupled, variational)")
    for i in range(max(len(x) for x in e)):
        cells = [f"{x[i, 0]:.12f} {x[i, 1]:.12f}" if i < len(x) else "-" for x in e]
        print(f"{i + 1:4d}  as usual {cells[0]}  NaN-filled {cells[1]}")
    n = min(len(x) for x in e)
    diff = np.abs(e[0][:n] - e[1][:n])
    print(
        f"largest difference over {n} iterations: {np.nanmax(diff) if n else float('nan'):.3e}; "
        f"NaN in the filled run: {bool(np.isnan(e[1]).any())}"
    )


if __name__ == "__main__":
    main()
