"""Block Davidson eigensolver for the lowest roots of a real symmetric operator.

Written once for numpy arrays and torch tensors: the subspace and its image stay where `diag`
lives (host memory, or a GPU), and only the small projected problem (size of the subspace)
travels to the host for its eigendecomposition.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


class _NumpyOps:
    """The array operations of the algorithm on numpy arrays."""

    # Residual rows reused between iterations: a fresh host block of the vectors' size costs
    # page faults every time (device allocators reuse freed blocks, so tensors need not).
    reuse = True

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

    reuse = False
    # torch loads its CUDA linear-algebra library on the first torch.linalg call of a process,
    # and that loading is not thread-safe: ranks on threads of one process (ThreadComm) whose
    # first QRs coincide fail with "lazy wrapper should be called at most once"
    # (github.com/pytorch/pytorch/issues/90613). The first CUDA call goes through this lock;
    # later ones do not need it.
    _linalg_lock = threading.Lock()
    _linalg_loaded = False

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
        if a.is_cuda and not _TorchOps._linalg_loaded:
            with _TorchOps._linalg_lock:
                q = self.torch.linalg.qr(a)
                _TorchOps._linalg_loaded = True
            return q
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
        r = self.torch.as_tensor(a, device=self.device).T.contiguous()
        # strides (n, 1) for one row too: a transposed column keeps (1, 1), "contiguous" to
        # torch but a leading dimension of 1 that cuBLASLt refuses in the in-place GEMMs
        return r.as_strided(r.shape, (r.shape[1], 1))

    def columns(self, a):
        return a.T.contiguous()

    def host(self, a):
        return a.cpu().numpy() if self.torch.is_tensor(a) else np.asarray(a)

    def dev(self, a):
        return self.torch.as_tensor(np.ascontiguousarray(a), device=self.device)

    def clamp_away(self, a, eps):
        return self.torch.where(self.torch.abs(a) < eps, eps, a)


class _Rows:
    """A block of `cap` float64 vectors of length n as contiguous rows of one array (numpy, or a
    tensor on its device): the Davidson subspace V or its image AV."""

    def __init__(self, ops, n: int, cap: int):
        self.ops = ops
        self.a = ops.empty(cap, n)

    def put(self, j: int, Q) -> None:
        """Rows j .. j + k - 1 from Q (k, n)."""
        self.a[j : j + Q.shape[0]] = Q

    def slot(self, j: int):
        """A writable row to build vector j in; `done(j, row)` stores it."""
        return self.a[j]

    def done(self, j: int, row) -> None:
        pass  # built in place

    def view(self, a: int, b: int):
        """Rows a .. b - 1 where they are stored on the device, else None."""
        return self.a[a:b]

    def mul(self, s, m: int, out=None):
        """s V[:m] (k, n) for s (k, m), into `out` when given."""
        return self.ops.matmul_into(s, self.a[:m], out)

    def tmul(self, B, m: int):
        """B V[:m]^T (k, m) for rows B (k, n)."""
        return B @ self.a[:m].T

    def project(self, m: int, B) -> np.ndarray:
        """V[:m] B^T (m, k) on the host."""
        return self.ops.host(self.a[:m] @ B.T)

    def sub(self, T, a, m: int) -> None:
        """T -= a V[:m] in place, a (k, m)."""
        self.ops.sub_matmul(T, a, self.a[:m])


class _Spilled(_Rows):
    """The same block (torch) with only its first `resident` rows on the device and the rest in
    host memory, one vector each, made when first written (page-locked when the device is a
    GPU). Products with the block stream the host rows through one device row: the device rows
    in one GEMM, then one rank-1 update or dot per host row."""

    def __init__(self, torch, device, n: int, cap: int, resident: int):
        self.torch, self.n = torch, n
        self.resident = max(0, min(int(resident), cap))
        self.dev = torch.empty((self.resident, n), dtype=torch.float64, device=device)
        self.host: list = [None] * (cap - self.resident)
        self.stage = None

    def _host_vector(self):
        f64 = self.torch.float64
        if self.dev.device.type == "cuda":  # page-locked: fast, asynchronous copies
            try:
                return self.torch.empty(self.n, dtype=f64, pin_memory=True)
            except RuntimeError:  # no page-locked memory left: pageable, slower copies
                pass
        return self.torch.empty(self.n, dtype=f64)

    def _row(self, j: int):
        """Host row j on the device (in the one staging row)."""
        if self.stage is None:
            self.stage = self.torch.empty(self.n, dtype=self.torch.float64, device=self.dev.device)
        self.stage.copy_(self.host[j - self.resident], non_blocking=True)
        return self.stage

    def _store(self, j: int, row) -> None:
        if j < self.resident:
            self.dev[j] = row
            return
        h = j - self.resident
        if self.host[h] is None:
            self.host[h] = self._host_vector()
        self.host[h].copy_(row.contiguous())

    def put(self, j, Q):
        for i in range(Q.shape[0]):
            self._store(j + i, Q[i])

    def slot(self, j):
        if j < self.resident:
            return self.dev[j]
        return self.torch.empty(self.n, dtype=self.torch.float64, device=self.dev.device)

    def done(self, j, row):
        if j >= self.resident:
            self._store(j, row)

    def view(self, a, b):
        return self.dev[a:b] if b <= self.resident else None

    def mul(self, s, m, out=None):
        r = min(m, self.resident)
        s = s if self.torch.is_tensor(s) else self.torch.as_tensor(s, device=self.dev.device)
        out = self.torch.matmul(s[:, :r], self.dev[:r], out=out)
        for j in range(r, m):
            out.addr_(s[:, j], self._row(j))
        return out

    def tmul(self, B, m):
        r = min(m, self.resident)
        out = self.torch.empty((B.shape[0], m), dtype=B.dtype, device=B.device)
        out[:, :r] = B @ self.dev[:r].T
        for j in range(r, m):
            out[:, j] = B @ self._row(j)
        return out

    def project(self, m, B):
        return self.tmul(B, m).T.cpu().numpy()

    def sub(self, T, a, m):
        r = min(m, self.resident)
        a = a if self.torch.is_tensor(a) else self.torch.as_tensor(a, device=self.dev.device)
        T.addmm_(a[:, :r], self.dev[:r], alpha=-1.0)
        for j in range(r, m):
            T.addr_(a[:, j], self._row(j), alpha=-1.0)


def _eigh(a: np.ndarray):
    """Eigenpairs of the small projected matrix, ascending: LAPACK's dsyevd (the routine of
    ``np.linalg.eigh``; the same numbers where both libraries carry the same LAPACK, as here)
    through SciPy, whose LAPACK a process that uses SciPy (every PySCF run) has in memory
    already; numpy's, a second copy, put 0.7 MB of code pages into the first solve of such a
    process (measured after a PySCF SCF)."""
    try:
        from scipy.linalg import eigh
    except ImportError:
        return np.linalg.eigh(a)
    return eigh(a, driver="evd", check_finite=False)


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
        callback: called as callback(iteration, energies, residual_norms) every iteration; a
            true return value stops the solve there (unconverged unless the test passes).
        precond: corrections from residuals, called as precond(R, theta, X) with the residuals
            R, Ritz values theta and Ritz vectors X of the unconverged roots (one column
            each); default R / (diag - theta). It may write over R (the residuals are not
            read after the call) and return that storage.
        resident: with tensors on a GPU, how many vectors of the subspace V (and as many of
            its image AV) stay on the device; the others are spilled to pinned host memory and
            streamed back one at a time for each product (None: all on the device). The
            arithmetic is the resident path's, in other summation orders: the energies agree
            with it to rounding, not bit for bit.

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
    del guess  # the caller may have handed it over: not held through the solve
    G, _ = ops.qr(G)
    # The subspace and its image are rows of preallocated blocks: each vector contiguous, so
    # that writing one touches only its own memory, and nothing is copied as the space grows.
    # The projected matrix grows by the new rows only (V_i . AV_j for the new j).
    cap = max_space + G.shape[1]
    if resident is not None and resident < cap and isinstance(ops, _TorchOps):
        Vb = _Spilled(ops.torch, ops.device, n, cap, resident)
        AVb = _Spilled(ops.torch, ops.device, n, cap, resident)
    else:
        Vb, AVb = _Rows(ops, n, cap), _Rows(ops, n, cap)
    Hs = np.zeros((cap, cap))

    def project(a: int, b: int, B) -> None:
        """Rows and columns a .. b - 1 of the projected matrix from the new image rows B."""
        P = Vb.project(b, B)  # (b, b - a): V_i . AV_j, j in a..b
        Hs[:b, a:b] = P
        Hs[a:b, :a] = P[:a].T
        new = Hs[a:b, a:b]
        Hs[a:b, a:b] = 0.5 * (new + new.T)

    def store_image(a: int, AQ) -> None:
        """The new images AQ (rows a ..) into AV and into the projected matrix."""
        AVb.put(a, AQ)
        B = AVb.view(a, a + AQ.shape[0])
        project(a, a + AQ.shape[0], AQ if B is None else B)

    m = G.shape[1]
    Vb.put(0, G.T)
    store_image(0, matvec(G).T)
    del G
    into = getattr(matvec, "into", None)
    Xb = ops.empty(nroots, n)  # Ritz vectors (and on the host residuals): rows reused
    Rb = ops.empty(nroots, n) if ops.reuse else None
    e_old = np.full(nroots, np.inf)
    res_norms = np.full(nroots, np.inf)
    theta_w = e_old
    X = None
    s_old = None  # the step before's Ritz coefficients (for a restart)
    for it in range(1, max_iter + 1):
        theta, s = _eigh(Hs[:m, :m])
        theta_w = theta[:nroots]
        s_w = ops.dev(np.ascontiguousarray(s[:, :nroots].T))
        X = Vb.mul(s_w, m, Xb)
        R = AVb.mul(s_w, m, Rb)
        ops.sub_matmul(R, np.diag(theta_w), X)  # R = AV s - X theta
        res_norms = ops.rownorms(R)
        stop = callback is not None and callback(it, theta_w, res_norms)
        converged = np.all(np.abs(theta_w - e_old) < tol) and np.all(res_norms < residual_tol)
        if converged or m >= n:
            return DavidsonResult(theta_w, ops.columns(X), True, it, res_norms)
        if stop:  # the caller's limit (time, say): the current Ritz pairs, not converged
            return DavidsonResult(theta_w, ops.columns(X), False, it, res_norms)
        e_old = theta_w
        # Preconditioned corrections for the unconverged roots.
        todo = np.flatnonzero(res_norms >= residual_tol)
        if todo.size == 0:
            todo = np.arange(nroots)
        if todo.size < nroots:
            Rt, Xt = R[ops.dev(todo)], X[ops.dev(todo)]
        else:  # every root unconverged (always with one): R and X themselves, no copies
            Rt, Xt = R, X
        del R
        if precond is None:
            denom = ops.clamp_away(diag[None, :] - ops.dev(theta_w[todo])[:, None], 1e-8)
            T = Rt / denom
        else:  # the hook takes and gives columns
            T = ops.rows(precond(Rt.T, theta_w[todo], Xt.T))
        del Rt, Xt  # on a device the residuals are freed here, before the next sigma
        if m + T.shape[0] > max_space:
            # Restart from the Ritz vectors and those of the step before (in the same basis,
            # padded with zeros for the vectors added since): the pair keeps the direction the
            # iteration was moving in, which the next lowest Ritz vectors do not ("GD+k":
            # Stathopoulos & Saad, "Restarting techniques for the (Jacobi-)Davidson symmetric
            # eigenvalue methods", ETNA 7, 163 (1998)). V and S are orthonormal, so
            # S^T V is too, its image follows by linearity (no extra matvec), and its projection
            # is S^T Hs S.
            if s_old is not None and max_space > 3 * nroots:
                S = np.zeros((m, 2 * nroots))
                S[:, :nroots] = s[:, :nroots]
                S[: s_old.shape[0], nroots:] = s_old
                S, rr = np.linalg.qr(S)
                S = S[:, np.abs(np.diag(rr)) > 1e-8 * np.abs(rr[0, 0])]
                H_k = S.T @ Hs[:m, :m] @ S
            else:  # restarted on the step before, or a space too small: the lowest Ritz vectors
                S = s[:, : max(nroots, min(2 * nroots, m))]
                H_k = np.diag(theta[: S.shape[1]])
            keep = S.shape[1]
            s_k = ops.dev(np.ascontiguousarray(S.T))
            Q = Vb.mul(s_k, m)
            Vb.put(0, Q)
            del Q
            AQ = AVb.mul(s_k, m)
            AVb.put(0, AQ)
            del AQ
            m = keep
            Hs[:] = 0.0
            Hs[:m, :m] = 0.5 * (H_k + H_k.T)
            s_old = None
        else:
            s_old = s[:, :nroots]
        for _ in range(2):  # orthogonalise twice (Kahan)
            Vb.sub(T, Vb.tmul(T, m), m)
        if T.shape[0] == 1:  # one vector: normalised straight into its row, no temporary
            r = float(ops.rownorms(T)[0])
            k = int(r > 1e-10)
            if k:
                q = Vb.slot(m)
                ops.divide_into(T[0], r, q)
                Vb.done(m, q)
                Q = q[None]
        else:
            Q, rr = ops.qr(T.T)
            Q = Q[:, ops.dev(np.abs(np.diag(ops.host(rr))) > 1e-10)].T
            k = Q.shape[0]
            Vb.put(m, Q)
        del T
        if k == 0:
            return DavidsonResult(
                theta_w, ops.columns(X), bool(np.all(res_norms < 1e-4)), it, res_norms
            )
        if into is not None and k == 1:  # the image written into its row in place
            a = AVb.slot(m)
            into(Q.T, a[None].T)
            AVb.done(m, a)
            del Q
            project(m, m + 1, a[None])
            del a
        else:
            AQ = matvec(Q.T).T
            del Q  # not held through the projection
            store_image(m, AQ)
            del AQ
        m += k
    if X is None:  # no iteration: the guess
        X = Vb.mul(ops.dev(np.eye(min(nroots, m), m)), m)
    return DavidsonResult(theta_w, ops.columns(X), False, max_iter, res_norms)
