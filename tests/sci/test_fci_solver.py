"""`cuscikit.sci.FCI` against pyscf.fci.direct_spin1: energies of several roots, density
matrices, <S^2>, and as the fcisolver of a PySCF CASCI."""

from __future__ import annotations

import numpy as np
import pytest

from cuscikit import Molecule
from cuscikit.chem.integrals import restore_eri
from cuscikit.sci import FCI
from tests.conftest import SYSTEMS, pyscf_integrals, random_integrals

pyscf = pytest.importorskip("pyscf")
from pyscf import fci as pyscf_fci  # noqa: E402


def _reference(h1, eri, norb, nelec, ecore, nroots):
    """PySCF's solver, its eigenpairs (one more root than asked, to see degeneracies with the
    last one) and the tolerance its vectors allow: exact (dense H in PySCF's own basis, from
    its pspace) up to 5000 determinants, Davidson beyond."""
    from math import comb

    ref = pyscf_fci.direct_spin1.FCI()
    g = restore_eri(eri, norb, 1)
    na, nb = nelec
    n_det = comb(norb, na) * comb(norb, nb)
    if n_det <= 5000:
        hdiag = ref.make_hdiag(h1, g, norb, nelec)
        addr, hpp = pyscf_fci.direct_spin1.pspace(h1, g, norb, nelec, hdiag, np=n_det)
        w, v = np.linalg.eigh(hpp)
        shape = (comb(norb, na), comb(norb, nb))
        vecs = []
        for k in range(nroots + 1):
            c = np.zeros(n_det)
            c[addr] = v[:, k]
            vecs.append(c.reshape(shape))
        return ref, w[: nroots + 1] + ecore, vecs, 1e-9
    # Residuals well below the tolerance of the comparison on both sides (at PySCF's default,
    # sqrt(conv_tol) = 1e-6, the density matrices of N2 differ by 1.5e-7 now and then).
    ref.conv_tol, ref.conv_tol_residual, ref.max_cycle = 1e-12, 1e-9, 200
    e, c = ref.kernel(h1, g, norb, nelec, ecore=ecore, nroots=nroots + 1)
    return ref, np.atleast_1d(e), c, 1e-7


@pytest.mark.parametrize(
    "name, spin, nroots",
    [("LiH", 0, 3), ("H2O", 0, 2), ("N2", 0, 1), ("H2O", 2, 2)],
)
def test_energies_rdms_and_spin_match_direct_spin1(name, spin, nroots):
    h1, eri, ecore, norb, nelec = pyscf_integrals(SYSTEMS[name], spin=spin)
    solver = FCI(conv_tol=1e-13, conv_tol_residual=1e-9)
    e, ci = solver.kernel(h1, eri, norb, nelec, ecore=ecore, nroots=nroots)
    ref, e_all, c_ref, tol = _reference(h1, eri, norb, nelec, ecore, nroots)
    e_ref, c_ref = e_all[:nroots], c_ref[:nroots]
    np.testing.assert_allclose(np.atleast_1d(e), e_ref, rtol=0, atol=1e-9)
    assert solver.e_tot is e and solver.converged
    ours = [ci] if nroots == 1 else ci
    for k, (c, cr) in enumerate(zip(ours, c_ref, strict=True)):
        if np.min(np.abs(np.delete(e_all, k) - e_all[k]), initial=1.0) < 1e-6:
            continue  # a degenerate root: its vector is any mix of the degenerate ones
        dm1, dm2 = solver.make_rdm12(c, norb, nelec)
        r1, r2 = ref.make_rdm12(cr, norb, nelec)
        np.testing.assert_allclose(dm1, r1, atol=tol)
        np.testing.assert_allclose(dm2, r2, atol=tol)
        np.testing.assert_allclose(solver.make_rdm1(c, norb, nelec), r1, atol=tol)
        for a, b in zip(
            solver.make_rdm1s(c, norb, nelec), ref.make_rdm1s(cr, norb, nelec), strict=True
        ):
            np.testing.assert_allclose(a, b, atol=tol)
        ss, mult = solver.spin_square(c, norb, nelec)
        ss_ref, mult_ref = ref.spin_square(cr, norb, nelec)
        assert abs(ss - ss_ref) < tol and abs(mult - mult_ref) < tol
        # the energy from the density matrices is the eigenvalue
        assert abs(solver.energy(h1, eri, c, norb, nelec, ecore) - np.atleast_1d(e)[k]) < 1e-9


def test_random_hamiltonian_and_a_guess():
    h1, g, ecore = random_integrals(6, seed=3)
    solver = FCI()
    e, ci = solver.kernel(h1, g, 6, (3, 2), ecore=ecore)
    _, e_ref, _, _ = _reference(h1, g, 6, (3, 2), ecore, 1)
    assert abs(e - e_ref[0]) < 1e-9
    e2, _ = solver.kernel(h1, g, 6, (3, 2), ci0=ci, ecore=ecore)  # from its own solution
    assert abs(e2 - e) < 1e-10


def test_as_the_fcisolver_of_pyscf_casci():
    from pyscf import gto, mcscf, scf

    mol = gto.M(atom=SYSTEMS["N2"], basis="sto-3g", verbose=0)
    mf = scf.RHF(mol).run(conv_tol=1e-12)
    ref = mcscf.CASCI(mf, 6, 6).run()
    ours = mcscf.CASCI(mf, 6, 6)
    ours.fcisolver = FCI()
    ours.run()
    assert abs(ours.e_tot - ref.e_tot) < 1e-8
    np.testing.assert_allclose(ours.make_rdm1(), ref.make_rdm1(), atol=1e-7)


def test_solver_shape_and_clear_errors():
    mol = Molecule.load("LiH")
    solver = FCI(mol)
    solver.conv_tl = 1e-9  # misspelt option
    with pytest.raises(AttributeError, match="did you mean 'conv_tol'"):
        solver.kernel()
    solver = FCI(mol)
    assert abs(solver.run().e_tot - mol.metadata["reference"]["energy"]) < 1e-9
    with pytest.raises(ValueError, match="nroots"):
        FCI().kernel(mol.h1e, mol.eri, mol.norb, mol.nelec, nroots=10**6)
    with pytest.raises(ValueError, match="symmetric"):
        FCI().kernel(mol.h1e + np.triu(np.ones_like(mol.h1e), 1), mol.eri, mol.norb, mol.nelec)
    with pytest.raises(MemoryError, match="GiB"):
        FCI(max_memory=10**5).kernel(mol.h1e, mol.eri, mol.norb, mol.nelec)
    with pytest.raises(AttributeError, match="no option 'tol'"):
        FCI(tol=1e-9)
