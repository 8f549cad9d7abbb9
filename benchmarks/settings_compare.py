"""One system, default NNQS-SCI settings except the ones given: error against FCI (mHa) at
100/250/500/1000/1500/2000/3000/4000 iterations. For checking a proposed default on several systems.

    python benchmarks/settings_compare.py H8-chain 1000 --ansatz '{"reference_bias": 0.0}'
    python benchmarks/settings_compare.py N2 1000 --runner '{"lr": 0.003}'
    python benchmarks/settings_compare.py H8-chain 2000 --lr-scale logit_bias=10

Candidate defaults tried at stop 10 (CPU, 1 thread, seed 0, error in mHa at 4000 iterations
unless marked; "stall" = flat at that error for the last 1000+ iterations):

    setting                       H8 chain      N2       H2O            LiH    O2 triplet
    defaults (bias 5)             +3.02         +0.10*   +0.06          +0.01* +0.08
    reference_bias 2.5            +3.20         +0.06    +0.13
    reference_bias 0              +0.53         +0.37    +5.30 stall    +0.00  +0.01
    --lr-scale logit_bias=3                              +20.7 (+22.96 1500-3000)
    --lr-scale logit_bias=10      +10.4 (2000)  +0.34 (2000)  +22.95 stall
    --lr-scale logit_bias=100     +11.5 (2000)  +20.6 (2000)

    * H200 run of the same defaults (compiled inference).

Each one that helps the H8 chain leaves H2O stalled, so none was adopted. The H2O stall at
reference_bias 0 is not a sign problem but "dead" configurations (benchmarks/stall_diagnosis.py):
two configurations of exact weight 1.1e-3 each have |psi|^2 ~ 1e-14, and their loss weight
w ~ |psi|^2 leaves no gradient to revive them.
"""

from __future__ import annotations

import json
import time

import torch
from _common import experiment_parser

from cuscikit import Molecule
from cuscikit.nnqs import Ansatz, Runner


def main() -> None:
    ap = experiment_parser(__doc__)
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
    marks = [k for k in (100, 250, 500, 1000, 1500, 2000, 3000, 4000, 6000, 8000, 12000, 16000)
             if k <= len(err)]
    shown = " ".join(f"{k}: {err[k - 1]:+.2f}" for k in marks)
    print(f"{args.system} ansatz={akw} runner={rkw} lr-scale={args.lr_scale}: "
          f"error (mHa) at {shown}; {time.perf_counter() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
