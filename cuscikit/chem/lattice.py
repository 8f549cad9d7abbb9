"""Lattice models as integrals: the Hubbard model on 1D and 2D lattices, and the orbital basis a
selected-CI method can stand on.

H = -t sum_<ij>,s (a+_is a_js + h.c.) + U sum_i n_i,up n_i,down: in chemists' notation h_ij = -t
for nearest neighbours i, j and (ii|ii) = U. In the site basis the Hartree-Fock determinant of a
correlated lattice has little weight, and a method that grows a determinant space from it
stands on nothing; a one-particle basis from a mean field of the model (`rhf_orbitals`) puts
most of the weight back on few determinants. The energies of any exact method are the same in
either basis (a unitary transformation of the orbitals), which the tests check.

Example:
    >>> h1, eri = hubbard_integrals(4, U=4.0, pbc=True)
    >>> h1[0].tolist(), float(eri[0, 0, 0, 0])
    ([0.0, -1.0, 0.0, -1.0], 4.0)
"""

from __future__ import annotations

import math
import re

import numpy as np

__all__ = [
    "LATTICE_NAMES",
    "hubbard_integrals",
    "lattice_bonds",
    "lattice_from_name",
    "rhf_levels",
    "rhf_orbitals",
    "rotate_integrals",
    "shell_fillings",
]


LATTICE_NAMES = (
    "Hubbard-<L>-<chain|ring>-U<U> or Hubbard-<Lx>x<Ly>-<open|pbc>-U<U>, half filling, "
    "optionally followed by -site (the site basis instead of the mean-field one) and -aufbau "
    "(start from the aufbau determinant), e.g. Hubbard-8-chain-U4, Hubbard-4x3-pbc-U8-site"
)
"""The grammar of lattice names (`lattice_from_name`), for messages and help texts."""

_NAME = re.compile(
    r"hubbard-(\d+)(?:x(\d+))?-(chain|ring|open|pbc)-u(\d+(?:\.\d*)?|\.\d+)"
    r"(-site)?(-aufbau)?",
    re.IGNORECASE,
)


def lattice_from_name(name: str) -> dict | None:
    """The `Molecule.hubbard` arguments a lattice name stands for, or None when ``name`` does not
    begin with "Hubbard" (a molecule's name, say). The grammar is `LATTICE_NAMES`; "ring" and
    "pbc" are periodic boundaries, "chain" and "open" open ones. The returned dict holds
    ``shape``, ``U``, ``pbc`` and ``basis``, and ``aufbau`` (True: drop the start determinant
    the mean-field basis names, so a run starts from the aufbau one).

    Raises:
        ValueError: a name that begins with "Hubbard" but does not follow the grammar.

    Example:
        >>> lattice_from_name("Hubbard-4x3-pbc-U8-site")
        {'shape': (4, 3), 'U': 8.0, 'pbc': True, 'basis': 'site', 'aufbau': False}
        >>> lattice_from_name("N2") is None
        True
    """
    name = str(name).strip()
    if not name.lower().startswith("hubbard"):
        return None
    m = _NAME.fullmatch(name)
    if m is None:
        raise ValueError(f"{name!r} is not a lattice name: expected {LATTICE_NAMES}")
    lx, ly, bc, u, site, aufbau = m.groups()
    return {
        "shape": int(lx) if ly is None else (int(lx), int(ly)),
        "U": float(u),
        "pbc": bc.lower() in ("ring", "pbc"),
        "basis": "site" if site else "rhf",
        "aufbau": bool(aufbau),
    }


def _shape(shape) -> tuple[int, ...]:
    dims = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    if not 1 <= len(dims) <= 2 or any(int(d) != d or d < 1 for d in dims):
        raise ValueError(f"a lattice shape is L or (Lx, Ly) with positive sizes, got {shape!r}")
    return tuple(int(d) for d in dims)


def lattice_bonds(shape, pbc: bool | tuple[bool, ...] = False) -> list[tuple[int, int]]:
    """Nearest-neighbour bonds (i < j, each once) of a chain or a rectangular lattice, sites
    numbered row by row; periodic along the axes where `pbc` is true (a periodic axis of
    length 2 has one bond, not two).

    Example:
        >>> lattice_bonds(3, pbc=True)
        [(0, 1), (0, 2), (1, 2)]
        >>> lattice_bonds((2, 2))
        [(0, 1), (0, 2), (1, 3), (2, 3)]
    """
    dims = _shape(shape)
    periodic = (pbc,) * len(dims) if isinstance(pbc, bool) else tuple(bool(p) for p in pbc)
    if len(periodic) != len(dims):
        raise ValueError(f"pbc needs one flag per axis of {dims}, got {pbc!r}")
    bonds = set()
    for flat in range(math.prod(dims)):
        coord = np.unravel_index(flat, dims)
        for axis, size in enumerate(dims):
            step = list(coord)
            step[axis] += 1
            if step[axis] == size:
                if not periodic[axis] or size < 3:
                    continue
                step[axis] = 0
            other = int(np.ravel_multi_index(step, dims))
            if other != flat:
                bonds.add((min(flat, other), max(flat, other)))
    return sorted(bonds)


def hubbard_integrals(shape, U: float, t: float = 1.0, pbc=False) -> tuple[np.ndarray, np.ndarray]:
    """(h1e, full eri) of the Hubbard model in the site basis.

    Args:
        shape: L (a chain) or (Lx, Ly).
        U: on-site repulsion.
        t: hopping between nearest neighbours.
        pbc: periodic boundaries (one flag, or one per axis).
    """
    if not (math.isfinite(U) and math.isfinite(t)):
        raise ValueError(f"U and t must be finite, got U={U}, t={t}")
    n = math.prod(_shape(shape))
    h1 = np.zeros((n, n))
    for i, j in lattice_bonds(shape, pbc):
        h1[i, j] = h1[j, i] = -float(t)
    eri = np.zeros((n,) * 4)
    eri[np.arange(n), np.arange(n), np.arange(n), np.arange(n)] = float(U)
    return h1, eri


def rotate_integrals(h1: np.ndarray, eri: np.ndarray, C: np.ndarray):
    """Integrals in the orbitals C (columns, orthonormal): C^T h C and (pq|rs) transformed on
    every index."""
    C = np.asarray(C, dtype=np.float64)
    if not np.allclose(C.T @ C, np.eye(C.shape[1]), atol=1e-10):
        raise ValueError("the orbitals are not orthonormal")
    h = C.T @ h1 @ C
    g = np.einsum("pqrs,pi,qj,rk,sl->ijkl", eri, C, C, C, C, optimize=True)
    return h, g


def rhf_orbitals(
    h1: np.ndarray,
    eri: np.ndarray,
    nelec,
    max_cycle: int = 500,
    tol: float = 1e-10,
    damping: float = 0.5,
) -> np.ndarray:
    """Orbitals of a restricted mean field of the model, as columns sorted by orbital energy.

    The spin-averaged Fock matrix is iterated from the non-interacting density with damped
    densities (again with damping 0.8, then 0.95, if an iteration cycles); a shell of degenerate
    levels at the Fermi level is occupied fractionally (equal shares), so that open-shell
    lattices (a 12-site ring at half filling) converge to the symmetric mean field instead of
    oscillating between the shell's members. On bipartite lattices at half filling this gives
    the uniform density at once (E_RHF = 2 sum of the lowest one-particle energies + U L / 4).
    Any orthonormal set gives the same exact energies; these put the weight of a correlated
    state on few determinants.

    Args:
        h1: one-electron integrals in an orthonormal basis.
        eri: full two-electron integrals in the same basis.
        nelec: (n_alpha, n_beta) or a total count.

    Raises:
        RuntimeError: the iteration did not reach `tol` in `max_cycle` cycles.

    Example:
        >>> h1, eri = hubbard_integrals(6, U=8.0, pbc=True)
        >>> C = rhf_orbitals(h1, eri, 6)
        >>> D = 2 * C[:, :3] @ C[:, :3].T
        >>> np.round(np.diag(D), 6).tolist()  # uniform density, not a density wave
        [1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    """
    return rhf_levels(h1, eri, nelec, max_cycle, tol, damping)[1]


def rhf_levels(
    h1: np.ndarray,
    eri: np.ndarray,
    nelec,
    max_cycle: int = 500,
    tol: float = 1e-10,
    damping: float = 0.5,
) -> tuple[np.ndarray, np.ndarray]:
    """(orbital energies, orbitals) of the mean field of `rhf_orbitals`: the levels ascending,
    the orbitals as columns in the same order.

    Example:
        >>> e, C = rhf_levels(*hubbard_integrals(4, U=0.0, pbc=True), 4)
        >>> (np.round(e, 12) + 0.0).tolist()   # a shell of two levels at 0: one electron per spin
        [-2.0, 0.0, 0.0, 2.0]
    """
    n = h1.shape[0]
    na, nb = _counts(nelec)
    if not (0 <= nb <= na <= n):
        raise ValueError(f"({na}, {nb}) electrons do not fit in {n} orbitals")
    scale = _scale(h1, eri)
    for mix in sorted({float(damping), 0.8, 0.95}):  # heavier damping if a lighter one cycles
        if mix < damping:
            continue
        e, C = np.linalg.eigh(h1)
        D = _aufbau_density(e, C, na, scale) + _aufbau_density(e, C, nb, scale)
        for _ in range(max_cycle):
            J = np.einsum("pqrs,rs->pq", eri, D)
            K = np.einsum("prqs,rs->pq", eri, D)
            e, C = np.linalg.eigh(h1 + J - 0.5 * K)
            D_new = _aufbau_density(e, C, na, scale) + _aufbau_density(e, C, nb, scale)
            if np.abs(D_new - D).max() < tol:
                return e, canonical_orbitals(e, C, scale)
            D = (1 - mix) * D_new + mix * D
    raise RuntimeError(
        f"the mean field did not converge in {max_cycle} cycles at damping {damping}, 0.8 or 0.95"
    )


def canonical_orbitals(e: np.ndarray, C: np.ndarray, scale: float = 1.0) -> np.ndarray:
    """The orbitals C (columns, levels e ascending) made independent of the eigensolver: an
    eigensolver may return any orthonormal basis of a shell of degenerate levels, and either
    sign of every orbital, and which one it returns differs between LAPACK builds. Within a
    shell (levels within 1e-8 * scale) the orbitals become the Gram-Schmidt sequence of the
    sites projected onto the shell, site 0 first (a site whose projection is already spanned
    is skipped): on a ring, the standing waves with a crest or a node on site 0. Every orbital
    then has its largest component positive (the first of those within 1e-6 of the largest).
    The span of every shell, and so every exact energy, is unchanged; the integrals in this
    basis, and the determinants' weights, no longer depend on the machine.

    Example:
        >>> h1, _ = hubbard_integrals(4, U=0.0, pbc=True)
        >>> e, C = np.linalg.eigh(h1)
        >>> (np.round(canonical_orbitals(e, C)[:, 1:3].T, 12) + 0.0).tolist()  # the shell at 0
        [[0.707106781187, 0.0, -0.707106781187, 0.0], [0.0, 0.707106781187, 0.0, -0.707106781187]]
    """
    C = np.array(C, dtype=np.float64, copy=True)
    n, tol = len(e), _LEVEL_TOL * scale
    start = 0
    while start < n:
        stop = start + 1
        while stop < n and e[stop] - e[stop - 1] <= tol:
            stop += 1
        if stop - start > 1:
            V = C[:, start:stop]
            P = V @ V.T  # the projector onto the shell
            basis: list[np.ndarray] = []
            for site in range(C.shape[0]):
                v = P[:, site].copy()
                for b in basis:
                    v -= (b @ v) * b
                norm = np.linalg.norm(v)
                if norm > 1e-6:  # the site's projection adds a direction
                    basis.append(v / norm)
                    if len(basis) == stop - start:
                        break
            C[:, start:stop] = np.stack(basis, axis=1)
        start = stop
    for k in range(C.shape[1]):
        mag = np.abs(C[:, k])
        j = int(np.flatnonzero(mag >= mag.max() - 1e-6)[0])  # equal to the mean field's rounding
        if C[j, k] < 0:
            C[:, k] = -C[:, k]
    return C


def _counts(nelec) -> tuple[int, int]:
    if np.ndim(nelec) == 0:
        return (int(nelec) + 1) // 2, int(nelec) // 2
    na, nb = map(int, nelec)
    return na, nb


_LEVEL_TOL = 1e-8
"""Levels within this (times the largest integral) of each other form one degenerate shell."""


def _scale(h1: np.ndarray, eri: np.ndarray) -> float:
    return max(1.0, float(np.abs(h1).max()), float(np.abs(eri).max()))


def _shell(e: np.ndarray, n: int, scale: float) -> tuple[int, np.ndarray]:
    """(orbitals fully below the Fermi level, the orbitals of the level shell at it) for n
    electrons in the ascending levels e."""
    if n == 0:
        return 0, np.zeros(0, dtype=np.int64)
    tol = _LEVEL_TOL * scale
    below = int((e < e[n - 1] - tol).sum())
    return below, np.flatnonzero(np.abs(e - e[n - 1]) <= tol)


def shell_fillings(e: np.ndarray, nelec, scale: float = 1.0, limit: int = 4096):
    """The occupations (alpha orbitals, beta orbitals) that fill the levels ``e`` (ascending)
    up to the Fermi level, every way a degenerate shell at the Fermi level can be filled: one
    (the aufbau filling, listed first) when the shell is full, up to `limit` of them (the first
    in the order of `itertools.combinations`) when it is partly filled.

    Example:
        >>> shell_fillings(np.array([-2.0, 0.0, 0.0, 2.0]), (1, 1))[:2]   # one level: no shell
        [([0], [0])]
        >>> len(shell_fillings(np.array([-2.0, 0.0, 0.0, 2.0]), (2, 2)))  # 2 x 2 fillings
        4
    """
    from itertools import combinations, islice, product

    per_spin = []
    for n in _counts(nelec):
        below, shell = _shell(np.asarray(e, dtype=np.float64), n, scale)
        core = list(range(below))
        per_spin.append([core + list(c) for c in combinations(shell.tolist(), n - below)])
    return [(a, b) for a, b in islice(product(*per_spin), limit)]


def _aufbau_density(e: np.ndarray, C: np.ndarray, n: int, scale: float) -> np.ndarray:
    """Density of n electrons in the levels e (ascending) of orbitals C, a degenerate shell at
    the Fermi level shared equally."""
    if n == 0:
        return np.zeros((len(e), len(e)))
    below, shell = _shell(e, n, scale)
    occ = np.zeros(len(e))
    occ[:below] = 1.0
    occ[shell] = (n - below) / len(shell)
    return (C * occ) @ C.T
