"""The training pass's tensor-core products (`cuscikit.nnqs.products`): when they apply, their
checks, and their arithmetic in the Triton interpreter against float64."""

from __future__ import annotations

import textwrap

import pytest

torch = pytest.importorskip("torch")

from cuscikit.nnqs import products  # noqa: E402
from cuscikit.nnqs._triton import interpreting  # noqa: E402
from tests.conftest import run_interpreted  # noqa: E402


def test_products_apply_only_to_float32_training_passes_on_a_gpu(monkeypatch):
    monkeypatch.setattr(products, "ENABLED", True)
    x, w = torch.zeros(4, 8), torch.zeros(2, 8)
    if not interpreting():
        assert not products.applies(x, w)  # a CPU tensor
    assert not products.applies(x.double(), w.double())
    with torch.no_grad():
        assert not products.applies(x, w)
    monkeypatch.setattr(products, "ENABLED", False)
    assert not products.applies(x, w)


def test_products_skip_layers_wider_than_max_width(monkeypatch):
    """A weight wider than MAX_WIDTH, in or out, keeps torch's products (the interpreter
    stands in for a GPU so that only the width decides)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    pytest.importorskip("triton")
    monkeypatch.setattr(products, "ENABLED", True)
    monkeypatch.setattr(products, "MAX_WIDTH", 128)
    x = torch.zeros(4, 128)
    assert products.applies(x, torch.zeros(128, 128))
    assert not products.applies(x, torch.zeros(129, 128))
    assert not products.applies(torch.zeros(4, 512), torch.zeros(1, 512))
    monkeypatch.setattr(products, "MAX_WIDTH", None)
    assert products.applies(torch.zeros(4, 512), torch.zeros(512, 512))


def test_a_failing_kernel_turns_the_products_off_with_torchs_results(monkeypatch):
    """A kernel that fails in the forward (or, the forward done, in the backward) turns the
    products off with one warning, and the layer's output and gradients are torch's."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # applies on the CPU; the kernels never run
    pytest.importorskip("triton")
    from cuscikit.nnqs import aside

    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 8, generator=g, requires_grad=True)
    w = torch.randn(3, 8, generator=g, requires_grad=True)
    b = torch.randn(3, generator=g, requires_grad=True)
    want = torch.nn.functional.linear(x, w, b)
    want_grads = torch.autograd.grad(want.sum(), (x, w, b))

    def broken(*args, **kwargs):
        raise RuntimeError("no kernel here")

    for where in ("mm", "weight_grad"):
        monkeypatch.setattr(products, "ENABLED", True)
        monkeypatch.setattr(products, "_failed", None)
        assert products.applies(x, w)
        with monkeypatch.context() as m:
            m.setattr(products, where, broken)
            if where == "weight_grad":  # the forward takes the kernel: torch's product here
                m.setattr(
                    products, "mm", lambda a, c, bias=None: a @ c + (0 if bias is None else bias)
                )
            with pytest.warns(RuntimeWarning, match="no kernel here"):
                y = aside.linear(x, w, b)
                grads = torch.autograd.grad(y.sum(), (x, w, b))
        assert products._failed is not None and not products.applies(x, w)
        torch.testing.assert_close(y, want, rtol=0, atol=1e-6)
        for got, ref in zip(grads, want_grads, strict=True):
            torch.testing.assert_close(got, ref, rtol=0, atol=1e-6)


def test_mm_rejects_bad_operands():
    with pytest.raises(ValueError, match="K\\) @ \\(K"):
        products.mm(torch.zeros(3, 4), torch.zeros(5, 2))
    with pytest.raises(ValueError, match="float32"):
        products.mm(torch.zeros(3, 4, dtype=torch.float64), torch.zeros(4, 2))


_INTERPRETED = textwrap.dedent(
    """
    import torch
    from cuscikit import Ansatz
    from cuscikit.nnqs import aside, products as P
    from cuscikit.nnqs.ansatz import _Linear
    from cuscikit.sci.configs import all_determinants

    P.ENABLED = True
    P.MAX_WIDTH = None  # every layer, the phase MLP's 512-wide ones included
    g = torch.Generator().manual_seed(0)

    def rel(a, ref):
        if a.is_complex():
            a, ref = torch.view_as_real(a), torch.view_as_real(ref)
        return float((a.double() - ref).abs().max() / ref.abs().max())

    splits = []
    launch = P._launch
    def counted(a, b, bias, n, sums, **kw):
        out = launch(a, b, bias, n, sums, **kw)
        splits.append(out[0].shape[0])
        return out
    P._launch = counted

    # products of the Ansatz's shapes and odd ones; the second operand transposed (a weight)
    for m, k, n in ((100, 32, 96), (37, 20, 512), (64, 512, 1), (50, 128, 32), (16, 16, 16)):
        a = torch.randn(m, k, generator=g)
        w = torch.randn(n, k, generator=g)
        b = torch.randn(n, generator=g)
        ref = a.double() @ w.double().t()
        assert rel(P.mm(a, w.t(), b), ref + b.double()) < 3e-6, (m, k, n)
        assert rel(P.mm(a, w.t()), ref) < 3e-6, (m, k, n)
        # the weight gradient over rows split among programs (odd row counts included)
        for rows in (m, 997):
            dy = torch.randn(rows, n, generator=g)
            x = torch.randn(rows, k, generator=g)
            dw, db = P.weight_grad(dy, x, True)
            assert rel(dw, dy.double().t() @ x.double()) < 3e-6, ("dw", rows, k, n)
            assert rel(db, dy.double().sum(0)) < 3e-6, ("db", rows, n)
            assert P.weight_grad(dy, x, False)[1] is None
    assert max(splits) > 1 and min(splits) == 1, splits

    # other launch settings (the reduction's step, tiles of 16 or up to 128, fewer or more
    # weight-gradient programs, a pipelining depth): the same products to the same accuracy
    saved = (P._BK, P._tile, P._WG_PER_SM, P._STAGES)
    tile128 = lambda n: 128 if n % 128 == 0 else 32
    for bk, tile, wg in ((16, lambda n: 16, 8), (64, tile128, 1)):
        P._BK, P._tile, P._WG_PER_SM, P._STAGES = bk, tile, wg, 2
        for m, k, n in ((256, 32, 96), (37, 20, 128)):
            a = torch.randn(m, k, generator=g)
            w = torch.randn(n, k, generator=g)
            b = torch.randn(n, generator=g)
            ref = a.double() @ w.double().t() + b.double()
            assert rel(P.mm(a, w.t(), b), ref) < 3e-6, (bk, m, k, n)
            dy = torch.randn(997, n, generator=g)
            x = torch.randn(997, k, generator=g)
            dw, db = P.weight_grad(dy, x, True)
            assert rel(dw, dy.double().t() @ x.double()) < 3e-6, ("dw", bk, k, n)
            assert rel(db, dy.double().sum(0)) < 3e-6, ("db", bk, n)
    P._BK, P._tile, P._WG_PER_SM, P._STAGES = saved

    # a linear layer through aside.linear: both ways, with and without a bias, against
    # float64, and an input without a gradient
    for bias in (True, False):
        x = torch.randn(3, 10, 32, generator=g, requires_grad=True)
        w = torch.randn(96, 32, generator=g, requires_grad=True)
        b = torch.randn(96, generator=g, requires_grad=True) if bias else None
        y = aside.linear(x, w, b)
        assert type(y.grad_fn).__name__ == "_LinearBackward", y.grad_fn
        gy = torch.randn(3, 10, 96, generator=g)
        ins = (x, w, b) if bias else (x, w)
        gr = torch.autograd.grad((y * gy).sum(), ins)
        ins0 = [t.detach().double().requires_grad_() for t in ins]
        y0 = torch.nn.functional.linear(*ins0, *([] if bias else [None]))
        gr0 = torch.autograd.grad((y0 * gy.double()).sum(), ins0)
        assert rel(y, y0) < 3e-6
        for a, c in zip(gr, gr0):
            assert rel(a, c) < 3e-6
    y = aside.linear(torch.randn(5, 32, generator=g), w, None)
    (gw,) = torch.autograd.grad(y.sum(), (w,))
    assert gw.shape == w.shape

    # MLPs through aside.mlp (the GELUs in the kernels), both ways, against float64: the
    # transformer's sublayer shape and a phase-MLP-like stack whose input has no gradient
    for sizes, x_grad in (((32, 128, 32), True), ((20, 64, 64, 64, 1), False)):
        layers = [_Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:])]
        x = torch.randn(7, 3, sizes[0], generator=g).requires_grad_(x_grad)
        y = aside.mlp(x, layers)
        assert type(y.grad_fn).__name__ == "_GeluMLPBackward", y.grad_fn
        gy = torch.randn(y.shape, generator=g)
        ps = [p for m in layers for p in (m.weight, m.bias)]
        ins = ([x] if x_grad else []) + ps
        gr = torch.autograd.grad((y * gy).sum(), ins)
        ins0 = [t.detach().double().requires_grad_() for t in ins]
        h = ins0[0] if x_grad else x.detach().double()
        ps0 = ins0[1:] if x_grad else ins0
        for i in range(len(layers)):
            h = torch.nn.functional.linear(h, ps0[2 * i], ps0[2 * i + 1])
            h = torch.nn.functional.gelu(h) if i < len(layers) - 1 else h
        gr0 = torch.autograd.grad((h * gy.double()).sum(), ins0)
        assert rel(y, h) < 3e-6, (sizes, rel(y, h))
        for a, c in zip(gr, gr0):
            assert rel(a, c) < 3e-6, (sizes, rel(a, c))
        P.FUSED_MLP = False  # the layers one by one, each through the products
        y1 = aside.mlp(x, layers)
        assert type(y1.grad_fn).__name__ == "_LinearBackward", y1.grad_fn
        assert rel(y1, h) < 3e-6
        P.FUSED_MLP = True

    # the Ansatz's float32 gradient with the products (every linear layer, the phase MLP's
    # included) against float64 and against torch's float32 products
    psi = Ansatz(6, (3, 2), seed=0, dtype=torch.float32)
    psi64 = Ansatz(6, (3, 2), seed=0, dtype=torch.float64)
    x = all_determinants(6, (3, 2))[::15]
    def grads(p, on):
        P.ENABLED = on
        lp = p.log_psi(x)
        loss = (lp.real * torch.arange(len(x))).sum() + lp.imag.sum()
        return lp.detach(), torch.autograd.grad(loss, list(p.parameters()))
    n0 = len(splits)
    lp_tc, g_tc = grads(psi, True)
    assert len(splits) > n0  # the pass took the kernel
    lp_32, g_32 = grads(psi, False)
    lp_64, g_64 = grads(psi64, False)
    e_tc = rel(lp_tc, lp_64)
    e_32 = rel(lp_32, lp_64)
    assert e_tc < 1e-5 and e_32 < 1e-5, (e_tc, e_32)
    worst = max(rel(a, c) for a, c in zip(g_tc, g_64) if c.abs().max() > 0)
    worst32 = max(rel(a, c) for a, c in zip(g_32, g_64) if c.abs().max() > 0)
    assert worst < 1e-4, (worst, worst32)
    print("ok", e_tc, e_32, worst, worst32)
    """
)


def test_products_in_triton_interpreter():
    """The products and weight gradients against float64 (3e-6 relative), a linear layer
    both ways, and the Ansatz's float32 ln psi and gradient with them, on the CPU."""
    out = run_interpreted(_INTERPRETED, timeout=600)
    assert "ok" in out
