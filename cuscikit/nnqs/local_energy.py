"""The local energies of the recorded optimiser stage's inner steps and the loss coefficients
they give, in three Triton kernels on a GPU instead of some 40 small torch kernels.

Each inner step of `cuscikit.nnqs.graphs.OptimizerGraph` turns ln psi over S (padded to a
bucket; ``mask`` is 1 on the rows of S) into

    psi   = exp(ln psi - max Re ln psi)
    w     = |psi|^2 mask / sum |psi|^2 mask
    num_x = sum_y H_xy psi_y                (the off-diagonal pairs of H_SS)
    E_x   = H_xx + num_x / psi_x on the rows of S, 0 on padding
    E     = Re sum_x w_x E_x
    T_x   = w_x (E_x - E)                   (the coefficients of the loss 2 Re sum conj(ln psi) T)

and a flag for any non-finite E_x or E (the stage is then undone). Between a pass's forward and
backward work these were some 40 kernels of 1-6 us on the path the pass waits for, among them
an ``index_add_`` of every pair (60 us an inner step for N2/STO-3G on an H100). With a teacher
(``teacher=(tw, c)``, `cuscikit.nnqs.teacher`: its weight and its vector on S, 0 on padding) T
also takes tw times the teacher's coefficients,
`cuscikit.nnqs.teacher.teacher_coefficients` (psi, c, mask):

    q_x = c_x^2 / sum c^2,   u_x = sign(c_x) psi_x / max(|psi_x|, 1e-300),   z = sum_x q_x u_x,
    T_x += tw ((w_x - q_x) + i q_x sin(arg(u_x conj(z)))),

another 35 torch kernels (about 100 us) an inner step.

On a CUDA device (or in Triton's interpreter) `terms` runs three kernels instead: one program
for the maximum, psi and the normalisation (and the teacher's sum of c^2 and z); one program
per 16 rows summing each row's pairs in order (the pairs in rows, `csr`: no atomic additions,
so the sums are the same in every run); one program for E, the flag and T (with the teacher's
pull). Elsewhere it runs the torch operations (the pairs in any order, `index_add_`). The
complex division is c10's (Smith's algorithm), so a row whose psi underflows gives what torch
gives; the teacher's sin(arg v) of a unit v is Im v / |v|, which differs from torch's sin of
torch's angle in the last bits. ``ENABLED = False`` keeps the torch operations on a GPU too; a
kernel that fails to build turns them off for the process (with a warning, ``failed`` saying
why) and the call takes the torch operations over the same pairs.

Example:
    >>> import torch
    >>> lp = torch.tensor([0.0 + 0.1j, -0.5 + 0.0j], dtype=torch.complex128)
    >>> pairs = (torch.tensor([0, 1]), torch.tensor([1, 0]),
    ...          torch.tensor([-0.2 + 0j, -0.2 + 0j], dtype=torch.complex128))
    >>> ones = torch.ones(2, dtype=torch.float64)
    >>> psi, coef, e, bad = terms(lp, ones, torch.tensor([-1.0, 0.5], dtype=torch.float64),
    ...                           pairs)
    >>> round(float(e), 6), bool(bad)
    (-0.773066, False)
"""

from __future__ import annotations

import warnings

import torch

from cuscikit.nnqs._triton import interpreting, pow2, tl, triton

__all__ = ["ENABLED", "csr", "kernels_for", "teacher_pull", "terms"]

#: True (default): `terms` takes the Triton kernels on a CUDA device.
ENABLED = True
failed: str | None = None  # why the kernels were turned off
_ROWS = 16  # rows of a program of the pair sums
_PAIRS = 32  # pairs of a row per step of that program
_BLOCK = 1024  # rows per step of the single-program kernels


def kernels_for(device: torch.device | str) -> bool:
    """Whether `terms` takes the Triton kernels for tensors on ``device`` (then it wants the
    pairs as `csr` gives them)."""
    dev = torch.device(device)
    return ENABLED and triton is not None and (dev.type == "cuda" or interpreting())


def csr(src: torch.Tensor, dst: torch.Tensor, val: torch.Tensor, n_rows: int):
    """The pairs ``(src, dst, val)`` of rows ``src`` in ``[0, n_rows)`` ordered by row (stable)
    with the row pointer: ``(rowptr (n_rows + 1,), src, dst, val)``; row r's pairs are
    ``rowptr[r]:rowptr[r + 1]``.

    Example:
        >>> rowptr, src, dst, val = csr(torch.tensor([2, 0, 2]), torch.tensor([5, 6, 7]),
        ...                             torch.tensor([1.0, 2.0, 3.0]), 3)
        >>> rowptr.tolist(), src.tolist(), dst.tolist(), val.tolist()
        ([0, 1, 1, 3], [0, 2, 2], [6, 5, 7], [2.0, 1.0, 3.0])
    """
    src = src.to(torch.long)
    order = torch.argsort(src, stable=True)
    counts = torch.bincount(src, minlength=n_rows)
    rowptr = torch.zeros(n_rows + 1, dtype=torch.long, device=src.device)
    torch.cumsum(counts, 0, out=rowptr[1:])
    return rowptr, src[order], dst[order].to(torch.long), val[order]


def terms(lp, mask, hd, pairs, rowptr=None, teacher=None, grad=None):
    """``(psi, T, E, bad)`` of the module docstring for ln psi ``lp`` (complex128, n rows, or
    the pair ``(ln|psi|, phi)`` of real tensors of any floating dtype, taken as complex128),
    ``mask`` and the diagonal ``hd`` (float64, n) and the pairs ``(src, dst, val)`` of H_SS
    (``val`` complex128); ``teacher``: None or ``(tw, c)`` (a 0-d float64 weight and the
    float64 vector, n rows, 0 on padding) whose pull T takes too. ``grad``: None, or a real
    tensor (2, n) that gets the gradient of the loss 2 Re sum conj(ln psi) T with respect to
    ln|psi| and phi, (2 Re T, 2 Im T), in its dtype. With ``rowptr`` (`csr`'s, the pairs in
    its order) the Triton kernels run (`kernels_for` the device); without it, or with the
    kernels turned off, the torch operations. ``E`` is a 0-d float64 tensor and ``bad`` a 0-d
    bool tensor; nothing waits on the device."""
    if rowptr is not None and ENABLED:
        try:
            return _kernel_terms(lp, mask, hd, pairs[1], pairs[2], rowptr, teacher, grad)
        except Exception as exc:  # noqa: BLE001 - a Triton that cannot build them here
            _turn_off(exc)
    if isinstance(lp, (tuple, list)):
        lp = torch.complex(*(t.to(torch.float64) for t in lp))
    src, dst, val = pairs
    psi = torch.exp(lp - lp.real.max())
    prob = psi.abs() ** 2 * mask
    num = torch.zeros_like(psi).index_add_(0, src, val * psi[dst])
    w = prob / prob.sum()
    eloc = torch.where(mask > 0, hd + num / psi, 0)
    e = (w * eloc).real.sum()
    bad = (~torch.isfinite(eloc)).any() | ~torch.isfinite(e)
    coef = w * (eloc - e)
    if teacher is not None:
        from cuscikit.nnqs.teacher import teacher_coefficients

        coef = coef + teacher[0] * teacher_coefficients(psi, teacher[1], mask)
    if grad is not None:
        grad.copy_(2.0 * torch.view_as_real(coef).t())
    return psi, coef, e, bad


def teacher_pull(psi: torch.Tensor, c: torch.Tensor):
    """``(T, L_T)``: the teacher's coefficients `cuscikit.nnqs.teacher.teacher_coefficients`
    (psi, c) and its loss `cuscikit.nnqs.teacher.fidelity_loss` (psi, c) as a 0-d tensor, in one
    Triton program (`kernels_for` psi's device) instead of some 40 torch operations: the
    iteration's pull, before the optimiser stage. psi complex128 and c float64, n rows each.
    None where the kernels are off (the caller takes the torch operations)."""
    if not (ENABLED and kernels_for(psi.device)):
        return None
    try:
        n = psi.shape[0]
        psi2 = torch.view_as_real(psi.to(torch.complex128).contiguous())
        c = c.to(device=psi.device, dtype=torch.float64).contiguous()
        pull = torch.empty((n, 2), dtype=torch.float64, device=psi.device)
        loss = torch.empty(1, dtype=torch.float64, device=psi.device)
        _pull_kernel[(1,)](psi2, c, pull, loss, n, BLOCK=_BLOCK, num_warps=8)
    except Exception as exc:  # noqa: BLE001 - a Triton that cannot build it here
        _turn_off(exc)
        return None
    return torch.view_as_complex(pull), loss[0]


def _turn_off(exc: Exception) -> None:
    global ENABLED, failed
    ENABLED, failed = False, f"{type(exc).__name__}: {exc}"
    warnings.warn(
        f"the local-energy kernels failed ({failed}); using torch's operations",
        RuntimeWarning,
        stacklevel=3,
    )


def _kernel_terms(lp, mask, hd, dst, val, rowptr, teacher=None, grad=None):
    if isinstance(lp, (tuple, list)):  # ln|psi| and phi: read with stride 1
        re, im = (t.contiguous() for t in lp)
        stride = 1
    else:  # complex128: the real and imaginary parts interleaved
        lp2 = torch.view_as_real(lp.contiguous())
        re, im, stride = lp2[:, 0], lp2[:, 1], 2
    n = re.shape[0]
    dev = re.device
    val2 = torch.view_as_real(val.contiguous())
    psi = torch.empty((n, 2), dtype=torch.float64, device=dev)
    eloc = torch.empty((n, 2), dtype=torch.float64, device=dev)
    coef = torch.empty((n, 2), dtype=torch.float64, device=dev)
    programs = triton.cdiv(n, _ROWS)
    part = torch.empty(programs, dtype=torch.float64, device=dev)
    flags = torch.empty(programs, dtype=torch.int32, device=dev)
    # normalisation, E, bad; the teacher's sum of c^2 and z (re, im)
    out = torch.empty(6, dtype=torch.float64, device=dev)
    tw, tc = teacher if teacher is not None else (out, mask)  # read only with TEACHER
    has = teacher is not None
    _psi_kernel[(1,)](re, im, stride, mask, tc, psi, out, n, BLOCK=_BLOCK, TEACHER=has, num_warps=8)
    _eloc_kernel[(programs,)](
        psi, rowptr, dst, val2, hd, mask, out, eloc, part, flags, n,
        ROWS=_ROWS, PAIRS=_PAIRS, num_warps=4,
    )  # fmt: skip
    g = grad if grad is not None else coef  # written only with GRAD
    _coef_kernel[(1,)](
        psi, mask, eloc, out, part, flags, tc, tw, coef, g, g.stride(0), n, programs,
        BLOCK=_BLOCK, PARTS=pow2(programs), TEACHER=has, GRAD=grad is not None, num_warps=8,
    )  # fmt: skip
    return (
        torch.view_as_complex(psi),
        torch.view_as_complex(coef),
        out[1],
        out[2] > 0.5,
    )


if triton is not None:

    @triton.jit
    def _finite(x):
        return (x == x) & (tl.abs(x) != float("inf"))

    @triton.jit
    def _unit(re, im):
        """(re, im) / |(re, im)|, computed without under- or overflow; (1, 0) at 0."""
        big = tl.maximum(tl.abs(re), tl.abs(im))
        ok = big > 0
        safe = tl.where(ok, big, 1.0)
        a, b = re / safe, im / safe
        r = tl.sqrt(a * a + b * b)
        return tl.where(ok, a / r, 1.0), tl.where(ok, b / r, 0.0)

    @triton.jit
    def _phase(re, im):
        """The teacher's phase factor as `cuscikit.nnqs.teacher` takes it: (re, im) / max(|.|,
        1e-300), 1 at 0 (a value below 1e-300 in size is not made a unit)."""
        big = tl.maximum(tl.abs(re), tl.abs(im))
        ok = big > 0
        safe = tl.where(ok, big, 1.0)
        a, b = re / safe, im / safe
        den = tl.maximum(big * tl.sqrt(a * a + b * b), 1e-300)
        return tl.where(ok, re / den, 1.0), tl.where(ok, im / den, 0.0)

    @triton.jit
    def _aligned(pr, pi, c, q_sum):
        """(q, u) of a row: the teacher's weight c^2 / sum c^2 and psi's phase times sign(c)."""
        ur, ui = _phase(pr, pi)
        sign = tl.where(c < 0, -1.0, 1.0)
        return c * c / q_sum, ur * sign, ui * sign

    @triton.jit
    def _pulled(pr, pi, c, q_sum, gr, gi):
        """(q, cos, sin) of a row's phase difference arg(u conj(g)) from the global phase g,
        as (Re, Im) / |.|."""
        q, ur, ui = _aligned(pr, pi, c, q_sum)
        vr, vi = _unit(ur * gr + ui * gi, ui * gr - ur * gi)
        return q, vr, vi

    @triton.jit
    def _row(psi, tc, i, ok):
        """psi (re, im) and the teacher's c of rows i."""
        pr = tl.load(psi + 2 * i, mask=ok, other=0.0)
        pi = tl.load(psi + 2 * i + 1, mask=ok, other=0.0)
        return pr, pi, tl.load(tc + i, mask=ok, other=0.0)

    @triton.jit(do_not_specialize=["n"])
    def _psi_kernel(
        lre, lim, stride, mask, tc, psi, out, n, BLOCK: tl.constexpr, TEACHER: tl.constexpr
    ):
        """One program: m = max Re lp (NaN propagates), psi = exp(lp - m), out[0] = the sum
        of |psi|^2 mask; with a teacher out[3] = sum c^2 and out[4:6] = z = sum q u. Row i
        of lp is (lre[stride i], lim[stride i]), taken as float64."""
        offs = tl.arange(0, BLOCK)
        top = tl.full((BLOCK,), float("-inf"), tl.float64)
        cc = tl.zeros((BLOCK,), tl.float64)
        for start in range(0, n, BLOCK):
            i = start + offs
            re = tl.load(lre + stride * i, mask=i < n, other=float("-inf")).to(tl.float64)
            top = tl.maximum(top, re, propagate_nan=tl.PropagateNan.ALL)
            if TEACHER:
                c = tl.load(tc + i, mask=i < n, other=0.0)
                cc += c * c
        m = tl.max(top, 0)
        m = tl.where(tl.max((top != top).to(tl.int32), 0) > 0, float("nan"), m)  # as torch's max
        q_sum = tl.sum(cc, 0)
        z = tl.zeros((BLOCK,), tl.float64)
        zr = tl.zeros((BLOCK,), tl.float64)
        zi = tl.zeros((BLOCK,), tl.float64)
        for start in range(0, n, BLOCK):
            i = start + offs
            ok = i < n
            re = tl.load(lre + stride * i, mask=ok, other=0.0).to(tl.float64)
            im = tl.load(lim + stride * i, mask=ok, other=0.0).to(tl.float64)
            a = tl.exp(re - m)
            pr = a * tl.cos(im)
            pi = a * tl.sin(im)
            tl.store(psi + 2 * i, pr, mask=ok)
            tl.store(psi + 2 * i + 1, pi, mask=ok)
            mk = tl.load(mask + i, mask=ok, other=0.0)
            z += tl.where(ok, (pr * pr + pi * pi) * mk, 0.0)
            if TEACHER:
                q, ur, ui = _aligned(pr, pi, tl.load(tc + i, mask=ok, other=0.0), q_sum)
                zr += tl.where(ok, q * ur, 0.0)
                zi += tl.where(ok, q * ui, 0.0)
        tl.store(out, tl.sum(z, 0))
        if TEACHER:
            tl.store(out + 3, q_sum)
            tl.store(out + 4, tl.sum(zr, 0))
            tl.store(out + 5, tl.sum(zi, 0))

    @triton.jit(do_not_specialize=["n"])
    def _eloc_kernel(
        psi, rowptr, dst, val, hd, mask, out, eloc, part, flags, n,
        ROWS: tl.constexpr, PAIRS: tl.constexpr,
    ):  # fmt: skip
        """ROWS rows: num = the row's pairs summed in order, E = hd + num / psi (c10's
        complex division) on the rows of S (0 on padding); part = sum w Re E over the rows,
        flags = any non-finite E."""
        pid = tl.program_id(0)
        r = pid * ROWS + tl.arange(0, ROWS)
        ok = r < n
        start = tl.load(rowptr + r, mask=ok, other=0)
        end = tl.load(rowptr + r + 1, mask=ok, other=0)
        most = tl.max(end - start, 0)
        acc_re = tl.zeros((ROWS,), tl.float64)
        acc_im = tl.zeros((ROWS,), tl.float64)
        k = tl.arange(0, PAIRS)
        for step in range(0, most, PAIRS):
            j = start[:, None] + step + k[None, :]
            mk = j < end[:, None]
            d = tl.load(dst + j, mask=mk, other=0)
            vr = tl.load(val + 2 * j, mask=mk, other=0.0)
            vi = tl.load(val + 2 * j + 1, mask=mk, other=0.0)
            pr = tl.load(psi + 2 * d, mask=mk, other=0.0)
            pi = tl.load(psi + 2 * d + 1, mask=mk, other=0.0)
            acc_re += tl.sum(vr * pr - vi * pi, 1)
            acc_im += tl.sum(vr * pi + vi * pr, 1)
        c = tl.load(psi + 2 * r, mask=ok, other=1.0)
        d = tl.load(psi + 2 * r + 1, mask=ok, other=0.0)
        # (a + ib) / (c + id) as c10::complex divides (Smith's algorithm)
        a, b = acc_re, acc_im
        wide = tl.abs(c) >= tl.abs(d)
        zero = (c == 0.0) & (d == 0.0)
        rat = tl.where(wide, d / c, c / d)
        scl = tl.where(wide, 1.0 / (c + d * rat), 1.0 / (d + c * rat))
        qr = tl.where(wide, (a + b * rat) * scl, (a * rat + b) * scl)
        qi = tl.where(wide, (b - a * rat) * scl, (b * rat - a) * scl)
        qr = tl.where(zero, a / tl.abs(c), qr)
        qi = tl.where(zero, b / tl.abs(d), qi)
        mk_row = tl.load(mask + r, mask=ok, other=0.0)
        valid = ok & (mk_row > 0)
        h = tl.load(hd + r, mask=ok, other=0.0)
        er = tl.where(valid, h + qr, 0.0)
        ei = tl.where(valid, qi, 0.0)
        tl.store(eloc + 2 * r, er, mask=ok)
        tl.store(eloc + 2 * r + 1, ei, mask=ok)
        w = (c * c + d * d) * mk_row / tl.load(out)
        tl.store(part + pid, tl.sum(tl.where(ok, w * er, 0.0), 0))
        bad = ok & ~(_finite(er) & _finite(ei))
        tl.store(flags + pid, tl.max(bad.to(tl.int32), 0))

    @triton.jit(do_not_specialize=["n", "parts", "g_stride"])
    def _coef_kernel(
        psi, mask, eloc, out, part, flags, tc, tw, coef, g, g_stride, n, parts,
        BLOCK: tl.constexpr, PARTS: tl.constexpr, TEACHER: tl.constexpr, GRAD: tl.constexpr,
    ):  # fmt: skip
        """One program: E = the parts summed in order, bad = any flag or E not finite,
        T = w (E_x - E), plus the teacher's pull; out[1] = E, out[2] = bad. With GRAD, rows
        g[0] and g[g_stride] also get 2 Re T and 2 Im T in g's dtype."""
        p = tl.arange(0, PARTS)
        e = tl.sum(tl.load(part + p, mask=p < parts, other=0.0), 0)
        bad = tl.max(tl.load(flags + p, mask=p < parts, other=0), 0)
        bad = bad | (~_finite(e)).to(tl.int32)
        z = tl.load(out)
        if TEACHER:  # the global phase: z / |z| (1 where z = 0)
            weight = tl.load(tw)
            q_sum = tl.load(out + 3)
            gr, gi = _phase(tl.load(out + 4), tl.load(out + 5))
        offs = tl.arange(0, BLOCK)
        for start in range(0, n, BLOCK):
            i = start + offs
            ok = i < n
            c = tl.load(psi + 2 * i, mask=ok, other=0.0)
            d = tl.load(psi + 2 * i + 1, mask=ok, other=0.0)
            w = (c * c + d * d) * tl.load(mask + i, mask=ok, other=0.0) / z
            er = tl.load(eloc + 2 * i, mask=ok, other=0.0)
            ei = tl.load(eloc + 2 * i + 1, mask=ok, other=0.0)
            tr = w * (er - e)
            ti = w * ei
            if TEACHER:
                t = tl.load(tc + i, mask=ok, other=0.0)
                q, _, sin = _pulled(c, d, t, q_sum, gr, gi)
                tr += weight * (w - q)
                ti += weight * (q * sin)
            tl.store(coef + 2 * i, tr, mask=ok)
            tl.store(coef + 2 * i + 1, ti, mask=ok)
            if GRAD:
                tl.store(g + i, (2.0 * tr).to(g.dtype.element_ty), mask=ok)
                tl.store(g + g_stride + i, (2.0 * ti).to(g.dtype.element_ty), mask=ok)
        tl.store(out + 1, e)
        tl.store(out + 2, bad.to(tl.float64))

    @triton.jit(do_not_specialize=["n"])
    def _pull_kernel(psi, tc, pull, loss, n, BLOCK: tl.constexpr):
        """One program: the teacher's T (as `_coef_kernel` adds it, with p = |psi|^2 / sum
        |psi|^2 over all rows) and L_T = sum_{q > 0} q (ln q - ln max(p, 1e-300)) +
        2 sum q (1 - cos(arg(u conj(g))))."""
        offs = tl.arange(0, BLOCK)
        pp = tl.zeros((BLOCK,), tl.float64)
        cc = tl.zeros((BLOCK,), tl.float64)
        for start in range(0, n, BLOCK):
            i = start + offs
            pr, pi, c = _row(psi, tc, i, i < n)
            pp += pr * pr + pi * pi
            cc += c * c
        p_sum = tl.sum(pp, 0)
        q_sum = tl.sum(cc, 0)
        zr = tl.zeros((BLOCK,), tl.float64)
        zi = tl.zeros((BLOCK,), tl.float64)
        for start in range(0, n, BLOCK):
            i = start + offs
            ok = i < n
            pr, pi, c = _row(psi, tc, i, ok)
            q, ur, ui = _aligned(pr, pi, c, q_sum)
            zr += tl.where(ok, q * ur, 0.0)
            zi += tl.where(ok, q * ui, 0.0)
        gr, gi = _phase(tl.sum(zr, 0), tl.sum(zi, 0))
        acc = tl.zeros((BLOCK,), tl.float64)
        for start in range(0, n, BLOCK):
            i = start + offs
            ok = i < n
            pr, pi, c = _row(psi, tc, i, ok)
            p = (pr * pr + pi * pi) / p_sum
            q, cos, sin = _pulled(pr, pi, c, q_sum, gr, gi)
            tl.store(pull + 2 * i, p - q, mask=ok)
            tl.store(pull + 2 * i + 1, q * sin, mask=ok)
            has = ok & (q > 0)
            kl = q * (tl.log(tl.where(has, q, 1.0)) - tl.log(tl.maximum(p, 1e-300)))
            acc += tl.where(has, kl, 0.0) + tl.where(ok, 2.0 * q * (1.0 - cos), 0.0)
        tl.store(loss, tl.sum(acc, 0))
else:  # pragma: no cover - depends on the installation
    _psi_kernel = _eloc_kernel = _coef_kernel = _pull_kernel = None
