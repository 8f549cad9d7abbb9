"""Factored two-electron integrals for the GUGA sigma: (pq|rs) = sum_P L[pq, P] L[rs, P].

With a factor L of naux columns the two-body step of the sigma, g = 1/2 T V over packed pairs,
becomes g = (T L) (1/2 L^T): two GEMMs of naux columns instead of one of npair = n(n+1)/2, and
the integrals are never held as npair x npair. L comes from density fitting (a 3-index tensor
(naux, norb, norb) or (naux, npair) transformed to the active orbitals) or from a pivoted
Cholesky decomposition of the integrals themselves (`cholesky_pairs`), which is exact when
carried to a zero threshold (Beebe and Linderberg, "Simplifications in the generation and
transformation of two-electron integrals in molecular calculations", Int. J. Quantum Chem. 12,
683 (1977), doi:10.1002/qua.560120408).

Example:
    >>> import numpy as np
    >>> x = np.random.default_rng(0).standard_normal((6, 3))
    >>> L = cholesky_pairs(x @ x.T, tol=0.0)
    >>> L.shape[1], bool(np.allclose(L @ L.T, x @ x.T))
    (3, True)
"""

from __future__ import annotations

import numpy as np

__all__ = ["cholesky_pairs", "pair_factor"]


def cholesky_pairs(g: np.ndarray, tol: float = 1e-10) -> np.ndarray:
    """Pivoted Cholesky factor L (npair, naux) of a symmetric positive semidefinite matrix.

    Columns are added at the largest remaining diagonal until it is at most `tol` (the largest
    error of any diagonal element (pq|pq), which bounds every |error| of (pq|rs)); `tol` = 0
    carries it to the numerical rank.

    Example:
        >>> cholesky_pairs(np.diag([4.0, 1.0, 0.0])).round(12).tolist()
        [[2.0, 0.0], [0.0, 1.0], [0.0, 0.0]]
    """
    g = np.asarray(g, dtype=np.float64)
    if g.ndim != 2 or g.shape[0] != g.shape[1]:
        raise ValueError(f"need a square matrix over pairs, got shape {g.shape}")
    if not np.allclose(g, g.T, atol=1e-10):
        raise ValueError("the pair matrix is not symmetric")
    tol = float(tol)
    if not tol >= 0:
        raise ValueError(f"tol must be >= 0, got {tol}")
    n = len(g)
    d = np.diag(g).copy()
    scale = max(float(np.abs(d).max(initial=0.0)), 1e-300)
    if d.min(initial=0.0) < -1e-10 * scale:
        raise ValueError("the pair matrix has a negative diagonal: not positive semidefinite")
    L = np.zeros((n, n))
    k = 0
    while k < n:
        p = int(np.argmax(d))
        # stop at the threshold, or at round-off level (tol = 0: the numerical rank)
        if d[p] <= max(tol, 1e-14 * scale):
            break
        col = g[:, p] - L[:, :k] @ L[p, :k]
        L[:, k] = col / np.sqrt(d[p])
        d -= L[:, k] ** 2
        d[p] = 0.0
        k += 1
    return np.ascontiguousarray(L[:, :k])


def pair_factor(cderi, norb: int) -> np.ndarray:
    """L (npair, naux) in packed pair order from a 3-index tensor (naux, norb, norb) or
    (naux, npair) (PySCF's ``cderi`` layout, pairs p >= q, pq = p(p+1)/2 + q).

    Example:
        >>> L = np.arange(2 * 3 * 3, dtype=float).reshape(2, 3, 3)
        >>> L = L + L.transpose(0, 2, 1)
        >>> pair_factor(L, 3).shape
        (6, 2)
    """
    a = np.asarray(cderi, dtype=np.float64)
    npair = norb * (norb + 1) // 2
    if a.ndim == 3 and a.shape[1:] == (norb, norb):
        if not np.allclose(a, a.transpose(0, 2, 1), atol=1e-10):
            raise ValueError("cderi[P] must be symmetric in its two orbital indices")
        i, j = np.tril_indices(norb)
        a = a[:, i, j]
    elif not (a.ndim == 2 and a.shape[1] == npair):
        raise ValueError(
            f"cderi must be (naux, {norb}, {norb}) or (naux, {npair}), got shape {a.shape}"
        )
    if not np.all(np.isfinite(a)):
        raise ValueError("cderi holds a NaN or an infinity")
    return np.ascontiguousarray(a.T)
