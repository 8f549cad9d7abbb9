"""The Triton training kernels on the GPU: forward and backward against torch's kernels, the
N2/STO-3G shapes and odd ones, inside a recorded CUDA graph, and the Ansatz's gradient."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from cuscikit import Ansatz, Molecule  # noqa: E402
from cuscikit.nnqs import fused_ops  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _need_cuda():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    fused_ops.ENABLED = True
    yield
    fused_ops.ENABLED = True
    assert fused_ops._failed is None


def _err(a, b):
    return float((a - b).abs().max())


def _attention(qkv, h):
    n, length, d3 = qkv.shape
    d = d3 // 3
    q, k, v = (t.reshape(n, length, h, d // h).transpose(1, 2) for t in qkv.split(d, -1))
    att = (q @ k.transpose(-2, -1)) / math.sqrt(d // h)
    future = torch.ones(length, length, dtype=torch.bool, device=qkv.device).triu(1)
    y = torch.softmax(att.masked_fill(future, -math.inf), -1) @ v
    return y.transpose(1, 2).reshape(n, length, d)


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 2e-5)])
@pytest.mark.parametrize(
    "n,length,d,h",
    [(1920, 10, 32, 4), (301, 16, 48, 6), (7, 1, 20, 5), (2049, 28, 48, 6), (5, 32, 16, 2)],
)
def test_kernels_match_torch(dtype, tol, n, length, d, h):
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(n, length, d, dtype=dtype, device="cuda", generator=g).requires_grad_()
    w = torch.randn(d, dtype=dtype, device="cuda", generator=g).requires_grad_()
    b = torch.randn(d, dtype=dtype, device="cuda", generator=g).requires_grad_()
    gy = torch.randn(n, length, d, dtype=dtype, device="cuda", generator=g)
    y = fused_ops.layer_norm(x, w, b, 1e-5)
    assert type(y.grad_fn).__name__ == "_LayerNormBackward"
    y0 = torch.nn.functional.layer_norm(x, (d,), w, b, 1e-5)
    assert _err(y, y0) < tol
    gr = torch.autograd.grad((y * gy).sum(), (x, w, b))
    gr0 = torch.autograd.grad((y0 * gy).sum(), (x, w, b))
    for a, c in zip(gr, gr0, strict=True):
        assert _err(a, c) < tol * max(1.0, float(c.abs().max()))
    # the residual sum with its LayerNorm, through both outputs
    r = torch.randn(n, length, d, dtype=dtype, device="cuda", generator=g).requires_grad_()
    gs = torch.randn(n, length, d, dtype=dtype, device="cuda", generator=g)
    s, y = fused_ops.add_layer_norm(x, r, w, b, 1e-5)
    s0 = x + r
    y0 = torch.nn.functional.layer_norm(s0, (d,), w, b, 1e-5)
    assert torch.equal(s, s0) and _err(y, y0) < tol
    gr = torch.autograd.grad((s * gs).sum() + (y * gy).sum(), (x, r, w, b))
    gr0 = torch.autograd.grad((s0 * gs).sum() + (y0 * gy).sum(), (x, r, w, b))
    for a, c in zip(gr, gr0, strict=True):
        assert _err(a, c) < tol * max(1.0, float(c.abs().max()))
    qkv = torch.randn(n, length, 3 * d, dtype=dtype, device="cuda", generator=g)
    qkv.requires_grad_()
    y0 = _attention(qkv, h)
    (gq0,) = torch.autograd.grad((y0 * gy).sum(), qkv)
    keep = fused_ops._ATTN_ROWS
    try:  # the row-wise kernels (float32's default) and the tile kernels (float64's)
        for rows in ({dtype: (64, 2)}, {}):
            fused_ops._ATTN_ROWS = rows
            y = fused_ops.causal_attention(qkv, h)
            assert type(y.grad_fn).__name__ == "_CausalAttentionBackward"
            assert _err(y, y0) < tol, rows
            (gq,) = torch.autograd.grad((y * gy).sum(), qkv)
            assert _err(gq, gq0) < tol * max(1.0, float(gq0.abs().max())), rows
    finally:
        fused_ops._ATTN_ROWS = keep


def _assert_replays(fn, expected):
    """fn() recorded in a CUDA graph (after a warm-up on a side stream) and replayed gives
    ``expected`` to 1e-12."""
    from cuscikit.nnqs.graphs import record

    graph, out = record(fn, warm_ups=1)
    graph.replay()
    torch.cuda.synchronize()
    assert max(_err(a, b) for a, b in zip(out, expected, strict=True)) < 1e-12


def test_long_sequences_keep_torch_attention():
    qkv = torch.zeros(3, 33, 24, device="cuda", requires_grad=True)
    assert fused_ops.causal_attention(qkv, 2) is None


def test_ansatz_gradient_and_recorded_pass():
    """N2/STO-3G in float64: the gradient of a loss through the kernels equals the one through
    torch's kernels to 1e-10, and a recorded forward and backward pass replays it."""
    mol = Molecule.load("N2")
    psi = Ansatz.for_molecule(mol, seed=0, dtype=torch.float64, device="cuda")
    with torch.no_grad():
        for p in psi.parameters():
            p.add_(0.05 * torch.randn_like(p))
    x = psi.sample(4000, generator=1)[0]
    tok = psi.tokens(x)
    weight = torch.linspace(-1, 1, len(x), dtype=torch.float64, device="cuda")
    params = list(psi.parameters())

    def grads():
        lp = psi._log_psi_tokens(tok)
        return torch.autograd.grad((lp.real * weight).sum() + lp.imag.sum(), params)

    fused_ops.ENABLED = False
    ref = grads()
    fused_ops.ENABLED = True
    got = grads()
    assert max(_err(a, b) for a, b in zip(got, ref, strict=True)) < 1e-10
    _assert_replays(grads, got)


@pytest.fixture
def _coarse_paths_off():
    fused_ops._POISON = True  # a gradient entry that no program writes stays NaN
    yield
    fused_ops.BLOCK_ENABLED = fused_ops.AMPLITUDE_ENABLED = fused_ops._POISON = False
    fused_ops.COARSE_PRODUCTS = "ieee"


@pytest.mark.parametrize("path", ["block", "amplitude"])
@pytest.mark.parametrize(
    "dtype,tol,products",
    [
        (torch.float64, 1e-12, "ieee"),
        (torch.float32, 3e-5, "ieee"),
        (torch.float32, 3e-5, "tf32x3"),
    ],
)
@pytest.mark.parametrize("system", ["N2", "Hubbard-10-chain-U4"])
def test_coarse_paths_match_torch(_coarse_paths_off, path, dtype, tol, products, system):
    """A block, or the whole ln|psi|, as one kernel each way at the shapes of N2/STO-3G and
    the 10-site chain (trained-looking weights), float32 products as FMAs or as three TF32
    products on the tensor cores: ln psi and every gradient against torch's kernels (relative
    to each gradient's largest entry), and a recorded pass replays it."""
    fused_ops.COARSE_PRODUCTS = products
    mol = Molecule.load(system)
    psi = Ansatz.for_molecule(mol, seed=0, dtype=dtype, device="cuda")
    with torch.no_grad():
        for p in psi.parameters():
            p.add_(0.05 * torch.randn_like(p))
    tok = psi.tokens(psi.sample(8000, generator=1)[0])
    weight = torch.linspace(-1, 1, len(tok), dtype=dtype, device="cuda")
    params = list(psi.parameters())

    def grads():
        lp = psi._log_psi_tokens(tok)
        loss = (lp.real * weight).sum() + lp.imag.sum()
        return [lp.real.detach(), *torch.autograd.grad(loss, params)]

    fused_ops.ENABLED = False
    ref = grads()
    fused_ops.ENABLED = True
    setattr(fused_ops, "BLOCK_ENABLED" if path == "block" else "AMPLITUDE_ENABLED", True)
    got = grads()
    assert fused_ops._coarse_failed is None, fused_ops._coarse_failed
    for a, b in zip(got, ref, strict=True):
        assert _err(a, b) < tol * max(1.0, float(b.abs().max()))
    _assert_replays(grads, got)


@pytest.fixture
def _tail_restored():
    fused_ops._POISON = True  # a gradient entry that no program writes stays NaN
    yield
    fused_ops.TAIL_ENABLED, fused_ops._POISON = True, False
    assert fused_ops._tail_failed is None, fused_ops._tail_failed


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 3e-5)])
@pytest.mark.parametrize("system,d", [("N2", None), ("Hubbard-10-chain-U4", None), ("N2", 16)])
def test_amplitude_tail_matches_the_module(_tail_restored, dtype, tol, system, d):
    """The amplitude's tail as one kernel each way (`fused_ops.amplitude_tail`) against the
    module's tail (the same LayerNorm and attention kernels before it): ln|psi| (-inf on the
    same rows, among them configurations outside the sector) and every gradient (relative to
    each gradient's largest entry), with a gradient that reaches the out-of-sector rows; and a
    recorded pass replays it."""
    mol = Molecule.load(system)
    psi = Ansatz.for_molecule(mol, seed=0, dtype=dtype, device="cuda", d_model=d)
    with torch.no_grad():
        for p in psi.parameters():
            p.add_(0.05 * torch.randn_like(p))
    tok = psi.tokens(psi.sample(8000, generator=1)[0])
    off = tok[:5].clone()
    off[:, 0] = 3 - off[:, 0]  # one spin more, one less: outside the sector
    tok = torch.cat((tok, off))
    weight = torch.linspace(-1, 1, len(tok), dtype=dtype, device="cuda")
    params = list(psi.parameters())

    def grads():
        amp, phase = psi._log_psi_parts(tok)
        gp = torch.ones_like(phase)
        return [amp.detach(), *torch.autograd.grad((amp, phase), params, (weight, gp))]

    fused_ops.TAIL_ENABLED = False
    ref = grads()
    fused_ops.TAIL_ENABLED = True
    got = grads()
    assert type(psi.log_amplitude(tok).grad_fn).__name__ == "_AmplitudeTailBackward"
    assert torch.equal(torch.isinf(got[0]), torch.isinf(ref[0]))
    assert int(torch.isinf(ref[0]).sum()) >= 5
    fin = torch.isfinite(ref[0])
    assert _err(got[0][fin], ref[0][fin]) < tol * max(1.0, float(ref[0][fin].abs().max()))
    for a, b in zip(got[1:], ref[1:], strict=True):
        assert _err(a, b) < tol * max(1.0, float(b.abs().max()))

    def grads_finite():  # a recording compares values: -inf == -inf is not within 1e-12
        out = grads()
        return [torch.where(fin, out[0], 0.0), *out[1:]]

    _assert_replays(grads_finite, [torch.where(fin, got[0], 0.0), *got[1:]])
