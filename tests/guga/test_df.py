"""Factored integrals in the GUGA sigma: an exact pivoted Cholesky factor, and the same factor
given as a 3-index tensor, give the energies and vectors of the dense integrals; a truncated
factor gives the energy of the truncated Hamiltonian; bad factors are refused."""

from __future__ import annotations

import numpy as np
import pytest

from cuscikit.guga import GUGASolver
from cuscikit.guga.df import cholesky_pairs, pair_factor
from cuscikit.guga.sigma import Engine

pytest.importorskip("pyscf")
from pyscf import ao2mo, gto, mcscf, scf  # noqa: E402


def _n2(norb=6):
    mol = gto.M(atom="N 0 0 0; N 0 0 1.098", basis="6-31g", verbose=0)
    mf = scf.RHF(mol).run()
    mc = mcscf.CASCI(mf, norb, 6)
    h1, ecore = mc.get_h1eff()
    return h1, ao2mo.restore(4, mc.get_h2eff(), norb), ecore


def test_cholesky_is_exact_at_zero_threshold_and_bounded_above_it():
    _, g4, _ = _n2()
    L = cholesky_pairs(g4, tol=0.0)
    np.testing.assert_allclose(L @ L.T, g4, atol=1e-12)
    Lt = cholesky_pairs(g4, tol=3e-2)
    assert Lt.shape[1] < L.shape[1]
    assert np.abs(np.diag(g4 - Lt @ Lt.T)).max() <= 3e-2 + 1e-15
    with pytest.raises(ValueError, match="positive semidefinite"):
        cholesky_pairs(np.diag([1.0, -1.0]))


@pytest.mark.parametrize("twos, nroots", [(0, 2), (2, 1)])
def test_factored_sigma_and_energies_equal_the_dense_ones(twos, nroots):
    h1, g4, ecore = _n2()
    nelec = (3 + twos // 2, 3 - twos // 2)
    dense = GUGASolver(spin=twos, conv_tol=1e-12, davidson_only=True)
    e_ref, c_ref = dense.kernel(h1, g4, 6, nelec, ecore=ecore, nroots=nroots)
    chol = GUGASolver(spin=twos, conv_tol=1e-12, davidson_only=True, df=True, df_tol=0.0)
    e, c = chol.kernel(h1, g4, 6, nelec, ecore=ecore, nroots=nroots)
    np.testing.assert_allclose(e, e_ref, atol=1e-10)
    # the same factor as a 3-index tensor (naux, norb, norb)
    L = cholesky_pairs(g4, tol=0.0)
    i, j = np.tril_indices(6)
    cd = np.zeros((L.shape[1], 6, 6))
    cd[:, i, j] = L.T
    cd[:, j, i] = L.T
    given = GUGASolver(spin=twos, conv_tol=1e-12, davidson_only=True, cderi=cd)
    e2, c2 = given.kernel(h1, None, 6, nelec, ecore=ecore, nroots=nroots)
    np.testing.assert_allclose(e2, e_ref, atol=1e-10)
    a, b = np.atleast_2d(np.asarray(c2))[0], np.atleast_2d(np.asarray(c_ref))[0]
    assert abs(abs(a @ b) - 1) < 1e-8  # the ground state, up to its sign
    # sigma itself, factored against dense, on a random vector
    eng = dense._engine(6, nelec)
    x = np.random.default_rng(0).standard_normal(eng.ncsf)
    np.testing.assert_allclose(
        eng.contract(x, (L, 0.5 * L.T)), eng.contract(x, 0.5 * g4), atol=1e-11
    )


def test_truncated_factor_solves_the_truncated_hamiltonian():
    h1, g4, ecore = _n2()
    s = GUGASolver(df=True, df_tol=3e-2, conv_tol=1e-12, davidson_only=True)
    e, _ = s.kernel(h1, g4, 6, (3, 3), ecore=ecore)
    L = cholesky_pairs(g4, tol=3e-2)
    e_ref, _ = GUGASolver(conv_tol=1e-12, davidson_only=True).kernel(
        h1, L @ L.T, 6, (3, 3), ecore=ecore
    )
    np.testing.assert_allclose(e, e_ref, atol=1e-10)


def test_bad_factors_are_refused():
    h1, g4, _ = _n2()
    with pytest.raises(ValueError, match="cderi must be"):
        pair_factor(np.zeros((3, 5)), 6)
    with pytest.raises(ValueError, match="pass eri=None"):
        GUGASolver(cderi=np.zeros((2, 21))).kernel(h1, g4, 6, (3, 3))
    with pytest.raises(ValueError, match="no cderi"):
        GUGASolver().kernel(h1, None, 6, (3, 3))
    with pytest.raises(ValueError, match="factors must be"):
        Engine(GUGASolver()._engine(6, (3, 3)).drt).contract(
            np.ones(175), (np.zeros((21, 2)), np.zeros((3, 21)))
        )


def test_wfnsym_is_refused_on_the_gpu_before_work():
    h1, g4, _ = _n2()
    orbsym = [0, 0, 0, 0, 0, 0]
    with pytest.raises(ValueError, match="CPU only"):
        GUGASolver(device="cuda", orbsym=orbsym, wfnsym=0).kernel(h1, g4, 6, (3, 3))
