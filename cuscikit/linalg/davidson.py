"""Block Davidson eigensolver for the lowest roots of a real symmetric operator.

Written once for numpy arrays and torch tensors: the subspace and its image stay where `diag`
lives (host memory, or a GPU), and only the small projected problem (size of the subspace)
travels to the host for its eigendecomposition.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


class _NumpyOps:
    """The array operations of the algorithm on numpy arrays."""

    def empty(self, n: int, m: int):
        return np.empty((n, m))

    def asarray(self, a, n: int):
        return np.asarray(a, dtype=float).reshape(n, -1)

    def zeros_guess(self, n: int, k: int):
        return np.zeros((n, k))

    def noise(self, n: int, k: int):
        return np.random.default_rng(12345).standard_normal((n, k))

    def argsort(self, a, k: int):
        return np.argsort(a, kind="stable")[:k]

    def qr(self, a):
        if a.shape[1] == 1:  # one column: a norm, no factorisation (see _TorchOps.qr)
            r = np.linalg.norm(a)
            return a / r, np.full((1, 1), r)
        return np.linalg.qr(a)

    def colnorms(self, a) -> np.ndarray:
        return np.linalg.norm(a, axis=0)

    def host(self, a) -> np.ndarray:
        return np.asarray(a)

    def dev(self, a: np.ndarray):
        return a

    def clamp_away(self, a, eps: float):
        return np.where(np.abs(a) < eps, eps, a)


class _TorchOps(_NumpyOps):
    """The same operations on torch tensors (any device, float64)."""

    def __init__(self, like):
        import torch

        self.torch = torch
        self.device = like.device

    def empty(self, n, m):
        return self.torch.empty((n, m), dtype=self.torch.float64, device=self.device)

    def asarray(self, a, n):
        return self.torch.as_tensor(a, dtype=self.torch.float64, device=self.device).reshape(n, -1)

    def zeros_guess(self, n, k):
        return self.torch.zeros((n, k), dtype=self.torch.float64, device=self.device)

    def noise(self, n, k):
        gen = self.torch.Generator(device=self.device).manual_seed(12345)
        return self.torch.randn((n, k), generator=gen, dtype=self.torch.float64, device=self.device)

    def argsort(self, a, k):
        return self.torch.argsort(a, stable=True)[:k]

    def qr(self, a):
        # One column (every step of a one-root solve): a norm instead of the dense solver's
        # QR, whose first call in a process initialises cuSOLVER.
        if a.shape[1] == 1:
            r = self.colnorms(a).reshape(1, 1)
            return a / float(r[0, 0]), r
        return self.torch.linalg.qr(a)

    def colnorms(self, a):
        # Through a GEMM (cuBLAS, which the subspace products load anyway) and the host: the
        # first vector_norm of a process loads reduction kernels of its own (about 0.05 s).
        return np.sqrt(np.diag((a.T @ a).cpu().numpy()))

    def host(self, a):
        return a.cpu().numpy() if self.torch.is_tensor(a) else np.asarray(a)

    def dev(self, a):
        return self.torch.as_tensor(np.ascontiguousarray(a), device=self.device)

    def clamp_away(self, a, eps):
        return self.torch.where(self.torch.abs(a) < eps, eps, a)


def _ops_for(diag):
    from cuscikit.backends.keys import is_tensor

    return _TorchOps(diag) if is_tensor(diag) else _NumpyOps()


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
    precond: Callable | None = None,
) -> DavidsonResult:
    """Lowest `nroots` eigenpairs of a symmetric operator with a diagonal preconditioner.

    Args:
        matvec: maps a block (n, k) to H @ block.
        diag: the diagonal of H (for the preconditioner and the initial guesses): a numpy
            array, or a float64 torch tensor to keep every vector on its device (then `matvec`
            maps tensors to tensors, `guess` may be either, and `vectors` is a tensor).
        nroots: number of lowest roots wanted.
        tol: convergence on the change of every wanted eigenvalue between iterations.
        residual_tol: convergence on the residual norm of every wanted root.
        max_iter: iteration limit; the result says whether it converged.
        max_space: subspace size before a restart (default max(8*nroots, 40)).
        guess: optional (n, k) starting vectors; default unit vectors on the lowest diagonals
            plus a little seeded noise, so that every symmetry block is reached.
        callback: called as callback(iteration, energies, residual_norms) every iteration.
        precond: corrections from residuals, called as precond(R, theta, X) with the residuals
            R, Ritz values theta and Ritz vectors X of the unconverged roots (one column
            each); default R / (diag - theta).

    Example:
        >>> import numpy as np
        >>> a = np.diag(np.arange(1.0, 101.0)); a[0, 1] = a[1, 0] = 0.5
        >>> r = davidson(lambda v: a @ v, np.diag(a).copy(), nroots=2)
        >>> np.allclose(r.energies, np.linalg.eigvalsh(a)[:2])
        True
    """
    ops = _ops_for(diag)
    n = len(diag)
    nroots = min(nroots, n)
    max_space = max_space or max(8 * nroots, 40)
    max_space = min(max_space, n)
    if guess is None:
        k0 = min(n, max(2 * nroots, nroots + 2))
        order = ops.argsort(diag, k0)
        G = ops.zeros_guess(n, k0)
        G[order, ops.dev(np.arange(k0))] = 1.0
        # A little seeded noise in every guess: with symmetry-adapted orbitals H is block
        # diagonal, and unit vectors alone would never reach a ground state whose symmetry
        # block holds none of the lowest diagonals (C2/STO-3G is such a case).
        G += 1e-2 / np.sqrt(n) * ops.noise(n, k0)
    else:
        G = ops.asarray(guess, n)
    G, _ = ops.qr(G)
    # Subspace and its image live in preallocated blocks: no copies as the space grows.
    V = ops.empty(n, max_space + G.shape[1])
    AV = ops.empty(n, max_space + G.shape[1])
    m = G.shape[1]
    V[:, :m] = G
    AV[:, :m] = matvec(G)
    e_old = np.full(nroots, np.inf)
    res_norms = np.full(nroots, np.inf)
    theta_w = e_old
    X = V[:, :nroots]
    for it in range(1, max_iter + 1):
        Hs = ops.host(V[:, :m].T @ AV[:, :m])
        Hs = 0.5 * (Hs + Hs.T)
        theta, s = np.linalg.eigh(Hs)
        theta_w = theta[:nroots]
        s_w = ops.dev(s[:, :nroots])
        X = V[:, :m] @ s_w
        R = AV[:, :m] @ s_w - X * ops.dev(theta_w)
        res_norms = ops.colnorms(R)
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
        if precond is None:
            denom = ops.clamp_away(diag[:, None] - ops.dev(theta_w[todo])[None, :], 1e-8)
            T = R[:, ops.dev(todo)] / denom
        else:
            T = precond(R[:, ops.dev(todo)], theta_w[todo], X[:, ops.dev(todo)])
        if m + T.shape[1] > max_space:
            # Restart from the lowest Ritz vectors. V and s are orthonormal, so V s is too, and
            # its image follows by linearity: no extra matvec.
            keep = max(nroots, min(2 * nroots, m))
            s_k = ops.dev(np.ascontiguousarray(s[:, :keep]))
            Q, AQ = V[:, :m] @ s_k, AV[:, :m] @ s_k
            m = keep
            V[:, :m], AV[:, :m] = Q, AQ
        for _ in range(2):  # orthogonalise twice (Kahan)
            T -= V[:, :m] @ (V[:, :m].T @ T)
        Q, rr = ops.qr(T)
        Q = Q[:, ops.dev(np.abs(np.diag(ops.host(rr))) > 1e-10)]
        if Q.shape[1] == 0:
            return DavidsonResult(theta_w, X, bool(np.all(res_norms < 1e-4)), it, res_norms)
        k = Q.shape[1]
        V[:, m : m + k] = Q
        AV[:, m : m + k] = matvec(Q)
        m += k
    return DavidsonResult(theta_w, X, False, max_iter, res_norms)
