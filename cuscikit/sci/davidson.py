"""Block Davidson eigensolver for the lowest roots of a real symmetric operator."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


@dataclass
class DavidsonResult:
    energies: np.ndarray
    vectors: np.ndarray  # (n, nroots)
    converged: bool
    iterations: int
    residual_norms: np.ndarray


def davidson(
    matvec: Callable[[np.ndarray], np.ndarray],
    diag: np.ndarray,
    nroots: int = 1,
    *,
    tol: float = 1e-11,
    residual_tol: float = 1e-6,
    max_iter: int = 300,
    max_space: int | None = None,
    guess: np.ndarray | None = None,
) -> DavidsonResult:
    """Lowest `nroots` eigenpairs of a symmetric operator with a diagonal preconditioner.

    Args:
        matvec: maps a block (n, k) to H @ block.
        diag: the diagonal of H (for the preconditioner and the initial guesses).
        nroots: number of lowest roots wanted.
        tol: convergence on the change of every wanted eigenvalue between iterations.
        residual_tol: convergence on the residual norm of every wanted root.
        max_iter: iteration limit; the result says whether it converged.
        max_space: subspace size before a restart (default max(8*nroots, 40)).
        guess: optional (n, k) starting vectors; default unit vectors on the lowest diagonals
            plus a little seeded noise, so that every symmetry block is reached.

    Example:
        >>> import numpy as np
        >>> a = np.diag(np.arange(1.0, 101.0)); a[0, 1] = a[1, 0] = 0.5
        >>> r = davidson(lambda v: a @ v, np.diag(a).copy(), nroots=2)
        >>> np.allclose(r.energies, np.linalg.eigvalsh(a)[:2])
        True
    """
    n = len(diag)
    nroots = min(nroots, n)
    max_space = max_space or max(8 * nroots, 40)
    max_space = min(max_space, n)
    if guess is None:
        k0 = min(n, max(2 * nroots, nroots + 2))
        order = np.argsort(diag, kind="stable")[:k0]
        V = np.zeros((n, k0))
        V[order, np.arange(k0)] = 1.0
        # A little seeded noise in every guess: with symmetry-adapted orbitals H is block
        # diagonal, and unit vectors alone would never reach a ground state whose symmetry
        # block holds none of the lowest diagonals (C2/STO-3G is such a case).
        V += 1e-3 * np.random.default_rng(12345).standard_normal((n, k0))
        V, _ = np.linalg.qr(V)
    else:
        V, _ = np.linalg.qr(np.asarray(guess, dtype=float).reshape(n, -1))
    AV = matvec(V)
    e_old = np.full(nroots, np.inf)
    res_norms = np.full(nroots, np.inf)
    for it in range(1, max_iter + 1):
        Hs = V.T @ AV
        Hs = 0.5 * (Hs + Hs.T)
        theta, s = np.linalg.eigh(Hs)
        theta_w, s_w = theta[:nroots], s[:, :nroots]
        X = V @ s_w
        R = AV @ s_w - X * theta_w
        res_norms = np.linalg.norm(R, axis=0)
        converged = np.all(np.abs(theta_w - e_old) < tol) and np.all(res_norms < residual_tol)
        if converged or V.shape[1] >= n:
            return DavidsonResult(theta_w, X, True, it, res_norms)
        e_old = theta_w
        # Preconditioned corrections for the unconverged roots.
        todo = np.flatnonzero(res_norms >= residual_tol)
        if todo.size == 0:
            todo = np.arange(nroots)
        denom = diag[:, None] - theta_w[todo][None, :]
        denom = np.where(np.abs(denom) < 1e-8, 1e-8, denom)
        T = R[:, todo] / denom
        if V.shape[1] + T.shape[1] > max_space:  # restart from the current Ritz vectors
            V, _ = np.linalg.qr(V @ s[:, : max(nroots, min(2 * nroots, V.shape[1]))])
            AV = matvec(V)
        for _ in range(2):  # twice is enough (Kahan)
            T -= V @ (V.T @ T)
        Q, rr = np.linalg.qr(T)
        keep = np.abs(np.diag(rr)) > 1e-10
        Q = Q[:, keep]
        if Q.shape[1] == 0:
            return DavidsonResult(theta_w, X, bool(np.all(res_norms < 1e-4)), it, res_norms)
        Q -= V @ (V.T @ Q)
        Q, _ = np.linalg.qr(Q)
        V = np.hstack([V, Q])
        AV = np.hstack([AV, matvec(Q)])
    return DavidsonResult(theta_w, X, False, max_iter, res_norms)
