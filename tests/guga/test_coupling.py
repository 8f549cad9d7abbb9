"""One-body coupling coefficients <m|E_pq|n> of the loop search against an independent
computation: the CSFs expanded in determinants and E_pq = sum_sigma a+_p,sigma a_q,sigma applied
with PySCF's creation and annihilation operators, for every (p, q) and several spins; and the
commutation relations of the unitary group generators."""

from __future__ import annotations

import numpy as np
import pytest

from cuscikit.guga import DRT

pytest.importorskip("pyscf")
from pyscf.fci import addons  # noqa: E402


def _apply_e(ci, norb, nelec, p, q):
    na, nb = nelec
    out = np.zeros_like(ci)
    if na:
        out = out + addons.cre_a(addons.des_a(ci, norb, (na, nb), q), norb, (na - 1, nb), p)
    if nb:
        out = out + addons.cre_b(addons.des_b(ci, norb, (na, nb), q), norb, (na, nb - 1), p)
    return out


def _generators(drt):
    """E[p, q] as dense (n_csf, n_csf) matrices from the compiled lists, E[p, q][m, n]."""
    n = drt.norb
    off, bra, code, w = drt.core.lists(0, drt.n_csf)
    E = np.zeros((n, n, drt.n_csf, drt.n_csf))
    for k in range(drt.n_csf):
        for e in range(off[k], off[k + 1]):
            p, q = divmod(int(code[e]), n)
            E[p, q, bra[e], k] += w[e]
    occ = np.array([0, 1, 1, 2])[drt.steps()]
    for r in range(n):
        E[r, r] = np.diag(occ[:, r])
    return E


CASES = [(4, 4, 0, 0), (4, 4, 2, 2), (5, 5, 1, 1), (5, 5, 3, -1), (5, 4, 2, 0), (6, 6, 2, 2)]


@pytest.mark.parametrize("norb,nelec,twos,twom", CASES)
def test_coupling_coefficients_match_determinant_expansion(norb, nelec, twos, twom):
    drt = DRT(norb, nelec, twos)
    X, ne = drt.csf_to_dets(twom)
    S = X.reshape(len(X), -1)
    E = _generators(drt)
    n_nonzero = 0
    for p in range(norb):
        for q in range(norb):
            ex = np.stack([_apply_e(x, norb, ne, p, q).reshape(-1) for x in X])
            ref = S @ ex.T  # ref[m, n] = <m|E_pq|n>
            np.testing.assert_allclose(E[p, q], ref, atol=1e-12, err_msg=f"E_{p}{q}")
            n_nonzero += int((np.abs(ref) > 1e-12).sum())
    assert n_nonzero > drt.n_csf * norb  # the comparison is not among zeros


@pytest.mark.parametrize("norb,nelec,twos", [(5, 5, 1), (5, 4, 2), (4, 4, 0)])
def test_generators_obey_unitary_group_commutators(norb, nelec, twos):
    E = _generators(DRT(norb, nelec, twos))
    for p in range(norb):
        for q in range(norb):
            for r in range(norb):
                for s in range(norb):
                    lhs = E[p, q] @ E[r, s] - E[r, s] @ E[p, q]
                    rhs = (q == r) * E[p, s] - (p == s) * E[r, q]
                    np.testing.assert_allclose(lhs, rhs, atol=1e-12)


def test_counts_agree_with_lists_and_blocks():
    drt = DRT(6, 6, 2)
    off, bra, code, w = drt.core.lists(0, drt.n_csf)
    counts = drt.core.counts(0, drt.n_csf)
    np.testing.assert_array_equal(np.diff(off), counts)
    # a block in the middle gives the same rows
    o2, b2, c2, w2 = drt.core.lists(50, 40)
    np.testing.assert_array_equal(b2, bra[off[50] : off[90]])
    np.testing.assert_array_equal(c2, code[off[50] : off[90]])
    np.testing.assert_array_equal(w2, w[off[50] : off[90]])
