"""Source spaces for the GPU benchmarks: breadth-first excitation levels of HF on the GPU (or,
for the small CPU rehearsals, with the host kernels)."""

from __future__ import annotations

import torch

from cuscikit import SCISpace
from cuscikit.backends import keys
from cuscikit.sci import cuda as sci_cuda


def sample_space(mol, n, seed=0, device="cuda"):
    """n configurations: HF, then breadth-first levels of excitations (GPU kernels), the last
    level subsampled at random (a seeded CPU generator: the same set on every rank). Returns a
    uint64 numpy array (n, words), sorted."""
    if torch.device(device).type == "cpu":
        from cuscikit.sci.hamiltonian import Hamiltonian

        H = Hamiltonian.from_molecule(mol)

        def coupled(src):
            return keys.to_device(H.coupled(keys.to_numpy(src)).configs, device)
    else:
        dh = sci_cuda.DeviceHamiltonian.from_molecule(mol, device)

        def coupled(src):
            return sci_cuda.coupled(dh, src)[1]

    S = keys.to_device(SCISpace.hf(mol).configs, device)
    end_bit = 2 * mol.norb
    g = torch.Generator(device="cpu").manual_seed(seed)
    while len(S) < n:
        src = S[torch.randperm(len(S), generator=g)[:20000].to(S.device)]
        cfg = coupled(src)
        new = keys.sort_unique(torch.cat([S, cfg]), return_inverse=False, end_bit=end_bit)
        fresh = new[keys.search(S, new) < 0]
        if len(fresh) == 0:
            break  # the sector is exhausted
        take = fresh[torch.randperm(len(fresh), generator=g)[: n - len(S)].to(S.device)]
        S = keys.sort_unique(torch.cat([S, take]), return_inverse=False, end_bit=end_bit)
    return keys.to_numpy(S[:n])
