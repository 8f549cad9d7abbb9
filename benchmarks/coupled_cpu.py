"""Coupled-configuration generation on the CPU: compiled C++ (OpenMP) vs the numpy twin.

Sources are random low-rank excitations of HF in N2/cc-pVDZ (1 word, |C(x)| = 30,723 unscreened)
and Cr2 (48e, 42o)/SV (2 words). Prints valid coupled configurations per second; this is the CPU
baseline that the GPU kernels are measured against.

    python benchmarks/coupled_cpu.py [--sources 2000] [--numpy-sources 20]
"""

from __future__ import annotations

import argparse

import numpy as np
from _common import best_time, machine, print_table, random_excitations

from cuscikit import Molecule
from cuscikit.backends import core
from cuscikit.backends.keys import dedup
from cuscikit.sci.configs import hf_configuration
from cuscikit.sci.hamiltonian import Hamiltonian
from cuscikit.sci.slow import coupled_configurations_numpy


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sources", type=int, default=2000)
    ap.add_argument("--cr2-sources", type=int, default=100)
    ap.add_argument("--numpy-sources", type=int, default=10)
    ap.add_argument("--dedup-items", type=int, default=20_000_000)
    args = ap.parse_args()

    rows = []
    for name, nsrc in (("N2/cc-pVDZ", args.sources), ("Cr2/SV", args.cr2_sources)):
        mol = Molecule.load(name)
        for eps in (-1.0, 1e-12):
            H = Hamiltonian.from_molecule(mol, eps=eps)
            src = random_excitations(hf_configuration(mol.norb, mol.nelec), mol.norb, nsrc, 4, 7)
            t, cs = best_time(lambda H=H, src=src: H.coupled(src), repeat=2)
            per = len(cs) / nsrc
            nps = min(args.numpy_sources, nsrc)
            tn, out = best_time(
                lambda mol=mol, src=src, nps=nps, eps=eps: coupled_configurations_numpy(
                    mol.h1e, mol.eri_full(), mol.e_core, src[:nps], mol.norb, eps
                ),
                repeat=1,
            )
            assert len(out[2]) == int(H.coupled_counts(src[:nps]).sum())
            rows.append(
                [
                    name,
                    H.nwords,
                    "none" if eps < 0 else f"{eps:g}",
                    nsrc,
                    f"{per:,.0f}",
                    f"{len(cs):,}",
                    f"{t:.3f}",
                    f"{len(cs) / t:.3e}",
                    f"{len(out[2]) / tn:.3e}",
                    f"{(len(cs) / t) / (len(out[2]) / tn):.0f}x",
                ]
            )
    print_table(
        f"Coupled-configuration generation on {machine()} ({core().build_info()['max_threads']} "
        "OpenMP threads)",
        [
            "system",
            "words",
            "eps",
            "sources",
            "|C(x)| mean",
            "coupled",
            "C++ s",
            "C++ /s",
            "numpy /s",
            "C++/numpy",
        ],
        rows,
    )

    rng = np.random.default_rng(0)
    drows = []
    for words in (1, 2):
        n = args.dedup_items
        keys = rng.integers(0, 2**64, size=(n // 2, words), dtype=np.uint64)
        keys = keys[rng.integers(0, len(keys), size=n)]  # ~half the items are duplicates
        t, (u, inv, cnt) = best_time(lambda keys=keys: dedup(keys), repeat=2)
        drows.append([words, f"{n:,}", f"{len(u):,}", f"{t:.3f}", f"{n / t:.3e}"])
    print_table(
        "De-duplication (sort + unique + inverse) on the CPU, full 64-bit key range",
        ["words", "items", "unique", "seconds", "items/s"],
        drows,
    )


if __name__ == "__main__":
    main()
