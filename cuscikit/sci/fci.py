"""Exact CI in the determinant space, as a solver with PySCF's fcisolver interface.

`FCI` diagonalises H in every determinant of the (n_alpha, n_beta) sector with cuscikit's own
kernels (`SCISpace.exact_energy`: dense for small spaces, Davidson otherwise) and gives the
spin-traced density matrices in PySCF's index conventions, so it drops into
``pyscf.mcscf.CASCI(...).fcisolver`` and is checked against ``pyscf.fci.direct_spin1``.

Conventions (as PySCF's): E = sum_pq h_pq dm1[q, p] + 1/2 sum_pqrs (pq|rs) dm2[p, q, r, s] + ecore
with dm1[p, q] = <E_qp> and dm2[p, q, r, s] = <E_pq E_rs> - delta_qr <E_ps>, E_pq the spin-summed
excitation operator. CI vectors are indexed like ``SCISpace.full``'s configurations (sorted
interleaved bitstrings), not like PySCF's (alpha string, beta string) matrices; the
basis-independent quantities (energies, density matrices, <S^2>) are what compare.

Example:
    >>> from cuscikit import Molecule
    >>> from cuscikit.sci import FCI
    >>> mol = Molecule.load("LiH")
    >>> e, ci = FCI().kernel(mol.h1e, mol.eri, mol.norb, mol.nelec, ecore=mol.e_core)
    >>> round(e, 8)
    -7.78446028
    >>> ss, mult = FCI().spin_square(ci, mol.norb, mol.nelec)
    >>> round(ss, 10), round(mult, 10)
    (0.0, 1.0)
"""

from __future__ import annotations

import math

import numpy as np

from cuscikit.backends.keys import KeyIndex, sort_unique
from cuscikit.chem.molecule import check_state_symmetry
from cuscikit.lib.logger import new_logger
from cuscikit.lib.solver import Solver
from cuscikit.sci.configs import all_determinants, normalize_nelec
from cuscikit.sci.hamiltonian import Hamiltonian
from cuscikit.sci.space import SCISpace

__all__ = ["FCI"]


def _popcount_below(configs: np.ndarray, k: int) -> np.ndarray:
    """Occupied spin orbitals strictly below spin orbital k, per configuration."""
    words = configs.shape[1]
    w, b = divmod(k, 64)
    count = np.zeros(len(configs), dtype=np.int64)
    for i in range(min(w, words)):
        count += np.bitwise_count(configs[:, i]).astype(np.int64)
    if w < words and b:
        mask = np.uint64((1 << b) - 1)
        count += np.bitwise_count(configs[:, w] & mask).astype(np.int64)
    return count


def _bit(configs: np.ndarray, k: int) -> np.ndarray:
    w, b = divmod(k, 64)
    return ((configs[:, w] >> np.uint64(b)) & np.uint64(1)).astype(bool)


class _Space:
    """The determinant list of one sector and the action of a+_P a_Q on it."""

    def __init__(self, norb: int, nelec):
        self.norb = norb
        self.nelec = normalize_nelec(nelec, norb)
        # sorted, as SCISpace keeps them: the CI vectors follow this order
        self.configs = sort_unique(all_determinants(norb, self.nelec), return_inverse=False)
        self.index = KeyIndex(self.configs)

    def hop(self, P: int, Q: int, target: _Space | None = None):
        """(rows, targets, signs) with a+_P a_Q |x_row> = sign |x_target> (spin orbitals);
        `target` is the sector of the results when P and Q differ in spin (default: this)."""
        x = self.configs
        ok = _bit(x, Q)
        if P != Q:
            ok &= ~_bit(x, P)
        rows = np.flatnonzero(ok)
        if P == Q:
            return rows, rows, np.ones(len(rows))
        src = x[rows]
        mid = src.copy()
        mid[:, Q // 64] ^= np.uint64(1) << np.uint64(Q % 64)
        sign = (-1.0) ** (_popcount_below(src, Q) + _popcount_below(mid, P))
        dst = mid
        dst[:, P // 64] ^= np.uint64(1) << np.uint64(P % 64)
        found = (target or self).index.find(dst)
        if (found < 0).any():  # pragma: no cover - a hop always lands in its sector
            raise RuntimeError("an excitation left the determinant sector")
        return rows, found, sign

    def apply_E(self, c: np.ndarray, p: int, q: int) -> np.ndarray:
        """E_pq c = sum over spins of a+_{p sigma} a_{q sigma} c."""
        out = np.zeros_like(c)
        for s in (0, 1):
            rows, dst, sign = self.hop(2 * p + s, 2 * q + s)
            np.add.at(out, dst, sign * c[rows])
        return out


class FCI(Solver):
    """Exact CI in the determinant space with PySCF's fcisolver signature.

    Options:
        conv_tol: energy convergence of the Davidson solver.
        conv_tol_residual: residual norm of every root at convergence (the accuracy of the
            vectors, hence of the density matrices).
        max_cycle: Davidson iteration limit.
        nroots: roots returned by `kernel` (default 1).
        max_memory: bytes the dense or RDM intermediates may take (None: the host's available
            memory); larger problems are refused before any work.

    Results (after `kernel`): ``e_tot`` (float or array), ``ci`` (vector or list), ``converged``.
    """

    conv_tol: float = 1e-12
    conv_tol_residual: float = 1e-9
    max_cycle: int = 300
    nroots: int = 1
    max_memory: int | None = None
    _keys = {"e_tot", "ci", "converged", "norb", "nelec", "molecule"}

    def __init__(self, molecule=None, **options):
        super().__init__(**options)
        self.molecule = molecule
        self.e_tot = None
        self.ci = None
        self.converged = False
        self._spaces: dict = {}

    def _space(self, norb: int, nelec) -> _Space:
        key = (int(norb), normalize_nelec(nelec, norb))
        if key not in self._spaces:
            self._spaces = {key: _Space(*key)}  # keep one sector's tables
        return self._spaces[key]

    def _budget(self) -> int:
        if self.max_memory is not None:
            return int(self.max_memory)
        from cuscikit.backends.memory import host_available_bytes

        return int(0.8 * host_available_bytes())

    def kernel(
        self,
        h1e=None,
        eri=None,
        norb=None,
        nelec=None,
        ci0=None,
        ecore: float = 0.0,
        nroots: int | None = None,
        **kwargs,
    ):
        """Lowest eigenpairs of H = h1e + eri + ecore in the (n_alpha, n_beta) sector.

        Args:
            h1e: (norb, norb) one-electron integrals (default: the solver's molecule's).
            eri: two-electron integrals, full or 4/8-fold packed (chemists' notation).
            norb: orbitals.
            nelec: (n_alpha, n_beta) or a total count.
            ci0: a guess vector (or list) in this solver's determinant order, or None.
            ecore: constant energy added to every root.
            nroots: number of roots (default: the ``nroots`` option).
            **kwargs: PySCF's extra keywords (``verbose``, ``max_memory``, ...): accepted and
                ignored where they do not apply.

        Returns:
            (e, ci): a float and a vector for one root, arrays and a list of vectors for more.
        """
        self.check_sanity()
        if h1e is None:
            mol = self.molecule
            if mol is None:
                raise ValueError("give integrals (h1e, eri, norb, nelec) or build FCI(molecule)")
            check_state_symmetry(mol)
            h1e, eri, norb, nelec, ecore = mol.h1e, mol.eri, mol.norb, mol.nelec, mol.e_core
        nroots = self.nroots if nroots is None else int(nroots)
        h1e = np.asarray(h1e, dtype=np.float64)
        norb = int(norb)
        if h1e.shape != (norb, norb):
            raise ValueError(f"h1e has shape {h1e.shape}, expected ({norb}, {norb})")
        if not np.allclose(h1e, h1e.T, atol=1e-10):
            raise ValueError("h1e is not symmetric")
        if not math.isfinite(float(ecore)):
            raise ValueError(f"ecore must be finite, got {ecore}")
        nelec = normalize_nelec(nelec, norb)
        n_det = math.comb(norb, nelec[0]) * math.comb(norb, nelec[1])
        if not 1 <= nroots <= n_det:
            raise ValueError(f"nroots must be in 1..{n_det}, got {nroots}")
        need = 8 * n_det * min(n_det, 2000) if n_det <= 2000 else 8 * n_det * 60
        if need > self._budget():
            raise MemoryError(
                f"FCI of {n_det:,} determinants needs about {need / 2**30:.1f} GiB, more than "
                f"the {self._budget() / 2**30:.1f} GiB allowed (max_memory)"
            )
        H = Hamiltonian(h1e, eri, float(ecore), nelec)
        space = SCISpace(H, self._space(norb, nelec).configs)
        guess = None
        if ci0 is not None and not (isinstance(ci0, (list, tuple)) and len(ci0) == 0):
            g = np.asarray(
                ci0 if not isinstance(ci0, (list, tuple)) else np.stack(ci0, axis=1),
                dtype=np.float64,
            ).reshape(n_det, -1)
            guess = g
        e, vecs = space.exact_energy(
            nroots,
            tol=self.conv_tol,
            return_vectors=True,
            guess=guess,
            max_iter=self.max_cycle,
            residual_tol=self.conv_tol_residual,
        )
        e = np.atleast_1d(np.asarray(e, dtype=np.float64))
        self.converged = True
        self.e_tot = float(e[0]) if nroots == 1 else e
        self.ci = vecs[:, 0].copy() if nroots == 1 else [vecs[:, k].copy() for k in range(nroots)]
        self.norb, self.nelec = norb, nelec
        new_logger(self).info("FCI: %d determinants, E = %s", n_det, self.e_tot)
        return self.e_tot, self.ci

    # --- properties of a CI vector ---------------------------------------------------------------
    def _check(self, ci, norb, nelec) -> tuple[np.ndarray, _Space]:
        sp = self._space(norb, nelec)
        c = np.asarray(ci, dtype=np.float64).reshape(-1)
        if len(c) != len(sp.configs):
            raise ValueError(
                f"the CI vector has {len(c)} entries, the sector {len(sp.configs)} determinants"
            )
        return c, sp

    def _excitations(self, c: np.ndarray, sp: _Space) -> np.ndarray:
        n = sp.norb
        need = 8 * n * n * len(c)
        if need > self._budget():
            raise MemoryError(
                f"the density matrices need {need / 2**30:.1f} GiB of "
                f"intermediates, more than max_memory allows"
            )
        return np.stack([sp.apply_E(c, p, q) for p in range(n) for q in range(n)]).reshape(n, n, -1)

    def make_rdm1(self, ci, norb: int, nelec, link_index=None) -> np.ndarray:
        """Spin-traced one-particle density matrix, dm1[p, q] = <E_qp>."""
        c, sp = self._check(ci, norb, nelec)
        dm1 = np.empty((norb, norb))
        for p in range(norb):
            for q in range(norb):
                dm1[p, q] = c @ sp.apply_E(c, q, p)
        return dm1

    def make_rdm12(self, ci, norb: int, nelec, link_index=None, reorder: bool = True):
        """(dm1, dm2) spin-traced, dm2[p, q, r, s] = <E_pq E_rs> - delta_qr <E_ps>."""
        c, sp = self._check(ci, norb, nelec)
        t = self._excitations(c, sp)  # t[r, s] = E_rs c
        dm1 = np.einsum("qpk,k->pq", t, c)  # <E_qp>
        # <E_pq E_rs> = (E_qp c) . (E_rs c)
        pqrs = np.einsum("qpk,rsk->pqrs", t, t, optimize=True)
        dm2 = pqrs - np.einsum("qr,sp->pqrs", np.eye(norb), dm1)
        return dm1, dm2

    def make_rdm1s(self, ci, norb: int, nelec, link_index=None):
        """(dm1_alpha, dm1_beta), dm1_s[p, q] = <a+_{q s} a_{p s}>."""
        c, sp = self._check(ci, norb, nelec)
        out = []
        for s in (0, 1):
            dm = np.empty((norb, norb))
            for p in range(norb):
                for q in range(norb):
                    rows, dst, sign = sp.hop(2 * q + s, 2 * p + s)
                    dm[p, q] = np.dot(c[dst], sign * c[rows])
            out.append(dm)
        return tuple(out)

    def spin_square(self, ci, norb: int, nelec) -> tuple[float, float]:
        """(<S^2>, 2S + 1) of a CI vector: <S^2> = |S+ c|^2 + Sz (Sz + 1)."""
        c, sp = self._check(ci, norb, nelec)
        na, nb = sp.nelec
        up = np.zeros(0)
        if nb > 0 and na < norb:  # S+ = sum_p a+_{p alpha} a_{p beta} lands in (na+1, nb-1)
            raised = _Space(norb, (na + 1, nb - 1))
            up = np.zeros(len(raised.configs))
            for p in range(norb):
                rows, dst, sign = sp.hop(2 * p, 2 * p + 1, target=raised)
                np.add.at(up, dst, sign * c[rows])
        sz = 0.5 * (na - nb)
        ss = float(up @ up / (c @ c) + sz * (sz + 1))
        s = 0.5 * (math.sqrt(4 * ss + 1) - 1)
        return ss, 2 * s + 1

    def energy(self, h1e, eri, ci, norb: int, nelec, ecore: float = 0.0) -> float:
        """<c|H|c> / <c|c> from the density matrices."""
        from cuscikit.chem.integrals import restore_eri

        dm1, dm2 = self.make_rdm12(ci, norb, nelec)
        g = restore_eri(eri, norb, 1)
        c = np.asarray(ci).reshape(-1)
        return float(
            (np.einsum("pq,qp", h1e, dm1) + 0.5 * np.einsum("pqrs,pqrs", g, dm2)) / (c @ c) + ecore
        )
