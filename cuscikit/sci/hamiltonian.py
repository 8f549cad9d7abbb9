"""The second-quantised Hamiltonian over configurations, backed by the compiled CPU kernels."""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass

import numpy as np

from cuscikit.backends import core
from cuscikit.backends.memory import host_available_bytes
from cuscikit.sci.configs import n_words, normalize_nelec

DEFAULT_EPS = 1e-12
"""Default screening threshold: coupled configurations with |H_xx'| <= DEFAULT_EPS are dropped.
A negative threshold keeps every spin-allowed single and double excitation, zero or not."""


@dataclass(frozen=True)
class CoupledSet:
    """Coupled configurations of a batch of sources, as compact arrays.

    Attributes:
        source: int64 (m,) index of the source configuration in the batch.
        configs: uint64 (m, words) coupled configurations x'.
        values: float64 (m,) matrix elements <x'|H|x>.
    """

    source: np.ndarray
    configs: np.ndarray
    values: np.ndarray

    def __len__(self) -> int:
        return len(self.values)


_BUILT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def cached_for(system, key, build):
    """``build()`` once per (system, key): Hamiltonian tables of a molecule, on the host or a
    device, live as long as the molecule does (a weak reference; nothing is stored on it)."""
    per = _BUILT.setdefault(system, {})
    if key not in per:
        per[key] = build()
    return per[key]


def table_bytes(norb: int) -> int:
    """Bytes the Hamiltonian holds for `norb` orbitals, at most: the full ERI array (twice: the
    Python copy and the kernels' copy) and the double-excitation table (every pair of spin
    orbitals to every pair, 12 bytes an entry)."""
    n_so = 2 * norb
    pairs = n_so * (n_so - 1) // 2
    return int(2 * 8 * norb**4 + 12 * pairs * pairs)


def full_eri(eri: np.ndarray, norb: int) -> np.ndarray:
    """Return the (norb,)*4 ERI array from a full, 4-fold or 8-fold packed array."""
    eri = np.asarray(eri, dtype=np.float64)
    if eri.ndim == 4:
        return np.ascontiguousarray(eri)
    from cuscikit.chem.integrals import restore_eri

    return np.ascontiguousarray(restore_eri(eri, norb, 1))


def _finite_eps(eps) -> float:
    """A screening threshold: a finite float (NaN would turn every comparison, and so the
    screening, off)."""
    value = float(eps)
    if not math.isfinite(value):
        raise ValueError(f"eps must be a finite number, got {eps!r}")
    return value


class Hamiltonian:
    """H = sum h_pq a+_p a_q + 1/2 sum (pq|rs) a+_p a+_r a_s a_q + E_core on configurations.

    Builds the excitation tables once (double excitations with |<ab||ij>| > eps, sorted by
    magnitude) and evaluates Slater-Condon matrix elements in compiled C++ (OpenMP).

    Args:
        h1e: (norb, norb) one-electron integrals.
        eri: two-electron integrals in chemists' notation, full or 4/8-fold packed.
        e_core: constant energy (nuclear repulsion plus frozen core).
        nelec: (n_alpha, n_beta) or total electron count.
        eps: screening threshold of the excitation tables (default 1e-12; negative: none).

    Example:
        >>> from cuscikit import Molecule
        >>> mol = Molecule.load("LiH")
        >>> H = Hamiltonian.from_molecule(mol)
        >>> from cuscikit.sci.configs import hf_configuration
        >>> abs(float(H.diagonal(hf_configuration(mol.norb, mol.nelec))[0]) - mol.e_hf) < 1e-10
        True
    """

    def __init__(self, h1e, eri, e_core: float = 0.0, nelec=None, eps: float = DEFAULT_EPS):
        h1e = np.ascontiguousarray(h1e, dtype=np.float64)
        if h1e.ndim != 2 or h1e.shape[0] != h1e.shape[1]:
            raise ValueError(f"h1e must be a square matrix, got shape {h1e.shape}")
        norb = h1e.shape[0]
        self.norb = norb
        self.nwords = n_words(norb)
        self.nelec = None if nelec is None else normalize_nelec(nelec, norb)
        self.e_core = float(e_core)
        self.eps = _finite_eps(eps)
        self.h1e = h1e
        need = table_bytes(norb)
        budget = host_available_bytes()
        if need > 0.8 * budget:
            raise MemoryError(
                f"the Hamiltonian tables of {norb} orbitals need about {need / 2**30:.1f} GiB, "
                f"more than the {budget / 2**30:.1f} GiB of memory available"
            )
        self.eri = full_eri(eri, norb)
        if self.eri.shape != (norb,) * 4:
            raise ValueError(f"eri does not match norb={norb}: shape {self.eri.shape}")
        self._core = core().Hamiltonian(self.h1e, self.eri, self.e_core, self.eps)

    @classmethod
    def from_molecule(cls, mol, eps: float = DEFAULT_EPS) -> Hamiltonian:
        """Hamiltonian of a `cuscikit.Molecule` (built once per molecule and threshold)."""
        return cached_for(
            mol, ("host", eps), lambda: cls(mol.h1e, mol.eri_full(), mol.e_core, mol.nelec, eps=eps)
        )

    # --- tables -------------------------------------------------------------------------------
    @property
    def max_single_size(self) -> int:
        """Targets per occupied spin orbital in the single-excitation table (same spin)."""
        return self._core.max_single_size

    @property
    def max_double_size(self) -> int:
        """Longest target list of any occupied pair in the double-excitation table."""
        return self._core.max_double_size

    def double_table(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(offsets, packed targets a | b << 16, values) of the double-excitation table."""
        return self._core.double_table()

    # --- matrix elements ----------------------------------------------------------------------
    def _check(self, configs) -> np.ndarray:
        arr = np.ascontiguousarray(configs, dtype=np.uint64)
        if arr.ndim == 1:
            arr = arr.reshape(-1, self.nwords)
        if arr.ndim != 2 or arr.shape[1] != self.nwords:
            raise ValueError(f"configurations must have shape (n, {self.nwords}), got {arr.shape}")
        return arr

    def _eps(self, eps: float | None) -> float:
        eps = self.eps if eps is None else _finite_eps(eps)
        if eps < self.eps:
            raise ValueError(
                f"eps={eps} is below the table threshold {self.eps}: build the Hamiltonian "
                "with a smaller eps"
            )
        return eps

    def diagonal(self, configs) -> np.ndarray:
        """<x|H|x> for each configuration, E_core included."""
        return core().diagonal_energies(self._core, self._check(configs))

    def matrix_elements(self, bra, ket) -> np.ndarray:
        """<bra_k|H|ket_k> for each pair of rows (zero beyond double excitations)."""
        return core().matrix_elements(self._core, self._check(bra), self._check(ket))

    def coupled(self, configs, eps: float | None = None) -> CoupledSet:
        """All x' (single and double excitations of each source x) with |<x'|H|x>| > eps.

        Output is grouped by source in input order; within a source, singles come first.
        """
        src, cfg, val = core().coupled_configurations(
            self._core, self._check(configs), self._eps(eps)
        )
        return CoupledSet(src, cfg, val)

    def coupled_counts(self, configs, eps: float | None = None) -> np.ndarray:
        """|C(x)| for each source, without materialising the coupled set."""
        return core().coupled_counts(self._core, self._check(configs), self._eps(eps))

    def csr(self, space, eps: float | None = None):
        """H restricted to `space` (rows of unique configurations) as a full scipy CSR matrix."""
        import scipy.sparse as sp

        space = self._check(space)
        indptr, indices, data = core().hamiltonian_csr(self._core, space, self._eps(eps), False)
        n = len(space)
        return sp.csr_matrix((data, indices, indptr), shape=(n, n))

    def restricted(self, space, eps: float | None = None, *, complete_sector: bool = False):
        """H restricted to `space`, stored as its upper triangle (half the memory of `csr`).

        Args:
            space: unique configurations (rows in any order).
            eps: screening threshold (default: the table threshold).
            complete_sector: the space is every determinant of the (n_alpha, n_beta) sector:
                configurations are then located by combinatorial ranking instead of hashing.
        """
        space = self._check(space)
        sector = None
        if complete_sector:
            if self.nelec is None:
                raise ValueError("complete_sector needs the Hamiltonian's nelec")
            sector = tuple(self.nelec)
        indptr, indices, data = core().hamiltonian_csr(
            self._core, space, self._eps(eps), True, sector
        )
        return SymmetricMatrix(indptr, indices, data)


class SymmetricMatrix:
    """A real symmetric sparse matrix stored as its upper triangle (CSR, diagonal included),
    with a parallel C++ product. Used for H restricted to an SCI space."""

    def __init__(self, indptr: np.ndarray, indices: np.ndarray, data: np.ndarray):
        self.indptr, self.indices, self.data = indptr, indices, data
        self.n = len(indptr) - 1

    @property
    def nnz_stored(self) -> int:
        return len(self.data)

    @property
    def nbytes(self) -> int:
        return self.indptr.nbytes + self.indices.nbytes + self.data.nbytes

    def diagonal(self) -> np.ndarray:
        # rows are sorted by column and the diagonal is the first entry of each row
        return self.data[self.indptr[:-1]].copy()

    def matmat(self, x: np.ndarray) -> np.ndarray:
        x2 = np.ascontiguousarray(x, dtype=np.float64)
        y = core().symmetric_csr_matvec(
            self.indptr, self.indices, self.data, x2.reshape(self.n, -1)
        )
        return y.reshape(x2.shape)

    __matmul__ = matmat

    def tocsr(self):
        """The whole symmetric matrix as a SciPy CSR matrix (both triangles)."""
        import scipy.sparse as sp

        u = sp.csr_matrix((self.data, self.indices, self.indptr), shape=(self.n, self.n))
        return (u + u.T - sp.diags(self.diagonal())).tocsr()

    def toarray(self) -> np.ndarray:
        return self.tocsr().toarray()
