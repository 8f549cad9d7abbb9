"""SCISpace: a set of determinants, and the exact energy of H restricted to it."""

from __future__ import annotations

from math import comb

import numpy as np

from cuscikit.backends.keys import KeyIndex, dedup
from cuscikit.sci.configs import (
    all_determinants,
    check_configurations,
    from_occupations,
    hf_configuration,
    start_configuration,
    to_occupations,
)
from cuscikit.sci.hamiltonian import DEFAULT_EPS, Hamiltonian

DENSE_LIMIT = 2000  # spaces up to this size are diagonalised densely


def _hamiltonian_of(system, eps: float) -> Hamiltonian:
    if isinstance(system, Hamiltonian):
        if system.nelec is None:
            raise ValueError("the Hamiltonian must know its electron count (pass nelec=...)")
        return system
    return Hamiltonian.from_molecule(system, eps=eps)


class SCISpace:
    """A set of unique configurations of one molecule, kept sorted.

    Args:
        system: a `cuscikit.Molecule` (or a `Hamiltonian` built with `nelec`).
        configs: uint64 (n, words) configurations; duplicates are dropped.
        eps: screening threshold of the Hamiltonian used for `exact_energy`.

    Example:
        >>> from cuscikit import Molecule, SCISpace
        >>> mol = Molecule.load("LiH")
        >>> full = SCISpace.full(mol)
        >>> len(full), round(full.exact_energy(), 8)
        (225, -7.78446028)
    """

    def __init__(self, system, configs=None, *, eps: float = DEFAULT_EPS):
        self.hamiltonian = _hamiltonian_of(system, eps)
        self.system = system
        self.norb = self.hamiltonian.norb
        self.nelec = self.hamiltonian.nelec
        if configs is None:
            configs = np.zeros((0, self.hamiltonian.nwords), np.uint64)
        configs = check_configurations(configs, self.norb, self.nelec)
        self.configs = dedup(configs)[0] if len(configs) else configs
        self._index: KeyIndex | None = None
        self.e_exact: np.ndarray | None = None

    # --- constructors ---------------------------------------------------------------------------
    @classmethod
    def hf(cls, system, **kw) -> SCISpace:
        """The space holding only the Hartree-Fock (aufbau) determinant."""
        h = _hamiltonian_of(system, kw.get("eps", DEFAULT_EPS))
        return cls(system, hf_configuration(h.norb, h.nelec), **kw)

    @classmethod
    def start(cls, system, **kw) -> SCISpace:
        """The space holding only the determinant a run starts from
        (`cuscikit.sci.configs.start_configuration`: the aufbau one unless the system's
        metadata names another)."""
        return cls(system, start_configuration(system), **kw)

    @classmethod
    def full(cls, system, **kw) -> SCISpace:
        """Every determinant of the molecule's (n_alpha, n_beta) sector: the FCI space."""
        h = _hamiltonian_of(system, kw.get("eps", DEFAULT_EPS))
        return cls(system, all_determinants(h.norb, h.nelec), **kw)

    @classmethod
    def singles_doubles(cls, system, **kw) -> SCISpace:
        """HF plus all its single and double excitations coupled to it (|H| > eps)."""
        h = _hamiltonian_of(system, kw.get("eps", DEFAULT_EPS))
        hf = hf_configuration(h.norb, h.nelec)
        cs = h.coupled(hf)
        return cls(system, np.vstack([hf, cs.configs]), **kw)

    @classmethod
    def from_occupations(cls, system, alpha, beta, **kw) -> SCISpace:
        """Build from lists of occupied alpha and beta orbitals."""
        h = _hamiltonian_of(system, kw.get("eps", DEFAULT_EPS))
        return cls(system, from_occupations(alpha, beta, h.norb), **kw)

    # --- set operations -------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.configs)

    def __repr__(self) -> str:
        return f"SCISpace(n={len(self)}, norb={self.norb}, nelec={self.nelec})"

    def index(self, configs) -> np.ndarray:
        """Row of each configuration in this space, -1 where absent."""
        if self._index is None:
            self._index = KeyIndex(self.configs)
        return self._index.find(configs)

    def __contains__(self, config) -> bool:
        return bool(self.index(np.asarray(config, np.uint64).reshape(1, -1))[0] >= 0)

    def add(self, configs) -> int:
        """Add configurations (validated, duplicates ignored); return how many were new."""
        configs = check_configurations(configs, self.norb, self.nelec)
        before = len(self)
        self.configs = dedup(np.vstack([self.configs, configs]))[0]
        self._index = None
        return len(self) - before

    @property
    def is_complete_sector(self) -> bool:
        """True when the space holds every determinant of its (n_alpha, n_beta) sector."""
        na, nb = self.nelec
        return len(self) == comb(self.norb, na) * comb(self.norb, nb)

    def occupations(self):
        """(alpha, beta) lists of occupied orbitals of every configuration."""
        return to_occupations(self.configs, self.norb)

    # --- exact energies -------------------------------------------------------------------------
    def exact_energy(
        self,
        nroots: int = 1,
        *,
        method: str = "auto",
        tol: float = 1e-11,
        return_vectors: bool = False,
        guess: np.ndarray | None = None,
        max_iter: int = 300,
        residual_tol: float = 1e-6,
    ):
        """Lowest eigenvalue(s) of H restricted to this space (variational CI in the space).

        For the full determinant space this is the FCI energy. Sparse H comes from the coupled
        generator (C++); spaces up to 2000 are diagonalised densely, larger ones by Davidson with
        at least three roots in the block (the lowest root of C2 is missed with one).

        Args:
            nroots: number of roots returned.
            method: "auto", "dense" or "davidson".
            tol: eigenvalue convergence for Davidson.
            return_vectors: also return the (n, nroots) eigenvectors (columns follow `configs`).
            guess: (n, k) starting vectors for Davidson (columns follow `configs`).
            max_iter: Davidson iteration limit.
            residual_tol: Davidson residual norm per root at convergence.

        Returns:
            float for nroots == 1, else an array; with return_vectors a pair.
        """
        n = len(self)
        if n == 0:
            raise ValueError("the space is empty")
        if nroots < 1 or nroots > n:
            raise ValueError(f"nroots must be in 1..{n}, got {nroots}")
        if method not in ("auto", "dense", "davidson"):
            raise ValueError(f"unknown method {method!r}: use 'auto', 'dense' or 'davidson'")
        H = self.hamiltonian.restricted(self.configs, complete_sector=self.is_complete_sector)
        if method == "dense" or (method == "auto" and n <= DENSE_LIMIT):
            w, v = np.linalg.eigh(H.toarray())
            e, vecs = w[:nroots], v[:, :nroots]
        else:
            from cuscikit.linalg.davidson import davidson

            nsolve = min(n, max(nroots, 3))
            res = davidson(
                H.matmat,
                H.diagonal(),
                nsolve,
                tol=tol,
                guess=guess,
                max_iter=max_iter,
                residual_tol=residual_tol,
            )
            # The extra roots only keep the lowest from being missed: a solve whose requested
            # roots meet the residual tolerance is accepted even if an extra one lags.
            if not res.converged and not np.all(res.residual_norms[:nroots] < residual_tol):
                raise RuntimeError(
                    f"Davidson did not converge in {res.iterations} iterations "
                    f"(residuals {res.residual_norms})"
                )
            e, vecs = res.energies[:nroots], res.vectors[:, :nroots]
        self.e_exact = e
        out = float(e[0]) if nroots == 1 else e
        return (out, vecs) if return_vectors else out
