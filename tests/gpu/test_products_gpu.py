"""The tensor-core products of `cuscikit.nnqs.products` on the GPU: against float64 at the
shapes of N2/STO-3G's training pass, the Ansatz's float32 pass with them, and a recorded
optimiser stage with them."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")

from cuscikit import Ansatz, Molecule, Runner  # noqa: E402
from cuscikit.nnqs import aside, products  # noqa: E402
from cuscikit.sci.configs import all_determinants  # noqa: E402
from tests.conftest import count_calls, next_recorded_stage  # noqa: E402

pytestmark = pytest.mark.gpu
DEV = torch.device("cuda")


@pytest.fixture(autouse=True)
def _need_cuda(monkeypatch):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    pytest.importorskip("triton")
    monkeypatch.setattr(products, "ENABLED", True)


def _rel(a, ref):
    if a.is_complex():
        a, ref = torch.view_as_real(a), torch.view_as_real(ref)
    return float((a.double() - ref).abs().max() / ref.abs().max())


@pytest.mark.parametrize(
    "m,k,n",
    [
        (19200, 32, 96),
        (19200, 32, 32),
        (19200, 32, 128),
        (19200, 128, 32),
        (1920, 20, 512),
        (1920, 512, 512),
        (1920, 512, 1),
        (1003, 48, 144),
    ],
)
def test_products_match_float64(m, k, n):
    """Forward, input and weight gradients (with the bias's sums) to 3e-6 of the largest
    entry, as close as cuBLAS's float32 products come (checked beside them)."""
    g = torch.Generator(device=DEV).manual_seed(m + k + n)
    x = torch.randn(m, k, device=DEV, generator=g)
    w = torch.randn(n, k, device=DEV, generator=g)
    b = torch.randn(n, device=DEV, generator=g)
    dy = torch.randn(m, n, device=DEV, generator=g)
    x64, w64, dy64 = x.double(), w.double(), dy.double()
    want = x64 @ w64.t() + b.double()
    assert _rel(products.mm(x, w.t(), b), want) < 3e-6
    assert _rel(products.mm(dy, w), dy64 @ w64) < 3e-6
    dw, db = products.weight_grad(dy, x, True)
    assert _rel(dw, dy64.t() @ x64) < 3e-6
    assert _rel(db, dy64.sum(0)) < 3e-6
    assert _rel(torch.addmm(b, x, w.t()), want) < 3e-6  # cuBLAS's, for scale


@pytest.mark.parametrize("fused_mlp,max_width", [(True, None), (False, None), (True, 256)])
def test_float32_pass_with_the_products_matches_float64(fused_mlp, max_width, monkeypatch):
    """N2's ansatz over 1,920 configurations: ln psi within 1e-5 of float64 (as the pass with
    cuBLAS's products), the gradient of a weighted loss within 1e-4 of float64's, and the
    kernel taken by every linear layer (without MAX_WIDTH: the phase MLP's included; with 256:
    the transformer's only), with each MLP's GELUs in the kernels or apart."""
    monkeypatch.setattr(products, "FUSED_MLP", fused_mlp)
    monkeypatch.setattr(products, "MAX_WIDTH", max_width)
    mol = Molecule.load("N2")
    psi32 = Ansatz.for_molecule(mol, seed=0, dtype=torch.float32, device="cuda")
    psi64 = Ansatz.for_molecule(mol, seed=0, dtype=torch.float64, device="cuda")
    x = all_determinants(mol.norb, mol.nelec)
    x = x[:: max(1, len(x) // 1920)][:1920]

    def run(psi, on):
        products.ENABLED = on
        with aside.gradients_aside(DEV):
            lp = psi.log_psi(x)
            weights = torch.linspace(-1, 1, len(x), device=DEV, dtype=lp.real.dtype)
            loss = (lp.real * weights).sum() + lp.imag.sum()
            grads = torch.autograd.grad(loss, list(psi.parameters()))
            aside.join(DEV)
        return lp.detach(), grads

    with monkeypatch.context() as m:
        launches = count_calls(m, products, "_launch")
        lp_tc, g_tc = run(psi32, True)
    calls = [args[0].shape for args in launches]
    linears = [m for m in psi32.modules() if isinstance(m, torch.nn.Linear)]
    narrow = [m for m in linears if max(m.weight.shape) <= (max_width or max(m.weight.shape))]
    # forward, input and weight gradient of each but the head (the tail kernel's); no input
    # gradient for the phase MLP's first layer (its input is the occupations)
    assert len(calls) >= 3 * (len(narrow) - 1) - (max_width is None)
    # every call of a phase MLP layer has a 512-wide operand; the transformer's none
    assert any(512 in shape for shape in calls) == (max_width is None)
    lp_32, _ = run(psi32, False)
    lp_64, g_64 = run(psi64, False)
    err_tc = float((lp_tc - lp_64).abs().max())
    err_32 = float((lp_32 - lp_64).abs().max())
    assert err_tc <= max(1e-5, 2 * err_32), (err_tc, err_32)
    for a, c in zip(g_tc, g_64, strict=True):
        if c.abs().max() > 0:
            assert _rel(a, c) < 1e-4


def test_recorded_stage_with_the_products_equals_its_body(monkeypatch):
    """A float32 N2 run with the products and the teacher's 16 inner steps: one recorded
    stage (17 passes) from a saved state gives the weights that the same stage's body run
    without a recording gives (the same kernels: float32 rounding apart at most)."""
    from cuscikit.nnqs.graphs import OptimizerGraph

    mol = Molecule.load("N2")
    ansatz = Ansatz.for_molecule(mol, seed=0, dtype=torch.float32, device="cuda")
    runner = Runner(mol, ansatz, seed=0, topk=256, graphs=True, teacher_inner_steps=16)
    runner.run(3, progress=False)
    seen = next_recorded_stage(runner)
    assert seen["args"][5] == 16
    out = {}
    calls = count_calls(monkeypatch, products, "_launch")
    for recorded in (True, False):
        psi = copy.deepcopy(runner.ansatz)
        psi.load_state_dict(seen["weights"])
        opt = torch.optim.AdamW(psi.parameters())
        opt.load_state_dict(copy.deepcopy(seen["adamw"]))
        before = len(calls)
        res = OptimizerGraph(psi, opt, use_graph=recorded).run(*seen["args"], **seen["kw"])
        assert len(calls) > before  # the passes took the kernel
        out[recorded] = res, {k: p.detach().clone() for k, p in psi.named_parameters()}
    (loss_g, *flags_g), w_g = out[True]
    (loss_e, *flags_e), w_e = out[False]
    assert flags_g == flags_e == [True, True]
    assert abs(loss_g - loss_e) <= 1e-5 * max(1.0, abs(loss_e))
    moved = max(float((p - seen["weights"][k]).abs().max()) for k, p in w_e.items())
    assert moved > 1e-5
    for k, p in w_g.items():
        torch.testing.assert_close(p, w_e[k], rtol=0, atol=1e-5, msg=k)
