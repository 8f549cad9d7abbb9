"""The P-space Hamiltonian equals the sigma's matrix elements; the P-space start and Olsen
preconditioner give the energies of the diagonal preconditioner, on numpy and on tensors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cuscikit.guga import DRT, GUGASolver
from cuscikit.guga.pspace import PSpacePreconditioner, pspace_hamiltonian
from cuscikit.guga.sigma import Engine
from tests.conftest import packed_random_integrals


def _operator(n: int, seed: int):
    rng = np.random.default_rng(seed)
    npair = n * (n + 1) // 2
    V = rng.standard_normal((npair, npair))
    return 0.5 * (V + V.T), rng.standard_normal(npair)


@pytest.mark.parametrize("space", [(6, 6, 0), (7, 6, 2), (8, 7, 1), (9, 11, 3)])
def test_pspace_hamiltonian_equals_sigma_elements(space):
    drt = DRT(*space)
    n, npair = drt.norb, drt.norb * (drt.norb + 1) // 2
    V, h = _operator(n, 1)
    eng = Engine(drt)
    rng = np.random.default_rng(2)
    csfs = rng.choice(drt.n_csf, size=min(50, drt.n_csf), replace=False)
    E = np.zeros((drt.n_csf, len(csfs)))
    E[csfs, np.arange(len(csfs))] = 1.0
    ref = np.stack([eng.contract(E[:, j], V, h) for j in range(len(csfs))], axis=1)[csfs]
    scale = np.abs(ref).max()
    assert np.abs(pspace_hamiltonian(drt, csfs, V, h, chunk_rows=40) - ref).max() < 1e-13 * scale
    assert np.abs(pspace_hamiltonian(drt, csfs, V, h) - ref).max() < 1e-13 * scale  # default
    H = pspace_hamiltonian(drt, csfs, V, h, diag=np.diag(ref), chunk_rows=7)
    assert np.abs(H - ref).max() < 1e-13 * scale
    A = rng.standard_normal((npair, 6))
    ref2 = np.stack([eng.contract(E[:, j], (A, A.T)) for j in range(len(csfs))], 1)[csfs]
    H2 = pspace_hamiltonian(drt, csfs, (A, A.T))
    assert np.abs(H2 - ref2).max() < 1e-13 * np.abs(ref2).max()


def test_pspace_rejects_bad_input():
    drt = DRT(6, 6, 0)
    V, h = _operator(6, 3)
    with pytest.raises(ValueError, match="distinct"):
        pspace_hamiltonian(drt, [1, 1], V, h)
    with pytest.raises(ValueError, match="kets must lie"):
        pspace_hamiltonian(drt, [drt.n_csf], V, h)
    with pytest.raises(ValueError, match="V must be"):
        pspace_hamiltonian(drt, [0, 1], V[:-1], h)
    with pytest.raises(ValueError, match="diag must"):
        pspace_hamiltonian(drt, [0, 1], V, h, diag=[0.0])
    with pytest.raises(ValueError, match="precond must be"):
        h1, g4, _ = packed_random_integrals(6, 4)
        GUGASolver(precond="olsen", pspace_size=10).kernel(h1, g4, 6, (3, 3))


def test_preconditioner_on_tensors_equals_numpy():
    rng = np.random.default_rng(5)
    n, p = 300, 20
    hdiag = np.sort(rng.standard_normal(n))
    csfs = np.arange(p)
    H = rng.standard_normal((p, p))
    H = 0.5 * (H + H.T) + np.diag(hdiag[:p])
    R, X = rng.standard_normal((n, 2)), rng.standard_normal((n, 2))
    host = PSpacePreconditioner(hdiag, csfs, H)
    dev = PSpacePreconditioner(torch.as_tensor(hdiag), csfs, H)
    thetas = np.array([-2.5, -1.7])
    a = host(R, thetas, X)
    b = dev(torch.as_tensor(R), thetas, torch.as_tensor(X)).numpy()
    assert np.abs(a - b).max() < 1e-12 * np.abs(a).max()
    assert np.array_equal(host.guess(2), dev.guess(2).numpy())
    g = host.guess(2)  # the lowest eigenvectors of H, zero outside the space
    assert np.abs(g[p:]).max() == 0.0
    np.testing.assert_allclose(H @ g[:p], g[:p] * np.linalg.eigvalsh(H)[:2], atol=1e-12)


@pytest.mark.parametrize("space,nroots", [((8, 8, 0), 2), ((9, 8, 2), 1)])
def test_pspace_solve_equals_diagonal_solve(space, nroots):
    n, N, twos = space
    h1, g4, _ = packed_random_integrals(n, 6)
    nelec = ((N + twos) // 2, (N - twos) // 2)
    opts = dict(nroots=nroots, conv_tol=1e-12, davidson_only=True, max_cycle=200, pspace_size=40)
    e_d, _ = GUGASolver(precond="diagonal", **opts).kernel(h1, g4, n, nelec)
    e_p, _ = GUGASolver(**opts).kernel(h1, g4, n, nelec)
    assert np.abs(np.asarray(e_p) - np.asarray(e_d)).max() < 1e-10


def test_pspace_grows_with_the_space(monkeypatch):
    """pspace_grow: above that many CSFs the P space holds pspace_size sqrt(n / pspace_grow)
    CSFs (at most 4 pspace_size); the energy is the fixed-size P space's."""
    n, nelec = 8, (4, 4)  # 1764 CSFs
    h1, g4, _ = packed_random_integrals(n, 5)
    sizes = []
    real = GUGASolver._pspace

    def spy(self, eng, op_vh, hdiag, sub, size):
        sizes.append(size)
        return real(self, eng, op_vh, hdiag, sub, size)

    monkeypatch.setattr(GUGASolver, "_pspace", spy)
    opts = dict(conv_tol=1e-12, pspace_size=40)
    e_fixed, _ = GUGASolver(pspace_grow=0, **opts).kernel(h1, g4, n, nelec)
    e_grown, _ = GUGASolver(pspace_grow=400, **opts).kernel(h1, g4, n, nelec)
    e_capped, _ = GUGASolver(pspace_grow=50, **opts).kernel(h1, g4, n, nelec)
    assert sizes == [40, int(40 * np.sqrt(1764 / 400)), 160]
    assert abs(e_grown - e_fixed) < 1e-10 and abs(e_capped - e_fixed) < 1e-10


def _random_pspace(rng, n: int, p: int):
    """A sorted random diagonal of n entries, p distinct P-space indices and a symmetric H_PP
    whose diagonal is theirs."""
    hdiag = np.sort(rng.standard_normal(n))
    csfs = rng.choice(n, size=p, replace=False)
    H = rng.standard_normal((p, p))
    return hdiag, csfs, 0.5 * (H + H.T) + np.diag(hdiag[csfs])


def test_preconditioner_equals_dense_olsen_correction():
    """The host correction (two work vectors, column by column) against Olsen's formula written
    densely: M = (H_PP - t) on the space and (H_mm - t) elsewhere, t = M^-1 (r - e x) with
    e = (x M^-1 r) / (x M^-1 x), for three columns at once (one diagonal exactly at t: clamped;
    one t below every diagonal, where the clamp is skipped)."""
    rng, n, p = np.random.default_rng(8), 200, 15
    hdiag, csfs, H = _random_pspace(rng, n, p)
    R, X = rng.standard_normal((n, 3)), rng.standard_normal((n, 3))
    pre = PSpacePreconditioner(hdiag, csfs, H)
    outside = np.setdiff1d(np.arange(n), csfs)
    thetas = np.array([-1.2, hdiag[outside[7]] + pre.shift, hdiag[0] - 0.5])
    got = pre(R, thetas, X)
    for j, t in enumerate(thetas - pre.shift):
        M = np.diag(np.where(np.abs(hdiag - t) < 1e-8, 1e-8, hdiag - t))
        M[np.ix_(csfs, csfs)] = H - t * np.eye(p)
        Mr, Mx = np.linalg.solve(M, R[:, j]), np.linalg.solve(M, X[:, j])
        ref = np.linalg.solve(M, R[:, j] - (X[:, j] @ Mr) / (X[:, j] @ Mx) * X[:, j])
        assert np.abs(got[:, j] - ref).max() < 1e-9 * np.abs(ref).max()


def test_correction_over_the_residuals_equals_the_new_block():
    """overwrite_r: the host correction written over the residuals passed in (as the solver's
    Davidson lets it) equals the correction into a new block bit for bit, and is that storage."""
    rng, n = np.random.default_rng(14), 300
    hdiag, csfs, H = _random_pspace(rng, n, 25)
    pre = PSpacePreconditioner(hdiag, csfs, H)
    thetas = np.array([hdiag[0] - 0.3, hdiag[40] + pre.shift])  # the second one clamped
    rows, X = rng.standard_normal((2, n)), rng.standard_normal((n, 2))
    ref = pre(rows.T.copy(), thetas, X)
    pre.overwrite_r = True
    got = pre(rows.T, thetas, X)
    assert np.shares_memory(got, rows)
    np.testing.assert_array_equal(got, ref)


def test_lowest_entries_equal_a_stable_argsort_with_ties():
    from cuscikit.guga.solver import _lowest

    rng = np.random.default_rng(9)
    for n in (1000, 70_000):  # a sort of all of them, and the selection beyond 65,536
        a = rng.integers(0, 20, size=n).astype(np.float64)  # many ties at every border
        for k in (1, 7, 50, n - 1, n, n + 200):
            assert np.array_equal(_lowest(a, k), np.argsort(a, kind="stable")[:k])


def test_host_noise_is_seeded_uniform_of_unit_variance():
    """The host's start noise: the same on every call, uniform on [-sqrt(3), sqrt(3)) (mean 0,
    variance 1, no zero entry: every CSF is reached)."""
    from cuscikit.guga.solver import _host_noise

    a = _host_noise((100_000, 2))
    assert a.shape == (100_000, 2) and np.array_equal(a, _host_noise((100_000, 2)))
    assert np.abs(a).max() <= np.sqrt(3.0) and np.all(a != 0.0)
    assert abs(a.mean()) < 0.01 and abs(a.var() - 1.0) < 0.01


@pytest.mark.parametrize("on_tensor", [False, True])
def test_start_noise_is_capped_at_the_pspace_norm(on_tensor):
    """The start vectors' noise: 1e-5 per CSF in a space no larger than the P space, and beyond
    it each column's norm exactly 1e-5 sqrt(P) (1e-5 per CSF would give 1e-5 sqrt(n), 20x more
    here), seeded, the same rule on numpy and on tensors."""
    from cuscikit.guga.solver import _start_vectors

    rng = np.random.default_rng(11)
    for n, p, nroots in ((200_000, 500, 1), (200_000, 500, 3), (300, 500, 1)):
        hdiag = np.sort(rng.standard_normal(n))
        d = torch.as_tensor(hdiag) if on_tensor else hdiag
        G = _start_vectors(d, n, nroots, None, p)
        G = G.numpy() if on_tensor else G
        assert np.array_equal(G, np.asarray(_start_vectors(d, n, nroots, None, p)))  # seeded
        k0 = G.shape[1]
        unit = np.zeros((n, k0))
        unit[np.arange(k0), np.arange(k0)] = 1.0  # hdiag sorted: the lowest diagonals first
        noise = G - unit
        norms = np.linalg.norm(noise, axis=0)
        if n > p:
            np.testing.assert_allclose(norms, 1e-5 * np.sqrt(p), rtol=1e-6)
        else:  # 1e-5 times unit-variance noise per CSF: a norm near 1e-5 sqrt(n)
            assert np.all(np.abs(norms / (1e-5 * np.sqrt(n)) - 1) < 0.2)
    # with a P-space preconditioner the cap is its size, whatever is passed
    n, p = 50_000, 200
    hdiag = np.sort(rng.standard_normal(n))
    H = np.diag(hdiag[:p]) + 1e-3 * np.ones((p, p))
    pre = PSpacePreconditioner(torch.as_tensor(hdiag) if on_tensor else hdiag, np.arange(p), H)
    G = _start_vectors(pre.hdiag, n, 1, pre)
    G = G.numpy() if on_tensor else G
    assert 0.99e-5 * np.sqrt(p) < np.linalg.norm(G[p:, 0]) < 1.0000001e-5 * np.sqrt(p)


def test_preconditioner_keeps_only_the_eigenpairs():
    """PSpacePreconditioner reads H's lower triangle and keeps its eigenpairs only: H is left as
    it is unless overwrite_h (then no copy of it is made: the build holds about one matrix
    beside H, where a symmetrised copy and numpy's eigh held several)."""
    import tracemalloc

    rng = np.random.default_rng(12)
    n, p = 1000, 300
    hdiag = np.sort(rng.standard_normal(n))
    H = rng.standard_normal((p, p))
    H = H + H.T + np.diag(hdiag[:p])
    keep = H.copy()
    a = PSpacePreconditioner(hdiag, np.arange(p), H)
    assert np.array_equal(H, keep)
    upper = np.triu(H, 1)
    H -= upper  # the lower triangle alone: the same eigenpairs
    tracemalloc.start()
    try:
        b = PSpacePreconditioner(hdiag, np.arange(p), H, overwrite_h=True)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1.5 * 8 * p * p
    np.testing.assert_allclose(b._w, np.linalg.eigvalsh(keep), atol=1e-10)
    np.testing.assert_allclose(np.abs(a._U.T @ b._U), np.eye(p), atol=1e-8)
