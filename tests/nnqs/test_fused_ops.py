"""The Triton training kernels (LayerNorm, short causal attention) of `cuscikit.nnqs.fused_ops`:
their torch fallback on the CPU, and their arithmetic in the Triton interpreter."""

from __future__ import annotations

import textwrap

import pytest

torch = pytest.importorskip("torch")

from cuscikit import Ansatz  # noqa: E402
from cuscikit.nnqs import fused_ops  # noqa: E402
from cuscikit.nnqs._triton import interpreting  # noqa: E402
from tests.conftest import run_interpreted  # noqa: E402


def test_cpu_passes_keep_torch_kernels():
    """On the CPU (no interpreter) the kernels are not taken and the results are torch's."""
    if interpreting():
        pytest.skip("the Triton interpreter runs the kernels on the CPU")
    x = torch.randn(6, 5, 8, dtype=torch.float64, requires_grad=True)
    w, b = torch.randn(8, dtype=torch.float64), torch.randn(8, dtype=torch.float64)
    assert not fused_ops.active(x)
    y = fused_ops.layer_norm(x, w, b, 1e-5)
    assert torch.equal(y, torch.nn.functional.layer_norm(x, (8,), w, b, 1e-5))
    assert fused_ops.causal_attention(torch.zeros(2, 3, 12, requires_grad=True), 2) is None


def test_float64_scalars_survive_the_float32_arguments():
    """Triton passes Python floats as float32: the two parts add back to the float64 value."""
    import math

    for v in (1e-5, 1.0 / math.sqrt(8), 1.0 / math.sqrt(6), 0.5):
        hi, lo = fused_ops._split(v)
        hi32, lo32 = (float(torch.tensor(p, dtype=torch.float32)) for p in (hi, lo))
        assert hi32 == hi  # already a float32 value
        assert abs((hi32 + lo32) - v) <= 1e-15 * v
        assert abs(hi32 - v) > 1e-12 * v or lo == 0.0  # the remainder matters


# the interpreted scripts' common start: imports, the largest difference, and the gradient of
# a weighted ln psi of x (every parameter) with one of fused_ops' switches on or off
_SCRIPT_HEAD = textwrap.dedent(
    """
    import math, torch
    import cuscikit.nnqs.fused_ops as fo
    from cuscikit import Ansatz
    from cuscikit.sci.configs import all_determinants

    def err(a, b):
        return float((a - b).detach().abs().max())

    def log_psi_grads(psi, x, switch, on):
        setattr(fo, switch, on)
        lp = psi.log_psi(x)
        loss = (lp.real * torch.arange(len(x))).sum() + lp.imag.sum()
        return torch.autograd.grad(loss, list(psi.parameters()))
    """
)

_INTERPRETED = _SCRIPT_HEAD + textwrap.dedent(
    """

    g = torch.Generator().manual_seed(0)
    keep_rows = fo._ATTN_ROWS
    for dt, tol in ((torch.float64, 1e-12), (torch.float32, 2e-5)):
        # LayerNorm: rows not a multiple of the tile, a width that is not a power of two
        for m, d in ((37, 32), (3, 20)):
            x = torch.randn(m, 2, d, dtype=dt, generator=g).requires_grad_()
            w = torch.randn(d, dtype=dt, generator=g).requires_grad_()
            b = torch.randn(d, dtype=dt, generator=g).requires_grad_()
            gy = torch.randn(m, 2, d, dtype=dt, generator=g)
            y = fo.layer_norm(x, w, b, 1e-5)
            assert type(y.grad_fn).__name__ == "_LayerNormBackward", y.grad_fn
            y0 = torch.nn.functional.layer_norm(x, (d,), w, b, 1e-5)
            gr = torch.autograd.grad((y * gy).sum(), (x, w, b))
            gr0 = torch.autograd.grad((y0 * gy).sum(), (x, w, b))
            assert err(y, y0) < tol, ("ln", dt, m, d, err(y, y0))
            for a, c in zip(gr, gr0):
                assert err(a, c) < tol * max(1.0, float(c.abs().max())), ("ln grad", dt, m, d)
        # the residual sum with its LayerNorm: the sum is torch's bit for bit, the norm, and
        # the gradients through both outputs (the sum's own gradient added in the kernel)
        for m, d in ((37, 32), (3, 20)):
            x, r = (torch.randn(m, 2, d, dtype=dt, generator=g).requires_grad_() for _ in "xr")
            w = torch.randn(d, dtype=dt, generator=g).requires_grad_()
            b = torch.randn(d, dtype=dt, generator=g).requires_grad_()
            gs, gy = (torch.randn(m, 2, d, dtype=dt, generator=g) for _ in "sy")
            s, y = fo.add_layer_norm(x, r, w, b, 1e-5)
            assert type(y.grad_fn).__name__ == "_LayerNormBackward", y.grad_fn
            s0 = x + r
            y0 = torch.nn.functional.layer_norm(s0, (d,), w, b, 1e-5)
            assert torch.equal(s, s0)
            assert err(y, y0) < tol, ("add ln", dt, m, d, err(y, y0))
            gr = torch.autograd.grad((s * gs).sum() + (y * gy).sum(), (x, r, w, b))
            gr0 = torch.autograd.grad((s0 * gs).sum() + (y0 * gy).sum(), (x, r, w, b))
            for a, c in zip(gr, gr0):
                assert err(a, c) < tol * max(1.0, float(c.abs().max())), ("add ln grad", dt, m, d)
            _, y = fo.add_layer_norm(x, r, w, b, 1e-5)  # the sum unused: its gradient zero
            (gx,) = torch.autograd.grad((y * gy).sum(), x)
            (gx0,) = torch.autograd.grad((torch.nn.functional.layer_norm(
                x + r, (d,), w, b, 1e-5) * gy).sum(), x)
            assert err(gx, gx0) < tol, ("add ln, norm alone", dt, m, d)
        # attention: the Ansatz's written-out form; head width and length not powers of two;
        # the tile kernels (rows None) with one head a program, all heads of a sequence in
        # one, two heads of three (one); the row kernels with programs of 16 and 64 rows (the
        # last program part full, or one program for all rows)
        cases = ((5, 4, 2, 4, 1, None), (3, 3, 3, 3, 1, None), (2, 28, 2, 3, 1, None),
                 (5, 4, 2, 4, 0, None), (3, 3, 3, 3, 2, None), (4, 10, 4, 8, 0, None),
                 (5, 4, 2, 4, 1, (16, 1)), (3, 3, 3, 3, 1, (16, 1)), (2, 28, 2, 3, 1, (64, 2)),
                 (4, 10, 4, 8, 1, (64, 2)), (1, 2, 1, 8, 1, (64, 2)))
        for n, length, h, hd, heads, rows in cases:
            fo._ATTN_HEADS, fo._ATTN_ROWS = heads, {dt: rows} if rows else {}
            d = h * hd
            qkv = torch.randn(n, length, 3 * d, dtype=dt, generator=g).requires_grad_()
            y = fo.causal_attention(qkv, h)
            assert type(y.grad_fn).__name__ == "_CausalAttentionBackward", y.grad_fn
            q, k, v = (
                t.reshape(n, length, h, hd).transpose(1, 2) for t in qkv.split(d, -1)
            )
            att = (q @ k.transpose(-2, -1)) / math.sqrt(hd)
            future = torch.ones(length, length, dtype=torch.bool).triu(1)
            y0 = torch.softmax(att.masked_fill(future, -math.inf), -1) @ v
            y0 = y0.transpose(1, 2).reshape(n, length, d)
            gy = torch.randn(n, length, d, dtype=dt, generator=g)
            (gq,) = torch.autograd.grad((y * gy).sum(), qkv)
            (gq0,) = torch.autograd.grad((y0 * gy).sum(), qkv)
            assert err(y, y0) < tol, ("attn", dt, n, length, rows, err(y, y0))
            assert err(gq, gq0) < tol, ("attn grad", dt, n, length, rows, err(gq, gq0))
        fo._ATTN_HEADS, fo._ATTN_ROWS = 1, keep_rows

    long = torch.zeros(2, 33, 12, dtype=torch.float64, requires_grad=True)
    assert fo.causal_attention(long, 2) is None  # past 32 positions: torch's attention

    # the Ansatz takes them in a training pass; its gradient equals torch's kernels' gradient
    calls = {"ln": 0, "attn": 0, "tail": 0}
    ln_apply, attn_apply = fo._LayerNorm.apply, fo._CausalAttention.apply
    tail_apply = fo._AmplitudeTail.apply
    def count(key, f):
        def wrapped(*a):
            calls[key] += 1
            return f(*a)
        return wrapped
    fo._LayerNorm.apply = count("ln", ln_apply)
    fo._CausalAttention.apply = count("attn", attn_apply)
    fo._AmplitudeTail.apply = count("tail", tail_apply)
    psi = Ansatz(4, (2, 1), d_model=8, n_heads=2, n_layers=1, phase_hidden=(4,), seed=0,
                 dtype=torch.float64)
    x = all_determinants(4, (2, 1))
    grads = {on: log_psi_grads(psi, x, "ENABLED", on) for on in (True, False)}
    # d_model 8: ln_f stays a LayerNorm kernel (the fused tail runs d_model 16, 32 and 64)
    assert calls == {"ln": 3, "attn": 1, "tail": 0}, calls
    assert fo._failed is None
    worst = max(err(a, b) for a, b in zip(grads[True], grads[False]))
    assert worst < 1e-12, worst
    with torch.no_grad():  # inference keeps torch's kernels
        fo.ENABLED = True
        psi.log_psi(x)
    assert calls == {"ln": 3, "attn": 1, "tail": 0}, calls
    # three blocks with the residual sums in the LayerNorm kernels (the first block's ln1, then
    # two LayerNorms a block, each with the sum before it, but one after the last block, and
    # ln_f: 7 calls) against the blocks one by one, and against torch's kernels
    psi = Ansatz(4, (2, 1), d_model=8, n_heads=2, n_layers=3, phase_hidden=(4,), seed=1,
                 dtype=torch.float64)
    calls.update(ln=0, attn=0)
    chained = log_psi_grads(psi, x, "ADD_NORM_ENABLED", True)
    assert calls == {"ln": 1 + 2 * 3 - 1 + 1, "attn": 3, "tail": 0}, calls
    apart = log_psi_grads(psi, x, "ADD_NORM_ENABLED", False)
    fo.ADD_NORM_ENABLED = True
    plain = log_psi_grads(psi, x, "ENABLED", False)
    fo.ENABLED = True
    worst = max(max(err(a, b), err(a, c)) for a, b, c in zip(chained, apart, plain))
    assert worst < 1e-12, worst
    print("ok", worst)
    """
)


def test_kernels_in_triton_interpreter():
    """Forward and backward of both kernels against torch (float64 1e-12, float32 2e-5), and
    the Ansatz's gradient through them, on the CPU."""
    out = run_interpreted(_INTERPRETED, timeout=300)
    assert "ok" in out


def test_ansatz_layer_norms_keep_their_state():
    """The LayerNorms are nn.LayerNorm subclasses: same parameters and state-dict keys."""
    psi = Ansatz(4, (2, 1), n_layers=1, seed=0)
    keys = [k for k in psi.state_dict() if ".ln" in k or k.startswith("ln_f")]
    assert keys == [
        "blocks.0.ln1.weight",
        "blocks.0.ln1.bias",
        "blocks.0.ln2.weight",
        "blocks.0.ln2.bias",
        "ln_f.weight",
        "ln_f.bias",
    ]
    assert isinstance(psi.ln_f, torch.nn.LayerNorm)


_BLOCK_INTERPRETED = _SCRIPT_HEAD + textwrap.dedent(
    """
    from cuscikit.nnqs.ansatz import _Block

    g = torch.Generator().manual_seed(1)
    fo._POISON = True  # a gradient entry that no program writes stays NaN
    fo.BLOCK_ENABLED = True
    # sequences not a multiple of a program's, lengths padded to 16 and to 32, two widths
    for dt, tol in ((torch.float64, 1e-12), (torch.float32, 3e-5)):
        for n, length, d, h in ((5, 10, 32, 4), (3, 7, 16, 2), (9, 17, 16, 4)):
            blk = _Block(d, h).to(dt)
            with torch.no_grad():
                for p in blk.parameters():  # LayerNorms away from (1, 0) too
                    p.copy_(0.3 * torch.randn(p.shape, dtype=dt, generator=g))
            x = torch.randn(n, length, d, dtype=dt, generator=g).requires_grad_()
            gy = torch.randn(n, length, d, dtype=dt, generator=g)
            y = fo.block(x, blk)
            assert type(y.grad_fn).__name__ == "_FusedBlockBackward", y.grad_fn
            grads = torch.autograd.grad((y * gy).sum(), [x, *blk.parameters()])
            fo.BLOCK_ENABLED = fo.ENABLED = False  # torch's own kernels for the reference
            y0 = blk(x)
            grads0 = torch.autograd.grad((y0 * gy).sum(), [x, *blk.parameters()])
            fo.BLOCK_ENABLED = fo.ENABLED = True
            assert err(y, y0) < tol * max(1.0, err(y0, 0)), ("block", dt, n, length)
            for a, c in zip(grads, grads0):
                scale = max(1.0, float(c.abs().max()))
                assert err(a, c) < tol * scale, ("block grad", dt, n, length, err(a, c))

    # shapes it leaves to the module
    assert "d_model 48" in fo.block_unsupported(torch.zeros(2, 5, 48), _Block(48, 6))
    assert "33 positions" in fo.block_unsupported(torch.zeros(2, 33, 16), _Block(16, 2))

    # the Ansatz takes it in a training pass, not in inference; the same gradient as torch's
    calls = [0]
    apply = fo._FusedBlock.apply
    def counted(*a):
        calls[0] += 1
        return apply(*a)
    fo._FusedBlock.apply = counted
    psi = Ansatz(6, (3, 2), n_layers=2, phase_hidden=(8,), seed=0, dtype=torch.float64)
    with torch.no_grad():
        for p in psi.parameters():
            p.add_(0.1 * torch.randn(p.shape, dtype=p.dtype, generator=g))
    x = all_determinants(6, (3, 2))[::6]  # 50 of the 300 (the interpreter runs every program)
    grads = {on: log_psi_grads(psi, x, "BLOCK_ENABLED", on) for on in (True, False)}
    assert calls[0] == 2, calls
    assert fo._failed is None, fo._failed
    worst = max(
        err(a, b) / max(1.0, float(b.abs().max())) for a, b in zip(grads[True], grads[False])
    )
    assert worst < 1e-12, worst
    fo.BLOCK_ENABLED = True
    with torch.no_grad():
        psi.log_psi(x)
    assert calls[0] == 2, calls
    fo.BLOCK_ENABLED = False

    # the whole ln|psi| as one kernel each way: values and the gradient of every parameter
    # of the amplitude against torch's kernels (two and three blocks, widths 32 and 16), the
    # float32 products as FMAs and as three TF32 products (here the interpreter's float32
    # products: the split and its sum, not the tensor cores), the last in programs of one
    # sequence
    cases = ((torch.float64, 1e-12, "ieee"), (torch.float32, 3e-5, "ieee"),
             (torch.float32, 3e-5, "tf32x3"))
    for dt, tol, products in cases:
        fo.COARSE_PRODUCTS = products
        # 43 and 54 configurations (at 64 rows a program neither fills its last one)
        for norb, nelec, d, h, nl, every in ((6, (3, 2), 32, 4, 2, 7), (7, (3, 3), 16, 2, 3, 23)):
            psi = Ansatz(norb, nelec, d_model=d, n_heads=h, n_layers=nl, phase_hidden=(8,),
                         seed=0, dtype=dt)
            with torch.no_grad():
                for p in psi.parameters():
                    p.add_(0.2 * torch.randn(p.shape, dtype=dt, generator=g))
            tok = psi.tokens(all_determinants(norb, nelec)[::every])
            wts = torch.randn(len(tok), dtype=dt, generator=g)
            params = [p for name, p in psi.named_parameters() if not name.startswith("phase")]
            fo.AMPLITUDE_ENABLED = True
            amp = psi.log_amplitude(tok)
            assert type(amp.grad_fn).__name__ == "_FusedAmplitudeBackward", amp.grad_fn
            grads = torch.autograd.grad((amp * wts).sum(), params)
            fo.AMPLITUDE_ENABLED = fo.ENABLED = False
            amp0 = psi.log_amplitude(tok)
            grads0 = torch.autograd.grad((amp0 * wts).sum(), params)
            fo.ENABLED = True
            assert err(amp, amp0) < tol * max(1.0, err(amp0, 0)), ("amp", dt, norb)
            for a, c in zip(grads, grads0):
                assert err(a, c) < tol * max(1.0, err(c, 0)), ("amp grad", dt, norb, err(a, c))
            # outside the sector: -inf, as the module gives
            fo.AMPLITUDE_ENABLED = True
            out = tok[:3].clone()
            out[:, 0] = 3 - out[:, 0]  # the first orbital's occupation flipped: another sector
            with torch.enable_grad():
                bad = psi.log_amplitude(out)
            fo.AMPLITUDE_ENABLED = False
            ref = psi.log_amplitude(out)
            assert bool(torch.isneginf(ref).all()) and bool(torch.isneginf(bad).all()), bad
    fo.COARSE_PRODUCTS = "ieee"
    assert fo._failed is None and fo._coarse_failed is None, (fo._failed, fo._coarse_failed)

    # a coarse kernel that fails turns off the coarse paths only, with a warning
    import warnings
    def broken(*a):
        raise RuntimeError("no build")
    fo._FusedBlock.apply = broken
    fo.BLOCK_ENABLED = True
    blk = _Block(16, 2).double()
    x = torch.randn(3, 5, 16, dtype=torch.float64, generator=g).requires_grad_()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert fo.block(x, blk) is None
    assert "no build" in fo._coarse_failed and fo._failed is None
    assert any("fused block/amplitude" in str(w.message) for w in caught)
    fo.AMPLITUDE_ENABLED = True  # it would apply (the loop above), but is off now
    assert fo.amplitude(psi, psi.tokens(all_determinants(7, (3, 3))[:4])) is None
    w1, b1 = torch.ones(16, dtype=torch.float64), torch.zeros(16, dtype=torch.float64)
    y = fo.layer_norm(x, w1, b1, 1e-5)
    assert type(y.grad_fn).__name__ == "_LayerNormBackward", y.grad_fn
    print("ok", worst)
    """
)


def test_fused_block_in_triton_interpreter():
    """A whole transformer block, and the whole ln|psi|, as one kernel each way: outputs and
    every gradient against torch's (float64 1e-12, float32 3e-5 relative), padded sequences
    and positions, configurations outside the sector, and the Ansatz's gradient through the
    block, on the CPU."""
    out = run_interpreted(_BLOCK_INTERPRETED, timeout=900)
    assert "ok" in out


_TAIL_INTERPRETED = _SCRIPT_HEAD + textwrap.dedent(
    """

    fo._POISON = True  # a partial-gradient entry that no program writes stays NaN
    for dt, tol in ((torch.float64, 1e-12), (torch.float32, 3e-5)):
        for norb, nelec, d in ((6, (3, 2), 16), (10, (5, 5), 32)):
            psi = Ansatz(norb, nelec, d_model=d, n_layers=1, phase_hidden=(4,), seed=1,
                         dtype=dt)
            tok = psi.tokens(all_determinants(norb, nelec)[:38])  # 41 with the 3 below
            off = tok[:3].clone()
            off[:, 0] = 3 - off[:, 0]  # outside the sector
            tok = torch.cat((tok, off))
            weight = torch.linspace(-1, 1, len(tok), dtype=dt)
            out = {}
            for on in (True, False):
                fo.TAIL_ENABLED = on
                amp, phase = psi._log_psi_parts(tok)
                grads = torch.autograd.grad((amp, phase), list(psi.parameters()),
                                            (weight, torch.ones_like(phase)))
                out[on] = (amp.detach(), grads, type(amp.grad_fn).__name__)
            assert out[True][2] == "_AmplitudeTailBackward", out[True][2]
            assert out[False][2] != "_AmplitudeTailBackward", out[False][2]
            a1, a0 = out[True][0], out[False][0]
            assert torch.equal(torch.isinf(a1), torch.isinf(a0)) and int(a0.isinf().sum()) == 3
            fin = torch.isfinite(a0)
            assert err(a1[fin], a0[fin]) < tol, ("tail", dt, d, err(a1[fin], a0[fin]))
            for g1, g0 in zip(out[True][1], out[False][1]):
                assert err(g1, g0) < tol * max(1.0, float(g0.abs().max())), ("tail grad", dt, d)
    assert fo._tail_failed is None
    psi = Ansatz(4, (2, 1), d_model=8, n_heads=2, seed=0, dtype=torch.float64)
    tok = psi.tokens(all_determinants(4, (2, 1)))
    h = torch.zeros(len(tok), 4, 8, dtype=torch.float64, requires_grad=True)
    assert "d_model 8" in fo.tail_unsupported(psi, h, tok)
    assert fo.amplitude_tail(psi, h, tok) is None
    # a tail kernel that fails turns the tail off alone, with a warning
    import warnings
    def broken(*a):
        raise RuntimeError("no build")
    fo._AmplitudeTail.apply = broken
    fo.TAIL_ENABLED = True
    psi = Ansatz(4, (2, 1), d_model=16, n_heads=2, seed=0, dtype=torch.float64)
    h = torch.zeros(len(tok), 4, 16, dtype=torch.float64, requires_grad=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert fo.amplitude_tail(psi, h, tok) is None
    assert "no build" in fo._tail_failed and fo._failed is None and fo._coarse_failed is None
    assert any("amplitude tail" in str(w.message) for w in caught)
    assert fo.amplitude_tail(psi, h, tok) is None  # off from now on
    print("ok")
    """
)


def test_amplitude_tail_in_triton_interpreter():
    """ln_f, the head and the masked log-softmax as one kernel each way: ln|psi| (-inf on the
    same rows, among them configurations outside the sector) and every parameter gradient
    against the module's tail (float64 1e-12, float32 3e-5 relative), a gradient reaching
    the out-of-sector rows too, on the CPU; an unsupported width is left to the module."""
    out = run_interpreted(_TAIL_INTERPRETED, timeout=600)
    assert "ok" in out


def test_coarse_products_are_checked():
    """The block and amplitude kernels' product code: 1 float64, float32 0 (FMAs) or 2 (three
    TF32 products, in programs of one sequence of up to 16 positions: the tile they were run at
    on a GPU); another COARSE_PRODUCTS is refused before any kernel runs."""
    keep = fused_ops.COARSE_PRODUCTS
    try:
        assert fused_ops._block_consts(10, 32, 4, 128, torch.float64)[-1] == 1
        assert fused_ops._block_consts(10, 32, 4, 128, torch.float32)[-1] == 0
        fused_ops.COARSE_PRODUCTS = "tf32x3"
        assert fused_ops._block_consts(10, 32, 4, 128, torch.float32)[-1] == 2
        assert fused_ops._block_consts(10, 32, 4, 128, torch.float32)[2] == 1  # sequences
        assert fused_ops._TILES[2] == (16, 4)
        assert fused_ops._block_consts(10, 32, 4, 128, torch.float64)[-1] == 1
        assert fused_ops._block_consts(10, 32, 4, 128, torch.float64)[2] == 4
        fused_ops.COARSE_PRODUCTS = "tf32"
        with pytest.raises(ValueError, match="COARSE_PRODUCTS"):
            fused_ops._block_consts(10, 32, 4, 128, torch.float32)
    finally:
        fused_ops.COARSE_PRODUCTS = keep


def test_fused_block_stays_off_on_the_cpu():
    """Without the interpreter a CPU pass keeps the module's block, switch on or off."""
    if interpreting():
        pytest.skip("the Triton interpreter runs the kernels on the CPU")
    from cuscikit.nnqs.ansatz import _Block

    blk = _Block(16, 2).double()
    x = torch.randn(3, 5, 16, dtype=torch.float64, requires_grad=True)
    keep = fused_ops.BLOCK_ENABLED
    try:
        fused_ops.BLOCK_ENABLED = True
        assert fused_ops.block(x, blk) is None
    finally:
        fused_ops.BLOCK_ENABLED = keep
