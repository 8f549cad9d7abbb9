"""Does a decaying learning rate remove the late error spikes of a constant one? One system,
default settings, except that from iteration --decay-from the AdamW learning rate falls
geometrically to --lr-final at the last iteration (`cuscikit.nnqs.LearningRateDecay`; the
Runner's defaults are untouched). Prints the error at the end of every --block iterations, the
median and the share of iterations above 1.6 mHa per block, and writes the history CSV.

    python benchmarks/lr_decay_compare.py H8-chain --iters 4000 --decay-from 2000 --lr-final 1e-4

Stop 11, candidate default: 4 inner steps, decay from 1000 to 1e-4 at 2000 (CPU, 1 thread, seed
0; `--iters 2000 --decay-from 1000 --lr-final 1e-4 --runner '{"inner_steps": 4}' --block 250`).
Error in mHa (the larger of the two estimators) at the end of each block:

    system        250     500     1000    1500    2000    > 1.6 mHa after 1000   wall s
    H8 chain      35.87   13.90   2.305   0.277   0.122   13 of 1000 (<= 1250)    3041
    N2 stretched  3.350   1.207   0.232   0.059   0.037   none                    2848
    H2O           0.544   0.224   5.960   0.141   0.135   33 of 1000 (<= 1250)     364
    LiH           0.065   0.001   0.001   0.000   0.000   none                     204
    O2 triplet    0.261   0.232   0.041   0.002   0.000   none                     288

Constant rate, 4000 plain iterations (stops 9-10): H8 chain +3.02, H2O +0.064, O2 +0.076.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

from cuscikit import Molecule
from cuscikit.nnqs import Ansatz, LearningRateDecay, Runner


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("system")
    ap.add_argument("--iters", type=int, default=4000)
    ap.add_argument("--decay-from", type=int, default=2000)
    ap.add_argument("--lr-final", type=float, default=1e-4)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=None, help="history CSV")
    ap.add_argument("--runner", default="{}", help="JSON keyword arguments of the Runner")
    ap.add_argument("--block", type=int, default=1000, help="iterations per summary line")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    mol = Molecule.load(args.system)
    runner = Runner(mol, Ansatz.for_molecule(mol, seed=0), seed=0, **json.loads(args.runner))
    decay = LearningRateDecay(args.decay_from, args.iters, args.lr_final)
    lr0 = runner.optimizer.defaults["lr"]
    t0 = time.perf_counter()
    h = runner.run(args.iters, callbacks=[decay], progress=False)
    if args.out:
        h.to_csv(args.out, index=False)
    err = np.maximum(h["error"].abs(), h["error_variational"].abs()).to_numpy() * 1e3
    print(f"{args.system} {args.runner}: lr {lr0:g} -> {args.lr_final:g} from iteration "
          f"{args.decay_from}; {time.perf_counter() - t0:.0f} s")
    b = args.block
    for lo in range(0, len(err), b):
        blk = err[lo:lo + b]
        print(f"  {lo + 1:>5}-{lo + len(blk):<5} error at end {blk[-1]:8.3f} mHa, median "
              f"{np.median(blk):8.3f}, share > 1.6 mHa {np.mean(blk > 1.6):.3f}, "
              f"max {blk.max():.2f}")


if __name__ == "__main__":
    main()
