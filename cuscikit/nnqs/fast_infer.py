"""ln psi without gradient through one fused kernel per batch (and prefix stage).

Two kernels compute the same function. The compiled CUDA kernel (``cuscikit._cuda``,
ext/cuda/sci/amplitude.cu; the default where it is built and the model has d_model 16, 32, 48
or 64 with heads of 8) gives every thread two (configuration, position) rows (one at d_model
64) with plain float32 FMAs rounded to nearest: the rows' residual activations stay in
registers through every layer, a block stages one layer's weights at a time in shared memory
(every weight is read by a whole warp at once and serves both rows of a thread), a
configuration's rows sit in consecutive lanes of a warp (32 // positions configurations per
warp and row) and attention takes the other positions' keys and values by warp shuffles, in
one pass with a running maximum; the last LayerNorm, the head, the masked log-softmax and the
sum over positions run in float64. On an H200 it runs N2/cc-pVDZ at 1.25x and N2/STO-3G at
1.3x the Triton kernel below (docs/performance.md, "The CUDA amplitude kernel"). With
``products="tf32x3"`` (the default at d_model 48) or ``"fp64"`` the same kernel runs its
products on the tensor cores instead (ext/cuda/sci/amplitude_tc.cu: a warp per configuration,
the activations in the accumulator layout of ``mma``, the weights staged in fragment order from
`tc_layer_blocks`; tf32x3 rounds both TF32 parts to nearest and adds every 8-wide step in
float32 rounded to nearest): N2/cc-pVDZ at about 1.4x the FMA path (docs/performance.md,
"#tensor-cores"). The rest of this docstring describes the Triton kernel (``kernel="triton"``),
which runs every supported size.

The amplitude of `cuscikit.nnqs.ansatz.Ansatz` (token and position embedding, the pre-LayerNorm
transformer blocks with causal attention, the final LayerNorm, the head, the masked conditional
log-probabilities and their sum) runs in one kernel: a program takes ``block`` configurations,
reads their bits, and keeps the activations of all their positions in registers through every
layer; only the weights (a few hundred KiB, from the L2 cache) and one number per configuration
touch memory. The phase MLP stays the module's own (``Ansatz.phase``): wide float32 products
that cuBLAS already runs near the chip's float32 rate.

The tiny widths are laid out for the tensor cores: d_model is padded to a power of two, the
positions to a power of two per configuration, and attention runs per group of 16 feature
columns (two heads of 8) as a batched product over (configuration, group), one masked head at a
time. By default (``precision="fp64"``) the weight products (the query, key, value and output
projections, both MLP products and the head) run on the float64 tensor cores: the float32
operands are exact there, the sums are rounded to nearest in float64 and the result once to
float32. The attention products use ``tf32x3``: each float32 operand is split into a TF32 high
part and a TF32 remainder, both rounded to nearest here, and three TF32 products (low*high +
high*low + high*high) give about float32 accuracy at tensor-core speed. The rounding is done in
the kernel rather than by Triton's own ``tf32x3``, which passes the remainder unrounded: the
tensor cores then cut its low bits, an error biased towards zero that adds up along a sum (on an
H200 that put ln psi 1e-5 from float64 at amplitudes near e^-16 after training).

``precision="tf32x3"`` (the earlier default) runs the weight products in tf32x3 too. The tensor
cores add in float32 with a cut towards zero: every 8-wide step of a product's sum is
truncated, a bias that shrinks each sum and adds up along the residual stream and the sum over
positions. Its weight products are therefore summed per chunk, after Ootomo and Yokota,
"Recovering single precision accuracy from Tensor Cores while surpassing the FP32 theoretical
peak performance" (arXiv:2203.03341): the columns of the activations are halved (even, odd)
until ``k_chunk`` (16, two 8-wide steps) are left, each part's three products start from a
zero accumulator, and the parts are added in float32 rounded to nearest (``k_chunk=0``: each
product summed whole on the tensor cores, the kernel before). With K of 32 to 64 that removes
only part of the bias, since every 8-wide step is still cut: in Triton's interpreter with the
tensor cores emulated, on a trained N2/STO-3G state, the largest error went from 1.04e-5 to
7.6e-6 with chunks of 16 and to 4.9e-6 with float64 weight products (the module's own float32
pass 4.5e-6; docs/performance.md, "Trained states").
``precision="ieee"`` uses plain float32 FMAs (slower; for checking), ``"tf32"`` one TF32
product (about 5e-4 in ln psi: outside the 1e-5 budget, kept only to measure what the split
buys). The LayerNorms divide and take square roots rounded to nearest, the last one runs in
float64, and so do the masked log-softmax (the picked logit's distance to the largest first),
the sum over positions and a prefix stage's partial ln|psi|: at tiny amplitudes each position's
log-probability is large, and float32 roundings of a row scale, of max + log-sum or of the
running sum would each add an error of that size times |log p|.

Configurations that share their first orbitals share those positions' activations (the model
is autoregressive: position k sees only orbitals 0..k-1). With ``share_prefixes`` (the default)
each batch is sorted by its orbitals' lexicographic order (`token_key`) and run in stages
(`plan`): the first stage runs positions 0..e-1 once per distinct prefix of e orbitals and
stores their keys and values (6 KiB per layer for d_model 48 and 16 positions); the next runs
the remaining positions once per configuration, attending to its prefix's cached keys and
values, and adds the prefix's partial ln|psi|. Stages pad their positions to a power of two
(at least 16), so for 28 orbitals the split is 12 + 16 positions instead of 32 padded ones.
`order` gives the permutation that puts a whole set in that order, so consecutive batches
share more (the pipeline takes U in it).

It is an inference path only: the gradient (over S) stays in PyTorch autograd, and the values
agree with the module to float32 rounding (the tests hold it to 1e-5 in ln psi against float64,
like the module's own float32 pass). `FusedInference.supported` says which sizes run fused.

Example (needs a CUDA GPU and Triton):
    >>> import torch
    >>> from cuscikit import Ansatz, Molecule
    >>> mol = Molecule.load("N2")
    >>> psi = Ansatz.for_molecule(mol, seed=0, device="cuda")      # doctest: +SKIP
    >>> fast = FusedInference(psi)                                   # doctest: +SKIP
    >>> x = psi.sample(1000)[0]                                      # doctest: +SKIP
    >>> float((fast(x) - psi.log_psi(x)).abs().max()) < 1e-5        # doctest: +SKIP
    True
"""

from __future__ import annotations

import math

import torch

from cuscikit.backends import cuda
from cuscikit.nnqs._triton import gelu, interpreting, pow2, tf32x3, tl, triton

__all__ = [
    "FusedInference",
    "cuda_unsupported_reason",
    "layer_block_floats",
    "token_key",
    "unsupported_reason",
]

PRECISIONS = ("fp64", "tf32x3", "ieee", "tf32")
_MAX_D = 64  # widest d_model laid out (one 64-column tile)
_MAX_LP = 64  # longest padded sequence
_GROUP = 16  # feature columns per attention group (the tensor cores' smallest K)
_FC = 64  # MLP hidden columns per chunk


def unsupported_reason(ansatz) -> str | None:
    """Why `FusedInference` cannot run this ansatz (None: it can), device aside.

    Example:
        >>> from cuscikit import Ansatz
        >>> unsupported_reason(Ansatz(6, (3, 2), d_model=96, seed=0))
        'd_model=96 is above 64'
    """
    from cuscikit.nnqs.ansatz import Ansatz

    if not isinstance(ansatz, Ansatz):
        return f"{type(ansatz).__name__} is not a cuscikit Ansatz"
    if ansatz.dtype != torch.float32:
        return f"the ansatz is {ansatz.dtype}, the fused kernel is float32"
    d, h = ansatz.d_model, ansatz.n_heads
    if d > _MAX_D:
        return f"d_model={d} is above {_MAX_D}"
    hd = d // h
    if _GROUP % hd:
        return f"head width {hd} does not divide {_GROUP}"
    if pow2(ansatz.norb) > _MAX_LP:
        return f"norb={ansatz.norb} is above {_MAX_LP}"
    if triton is None:
        return "Triton is not installed"
    return None


if triton is not None:

    @triton.jit
    def _layer_norm(h, w_ptr, b_ptr, c, colmask, D: tl.constexpr):
        """LayerNorm of the rows of h in h's precision (correctly rounded square root and
        division: the approximate ones scale a whole row by up to a few ulp)."""
        mean = tl.sum(h, 1) / D
        xc = tl.where(colmask[None, :], h - mean[:, None], 0.0)
        var = tl.sum(xc * xc, 1) / D
        if h.dtype == tl.float64:
            rstd = 1.0 / tl.sqrt(var + 1e-5)  # float64: rounded to nearest on the GPU too
        else:
            rstd = tl.div_rn(tl.full(var.shape, 1.0, var.dtype), tl.sqrt_rn(var + 1e-5))
        w = tl.load(w_ptr + c)
        b = tl.load(b_ptr + c)
        return xc * rstd[:, None] * w[None, :] + b[None, :]

    @triton.jit
    def _dot(a, b, PREC: tl.constexpr):
        """a @ b in the precision PREC ("tf32x3", and "fp64" for the attention products:
        `tf32x3`, all of K in one accumulator)."""
        if PREC == "tf32x3" or PREC == "fp64":
            return tf32x3(a, b)
        else:
            return tl.dot(a, b, input_precision=PREC)

    @triton.jit
    def _mm(
        x,
        w_ptr,
        LD: tl.constexpr,
        cols,
        R0: tl.constexpr,
        S: tl.constexpr,
        PREC: tl.constexpr,
        KC: tl.constexpr,
    ):
        """x (M, K) @ W with W's row i at w_ptr + (R0 + S i) LD, its columns at ``cols``.

        "fp64": on the float64 tensor cores (float32 operands exact, sums rounded to nearest in
        float64), the result rounded to float32. "tf32x3" with K > KC > 0: x's columns are
        halved (even, odd) until KC are left, each part's three products run from a zero
        accumulator and the parts are summed in float32 rounded to nearest; the tensor cores
        add only KC products (KC / 8 steps) per sum."""
        K: tl.constexpr = x.shape[1]
        if PREC == "tf32x3" and KC > 0 and K > KC:
            M: tl.constexpr = x.shape[0]
            even, odd = tl.split(tl.reshape(x, (M, K // 2, 2)))
            return _mm(even, w_ptr, LD, cols, R0, 2 * S, PREC, KC) + _mm(
                odd, w_ptr, LD, cols, R0 + S, 2 * S, PREC, KC
            )
        else:
            rows = R0 + S * tl.arange(0, K)
            w = tl.load(w_ptr + rows[:, None] * LD + cols[None, :])
            if PREC == "fp64":
                return tl.dot(x.to(tl.float64), w.to(tl.float64)).to(tl.float32)
            else:
                return _dot(x, w, PREC)

    @triton.jit
    def _linear(x, w_ptr, b_ptr, c_out, N: tl.constexpr, PREC: tl.constexpr, KC: tl.constexpr):
        """x (R, K) @ W (K, N) + b with W row-major at w_ptr."""
        b = tl.load(b_ptr + c_out)
        return _mm(x, w_ptr, N, c_out, 0, 1, PREC, KC) + b[None, :]

    @triton.jit(do_not_specialize=["n"])  # one compilation for every batch size
    def _amplitude_kernel(
        cfg_ptr,
        out_ptr,
        n,
        parent_ptr,
        pamp_ptr,
        pkv_ptr,
        skv_ptr,
        tok_emb,
        pos_emb,
        ln1w,
        ln1b,
        wq,
        bq,
        wk,
        bk,
        wv,
        bv,
        wo,
        bo,
        ln2w,
        ln2b,
        w1,
        b1,
        w2,
        b2,
        lnfw,
        lnfb,
        wh,
        bias16,
        scale,
        NA: tl.constexpr,
        NB: tl.constexpr,
        L: tl.constexpr,
        LT: tl.constexpr,
        K0: tl.constexpr,
        K1: tl.constexpr,
        SP: tl.constexpr,
        LPC: tl.constexpr,
        LPS: tl.constexpr,
        WORDS: tl.constexpr,
        D: tl.constexpr,
        DP: tl.constexpr,
        NGR: tl.constexpr,
        HD: tl.constexpr,
        NL: tl.constexpr,
        FP: tl.constexpr,
        FC: tl.constexpr,
        BN: tl.constexpr,
        PREC: tl.constexpr,
        KC: tl.constexpr,
        HAS_PARENT: tl.constexpr,
        STORE: tl.constexpr,
    ):
        """Positions K0..K1-1 of BN configurations per program (SP rows each, padded).

        With HAS_PARENT the keys/values of positions 0..K0-1 come from the parent prefix's
        cache (pkv, LPC positions per head group) and its partial ln|psi| (pamp) is added;
        with STORE the keys/values of positions 0..K1-1 go to skv (LPS positions per group)."""
        R: tl.constexpr = BN * SP
        NG: tl.constexpr = DP // 16
        G: tl.constexpr = 16 // HD
        pid = tl.program_id(0)
        rows = tl.arange(0, R)
        k = K0 + rows % SP  # position of each row
        cfg = pid * BN + rows // SP  # configuration of each row
        valid = cfg < n
        j = tl.arange(0, LT)
        # tokens t_j = n_j,alpha + 2 n_j,beta of each row's configuration: bits 2j, 2j+1
        inside = j[None, :] < L
        word = tl.load(
            cfg_ptr + cfg[:, None].to(tl.int64) * WORDS + (j[None, :] // 32),
            mask=valid[:, None] & inside,
            other=0,
        )
        t2 = ((word >> (2 * (j[None, :] % 32)).to(tl.int64)) & 3).to(tl.int32)
        t2 = tl.where(inside, t2, 0)
        before = j[None, :] < k[:, None]
        used_a = tl.sum(tl.where(before, t2 & 1, 0), 1)
        used_b = tl.sum(tl.where(before, t2 >> 1, 0), 1)
        target = tl.sum(tl.where(j[None, :] == k[:, None], t2, 0), 1)
        prev = tl.sum(tl.where(j[None, :] == k[:, None] - 1, t2, 0), 1)
        inp = tl.where(k == 0, 4, prev)  # the start token, then the previous orbital's

        c = tl.arange(0, DP)
        colmask = c < D
        h = tl.load(tok_emb + inp[:, None] * DP + c[None, :])
        h += tl.load(pos_emb + tl.minimum(k, LT - 1)[:, None] * DP + c[None, :])

        c16 = tl.arange(0, 16)
        cf = tl.arange(0, FC)
        qi = tl.arange(0, SP)
        causal = qi[None, :] <= qi[:, None]  # (query, key)
        # the cache layout: (prefix, layer, k|v, group, position, 16), real groups only
        bg = tl.arange(0, BN * NG)
        gcfg = pid * BN + bg // NG  # configuration of each (configuration, group) pair
        grp = bg % NG
        gok = (gcfg < n) & (grp < NGR)
        if HAS_PARENT:
            par = tl.load(parent_ptr + gcfg, mask=gcfg < n, other=0).to(tl.int64)
            pc = tl.arange(0, LPC)
            pbase = pkv_ptr + par * (NL * 2 * NGR * LPC * 16) + grp * (LPC * 16)
            pofs = pc[None, :, None] * 16 + c16[None, None, :]
            pmask = gok[:, None, None] & (pc[None, :, None] < K0)
            pkey = pc[None, None, :] < K0  # (group, query, key)
        if STORE:
            sbase = skv_ptr + gcfg.to(tl.int64) * (NL * 2 * NGR * LPS * 16) + grp * (LPS * 16)
            sofs = (K0 + qi)[None, :, None] * 16 + c16[None, None, :]
            smask = gok[:, None, None] & ((K0 + qi)[None, :, None] < K1)
        for layer in range(NL):
            sq = layer * DP * DP
            sv = layer * DP
            x = _layer_norm(h, ln1w + sv, ln1b + sv, c, colmask, D)
            q = _linear(x, wq + sq, bq + sv, c, DP, PREC, KC) * scale
            kk = _linear(x, wk + sq, bk + sv, c, DP, PREC, KC)
            v = _linear(x, wv + sq, bv + sv, c, DP, PREC, KC)
            # (configuration, position, group, 16) -> (configuration * group, position, 16)
            qg = tl.reshape(
                tl.permute(tl.reshape(q, (BN, SP, NG, 16)), (0, 2, 1, 3)), (BN * NG, SP, 16)
            )
            kg = tl.reshape(
                tl.permute(tl.reshape(kk, (BN, SP, NG, 16)), (0, 2, 1, 3)), (BN * NG, SP, 16)
            )
            vg = tl.reshape(
                tl.permute(tl.reshape(v, (BN, SP, NG, 16)), (0, 2, 1, 3)), (BN * NG, SP, 16)
            )
            kt = tl.permute(kg, (0, 2, 1))
            if HAS_PARENT:
                lofs = layer * (2 * NGR * LPC * 16)
                pk = tl.load(pbase[:, None, None] + lofs + pofs, mask=pmask, other=0.0)
                pv = tl.load(
                    pbase[:, None, None] + lofs + NGR * LPC * 16 + pofs, mask=pmask, other=0.0
                )
                pkt = tl.permute(pk, (0, 2, 1))
            if STORE:
                lofs_s = layer * (2 * NGR * LPS * 16)
                tl.store(sbase[:, None, None] + lofs_s + sofs, kg, mask=smask)
                tl.store(sbase[:, None, None] + lofs_s + NGR * LPS * 16 + sofs, vg, mask=smask)
                if HAS_PARENT:  # the prefix's own keys/values travel on to the children
                    tl.store(sbase[:, None, None] + lofs_s + pofs, pk, mask=pmask)
                    tl.store(sbase[:, None, None] + lofs_s + NGR * LPS * 16 + pofs, pv, mask=pmask)
            o = tl.zeros((BN * NG, SP, 16), dtype=tl.float32)
            for g in tl.static_range(G):
                head = ((c16 // HD) == g).to(tl.float32)
                qh = qg * head[None, None, :]
                s = _dot(qh, kt, PREC)
                s = tl.where(causal[None, :, :], s, -1.0e30)
                m = tl.max(s, 2)
                if HAS_PARENT:
                    sc = _dot(qh, pkt, PREC)
                    sc = tl.where(pkey, sc, -1.0e30)
                    m = tl.maximum(m, tl.max(sc, 2))
                    pcs = tl.exp(sc - m[:, :, None])
                p = tl.exp(s - m[:, :, None])
                den = tl.sum(p, 2)
                if HAS_PARENT:
                    den += tl.sum(pcs, 2)
                # one correctly rounded reciprocal per row (the approximate division is 2 ulp)
                inv = tl.div_rn(tl.full(den.shape, 1.0, tl.float32), den)
                if HAS_PARENT:
                    og = _dot(p, vg * head[None, None, :], PREC)
                    og += _dot(pcs, pv * head[None, None, :], PREC)
                    o += og * inv[:, :, None]
                else:
                    p = p * inv[:, :, None]
                    o += _dot(p, vg * head[None, None, :], PREC)
            y = tl.reshape(tl.permute(tl.reshape(o, (BN, NG, SP, 16)), (0, 2, 1, 3)), (R, DP))
            h += _linear(y, wo + sq, bo + sv, c, DP, PREC, KC)
            x = _layer_norm(h, ln2w + sv, ln2b + sv, c, colmask, D)
            acc = tl.zeros((R, DP), dtype=tl.float32)
            for f0 in range(0, FP, FC):
                bf = tl.load(b1 + layer * FP + f0 + cf)
                a = _mm(x, w1 + layer * DP * FP + f0, FP, cf, 0, 1, PREC, KC) + bf[None, :]
                acc += _mm(gelu(a), w2 + (layer * FP + f0) * DP, DP, c, 0, 1, PREC, KC)
            h += acc + tl.load(b2 + sv + c)[None, :]

        # the last LayerNorm in float64: a rounding of its row scale would scale all four
        # logits of a position together, an error of that size times |log p|
        x = _layer_norm(h.to(tl.float64), lnfw, lnfb, c, colmask, D).to(tl.float32)
        logits = _mm(x, wh, 16, c16, 0, 1, PREC, KC)
        kb = tl.minimum(k, LT - 1)
        logits += tl.load(bias16 + kb[:, None] * 16 + c16[None, :])  # head bias + logit_bias[k]

        # the tokens that keep the sector reachable, and the masked log-softmax
        ua = used_a[:, None] + (c16[None, :] & 1)
        ub = used_b[:, None] + (c16[None, :] >> 1)
        rem = (L - 1 - k)[:, None]
        real = c16[None, :] < 4
        allowed = (ua <= NA) & (NA - ua <= rem) & (ub <= NB) & (NB - ub <= rem) & real
        n_allowed = tl.sum(allowed.to(tl.int32), 1)
        use = allowed | (real & (n_allowed == 0)[:, None])
        # in float64 from here on, with the picked logit's distance to the largest taken first:
        # at tiny amplitudes the conditional log-probabilities are large and their float32
        # roundings (of max + log sum, and of the running sum) would add up
        lg = tl.where(use, logits, -1.0e30).to(tl.float64)
        mx = tl.max(lg, 1)
        ex = tl.where(use, tl.exp(lg - mx[:, None]), 0.0)
        pick = c16[None, :] == target[:, None]
        lp = (tl.sum(tl.where(pick, lg, 0.0), 1) - mx) - tl.log(tl.sum(ex, 1))
        ok = tl.sum((pick & allowed).to(tl.int32), 1)
        lp = tl.where(k < K1, lp, 0.0)
        bad = ((k < K1) & (ok == 0)).to(tl.int32)
        amp = 0.5 * tl.sum(tl.reshape(lp, (BN, SP)), 1)
        nbad = tl.sum(tl.reshape(bad, (BN, SP)), 1)
        amp = tl.where(nbad > 0, float("-inf"), amp)
        ob = pid * BN + tl.arange(0, BN)
        if HAS_PARENT:
            pa = tl.load(parent_ptr + ob, mask=ob < n, other=0)
            amp += tl.load(pamp_ptr + pa, mask=ob < n, other=0.0)
        tl.store(out_ptr + ob, amp, mask=ob < n)


def _pad(t: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    out = torch.zeros(shape, dtype=torch.float32, device=t.device)
    out[tuple(slice(0, s) for s in t.shape)] = t.detach().to(torch.float32)
    return out


KERNELS = ("auto", "cuda", "triton")
#: the CUDA kernel's products, in its numbering (AmplitudeStage::products)
CUDA_PRODUCTS = ("fma", "fp64", "tf32x3")
_TC_DEFAULT_D = 48  # the width where the tensor-core products are the default
_CUDA_WIDTHS = (16, 32, 48, 64)  # d_model values the CUDA kernel is compiled for (heads of 8)
_CUDA_TWO_ROWS_MAX_D = 48  # the widest d_model with two rows per thread (kTwoRowsMaxD)


def cuda_unsupported_reason(ansatz) -> str | None:
    """Why the CUDA amplitude kernel cannot run this ansatz here (None: it can).

    Example:
        >>> from cuscikit import Ansatz
        >>> cuda_unsupported_reason(Ansatz(6, (3, 2), d_model=40, n_heads=5, seed=0))
        'd_model=40 with heads of 8 is not compiled (16-64 by 16, heads of 8 are)'
    """
    d, hd = ansatz.d_model, ansatz.d_model // ansatz.n_heads
    if d not in _CUDA_WIDTHS or hd != 8:
        return f"d_model={d} with heads of {hd} is not compiled (16-64 by 16, heads of 8 are)"
    if ansatz.dtype != torch.float32:
        return f"the ansatz is {ansatz.dtype}, the kernel is float32"
    if ansatz.norb > 64:
        return f"norb={ansatz.norb} is above 64"
    if ansatz.device.type != "cuda":
        return f"the ansatz is on {ansatz.device.type}"
    try:
        mod = cuda()
    except Exception as exc:  # noqa: BLE001 - any reason the compiled module cannot load
        return str(exc)
    if not hasattr(mod, "amplitude_stage"):
        return "cuscikit._cuda was built without the amplitude kernel"
    return None


def layer_block_floats(d: int) -> int:
    """Floats per layer in the CUDA kernel's weight layout: the four d x d attention
    matrices, the two MLP matrices (d x 4d, 4d x d), eight d-vectors (the attention biases and
    both LayerNorms), the MLP biases (4d, d); padded to a multiple of 4."""
    return -(-(4 * d * d + 8 * d * d + 9 * d + 4 * d) // 4) * 4


def _layer_blocks(packed: dict[str, torch.Tensor], d: int, nl: int) -> torch.Tensor:
    """(n_layers, layer_block_floats(d)) float32: each layer's parameters in the CUDA
    kernel's order, (in, out) matrices row-major without the padding of ``packed``."""
    f = 4 * d
    parts = []
    for i in range(nl):
        mats = [packed[k][i, :d, :d] for k in ("wq", "wk", "wv", "wo")]
        mats += [packed["w1"][i, :d, :f], packed["w2"][i, :f, :d]]
        vecs = [packed[k][i, :d] for k in ("bq", "bk", "bv", "bo", "ln1w", "ln1b", "ln2w", "ln2b")]
        vecs += [packed["b1"][i, :f], packed["b2"][i, :d]]
        flat = torch.cat([t.reshape(-1) for t in mats + vecs])
        pad = layer_block_floats(d) - flat.numel()
        parts.append(torch.nn.functional.pad(flat, (0, pad)))
    return torch.stack(parts).contiguous()


def tc_fragment_order(layers: torch.Tensor, d: int) -> torch.Tensor:
    """`_layer_blocks` with every matrix (K x N) in the order of the tensor-core products'
    fragments: element ``((kt * N/8 + nt) * 32 + 4 g + t) * 2 + c`` of a matrix is
    ``W[8 kt + 2 t + c, 8 nt + g]`` (lane 4 g + t of fragment (kt, nt) holds rows 2t and 2t + 1
    of its 8-row step, column g); the vectors stay in place.

    Example:
        >>> import torch
        >>> blocks = torch.arange(2 * layer_block_floats(16), dtype=torch.float32).view(2, -1)
        >>> frags = tc_fragment_order(blocks, 16)
        >>> w = blocks[0, : 16 * 16].view(16, 16)  # the query matrix of layer 0
        >>> bool(frags[0, 2 * (4 * 3 + 1)] == w[2, 3])  # fragment (0, 0), lane 4*3 + 1, c = 0
        True
    """
    out = layers.clone()
    for off, k, n in _tc_matrices(d):
        w = layers[:, off : off + k * n].reshape(-1, k // 8, 4, 2, n // 8, 8)
        # (layer, kt, t, c, nt, g) -> (layer, kt, nt, g, t, c)
        out[:, off : off + k * n] = w.permute(0, 1, 4, 5, 2, 3).reshape(-1, k * n)
    return out.contiguous()


def _tc_matrices(d: int) -> list[tuple[int, int, int]]:
    """(float offset, K, N) of the six matrices in a layer block of `_layer_blocks`."""
    f = 4 * d
    return [(i * d * d, d, d) for i in range(4)] + [(4 * d * d, d, f), (4 * d * d + d * f, f, d)]


def tf32_round(x: torch.Tensor) -> torch.Tensor:
    """float32 rounded to TF32 (10 explicit mantissa bits), to nearest with ties away from zero
    (the CUDA kernel's rounding; finite values).

    Example:
        >>> import torch
        >>> tf32_round(torch.tensor([1 + 2**-11, 1 + 2**-12, -(1 + 2**-11)])).tolist()
        [1.0009765625, 1.0, -1.0009765625]
    """
    bits = x.contiguous().view(torch.int32)
    return ((bits + 0x1000) & -0x2000).view(torch.float32)


def tc_layer_blocks(layers: torch.Tensor, d: int, products: str) -> torch.Tensor:
    """The layer blocks the tensor-core products stage (``AmplitudeNet::layers_tc``): per
    layer the six matrices in fragment order (`tc_fragment_order`) at 8 bytes a weight, for
    ``products="fp64"`` each weight as float64, for ``"tf32x3"`` a lane's pair as (hi, hi, lo,
    lo) with hi = `tf32_round` (w) and lo = `tf32_round` (w - hi); then the vectors as float32.

    Example:
        >>> import torch
        >>> blocks = torch.randn(2, layer_block_floats(16))
        >>> tc = tc_layer_blocks(blocks, 16, "fp64")
        >>> tc.shape == (2, layer_block_floats(16) + 12 * 16 * 16)
        True
        >>> w = tc_fragment_order(blocks, 16)[:, : 12 * 16 * 16]
        >>> bool((tc[:, : 24 * 16 * 16].contiguous().view(torch.float64) == w.double()).all())
        True
    """
    if products not in ("fp64", "tf32x3"):
        raise ValueError(f"products must be 'fp64' or 'tf32x3', got {products!r}")
    frags = tc_fragment_order(layers, d)
    m = 12 * d * d  # the matrices' floats: 4 d^2 + 2 d (4d)
    w = frags[:, :m]
    if products == "fp64":
        wide = w.double().view(torch.float32)  # each weight as two float32 words
    else:
        hi = tf32_round(w)
        lo = tf32_round(w - hi)
        pairs = w.shape[1] // 2
        wide = torch.cat([hi.view(-1, pairs, 2), lo.view(-1, pairs, 2)], dim=2).view(-1, 2 * m)
    return torch.cat([wide.reshape(len(layers), 2 * m), frags[:, m:]], dim=1).contiguous()


class FusedInference:
    """ln psi (complex64, no gradient) of an `Ansatz` through the fused amplitude kernel.

    The weights are packed (transposed, padded) on the first call and again whenever a
    parameter changed in place (an optimiser step), so one object follows a training run. A
    change is seen through the parameters' autograd version counters: a write that does not
    move them (through ``.data``, or a CUDA graph's replay) must be announced with
    ``torch.autograd.graph.increment_version`` (as the recorded optimiser stage does).

    Args:
        ansatz: a float32 `Ansatz` on a CUDA device (`unsupported_reason` says which sizes).
        precision: the Triton kernel's products: "fp64" (None, the default: the weight
            products on the float64 tensor cores, the attention products tf32x3), "tf32x3"
            (all products tf32x3), "ieee" (float32 FMAs) or "tf32" (outside the 1e-5 budget;
            measurement only).
        block: configurations per program (None: 8 for up to 16 orbitals, else 1); a prefix
            stage with fewer padded positions takes proportionally more (the same rows).
        num_warps: warps per program (None: 8 for up to 16 orbitals, else 4).
        share_prefixes: run shared first orbitals once per batch (`plan`); False runs every
            configuration's whole sequence.
        k_chunk: with "tf32x3", the terms of a weight product the tensor cores add before the
            sum leaves them (a power of two >= 16, Triton's smallest K for float32 products, or
            0: all of K in one accumulator; None: 16); the chunks are added in float32 rounded
            to nearest (the module docstring says why).
        num_stages: Triton's software pipelining depth of the kernel's loops (None: Triton's
            default); fewer stages keep fewer weight tiles in shared memory.
        maxnreg: the most registers per thread the compiler may use (None: no limit; the
            N2/cc-pVDZ kernel then takes all 255, two programs per SM; with a limit it spills,
            and on an H200 it ran slower, docs/performance.md). Neither option changes the
            arithmetic: ln psi is the same to the bit.
        kernel: "cuda" (the compiled kernel of ``cuscikit._cuda``: one or two positions per
            thread, float32 FMAs rounded to nearest, the weights of a layer in shared memory;
            d_model 16, 32, 48 or 64 with heads of 8), "triton" (the kernel above, which the options
            ``precision``, ``block``, ``num_warps``, ``k_chunk``, ``num_stages`` and
            ``maxnreg`` configure), or "auto" (default: CUDA where it runs, unless one of
            those options is given). A stage of more than 32 positions always runs on Triton.
        rows: the CUDA kernel's rows per thread: 1, or 2 for d_model up to 48 (every weight it
            reads from shared memory then serves two configurations); None: its default (2 up
            to d_model 48, else 1). Giving it asks for the CUDA kernel.
        products: the CUDA kernel's weight and attention products: "fma" (float32 FMAs, one
            thread per row, ``rows``), "fp64" (on the float64 tensor cores: the float32
            operands exact, the sums rounded to nearest) or "tf32x3" (each operand split into
            two TF32 parts rounded to nearest, three products per 8-wide step, the steps added
            in float32); both tensor-core paths run a warp per configuration as a 16-row tile,
            for d_model 16, 32 or 48 and stages of at most 16 positions after at most 32 cached
            ones (other stages take the FMA path). None (default): "tf32x3" at d_model 48
            (the cc-pVDZ-size default model, 1.4x the FMA path there), else "fma" (faster at
            d_model 32). Giving it asks for the CUDA kernel.

    Raises:
        ValueError: for an unsupported ansatz or device, an unknown precision or kernel,
            ``kernel="cuda"`` (or ``rows``) where that kernel cannot run or with an option of
            the Triton kernel, ``rows`` other than None, 1 or 2 (1 above d_model 48), an
            unknown ``products`` or one other than "fma" together with ``rows``.

    Example (needs a CUDA GPU):
        >>> from cuscikit import Ansatz
        >>> psi = Ansatz(10, (4, 3), seed=0, device="cuda")               # doctest: +SKIP
        >>> x = psi.sample(200, generator=1)[0]                          # doctest: +SKIP
        >>> d = FusedInference(psi)(x) - psi.log_psi(x)                  # doctest: +SKIP
        >>> float(d.abs().max()) < 1e-5                                  # doctest: +SKIP
        True
    """

    def __init__(
        self,
        ansatz,
        *,
        precision: str | None = None,
        block: int | None = None,
        num_warps: int | None = None,
        share_prefixes: bool = True,
        k_chunk: int | None = None,
        num_stages: int | None = None,
        maxnreg: int | None = None,
        kernel: str = "auto",
        rows: int | None = None,
        products: str | None = None,
    ) -> None:
        triton_options = {
            k: v
            for k, v in (
                ("precision", precision),
                ("block", block),
                ("num_warps", num_warps),
                ("k_chunk", k_chunk),
                ("num_stages", num_stages),
                ("maxnreg", maxnreg),
            )
            if v is not None
        }
        precision = "fp64" if precision is None else precision
        k_chunk = 16 if k_chunk is None else k_chunk
        why = unsupported_reason(ansatz)
        if why is None and ansatz.device.type != "cuda" and not interpreting():
            why = f"the ansatz is on {ansatz.device.type}, the fused kernel needs CUDA"
        if why is not None:
            raise ValueError(f"fused inference unavailable: {why}")
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
        self.ansatz = ansatz
        self.precision = precision
        self.lp = max(16, pow2(ansatz.norb))
        # measured on an H200 (docs/performance.md): 16 positions, 8 configurations and 8 warps
        # per program; 32 positions, one configuration and 4 warps (larger tiles spill)
        short = self.lp <= 16
        self.block = int(block) if block is not None else (8 if short else 1)
        if self.block <= 0 or self.block & (self.block - 1):
            raise ValueError(f"block must be a positive power of two, got {block!r}")
        self.num_warps = int(num_warps) if num_warps is not None else (8 if short else 4)
        self.share_prefixes = bool(share_prefixes)
        self.k_chunk = int(k_chunk)
        if self.k_chunk and (self.k_chunk < 16 or self.k_chunk & (self.k_chunk - 1)):
            raise ValueError(f"k_chunk must be 0 or a power of two >= 16, got {k_chunk!r}")
        self.num_stages = None if num_stages is None else int(num_stages)
        if self.num_stages is not None and self.num_stages < 1:
            raise ValueError(f"num_stages must be None or >= 1, got {num_stages!r}")
        self.maxnreg = None if maxnreg is None else int(maxnreg)
        if self.maxnreg is not None and not 24 <= self.maxnreg <= 255:
            raise ValueError(f"maxnreg must be None or 24..255, got {maxnreg!r}")
        if kernel not in KERNELS:
            raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
        if rows is not None:
            if rows not in (1, 2) or (rows == 2 and ansatz.d_model > _CUDA_TWO_ROWS_MAX_D):
                raise ValueError(
                    f"rows must be None, 1, or 2 for d_model <= {_CUDA_TWO_ROWS_MAX_D}, "
                    f"got {rows!r} (d_model {ansatz.d_model})"
                )
            if kernel == "triton":
                raise ValueError("rows configures the CUDA kernel, not kernel='triton'")
            kernel = "cuda"
        #: the CUDA kernel's rows per thread (0: its default)
        self.rows = 0 if rows is None else int(rows)
        if products is not None:
            if products not in CUDA_PRODUCTS:
                raise ValueError(f"products must be one of {CUDA_PRODUCTS}, got {products!r}")
            if products != "fma" and rows is not None:
                raise ValueError("rows configures the FMA path, not products=" + repr(products))
            if kernel == "triton":
                raise ValueError("products configures the CUDA kernel, not kernel='triton'")
            kernel = "cuda"
        #: the CUDA kernel's products ("fma", "fp64" or "tf32x3"); by default tf32x3 at d_model
        #: 48 (faster there on an H200, docs/performance.md#tensor-cores), else fma
        self.products = products or (
            "tf32x3" if rows is None and ansatz.d_model == _TC_DEFAULT_D else "fma"
        )
        if kernel == "cuda" and triton_options:
            raise ValueError(
                f"{', '.join(triton_options)} configure the Triton kernel, not kernel='cuda'"
            )
        cuda_why = None if kernel == "triton" or triton_options else cuda_unsupported_reason(ansatz)
        if kernel == "cuda" and cuda_why is not None:
            raise ValueError(f"the CUDA amplitude kernel is unavailable: {cuda_why}")
        #: "cuda" or "triton": which kernel runs the stages (``kernel="auto"``: CUDA where it
        #: runs, unless an option of the Triton kernel was given)
        self.kernel = (
            "cuda" if kernel != "triton" and not triton_options and cuda_why is None else "triton"
        )
        self.last_plan: list[int] | None = None
        self._packed: dict[str, torch.Tensor] | None = None
        self._versions: tuple[int, ...] | None = None

    # ------------------------------------------------------------------ weights
    def _version_key(self) -> tuple[int, ...]:
        return tuple(p._version for p in self.ansatz.parameters()) + tuple(
            p.data_ptr() for p in self.ansatz.parameters()
        )

    def pack(self) -> dict[str, torch.Tensor]:
        """The weights in the kernel's layout (float32, (in, out), padded with zeros)."""
        a = self.ansatz
        d, dp, lp = a.d_model, max(16, pow2(a.d_model)), self.lp
        f = 4 * d
        fp = _FC * math.ceil(f / _FC)
        nl = a.n_layers
        blocks = list(a.blocks)

        def stack(fn, shape):
            return torch.stack([_pad(fn(b), shape) for b in blocks]).contiguous()

        def qkv(i):
            return lambda b: b.attn.qkv.weight[i * d : (i + 1) * d].t()

        def qkv_b(i):
            return lambda b: b.attn.qkv.bias[i * d : (i + 1) * d]

        with torch.no_grad():
            bias = torch.zeros((lp, 16), dtype=torch.float32, device=a.device)
            bias[: a.norb, :4] = a.logit_bias.float() + a.head.bias.float()
            packed = {
                "tok_emb": _pad(a.token_embedding.weight, (5, dp)),
                "pos_emb": _pad(a.position_embedding.weight, (lp, dp)),
                "ln1w": stack(lambda b: b.ln1.weight, (dp,)),
                "ln1b": stack(lambda b: b.ln1.bias, (dp,)),
                "wq": stack(qkv(0), (dp, dp)),
                "bq": stack(qkv_b(0), (dp,)),
                "wk": stack(qkv(1), (dp, dp)),
                "bk": stack(qkv_b(1), (dp,)),
                "wv": stack(qkv(2), (dp, dp)),
                "bv": stack(qkv_b(2), (dp,)),
                "wo": stack(lambda b: b.attn.proj.weight.t(), (dp, dp)),
                "bo": stack(lambda b: b.attn.proj.bias, (dp,)),
                "ln2w": stack(lambda b: b.ln2.weight, (dp,)),
                "ln2b": stack(lambda b: b.ln2.bias, (dp,)),
                "w1": stack(lambda b: b.fc.weight.t(), (dp, fp)),
                "b1": stack(lambda b: b.fc.bias, (fp,)),
                "w2": stack(lambda b: b.proj.weight.t(), (fp, dp)),
                "b2": stack(lambda b: b.proj.bias, (dp,)),
                "lnfw": _pad(a.ln_f.weight, (dp,)),
                "lnfb": _pad(a.ln_f.bias, (dp,)),
                "wh": _pad(a.head.weight.t(), (dp, 16)),
                "bias16": bias,
            }
        if self.kernel == "cuda":
            packed["layers"] = _layer_blocks(packed, d, nl)
            if self.products != "fma":
                packed["layers_tc"] = tc_layer_blocks(packed["layers"], d, self.products)
        self._meta = {
            "D": d,
            "DP": dp,
            "NGR": -(-d // 16),
            "FP": fp,
            "NL": nl,
            "HD": d // a.n_heads,
        }
        return packed

    def _weights(self) -> dict[str, torch.Tensor]:
        key = self._version_key()
        if self._packed is None or key != self._versions:
            self._packed = self.pack()
            self._versions = key
        return self._packed

    # ------------------------------------------------------------------ checking
    #: largest |ln psi - ln psi(float64 module)| accepted by `verify`'s callers
    tolerance = 1e-5
    #: the pipeline also keeps the kernel while its error is within this factor of the float32
    #: module's own error on the same configurations (`errors`): a trained network with large
    #: weights can put the module itself past `tolerance`, and the module is what would run
    #: instead. A wrong kernel is off by far more than float32 rounding.
    module_factor = 4.0

    @torch.no_grad()
    def verify(self, configs) -> float:
        """Largest |ln psi| difference between this path and the module evaluated in float64
        (a float64 copy of the ansatz) on ``configs``; configurations outside the sector
        must be -inf in both (inf otherwise). Both parts of ln psi count.

        Example (needs a CUDA GPU):
            >>> from cuscikit import Ansatz
            >>> psi = Ansatz(10, (4, 3), seed=0, device="cuda")           # doctest: +SKIP
            >>> FusedInference(psi).verify(psi.sample(100)[0]) < 1e-5    # doctest: +SKIP
            True
        """
        return self.errors(configs, module=False)[0]

    @torch.no_grad()
    def errors(self, configs, *, module: bool = True) -> tuple[float, float]:
        """``(this path, the module)``: each one's largest |ln psi| difference from the module
        evaluated in float64 on ``configs``, as `verify` measures it; the module in its own
        precision (float32), the one the pipeline falls back to (nan with ``module=False``).

        Example (needs a CUDA GPU):
            >>> from cuscikit import Ansatz
            >>> psi = Ansatz(10, (4, 3), seed=0, device="cuda")           # doctest: +SKIP
            >>> kernel, module = FusedInference(psi).errors(psi.sample(100)[0])  # doctest: +SKIP
            >>> kernel < 1e-5 and module < 1e-5                          # doctest: +SKIP
            True
        """
        import copy

        if len(configs) == 0:
            return 0.0, 0.0
        ref = copy.deepcopy(self.ansatz).to(torch.float64).log_psi(configs)
        fin = torch.isfinite(ref.real)

        def error(got: torch.Tensor) -> float:
            got = got.to(torch.complex128)
            if not torch.equal(fin, torch.isfinite(got.real)):
                return math.inf
            if not bool(fin.any()):
                return 0.0
            return float((got[fin] - ref[fin]).abs().max())

        own = error(self.ansatz.log_psi(configs)) if module else math.nan
        return error(self(configs)), own

    # ------------------------------------------------------------------ evaluation
    def _launch(self, x, out, k0, k1, *, parent=None, pamp=None, pkv=None, store=None):
        """One kernel over the configurations ``x`` for positions k0..k1-1."""
        a = self.ansatz
        w = self._weights()
        m = self._meta
        na, nb = a.nelec
        if self.kernel == "cuda" and k1 - k0 <= 32:
            cuda().amplitude_stage(
                x,
                k0,
                k1,
                a.norb,
                na,
                nb,
                m["D"],
                m["HD"],
                1.0 / math.sqrt(m["HD"]),
                w["layers"],
                w["tok_emb"],
                w["pos_emb"],
                w["lnfw"],
                w["lnfb"],
                w["wh"],
                w["bias16"],
                parent,
                pamp,
                pkv,
                store,
                out if out.dtype == torch.float64 else None,
                out if out.dtype == torch.float32 else None,
                torch.cuda.current_stream(x.device).cuda_stream,
                rows=self.rows,
                products=CUDA_PRODUCTS.index(self.products),
                layers_tc=w.get("layers_tc"),
            )
            return
        sp = max(16, pow2(k1 - k0))
        bn = max(1, (self.block * self.lp) // sp)  # the rows per program of the whole pass
        n = x.shape[0]
        dummy = out
        compile_options = {
            k: v
            for k, v in (("num_stages", self.num_stages), ("maxnreg", self.maxnreg))
            if v is not None and not interpreting()
        }
        _amplitude_kernel[(triton.cdiv(n, bn),)](
            x,
            out,
            n,
            parent if parent is not None else dummy,
            pamp if pamp is not None else dummy,
            pkv if pkv is not None else dummy,
            store if store is not None else dummy,
            *(w[name] for name in _ORDER),
            1.0 / math.sqrt(m["HD"]),
            NA=na,
            NB=nb,
            L=a.norb,
            LT=self.lp,
            K0=k0,
            K1=k1,
            SP=sp,
            LPC=max(16, pow2(k0)),
            LPS=max(16, pow2(k1)),
            WORDS=a.n_words,
            D=m["D"],
            DP=m["DP"],
            NGR=m["NGR"],
            HD=m["HD"],
            NL=m["NL"],
            FP=m["FP"],
            FC=_FC,
            BN=bn,
            PREC=self.precision,
            KC=self.k_chunk,
            HAS_PARENT=parent is not None,
            STORE=store is not None,
            num_warps=self.num_warps,
            **compile_options,
        )

    def plan(self, configs: torch.Tensor) -> tuple[list[int], list[int]]:
        """The prefix stages for a batch: (ends, counts). Stage i runs positions
        ends[i-1]..ends[i]-1 once per distinct prefix of ends[i] orbitals (counts[i] of them;
        the last stage once per configuration), chosen to minimise the padded rows
        (each stage pads its positions to a power of two, at least 16).

        Example:
            >>> from cuscikit import Ansatz
            >>> from cuscikit.sci.configs import all_determinants
            >>> psi = Ansatz(20, (2, 2), seed=0)
            >>> x = psi.config_words(all_determinants(20, (2, 2)))
            >>> FusedInference.plan_for(psi, x, share_prefixes=True)
            ([4, 20], [121, 36100])
        """
        return self.plan_for(self.ansatz, configs, self.share_prefixes, self.kernel)

    @staticmethod
    def plan_for(
        ansatz, configs: torch.Tensor, share_prefixes: bool = True, kernel: str = "triton"
    ):
        """`plan` without a `FusedInference` (the planning needs no GPU) for the costs of
        ``kernel`` ("triton": a stage of p positions pads them to max(16, 2^ceil(log2 p))
        rows; "cuda": a warp holds 32 // p configurations, so a configuration costs
        32 / (32 // p) lanes, and at most one prefix stage: on an H200 N2/cc-pVDZ ran at
        3.8e6/s with [12, 28], 3.0-3.2e6/s with three to five stages)."""
        return FusedInference._planned(ansatz, configs, share_prefixes, kernel)[:2]

    @staticmethod
    def _planned(ansatz, configs: torch.Tensor, share_prefixes: bool, kernel: str = "triton"):
        """(ends, counts, sorted) of `plan_for`; ``sorted``: (keys, permutation) of the
        configurations' `token_key` sort that the plan was made from (None for one stage;
        the permutation None when they were in that order already)."""
        norb, n = ansatz.norb, len(configs)
        if not share_prefixes or n < 2 or norb <= 16:
            return [norb], [n], None
        top = min(norb - 1, 32)
        ends = torch.arange(1, top + 1, device=configs.device)
        key = token_key(configs)

        def distinct_prefixes(key):
            d = key[1:] ^ key[:-1]
            return ((d[None, :] >> (64 - 2 * ends)[:, None]) != 0).sum(1) + 1

        # one read from the device: the counts if the batch is in the prefix order already (the
        # pipeline's batches), and whether it is
        ordered = _in_order(key).view(1)
        counts = torch.cat([distinct_prefixes(key), ordered.to(torch.int64)]).tolist()
        if counts.pop():
            srt = (key, None)
        else:
            srt = torch.sort(key)
            counts = distinct_prefixes(srt[0]).tolist()
        distinct = {0: 0, **dict(zip(range(1, top + 1), counts, strict=True))}
        distinct[norb] = n

        def rows(a, b):
            p = b - a
            if kernel == "cuda" and p <= 32:
                return distinct[b] * 32 / (32 // p)
            return distinct[b] * max(16, pow2(p))

        # best[b]: fewest padded rows for positions 0..b-1, one extra stage costing 1/32 pass
        overhead = n * max(16, pow2(norb)) / 32
        best = {0: (0.0, [])}
        for b in [*range(1, top + 1), norb]:
            # the CUDA kernel: one prefix stage at most (a middle stage copies its parent's
            # keys and values per prefix, which cost more than its rows saved on an H200)
            starts = [0] if kernel == "cuda" and b < norb else list(best)
            best[b] = min(
                (best[a][0] + rows(a, b) + (overhead if a else 0.0), [*best[a][1], b])
                for a in starts
                if a < b
            )
        ends_best = best[norb][1]
        return ends_best, [distinct[e] for e in ends_best], srt

    def order(self, configs: torch.Tensor) -> torch.Tensor:
        """A permutation that puts configurations sharing their first orbitals next to each
        other (the orbitals' lexicographic order): batches taken in this order share more
        prefixes. ``configs``: int64 tensor (n, words) on the device."""
        return torch.argsort(token_key(configs))

    def amplitude(self, configs: torch.Tensor, ends: list[int] | None = None) -> torch.Tensor:
        """ln|psi| (float32, (n,)) of configurations (int64 tensor (n, words) on the device).

        ``ends``: the stages' last positions + 1, increasing, the last = norb, the others at
        most 32 (None: `plan`'s choice); e.g. ``[12, 28]`` runs orbitals 0-11 once per distinct
        prefix, then 12-27 per configuration with the prefix's keys and values."""
        a = self.ansatz
        x = configs.to(a.device)
        if x.ndim == 1 and a.n_words == 1:
            x = x[:, None]
        x = x.contiguous()
        n = x.shape[0]
        out = torch.empty(n, dtype=torch.float32, device=a.device)
        if n == 0:
            return out
        srt = counts = None
        if ends is None:
            ends, counts, srt = self._planned(a, x, self.share_prefixes, self.kernel)
        ends = [int(e) for e in ends]
        if ends[-1] != a.norb or ends[0] < 1 or sorted(set(ends)) != ends:
            raise ValueError(f"ends must increase to norb={a.norb}, got {ends}")
        if len(ends) > 1 and ends[-2] > 32:
            raise ValueError(f"prefix stages end at most at orbital 32, got {ends}")
        self.last_plan = ends
        if len(ends) == 1:
            self._launch(x, out, 0, a.norb)
            return out
        self._weights()
        m = self._meta
        key, perm = srt if srt is not None else _prefix_sorted(x)
        xs = x if perm is None else x[perm]
        d = key[1:] ^ key[:-1]
        parent = pamp = pkv = None
        k0 = 0
        for i, e in enumerate(ends[:-1]):
            start = torch.ones(n, dtype=torch.bool, device=x.device)
            start[1:] = (d >> (64 - 2 * e)) != 0
            gid = (torch.cumsum(start, 0) - 1).to(torch.int32)
            if counts is None:
                rep = torch.nonzero(start).squeeze(1)
            else:  # the plan counted them: no wait on the device for the size
                rep = torch.nonzero_static(start, size=counts[i]).squeeze(1)
            cnt = len(rep)
            store = torch.empty(
                (cnt, m["NL"], 2, m["NGR"], max(16, pow2(e)), 16),
                dtype=torch.float32,
                device=x.device,
            )
            amp = torch.empty(cnt, dtype=torch.float64, device=x.device)
            par = parent[rep].contiguous() if parent is not None else None
            self._launch(xs[rep], amp, k0, e, parent=par, pamp=pamp, pkv=pkv, store=store)
            parent, pamp, pkv, k0 = gid, amp, store, e
        last = out if perm is None else torch.empty_like(out)
        self._launch(xs, last, k0, a.norb, parent=parent, pamp=pamp, pkv=pkv)
        if perm is not None:
            out[perm] = last
        return out

    @torch.no_grad()
    def __call__(self, configs) -> torch.Tensor:
        """ln psi (complex64, (n,)) of uint64 configurations (numpy) or their int64 tensor."""
        a = self.ansatz
        x = a.config_words(configs)
        amp = self.amplitude(x)
        phase = a.phase(a.tokens(x)).to(amp.dtype)
        return torch.complex(amp, phase)


_ORDER = (
    "tok_emb",
    "pos_emb",
    "ln1w",
    "ln1b",
    "wq",
    "bq",
    "wk",
    "bk",
    "wv",
    "bv",
    "wo",
    "bo",
    "ln2w",
    "ln2b",
    "w1",
    "b1",
    "w2",
    "b2",
    "lnfw",
    "lnfb",
    "wh",
    "bias16",
)


_SIGN = -(2**63)
_PAIR_MASKS = (
    (2, 0x3333333333333333),
    (4, 0x0F0F0F0F0F0F0F0F),
    (8, 0x00FF00FF00FF00FF),
    (16, 0x0000FFFF0000FFFF),
    (32, 0x00000000FFFFFFFF),
)


def _prefix_sorted(configs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(keys, permutation) that put ``configs`` in `token_key` order: the keys sorted, and
    None for the permutation when they were in that order already (the pipeline hands its
    batches over sorted; the check is one comparison per configuration, the sort several
    passes)."""
    key = token_key(configs)
    if len(key) < 2 or bool(_in_order(key)):
        return key, None
    return torch.sort(key)


def _in_order(key: torch.Tensor) -> torch.Tensor:
    """Whether the keys are sorted (a bool tensor on their device: no wait)."""
    return (key[1:] >= key[:-1]).all()


def token_key(configs: torch.Tensor) -> torch.Tensor:
    """int64 keys (n,) in the lexicographic order of the first word's orbitals: its 2-bit
    tokens reversed (orbital 0 in the top bits), the sign bit flipped so that signed order is
    that order. Configurations share their first b orbitals (b <= 32) exactly when their keys
    agree in the top 2b bits.

    Example:
        >>> import torch
        >>> hex(int(token_key(torch.tensor([[0b0111]]))[0]) & (2**64 - 1))  # tokens 3, 1
        '0x5000000000000000'
    """
    x = configs[:, 0] if configs.ndim == 2 else configs
    x = x.to(torch.int64)
    for shift, mask in _PAIR_MASKS:
        x = ((x >> shift) & mask) | ((x & mask) << shift)
    return x ^ _SIGN
