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

    def rownorms(self, a) -> np.ndarray:
        return np.sqrt(np.einsum("ij,ij->i", a, a))

    def matmul_into(self, a, b, out):
        return np.matmul(a, b, out=out)

    def divide_into(self, a, r: float, out) -> None:
        np.divide(a, r, out=out)

    def sub_matmul(self, t, a, b) -> None:
        """t -= a @ b in place, t (k, n) and b (m, n) contiguous rows, a (k, m) small: one BLAS
        call with beta = 1 (no temporary of t's size) where SciPy is present."""
        try:
            from scipy.linalg.blas import dgemm
        except ImportError:
            t -= a @ b
            return
        # column-major view: t^T (n, k) -= b^T (n, m) a^T (m, k)
        out = dgemm(-1.0, b.T, np.asarray(a, dtype=np.float64).T, 1.0, t.T, overwrite_c=True)
        if not np.shares_memory(out, t):  # a layout SciPy had to copy: write back
            t[...] = out.T

    def rows(self, a):
        """(n, k) columns as (k, n) contiguous rows (no copy for one column)."""
        return np.ascontiguousarray(np.asarray(a).T)

    def columns(self, a):
        """(k, n) rows as (n, k) contiguous columns (no copy for one row)."""
        return np.ascontiguousarray(a.T)

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
            r = self.rownorms(a.T).reshape(1, 1)
            return a / float(r[0, 0]), r
        return self.torch.linalg.qr(a)

    def matmul_into(self, a, b, out):
        return self.torch.matmul(a, b, out=out)

    def divide_into(self, a, r: float, out) -> None:
        self.torch.div(a, r, out=out)

    def sub_matmul(self, t, a, b) -> None:
        a = a if self.torch.is_tensor(a) else self.dev(np.ascontiguousarray(a))
        t.addmm_(a, b, alpha=-1.0)

    def rownorms(self, a):
        # Through a GEMM (cuBLAS, which the subspace products load anyway) and the host: the
        # first vector_norm of a process loads reduction kernels of its own (about 0.05 s).
        return np.sqrt(np.diag((a @ a.T).cpu().numpy()))

    def rows(self, a):
        return self.torch.as_tensor(a, device=self.device).T.contiguous()

    def columns(self, a):
        return a.T.contiguous()

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
        matvec: maps a block (n, k) to H @ block. It may carry an attribute
            ``into(block, out)`` that writes H @ block into `out` (n, 1) in place; one new
            vector's image is then written straight into the subspace's storage.
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
    # The subspace and its image are rows of preallocated blocks: each vector contiguous, so
    # that writing one touches only its own memory, and nothing is copied as the space grows.
    # The projected matrix grows by the new rows only (V_i . AV_j for the new j).
    cap = max_space + G.shape[1]
    V = ops.empty(cap, n)
    AV = ops.empty(cap, n)
    Hs = np.zeros((cap, cap))
    m = G.shape[1]
    V[:m] = G.T
    AV[:m] = matvec(G).T

    def project(a: int, b: int) -> None:
        P = ops.host(V[:b] @ AV[a:b].T)  # (b, b - a): V_i . AV_j, j in a..b
        Hs[:b, a:b] = P
        Hs[a:b, :a] = P[:a].T
        new = Hs[a:b, a:b]
        Hs[a:b, a:b] = 0.5 * (new + new.T)

    project(0, m)
    Xb = ops.empty(nroots, n)  # Ritz vectors and residuals, rows reused every iteration
    Rb = ops.empty(nroots, n)
    e_old = np.full(nroots, np.inf)
    res_norms = np.full(nroots, np.inf)
    theta_w = e_old
    X = V[:nroots]
    for it in range(1, max_iter + 1):
        theta, s = np.linalg.eigh(Hs[:m, :m])
        theta_w = theta[:nroots]
        s_w = ops.dev(np.ascontiguousarray(s[:, :nroots].T))
        X = ops.matmul_into(s_w, V[:m], Xb)
        R = ops.matmul_into(s_w, AV[:m], Rb)
        ops.sub_matmul(R, np.diag(theta_w), X)  # R = AV s - X theta
        res_norms = ops.rownorms(R)
        if callback is not None:
            callback(it, theta_w, res_norms)
        converged = np.all(np.abs(theta_w - e_old) < tol) and np.all(res_norms < residual_tol)
        if converged or m >= n:
            return DavidsonResult(theta_w, ops.columns(X), True, it, res_norms)
        e_old = theta_w
        # Preconditioned corrections for the unconverged roots.
        todo = np.flatnonzero(res_norms >= residual_tol)
        if todo.size == 0:
            todo = np.arange(nroots)
        if todo.size < nroots:
            Rt, Xt = R[ops.dev(todo)], X[ops.dev(todo)]
        else:
            Rt, Xt = R, X
        del R
        if precond is None:
            denom = ops.clamp_away(diag[None, :] - ops.dev(theta_w[todo])[:, None], 1e-8)
            T = Rt / denom
        else:  # the hook takes and gives columns
            T = ops.rows(precond(Rt.T, theta_w[todo], Xt.T))
        del Rt, Xt
        if m + T.shape[0] > max_space:
            # Restart from the lowest Ritz vectors. V and s are orthonormal, so s^T V is too,
            # its image follows by linearity (no extra matvec), and its projection is diag(theta).
            keep = max(nroots, min(2 * nroots, m))
            s_k = ops.dev(np.ascontiguousarray(s[:, :keep].T))
            Q = s_k @ V[:m]
            V[:keep] = Q
            del Q
            AQ = s_k @ AV[:m]
            AV[:keep] = AQ
            del AQ
            m = keep
            Hs[:] = 0.0
            Hs[np.arange(m), np.arange(m)] = theta[:m]
        for _ in range(2):  # orthogonalise twice (Kahan)
            ops.sub_matmul(T, T @ V[:m].T, V[:m])
        if T.shape[0] == 1:  # one vector: normalised straight into its row, no temporary
            r = float(ops.rownorms(T)[0])
            k = int(r > 1e-10)
            if k:
                ops.divide_into(T[0], r, V[m])
        else:
            Q, rr = ops.qr(T.T)
            Q = Q[:, ops.dev(np.abs(np.diag(ops.host(rr))) > 1e-10)]
            k = Q.shape[1]
            V[m : m + k] = Q.T
            del Q
        del T
        if k == 0:
            return DavidsonResult(
                theta_w, ops.columns(X), bool(np.all(res_norms < 1e-4)), it, res_norms
            )
        into = getattr(matvec, "into", None)
        if into is not None and k == 1:  # the image written into its row in place
            into(V[m : m + 1].T, AV[m : m + 1].T)
        else:
            AV[m : m + k] = matvec(V[m : m + k].T).T
        project(m, m + k)
        m += k
    return DavidsonResult(theta_w, ops.columns(X), False, max_iter, res_norms)
