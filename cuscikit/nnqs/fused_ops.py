"""Triton forward and backward kernels for the training pass of a small `Ansatz`.

On a small system (N2/STO-3G: 1,920 configurations of 10 orbitals, d_model 32) a forward and
backward pass over S is tens of thousands of rows of width 32, and torch's general kernels are
made for wider rows: LayerNorm's weight and bias gradients run as one thread block for the
whole batch (about 50 us a call on an H200), its forward as one block per row, and the
attention products of 10 x 10 per head as batched cuBLAS GEMVs of tens of microseconds. This
module gives three autograd functions with one Triton kernel each way:

- `layer_norm`: a program normalises a tile of rows; the backward writes the input gradient
  and one row of partial weight/bias sums per program, summed by one reduction (a fixed order:
  the result does not depend on scheduling).
- `causal_attention`: softmax(q k^T / sqrt(hd), causal) v of every head, read straight from the
  ``qkv`` projection (n, L, 3d) and written as (n, L, d) (no transposes), in one of two kernel
  pairs:

  - row-wise (float32's default; ``_ATTN_ROWS[dtype]`` = (rows, warps) a program): a row is
    one position of one head of one sequence, its head's columns in registers (loaded as
    vectors). The forward walks the keys of the row's sequence one position after another
    (the largest score, then the exponentials and the weighted values); the backward walks
    them twice: the row as a query (dq over the keys before it, the probabilities from the
    saved log-sum-exp), then as a key (dk and dv over the queries after it). A score
    is the same sum of the same products in every place it is formed. Nothing is padded: at
    N2/STO-3G's shapes (10 positions, heads of 8) the tile kernels pad both to 16, about 5
    times the products of the 10 x 10 scores.
  - tiles (float64's default: a dtype not in ``_ATTN_ROWS``): a program takes one head of one
    sequence (the grid: sequences x heads; `_ATTN_HEADS` > 1 takes several heads one after
    another) as matrices (positions, head width), both padded to powers of two of at least
    16, and forms the whole score matrix with matrix products (float32 FMAs, no TF32; float64
    products in float64); the backward recomputes the probabilities from the saved
    log-sum-exp and takes the gradients of q, k and v as five such products. Both kernels take
    their offsets and masks from one helper, `_attn_rows` (the row-wise ones from
    `_attn_row_at`).
- `amplitude_tail`: the amplitude's tail after the last block (ln_f, the head, the logit
  offsets, the masked log-softmax, the pick of each position's token and the sum over
  positions) in one kernel each way (``TAIL_ENABLED``), with the head code of the
  whole-amplitude kernels below; the backward kernel writes the last block's input gradient
  and a row of partial parameter gradients per program.

The arithmetic is that of `torch.nn.functional.layer_norm` and of the written-out attention in
`cuscikit.nnqs.ansatz` (same formulas, other summation orders): float64 agrees to rounding
(the tests: 1e-12 against torch), float32 to float32 rounding. The Ansatz uses them when a
pass keeps an autograd graph on a CUDA device with Triton installed (`active`); inference
(no gradient) keeps torch's kernels. ``ENABLED = False`` turns them off (benchmarks compare
both); a kernel that fails to build turns them off with a warning.

Two coarser paths take a whole block (`block`, ``BLOCK_ENABLED``) or the whole ln|psi|
(`amplitude`, ``AMPLITUDE_ENABLED``) as one kernel each way, for a pass whose cost would be its
number of kernels. They are off by default: on an H100 they cut the kernels of a pass from 368
to 233 and 141 and made it slower (docs/performance.md, "#fused-block-gpu").
``COARSE_PRODUCTS = "tf32x3"`` runs their float32 products on the tensor cores.

Example (needs a CUDA GPU and Triton):
    >>> import torch
    >>> x = torch.randn(100, 32, device="cuda", requires_grad=True)     # doctest: +SKIP
    >>> w, b = torch.ones(32, device="cuda"), torch.zeros(32, device="cuda")  # doctest: +SKIP
    >>> y = layer_norm(x, w, b, 1e-5)                                    # doctest: +SKIP
    >>> bool((y - torch.nn.functional.layer_norm(x, (32,))).abs().max() < 1e-5)  # doctest: +SKIP
    True
"""

from __future__ import annotations

import contextlib
import math
import struct
import warnings

import torch

from cuscikit.nnqs import aside
from cuscikit.nnqs._triton import (
    gelu,
    gelu_grad,
    pow2,
    tf32x3,
    tl,
    training_pass,
    triton,
)

__all__ = [
    "ADD_NORM_ENABLED",
    "AMPLITUDE_ENABLED",
    "BLOCK_ENABLED",
    "COARSE_PRODUCTS",
    "ENABLED",
    "TAIL_ENABLED",
    "active",
    "add_layer_norm",
    "amplitude",
    "amplitude_tail",
    "block",
    "causal_attention",
    "layer_norm",
]

#: False: the Ansatz keeps torch's kernels everywhere.
ENABLED = True
_MAX_WIDTH = 1024  # widest LayerNorm row in one tile
_MAX_LENGTH = 32  # longest sequence of the attention kernels (a program holds the whole score
# matrix; longer sequences keep torch's kernels)
_MAX_HEAD = 64  # widest head
_ROW_TILE = 2048  # elements of a LayerNorm tile
_ATTN_WARPS = 1  # warps per attention program (an H200: the N2/cc-pVDZ training pass, 28
# positions, 1.71 us a configuration at 1 warp, 1.88 at 2, 1.86 at 4, with torch's attention
# 2.36; N2/STO-3G's calls equal within the launch time; `small_iteration.py --kernels` and
# tools/profile_large_iteration.py time 1/2/4)
# heads an attention program takes one after another (0: all of them): one program per
# sequence and head (1) or per sequence (0), each head's loads and products as before
_ATTN_HEADS = 1
# (rows, warps) of a row-wise attention program (`_attn_row_fwd_kernel`: a row is one
# sequence's position of one head) by dtype; a dtype not here takes the tile kernels
# (`_attn_fwd_kernel`, one sequence's head a program, positions and head padded to 16). On an
# H100 the row-wise kernels replayed a float32 N2/STO-3G stage with the teacher in 18.73 ms
# against 20.87 with the tiles, and made float64's stage slower (27.75 against 26.25 ms), so
# float64 keeps the tiles (docs/performance.md, "#row-attention").
_ATTN_ROWS: dict = {torch.float32: (64, 2)}
_MAX_ELEMENTS = 2**31  # the kernels index with 32-bit offsets
_failed: str | None = None  # why the kernels were turned off
_coarse_failed: str | None = None  # why `block` and `amplitude` were turned off
#: True: a training pass runs each supported transformer block as one kernel each way
#: (`block`) instead of the LayerNorm and attention kernels inside torch's block.
BLOCK_ENABLED = False
#: True: a training pass runs ln|psi| (embeddings, every block, the head and the masked
#: log-softmax) as one kernel each way (`amplitude`); it takes precedence over BLOCK_ENABLED.
AMPLITUDE_ENABLED = False
# Rows (sequences x padded positions) and warps of a block or amplitude kernel's program, by
# product code (`_prec`). Compiled for sm_90 (tools/fused_kernel_resources.py, d_model 32, 10
# positions, float32): at 64 rows the FMA backward kernels spill about 1 KB a thread with 4
# warps and 16-24 bytes with 8. The three-TF32 products run programs of one sequence: they
# spill nothing at 16 rows and 4 warps, and on an H100 (Triton of torch 2.11) the amplitude
# kernels with them at 64 rows and 8 warps stopped with an illegal memory access.
_TILES = {0: (64, 8), 1: (64, 8), 2: (16, 4)}
# one pipeline stage: the layer loops' loads are not multi-buffered (three stages put the
# whole-amplitude backward kernel over the shared memory of an H100/H200 block)
_LAUNCH_STAGES = 1
#: The float32 products of the `block` and `amplitude` kernels: "ieee" (FMAs, as torch's
#: float32 products) or "tf32x3" (each operand split into two TF32 parts, three products on
#: the tensor cores; float32-like accuracy, not torch's rounding). Float64 is unaffected.
COARSE_PRODUCTS = "ieee"
_POISON = False  # tests: partial-gradient rows start as NaN (`_part_rows`)
#: True (default): in a training pass that takes these kernels, each residual sum of the
#: transformer that a LayerNorm reads is that LayerNorm's kernel's (`add_layer_norm`, through
#: `Ansatz._chain`), both ways.
ADD_NORM_ENABLED = True
#: True (default): a training pass runs the amplitude's tail (ln_f, the head and the masked
#: log-softmax, summed over positions) as one kernel each way (`amplitude_tail`).
TAIL_ENABLED = True
_TAIL_ROWS = 64  # rows (sequences x padded positions) of a tail program
_TAIL_WARPS = 4
_tail_failed: str | None = None  # why `amplitude_tail` was turned off


def active(x: torch.Tensor) -> bool:
    """Whether the Ansatz's pass over ``x`` takes these kernels: enabled, Triton present, a
    gradient being recorded, float32/float64 on a CUDA device (any device under the Triton
    interpreter), not inside `torch.compile`.

    Example:
        >>> active(torch.zeros(3, requires_grad=True))   # a CPU tensor
        False
    """
    if not ENABLED or _failed is not None or x.dtype not in (torch.float32, torch.float64):
        return False
    return training_pass(x)


def _turn_off(exc: Exception, part: str = "all") -> None:
    """A kernel failed to build or run: ``part`` "coarse" (a `block` or `amplitude` kernel)
    turns those two paths off, "tail" `amplitude_tail`; the LayerNorm and attention kernels
    stay. "all" turns every kernel off. Warns once with the reason, kept in the part's flag."""
    global _failed, _coarse_failed, _tail_failed
    why = f"{type(exc).__name__}: {exc}"
    if part == "coarse":
        _coarse_failed = why
        what = "the fused block/amplitude kernels failed ({}); using the module's pass"
    elif part == "tail":
        _tail_failed = why
        what = "the fused amplitude tail failed ({}); using the module's tail"
    else:
        _failed = why
        what = "the Triton training kernels failed ({}); using torch's kernels"
    warnings.warn(what.format(why), RuntimeWarning, stacklevel=3)


# ------------------------------------------------------------------------------- kernels
if triton is not None:

    @triton.jit(do_not_specialize=["m"])
    def _ln_fwd_kernel(
        x_ptr,
        r_ptr,
        s_ptr,
        w_ptr,
        b_ptr,
        y_ptr,
        mean_ptr,
        rstd_ptr,
        m,
        eps_hi,
        eps_lo,
        D: tl.constexpr,
        DP: tl.constexpr,
        BLOCK: tl.constexpr,
        PREC: tl.constexpr,
        ADD: tl.constexpr,
    ):
        """y = LayerNorm(x) over rows of D; with ADD, of the residual sum s = x + r, stored
        at s_ptr (one rounding, as torch's addition)."""
        rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        cols = tl.arange(0, DP)
        rmask = rows < m
        cmask = cols < D
        mask = rmask[:, None] & cmask[None, :]
        offs = rows[:, None] * D + cols[None, :]
        x = tl.load(x_ptr + offs, mask=mask, other=0.0)
        if ADD:
            x = x + tl.load(r_ptr + offs, mask=mask, other=0.0)
            tl.store(s_ptr + offs, x, mask=mask)
        mean = tl.sum(x, 1) / D
        xc = tl.where(mask, x - mean[:, None], 0.0)
        var = tl.sum(xc * xc, 1) / D
        if PREC == 1:  # float64 plus the two float32 parts of eps
            rstd = 1.0 / tl.sqrt(var + eps_hi + eps_lo)
        else:
            rstd = 1.0 / tl.sqrt_rn(var + eps_hi)  # IEEE rounding, as torch's float32 kernel
        w = tl.load(w_ptr + cols, mask=cmask, other=0.0)
        b = tl.load(b_ptr + cols, mask=cmask, other=0.0)
        tl.store(y_ptr + offs, xc * rstd[:, None] * w[None, :] + b[None, :], mask=mask)
        tl.store(mean_ptr + rows, mean, mask=rmask)
        tl.store(rstd_ptr + rows, rstd, mask=rmask)

    @triton.jit(do_not_specialize=["m"])
    def _ln_bwd_kernel(
        dy_ptr,
        x_ptr,
        w_ptr,
        mean_ptr,
        rstd_ptr,
        ds_ptr,
        dx_ptr,
        part_ptr,
        m,
        D: tl.constexpr,
        DP: tl.constexpr,
        BLOCK: tl.constexpr,
        ACC: tl.constexpr,
    ):
        """The input gradient of `_ln_fwd_kernel` (with ACC, plus the gradient ds_ptr that
        reaches its input by another way: a residual sum's) and one row of partial weight and
        bias gradients per program."""
        pid = tl.program_id(0)
        rows = pid * BLOCK + tl.arange(0, BLOCK)
        cols = tl.arange(0, DP)
        rmask = rows < m
        cmask = cols < D
        mask = rmask[:, None] & cmask[None, :]
        offs = rows[:, None] * D + cols[None, :]
        x = tl.load(x_ptr + offs, mask=mask, other=0.0)
        dy = tl.load(dy_ptr + offs, mask=mask, other=0.0)
        mean = tl.load(mean_ptr + rows, mask=rmask, other=0.0)
        rstd = tl.load(rstd_ptr + rows, mask=rmask, other=0.0)
        w = tl.load(w_ptr + cols, mask=cmask, other=0.0)
        xhat = tl.where(mask, (x - mean[:, None]) * rstd[:, None], 0.0)
        g = dy * w[None, :]
        c1 = tl.sum(xhat * g, 1) / D
        c2 = tl.sum(g, 1) / D
        dx = (g - xhat * c1[:, None] - c2[:, None]) * rstd[:, None]
        if ACC:
            dx = dx + tl.load(ds_ptr + offs, mask=mask, other=0.0)
        tl.store(dx_ptr + offs, dx, mask=mask)
        # this program's rows of the weight and bias gradients: row pid of (programs, 2, DP)
        tl.store(part_ptr + pid * 2 * DP + cols, tl.sum(dy * xhat, 0))
        tl.store(part_ptr + pid * 2 * DP + DP + cols, tl.sum(dy, 0))

    @triton.jit
    def _scaled(x, hi, lo, PREC: tl.constexpr):
        """x times a scale given as float32 parts (see `_split`)."""
        if PREC == 1:
            return x * hi + x * lo
        else:
            return x * hi

    @triton.jit
    def _attn_rows(
        h, L: tl.constexpr, LP: tl.constexpr, H: tl.constexpr, HD: tl.constexpr, HDP: tl.constexpr
    ):
        """The tile of head ``h`` of sequence ``program_id(0)`` in either attention kernel
        (a program takes HG heads: ``h`` is ``program_id(1) HG`` plus one of them). Offsets
        of its queries in ``qkv`` (LP, HDP; keys ``d`` further, values ``2 d``), of its rows
        in ``y`` (same shape), of its log-sum-exps (LP,), with their masks, and the causal
        mask (LP, LP): query i sees keys j <= i."""
        d = H * HD
        seq = tl.program_id(0).to(tl.int64)
        pos = tl.arange(0, LP)
        col = tl.arange(0, HDP)
        pmask = pos < L
        mask2 = pmask[:, None] & (col < HD)[None, :]
        q_at = seq * (L * 3 * d) + pos[:, None] * (3 * d) + h * HD + col[None, :]
        y_at = seq * (L * d) + pos[:, None] * d + h * HD + col[None, :]
        lse_at = (seq * H + h) * L + pos
        seen = (pos[:, None] >= pos[None, :]) & pmask[:, None]
        return mask2, pmask, q_at, y_at, lse_at, seen

    @triton.jit
    def _mm(a, b, PREC: tl.constexpr):
        """a @ b in the kernels' product code PREC (`_prec`): 1, float64 products (rounded to
        nearest); 0, float32 FMAs (no TF32); 2, float32 as three TF32 products on the tensor
        cores (`tf32x3`; the block and amplitude kernels under ``COARSE_PRODUCTS =
        "tf32x3"``)."""
        if PREC == 1:
            return tl.dot(a, b)
        elif PREC == 2:
            return tf32x3(a, b)
        else:
            return tl.dot(a, b, input_precision="ieee")

    @triton.jit
    def _attn_fwd_kernel(
        qkv_ptr,
        y_ptr,
        lse_ptr,
        scale_hi,
        scale_lo,
        L: tl.constexpr,
        LP: tl.constexpr,
        H: tl.constexpr,
        HD: tl.constexpr,
        HDP: tl.constexpr,
        PREC: tl.constexpr,
        HG: tl.constexpr,
    ):
        d = H * HD
        for hh in tl.static_range(HG):
            h = tl.program_id(1) * HG + hh
            mask2, pmask, q_at, y_at, lse_at, seen = _attn_rows(h, L, LP, H, HD, HDP)
            q = tl.load(qkv_ptr + q_at, mask=mask2, other=0.0)
            q = _scaled(q, scale_hi, scale_lo, PREC)
            k = tl.load(qkv_ptr + q_at + d, mask=mask2, other=0.0)
            v = tl.load(qkv_ptr + q_at + 2 * d, mask=mask2, other=0.0)
            s = tl.where(seen, _mm(q, tl.trans(k), PREC), float("-inf"))
            s = tl.where(pmask[:, None], s, 0.0)  # padded query rows: finite, never stored
            m = tl.max(s, 1)
            p = tl.exp(s - m[:, None])
            l_sum = tl.sum(p, 1)
            y = _mm(p, v, PREC) / l_sum[:, None]
            tl.store(y_ptr + y_at, y, mask=mask2)
            tl.store(lse_ptr + lse_at, m + tl.log(l_sum), mask=pmask)

    @triton.jit
    def _attn_bwd_kernel(
        qkv_ptr,
        y_ptr,
        dy_ptr,
        lse_ptr,
        dqkv_ptr,
        scale_hi,
        scale_lo,
        L: tl.constexpr,
        LP: tl.constexpr,
        H: tl.constexpr,
        HD: tl.constexpr,
        HDP: tl.constexpr,
        PREC: tl.constexpr,
        HG: tl.constexpr,
    ):
        d = H * HD
        for hh in tl.static_range(HG):
            h = tl.program_id(1) * HG + hh
            mask2, pmask, q_at, y_at, lse_at, seen = _attn_rows(h, L, LP, H, HD, HDP)
            q = tl.load(qkv_ptr + q_at, mask=mask2, other=0.0)
            k = tl.load(qkv_ptr + q_at + d, mask=mask2, other=0.0)
            v = tl.load(qkv_ptr + q_at + 2 * d, mask=mask2, other=0.0)
            dy = tl.load(dy_ptr + y_at, mask=mask2, other=0.0)
            y = tl.load(y_ptr + y_at, mask=mask2, other=0.0)
            lse = tl.load(lse_ptr + lse_at, mask=pmask, other=0.0)
            delta = tl.sum(dy * y, 1)  # sum_j p_ij dp_ij = dy_i . y_i
            s = _mm(_scaled(q, scale_hi, scale_lo, PREC), tl.trans(k), PREC)
            p = tl.where(seen, tl.exp(s - lse[:, None]), 0.0)
            ds = p * (_mm(dy, tl.trans(v), PREC) - delta[:, None])
            dq = _mm(ds, k, PREC)
            dk = _mm(tl.trans(ds), q, PREC)
            dv = _mm(tl.trans(p), dy, PREC)
            tl.store(dqkv_ptr + q_at, _scaled(dq, scale_hi, scale_lo, PREC), mask=mask2)
            tl.store(dqkv_ptr + q_at + d, _scaled(dk, scale_hi, scale_lo, PREC), mask=mask2)
            tl.store(dqkv_ptr + q_at + 2 * d, dv, mask=mask2)

    @triton.jit
    def _row_load(at, cm, FULL: tl.constexpr):
        """The (rows, HDP) tile at pointers ``at``, its columns past the head's (``cm`` false)
        zero; without a mask when the head fills the tile (FULL)."""
        if FULL:
            x = tl.load(at)
        else:
            x = tl.load(at, mask=cm[None, :], other=0.0)
        return x

    @triton.jit
    def _attn_row_at(
        rows,
        R: tl.constexpr,
        L: tl.constexpr,
        H: tl.constexpr,
        HD: tl.constexpr,
        HDP: tl.constexpr,
        A: tl.constexpr,
    ):
        """The R rows of a row-wise attention program: a row is one (sequence, position, head),
        the head fastest (so a program's own rows lie side by side in ``qkv`` and ``y``). Past
        the last row a program reads the last row again and stores nothing. Returns the rows'
        sequence offsets in ``qkv`` (R,) (plus ``t 3 d`` for position t) and in ``y``, their
        positions, their offsets of log-sum-exp in ``lse`` (n, H, L) less their position, the
        head's columns (HDP,), their mask (HDP,), and the rows' store mask (R,)."""
        d = H * HD
        r = tl.program_id(0) * R + tl.arange(0, R)  # 32-bit: the tensors hold < 2^31 elements
        ok = r < rows
        r = tl.minimum(r, rows - 1)
        head = r % H
        pos = (r // H) % L
        seq = r // (H * L)
        col = tl.arange(0, HDP)
        # a head's columns start at a multiple of A (the largest power of two dividing HD): the
        # loads of a row go in vectors
        return (
            tl.multiple_of(seq * (L * 3 * d) + head * HD, A),
            tl.multiple_of(seq * (L * d) + head * HD, A),
            pos,
            (seq * H + head) * L,
            col,
            col < HD,
            ok,
        )

    @triton.jit
    def _attn_row_fwd_kernel(
        qkv_ptr,
        y_ptr,
        lse_ptr,
        rows,
        scale_hi,
        scale_lo,
        L: tl.constexpr,
        H: tl.constexpr,
        HD: tl.constexpr,
        HDP: tl.constexpr,
        PREC: tl.constexpr,
        R: tl.constexpr,
        A: tl.constexpr,
        full: tl.constexpr,
    ):
        """Row-wise causal attention: each row (`_attn_row_at`) holds its query and walks the
        keys of its sequence one position after another (products as sums over the head's
        columns, no padding of the positions or the head to a tensor-core tile)."""
        d = H * HD
        qa, ya, pos, la, col, cm, ok = _attn_row_at(rows, R, L, H, HD, HDP, A)
        q = _row_load(qkv_ptr + (qa + pos * (3 * d))[:, None] + col[None, :], cm, full)
        q = _scaled(q, scale_hi, scale_lo, PREC)
        m = tl.full(pos.shape, float("-inf"), q.dtype)
        for t in range(L):  # the largest score over keys t <= pos
            k = _row_load(qkv_ptr + (qa + t * (3 * d) + d)[:, None] + col[None, :], cm, full)
            m = tl.maximum(m, tl.where(t <= pos, tl.sum(q * k, 1), float("-inf")))
        l_sum = tl.zeros(pos.shape, q.dtype)
        acc = tl.zeros(q.shape, q.dtype)
        for t in range(L):
            at = qkv_ptr + (qa + t * (3 * d))[:, None] + col[None, :]
            k = _row_load(at + d, cm, full)
            v = _row_load(at + 2 * d, cm, full)
            p = tl.where(t <= pos, tl.exp(tl.sum(q * k, 1) - m), 0.0)
            l_sum += p
            acc += p[:, None] * v
        y = acc / l_sum[:, None]
        tl.store(y_ptr + (ya + pos * d)[:, None] + col[None, :], y, mask=ok[:, None] & cm[None, :])
        tl.store(lse_ptr + la + pos, m + tl.log(l_sum), mask=ok)

    @triton.jit
    def _attn_row_bwd_kernel(
        qkv_ptr,
        y_ptr,
        dy_ptr,
        lse_ptr,
        dqkv_ptr,
        rows,
        scale_hi,
        scale_lo,
        L: tl.constexpr,
        H: tl.constexpr,
        HD: tl.constexpr,
        HDP: tl.constexpr,
        PREC: tl.constexpr,
        R: tl.constexpr,
        A: tl.constexpr,
        full: tl.constexpr,
    ):
        """The gradient of `_attn_row_fwd_kernel`: each row is a query (its dq, over the keys
        t <= pos) and a key (its dk and dv, over the queries t >= pos); a score is the same
        sum of the same products in both roles and in the forward kernel."""
        d = H * HD
        qa, ya, pos, la, col, cm, ok = _attn_row_at(rows, R, L, H, HD, HDP, A)
        own = (qa + pos * (3 * d))[:, None] + col[None, :]
        q = _scaled(_row_load(qkv_ptr + own, cm, full), scale_hi, scale_lo, PREC)
        k = _row_load(qkv_ptr + own + d, cm, full)
        v = _row_load(qkv_ptr + own + 2 * d, cm, full)
        yo = (ya + pos * d)[:, None] + col[None, :]
        dy = _row_load(dy_ptr + yo, cm, full)
        delta = tl.sum(dy * _row_load(y_ptr + yo, cm, full), 1)
        lse = tl.load(lse_ptr + la + pos)
        dq = tl.zeros(q.shape, q.dtype)
        for t in range(L):  # as a query: keys t <= pos
            at = (qa + t * (3 * d))[:, None] + col[None, :]
            kt = _row_load(qkv_ptr + at + d, cm, full)
            vt = _row_load(qkv_ptr + at + 2 * d, cm, full)
            p = tl.where(t <= pos, tl.exp(tl.sum(q * kt, 1) - lse), 0.0)
            dq += (p * (tl.sum(dy * vt, 1) - delta))[:, None] * kt
        st = ok[:, None] & cm[None, :]
        tl.store(dqkv_ptr + own, _scaled(dq, scale_hi, scale_lo, PREC), mask=st)
        dk = tl.zeros(q.shape, q.dtype)
        dv = tl.zeros(q.shape, q.dtype)
        for t in range(L):  # as a key: queries t >= pos
            qt = _row_load(qkv_ptr + (qa + t * (3 * d))[:, None] + col[None, :], cm, full)
            qt = _scaled(qt, scale_hi, scale_lo, PREC)
            yt = (ya + t * d)[:, None] + col[None, :]
            dyt = _row_load(dy_ptr + yt, cm, full)
            delta_t = tl.sum(dyt * _row_load(y_ptr + yt, cm, full), 1)
            pt = tl.where(t >= pos, tl.exp(tl.sum(qt * k, 1) - tl.load(lse_ptr + la + t)), 0.0)
            dv += pt[:, None] * dyt
            dk += (pt * (tl.sum(dyt * v, 1) - delta_t))[:, None] * qt
        tl.store(dqkv_ptr + own + d, dk, mask=st)
        tl.store(dqkv_ptr + own + 2 * d, dv, mask=st)

    # ------------------------------------------------------------------ whole blocks
    # A block's parameters lie flat at one pointer, in the module's order (`_layer_ptrs`); a
    # program takes BN whole sequences of LP (padded) positions, R = BN * LP rows in registers.
    @triton.jit
    def _layer_ptrs(w, D: tl.constexpr, FF: tl.constexpr):
        """Pointers to ln1 (w, b), qkv (W, b), the attention's proj (W, b), ln2 (w, b), fc
        (W, b) and the MLP's proj (W, b) in a flat block at w (torch Linear layout (out, in))."""
        ln1b = w + D
        qkvw = w + 2 * D
        qkvb = qkvw + 3 * D * D
        aow = qkvb + 3 * D
        aob = aow + D * D
        ln2w = aob + D
        ln2b = ln2w + D
        fcw = ln2b + D
        fcb = fcw + FF * D
        prw = fcb + FF
        prb = prw + D * FF
        return w, ln1b, qkvw, qkvb, aow, aob, ln2w, ln2b, fcw, fcb, prw, prb

    @triton.jit
    def _blk_ln(h, w_ptr, b_ptr, c, eps_hi, eps_lo, D: tl.constexpr, PREC: tl.constexpr):
        """LayerNorm of the rows of h (R, D): (y, xhat, rstd)."""
        mean = tl.sum(h, 1) / D
        xc = h - mean[:, None]
        var = tl.sum(xc * xc, 1) / D
        if PREC == 1:
            rstd = 1.0 / tl.sqrt(var + eps_hi + eps_lo)
        else:
            rstd = 1.0 / tl.sqrt_rn(var + eps_hi)
        xhat = xc * rstd[:, None]
        return xhat * tl.load(w_ptr + c)[None, :] + tl.load(b_ptr + c)[None, :], xhat, rstd

    @triton.jit
    def _blk_ln_bwd(dy, xhat, rstd, w_ptr, c, D: tl.constexpr):
        """The input gradient of `_blk_ln` for the output gradient dy."""
        g = dy * tl.load(w_ptr + c)[None, :]
        c1 = tl.sum(xhat * g, 1) / D
        c2 = tl.sum(g, 1) / D
        return (g - xhat * c1[:, None] - c2[:, None]) * rstd[:, None]

    @triton.jit
    def _blk_wt(w_ptr, ri, co, IN: tl.constexpr):
        """Tile (ri, co) of W^T for a torch Linear weight W (out, in) at w_ptr: W[co, ri]."""
        return tl.load(w_ptr + co[None, :] * IN + ri[:, None])

    @triton.jit
    def _blk_w(w_ptr, ro, ci, IN: tl.constexpr):
        """Tile (ro, ci) of a torch Linear weight W (out, in) at w_ptr."""
        return tl.load(w_ptr + ro[:, None] * IN + ci[None, :])

    @triton.jit
    def _blk_rows(n, L: tl.constexpr, LP: tl.constexpr, BN: tl.constexpr, D: tl.constexpr):
        """A program's rows: their sequences and positions, their offsets (R, D) in (n, L, D)
        activations, the mask of the real ones and the feature columns."""
        r = tl.arange(0, BN * LP)
        seq = tl.program_id(0) * BN + r // LP
        pos = r % LP
        valid = (seq < n) & (pos < L)
        c = tl.arange(0, D)
        offs = seq.to(tl.int64)[:, None] * (L * D) + pos[:, None] * D + c[None, :]
        return seq, pos, valid, offs, valid[:, None] & (c[None, :] < D), c

    @triton.jit
    def _blk_probs(q3, k3, hm, seen, PREC: tl.constexpr):
        """Causal softmax of one head (columns hm) for every sequence: (BN, LP, LP)."""
        s = _mm(q3 * hm[None, None, :], tl.permute(k3, (0, 2, 1)), PREC)
        s = tl.where(seen[None, :, :], s, float("-inf"))
        p = tl.exp(s - tl.max(s, 2)[:, :, None])
        return p / tl.sum(p, 2)[:, :, None]

    @triton.jit
    def _blk_qkv(
        a,
        qkvw,
        qkvb,
        c,
        sc_hi,
        sc_lo,
        BN: tl.constexpr,
        LP: tl.constexpr,
        D: tl.constexpr,
        PREC: tl.constexpr,
    ):
        """The scaled queries, the keys and the values of the rows a (R, D), as (BN, LP, D)."""
        q = _mm(a, _blk_wt(qkvw, c, c, D), PREC) + tl.load(qkvb + c)[None, :]
        k = _mm(a, _blk_wt(qkvw + D * D, c, c, D), PREC) + tl.load(qkvb + D + c)[None, :]
        v = _mm(a, _blk_wt(qkvw + 2 * D * D, c, c, D), PREC)
        v += tl.load(qkvb + 2 * D + c)[None, :]
        q3 = tl.reshape(_scaled(q, sc_hi, sc_lo, PREC), (BN, LP, D))
        return q3, tl.reshape(k, (BN, LP, D)), tl.reshape(v, (BN, LP, D))

    @triton.jit
    def _blk_forward(
        h,
        c,
        w,
        eps_hi,
        eps_lo,
        sc_hi,
        sc_lo,
        BN: tl.constexpr,
        LP: tl.constexpr,
        D: tl.constexpr,
        H: tl.constexpr,
        FF: tl.constexpr,
        FC: tl.constexpr,
        PREC: tl.constexpr,
    ):
        """The block at w on the rows h (R, D): h1 = h + attn(ln1(h)), then h1 + mlp(ln2(h1));
        returns both (the backward pass starts from h and h1)."""
        R: tl.constexpr = BN * LP
        HD: tl.constexpr = D // H
        ln1w, ln1b, qkvw, qkvb, aow, aob, ln2w, ln2b, fcw, fcb, prw, prb = _layer_ptrs(w, D, FF)
        a = _blk_ln(h, ln1w, ln1b, c, eps_hi, eps_lo, D, PREC)[0]
        q3, k3, v3 = _blk_qkv(a, qkvw, qkvb, c, sc_hi, sc_lo, BN, LP, D, PREC)
        i = tl.arange(0, LP)
        seen = i[None, :] <= i[:, None]  # (query, key)
        y3 = tl.zeros((BN, LP, D), dtype=h.dtype)
        for hh in range(H):
            hm = ((c // HD) == hh).to(h.dtype)
            y3 += _mm(_blk_probs(q3, k3, hm, seen, PREC), v3 * hm[None, None, :], PREC)
        y = tl.reshape(y3, (R, D))
        h1 = h + _mm(y, _blk_wt(aow, c, c, D), PREC) + tl.load(aob + c)[None, :]
        b = _blk_ln(h1, ln2w, ln2b, c, eps_hi, eps_lo, D, PREC)[0]
        cf = tl.arange(0, FC)
        acc = tl.zeros((R, D), dtype=h.dtype)
        for f0 in range(0, FF, FC):
            u = _mm(b, _blk_wt(fcw + f0 * D, c, cf, D), PREC)
            u += tl.load(fcb + f0 + cf)[None, :]
            acc += _mm(gelu(u), _blk_wt(prw + f0, cf, c, FF), PREC)
        return h1 + acc + tl.load(prb + c)[None, :], h1

    @triton.jit
    def _blk_backward(
        h,
        h1,
        dh2,
        c,
        w,
        g,
        eps_hi,
        eps_lo,
        sc_hi,
        sc_lo,
        BN: tl.constexpr,
        LP: tl.constexpr,
        D: tl.constexpr,
        H: tl.constexpr,
        FF: tl.constexpr,
        FC: tl.constexpr,
        PREC: tl.constexpr,
    ):
        """The backward pass of the block at w from its input rows h, its midpoint h1 (after
        the attention) and the output gradient dh2; each half recomputes what it needs from
        h1 or h. Returns the input gradient and stores this program's partial gradient of every
        parameter at g (the layout of w)."""
        R: tl.constexpr = BN * LP
        HD: tl.constexpr = D // H
        ln1w, ln1b, qkvw, qkvb, aow, _, ln2w, ln2b, fcw, fcb, prw, _ = _layer_ptrs(w, D, FF)
        g_ln1w, g_ln1b, g_qkvw, g_qkvb, g_aow, g_aob, g_ln2w, g_ln2b, g_fcw, g_fcb, g_prw, g_prb = (
            _layer_ptrs(g, D, FF)
        )
        # the MLP from h1: h2 = h1 + gelu(b W1^T + b1) W2^T + b2, b = ln2(h1)
        b, xhat2, rstd2 = _blk_ln(h1, ln2w, ln2b, c, eps_hi, eps_lo, D, PREC)
        tl.store(g_prb + c, tl.sum(dh2, 0))
        cf = tl.arange(0, FC)
        db = tl.zeros((R, D), dtype=h.dtype)
        for f0 in range(0, FF, FC):
            u = _mm(b, _blk_wt(fcw + f0 * D, c, cf, D), PREC)
            u += tl.load(fcb + f0 + cf)[None, :]
            gu = gelu(u)
            # W2's columns f0.. get gu^T dh2; the chunk's input gradient is dh2 W2[:, chunk]
            tl.store(g_prw + c[None, :] * FF + (f0 + cf)[:, None], _mm(tl.trans(gu), dh2, PREC))
            du = _mm(dh2, _blk_w(prw + f0, c, cf, FF), PREC) * gelu_grad(u)
            tl.store(g_fcw + (f0 + cf)[None, :] * D + c[:, None], _mm(tl.trans(b), du, PREC))
            tl.store(g_fcb + f0 + cf, tl.sum(du, 0))
            db += _mm(du, _blk_w(fcw + f0 * D, cf, c, D), PREC)
        tl.store(g_ln2w + c, tl.sum(db * xhat2, 0))
        tl.store(g_ln2b + c, tl.sum(db, 0))
        dh1 = dh2 + _blk_ln_bwd(db, xhat2, rstd2, ln2w, c, D)
        # the attention from h: h1 = h + y Wo^T + bo, y = attn(q, k, v), (q, k, v) from ln1(h)
        a, xhat1, rstd1 = _blk_ln(h, ln1w, ln1b, c, eps_hi, eps_lo, D, PREC)
        q3, k3, v3 = _blk_qkv(a, qkvw, qkvb, c, sc_hi, sc_lo, BN, LP, D, PREC)
        dy3 = tl.reshape(_mm(dh1, _blk_w(aow, c, c, D), PREC), (BN, LP, D))
        i = tl.arange(0, LP)
        seen = i[None, :] <= i[:, None]
        y3 = tl.zeros((BN, LP, D), dtype=h.dtype)
        dq3 = tl.zeros((BN, LP, D), dtype=h.dtype)
        dk3 = tl.zeros((BN, LP, D), dtype=h.dtype)
        dv3 = tl.zeros((BN, LP, D), dtype=h.dtype)
        for hh in range(H):  # head by head (columns hm)
            hm = ((c // HD) == hh).to(h.dtype)
            p = _blk_probs(q3, k3, hm, seen, PREC)
            y3 += _mm(p, v3 * hm[None, None, :], PREC)
            dyh = dy3 * hm[None, None, :]
            dv3 += _mm(tl.permute(p, (0, 2, 1)), dyh, PREC)
            dp = _mm(dyh, tl.permute(v3, (0, 2, 1)), PREC)
            ds = p * (dp - tl.sum(dp * p, 2)[:, :, None])
            dq3 += _mm(ds, k3 * hm[None, None, :], PREC)
            dk3 += _mm(tl.permute(ds, (0, 2, 1)), q3 * hm[None, None, :], PREC)
        tl.store(
            g_aow + c[None, :] * D + c[:, None],
            _mm(tl.trans(tl.reshape(y3, (R, D))), dh1, PREC),
        )
        tl.store(g_aob + c, tl.sum(dh1, 0))
        dq = _scaled(tl.reshape(dq3, (R, D)), sc_hi, sc_lo, PREC)
        dk = tl.reshape(dk3, (R, D))
        dv = tl.reshape(dv3, (R, D))
        # the q/k/v projection of a = ln1(h)
        at = tl.trans(a)
        wt = c[None, :] * D + c[:, None]
        tl.store(g_qkvw + wt, _mm(at, dq, PREC))
        tl.store(g_qkvw + D * D + wt, _mm(at, dk, PREC))
        tl.store(g_qkvw + 2 * D * D + wt, _mm(at, dv, PREC))
        tl.store(g_qkvb + c, tl.sum(dq, 0))
        tl.store(g_qkvb + D + c, tl.sum(dk, 0))
        tl.store(g_qkvb + 2 * D + c, tl.sum(dv, 0))
        da = _mm(dq, _blk_w(qkvw, c, c, D), PREC)
        da += _mm(dk, _blk_w(qkvw + D * D, c, c, D), PREC)
        da += _mm(dv, _blk_w(qkvw + 2 * D * D, c, c, D), PREC)
        tl.store(g_ln1w + c, tl.sum(da * xhat1, 0))
        tl.store(g_ln1b + c, tl.sum(da, 0))
        return dh1 + _blk_ln_bwd(da, xhat1, rstd1, ln1w, c, D)

    @triton.jit(do_not_specialize=["n"])
    def _block_fwd_kernel(
        h_ptr,
        out_ptr,
        mid_ptr,
        w,
        n,
        eps_hi,
        eps_lo,
        sc_hi,
        sc_lo,
        L: tl.constexpr,
        LP: tl.constexpr,
        BN: tl.constexpr,
        D: tl.constexpr,
        H: tl.constexpr,
        FF: tl.constexpr,
        FC: tl.constexpr,
        NP: tl.constexpr,
        PREC: tl.constexpr,
    ):
        """The block's output, and its midpoint h1 (for the backward pass) at mid."""
        _, _, _, offs, mask, c = _blk_rows(n, L, LP, BN, D)
        h = tl.load(h_ptr + offs, mask=mask, other=0.0)
        h2, h1 = _blk_forward(h, c, w, eps_hi, eps_lo, sc_hi, sc_lo, BN, LP, D, H, FF, FC, PREC)
        tl.store(out_ptr + offs, h2, mask=mask)
        tl.store(mid_ptr + offs, h1, mask=mask)

    @triton.jit(do_not_specialize=["n"])
    def _block_bwd_kernel(
        h_ptr,
        mid_ptr,
        dout_ptr,
        dh_ptr,
        w,
        part_ptr,
        n,
        eps_hi,
        eps_lo,
        sc_hi,
        sc_lo,
        L: tl.constexpr,
        LP: tl.constexpr,
        BN: tl.constexpr,
        D: tl.constexpr,
        H: tl.constexpr,
        FF: tl.constexpr,
        FC: tl.constexpr,
        NP: tl.constexpr,
        PREC: tl.constexpr,
    ):
        """The input gradient, and this program's row of the parameter gradients (row pid
        of part, the layout of w)."""
        _, _, _, offs, mask, c = _blk_rows(n, L, LP, BN, D)
        h = tl.load(h_ptr + offs, mask=mask, other=0.0)
        h1 = tl.load(mid_ptr + offs, mask=mask, other=0.0)
        dh2 = tl.load(dout_ptr + offs, mask=mask, other=0.0)
        g = part_ptr + tl.program_id(0).to(tl.int64) * NP
        dh = _blk_backward(
            h, h1, dh2, c, w, g, eps_hi, eps_lo, sc_hi, sc_lo, BN, LP, D, H, FF, FC, PREC
        )
        tl.store(dh_ptr + offs, dh, mask=mask)

    # --------------------------------------------------------------- the whole amplitude
    # The flat parameters of `Ansatz.log_amplitude` in the module's order: the token (5, D)
    # and position (L, D) embeddings, NL blocks (`_layer_ptrs`), ln_f (w, b), the head (4, D)
    # and its bias (4), the logit offsets (L, 4).
    @triton.jit
    def _amp_tokens(tok_ptr, seq, pos, n, L: tl.constexpr, LP: tl.constexpr):
        """Per row: the input token (the start token 4, then the previous orbital's), the
        target token, and the alpha and beta electrons of the orbitals before it."""
        j = tl.arange(0, LP)
        tk = tl.load(
            tok_ptr + seq.to(tl.int64)[:, None] * L + j[None, :],
            mask=(seq < n)[:, None] & (j < L)[None, :],
            other=0,
        ).to(tl.int32)
        before = j[None, :] < pos[:, None]
        used_a = tl.sum(tl.where(before, tk & 1, 0), 1)
        used_b = tl.sum(tl.where(before, tk >> 1, 0), 1)
        target = tl.sum(tl.where(j[None, :] == pos[:, None], tk, 0), 1)
        prev = tl.sum(tl.where(j[None, :] == pos[:, None] - 1, tk, 0), 1)
        return tl.where(pos == 0, 4, prev), target, used_a, used_b

    @triton.jit
    def _amp_head(
        h,
        c,
        wf,
        pos,
        target,
        used_a,
        used_b,
        eps_hi,
        eps_lo,
        L: tl.constexpr,
        D: tl.constexpr,
        NA: tl.constexpr,
        NB: tl.constexpr,
        PREC: tl.constexpr,
    ):
        """ln_f, the head and the masked log-softmax of the rows h, with ln_f, the head and the
        logit offsets at wf: log p of each row's target, the probabilities of its four tokens
        (16 columns, 0 past the fourth), whether the target is allowed, and ln_f's pieces."""
        x, xhat, rstd = _blk_ln(h, wf, wf + D, c, eps_hi, eps_lo, D, PREC)
        c16 = tl.arange(0, 16)
        real = c16 < 4
        wh = tl.load(wf + 2 * D + c16[None, :] * D + c[:, None], mask=real[None, :], other=0.0)
        bh = tl.load(wf + 6 * D + c16, mask=real, other=0.0)
        kb = tl.minimum(pos, L - 1)
        lb = tl.load(wf + 6 * D + 4 + kb[:, None] * 4 + c16[None, :], mask=real[None, :], other=0.0)
        logits = _mm(x, wh, PREC) + bh[None, :] + lb
        ua = used_a[:, None] + (c16[None, :] & 1)
        ub = used_b[:, None] + (c16[None, :] >> 1)
        rem = (L - 1 - pos)[:, None]
        allowed = (ua <= NA) & (NA - ua <= rem) & (ub <= NB) & (NB - ub <= rem) & real
        n_allowed = tl.sum(allowed.to(tl.int32), 1)
        # rows with nothing allowed (behind an out-of-sector prefix) are left unmasked
        use = allowed | (real & (n_allowed == 0)[:, None])
        lg = tl.where(use, logits, float("-inf"))
        mx = tl.max(lg, 1)
        ex = tl.where(use, tl.exp(lg - mx[:, None]), 0.0)
        se = tl.sum(ex, 1)
        pick = c16[None, :] == target[:, None]
        lp = tl.sum(tl.where(pick, lg, 0.0), 1) - mx - tl.log(se)
        ok = tl.sum((pick & allowed).to(tl.int32), 1) > 0
        return lp, ex / se[:, None], ok, pick, x, xhat, rstd, wh

    @triton.jit
    def _amp_out(
        h, c, wf, amp_ptr, n, pos, valid, target, used_a, used_b, eps_hi, eps_lo,
        L: tl.constexpr, LP: tl.constexpr, BN: tl.constexpr, D: tl.constexpr,
        NA: tl.constexpr, NB: tl.constexpr, PREC: tl.constexpr,
    ):  # fmt: skip
        """ln|psi| = 1/2 sum of the rows' log p of their targets, from the last block's
        output h (`_amp_head`), stored for the program's BN sequences; -inf where a target
        is not allowed."""
        lp, _, ok, _, _, _, _, _ = _amp_head(
            h, c, wf, pos, target, used_a, used_b, eps_hi, eps_lo, L, D, NA, NB, PREC
        )
        lp = tl.where(valid, lp, 0.0)
        bad = (valid & ~ok).to(tl.int32)
        amp = 0.5 * tl.sum(tl.reshape(lp, (BN, LP)), 1)
        amp = tl.where(tl.sum(tl.reshape(bad, (BN, LP)), 1) > 0, float("-inf"), amp)
        ob = tl.program_id(0) * BN + tl.arange(0, BN)
        tl.store(amp_ptr + ob, amp, mask=ob < n)

    @triton.jit
    def _amp_head_bwd(
        h, c, wf, gf, damp_ptr, n, seq, pos, valid, target, used_a, used_b, eps_hi, eps_lo,
        L: tl.constexpr, LP: tl.constexpr, BN: tl.constexpr, D: tl.constexpr,
        NA: tl.constexpr, NB: tl.constexpr, PREC: tl.constexpr,
    ):  # fmt: skip
        """The backward pass of `_amp_out` for the gradient damp of ln|psi|: the program's
        partial gradients of ln_f, the head and the logit offsets at gf (the layout of wf),
        and the gradient of h, returned."""
        _, prob, ok, pick, x, xhat, rstd, wh = _amp_head(
            h, c, wf, pos, target, used_a, used_b, eps_hi, eps_lo, L, D, NA, NB, PREC
        )
        # d ln|psi| / d logits = (onehot(target) - p) / 2 on the rows that count
        gr = 0.5 * tl.load(damp_ptr + seq, mask=seq < n, other=0.0)
        gr = tl.where(valid & ok, gr, 0.0)
        dl = gr[:, None] * (pick.to(h.dtype) - prob)
        c16 = tl.arange(0, 16)
        real = c16 < 4
        tl.store(
            gf + 2 * D + c16[:, None] * D + c[None, :],
            _mm(tl.trans(dl), x, PREC),
            mask=real[:, None],
        )
        tl.store(gf + 6 * D + c16, tl.sum(dl, 0), mask=real)
        i = tl.arange(0, LP)
        tl.store(
            gf + 6 * D + 4 + i[:, None] * 4 + c16[None, :],
            tl.sum(tl.reshape(dl, (BN, LP, 16)), 0),
            mask=(i < L)[:, None] & real[None, :],
        )
        dx = _mm(dl, tl.trans(wh), PREC)
        tl.store(gf + c, tl.sum(dx * xhat, 0))
        tl.store(gf + D + c, tl.sum(dx, 0))
        return _blk_ln_bwd(dx, xhat, rstd, wf, c, D)

    @triton.jit(do_not_specialize=["n"])
    def _tail_fwd_kernel(
        tok_ptr, wf, h_ptr, amp_ptr, n, eps_hi, eps_lo,
        L: tl.constexpr, LP: tl.constexpr, BN: tl.constexpr, D: tl.constexpr,
        NA: tl.constexpr, NB: tl.constexpr, PREC: tl.constexpr,
    ):  # fmt: skip
        """`_amp_out` of BN sequences per program from the last block's output h (n, L, D)."""
        seq, pos, valid, offs, mask, c = _blk_rows(n, L, LP, BN, D)
        _, target, used_a, used_b = _amp_tokens(tok_ptr, seq, pos, n, L, LP)
        h = tl.load(h_ptr + offs, mask=mask, other=0.0)
        _amp_out(h, c, wf, amp_ptr, n, pos, valid, target, used_a, used_b, eps_hi, eps_lo,
                 L, LP, BN, D, NA, NB, PREC)  # fmt: skip

    @triton.jit(do_not_specialize=["n"])
    def _tail_bwd_kernel(
        tok_ptr, wf, h_ptr, damp_ptr, dh_ptr, part_ptr, n, eps_hi, eps_lo,
        L: tl.constexpr, LP: tl.constexpr, BN: tl.constexpr, D: tl.constexpr,
        NA: tl.constexpr, NB: tl.constexpr, NW: tl.constexpr, PREC: tl.constexpr,
    ):  # fmt: skip
        """`_amp_head_bwd` of BN sequences per program: the gradient of h and this program's
        row (NW numbers, the layout of wf) of the parameters' partial gradients."""
        seq, pos, valid, offs, mask, c = _blk_rows(n, L, LP, BN, D)
        _, target, used_a, used_b = _amp_tokens(tok_ptr, seq, pos, n, L, LP)
        h = tl.load(h_ptr + offs, mask=mask, other=0.0)
        g = part_ptr + tl.program_id(0).to(tl.int64) * NW
        dh = _amp_head_bwd(
            h, c, wf, g, damp_ptr, n, seq, pos, valid, target, used_a, used_b, eps_hi,
            eps_lo, L, LP, BN, D, NA, NB, PREC,
        )  # fmt: skip
        tl.store(dh_ptr + offs, tl.where(mask, dh, 0.0), mask=mask)

    @triton.jit(do_not_specialize=["n"])
    def _amp_fwd_kernel(
        tok_ptr,
        w,
        hs_ptr,
        amp_ptr,
        n,
        eps_hi,
        eps_lo,
        sc_hi,
        sc_lo,
        L: tl.constexpr,
        LP: tl.constexpr,
        BN: tl.constexpr,
        D: tl.constexpr,
        H: tl.constexpr,
        FF: tl.constexpr,
        FC: tl.constexpr,
        NP: tl.constexpr,
        NL: tl.constexpr,
        NA: tl.constexpr,
        NB: tl.constexpr,
        PREC: tl.constexpr,
    ):
        """ln|psi| of BN configurations per program; for the backward pass, hs (2 NL + 1, n,
        L, D) gets every block's input and midpoint (after its attention), then the last
        block's output."""
        seq, pos, valid, offs, mask, c = _blk_rows(n, L, LP, BN, D)
        inp, target, used_a, used_b = _amp_tokens(tok_ptr, seq, pos, n, L, LP)
        h = tl.load(w + inp[:, None] * D + c[None, :])
        h += tl.load(w + 5 * D + tl.minimum(pos, L - 1)[:, None] * D + c[None, :])
        for layer in range(NL):  # a loop, not unrolled: one block's code
            tl.store(hs_ptr + 2 * layer * n * L * D + offs, h, mask=mask)
            lw = w + (5 + L) * D + layer * NP
            h, h1 = _blk_forward(h, c, lw, eps_hi, eps_lo, sc_hi, sc_lo, BN, LP, D, H, FF, FC, PREC)
            tl.store(hs_ptr + (2 * layer + 1) * n * L * D + offs, h1, mask=mask)
        tl.store(hs_ptr + 2 * NL * n * L * D + offs, h, mask=mask)
        wf = w + (5 + L) * D + NL * NP
        _amp_out(h, c, wf, amp_ptr, n, pos, valid, target, used_a, used_b, eps_hi, eps_lo,
                 L, LP, BN, D, NA, NB, PREC)  # fmt: skip

    @triton.jit(do_not_specialize=["n"])
    def _amp_bwd_kernel(
        tok_ptr,
        w,
        hs_ptr,
        damp_ptr,
        part_ptr,
        n,
        eps_hi,
        eps_lo,
        sc_hi,
        sc_lo,
        L: tl.constexpr,
        LP: tl.constexpr,
        BN: tl.constexpr,
        D: tl.constexpr,
        H: tl.constexpr,
        FF: tl.constexpr,
        FC: tl.constexpr,
        NP: tl.constexpr,
        NL: tl.constexpr,
        NA: tl.constexpr,
        NB: tl.constexpr,
        NW: tl.constexpr,
        PREC: tl.constexpr,
    ):
        """This program's row (NW numbers, the layout of w) of the gradient of
        sum_x damp(x) ln|psi(x)|: the head again from the last block's output (kept in hs),
        then every block backward from its input and midpoint, then the embeddings."""
        seq, pos, valid, offs, mask, c = _blk_rows(n, L, LP, BN, D)
        inp, target, used_a, used_b = _amp_tokens(tok_ptr, seq, pos, n, L, LP)
        g = part_ptr + tl.program_id(0).to(tl.int64) * NW
        h = tl.load(hs_ptr + 2 * NL * n * L * D + offs, mask=mask, other=0.0)
        wf = w + (5 + L) * D + NL * NP
        dh = _amp_head_bwd(
            h, c, wf, g + (5 + L) * D + NL * NP, damp_ptr, n, seq, pos, valid, target, used_a,
            used_b, eps_hi, eps_lo, L, LP, BN, D, NA, NB, PREC,
        )  # fmt: skip
        i = tl.arange(0, LP)
        for back in range(NL):
            layer = NL - 1 - back
            h = tl.load(hs_ptr + 2 * layer * n * L * D + offs, mask=mask, other=0.0)
            h1 = tl.load(hs_ptr + (2 * layer + 1) * n * L * D + offs, mask=mask, other=0.0)
            lw = w + (5 + L) * D + layer * NP
            lg = g + (5 + L) * D + layer * NP
            dh = _blk_backward(
                h, h1, dh, c, lw, lg, eps_hi, eps_lo, sc_hi, sc_lo, BN, LP, D, H, FF, FC, PREC
            )
        dh = tl.where(mask, dh, 0.0)
        for t in tl.static_range(5):
            tl.store(g + t * D + c, tl.sum(tl.where((inp == t)[:, None], dh, 0.0), 0))
        tl.store(
            g + 5 * D + i[:, None] * D + c[None, :],
            tl.sum(tl.reshape(dh, (BN, LP, D)), 0),
            mask=(i < L)[:, None],
        )


# ------------------------------------------------------------------------- autograd functions
def _on(t: torch.Tensor):
    """The tensor's GPU as the current device while a kernel launches (Triton launches on the
    current device)."""
    return torch.cuda.device(t.device) if t.is_cuda else contextlib.nullcontext()


def _split(v: float) -> tuple[float, float]:
    """``v`` as a float32 value plus a float32 remainder: Triton passes Python floats as
    float32, and a float64 kernel adds the two parts back (to about 1e-15 relative)."""
    hi = struct.unpack("f", struct.pack("f", v))[0]
    return hi, v - hi


def _prec(dtype: torch.dtype, coarse: bool = False) -> int:
    """The kernels' product code PREC (`_mm`): 1 for float64; for float32 0 (FMAs), or 2 (three
    TF32 products) in the block and amplitude kernels (``coarse``) under ``COARSE_PRODUCTS =
    "tf32x3"``."""
    if coarse and COARSE_PRODUCTS not in ("ieee", "tf32x3"):
        raise ValueError(f"COARSE_PRODUCTS must be 'ieee' or 'tf32x3', got {COARSE_PRODUCTS!r}")
    if dtype == torch.float64:
        return 1
    return 2 if coarse and COARSE_PRODUCTS == "tf32x3" else 0


def _row_tile(dp: int) -> int:
    return max(1, _ROW_TILE // dp)


class _LayerNorm(torch.autograd.Function):
    """LayerNorm over the last dimension (`layer_norm`); with a residual ``r`` of the sum
    s = x + r, returning (s, y) (`add_layer_norm`): the sum is the same kernel's, and its
    gradient (the norm's input gradient plus s's own) is the backward kernel's."""

    @staticmethod
    def forward(ctx, x, r, weight, bias, eps):
        d = x.shape[-1]
        x2 = x.reshape(-1, d).contiguous()
        add = r is not None
        r2 = r.reshape(-1, d).contiguous() if add else x2
        s = torch.empty_like(x2) if add else x2
        m, dp = x2.shape[0], pow2(d)
        block = _row_tile(dp)
        y = torch.empty_like(x2)
        mean = torch.empty(m, dtype=x.dtype, device=x.device)
        rstd = torch.empty_like(mean)
        if m:
            grid = (triton.cdiv(m, block),)
            hi, lo = _split(eps)
            prec = _prec(x.dtype)
            with _on(x):
                _ln_fwd_kernel[grid](
                    x2, r2, s, weight, bias, y, mean, rstd, m, hi, lo, d, dp, block, prec, add
                )
        ctx.save_for_backward(s, weight, mean, rstd)
        ctx.shape, ctx.stream, ctx.add = x.shape, aside.stream_for(x), add
        if add:
            return s.view(x.shape), y.view(x.shape)
        return y.view(x.shape)

    @staticmethod
    def backward(ctx, *grads):
        s, weight, mean, rstd = ctx.saved_tensors
        ds, dy = grads if ctx.add else (None, grads[0])
        m, d = s.shape
        dp = pow2(d)
        block = _row_tile(dp)
        programs = triton.cdiv(m, block)
        dy2 = dy.reshape(-1, d).contiguous()
        ds2 = ds.reshape(-1, d).contiguous() if ds is not None else dy2
        dx = torch.empty_like(s)
        part = torch.empty((programs, 2, dp), dtype=s.dtype, device=s.device)
        if m:
            with _on(s):
                _ln_bwd_kernel[(programs,)](
                    dy2, s, weight, mean, rstd, ds2, dx, part, m, d, dp, block, ds is not None
                )
        with aside.fork(ctx.stream, part):  # the weight and bias sums beside the pass
            sums = aside.column_sums(part.view(programs, 2 * dp)).view(2, dp)
        dx = dx.view(ctx.shape)
        return dx, dx if ctx.add else None, sums[0, :d], sums[1, :d], None


def _heads_per_program(n_heads: int) -> int:
    """Heads an attention program takes one after another: `_ATTN_HEADS` (0: all), or the
    largest divisor of ``n_heads`` below it."""
    want = n_heads if _ATTN_HEADS <= 0 else min(_ATTN_HEADS, n_heads)
    return max(h for h in range(1, want + 1) if n_heads % h == 0)


def _row_launch(rows, length, n_heads, hd, scale, prec, dtype) -> tuple | None:
    """The row-wise attention kernels' launch for ``rows`` = sequences x positions x heads:
    (grid, the arguments after the tensors, warps), or None when `_ATTN_ROWS` gives ``dtype``
    the tile kernels. Both kernels take the same arguments after their tensors."""
    tile = _ATTN_ROWS.get(dtype)
    if not tile:
        return None
    p2 = pow2(hd)
    args = (rows, *scale, length, n_heads, hd, p2, prec, tile[0], hd & -hd, hd == p2)
    return (triton.cdiv(rows, tile[0]),), args, tile[1]


class _CausalAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, qkv, n_heads):
        n, length, d3 = qkv.shape
        d = d3 // 3
        hd = d // n_heads
        y = torch.empty((n, length, d), dtype=qkv.dtype, device=qkv.device)
        lse = torch.empty((n, n_heads, length), dtype=qkv.dtype, device=qkv.device)
        scale = _split(1.0 / math.sqrt(hd))
        consts = (length, max(16, pow2(length)), n_heads, hd, max(16, pow2(hd)), _prec(qkv.dtype))
        # the row-wise kernels' grid, arguments after the tensors and warps, both ways
        row = _row_launch(n * length * n_heads, length, n_heads, hd, scale, consts[5], qkv.dtype)
        if n and row:
            with _on(qkv):
                _attn_row_fwd_kernel[row[0]](qkv, y, lse, *row[1], num_warps=row[2])
        elif n:
            hg = _heads_per_program(n_heads)
            with _on(qkv):
                _attn_fwd_kernel[(n, n_heads // hg)](
                    qkv, y, lse, *scale, *consts, hg, num_warps=_ATTN_WARPS
                )
        ctx.save_for_backward(qkv, y, lse)
        ctx.consts, ctx.scale, ctx.row = consts, scale, row
        return y

    @staticmethod
    def backward(ctx, dy):
        qkv, y, lse = ctx.saved_tensors
        n = qkv.shape[0]
        dqkv = torch.empty_like(qkv)
        row = ctx.row
        if n and row:
            with _on(qkv):
                _attn_row_bwd_kernel[row[0]](
                    qkv, y, dy.contiguous(), lse, dqkv, *row[1], num_warps=row[2]
                )
        elif n:
            hg = _heads_per_program(ctx.consts[2])
            with _on(qkv):
                _attn_bwd_kernel[(n, ctx.consts[2] // hg)](
                    qkv,
                    y,
                    dy.contiguous(),
                    lse,
                    dqkv,
                    *ctx.scale,
                    *ctx.consts,
                    hg,
                    num_warps=_ATTN_WARPS,
                )
        return dqkv, None


class _FusedBlock(torch.autograd.Function):
    """A whole pre-LayerNorm block (`cuscikit.nnqs.ansatz._Block`) as one kernel each way;
    its parameters flat in ``w`` (`_block_params` order)."""

    @staticmethod
    def forward(ctx, h, w, consts, scalars):
        n = h.shape[0]
        h = h.contiguous()
        out = torch.empty_like(h)
        mid = torch.empty_like(h)  # after the attention: where the backward pass starts
        if n:
            with _on(h):
                _block_fwd_kernel[(triton.cdiv(n, consts[2]),)](
                    h,
                    out,
                    mid,
                    w,
                    n,
                    *scalars,
                    *consts,
                    num_warps=_warps(consts),
                    num_stages=_LAUNCH_STAGES,
                )
        ctx.save_for_backward(h, mid, w)
        ctx.consts, ctx.scalars = consts, scalars
        return out

    @staticmethod
    def backward(ctx, dout):
        h, mid, w = ctx.saved_tensors
        n = h.shape[0]
        programs = triton.cdiv(n, ctx.consts[2])
        dh = torch.empty_like(h)
        part = _part_rows(programs, w, n)
        if n:
            with _on(h):
                _block_bwd_kernel[(programs,)](
                    h,
                    mid,
                    dout.contiguous(),
                    dh,
                    w,
                    part,
                    n,
                    *ctx.scalars,
                    *ctx.consts,
                    num_warps=_warps(ctx.consts),
                    num_stages=_LAUNCH_STAGES,
                )
        return dh, part.sum(0), None, None  # one reduction, in a fixed order


class _FusedAmplitude(torch.autograd.Function):
    """`Ansatz.log_amplitude` as one kernel each way; its parameters flat in ``w`` (the
    module's order), every block's input and midpoint kept for the backward pass."""

    @staticmethod
    def forward(ctx, tokens, w, consts, scalars, nl, nelec):
        n, length = tokens.shape
        d = consts[3]
        amp = torch.empty(n, dtype=w.dtype, device=w.device)
        hs = torch.empty((2 * nl + 1, n, length, d), dtype=w.dtype, device=w.device)
        if n:
            with _on(w):
                _amp_fwd_kernel[(triton.cdiv(n, consts[2]),)](
                    tokens,
                    w,
                    hs,
                    amp,
                    n,
                    *scalars,
                    *consts[:8],
                    nl,
                    *nelec,
                    consts[8],
                    num_warps=_warps(consts),
                    num_stages=_LAUNCH_STAGES,
                )
        ctx.save_for_backward(tokens, w, hs)
        ctx.consts, ctx.scalars, ctx.nl, ctx.nelec = consts, scalars, nl, nelec
        return amp

    @staticmethod
    def backward(ctx, damp):
        tokens, w, hs = ctx.saved_tensors
        n = tokens.shape[0]
        consts = ctx.consts
        programs = triton.cdiv(n, consts[2])
        part = _part_rows(programs, w, n)
        if n:
            with _on(w):
                _amp_bwd_kernel[(programs,)](
                    tokens,
                    w,
                    hs,
                    damp.contiguous(),
                    part,
                    n,
                    *ctx.scalars,
                    *consts[:8],
                    ctx.nl,
                    *ctx.nelec,
                    w.numel(),
                    consts[8],
                    num_warps=_warps(consts),
                    num_stages=_LAUNCH_STAGES,
                )
        return None, part.sum(0), None, None, None, None  # one reduction, in a fixed order


def _part_rows(programs: int, w: torch.Tensor, n: int) -> torch.Tensor:
    """The rows of partial gradients, one per program: every entry is written by its program,
    so the buffer is not cleared (zeros for an empty batch; NaN under `_POISON`, which the
    tests set so that an entry no program writes shows)."""
    shape = (max(programs, 1), w.numel())
    if _POISON:
        return torch.full(shape, float("nan"), dtype=w.dtype, device=w.device)
    return (torch.empty if n else torch.zeros)(shape, dtype=w.dtype, device=w.device)


def _layer_floats(d: int, ff: int) -> int:
    """Numbers in a block's flat parameters (`_layer_ptrs`): ln1, qkv, proj, ln2, fc, proj."""
    return 4 * d * d + 2 * d * ff + 9 * d + ff


def _set_tile(dtype: torch.dtype, rows: int, warps: int) -> None:
    """Launch the block and amplitude kernels of ``dtype`` under the current
    ``COARSE_PRODUCTS`` with programs of ``rows`` rows and ``warps`` warps (benchmarks, tools)."""
    _TILES[_prec(dtype, coarse=True)] = (int(rows), int(warps))


def _warps(consts: tuple) -> int:
    """The warps of a block or amplitude kernel's program for its `_block_consts`."""
    return _TILES[consts[-1]][1]


def _block_consts(length: int, d: int, n_heads: int, ff: int, dtype: torch.dtype) -> tuple:
    """The kernels' compile-time sizes: L, LP (positions padded), BN (sequences per program),
    D, H, FF (hidden width), FC (its chunk), NP (a block's parameters), PREC (`_prec`)."""
    lp = max(16, pow2(length))
    prec = _prec(dtype, coarse=True)
    bn = max(1, _TILES[prec][0] // lp)
    return (
        length,
        lp,
        bn,
        d,
        n_heads,
        ff,
        min(32, ff),
        _layer_floats(d, ff),
        prec,
    )


def _block_params(blk) -> tuple[torch.Tensor, ...]:
    """A block's parameters in the kernels' order (the module's)."""
    return (
        blk.ln1.weight,
        blk.ln1.bias,
        blk.attn.qkv.weight,
        blk.attn.qkv.bias,
        blk.attn.proj.weight,
        blk.attn.proj.bias,
        blk.ln2.weight,
        blk.ln2.bias,
        blk.fc.weight,
        blk.fc.bias,
        blk.proj.weight,
        blk.proj.bias,
    )


def _flat(params) -> torch.Tensor:
    return torch.cat([p.reshape(-1) for p in params])


def block_unsupported(x: torch.Tensor, blk) -> str | None:
    """Why `block` leaves this block to the module (None: it runs fused)."""
    if x.dim() != 3:
        return "activations not of shape (n, L, d)"
    n, length, d = x.shape
    # x, the output, the midpoint and the input gradient: four tensors of that size
    return _block_unsupported(n, length, d, x.dtype, blk, slots=4)


def _block_unsupported(n: int, length: int, d: int, dtype, blk, slots: int) -> str | None:
    """Why the fused kernels cannot take ``blk`` on n sequences of ``length`` positions of
    width ``d`` with ``slots`` activation tensors of that size indexed by one offset."""
    ff = blk.fc.weight.shape[0]
    if d not in (16, 32, 64):
        return f"d_model {d} (the fused block runs 16, 32 and 64)"
    if d % blk.attn.n_heads:
        return "heads that do not divide d_model"
    if ff != pow2(ff) or ff < 16:
        return f"a hidden width of {ff} (not a power of two of at least 16)"
    if length > _MAX_LENGTH:
        return f"{length} positions (at most {_MAX_LENGTH})"
    if blk.ln1.eps != blk.ln2.eps:
        return "LayerNorms with different eps"
    if any(p.dtype != dtype for p in _block_params(blk)):
        return "parameters of another dtype"
    if slots * n * length * d >= _MAX_ELEMENTS:
        return "too many rows for 32-bit offsets"
    return None


def _scalars(eps: float, head_width: int) -> tuple[float, float, float, float]:
    return (*_split(eps), *_split(1.0 / math.sqrt(head_width)))


def block(x: torch.Tensor, blk) -> torch.Tensor | None:
    """The Ansatz block ``blk`` on ``x`` (n, L, d) through one Triton kernel each way
    (LayerNorms, attention, both projections, the MLP and the residual sums of a tile of
    whole sequences in registers; the backward pass recomputes what it needs from the block's
    input and midpoint, kept by the forward pass, and writes one row of partial parameter
    gradients per program, summed in a fixed order);
    None when it does not apply (`BLOCK_ENABLED` off, not `active`, or `block_unsupported`),
    so the caller runs the module's own pass."""
    if not BLOCK_ENABLED or _coarse_failed is not None or not active(x):
        return None
    if block_unsupported(x, blk) is not None:
        return None
    n, length, d = x.shape
    h = blk.attn.n_heads
    consts = _block_consts(length, d, h, blk.fc.weight.shape[0], x.dtype)
    try:
        w = _flat(_block_params(blk))
        return _FusedBlock.apply(x, w, consts, _scalars(float(blk.ln1.eps), d // h))
    except Exception as exc:  # noqa: BLE001 - a kernel that does not build: the module's
        _turn_off(exc, "coarse")
        return None


def amplitude_unsupported(ansatz, tokens: torch.Tensor) -> str | None:
    """Why `amplitude` leaves this pass to the module (None: it runs fused)."""
    if tokens.dim() != 2 or tokens.shape[1] != ansatz.norb:
        return "tokens not of shape (n, norb)"
    n, length, d = tokens.shape[0], ansatz.norb, ansatz.d_model
    slots = 2 * ansatz.n_layers + 1  # every block's input and midpoint, the last output
    for blk in ansatz.blocks:
        why = _block_unsupported(n, length, d, ansatz.dtype, blk, slots)
        if why is not None:
            return why
    if len({ansatz.ln_f.eps} | {blk.ln1.eps for blk in ansatz.blocks}) != 1:
        return "LayerNorms with different eps"
    return None


def _amplitude_params(ansatz) -> list[torch.Tensor]:
    """The parameters of ln|psi| in the kernels' order (the module's)."""
    params = [ansatz.token_embedding.weight, ansatz.position_embedding.weight]
    for blk in ansatz.blocks:
        params += _block_params(blk)
    return params + _tail_params(ansatz)


def _tail_params(ansatz) -> list[torch.Tensor]:
    """The parameters after the last block in the kernels' order: ln_f, the head, the logit
    offsets (the layout `_amp_head` reads)."""
    head = ansatz.head
    return [ansatz.ln_f.weight, ansatz.ln_f.bias, head.weight, head.bias, ansatz.logit_bias]


def amplitude(ansatz, tokens: torch.Tensor) -> torch.Tensor | None:
    """``Ansatz.log_amplitude(tokens)`` through one Triton kernel each way: a program takes
    whole configurations through the embeddings, every block, ln_f, the head and the masked
    log-softmax in registers; the backward pass recomputes what it needs of each block from its
    input and midpoint (kept by the forward pass) and writes one row of partial gradients of all
    parameters per program, summed in a fixed order. None when it does not apply
    (`AMPLITUDE_ENABLED` off, not `active`, or `amplitude_unsupported`), so the caller runs the
    module's pass."""
    head = ansatz.head.weight
    if not AMPLITUDE_ENABLED or _coarse_failed is not None or not active(head):
        return None
    if not head.requires_grad:
        return None
    if amplitude_unsupported(ansatz, tokens) is not None:
        return None
    blk = ansatz.blocks[0]
    length, d, h, ff = ansatz.norb, ansatz.d_model, ansatz.n_heads, blk.fc.weight.shape[0]
    consts = _block_consts(length, d, h, ff, head.dtype)
    try:
        w = _flat(_amplitude_params(ansatz))
        # the layout `_amp_fwd_kernel` reads: embeddings, blocks, ln_f, head, logit offsets
        floats = (
            (5 + length) * d + ansatz.n_layers * _layer_floats(d, ff) + 6 * d + 4 * (1 + length)
        )
        assert w.numel() == floats, (w.numel(), floats)
        scalars = _scalars(float(blk.ln1.eps), d // h)
        return _FusedAmplitude.apply(
            tokens.contiguous(), w, consts, scalars, ansatz.n_layers, tuple(ansatz.nelec)
        )
    except Exception as exc:  # noqa: BLE001 - a kernel that does not build: the module's
        _turn_off(exc, "coarse")
        return None


class _AmplitudeTail(torch.autograd.Function):
    """ln_f, the head and the masked log-softmax of `Ansatz.log_amplitude` (its tail) as one
    kernel each way from the last block's output; the tail's parameters flat in ``wf``."""

    @staticmethod
    def forward(ctx, h, tokens, ln_w, ln_b, head_w, head_b, offsets, consts, eps, stream):
        n = h.shape[0]
        wf = _flat((ln_w, ln_b, head_w, head_b, offsets))
        amp = torch.empty(n, dtype=h.dtype, device=h.device)
        if n:
            with _on(h):
                _tail_fwd_kernel[(triton.cdiv(n, consts[2]),)](
                    tokens, wf, h, amp, n, *eps, *consts, num_warps=_TAIL_WARPS
                )
        ctx.save_for_backward(h, tokens, wf)
        ctx.consts, ctx.eps, ctx.stream = consts, eps, stream
        ctx.shapes = [p.shape for p in (ln_w, ln_b, head_w, head_b, offsets)]
        return amp

    @staticmethod
    def backward(ctx, damp):
        h, tokens, wf = ctx.saved_tensors
        n = h.shape[0]
        programs = triton.cdiv(n, ctx.consts[2])
        dh = torch.empty_like(h)
        part = _part_rows(programs, wf, n)
        if n:
            with _on(h):
                _tail_bwd_kernel[(programs,)](
                    tokens, wf, h, damp.contiguous(), dh, part, n, *ctx.eps, *ctx.consts[:6],
                    wf.numel(), ctx.consts[6], num_warps=_TAIL_WARPS,
                )  # fmt: skip
        with aside.fork(ctx.stream, part):  # the parameters' sums beside the pass
            sums = aside.column_sums(part)
        sizes = [s.numel() for s in ctx.shapes]
        grads = [g.view(s) for g, s in zip(sums.split(sizes), ctx.shapes, strict=True)]
        return (dh, None, *grads, None, None, None)


def tail_unsupported(ansatz, h: torch.Tensor, tokens: torch.Tensor) -> str | None:
    """Why `amplitude_tail` leaves this pass to the module (None: it runs fused)."""
    n, length, d = h.shape
    if tuple(tokens.shape) != (n, length) or length != ansatz.norb:
        return "tokens not of shape (n, norb)"
    if d not in (16, 32, 64):
        return f"d_model {d} (the fused tail runs 16, 32 and 64)"
    if length > _MAX_LENGTH:
        return f"{length} positions (at most {_MAX_LENGTH})"
    if ansatz.head.bias is None or any(p.dtype != h.dtype for p in _tail_params(ansatz)):
        return "parameters of another dtype, or a head without bias"
    if h.numel() >= _MAX_ELEMENTS:
        return "too many rows for 32-bit offsets"
    return None


def amplitude_tail(ansatz, h: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor | None:
    """``ln|psi|`` (n,) of ``tokens`` (n, L) from the output ``h`` (n, L, d) of the Ansatz's
    last block: ln_f, the head, the logit offsets, the masked log-softmax, the pick of each
    position's token and the sum over positions (`Ansatz.log_amplitude`'s tail, some ten
    kernels each way in torch) as one Triton kernel each way; the backward kernel writes the
    gradient of h and one row of partial parameter gradients per program, summed in a fixed
    order (beside the pass inside `aside.gradients_aside`). None where it does not apply
    (``TAIL_ENABLED`` off, not `active`, `tail_unsupported`), so the caller runs the
    module's tail."""
    if not TAIL_ENABLED or _tail_failed is not None or not active(h):
        return None
    if tail_unsupported(ansatz, h, tokens) is not None:
        return None
    n, length, d = h.shape
    lp = max(16, pow2(length))
    consts = (length, lp, max(1, _TAIL_ROWS // lp), d, *ansatz.nelec, _prec(h.dtype))
    try:
        return _AmplitudeTail.apply(
            h.contiguous(),
            tokens.contiguous(),
            *_tail_params(ansatz),
            consts,
            _split(float(ansatz.ln_f.eps)),
            aside.stream_for(h),
        )
    except Exception as exc:  # noqa: BLE001 - a kernel that does not build: the module's
        _turn_off(exc, "tail")
        return None


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float):
    """`torch.nn.functional.layer_norm` over the last dimension with an affine weight and
    bias, through the Triton kernels when `active` and the width fits (else torch's)."""
    if _norm_fits(x, weight, bias):
        try:
            return _LayerNorm.apply(x, None, weight, bias, float(eps))
        except Exception as exc:  # noqa: BLE001 - a kernel that does not build: torch's
            _turn_off(exc)
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), weight, bias, eps)


def _norm_fits(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> bool:
    d = x.shape[-1]
    same = weight.dtype == bias.dtype == x.dtype and weight.shape == bias.shape == (d,)
    return same and d <= _MAX_WIDTH and x.numel() < _MAX_ELEMENTS and active(x)


def add_layer_norm(
    x: torch.Tensor, r: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual sum s = x + r and its LayerNorm y (as `layer_norm`), ``(s, y)``: one Triton
    kernel each way when `layer_norm`'s kernels apply (the sum's
    rounding is torch's; the backward kernel adds s's own gradient to the norm's input
    gradient, the addition autograd makes where s has two uses), else torch's operations.

    Example:
        >>> x, r = torch.ones(2, 4), torch.arange(8.0).reshape(2, 4)
        >>> s, y = add_layer_norm(x, r, torch.ones(4), torch.zeros(4), 1e-5)
        >>> s[1].tolist(), [round(v, 3) for v in y[0].tolist()]
        ([5.0, 6.0, 7.0, 8.0], [-1.342, -0.447, 0.447, 1.342])
    """
    if x.shape == r.shape and x.dtype == r.dtype and _norm_fits(x, weight, bias):
        try:
            return _LayerNorm.apply(x, r, weight, bias, float(eps))
        except Exception as exc:  # noqa: BLE001 - a kernel that does not build: torch's
            _turn_off(exc)
    s = x + r
    return s, layer_norm(s, weight, bias, eps)


def causal_attention(qkv: torch.Tensor, n_heads: int) -> torch.Tensor | None:
    """Causal softmax attention of every head from the ``qkv`` projection (n, L, 3d):
    (n, L, d), heads side by side; None when the kernels do not apply (not `active`, a
    sequence over 32 positions or heads wider than 64), so the caller computes it itself."""
    n, length, d3 = qkv.shape
    d = d3 // 3
    if d3 % 3 or d % n_heads or length > _MAX_LENGTH or d // n_heads > _MAX_HEAD:
        return None
    if qkv.numel() >= _MAX_ELEMENTS:
        return None
    if not active(qkv):
        return None
    try:
        return _CausalAttention.apply(qkv.contiguous(), int(n_heads))
    except Exception as exc:  # noqa: BLE001 - a kernel that does not build: torch's
        _turn_off(exc)
        return None
