"""The training pass's linear-layer products on the tensor cores, with float32's accuracy.

A float32 training pass over a small system's S (N2/STO-3G: 19,200 token rows of width 32 to
128 in the transformer, 1,920 rows of width 512 in the phase MLP) spends much of its time in
cuBLAS's float32 products, which run on the CUDA cores (SIMT FMAs): the phase MLP's at about a
third of the plain float32 rate, and the weight gradients ``dy^T @ x`` (a sum over all rows
into a small matrix) as split-K products with a reduction kernel and a matrix-vector product
for the bias. Here a product is one Triton kernel (`mm`) whose float32 operands are each split
into a TF32 part rounded to nearest and the TF32-rounded remainder, three tensor-core products
per 32-wide step from a zero accumulator (the low-by-high pair first), the steps added in
float32 (`cuscikit.nnqs._triton.tf32x3`): about float32's accuracy, not its rounding. A weight
gradient splits the rows over programs, each writing its partial product (and, for the bias,
its partial column sums of ``dy``), summed over the splits in a fixed order.

`cuscikit.nnqs.aside.linear` (the Ansatz's linear layers) takes these products in a float32
pass that records a gradient on a CUDA device (`applies`): by default (``ENABLED``) for every
layer, the transformer's and the phase MLP's (``MAX_WIDTH`` None; on an H100 the recorded
optimiser stage of a default N2/STO-3G iteration with the teacher took 15.2 ms against 18.9 with
cuBLAS's products and 15.8 with the kernels for the transformer's layers alone,
docs/performance.md, "products-sweep"). Float64 and inference keep torch's. A kernel that
fails to build turns them off with a warning.

Example (needs a CUDA GPU and Triton):
    >>> import torch
    >>> a = torch.randn(1920, 512, device="cuda")                       # doctest: +SKIP
    >>> w = torch.randn(512, 512, device="cuda")                        # doctest: +SKIP
    >>> c = mm(a, w.t())                                                 # doctest: +SKIP
    >>> ref = (a.double() @ w.double().t())                              # doctest: +SKIP
    >>> bool(((c - ref).abs().max() / ref.abs().max()) < 1e-6)           # doctest: +SKIP
    True
"""

from __future__ import annotations

import contextlib
import warnings

import torch

from cuscikit.nnqs._triton import gelu, gelu_grad, tf32x3, tl, training_pass, triton

__all__ = [
    "ENABLED",
    "FUSED_MLP",
    "MAX_WIDTH",
    "applies",
    "mm",
    "mm_gelu",
    "mm_gelu_grad",
    "turn_off",
    "usable",
    "weight_grad",
]

#: True: a float32 training pass's linear layers take these products (see the module).
ENABLED = True
#: A layer whose weight is wider than this (in or out) keeps torch's products (None, the
#: default: no limit). 256 takes the transformer's layers up to d_model 64 (its MLP 4 d_model
#: wide) and leaves the phase MLP's 512-wide ones to cuBLAS, which was the faster choice
#: before the gradients' launch settings of the kernel were tuned (docs/performance.md).
MAX_WIDTH: int | None = None
#: True (with ENABLED): an MLP's layers and the GELUs between them are one autograd function
#: (`cuscikit.nnqs.aside.mlp`) whose GELUs are in the products' kernels (the forward one in
#: the layer before, its derivative in the input gradient of the layer after).
FUSED_MLP = True
_failed: str | None = None  # why the kernel was turned off
_BK = 32  # the reduction's step (rows of the operands a program loads at once)
_WARPS = 4  # warps a program where B is read along the reduction (a forward: x @ w.t())
_WARPS_ROWS = 2  # ... where it is read along its rows (input and weight gradients)
_STAGES: int | None = None  # Triton's pipelining depth of the reduction's loop (None: its
# own; one stage where the reduction is a single step, which Triton's pipelining only slows)
_WG_PER_SM = 2  # a weight gradient's programs: about this many a multiprocessor
_SMS: dict = {}  # device index -> multiprocessors


def applies(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether a linear layer over ``x`` takes these products: ``ENABLED``, Triton present and
    working, a gradient being recorded, float32 ``x`` and ``weight`` on a CUDA device (any
    device under the Triton interpreter), ``weight`` no wider than ``MAX_WIDTH``, not inside
    `torch.compile`.

    Example:
        >>> applies(torch.zeros(4, 8), torch.zeros(2, 8))   # CPU tensors
        False
    """
    if not usable() or x.dtype != torch.float32 or weight.dtype != torch.float32:
        return False
    if MAX_WIDTH is not None and max(weight.shape) > MAX_WIDTH:
        return False
    return training_pass(x)


def usable() -> bool:
    """Whether the kernel may run (``ENABLED``, Triton present, not turned off): a backward
    pass, which records no gradient itself, checks this for products its forward took."""
    return ENABLED and triton is not None and _failed is None


def turn_off(exc: Exception) -> None:
    """A kernel failed to build or run: torch's products from now on, with one warning."""
    global _failed
    _failed = f"{type(exc).__name__}: {exc}"
    warnings.warn(
        f"the tensor-core products failed ({_failed}); using torch's", RuntimeWarning, stacklevel=3
    )


if triton is not None:

    @triton.jit
    def _mm_kernel(
        a_ptr,
        b_ptr,
        c_ptr,
        bias_ptr,
        sums_ptr,
        u_ptr,
        M,
        N,
        K,
        k_split,
        split,
        sam,
        sak,
        sbk,
        sbn,
        HAS_BIAS: tl.constexpr,
        SUMS: tl.constexpr,
        ACT: tl.constexpr,
        BM: tl.constexpr,
        BN: tl.constexpr,
        BK: tl.constexpr,
    ):
        """Split s (third grid axis) of C = A @ B: A (M, K) and B (K, N) by their strides, the
        reduction over s's slice [s k_split, (s + 1) k_split) of K, written to the contiguous
        (M, N) at c_ptr + s split, plus ``bias`` (N,) with HAS_BIAS. With SUMS the programs of
        the first column tile also write A's row sums over the slice to sums_ptr + s split (M,).
        ACT (one split): 0 C as it is; 1 (a layer and its GELU) the sum u to u_ptr (M, N) and
        gelu(u) to C; 2 (an input gradient through the GELU before it) C times gelu'(u), u read
        from u_ptr."""
        pm = tl.program_id(0)
        pn = tl.program_id(1)
        ps = tl.program_id(2)
        rm = pm * BM + tl.arange(0, BM)
        rn = pn * BN + tl.arange(0, BN)
        in_m = rm < M
        in_n = rn < N
        k_lo = ps * k_split
        k_hi = tl.minimum(K, k_lo + k_split)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        sums = tl.zeros((BM,), dtype=tl.float32)
        for k0 in range(k_lo, k_hi, BK):
            rk = k0 + tl.arange(0, BK)
            in_k = rk < k_hi
            a = tl.load(
                a_ptr + rm[:, None] * sam + rk[None, :] * sak,
                mask=in_m[:, None] & in_k[None, :],
                other=0.0,
            )
            b = tl.load(
                b_ptr + rk[:, None] * sbk + rn[None, :] * sbn,
                mask=in_k[:, None] & in_n[None, :],
                other=0.0,
            )
            acc += tf32x3(a, b)
            if SUMS:
                sums += tl.sum(a, axis=1)
        if HAS_BIAS:
            acc += tl.load(bias_ptr + rn, mask=in_n, other=0.0)[None, :]
        at = rm[:, None] * N + rn[None, :]
        inside = in_m[:, None] & in_n[None, :]
        if ACT == 1:
            tl.store(u_ptr + at, acc, mask=inside)
            acc = gelu(acc)
        if ACT == 2:
            acc = acc * gelu_grad(tl.load(u_ptr + at, mask=inside, other=0.0))
        tl.store(c_ptr + ps * split + at, acc, mask=inside)
        if SUMS:
            if pn == 0:
                tl.store(sums_ptr + ps * split + rm, sums, mask=in_m)


def _tile(n: int) -> int:
    """A tile side for n rows or columns: 64 where it divides n (or n is large), else the
    smallest of 16/32 that covers n's remainder well (Triton's products need 16 or more)."""
    if n % 64 == 0 or n > 256:
        return 64
    return 32 if n % 32 == 0 or n > 16 else 16


def _stages(k_split: int) -> dict:
    """Triton's pipelining depth for a reduction of k_split (as a launch keyword, or none)."""
    if _STAGES is not None:
        return {"num_stages": _STAGES}
    return {"num_stages": 1} if k_split <= _BK else {}


def _sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 8
    key = device.index if device.index is not None else torch.cuda.current_device()
    if key not in _SMS:
        _SMS[key] = torch.cuda.get_device_properties(key).multi_processor_count
    return _SMS[key]


def _launch(a, b, bias, splits: int, sums: bool, act: int = 0, u=None):
    """(C over its splits (splits, M, N), A's row sums over the splits (splits, M) or None,
    the buffer (splits, M N (+ M)) both are views of: each split's products followed by its
    sums, so that one reduction over the splits sums both); ``act`` and ``u`` as the kernel's
    ACT (one split)."""
    m, k = a.shape
    n = b.shape[1]
    bm, bn = _tile(m), _tile(n)
    k_split = -(-k // splits)
    k_split = -(-k_split // _BK) * _BK
    splits = -(-k // k_split) if k else 1
    width = m * n + (m if sums else 0)
    buf = a.new_empty((splits, width))
    c, s = buf[:, : m * n].view(splits, m, n), buf[:, m * n :]
    grid = (-(-m // bm), -(-n // bn), splits)
    dev = torch.cuda.device(a.device) if a.is_cuda else contextlib.nullcontext()
    with dev:
        _mm_kernel[grid](
            a,
            b,
            buf,
            bias if bias is not None else buf,
            s if sums else buf,
            u if u is not None else buf,
            m,
            n,
            k,
            k_split,
            width,
            a.stride(0),
            a.stride(1),
            b.stride(0),
            b.stride(1),
            HAS_BIAS=bias is not None,
            SUMS=sums,
            ACT=act,
            BM=bm,
            BN=bn,
            BK=_BK,
            num_warps=_WARPS if b.stride(0) == 1 else _WARPS_ROWS,
            **_stages(k_split),
        )
    return c, (s if sums else None), buf


def mm(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``a @ b (+ bias)`` for float32 ``a`` (M, K) and ``b`` (K, N) of any strides (a
    transposed view costs nothing) in one kernel: three TF32 products per 32-wide step (see
    the module), one program per 64 x 64 (or narrower) tile of the result."""
    _check(a, b)
    return _launch(a, b, bias, 1, False)[0][0]


def mm_gelu(
    a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(u, gelu(u))`` for u = ``a @ b (+ bias)`` (as `mm`), the GELU applied as the kernel
    writes (torch's exact GELU, `cuscikit.nnqs._triton.gelu`)."""
    _check(a, b)
    u = a.new_empty((a.shape[0], b.shape[1]))
    return u, _launch(a, b, bias, 1, False, act=1, u=u)[0][0]


def mm_gelu_grad(a: torch.Tensor, b: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """``(a @ b) * gelu'(u)`` (as `mm`): the input gradient of a layer whose input was
    gelu(u), taken back through the GELU as the kernel writes. ``u`` contiguous (M, N)."""
    _check(a, b)
    if u.shape != (a.shape[0], b.shape[1]) or not u.is_contiguous():
        raise ValueError(f"u must be contiguous {(a.shape[0], b.shape[1])}, got {tuple(u.shape)}")
    return _launch(a, b, None, 1, False, act=2, u=u)[0][0]


def weight_grad(
    dy: torch.Tensor, x: torch.Tensor, bias: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A linear layer's ``(dy^T @ x, dy.sum(0) or None)`` for float32 ``dy`` (rows, out) and
    ``x`` (rows, in): the rows split over about ``_WG_PER_SM`` (2) programs a multiprocessor,
    each split's partial product (and with ``bias`` its partial column sums of dy, from the same
    loads) written apart and summed over the splits in a fixed order."""
    _check(dy.t(), x)
    rows = x.shape[0]
    tiles = -(-dy.shape[1] // _tile(dy.shape[1])) * -(-x.shape[1] // _tile(x.shape[1]))
    splits = max(1, min(-(-rows // (4 * _BK)), (_WG_PER_SM * _sms(x.device)) // tiles))
    c, s, buf = _launch(dy.t(), x, None, splits, bias)
    if c.shape[0] == 1:
        return c[0], (None if s is None else s[0])
    out, mn = c.shape[1], c.shape[1] * c.shape[2]
    total = buf.sum(0)  # the products' and the sums' splits in one reduction
    return total[:mn].view(out, c.shape[2]), (None if s is None else total[mn:])


def _check(a: torch.Tensor, b: torch.Tensor) -> None:
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"mm needs (M, K) @ (K, N), got {tuple(a.shape)} @ {tuple(b.shape)}")
    if a.dtype != torch.float32 or b.dtype != torch.float32:
        raise ValueError(f"mm takes float32 operands, got {a.dtype} and {b.dtype}")
    if max(a.numel(), b.numel(), a.shape[0] * b.shape[1]) >= 2**31:
        raise ValueError("mm indexes with 32-bit offsets: operands under 2**31 elements")
