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
    callback: Callable[[int, np.ndarray, np.ndarray], None] | None = None,
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
        callback: called as callback(iteration, energies, residual_norms) every iteration.

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
        G = np.zeros((n, k0))
        G[order, np.arange(k0)] = 1.0
        # A little seeded noise in every guess: with symmetry-adapted orbitals H is block
        # diagonal, and unit vectors alone would never reach a ground state whose symmetry
        # block holds none of the lowest diagonals (C2/STO-3G is such a case).
        G += 1e-2 / np.sqrt(n) * np.random.default_rng(12345).standard_normal((n, k0))
    else:
        G = np.asarray(guess, dtype=float).reshape(n, -1)
    G, _ = np.linalg.qr(G)
    # Subspace and its image live in preallocated blocks: no copies as the space grows.
    V = np.empty((n, max_space + G.shape[1]))
    AV = np.empty_like(V)
    m = G.shape[1]
    V[:, :m] = G
    AV[:, :m] = matvec(G)
    e_old = np.full(nroots, np.inf)
    res_norms = np.full(nroots, np.inf)
    theta_w = e_old
    X = V[:, :nroots]
    for it in range(1, max_iter + 1):
        Hs = V[:, :m].T @ AV[:, :m]
        Hs = 0.5 * (Hs + Hs.T)
        theta, s = np.linalg.eigh(Hs)
        theta_w, s_w = theta[:nroots], s[:, :nroots]
        X = V[:, :m] @ s_w
        R = AV[:, :m] @ s_w - X * theta_w
        res_norms = np.linalg.norm(R, axis=0)
        if callback is not None:
            callback(it, theta_w, res_norms)
        converged = np.all(np.abs(theta_w - e_old) < tol) and np.all(res_norms < residual_tol)
        if converged or m >= n:
            return DavidsonResult(theta_w, X, True, it, res_norms)
        e_old = theta_w
        # Preconditioned corrections for the unconverged roots.
        todo = np.flatnonzero(res_norms >= residual_tol)
        if todo.size == 0:
            todo = np.arange(nroots)
        denom = diag[:, None] - theta_w[todo][None, :]
        denom = np.where(np.abs(denom) < 1e-8, 1e-8, denom)
        T = R[:, todo] / denom
        if m + T.shape[1] > max_space:
            # Restart from the lowest Ritz vectors. V and s are orthonormal, so V s is too, and
            # its image follows by linearity: no extra matvec.
            keep = max(nroots, min(2 * nroots, m))
            Q, AQ = V[:, :m] @ s[:, :keep], AV[:, :m] @ s[:, :keep]
            m = keep
            V[:, :m], AV[:, :m] = Q, AQ
        for _ in range(2):  # orthogonalise twice (Kahan)
            T -= V[:, :m] @ (V[:, :m].T @ T)
        Q, rr = np.linalg.qr(T)
        Q = Q[:, np.abs(np.diag(rr)) > 1e-10]
        if Q.shape[1] == 0:
            return DavidsonResult(theta_w, X, bool(np.all(res_norms < 1e-4)), it, res_norms)
        k = Q.shape[1]
        V[:, m : m + k] = Q
        AV[:, m : m + k] = matvec(Q)
        m += k
    return DavidsonResult(theta_w, X, False, max_iter, res_norms)
