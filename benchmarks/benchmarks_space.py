"""Source spaces for the GPU benchmarks: breadth-first excitation levels of HF on the GPU."""

from __future__ import annotations

import torch
from cuscikit.gpu import ops

from cuscikit import SCISpace


def sample_space(mol, n, seed=0, device="cuda"):
    """n configurations: HF, then breadth-first levels of excitations (GPU kernels), the last
    level subsampled at random. Returns a uint64 numpy array (n, words), sorted."""
    dh = ops.DeviceHamiltonian.from_molecule(mol, device)
    S = ops.to_device(SCISpace.hf(mol).configs, device)
    end_bit = 2 * mol.norb
    g = torch.Generator(device="cpu").manual_seed(seed)
    while len(S) < n:
        src = S[torch.randperm(len(S), generator=g)[:20000].to(device)]
        _, cfg, _ = ops.coupled(dh, src)
        new = ops.sort_unique(torch.cat([S, cfg]), end_bit=end_bit)
        fresh = new[ops.search(S, new) < 0]
        if len(fresh) == 0:
            break  # the sector is exhausted
        take = fresh[torch.randperm(len(fresh), generator=g)[: n - len(S)].to(device)]
        S = ops.sort_unique(torch.cat([S, take]), end_bit=end_bit)
    return ops.to_numpy(S[:n])
