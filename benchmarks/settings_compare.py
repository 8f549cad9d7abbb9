"""One system, default NNQS-SCI settings except the ones given: error against FCI (mHa) at
100/250/500/1000/1500/2000/3000 iterations. For checking a proposed default on several systems.

    python benchmarks/settings_compare.py H8-chain 1000 --ansatz '{"reference_bias": 0.0}'
    python benchmarks/settings_compare.py N2 1000 --runner '{"lr": 0.003}'
    python benchmarks/settings_compare.py H8-chain 2000 --lr-scale logit_bias=10

`--lr-scale logit_bias=F` (the ansatz's per-position logit offsets at F x lr) was tried as a
default at stop 10 (CPU, seed 0, mHa at 2000 iterations; defaults: H8 +28.8, N2 +0.71):
F=10 gave H8 +10.4, N2 +0.34, but H2O stalled at +22.95 through 4000 iterations (defaults:
+0.08); F=3 stalled H2O too (+20.7 at 4000); F=100 gave H8 +11.5, N2 +20.6. Not adopted.
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
    ap.add_argument("--lr-scale", action="append", default=[], metavar="PARAM=FACTOR",
                    help="give the ansatz parameters whose name starts with PARAM their own "
                         "AdamW learning rate, FACTOR times the runner's")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    akw, rkw = json.loads(args.ansatz), json.loads(args.runner)
    mol = Molecule.load(args.system)
    runner = Runner(mol, Ansatz.for_molecule(mol, seed=0, **akw), seed=0, **rkw)
    if args.lr_scale:
        scale = {k: float(v) for k, v in (item.split("=") for item in args.lr_scale)}
        groups: dict[float, list] = {}
        for name, p in runner.ansatz.named_parameters():
            f = next((v for k, v in scale.items() if name.startswith(k)), 1.0)
            groups.setdefault(f, []).append(p)
        base = runner.optimizer.defaults
        runner.optimizer = torch.optim.AdamW(
            [{"params": ps, "lr": base["lr"] * f} for f, ps in groups.items()],
            lr=base["lr"], betas=base["betas"], eps=base["eps"],
            weight_decay=base["weight_decay"])
    t0 = time.perf_counter()
    err = runner.run(args.iters, progress=False)["error"].to_numpy() * 1e3
    marks = [k for k in (100, 250, 500, 1000, 1500, 2000, 3000, 4000) if k <= len(err)]
    shown = " ".join(f"{k}: {err[k - 1]:+.2f}" for k in marks)
    print(f"{args.system} ansatz={akw} runner={rkw} lr-scale={args.lr_scale}: "
          f"error (mHa) at {shown}; {time.perf_counter() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
