"""Mini-batch inner steps (`Runner(inner_batch=M)`): the draw, the gradient it estimates, and
runs with and without it."""

import numpy as np
import pytest
import torch

from cuscikit import Molecule
from cuscikit.nnqs import Ansatz
from cuscikit.nnqs.checkpoint import CheckpointError, saved_settings
from cuscikit.nnqs.runner import Runner, systematic_draw


def _runner(name="LiH", device="cpu", **kw):
    mol = Molecule.load(name)
    kw.setdefault("topk", 16)
    psi = Ansatz.for_molecule(mol, seed=0, dtype=torch.float64, device=device)
    return Runner(mol, psi, seed=0, **kw)


_CUDA = pytest.param(
    "cuda",
    marks=[
        pytest.mark.gpu,
        pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    ],
)


def _grid(k):
    return (np.arange(k) + 0.5) / k  # midpoints: the mean over them is the mean over u in [0, 1)


def test_systematic_draw_is_unbiased_and_keeps_the_heavy_rows():
    g = torch.Generator().manual_seed(0)
    n, m = 60, 7
    coef = torch.randn(n, generator=g, dtype=torch.float64) + 1j * torch.randn(
        n, generator=g, dtype=torch.float64
    )
    coef[[3, 11, 12]] = 0
    coef[20] = 30.0  # probability above 1/m: drawn at every u
    vec = torch.randn((n, 3), generator=g, dtype=torch.float64).to(torch.complex128)
    exact = (coef[:, None] * vec).sum(0)
    p = coef.abs() / coef.abs().sum()
    counts = torch.zeros(n, dtype=torch.float64)
    estimate = torch.zeros(3, dtype=torch.complex128)
    us = _grid(20000)
    for u in us:
        rows, factor = systematic_draw(coef, m, float(u))
        assert len(rows) <= m and bool((rows[1:] > rows[:-1]).all())
        assert 20 in rows.tolist() and not {3, 11, 12} & set(rows.tolist())
        c = factor * m * p[rows]  # the draw's counts
        assert torch.allclose(c, c.round(), atol=1e-9) and float(c.sum().round()) == m
        counts[rows] += c.round()
        estimate += (factor[:, None] * coef[rows, None] * vec[rows]).sum(0)
    # expected count m p, and the estimate's mean the exact sum (to the grid's resolution)
    assert float((counts / len(us) - m * p).abs().max()) < 2e-4
    assert float((estimate / len(us) - exact).abs().max()) < 1e-3 * float(exact.abs().max())
    # nothing to draw when every coefficient is 0
    rows, factor = systematic_draw(torch.zeros(5, dtype=torch.complex128), 3, 0.5)
    assert rows.numel() == 0 and factor.numel() == 0


@pytest.mark.parametrize("device", ["cpu", _CUDA])
@pytest.mark.parametrize("teacher", [0.0, 1.0])
def test_mini_batch_inner_step_estimates_the_full_gradient(teacher, device):
    """Averaged over the draw's u, the inner step's mini-batch gradient (through the Runner's
    own code: the loss's coefficients, the draw, the weighted backward pass) is the full one;
    a single draw is not."""
    runner = _runner("H2O", device, teacher=teacher, topk=24)
    for _ in range(3):
        runner.step()
    S = runner.space.configs
    assert len(S) > 40
    r = runner._pipeline.run(S, runner.topk)
    teach = None
    if teacher:
        e_t, c = runner._teacher_solution(S, r)
        teach = (teacher, torch.as_tensor(c, dtype=torch.float64, device=runner.device))

    def grad(**kw):
        seen = []
        step = runner.optimizer.step
        runner.optimizer.step = lambda: seen.append(
            torch.cat([p.grad.reshape(-1) for p in runner.ansatz.parameters()])
        )
        try:
            runner.inner_batch = kw.get("inner_batch")
            u = kw.get("u")
            if u is not None:
                rng, runner.rng = runner.rng, type("U", (), {"random": lambda self: u})()
            runner._inner(S, r.hdiag, r.space_pairs, None, teach, n_inner=1)
        finally:
            runner.optimizer.step = step
            if kw.get("u") is not None:
                runner.rng = rng
        return seen[0]

    full = grad()
    mean = torch.zeros_like(full)
    us = _grid(400)
    for u in us:
        mean += grad(inner_batch=8, u=float(u))
    mean /= len(us)
    one = grad(inner_batch=8, u=0.3)
    scale = float(full.norm())
    assert float((mean - full).norm()) < 2e-2 * scale, float((mean - full).norm()) / scale
    assert float((one - full).norm()) > 5e-2 * scale  # one draw of 8 rows is not the sum


def test_inner_batch_at_or_above_the_space_is_the_full_step():
    """While |S| <= inner_batch nothing changes: the same history to the bit."""
    cols = ["e_coupled", "e_variational", "loss", "n_space", "e_pt2"]
    plain = _runner("H2O", inner_steps=2)
    plain.run(5)
    big = _runner("H2O", inner_steps=2, inner_batch=10**6)
    big.run(5)
    for c in cols:
        np.testing.assert_array_equal(plain.history[c], big.history[c], err_msg=c)


def test_a_run_with_mini_batch_inner_steps_learns_and_draws():
    """H2O with inner steps drawn from 6 configurations once |S| passes 6: the history parts
    from the full inner steps' once the space grows, and the drawn steps still do most of
    their work (after 30 iterations on the 2-core CPU: 58.8 mHa above FCI drawn, 57.8 full,
    126.8 without inner steps)."""
    runs = {}
    for name, kw in [("none", {"inner_steps": 0}), ("full", {}), ("mini", {"inner_batch": 6})]:
        kw.setdefault("inner_steps", 2)
        runs[name] = _runner("H2O", teacher=0, **kw)
        runs[name].run(30)
    err = {k: r.history["error_variational"].to_numpy() for k, r in runs.items()}
    assert err["mini"][0] == err["full"][0]  # |S| = 1 at the first iteration: no draw
    assert not np.array_equal(err["mini"], err["full"])
    assert np.isfinite(err["mini"]).all()
    assert err["mini"][-1] < err["none"][-1] - 0.03, (err["mini"][-1], err["none"][-1])


def test_inner_batch_is_checked_and_kept_in_the_checkpoint(tmp_path):
    for bad in (0, -3, 2.5, True, "8"):
        with pytest.raises(ValueError, match="inner_batch"):
            _runner(inner_batch=bad)
    r = _runner(inner_batch=8)
    r.step()
    path = tmp_path / "lih.h5"
    r.save(path)
    assert saved_settings(path)["inner_batch"] == 8
    _runner(inner_batch=8).load(path)
    with pytest.raises(CheckpointError, match="inner_batch"):
        _runner().load(path)
