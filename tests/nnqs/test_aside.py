"""Parameter gradients beside the pass (`cuscikit.nnqs.aside`): the autograd functions'
arithmetic on the CPU (one stream), against torch's linear layer and embeddings, and the
Ansatz's gradient through them. The second stream itself needs a GPU (tests/gpu)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from cuscikit import Ansatz  # noqa: E402
from cuscikit.nnqs import aside  # noqa: E402

F64 = torch.float64


@pytest.mark.parametrize("shape", [(7, 5), (3, 4, 5)])
@pytest.mark.parametrize("bias", [True, False])
def test_linear_function_gradcheck(shape, bias):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(*shape, dtype=F64, generator=g, requires_grad=True)
    w = torch.randn(6, 5, dtype=F64, generator=g, requires_grad=True)
    b = torch.randn(6, dtype=F64, generator=g, requires_grad=True) if bias else None
    fn = lambda x, w, b: aside._Linear.apply(x, w, b, None, False)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (x, w, b))
    y = fn(x, w, b)
    torch.testing.assert_close(y, torch.nn.functional.linear(x, w, b), rtol=0, atol=1e-14)


def test_linear_function_without_input_gradient():
    """A first layer (input without gradient, as the phase MLP's): no input gradient, the
    parameters' equal to torch's."""
    g = torch.Generator().manual_seed(2)
    x = torch.randn(9, 4, dtype=F64, generator=g)
    w = torch.randn(3, 4, dtype=F64, generator=g, requires_grad=True)
    b = torch.randn(3, dtype=F64, generator=g, requires_grad=True)
    up = torch.randn(9, 3, dtype=F64, generator=g)
    got = torch.autograd.grad((aside._Linear.apply(x, w, b, None, False) * up).sum(), (w, b))
    want = torch.autograd.grad((torch.nn.functional.linear(x, w, b) * up).sum(), (w, b))
    for a, e in zip(got, want, strict=True):
        torch.testing.assert_close(a, e, rtol=0, atol=1e-13)


def test_column_sums(monkeypatch):
    """The sums over rows as a product with a ones vector (kept per row count), and torch's
    reduction above the kept vectors' limit: both the column sums to rounding."""
    monkeypatch.setattr(aside, "_ones", {})  # this test's vectors alone
    g = torch.Generator().manual_seed(4)
    for m in (1, 37, 37):
        t = torch.randn(m, 5, dtype=F64, generator=g)
        torch.testing.assert_close(aside.column_sums(t), t.sum(0), rtol=0, atol=1e-13)
    assert aside._ones[(torch.device("cpu"), F64, 37)].shape == (37,)
    monkeypatch.setattr(aside, "_ONES_ROWS", 8)
    t = torch.randn(9, 3, dtype=F64, generator=g)
    torch.testing.assert_close(aside.column_sums(t), t.sum(0), rtol=0, atol=0)
    assert (torch.device("cpu"), F64, 9) not in aside._ones


def test_embed_function_gradcheck_and_values():
    g = torch.Generator().manual_seed(3)
    inputs = torch.randint(0, 5, (6, 4), generator=g)
    tok = torch.randn(5, 3, dtype=F64, generator=g, requires_grad=True)
    pos = torch.randn(7, 3, dtype=F64, generator=g, requires_grad=True)  # more rows than L
    fn = lambda t, p: aside._Embed.apply(inputs, t, p, None)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (tok, pos))
    torch.testing.assert_close(fn(tok, pos), aside.embed(inputs, tok, pos), rtol=0, atol=0)
    up = torch.randn(6, 4, 3, dtype=F64, generator=g)
    gt, gp = torch.autograd.grad((fn(tok, pos) * up).sum(), (tok, pos))
    assert torch.all(gp[4:] == 0)  # positions past the sequence get no gradient
    want = torch.zeros_like(tok).index_add_(0, inputs.reshape(-1), up.reshape(-1, 3))
    torch.testing.assert_close(gt, want, rtol=0, atol=1e-13)


def test_cpu_passes_keep_one_stream(monkeypatch):
    """On the CPU `gradients_aside` changes nothing, switches on or off: no side stream, a
    branch runs in place, `merge` and `join` are no-ops."""
    monkeypatch.setattr(aside, "ENABLED", True)
    monkeypatch.setattr(aside, "PHASE", True)
    x = torch.zeros(3, 2, requires_grad=True)
    with aside.gradients_aside():
        assert aside.stream_for(x) is None and aside.branch_stream(x) is None
        with aside.branch(None, x):
            y = x * 2
        aside.merge(None, y)
        aside.join("cpu")
    assert aside.stream_for(x) is None and aside.branch_stream(x) is None
    assert not aside._held and not aside._pending


def test_ansatz_gradient_through_the_functions(monkeypatch):
    """The Ansatz's pass with every linear layer and the embeddings through the autograd
    functions: ln psi and every parameter's gradient as torch's modules give (float64)."""
    psi = Ansatz(6, (3, 2), seed=4, dtype=F64)
    tok = psi.tokens(psi.sample(200)[0])
    up = torch.randn(len(tok), dtype=torch.complex128, generator=torch.Generator().manual_seed(5))

    def grads():
        lp = psi._log_psi_tokens(tok)
        loss = (lp.conj() * up).real.sum()
        return lp.detach(), torch.autograd.grad(loss, list(psi.parameters()))

    want_lp, want = grads()
    calls = []

    def linear(x, w, b):
        calls.append("linear")
        return aside._Linear.apply(x, w, b, None, False)

    def embed(inputs, t, p):
        calls.append("embed")
        return aside._Embed.apply(inputs, t, p, None)

    monkeypatch.setattr(aside, "linear", linear)
    monkeypatch.setattr(aside, "embed", embed)
    got_lp, got = grads()
    n_linear = 4 * psi.n_layers + 1 + len(psi.phase_hidden) + 1
    assert calls.count("linear") == n_linear and calls.count("embed") == 1
    torch.testing.assert_close(got_lp, want_lp, rtol=0, atol=1e-13)
    for a, e in zip(got, want, strict=True):
        torch.testing.assert_close(a, e, rtol=0, atol=1e-12)


def test_gradients_aside_is_per_thread_and_nests():
    """The switch is this thread's (ranks in threads each run their own stage) and nests."""
    import threading

    seen = []
    with aside.gradients_aside():
        with aside.gradients_aside():
            seen.append(aside._local.depth)
        seen.append(aside._local.depth)
        other = threading.Thread(target=lambda: seen.append(getattr(aside._local, "depth", 0)))
        other.start()
        other.join()
    seen.append(aside._local.depth)
    assert seen == [2, 1, 0, 0]
