"""`cuscikit.nnqs.local_energy`: the local energies and loss coefficients of the recorded
stage's inner steps. The torch operations on the CPU; the Triton kernels in Triton's
interpreter against them (float64), alone and inside an optimiser stage."""

from __future__ import annotations

import textwrap

import pytest

torch = pytest.importorskip("torch")

from cuscikit.nnqs import local_energy  # noqa: E402
from tests.conftest import run_interpreted  # noqa: E402


def test_terms_on_the_cpu_are_the_variational_energy():
    """Without the kernels: E is <psi|H|psi> / <psi|psi> over the rows of S (a dense H built
    from the pairs), T = w (E_x - E) sums to 0, padding rows get nothing."""
    g = torch.Generator().manual_seed(0)
    n, pad = 12, 3
    h = torch.randn(n - pad, n - pad, dtype=torch.float64, generator=g)
    h = h + h.T
    src, dst = torch.nonzero(~torch.eye(n - pad, dtype=torch.bool), as_tuple=True)
    val = h[src, dst].to(torch.complex128)
    lp = torch.complex(
        torch.randn(n, dtype=torch.float64, generator=g),
        torch.randn(n, dtype=torch.float64, generator=g),
    )
    lp[n - pad :] = lp[0]
    mask = torch.ones(n, dtype=torch.float64)
    mask[n - pad :] = 0
    hd = torch.cat([h.diagonal(), torch.zeros(pad, dtype=torch.float64)])
    psi, coef, e, bad = local_energy.terms(lp, mask, hd, (src, dst, val))
    v = torch.exp(lp[: n - pad])
    want = (v.conj() @ (h.to(torch.complex128) @ v)).real / (v.abs() ** 2).sum()
    assert abs(float(e) - float(want)) < 1e-12
    assert not bool(bad) and float(coef.abs()[n - pad :].max()) == 0.0
    assert abs(complex(coef.sum())) < 1e-12


def test_terms_take_the_two_real_parts_and_write_the_loss_gradient():
    """ln psi as ``(ln|psi|, phi)`` (float32 here) gives what its complex128 value gives, and
    ``grad`` gets (2 Re T, 2 Im T) in the parts' dtype: the gradient of 2 Re sum conj(ln psi) T
    that autograd takes through the complex loss, bit for bit."""
    g = torch.Generator().manual_seed(3)
    n = 15
    amp = torch.randn(n, generator=g, requires_grad=True)
    phase = torch.randn(n, generator=g, requires_grad=True)
    mask, hd = torch.ones(n, dtype=torch.float64), torch.randn(n, dtype=torch.float64, generator=g)
    src, dst = torch.randint(0, n, (60,), generator=g), torch.randint(0, n, (60,), generator=g)
    val = torch.randn(60, dtype=torch.complex128, generator=g)
    lp = torch.complex(amp, phase).to(torch.complex128)
    grad = torch.empty((2, n))
    got = local_energy.terms((amp.detach(), phase.detach()), mask, hd, (src, dst, val), grad=grad)
    want = local_energy.terms(lp.detach(), mask, hd, (src, dst, val))
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b)
    ga, gp = torch.autograd.grad(2.0 * (lp.conj() * want[1]).real.sum(), (amp, phase))
    assert torch.equal(grad[0], ga) and torch.equal(grad[1], gp)
    assert float(grad.abs().max()) > 0


def test_a_kernel_that_cannot_run_falls_back_to_the_torch_operations(monkeypatch):
    """Where the kernels cannot run (here CPU tensors outside Triton's interpreter) `terms`
    warns, turns them off for the process and gives the torch operations' values over the
    same pairs in rows."""
    from cuscikit.nnqs._triton import interpreting

    if interpreting():
        pytest.skip("the interpreter runs the kernels on CPU tensors")
    monkeypatch.setattr(local_energy, "ENABLED", True)
    monkeypatch.setattr(local_energy, "failed", None)
    g = torch.Generator().manual_seed(2)
    n = 20
    lp = torch.randn(n, dtype=torch.complex128, generator=g)
    mask, hd = torch.ones(n, dtype=torch.float64), torch.randn(n, dtype=torch.float64)
    src = torch.randint(0, n, (80,), generator=g)
    dst = torch.randint(0, n, (80,), generator=g)
    val = torch.randn(80, dtype=torch.complex128, generator=g)
    rowptr, src, dst, val = local_energy.csr(src, dst, val, n)
    assert rowptr.tolist() == [int((src < r).sum()) for r in range(n + 1)]
    want = local_energy.terms(lp, mask, hd, (src, dst, val))
    with pytest.warns(RuntimeWarning, match="local-energy kernels failed"):
        got = local_energy.terms(lp, mask, hd, (src, dst, val), rowptr)
    assert not local_energy.ENABLED and local_energy.failed
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b)


_SCRIPT = textwrap.dedent(
    """
    import copy, torch
    from cuscikit.nnqs import local_energy as le

    assert le.kernels_for("cpu")  # the interpreter runs the kernels on CPU tensors
    g = torch.Generator().manual_seed(1)

    def case(n, n_pad, m, hub=None, poke=None, teach=False):
        lp = torch.complex(torch.rand(n, dtype=torch.float64, generator=g) * 4 - 3,
                           torch.rand(n, dtype=torch.float64, generator=g) * 6 - 3)
        lp[n - n_pad:] = lp[0]  # padding rows repeat row 0
        mask = torch.ones(n, dtype=torch.float64)
        mask[n - n_pad:] = 0
        hd = torch.randn(n, dtype=torch.float64, generator=g)
        src = torch.randint(0, n - n_pad, (m,), generator=g)
        if hub is not None:  # one row with more pairs than a program takes in one step
            src = torch.cat([src, torch.full((100,), hub)])
        dst = torch.randint(0, n - n_pad, (len(src),), generator=g)
        val = torch.complex(torch.randn(len(src), dtype=torch.float64, generator=g),
                            torch.randn(len(src), dtype=torch.float64, generator=g)) * 0.1
        if poke is not None:
            poke(lp)
        t = None
        if teach:  # signs of both kinds, rows the teacher leaves out, 0 on padding
            c = torch.randn(n, dtype=torch.float64, generator=g) * mask
            c[torch.rand(n, generator=g) < 0.2] = 0.0
            t = (torch.tensor(0.7, dtype=torch.float64), c)
        ref = le.terms(lp, mask, hd, (src, dst, val), teacher=t)
        rowptr, s2, d2, v2 = le.csr(src, dst, val, n)
        return ref, le.terms(lp, mask, hd, (s2, d2, v2), rowptr=rowptr, teacher=t)

    # rows not a multiple of a program's, empty rows, a single row, unsorted pairs
    for args in [(70, 10, 600, 5), (16, 0, 40, None), (1, 0, 0, None), (130, 3, 2000, 7),
                 (1, 0, 0, None, None, True),
                 (1100, 20, 3000, 9, None, True)]:  # with a teacher; more rows than a step
        ref, got = case(*args)
        for a, b, name in zip(ref[:3], got[:3], ("psi", "coef", "e")):
            err = float((a - b).abs().max())
            assert err <= 1e-13 * max(1.0, float(a.abs().max())), (args, name, err)
        assert not bool(ref[3]) and not bool(got[3]), args
    # ln psi as the pair (ln|psi|, phi) in float64 or float32 (read as float64), and the
    # loss's gradient (2 Re T, 2 Im T) written in the pair's dtype, kernels and torch alike
    for dt in (torch.float64, torch.float32):
        n = 70
        pair = ((torch.rand(n, dtype=torch.float64, generator=g) * 4 - 3).to(dt),
                (torch.rand(n, dtype=torch.float64, generator=g) * 6 - 3).to(dt))
        lpc = torch.complex(*pair).to(torch.complex128)
        mask, hd = torch.ones(n, dtype=torch.float64), torch.randn(n, dtype=torch.float64)
        src = torch.randint(0, n, (500,), generator=g)
        dst = torch.randint(0, n, (500,), generator=g)
        val = torch.randn(500, dtype=torch.complex128, generator=g) * 0.1
        c = torch.randn(n, dtype=torch.float64, generator=g)
        t = (torch.tensor(0.3, dtype=torch.float64), c)
        rowptr, s2, d2, v2 = le.csr(src, dst, val, n)
        for rp, pairs in ((rowptr, (s2, d2, v2)), (None, (src, dst, val))):
            grad = torch.full((2, n), float("nan"), dtype=dt)
            got = le.terms(pair, mask, hd, pairs, rp, t, grad)
            want = le.terms(lpc, mask, hd, pairs, rp, t)
            for a, b in zip(got, want, strict=True):
                assert torch.equal(a, b), (dt, rp is None)
            assert torch.equal(grad, (2.0 * torch.view_as_real(want[1]).t()).to(dt))
    # the teacher's pull where psi is tiny (its phase still counts) or exactly 0
    for poke in (lambda lp: lp.__setitem__(3, complex(-700.0, 2.5)),
                 lambda lp: lp.__setitem__(3, complex(-1000.0, 2.5))):
        ref, got = case(40, 4, 0, None, poke, True)
        torch.testing.assert_close(got[1], ref[1], rtol=0, atol=1e-13, equal_nan=True)
    # the iteration's pull and the teacher's loss in one program, against the torch operations
    from cuscikit.nnqs import teacher as T
    for n in (1, 37, 1100):
        lp = torch.complex(torch.rand(n, dtype=torch.float64, generator=g) * 4 - 3,
                           torch.rand(n, dtype=torch.float64, generator=g) * 6 - 3)
        if n > 5:
            lp[3] = complex(-700.0, 2.5)  # |psi| below 1e-300: not made a unit, as torch's
        psi = torch.exp(lp - lp.real.max())
        c = torch.randn(n, dtype=torch.float64, generator=g)
        c[torch.rand(n, generator=g) < 0.2] = 0.0
        c[0] = 1.0
        parts = T._parts(psi, c)
        pull, loss = le.teacher_pull(psi, c)
        assert float((pull - T._coefficients(*parts)).abs().max()) <= 1e-13, n
        assert abs(float(loss) - float(T._loss(*parts))) <= 1e-12 * max(1.0, float(loss)), n
    # a row whose psi underflows to 0, a NaN: flagged by both
    for poke in (lambda lp: lp.__setitem__(3, complex(-800.0, 0.2)),
                 lambda lp: lp.__setitem__(5, complex(float("nan"), 0.0))):
        ref, got = case(40, 4, 300, None, poke)
        assert bool(ref[3]) and bool(got[3])

    # one optimiser stage (LiH, 2 inner steps) with the kernels against the torch operations
    # (the transformer's own Triton kernels off: in the interpreter they take a minute a stage)
    from cuscikit import Molecule, Ansatz, Runner
    from cuscikit.nnqs import fused_ops
    fused_ops.ENABLED = False
    from cuscikit.nnqs.graphs import OptimizerGraph
    mol = Molecule.load("LiH")
    runner = Runner(mol, Ansatz.for_molecule(mol, seed=0, dtype=torch.float64), seed=0,
                    topk=16, inner_steps=2, teacher=0)
    runner.run(1, progress=False)
    S = runner.space.configs
    res = runner._pipeline.run(S, runner.topk)
    psi = torch.as_tensor(res.psi_s)
    w = psi.abs() ** 2 / (psi.abs() ** 2).sum()
    de = torch.zeros(len(S), dtype=torch.complex128)
    pairs = tuple(torch.as_tensor(a) for a in res.space_pairs)
    c = torch.randn(len(S), dtype=torch.float64, generator=g)
    for teacher in (None, (0.5, c / c.norm())):  # without and with the teacher's pull
        weights = []
        for on in (True, False):
            le.ENABLED = on
            ansatz = copy.deepcopy(runner.ansatz)
            opt = torch.optim.AdamW(ansatz.parameters())
            stage = OptimizerGraph(ansatz, opt, use_graph=False)
            hd = torch.as_tensor(res.hdiag)
            loss, ok, finite = stage.run(S, w, de, hd, pairs, 2, teacher=teacher)
            assert stage._key.csr == on and ok and finite
            weights.append([p.detach().clone() for p in ansatz.parameters()])
        moved = max(float((a - b).abs().max())
                    for a, b in zip(weights[1], runner.ansatz.parameters()))
        assert moved > 1e-6
        worst = max(float((a - b).abs().max()) for a, b in zip(*weights))
        # the teacher's sin(arg v) as Im v / |v| differs from torch's sin(angle(v)) in the
        # last bits, which AdamW's first steps (update ~ g / (|g| + eps)) enlarge
        assert worst <= (1e-11 if teacher else 1e-12), (teacher is not None, worst)
    print("ok", worst)
    """
)


def test_kernels_match_the_torch_operations_in_the_interpreter():
    """float64: psi, T and E to 1e-13 on random spaces (padding, empty rows, a row of 100
    pairs, a single row), with and without a teacher's pull (T to 1e-13 also where psi is
    tiny or 0), the iteration's pull and loss (`teacher_pull`, 1e-13 / 1e-12), the same flag
    where psi underflows or is NaN; and one optimiser stage (LiH, two inner steps, with and
    without a teacher) with the kernels leaves the same weights as with the torch operations
    (1e-12; 1e-11 with the teacher)."""
    out = run_interpreted(_SCRIPT, timeout=600)
    assert "ok" in out
