"""The selected-CI kernels on a GPU: coupled generation, diagonal elements and local-energy sums.

Configurations on the GPU are ``int64`` tensors of shape (n, words) holding the bits of the
``uint64`` arrays used on the CPU (word words-1 most significant; `cuscikit.backends.keys`
converts and sorts them); every buffer is allocated through PyTorch's caching allocator and
handed to the typed bindings of ``cuscikit._cuda`` as a tensor, so one pool holds all memory and
``torch.cuda.max_memory_allocated`` measures its peak.

Each function has a CPU twin it is tested against: `Hamiltonian.coupled` / `.diagonal` and
the pipeline's host segment sums.

Example:
    >>> import cuscikit
    >>> from cuscikit.sci import cuda as sci_cuda  # doctest: +SKIP
    >>> from cuscikit.backends.keys import to_device
    >>> mol = cuscikit.Molecule.load("N2")
    >>> dh = sci_cuda.DeviceHamiltonian.from_molecule(mol, "cuda")  # doctest: +SKIP
    >>> hf = to_device(cuscikit.SCISpace.hf(mol).configs, "cuda")  # doctest: +SKIP
    >>> offsets, configs, values = sci_cuda.coupled(dh, hf)  # doctest: +SKIP
    >>> int(offsets[-1])  # |C(HF)| for N2/STO-3G  # doctest: +SKIP
"""

from __future__ import annotations

import numpy as np
import torch

from cuscikit.backends import cuda
from cuscikit.sci.hamiltonian import DEFAULT_EPS, Hamiltonian, cached_for


def _stream(device: torch.device) -> int:
    return torch.cuda.current_stream(device).cuda_stream


def _check_configs(configs: torch.Tensor, words: int | None = None) -> torch.Tensor:
    if not isinstance(configs, torch.Tensor) or configs.device.type != "cuda":
        raise ValueError("configurations must be a CUDA tensor")
    if configs.dtype != torch.int64:
        raise ValueError(f"configurations must be int64 (uint64 bits), got {configs.dtype}")
    if configs.ndim != 2 or (words is not None and configs.shape[1] != words):
        raise ValueError(
            f"configurations must have shape (n, {words or 'words'}), got {tuple(configs.shape)}"
        )
    return configs.contiguous()


class DeviceHamiltonian:
    """A `Hamiltonian`'s integrals and double-excitation table resident on one GPU.

    Args:
        hamiltonian: the CPU `Hamiltonian` (its tables are copied, not rebuilt).
        device: a CUDA device.
    """

    def __init__(self, hamiltonian: Hamiltonian, device="cuda"):
        self._k = cuda()
        self.device = torch.device(device)
        if self.device.type != "cuda":
            raise ValueError(f"DeviceHamiltonian needs a CUDA device, got {self.device}")
        self.hamiltonian = hamiltonian
        self.norb, self.nwords = hamiltonian.norb, hamiltonian.nwords
        self.table_eps = hamiltonian.eps
        self.nelec = hamiltonian.nelec
        dev = self.device
        self.h1 = torch.as_tensor(np.ascontiguousarray(hamiltonian.h1e, np.float64), device=dev)
        self.eri = torch.as_tensor(np.ascontiguousarray(hamiltonian.eri, np.float64), device=dev)
        offsets, targets, values = hamiltonian.double_table()
        self._offsets_np, self._abs_values = offsets, np.abs(values)
        self.offsets = torch.as_tensor(offsets.astype(np.int64), device=dev)
        self.targets = torch.as_tensor(targets.astype(np.int32), device=dev)
        self.values = torch.as_tensor(values.astype(np.float64), device=dev)
        self._tables: dict[float, tuple] = {}

    @classmethod
    def from_molecule(cls, mol, device="cuda", eps: float = DEFAULT_EPS) -> DeviceHamiltonian:
        """The molecule's Hamiltonian on `device` (built once per molecule, device and eps)."""
        key = ("device", str(torch.device(device)), eps)
        return cached_for(mol, key, lambda: cls(Hamiltonian.from_molecule(mol, eps=eps), device))

    @property
    def n_spin_orbitals(self) -> int:
        return 2 * self.norb

    def tables(self, eps: float | None = None):
        """Kernel view of the tables screened at `eps` (>= the table threshold)."""
        eps = self.table_eps if eps is None else float(eps)
        if eps < self.table_eps:
            raise ValueError(f"eps={eps} is below the table threshold {self.table_eps}")
        if eps not in self._tables:
            # Rows are sorted by decreasing |value|: the first cut[p] entries lie above eps.
            above = np.concatenate([[0], np.cumsum(self._abs_values > eps)])
            cut = above[self._offsets_np[1:]] - above[self._offsets_np[:-1]]
            cut_t = torch.as_tensor(cut.astype(np.int32), device=self.device)
            self._tables[eps] = self._k.Tables(
                self.h1,
                self.eri,
                float(self.hamiltonian.e_core),
                self.offsets,
                self.targets,
                self.values,
                cut_t,
            )  # the binding keeps the tensors alive
        return self._tables[eps]

    def n_elec(self, configs: torch.Tensor) -> int:
        if self.nelec is not None:
            return int(sum(self.nelec))
        if len(configs) == 0:
            return 0
        return int(sum(bin(int(v) & (2**64 - 1)).count("1") for v in configs[0].tolist()))


def coupled_counts(dh: DeviceHamiltonian, configs: torch.Tensor, eps: float | None = None):
    """|C(x)| per source (int64 tensor), without writing the coupled set."""
    configs = _check_configs(configs, dh.nwords)
    counts = torch.empty(len(configs), dtype=torch.int64, device=configs.device)
    dh._k.coupled_counts(
        dh.tables(eps), configs, dh.n_elec(configs), _eps(dh, eps), counts, _stream(configs.device)
    )
    return counts


def _eps(dh: DeviceHamiltonian, eps: float | None) -> float:
    return dh.table_eps if eps is None else float(eps)


def coupled(
    dh: DeviceHamiltonian,
    configs: torch.Tensor,
    eps: float | None = None,
    counts: torch.Tensor | None = None,
):
    """The coupled set of each source: (offsets (n+1,), configs (m, words), values (m,)).

    Source s owns rows offsets[s]:offsets[s+1], in the CPU kernel's order within a source.
    `counts` (from `coupled_counts`) skips the counting pass.
    """
    configs = _check_configs(configs, dh.nwords)
    if counts is None:
        counts = coupled_counts(dh, configs, eps)
    offsets = torch.zeros(len(configs) + 1, dtype=torch.int64, device=configs.device)
    torch.cumsum(counts, 0, out=offsets[1:])
    m = int(offsets[-1])
    out_c = torch.empty((m, dh.nwords), dtype=torch.int64, device=configs.device)
    out_v = torch.empty(m, dtype=torch.float64, device=configs.device)
    dh._k.coupled_write(
        dh.tables(eps),
        configs,
        dh.n_elec(configs),
        _eps(dh, eps),
        offsets,
        out_c,
        out_v,
        _stream(configs.device),
    )
    return offsets, out_c, out_v


def diagonal(dh: DeviceHamiltonian, configs: torch.Tensor) -> torch.Tensor:
    """<x|H|x> per configuration, E_core included."""
    configs = _check_configs(configs, dh.nwords)
    out = torch.empty(len(configs), dtype=torch.float64, device=configs.device)
    dh._k.diagonal(dh.tables(), configs, out, _stream(configs.device))
    return out


def local_energy_sums(
    offsets: torch.Tensor,
    values: torch.Tensor,
    index: torch.Tensor,
    psi: torch.Tensor,
    in_space: torch.Tensor,
):
    """Per source s: sum_k values[k] psi[index[k]] over its segment, for all k (coupled
    estimator) and for those with in_space[index[k]] (variational estimator).

    Returns two complex128 tensors of length len(offsets) - 1.
    """
    n = len(offsets) - 1
    dev = values.device
    psi = psi.to(torch.complex128).contiguous()
    in_space = in_space.to(torch.uint8).contiguous()
    num_c = torch.empty(n, dtype=torch.complex128, device=dev)
    num_v = torch.empty(n, dtype=torch.complex128, device=dev)
    cuda().local_energy_sums(
        offsets.contiguous(),
        values.contiguous(),
        index.contiguous(),
        torch.view_as_real(psi),
        in_space,
        torch.view_as_real(num_c),
        torch.view_as_real(num_v),
        _stream(dev),
    )
    return num_c, num_v
