"""N2/STO-3G with the default settings except the AdamW learning rate (ALGORITHMS.md's 3e-4 by
default here): prints the error against FCI at 500/1000/1500/2000 iterations. The 1e-3 default
is measured by `accuracy_small.py N2` (or `cuscikit demo`).

    python benchmarks/lr_compare.py [--lr 3e-4 1e-3]
"""

from __future__ import annotations

import argparse
import time

from cuscikit import Molecule
from cuscikit.nnqs import Ansatz, Runner


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--lr", type=float, nargs="+", default=[3e-4])
    ap.add_argument("--iters", type=int, default=2000)
    args = ap.parse_args()
    mol = Molecule.load("N2")
    for lr in args.lr:
        runner = Runner(mol, Ansatz.for_molecule(mol, seed=0), seed=0, lr=lr)
        t0 = time.perf_counter()
        err = runner.run(args.iters, progress=False)["error"].to_numpy() * 1e3
        marks = [k for k in (500, 1000, 1500, 2000) if k <= len(err)]
        shown = " ".join(f"{k}: {err[k - 1]:.2f}" for k in marks)
        print(f"lr {lr:g}: error (mHa) at {shown}; {time.perf_counter() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
