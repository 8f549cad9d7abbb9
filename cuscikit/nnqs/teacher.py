"""The selected-CI vector of S as a teacher for the network (`Runner(teacher=...)`).

Within the current space S the iteration already holds H_SS (the diagonal and the coupled pairs
inside S that the inner steps use). Its lowest eigenvector c is the best state S can hold, so it
is at least as low in energy as the network restricted to S. While a run is young the network is
pulled towards it by a second loss on S,

    L_T = KL(q || p) + 2 sum_x q_x (1 - cos(phi_x - theta_x - phi_0)),

with q_x = c_x^2 (c normalised), p_x = |psi_x|^2 / sum_S |psi|^2 the network's distribution on
S, phi_x the network's phase, theta_x = 0 or pi the sign of c_x and phi_0 the global phase that
best aligns the two (held fixed in the gradient). L_T >= 0, and L_T = 0 exactly when psi is
proportional to c on S (up to a global phase). Its gradient with respect to ln|psi_x| is
2 (p_x - q_x) and with respect to phi_x 2 q_x sin(phi_x - theta_x - phi_0): weighted by the
teacher's q_x, not by the network's |psi_x|^2, so a configuration whose amplitude has collapsed
(the energy's gradient on it ~ |psi_x|^2) still gets a pull of the size of its CI weight, and the
sign of each configuration is taught directly instead of through the energy.

The teacher only shapes the gradient: every energy the Runner reports is the network's own.

Our account, the measurements and the default: ``docs/nnqs_sci.md`` ("The selected-CI teacher").
"""

from __future__ import annotations

import warnings

import numpy as np
import torch

__all__ = ["fidelity_loss", "pull_and_loss", "space_ground_state", "teacher_coefficients"]

DENSE_LIMIT = 600
"""Spaces up to this size are diagonalised densely; larger ones by Davidson."""


def _host(a) -> np.ndarray:
    return a.detach().to("cpu").numpy() if torch.is_tensor(a) else np.asarray(a)


def space_ground_state(
    hdiag, pairs, guess=None, tol: float = 1e-10, residual_tol: float = 1e-7, comm=None
) -> tuple[float, np.ndarray]:
    """The lowest eigenpair of H restricted to S, from its diagonal and off-diagonal pairs.

    Spaces up to `DENSE_LIMIT` are diagonalised densely on the host; larger ones by the block
    Davidson solver of `cuscikit.linalg.davidson` (one root, started from `guess`) where the
    pairs live: for torch tensors (a GPU's) the sparse products are torch's CSR on their
    device, for numpy arrays SciPy's. The iteration's pairs never travel.

    On several ranks (`comm`) each rank passes the H_SS rows of its own contiguous share of S
    (the shares in rank order are S) and every rank returns the same solution over all of S:
    the dense path gathers the rows; Davidson's keeps them where they are and gathers only
    each product's rows, so every rank runs the same iteration on the same vectors.

    Args:
        hdiag: <x|H|x> for the n configurations of S, or of this rank's rows (numpy or torch).
        pairs: (row, column, value) of the off-diagonal entries of H_SS, every entry listed
            from both of its rows (as the iteration's coupled pairs inside S are); rows and
            columns numbered in all of S.
        guess: a starting vector over all of S (e.g. the network's psi on S, or the last
            solution carried over); complex values are reduced to a real vector of the same
            signs.
        tol: the iterative solver's convergence on the change of the energy (Hartree).
        residual_tol: and on the norm of the residual (c normalised).
        comm: a `cuscikit.parallel.Comm` whose ranks each hold a share (None: one rank).

    Returns:
        (energy, c) with c a real numpy vector over all of S, normalised, sign fixed so that
        its largest entry is positive.

    Example:
        >>> import numpy as np
        >>> e, c = space_ground_state(np.array([0.0, 1.0]), (np.array([0, 1]),
        ...                           np.array([1, 0]), np.array([-0.5, -0.5])))
        >>> round(e, 6), bool(c[0] > c[1] > 0)
        (-0.207107, True)
    """
    from cuscikit.nnqs.distributed import all_rows

    rows, cols, vals = pairs
    if not (len(rows) == len(cols) == len(vals)):
        raise ValueError("pairs must be three arrays of one length")
    ranks = comm is not None and comm.size > 1
    m = len(hdiag)
    counts = [int(c[0]) for c in comm.allgather(np.array([m], np.int64))] if ranks else [m]
    lo, n = sum(counts[: comm.rank]) if ranks else 0, sum(counts)
    if n == 0:
        raise ValueError("the space is empty")
    if ranks:  # one dtype on every rank for the gathers (a rank without rows has its own)
        hdiag, vals = _as(hdiag, np.float64), _as(vals, np.float64)
        rows, cols = _as(rows, np.int64), _as(cols, np.int64)
    if ranks and n <= DENSE_LIMIT:  # small: every rank solves all of it
        full = [all_rows(a, comm) for a in (hdiag, rows, cols, vals)]
        return space_ground_state(full[0], tuple(full[1:]), guess, tol, residual_tol)

    if n <= DENSE_LIMIT or not torch.is_tensor(hdiag):
        import scipy.sparse as sp

        d = _host(hdiag).astype(np.float64).real
        h = sp.coo_matrix(
            (
                np.asarray(_host(vals)).real.astype(np.float64),
                (_host(rows).astype(np.int64) - lo, _host(cols).astype(np.int64)),
            ),
            shape=(m, n),
        ).tocsr()
        if n <= DENSE_LIMIT:
            w, v = np.linalg.eigh((h + sp.diags(d)).toarray())
            return _signed(float(w[0]), v[:, 0])

        def matvec(x):
            return all_rows(h @ x + d[:, None] * x[lo : lo + m], comm)  # rows of all ranks

    else:
        dev = hdiag.device
        d = hdiag.real.to(torch.float64)
        r = torch.as_tensor(rows, device=dev).to(torch.int64) - lo
        idx = torch.stack([r, torch.as_tensor(cols, device=dev).to(torch.int64)])
        with warnings.catch_warnings():  # torch's notices that its sparse layouts are beta
            warnings.filterwarnings("ignore", message="Sparse")
            off = torch.sparse_coo_tensor(
                idx,
                torch.as_tensor(vals, device=dev).real.to(torch.float64),
                (m, n),
                check_invariants=False,
            )
            off = off.coalesce().to_sparse_csr()

        def matvec(x):
            return all_rows(off @ x + d[:, None] * x[lo : lo + m], comm)

    from cuscikit.linalg.davidson import davidson

    diag = all_rows(d, comm)
    g = _real_guess(guess, diag)
    res = davidson(matvec, diag, 1, guess=g, tol=tol, residual_tol=residual_tol, max_iter=500)
    c = res.vectors[:, 0]
    return _signed(float(res.energies[0]), _host(c).astype(np.float64))


def _as(a, dtype):
    """The real part of `a` as `dtype`, a torch tensor on its device or a numpy array."""
    if torch.is_tensor(a):
        return (a.real if a.is_complex() else a).to(getattr(torch, np.dtype(dtype).name))
    return np.asarray(a).real.astype(dtype, copy=False)


def _real_guess(guess, diag):
    """`guess` as a real (n, 1) start on diag's device with the signs of its phases (aligned on
    its largest entry); None (the solver's own start) where it is None or zero."""
    if guess is None:
        return None
    if torch.is_tensor(diag):
        g = _aligned(torch.as_tensor(guess, device=diag.device).to(torch.complex128))
    else:
        g = aligned_real(guess)
    return g[:, None] if float((g * g).sum()) > 0 else None


def _aligned(g):
    """The real part of g (complex numpy array or torch tensor, kept where it is) after the
    phase of its largest entry is taken out."""
    top = g[int(abs(g).argmax())]
    return (g * top.conj() / max(float(abs(top)), 1e-300)).real


def aligned_real(psi) -> np.ndarray:
    """A complex vector (numpy or torch) as the real numpy vector of its phases aligned on its
    largest entry: the start the eigensolve reads from a network's psi.

    Example:
        >>> aligned_real(np.array([1j, -2j])).tolist()
        [-1.0, 2.0]
    """
    return _aligned(_host(psi).astype(np.complex128))


def _signed(e: float, c: np.ndarray) -> tuple[float, np.ndarray]:
    """(e, c) with c normalised and its largest entry positive."""
    c = c / np.linalg.norm(c)
    if c[int(np.argmax(np.abs(c)))] < 0:
        c = -c
    return e, c


def _parts(psi: torch.Tensor, c: torch.Tensor, mask: torch.Tensor | None = None):
    """(p, q, phase difference aligned by the best global phase) of psi and c on S. Rows where
    `mask` is 0 (padding) get p = 0; padded rows of c must be 0. No host synchronisation (the
    form a recorded CUDA graph can hold)."""
    prob = psi.abs() ** 2
    if mask is not None:
        prob = prob * mask
    p = prob / prob.sum()
    q = c.real.to(torch.float64) ** 2
    q = q / q.sum()
    sign = torch.where(c.real < 0, -1.0, 1.0).to(psi.dtype)
    unit = torch.where(psi.abs() > 0, psi / psi.abs().clamp_min(1e-300), torch.ones_like(psi))
    rel = unit * sign  # e^{i (phi - theta)}
    z = (q.to(psi.dtype) * rel).sum()
    za = z.abs()
    phase0 = torch.where(za > 0, z / za.clamp_min(1e-300), torch.ones_like(z))
    return p, q, torch.angle(rel * phase0.conj())


def _loss(p: torch.Tensor, q: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
    """L_T from `_parts`, as a device scalar: the KL term over the rows where q > 0 (selected
    by value, not by a mask's gather, so no host synchronisation) plus the phase term."""
    kl = torch.where(q > 0, q * (q.log() - p.clamp_min(1e-300).log()), 0.0)
    return kl.sum() + 2.0 * (q * (1.0 - torch.cos(delta))).sum()


def fidelity_loss(psi, c) -> float:
    """L_T of the module docstring for psi (complex, any normalisation) and the teacher c on S.

    Example:
        >>> import torch
        >>> c = torch.tensor([0.8, -0.6], dtype=torch.float64)
        >>> psi = (3.0 * c).to(torch.complex128) * torch.exp(torch.tensor(0.7j))
        >>> abs(fidelity_loss(psi, c)) < 1e-12
        True
    """
    psi = torch.as_tensor(psi).to(torch.complex128)
    c = torch.as_tensor(c).to(torch.float64)
    return float(_loss(*_parts(psi, c)))


def pull_and_loss(psi: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(`teacher_coefficients` (psi, c), `fidelity_loss` (psi, c) as a device scalar) from one
    evaluation of their common parts, without a host synchronisation: the iteration's pull
    and its ``teacher_loss``, which the Runner reads after the optimiser stage.
    On a GPU one Triton program (`cuscikit.nnqs.local_energy.teacher_pull`: the same values
    to the last bits, sums in another order).

    Example:
        >>> import torch
        >>> c = torch.tensor([0.8, -0.6], dtype=torch.float64)
        >>> psi = torch.tensor([0.6, 0.8], dtype=torch.complex128)
        >>> t, loss = pull_and_loss(psi, c)
        >>> bool(torch.equal(t, teacher_coefficients(psi, c))), float(loss) == fidelity_loss(psi, c)
        (True, True)
    """
    from cuscikit.nnqs import local_energy

    psi = psi.to(torch.complex128)
    fused = local_energy.teacher_pull(psi, c)  # one Triton program on a GPU
    if fused is not None:
        return fused
    p, q, delta = _parts(psi, c.to(psi.device))
    return _coefficients(p, q, delta), _loss(p, q, delta)


def _coefficients(p: torch.Tensor, q: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
    return torch.complex(p - q, q * torch.sin(delta))


def teacher_coefficients(
    psi: torch.Tensor, c: torch.Tensor, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """T_x such that the gradient of 2 Re sum_x conj(ln psi_x) T_x (T held fixed) is the
    gradient of `fidelity_loss` with respect to the network's parameters: Re T = p - q and
    Im T = q sin(phi - theta - phi_0). Complex128, on psi's device. `mask` (1 on the rows of S,
    0 on padding; padded rows of c are 0) serves the recorded optimiser stage, whose S is
    padded to a bucket; the padded rows get T = 0. No host synchronisation.

    Example:
        >>> import torch
        >>> c = torch.tensor([0.8, -0.6], dtype=torch.float64)
        >>> t = teacher_coefficients(c.to(torch.complex128), c)  # psi = c: no pull
        >>> bool(t.abs().max() < 1e-12)
        True
    """
    psi = psi.to(torch.complex128)
    return _coefficients(*_parts(psi, c.to(psi.device), mask))
