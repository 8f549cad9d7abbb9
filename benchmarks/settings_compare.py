"""One system, default NNQS-SCI settings except the ones given: error against FCI (mHa) at
100/250/500/1000/1500/2000/3000 iterations. For checking a proposed default on several systems.

    python benchmarks/settings_compare.py H8-chain 1000 --ansatz '{"reference_bias": 0.0}'
    python benchmarks/settings_compare.py N2 1000 --runner '{"lr": 0.003}'
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from cuscikit import Molecule
from cuscikit.nnqs import Ansatz, Runner


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("system")
    ap.add_argument("iters", type=int)
    ap.add_argument("--ansatz", default="{}", help="JSON keyword arguments of the Ansatz")
    ap.add_argument("--runner", default="{}", help="JSON keyword arguments of the Runner")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    akw, rkw = json.loads(args.ansatz), json.loads(args.runner)
    mol = Molecule.load(args.system)
    runner = Runner(mol, Ansatz.for_molecule(mol, seed=0, **akw), seed=0, **rkw)
    t0 = time.perf_counter()
    err = runner.run(args.iters, progress=False)["error"].to_numpy() * 1e3
    marks = [k for k in (100, 250, 500, 1000, 1500, 2000, 3000) if k <= len(err)]
    shown = " ".join(f"{k}: {err[k - 1]:+.2f}" for k in marks)
    print(f"{args.system} ansatz={akw} runner={rkw}: error (mHa) at {shown}; "
          f"{time.perf_counter() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
