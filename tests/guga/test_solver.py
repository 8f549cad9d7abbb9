"""`GUGASolver` against PySCF: energies of every root for singlet to quintet (direct_spin1 with
fix_spin_), density matrices, transition density matrices, alpha/beta density matrices and <S^2>
of the same state as a determinant vector, sigma against PySCF's contract_2e, the exact CSF
diagonal, and clear errors for bad input."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from cuscikit.guga import DRT, GUGASolver

pytest.importorskip("pyscf")
from pyscf import fci, gto, mcscf, scf  # noqa: E402


@functools.cache
def _active(name):
    """(h1, eri, norb, nelec, ecore) of a small active space from PySCF."""
    if name == "N2":
        mol = gto.M(atom="N 0 0 0; N 0 0 1.098", basis="6-31g", verbose=0)
        mf = scf.RHF(mol).run()
        mc = mcscf.CASCI(mf, 6, 6)
    else:  # O2 triplet ground state, ROHF orbitals
        mol = gto.M(atom="O 0 0 0; O 0 0 1.2075", basis="6-31g", spin=2, verbose=0)
        mf = scf.ROHF(mol).run()
        mc = mcscf.CASCI(mf, 6, (5, 3))
    h1, ecore = mc.get_h1eff()
    eri = mc.get_h2eff()
    return h1, eri, 6, ecore


def _reference(h1, eri, norb, nelec, twos, nroots, ecore):
    """The lowest roots of spin S of PySCF's determinant Hamiltonian (direct_spin1): dense H from
    its pspace over every determinant, eigenvectors kept where <S^2> = S(S+1)."""
    from math import comb

    s = 0.5 * twos
    na, nb = nelec
    n_det = comb(norb, na) * comb(norb, nb)
    g = fci.direct_spin1.ao2mo.restore(1, eri, norb)
    hdiag = fci.direct_spin1.make_hdiag(h1, g, norb, nelec)
    addr, hpp = fci.direct_spin1.pspace(h1, g, norb, nelec, hdiag, np=n_det)
    w, v = np.linalg.eigh(hpp)
    out = []
    for k in range(n_det):
        c = np.zeros(n_det)
        c[addr] = v[:, k]
        ss = fci.spin_op.spin_square0(c.reshape(comb(norb, na), -1), norb, nelec)[0]
        if abs(ss - s * (s + 1)) < 1e-6:
            out.append(w[k] + ecore)
        if len(out) == nroots:
            break
    return np.array(out)


def _davidson_reference(h1, eri, norb, nelec, twos, ecore):
    """PySCF's Davidson with a spin penalty: the ground state of spin S."""
    s = 0.5 * twos
    ref = fci.addons.fix_spin_(fci.direct_spin1.FCI(), shift=1.0, ss=s * (s + 1))
    ref.conv_tol = 1e-13
    return ref.kernel(h1, eri, norb, nelec, ecore=ecore)[0]


SLOW = pytest.mark.slow
ENERGY_CASES = [
    pytest.param("N2", (3, 3), 0, 3, marks=SLOW),
    pytest.param("N2", (4, 2), 2, 2, marks=SLOW),
    ("N2", (3, 3), 2, 2),  # a triplet at M = 0
    pytest.param("N2", (4, 2), 4, 2, marks=SLOW),
    ("N2", (5, 1), 4, 1),
    pytest.param("O2", (5, 3), 2, 3, marks=SLOW),  # open-shell ground state
    pytest.param("O2", (4, 4), 0, 2, marks=SLOW),
    ("O2", (5, 3), 4, 1),
]


@pytest.mark.parametrize("name,nelec,twos,nroots", ENERGY_CASES)
def test_energies_match_pyscf_every_root(name, nelec, twos, nroots):
    h1, eri, norb, ecore = _active(name)
    solver = GUGASolver(spin=twos, conv_tol=1e-12, davidson_only=True)
    e, ci = solver.kernel(h1, eri, norb, nelec, nroots=nroots, ecore=ecore)
    ref = _reference(h1, eri, norb, nelec, twos, nroots, ecore)
    np.testing.assert_allclose(np.atleast_1d(e), ref, atol=1e-9, rtol=0)
    assert np.all(solver.converged)
    if nelec[0] - nelec[1] == twos:  # the spin penalty is reliable at M = S
        e_d = _davidson_reference(h1, eri, norb, nelec, twos, ecore)
        assert np.atleast_1d(e)[0] == pytest.approx(e_d, abs=1e-9)
    # dense diagonalisation (small space, no guess) gives the same roots
    e2, _ = GUGASolver(spin=twos).kernel(h1, eri, norb, nelec, nroots=nroots, ecore=ecore)
    np.testing.assert_allclose(np.atleast_1d(e2), ref, atol=1e-9, rtol=0)


@pytest.mark.parametrize(
    "name,nelec,twos", [("N2", (3, 3), 0), ("O2", (5, 3), 2), ("N2", (3, 3), 2)]
)
def test_density_matrices_and_spin_match_the_determinant_state(name, nelec, twos):
    h1, eri, norb, ecore = _active(name)
    solver = GUGASolver(spin=twos, conv_tol=1e-12)
    e, ci = solver.kernel(h1, eri, norb, nelec, nroots=2, ecore=ecore)
    X, ne = DRT(norb, sum(nelec), twos).csf_to_dets(nelec[0] - nelec[1])
    dets = [np.tensordot(c, X, axes=1) for c in ci]
    dm1, dm2 = solver.make_rdm12(ci[0], norb, nelec)
    r1, r2 = fci.direct_spin1.make_rdm12(dets[0], norb, ne)
    np.testing.assert_allclose(dm1, r1, atol=1e-9)
    np.testing.assert_allclose(dm2, r2, atol=1e-9)
    np.testing.assert_allclose(solver.make_rdm1(ci[0], norb, nelec), r1, atol=1e-9)
    a, b = solver.make_rdm1s(ci[0], norb, nelec)
    ra, rb = fci.direct_spin1.make_rdm1s(dets[0], norb, ne)
    np.testing.assert_allclose(a, ra, atol=1e-9)
    np.testing.assert_allclose(b, rb, atol=1e-9)
    t1, t2 = solver.trans_rdm12(ci[0], ci[1], norb, nelec)
    q1, q2 = fci.direct_spin1.trans_rdm12(dets[0], dets[1], norb, ne)
    np.testing.assert_allclose(t1, q1, atol=1e-9)
    np.testing.assert_allclose(t2, q2, atol=1e-9)
    np.testing.assert_allclose(solver.trans_rdm1(ci[0], ci[1], norb, nelec), q1, atol=1e-9)
    ss_ref = fci.spin_op.spin_square0(dets[0], norb, ne)[0]
    ss, mult = solver.spin_square(ci[0], norb, nelec)
    s = 0.5 * twos
    assert abs(ss - s * (s + 1)) < 1e-10 and abs(ss_ref - ss) < 1e-10
    assert mult == pytest.approx(twos + 1)
    # the energy from the density matrices
    g = np.asarray(fci.direct_spin1.ao2mo.restore(1, eri, norb))
    e_rdm = np.einsum("pq,qp", h1, dm1) + 0.5 * np.einsum("pqrs,pqrs", g, dm2) + ecore
    assert e_rdm == pytest.approx(e[0], abs=1e-9)


def test_sigma_and_diagonal_match_pyscf_in_the_determinant_basis():
    h1, eri, norb, ecore = _active("O2")
    nelec, twos = (5, 3), 2
    solver = GUGASolver()
    X, ne = DRT(norb, 8, twos).csf_to_dets(2)
    S = X.reshape(len(X), -1)
    c = np.random.default_rng(3).standard_normal(len(X))
    h2 = solver.absorb_h1e(h1, eri, norb, nelec, 0.5)
    h2_ref = fci.direct_spin1.absorb_h1e(h1, eri, norb, ne, 0.5)
    np.testing.assert_allclose(h2, h2_ref, atol=1e-12)
    sigma = solver.contract_2e(h2, c, norb, nelec)
    ref = S @ fci.direct_spin1.contract_2e(h2_ref, c @ S, norb, ne).reshape(-1)
    np.testing.assert_allclose(sigma, ref, atol=1e-10)
    hdiag = solver.make_hdiag(h1, eri, norb, nelec)
    Hcsf = S @ np.stack(
        [fci.direct_spin1.contract_2e(h2_ref, x, norb, ne).reshape(-1) for x in X], axis=1
    )
    np.testing.assert_allclose(hdiag, np.diag(Hcsf), atol=1e-10)
    np.testing.assert_allclose(Hcsf, Hcsf.T, atol=1e-10)


def test_blocked_and_cached_sigma_agree():
    from cuscikit.guga.sigma import Engine

    h1, eri, norb, ecore = _active("N2")
    drt = DRT(norb, 6, 0)
    c = np.random.default_rng(0).standard_normal(drt.n_csf)
    V = np.random.default_rng(1).standard_normal((21, 21))
    V = V + V.T
    h = np.random.default_rng(2).standard_normal(21)
    full = Engine(drt, method="lists").contract(c, V, h)
    small = Engine(drt, budget=0, rows=37, nthreads=2, method="lists")
    np.testing.assert_allclose(small.contract(c, V, h), full, atol=1e-12)
    assert len(small.blocks) > 3 and not small.cached and small.list_bytes == 0
    part = Engine(drt, rows=37, method="lists")
    part.budget = part.list_bytes + 2 * 14 * int(np.diff(part.lists(0)[0]).sum()) + 1000
    np.testing.assert_allclose(part.contract(c, V, h), full, atol=1e-12)
    assert 0 < len(part._lists) < len(part.blocks) and not part.cached
    np.testing.assert_allclose(part.contract(c, V, h), full, atol=1e-12)
    chunked = Engine(drt, method="lists")
    chunked.rows = 37  # row ranges inside one cached block
    np.testing.assert_allclose(chunked.contract(c, V, h), full, atol=1e-12)
    g4 = np.asarray(fci.direct_spin1.ao2mo.restore(4, eri, norb))
    for eng in (small, chunked):
        np.testing.assert_allclose(eng.diagonal(h1, g4), Engine(drt).diagonal(h1, g4), atol=1e-12)
        d1, M = eng.generator_products(c, c[::-1].copy())
        r1, rM = Engine(drt).generator_products(c, c[::-1].copy())
        np.testing.assert_allclose(d1, r1, atol=1e-10)
        np.testing.assert_allclose(M, rM, atol=1e-10)


def test_kernel_outputs_have_pyscf_shapes():
    h1, eri, norb, ecore = _active("N2")
    s = GUGASolver()
    e, ci = s.kernel(h1, eri, norb, (3, 3), ecore=ecore)
    assert isinstance(e, float) and ci.ndim == 1 and s.converged is True
    e, ci = s.kernel(h1, eri, norb, 6, nroots=2, ecore=ecore)
    assert e.shape == (2,) and isinstance(ci, list) and len(ci) == 2
    g8 = fci.direct_spin1.ao2mo.restore(8, eri, norb)
    g1 = fci.direct_spin1.ao2mo.restore(1, eri, norb)
    e8, _ = GUGASolver().kernel(h1, g8, norb, (3, 3))
    e1, _ = GUGASolver().kernel(h1, g1, norb, (3, 3))
    assert e8 == pytest.approx(e1, abs=1e-12)
    # a guess from the previous solution converges at once to the same root
    e2, _ = GUGASolver(conv_tol=1e-12).kernel(h1, eri, norb, (3, 3), ci0=ci[0], ecore=ecore)
    assert e2 == pytest.approx(e[0], abs=1e-9)


def test_bad_input_is_refused_before_work():
    h1, eri, norb, ecore = _active("N2")
    with pytest.raises(ValueError, match="impossible"):
        GUGASolver(spin=1).kernel(h1, eri, norb, (3, 3))
    with pytest.raises(ValueError, match="cannot hold"):
        GUGASolver(spin=0).kernel(h1, eri, norb, (4, 2))
    bad = h1.copy()
    bad[0, 1] += 0.1
    with pytest.raises(ValueError, match="not symmetric"):
        GUGASolver().kernel(bad, eri, norb, (3, 3))
    with pytest.raises(ValueError, match="bytes"):
        GUGASolver(max_memory=0.001).kernel(h1, eri, norb, (3, 3))
    with pytest.raises(ValueError, match="maximum"):
        GUGASolver().kernel(np.eye(65), np.zeros(1), 65, (3, 3))
    with pytest.raises(AttributeError, match="conv_tol"):
        s = GUGASolver()
        s.conv_tl = 1e-9
        s.kernel(h1, eri, norb, (3, 3))


@pytest.mark.parametrize("method", ["loops", "lists"])
def test_sigma_is_bitwise_reproducible_for_a_thread_count(method):
    from cuscikit.guga.sigma import Engine

    drt = DRT(8, 8, 0)
    rng = np.random.default_rng(3)
    c = rng.standard_normal(drt.n_csf)
    V = rng.standard_normal((36, 36))
    V = V + V.T
    eng = Engine(drt, nthreads=2, rows=500, method=method)
    first = eng.contract(c, V)
    for _ in range(5):
        assert np.array_equal(eng.contract(c, V), first)
    one = Engine(drt, nthreads=1, method=method).contract(c, V)
    np.testing.assert_allclose(one, first, atol=1e-11)


@pytest.mark.parametrize("method", ["loops", "lists"])
@pytest.mark.parametrize("nthreads", [1, 2])
def test_sigma_into_a_given_vector_equals_a_new_one(method, nthreads):
    """contract(..., out=) writes the same bits as a new vector, into a contiguous vector or a
    strided column, for one thread (the buffer is `out`) and two (a sum into it); the thread
    buffers kept between calls leave nothing behind from the call before."""
    from cuscikit.guga.sigma import Engine

    drt = DRT(8, 8, 2)
    rng = np.random.default_rng(12)
    c, c2 = rng.standard_normal(drt.n_csf), rng.standard_normal(drt.n_csf)
    V = rng.standard_normal((36, 36))
    V, h = V + V.T, rng.standard_normal(36)
    eng = Engine(drt, nthreads=nthreads, method=method)
    ref = eng.contract(c, V, h)
    eng.contract(c2, V, h)  # a different vector in between
    flat = np.full(drt.n_csf, np.nan)
    assert eng.contract(c, V, h, out=flat) is flat and np.array_equal(flat, ref)
    block = np.full((drt.n_csf, 2), np.nan)
    eng.contract(c, V, h, out=block[:, 1])
    assert np.array_equal(block[:, 1], ref) and np.isnan(block[:, 0]).all()
    with pytest.raises(ValueError, match="out must"):
        eng.contract(c, V, h, out=np.empty(drt.n_csf - 1))
    with pytest.raises(ValueError, match="share memory"):
        eng.contract(c, V, h, out=c)
