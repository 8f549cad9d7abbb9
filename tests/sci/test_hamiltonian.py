"""Slater-Condon matrix elements and coupled sets against PySCF and brute-force enumeration."""

import numpy as np
import pytest

from cuscikit.sci import configs as C
from cuscikit.sci.hamiltonian import Hamiltonian
from cuscikit.sci.slow import (
    coupled_configurations_numpy,
    coupled_configurations_slow,
    diagonal_slow,
)
from tests.conftest import SYSTEMS, pyscf_integrals, random_integrals


def pyscf_hamiltonian_in_our_basis(h1, eri, ecore, norb, nelec):
    """PySCF's dense FCI Hamiltonian, rows mapped to our interleaved configurations.

    PySCF orders creation operators all-alpha-then-all-beta; ours interleave them. Reordering a
    determinant costs (-1)^{#(p in alpha, q in beta) with p > q}.
    """
    from pyscf import ao2mo, fci

    na, nb = nelec
    sa = fci.cistring.make_strings(range(norb), na)
    sb = fci.cistring.make_strings(range(norb), nb)
    ndet = len(sa) * len(sb)
    # pspace with every determinant is PySCF's exact dense Hamiltonian (ecore excluded)
    addr, h0 = fci.direct_spin1.pspace(h1, ao2mo.restore(1, eri, norb), norb, nelec, np=ndet)
    hmat = np.empty((ndet, ndet))
    hmat[np.ix_(addr, addr)] = h0
    hmat += ecore * np.eye(ndet)
    alpha = [[p for p in range(norb) if s >> p & 1] for s in sa]
    beta = [[p for p in range(norb) if s >> p & 1] for s in sb]
    occ_a = [a for a in alpha for _ in beta]
    occ_b = [b for _ in alpha for b in beta]
    x = C.from_occupations(occ_a, occ_b, norb)
    pairs = zip(occ_a, occ_b, strict=True)
    sign = np.array([(-1) ** sum(p > q for p in a for q in b) for a, b in pairs])
    return x, hmat * np.outer(sign, sign)


_CACHE = {}


def reference(case):
    name, h1, eri, ecore, norb, nelec = case
    if name not in _CACHE:
        _CACHE[name] = pyscf_hamiltonian_in_our_basis(h1, eri, ecore, norb, nelec)
    return _CACHE[name]


def systems():
    out = []
    for name in ("LiH", "H2O"):
        h1, eri, ecore, norb, nelec = pyscf_integrals(SYSTEMS[name])
        out.append((name, h1, eri, ecore, norb, nelec))
    # open shell, non-molecular integrals
    h1, g, ecore = random_integrals(6, seed=3)
    out.append(("random(4,2)", h1, g, ecore, 6, (4, 2)))
    # triplet CH2 with ROHF orbitals
    h1, eri, ecore, norb, nelec = pyscf_integrals("C 0 0 0; H 0 0.93 0.6; H 0 -0.93 0.6", spin=2)
    out.append(("CH2 triplet", h1, eri, ecore, norb, nelec))
    return out


@pytest.mark.parametrize("case", systems(), ids=lambda c: c[0])
def test_matrix_elements_match_pyscf(case):
    _, h1, eri, ecore, norb, nelec = case
    x, href = reference(case)
    H = Hamiltonian(h1, eri, ecore, nelec=nelec)
    n = len(x)
    bra = np.repeat(x, n, axis=0)
    ket = np.tile(x, (n, 1))
    ours = H.matrix_elements(bra, ket).reshape(n, n)
    np.testing.assert_allclose(ours, href, atol=1e-11, rtol=0)
    np.testing.assert_allclose(H.diagonal(x), np.diag(href), atol=1e-11, rtol=0)
    # the restricted matrix in the full space is the same matrix
    order = np.lexsort(x.T)
    dense = H.restricted(x[order]).toarray()
    np.testing.assert_allclose(dense, href[np.ix_(order, order)], atol=1e-11, rtol=0)


@pytest.mark.parametrize("case", systems(), ids=lambda c: c[0])
def test_coupled_sets_match_brute_force(case):
    _, h1, eri, ecore, norb, nelec = case
    x, href = reference(case)
    eps = 1e-10
    H = Hamiltonian(h1, eri, ecore, nelec=nelec, eps=eps)
    rng = np.random.default_rng(0)
    src = rng.choice(len(x), size=min(25, len(x)), replace=False)
    cs = H.coupled(x[src])
    for k, s in enumerate(src):
        col = href[:, s].copy()
        col[s] = 0.0
        expect = {int(x[r, 0]): col[r] for r in np.flatnonzero(np.abs(col) > eps)}
        mine = cs.source == k
        got = dict(zip(cs.configs[mine, 0].tolist(), cs.values[mine].tolist(), strict=True))
        assert len(got) == mine.sum(), "a coupled configuration appears twice"
        assert got.keys() == expect.keys()
        for key, v in got.items():
            assert abs(v - expect[key]) < 1e-11
    np.testing.assert_array_equal(
        H.coupled_counts(x[src]), np.bincount(cs.source, minlength=len(src))
    )


def _as_sorted_triples(src, cfg, val):
    order = np.lexsort((*cfg.T[::-1], src))
    return src[order], cfg[order], val[order]


@pytest.mark.parametrize("norb,nelec,words", [(10, (7, 7), 1), (40, (5, 4), 2)])
def test_slow_twins_match_compiled(norb, nelec, words):
    h1, g, ecore = random_integrals(norb, seed=norb)
    H = Hamiltonian(h1, g, ecore, nelec=nelec)
    assert H.nwords == words
    rng = np.random.default_rng(5)
    occ_a = [sorted(rng.choice(norb, nelec[0], replace=False)) for _ in range(4)]
    occ_b = [sorted(rng.choice(norb, nelec[1], replace=False)) for _ in range(4)]
    x = C.from_occupations(occ_a, occ_b, norb)
    cs = H.coupled(x)
    a = _as_sorted_triples(cs.source, cs.configs, cs.values)
    for twin in (coupled_configurations_slow, coupled_configurations_numpy):
        b = _as_sorted_triples(*twin(h1, g, ecore, x, norb, eps=H.eps))
        np.testing.assert_array_equal(a[0], b[0])
        np.testing.assert_array_equal(a[1], b[1])
        np.testing.assert_allclose(a[2], b[2], atol=1e-12, rtol=1e-12)
    np.testing.assert_allclose(H.diagonal(x), diagonal_slow(h1, g, ecore, x, norb), atol=1e-11)
    # matrix_elements agrees with the coupled values pair by pair
    np.testing.assert_allclose(
        H.matrix_elements(cs.configs, x[cs.source]), cs.values, atol=1e-12, rtol=1e-12
    )


def test_unscreened_count_is_all_singles_and_doubles():
    norb, (na, nb) = 12, (4, 3)
    h1, g, ecore = random_integrals(norb, seed=1)
    H = Hamiltonian(h1, g, ecore, nelec=(na, nb), eps=-1.0)
    va, vb = norb - na, norb - nb
    singles = na * va + nb * vb
    doubles = na * (na - 1) // 2 * va * (va - 1) // 2 + nb * (nb - 1) // 2 * vb * (vb - 1) // 2
    doubles += na * va * nb * vb
    assert H.coupled_counts(C.hf_configuration(norb, (na, nb)))[0] == singles + doubles


def test_screening_threshold_validation():
    h1, g, ecore = random_integrals(4)
    H = Hamiltonian(h1, g, ecore, nelec=(2, 2), eps=1e-8)
    x = C.hf_configuration(4, (2, 2))
    with pytest.raises(ValueError, match="below the table threshold"):
        H.coupled(x, eps=1e-12)
    assert len(H.coupled(x, eps=1e-3)) <= len(H.coupled(x))
    with pytest.raises(ValueError, match="shape"):
        H.diagonal(np.zeros((1, 2), np.uint64))
    with pytest.raises(ValueError, match="eri does not match"):
        Hamiltonian(h1, np.zeros((3, 3, 3, 3)), 0.0)


@pytest.mark.parametrize("eps", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_screening_threshold_is_refused(eps):
    """NaN compares false with everything: taken as given it would switch screening off."""
    from cuscikit import Molecule
    from cuscikit.sci import SCISpace

    mol = Molecule.load("LiH")
    with pytest.raises(ValueError, match="eps must be a finite number"):
        SCISpace.hf(mol, eps=eps)
    H = SCISpace.hf(mol).hamiltonian
    with pytest.raises(ValueError, match="eps must be a finite number"):
        H.coupled(SCISpace.hf(mol).configs, eps=eps)
