"""The determinant kernels behind one interface, on the host or on a GPU.

An iteration written against `Engine` runs unchanged on either: `HostEngine` calls the compiled
C++/OpenMP kernels on numpy arrays (or, with ``tensors=True``, hands torch CPU tensors between
them, the array kind of the GPU path, so that CPU-only machines test that path too),
`CudaEngine` the CUDA kernels on torch tensors of one GPU. Keys are the configurations (numpy
uint64 or torch int64, see `cuscikit.backends.keys`).

Example:
    >>> from cuscikit import Molecule, SCISpace
    >>> mol = Molecule.load("LiH")
    >>> eng = engine("cpu", mol)
    >>> S = eng.keys(SCISpace.hf(mol).configs)
    >>> offsets, configs, values = eng.coupled(S, eng.coupled_counts(S))
    >>> int(offsets[-1]) == len(configs) == len(values)
    True
"""

from __future__ import annotations

import numpy as np

from cuscikit.backends.keys import KeyIndex, is_tensor, search, to_device, to_numpy
from cuscikit.sci.hamiltonian import Hamiltonian


class Engine:
    """What the NNQS-SCI iteration needs from the determinant kernels.

    Attributes:
        device: "cpu" or a torch CUDA device.
        tensors: arrays between stages are torch tensors (else numpy arrays).
        words: 64-bit words per configuration.
        end_bit: bits that matter per configuration (2 * norb).
    """

    name = ""
    tensors = False

    def keys(self, configs):
        """Host configurations as this engine's key array."""
        raise NotImplementedError

    def to_host(self, keys) -> np.ndarray:
        """Keys back as host uint64 configurations."""
        return to_numpy(keys)

    def coupled_counts(self, sources):
        """|C(x)| per source, as a host int64 array."""
        raise NotImplementedError

    def coupled(self, sources, counts):
        """(offsets (n+1,), configurations (m, words), values (m,)) of the sources' coupled
        sets, grouped by source in source order."""
        raise NotImplementedError

    def diagonal(self, configs):
        """<x|H|x>, E_core included."""
        raise NotImplementedError

    def locate(self, sorted_unique, queries):
        """Row of each query in sorted unique keys (every query must be present)."""
        raise NotImplementedError

    def find(self, sorted_unique, queries):
        """Row of each query in sorted unique keys, or -1."""
        return search(sorted_unique, queries)

    def numerators(self, offsets, values, index, psi, in_space):
        """Per source: sum of values * psi[index] over its segment, all of them (coupled
        estimator) and those with in_space[index] (variational estimator)."""
        raise NotImplementedError

    def cat(self, arrays):
        raise NotImplementedError


class HostEngine(Engine):
    """The compiled C++/OpenMP kernels on numpy arrays (torch CPU tensors with `tensors`)."""

    name = "cpu"
    device = "cpu"

    def __init__(self, hamiltonian: Hamiltonian, tensors: bool = False):
        self.hamiltonian = hamiltonian
        self.words, self.end_bit = hamiltonian.nwords, 2 * hamiltonian.norb
        self.tensors = bool(tensors)

    def _out(self, a):
        """A host result as this engine's kind (uint64 keys become int64 tensors)."""
        if not self.tensors:
            return a
        import torch

        a = np.ascontiguousarray(a)
        return torch.from_numpy(a.view(np.int64) if a.dtype == np.uint64 else a)

    @staticmethod
    def _in(a) -> np.ndarray:
        """This engine's array as numpy (int64 key tensors as uint64 keys)."""
        return to_numpy(a) if is_tensor(a) and a.ndim == 2 else (a.numpy() if is_tensor(a) else a)

    def keys(self, configs):
        return self._out(np.ascontiguousarray(configs, dtype=np.uint64))

    def coupled_counts(self, sources):
        return self.hamiltonian.coupled_counts(self._in(sources))

    def coupled(self, sources, counts):
        cs = self.hamiltonian.coupled(self._in(sources))
        offsets = np.zeros(len(sources) + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        return self._out(offsets), self._out(cs.configs), self._out(cs.values)

    def diagonal(self, configs):
        return self._out(self.hamiltonian.diagonal(self._in(configs)))

    def locate(self, sorted_unique, queries):
        return self._out(KeyIndex(self._in(sorted_unique)).find(self._in(queries)))

    find = locate  # a hash lookup answers -1 for absent keys

    def numerators(self, offsets, values, index, psi, in_space):
        offsets, values, index, psi, in_space = (
            self._in(a) for a in (offsets, values, index, psi, in_space)
        )
        n = len(offsets) - 1
        source = np.repeat(np.arange(n, dtype=np.int64), np.diff(offsets))
        contrib = values * psi[index]
        inside = in_space[index]
        num_c = _segment_sum(source, contrib, n)
        num_v = _segment_sum(source[inside], contrib[inside], n)
        return self._out(num_c), self._out(num_v)

    def cat(self, arrays):
        if self.tensors:
            import torch

            return torch.cat(arrays)
        return np.concatenate(arrays)


def _segment_sum(index: np.ndarray, values: np.ndarray, n: int) -> np.ndarray:
    """Sum of complex `values` grouped by `index` (length n), in input order."""
    re = np.bincount(index, weights=values.real, minlength=n)
    im = np.bincount(index, weights=values.imag, minlength=n)
    return re + 1j * im


class CudaEngine(Engine):
    """The CUDA kernels on torch tensors of one GPU (`cuscikit.sci.cuda`)."""

    name = "cuda"
    tensors = True

    def __init__(self, hamiltonian: Hamiltonian, device):
        import torch

        from cuscikit.sci.cuda import DeviceHamiltonian

        self.torch = torch
        self.device = torch.device(device)
        if self.device.index is None:  # "cuda": the current device, by number
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.hamiltonian = hamiltonian
        self.dh = DeviceHamiltonian(hamiltonian, self.device)
        self.words, self.end_bit = hamiltonian.nwords, 2 * hamiltonian.norb

    def keys(self, configs):
        return to_device(configs, self.device)

    def coupled_counts(self, sources):
        from cuscikit.sci import cuda as sci_cuda

        return sci_cuda.coupled_counts(self.dh, sources).to("cpu").numpy()

    def coupled(self, sources, counts):
        from cuscikit.sci import cuda as sci_cuda

        counts_t = self.torch.as_tensor(np.asarray(counts, np.int64), device=self.device)
        return sci_cuda.coupled(self.dh, sources, counts=counts_t)

    def diagonal(self, configs):
        from cuscikit.sci import cuda as sci_cuda

        return sci_cuda.diagonal(self.dh, configs)

    def locate(self, sorted_unique, queries):
        return search(sorted_unique, queries)

    def numerators(self, offsets, values, index, psi, in_space):
        from cuscikit.sci import cuda as sci_cuda

        return sci_cuda.local_energy_sums(offsets, values, index, psi, in_space)

    def cat(self, arrays):
        return self.torch.cat(arrays)


def engine(kind: str, molecule, eps: float | None = None, device=None) -> Engine:
    """The engine of `kind` for a molecule's Hamiltonian screened at `eps`.

    Args:
        kind: "cpu" (compiled host kernels on numpy arrays), "cpu-tensors" (the same kernels,
            torch CPU tensors between stages) or "cuda" (CUDA kernels).
        molecule: a `cuscikit.Molecule`.
        eps: screening threshold of the coupled sets (default: the Hamiltonian's).
        device: the CUDA device (default: the current one).
    """
    from cuscikit.sci.hamiltonian import DEFAULT_EPS

    h = Hamiltonian.from_molecule(molecule, eps=DEFAULT_EPS if eps is None else eps)
    if kind in ("cpu", "cpu-tensors"):
        return HostEngine(h, tensors=kind == "cpu-tensors")
    if kind == "cuda":
        return CudaEngine(h, device if device is not None else "cuda")
    raise ValueError(f"unknown engine {kind!r}: use 'cpu', 'cpu-tensors' or 'cuda'")
