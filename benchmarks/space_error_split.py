"""How far is a run's network from the best wavefunction its space S allows? From a checkpoint:
the exact ground state in S (`SCISpace.exact_energy`), the network's Rayleigh quotient over S,
and that quotient with the network's amplitudes on the exact signs, and the exact amplitudes with
the network's signs; overlap, wrong-sign weight and the amplitude ratio by exact weight.

    python benchmarks/space_error_split.py Li2O out/ckpt/li2o_sto3g.h5

Stop 11, Li2O after 4000 default iterations on the H200 (+3.600 mHa): E exact in S (16,384
determinants) +0.594 mHa against FCI; the network +2.996 above it; network amplitudes on exact
signs +2.59, exact amplitudes on network signs +1.94; overlap 0.99842; 6,682 wrong signs carrying
2.0e-4 of the exact weight; determinants of exact |c|^2 in [1e-6, 1e-5) are 10^-0.86 too small.
"""

from __future__ import annotations

import argparse

import numpy as np
from _common import network_vector

from cuscikit import Molecule, SCISpace
from cuscikit.nnqs import Ansatz, Runner
from cuscikit.nnqs.checkpoint import saved_settings


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("system")
    ap.add_argument("checkpoint")
    args = ap.parse_args()
    mol = Molecule.load(args.system)
    e_fci = mol.metadata["reference"]["energy"]
    settings = saved_settings(args.checkpoint)  # e.g. inner_steps=0 in files before stop 12
    runner = Runner(mol, Ansatz.for_molecule(mol, seed=0), **settings).load(args.checkpoint)
    space = SCISpace(mol, runner.space.configs)
    e_s, vecs = space.exact_energy(return_vectors=True)
    v = vecs[:, 0]
    h = space.hamiltonian.restricted(space.configs)

    def rayleigh(x: np.ndarray) -> float:  # H is real: the real and imaginary parts add
        xs = np.stack([x.real, x.imag], axis=1)
        return float((xs * h.matmat(xs)).sum() / (xs * xs).sum())

    psi = network_vector(runner.ansatz, space.configs, v)
    sign = np.sign(psi.real)
    c2, p2 = v**2, np.abs(psi) ** 2
    wrong = sign != np.sign(v)
    print(f"{args.system}, iteration {runner.iteration}, |S| = {len(space)}")
    print(f"  E exact in S          {e_s:.8f}  ({(e_s - e_fci) * 1e3:+.3f} mHa against FCI)")
    for tag, x in (("network", psi), ("network |psi|, exact signs", np.abs(psi) * np.sign(v)),
                   ("exact |c|, network signs", np.abs(v) * sign)):
        print(f"  {tag:<27} {(rayleigh(x) - e_s) * 1e3:+.3f} mHa above E in S")
    print(f"  overlap {abs(np.vdot(v, psi)) ** 2:.6f}; {int(wrong.sum())} wrong signs of exact "
          f"weight {c2[wrong].sum():.2e}; imaginary weight {(psi.imag ** 2).sum():.2e}")
    for lo in (1e-3, 1e-4, 1e-5, 1e-6):
        m = (c2 >= lo) & (c2 < 10 * lo)
        if m.any():
            print(f"  exact |c|^2 in [{lo:.0e}, {10 * lo:.0e}): {int(m.sum())} determinants, "
                  f"mean log10(|psi|^2 / |c|^2) {np.mean(np.log10(p2[m] / c2[m])):+.2f}")


if __name__ == "__main__":
    main()
