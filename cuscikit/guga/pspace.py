"""The Hamiltonian in a few hundred CSFs (a "P space"), for the Davidson start and preconditioner.

PySCF's FCI solvers diagonalise H exactly in the few hundred determinants of lowest diagonal
energy: the lowest eigenvectors there are the start vectors, and the preconditioner inverts
(H_PP - e) on those determinants and (H_mm - e) elsewhere, with Olsen's correction
(J. Olsen, P. Jørgensen, J. Simons, "Passing the one-billion limit in full configuration-
interaction (FCI) calculations", Chem. Phys. Lett. 169, 463 (1990), doi:10.1016/0009-
2614(90)85633-N). Here the same in CSFs.

H_PP comes from the couplings of each CSF j of the space as a ket (the loop search of
cuscikit/guga_loops.hpp on the host, `_core.guga_rows.couplings`): with
A[m, P, j] = <m|E^sym_P|j> (E_rr = n_r on the diagonal),

    H_ij = sum_m sum_PQ A[m, P, i] V[P, Q] A[m, Q, j] + sum_P h[P] A[i, P, j],

the same operator as the sigma (`Engine.contract`): sigma(e_j)_i = H_ij. The sum over m runs
over the CSFs that couple to the space, grouped by how many CSFs of the space they couple to.

Example:
    >>> import numpy as np
    >>> from cuscikit.guga.drt import DRT
    >>> from cuscikit.guga.sigma import Engine
    >>> drt = DRT(4, 4, 0)
    >>> rng = np.random.default_rng(0)
    >>> V = rng.standard_normal((10, 10)); V = V + V.T; h = rng.standard_normal(10)
    >>> csfs = np.array([0, 3, 7])
    >>> H = pspace_hamiltonian(drt, csfs, V, h)
    >>> ref = Engine(drt).contract(np.eye(drt.n_csf)[:, 3], V, h)[csfs]
    >>> bool(np.allclose(H[:, 1], ref))
    True
"""

from __future__ import annotations

import numpy as np

from cuscikit.guga.drt import DRT
from cuscikit.guga.sigma import pair_index

__all__ = ["pspace_hamiltonian", "PSpacePreconditioner"]


def _rows_drt(drt: DRT):
    from cuscikit import _core

    return _core.guga_rows.Drt(
        drt.norb,
        drt.head,
        np.ascontiguousarray(drt.up, dtype=np.int32).reshape(-1),
        np.ascontiguousarray(drt.down, dtype=np.int32).reshape(-1),
        np.ascontiguousarray(drt.b, dtype=np.int32),
        np.ascontiguousarray(drt.y, dtype=np.int64).reshape(-1),
        int(drt.n_csf),
    )


def pspace_hamiltonian(drt: DRT, csfs, V, h=None, diag=None, chunk_rows: int | None = None):
    """H[i, j] = <csfs[i]|H|csfs[j]> for H = sum_PQ V[P,Q] E^sym_P E^sym_Q + sum_P h[P] E^sym_P.

    Args:
        drt: the table.
        csfs: distinct CSF indices (the space).
        V: (npair, npair) symmetric, or a factored pair (A, B) meaning V = A B.
        h: (npair,) or None.
        diag: the diagonal <m|H|m> of the space when known (the solver's exact diagonal); then
            the CSFs m that couple to one CSF of the space only (they reach the diagonal only,
            most of them) are skipped.
        chunk_rows: (CSF, ket) rows of A held at once (memory: chunk_rows * npair doubles).
            None: 20 per CSF of the space, at most 65536 and at most half a vector's bytes
            (ncsf / (2 npair)), but at least 2048 (N2 CAS(14,14) triplet, 1500 CSFs: 4.5 CPU
            s at 32768 rows, 21 s at 2048, where the time went to the Python loop over small
            chunks; 400 CSFs: 0.4-0.7 s either way).

    Returns:
        (len(csfs), len(csfs)) float64.

    Raises:
        ValueError: repeated or out-of-range CSFs, or operators of the wrong shape.
    """
    from cuscikit.guga.sigma import _OneThreadBlas

    # small products: numpy's threaded BLAS costs more than it gives (N2 CAS(10,10) triplet, 400
    # CSFs: 0.12 CPU s on one thread, 0.25 on two)
    with _OneThreadBlas():
        return _pspace_hamiltonian(drt, csfs, V, h, diag, chunk_rows)


def _pspace_hamiltonian(drt, csfs, V, h, diag, chunk_rows):
    from cuscikit import _core

    csfs = np.asarray(csfs, dtype=np.int64).reshape(-1)
    p, n = len(csfs), drt.norb
    npair = n * (n + 1) // 2
    if chunk_rows is None:
        chunk_rows = max(2048, min(65536, 20 * p, drt.n_csf // (2 * npair)))
    # the space in sorted order: its distinctness here, the one-body term's lookup below (one
    # argsort, no sort of its own: np.sort's kernels are more code to load in a first solve)
    order = np.argsort(csfs)
    srt = csfs[order]
    if p == 0 or np.any(srt[1:] == srt[:-1]):
        raise ValueError("csfs must be a non-empty list of distinct CSF indices")
    if diag is not None:
        diag = np.asarray(diag, dtype=np.float64).reshape(-1)
        if diag.shape != (p,):
            raise ValueError("diag must hold one entry per CSF of the space")
    if isinstance(V, tuple):
        A, B = (np.asarray(x, dtype=np.float64) for x in V)
        if A.shape[0] != npair or B.shape != (A.shape[1], npair):
            raise ValueError(f"factors must be (npair, naux) and (naux, npair), npair={npair}")

        def times_v(R):
            return (R @ A) @ B
    else:
        V = np.asarray(V, dtype=np.float64)
        if V.shape != (npair, npair):
            raise ValueError(f"V must be (npair, npair) = ({npair}, {npair})")

        def times_v(R):
            return R @ V

    src, bra, code, w = _core.guga_rows.couplings(_rows_drt(drt), csfs)
    P = pair_index(n)[code]
    H = np.zeros(p * p)
    if h is not None:  # one-body: the couplings that land in the space
        h = np.asarray(h, dtype=np.float64).reshape(-1)
        if h.shape != (npair,):
            raise ValueError(f"h must hold npair = {npair} entries")
        loc = np.minimum(np.searchsorted(srt, bra), p - 1)
        inside = srt[loc] == bra
        flat = order[loc[inside]] * p + src[inside]
        np.add.at(H, flat, h[P[inside]] * w[inside])
        del loc, inside, flat
    del order, srt
    # rows (m, j) of A, sorted by m: each m's rows are contiguous
    # (the per-coupling arrays are dropped as soon as they are used: together they were the
    # largest part of the build in a small space)
    # (np.unique(key, return_inverse=True) written out: its sort-based path, the same result,
    # from kernels this build has loaded already; no flattened copy of the keys)
    key = bra * p + src
    del src, bra, code
    perm = np.argsort(key)
    key = key[perm]
    first = np.empty(len(key), dtype=bool)
    first[:1] = True
    np.not_equal(key[1:], key[:-1], out=first[1:])
    row_of = np.empty(len(key), dtype=np.intp)
    row_of[perm] = np.cumsum(first) - 1
    ukey = key[first]
    del perm, key, first
    row_m, row_j = np.divmod(ukey, p)
    del ukey
    starts = np.flatnonzero(np.r_[True, row_m[1:] != row_m[:-1]])  # first row of each m
    del row_m
    sizes = np.diff(np.r_[starts, len(row_j)])
    if diag is not None:  # only the m that couple to two CSFs of the space or more
        keep = np.repeat(sizes >= 2, sizes)
        new_row = np.cumsum(keep) - 1
        mask = keep[row_of]
        row_of, P, w = new_row[row_of[mask]], P[mask], w[mask]
        row_j = row_j[keep]
        starts, sizes = (new_row[starts[sizes >= 2]], sizes[sizes >= 2])
        del keep, new_row, mask
    nrows = len(row_j)
    e_order = np.argsort(row_of, kind="stable")
    row_of, P, w = row_of[e_order], P[e_order], w[e_order]
    del e_order
    e_start = np.searchsorted(row_of, np.arange(nrows + 1))
    g0 = 0
    while g0 < len(starts):  # chunks of whole m groups, about chunk_rows rows each
        g1 = max(g0 + 1, int(np.searchsorted(starts, starts[g0] + chunk_rows)))
        r0 = starts[g0]
        r1 = starts[g1] if g1 < len(starts) else nrows
        e0, e1 = e_start[r0], e_start[r1]
        # the chunk's m groups reordered by size (stable): the rows of the groups of one size
        # are then one contiguous block of R, a (groups, g, npair) view, not a gathered copy
        gsz = sizes[g0:g1]
        order = np.argsort(gsz, kind="stable")
        ssz = gsz[order]
        new_start = np.empty_like(gsz)
        new_start[order] = np.cumsum(ssz) - ssz
        shift = np.repeat(new_start - (starts[g0:g1] - r0), gsz)
        new_row = shift + np.arange(r1 - r0)
        flat = new_row[row_of[e0:e1] - r0] * npair + P[e0:e1]
        R = np.bincount(flat, w[e0:e1], minlength=(r1 - r0) * npair).reshape(r1 - r0, npair)
        del flat
        RV = times_v(R)
        J_all = np.empty(r1 - r0, dtype=row_j.dtype)
        J_all[new_row] = row_j[r0:r1]
        cut = np.r_[0, np.flatnonzero(ssz[1:] != ssz[:-1]) + 1, len(ssz)]
        row_at = np.r_[0, np.cumsum(ssz)]
        for a, b in zip(cut[:-1], cut[1:], strict=True):
            g, ng = int(ssz[a]), int(b - a)
            ra, rb = row_at[a], row_at[b]
            Rg = R[ra:rb].reshape(ng, g, npair)
            M = np.matmul(RV[ra:rb].reshape(ng, g, npair), Rg.transpose(0, 2, 1))  # (ng, g, g)
            J = J_all[ra:rb].reshape(ng, g)
            # into H in place: a bincount of p^2 entries per group size would leave as many
            # temporaries (the largest allocation of a small space's solve)
            np.add.at(H, (J[:, :, None] * p + J[:, None, :]).ravel(), M.ravel())
        del R, RV, Rg, M  # before the next chunk's: one chunk's R and RV live at a time
        g0 = g1
    H = H.reshape(p, p)
    if diag is not None:
        H[np.diag_indices(p)] = diag
    return H


def _axpy_into(y: np.ndarray, x: np.ndarray, a: float) -> None:
    """y += a x in place in one pass (BLAS daxpy where SciPy is present; y, x contiguous)."""
    try:
        from scipy.linalg.blas import daxpy
    except ImportError:
        y += a * x
        return
    out = daxpy(x, y, a=a)
    if not np.shares_memory(out, y):  # SciPy had to copy: write back
        y[...] = out


class PSpacePreconditioner:
    """The start vectors and the preconditioner of a Davidson solve from H in a P space.

    Args:
        hdiag: the diagonal of H (numpy, or a torch tensor whose device the vectors live on).
        csfs: the CSFs of the space (indices into hdiag).
        H: their Hamiltonian (`pspace_hamiltonian`; symmetric, its lower triangle is read).
        overwrite_h: H may be overwritten (no copy of it is made).

    ``guess(k)`` gives the k lowest eigenvectors of H embedded in the full space; calling the
    object as ``precond(R, theta, X)`` gives the corrections of `cuscikit.linalg.davidson`
    (residuals R, Ritz values theta, Ritz vectors X, one column each): Olsen's correction
    t = M^-1 (r - e x) with e = (x M^-1 r) / (x M^-1 x), M = (H_PP - theta + shift) on the
    space and (H_mm - theta + shift) elsewhere (PySCF's level shift, 1e-3). On the host,
    ``overwrite_r = True`` lets the call write the corrections over R's columns (when they are
    contiguous) and return them there, and ``work``, a vector of len(hdiag) doubles, is used as
    its work vector instead of one of its own (the solver sets both: the Davidson does not read
    its residuals after the call, and lends the sigma's kept buffer).

    Example:
        >>> import numpy as np
        >>> hdiag = np.array([0.0, 1.0, 2.0, 3.0])
        >>> pre = PSpacePreconditioner(hdiag, [0, 1], np.array([[0.0, 0.5], [0.5, 1.0]]))
        >>> pre.guess(1)[:, 0].round(4)  # the ground state of H_PP, zero outside
        array([-0.9239,  0.3827,  0.    ,  0.    ])
        >>> t = pre(np.ones((4, 1)), np.array([-0.2]), pre.guess(1))
        >>> t[:, 0].round(4)
        array([0.3551, 0.8573, 0.4543, 0.3124])
    """

    shift = 1e-3
    # the host correction may be written over the residuals passed in (the Davidson does not
    # read them after the call): no block of the vectors' size beside them
    overwrite_r = False
    # a vector of len(hdiag) doubles the host correction may use as its work vector (it keeps
    # nothing in it between calls), else it allocates one: the solver lends the sigma's kept
    # per-thread buffer, which the sigma zeroes before each use
    work = None

    def __init__(self, hdiag, csfs, H, overwrite_h: bool = False):
        self.hdiag = hdiag
        self.csfs = np.asarray(csfs, dtype=np.int64)
        self.torch = None
        from cuscikit.backends.keys import is_tensor

        if is_tensor(hdiag):
            import torch

            self.torch = torch
            self._idx = torch.as_tensor(self.csfs, device=hdiag.device)
        else:
            self._idx = self.csfs
        from scipy.linalg import eigh

        from cuscikit.guga.sigma import _OneThreadBlas

        # H's lower triangle, as columns of H^T (no copy when H may be overwritten); only the
        # eigenpairs are kept, and MRRR (evr) needs no work space of H's size beside them
        a = np.asarray(H, dtype=np.float64).T
        with _OneThreadBlas():  # threaded LAPACK on a busy machine: 20-70x slower measured
            # (H - t)^-1 = U (w - t)^-1 U^T for any t
            self._w, self._U = eigh(
                a if overwrite_h else a.copy(order="F"),
                lower=False,
                overwrite_a=True,
                check_finite=False,
                driver="evr",
            )

    def _dev(self, a):
        if self.torch is None:
            return a
        return self.torch.as_tensor(np.ascontiguousarray(a), device=self.hdiag.device)

    def _host(self, a):
        return a.cpu().numpy() if self.torch is not None else np.asarray(a)

    def guess(self, k: int):
        """(n, k) the k lowest eigenvectors of H_PP, zero outside the space."""
        v = self._U
        n = len(self.hdiag)
        if self.torch is None:
            G = np.zeros((n, k))
        else:
            G = self.torch.zeros((n, k), dtype=self.torch.float64, device=self.hdiag.device)
        G[self._idx] = self._dev(v[:, :k])
        return G

    def _pspace_shifts(self, thetas) -> np.ndarray:
        """(len(w), k) the eigenvalues of H_PP minus each theta, kept away from 0 by 1e-8."""
        dw = self._w[:, None] - thetas[None, :]
        return np.where(np.abs(dw) < 1e-8, 1e-8, dw)

    def _apply(self, Y, thetas):
        """M^-1 Y column by column, for vectors on a torch device (the host's correction is
        `_olsen_host`), in place: one vector per column beside Y (3.6 GB each at CAS(18,18))."""
        torch = self.torch
        d = self.hdiag[:, None] - self._dev(np.asarray(thetas))[None, :]
        tiny = d.new_full((), 1e-8)
        Z = torch.div(Y, torch.where(torch.abs(d) < 1e-8, tiny, d, out=d), out=d)
        ys = self._U.T @ self._host(Y[self._idx])
        Z[self._idx] = self._dev(self._U @ (ys / self._pspace_shifts(thetas)))
        return Z

    def _olsen_host(self, R, thetas, X) -> np.ndarray:
        """The correction on the host, column by column in one work vector (no temporaries of
        the vectors' size): M^-1 r and M^-1 x, then t = M^-1 r - e M^-1 x (= M^-1 (r - e x)).
        With ``overwrite_r`` the corrections are written over R's columns (returned), else into
        a new block; the diagonal H_mm - theta is formed in the work vector and divided out of
        r in place before M^-1 x takes the work vector (the same operations in the same order
        either way: the results are bitwise equal)."""
        n, k = R.shape
        # rows; returned as columns (a view)
        out = R.T if self.overwrite_r and R.strides[0] == 8 else np.empty((k, n))
        if self.work is not None and self.work.shape == (n,) and self.work.dtype == np.float64:
            mx = self.work  # the caller's work space
        else:
            if getattr(self, "_work", None) is None or self._work.shape[0] != n:
                self._work = np.empty(n)
            mx = self._work
        idx, U = self._idx, self._U
        dw = self._pspace_shifts(thetas)
        if getattr(self, "_hmin", None) is None:
            self._hmin = float(np.min(self.hdiag))
        for j in range(k):
            r, x, t = R[:, j], X[:, j], out[j]
            ur = U.T @ r[idx]  # before t (maybe r itself) is written
            d = np.subtract(self.hdiag, thetas[j], out=mx)
            if thetas[j] > self._hmin - 1e-7:  # else no |d| < 1e-8 can occur (the ground state)
                d[np.abs(d) < 1e-8] = 1e-8
            np.divide(r, d, out=t)
            np.divide(x, d, out=mx)  # d is gone from here on
            t[idx] = U @ (ur / dw[:, j])
            mx[idx] = U @ ((U.T @ x[idx]) / dw[:, j])
            _axpy_into(t, mx, -(x @ t) / (x @ mx))
        return out.T

    def __call__(self, R, thetas, X):
        thetas = np.asarray(thetas, dtype=np.float64).reshape(-1) - self.shift
        if self.torch is None:  # on one BLAS thread: 0.4 ms instead of 36 ms (CPU) at 30k CSFs
            from cuscikit.guga.sigma import _OneThreadBlas

            with _OneThreadBlas():
                return self._olsen_host(np.asarray(R), thetas, np.asarray(X))
        MR, MX = self._apply(R, thetas), self._apply(X, thetas)
        # column dots through a GEMM: no reduction kernels to load in the first solve
        e = self.torch.diagonal(X.T @ MR) / self.torch.diagonal(X.T @ MX)
        del MR, MX  # freed before the last application
        return self._apply(R - X * e[None, :], thetas)
