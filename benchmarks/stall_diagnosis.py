"""Why does a run stall? The NN wavefunction at the stall against the exact ground state over
the full sector of a small system: overlap, weight on wrong signs, amplitude error, and the
configurations the network has "killed" (|psi|^2 far below the exact weight); then 1000 more
(--more) iterations with and without a random kick to the phase network.

    python benchmarks/stall_diagnosis.py H2O 2000 --ansatz '{"reference_bias": 0.0}'

Stop 10, CPU, seed 0 (H2O, reference_bias 0, stalled at +5.3 mHa from iteration 2000): overlap
0.9966; wrong signs carry an exact weight of 4e-5, the |psi| error 3.4e-3; two configurations of
exact weight 1.1e-3 each have |psi|^2 ~ 1e-14 (2.7e-3 of exact weight is "dead"). The phase
kick changes nothing (+5.28 vs +5.33 after 1000 more). With |psi(x)| ~ 0 the loss weight
w(x) ~ |psi(x)|^2 and the gradient on ln psi(x) vanish, so nothing revives those configurations.
"""

from __future__ import annotations

import json
from pathlib import Path
from tempfile import TemporaryDirectory

import numpy as np
import torch
from _common import experiment_parser, network_vector

from cuscikit import Molecule, SCISpace
from cuscikit.nnqs import Ansatz, Runner


def diagnose(runner: Runner, space: SCISpace, e0: float, v: np.ndarray, tag: str) -> None:
    psi = network_vector(runner.ansatz, space.configs, v)
    c2, p2 = v**2, np.abs(psi) ** 2
    wrong = (np.sign(psi.real) != np.sign(v)) & (c2 > 1e-6)
    dead = p2 < 1e-3 * c2
    print(f"{tag}: error {(runner.history['e_coupled'].iloc[-1] - e0) * 1e3:+.3f} mHa, overlap "
          f"{abs(np.vdot(v, psi)) ** 2:.6f}, wrong-sign weight {c2[wrong].sum():.2e}, |psi| error "
          f"{((np.abs(psi) - np.abs(v)) ** 2).sum():.2e}, dead configurations {int(dead.sum())} "
          f"of exact weight {c2[dead].sum():.2e}", flush=True)
    for i in np.argsort(-(c2 - p2))[:3]:
        print(f"    exact |c|^2 {c2[i]:.3e}, NN |psi|^2 {p2[i]:.3e}")


def main() -> None:
    ap = experiment_parser(__doc__)
    ap.add_argument("--kick", type=float, default=0.05, help="std of the phase-network kick")
    ap.add_argument("--more", type=int, default=1000, help="iterations after the stall")
    args = ap.parse_args()
    torch.set_num_threads(1)
    mol = Molecule.load(args.system)
    space = SCISpace.full(mol)
    e0, vecs = space.exact_energy(return_vectors=True)
    v = vecs[:, 0]
    akw = json.loads(args.ansatz)

    def make() -> Runner:
        return Runner(mol, Ansatz.for_molecule(mol, seed=0, **akw), seed=0)

    runner = make()
    runner.run(args.iters, progress=False)
    diagnose(runner, space, e0, v, f"{args.system} {akw} after {args.iters}")
    with TemporaryDirectory() as tmp:
        runner.save(Path(tmp) / "stall.h5")
        kicked = make().load(Path(tmp) / "stall.h5")
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in kicked.ansatz.phase_net.parameters():
            p.add_(args.kick * torch.randn(p.shape, generator=g, dtype=p.dtype))
    runner.run(args.more, progress=False)
    diagnose(runner, space, e0, v, f"  +{args.more} iterations")
    kicked.run(args.more, progress=False)
    diagnose(kicked, space, e0, v, f"  +{args.more} after a phase kick (std {args.kick})")


if __name__ == "__main__":
    main()
