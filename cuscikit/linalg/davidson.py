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


class _Spilled:
    """A block of `cols` float64 columns of length n (the Davidson subspace V or its image AV)
    whose first `resident` columns stay on the device and the rest in host memory (one vector
    each, made when first written; page-locked when the device is a GPU). Products with the
    block stream the host columns through one device vector: V^T B and V s, the only uses the
    algorithm makes."""

    def __init__(self, torch, device, n: int, cols: int, resident: int):
        self.torch, self.n = torch, n
        self.resident = max(0, min(int(resident), cols))
        self.dev = torch.empty((n, self.resident), dtype=torch.float64, device=device)
        self.host: list = [None] * (cols - self.resident)
        self.stage = None

    def _host_vector(self):
        f64 = self.torch.float64
        if self.dev.device.type == "cuda":  # page-locked: fast, asynchronous copies
            try:
                return self.torch.empty(self.n, dtype=f64, pin_memory=True)
            except RuntimeError:  # no page-locked memory left: pageable, slower copies
                pass
        return self.torch.empty(self.n, dtype=f64)

    def _column(self, j: int):
        if self.stage is None:
            self.stage = self.torch.empty(self.n, dtype=self.torch.float64, device=self.dev.device)
        self.stage.copy_(self.host[j - self.resident], non_blocking=True)
        return self.stage

    def set(self, j: int, Q) -> None:
        """Columns j .. j + k - 1 from the device block Q (n, k)."""
        for i in range(Q.shape[1]):
            if j + i < self.resident:
                self.dev[:, j + i] = Q[:, i]
                continue
            h = j + i - self.resident
            if self.host[h] is None:
                self.host[h] = self._host_vector()
            self.host[h].copy_(Q[:, i].contiguous())

    def tdot(self, m: int, B):
        """V[:, :m]^T B (m, k) on the device."""
        r = min(m, self.resident)
        out = self.torch.empty((m, B.shape[1]), dtype=B.dtype, device=B.device)
        out[:r] = self.dev[:, :r].T @ B
        for j in range(r, m):
            out[j] = self._column(j) @ B
        return out

    def mul(self, m: int, s):
        """V[:, :m] s (n, k) on the device."""
        r = min(m, self.resident)
        out = self.dev[:, :r] @ s[:r]
        for j in range(r, m):
            out.addr_(self._column(j), s[j])
        return out


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
    resident: int | None = None,
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
        callback: called as callback(iteration, energies, residual_norms) every iteration; a
            true return value stops the solve there (unconverged unless the test passes).
        precond: corrections from residuals, called as precond(R, theta, X) with the residuals
            R, Ritz values theta and Ritz vectors X of the unconverged roots (one column
            each); default R / (diag - theta).
        resident: with tensors on a GPU, how many columns of the subspace V (and as many of its
            image AV) stay on the device; the others are spilled to pinned host memory and
            streamed back for each product (None: all on the device). The projected matrix is
            then updated column by column (V^T AQ for each new block AQ) instead of formed
            whole, so the energies agree with the resident path to rounding, not bit for bit.

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
    cols = max_space + G.shape[1]
    spill = resident is not None and resident < cols and isinstance(ops, _TorchOps)
    if spill:
        torch = ops.torch
        Vb = _Spilled(torch, ops.device, n, cols, resident)
        AVb = _Spilled(torch, ops.device, n, cols, resident)
        Hs_all = np.zeros((cols, cols))

        def v_t(m, B):
            return Vb.tdot(m, B)

        def v_mul(m, s):
            return Vb.mul(m, s)

        def av_mul(m, s):
            return AVb.mul(m, s)

        def put(j, Q, AQ):
            Vb.set(j, Q)
            AVb.set(j, AQ)
            # the new columns of the projected matrix, V^T AQ, mirrored (H is symmetric)
            k = Q.shape[1]
            col = ops.host(Vb.tdot(j + k, AQ))
            Hs_all[: j + k, j : j + k] = col
            Hs_all[j : j + k, :j] = col[:j].T

        def projected(m):
            return Hs_all[:m, :m].copy()
    else:
        V = ops.empty(n, cols)
        AV = ops.empty(n, cols)

        def v_t(m, B):
            return V[:, :m].T @ B

        def v_mul(m, s):
            return V[:, :m] @ s

        def av_mul(m, s):
            return AV[:, :m] @ s

        def put(j, Q, AQ):
            k = Q.shape[1]
            V[:, j : j + k], AV[:, j : j + k] = Q, AQ

        def projected(m):
            return ops.host(V[:, :m].T @ AV[:, :m])

    m = G.shape[1]
    put(0, G, matvec(G))
    e_old = np.full(nroots, np.inf)
    res_norms = np.full(nroots, np.inf)
    theta_w = e_old
    X = G[:, :nroots]
    for it in range(1, max_iter + 1):
        Hs = projected(m)
        Hs = 0.5 * (Hs + Hs.T)
        theta, s = np.linalg.eigh(Hs)
        theta_w = theta[:nroots]
        s_w = ops.dev(s[:, :nroots])
        X = v_mul(m, s_w)
        R = av_mul(m, s_w) - X * ops.dev(theta_w)
        res_norms = ops.colnorms(R)
        stop = callback is not None and callback(it, theta_w, res_norms)
        converged = np.all(np.abs(theta_w - e_old) < tol) and np.all(res_norms < residual_tol)
        if converged or m >= n:
            return DavidsonResult(theta_w, X, True, it, res_norms)
        if stop:  # the caller's limit (time, say): the current Ritz pairs, not converged
            return DavidsonResult(theta_w, X, False, it, res_norms)
        e_old = theta_w
        # Preconditioned corrections for the unconverged roots.
        todo = np.flatnonzero(res_norms >= residual_tol)
        if todo.size == 0:
            todo = np.arange(nroots)
        # every root unconverged (always with one): R and X themselves, no indexed copies
        every = todo.size == R.shape[1]
        R_t = R if every else R[:, ops.dev(todo)]
        if precond is None:
            denom = ops.clamp_away(diag[:, None] - ops.dev(theta_w[todo])[None, :], 1e-8)
            T = R_t / denom
        else:
            T = precond(R_t, theta_w[todo], X if every else X[:, ops.dev(todo)])
        del R, R_t
        if m + T.shape[1] > max_space:
            # Restart from the lowest Ritz vectors. V and s are orthonormal, so V s is too, and
            # its image follows by linearity: no extra matvec.
            keep = max(nroots, min(2 * nroots, m))
            s_k = ops.dev(np.ascontiguousarray(s[:, :keep]))
            Q, AQ = v_mul(m, s_k), av_mul(m, s_k)
            m = keep
            put(0, Q, AQ)
            del Q, AQ
        for _ in range(2):  # orthogonalise twice (Kahan)
            T -= v_mul(m, v_t(m, T))
        Q, rr = ops.qr(T)
        Q = Q[:, ops.dev(np.abs(np.diag(ops.host(rr))) > 1e-10)]
        if Q.shape[1] == 0:
            return DavidsonResult(theta_w, X, bool(np.all(res_norms < 1e-4)), it, res_norms)
        k = Q.shape[1]
        del T
        put(m, Q, matvec(Q))
        del Q  # not held through the next iteration
        m += k
    return DavidsonResult(theta_w, X, False, max_iter, res_norms)
