"""Source spaces for the GPU benchmarks: breadth-first excitation levels of HF on the GPU."""

from __future__ import annotations

import torch

from cuscikit import SCISpace
from cuscikit.backends import keys
from cuscikit.sci import cuda as sci_cuda


def sample_space(mol, n, seed=0, device="cuda"):
    """n configurations: HF, then breadth-first levels of excitations (GPU kernels), the last
    level subsampled at random (a seeded CPU generator: the same set on every rank). Returns a
    uint64 numpy array (n, words), sorted."""
    dh = sci_cuda.DeviceHamiltonian.from_molecule(mol, device)
    S = keys.to_device(SCISpace.hf(mol).configs, device)
    end_bit = 2 * mol.norb
    g = torch.Generator(device="cpu").manual_seed(seed)
    while len(S) < n:
        src = S[torch.randperm(len(S), generator=g)[:20000].to(S.device)]
        _, cfg, _ = sci_cuda.coupled(dh, src)
        new = keys.sort_unique(torch.cat([S, cfg]), return_inverse=False, end_bit=end_bit)
        fresh = new[keys.search(S, new) < 0]
        if len(fresh) == 0:
            break  # the sector is exhausted
        take = fresh[torch.randperm(len(fresh), generator=g)[: n - len(S)].to(S.device)]
        S = keys.sort_unique(torch.cat([S, take]), return_inverse=False, end_bit=end_bit)
    return keys.to_numpy(S[:n])
