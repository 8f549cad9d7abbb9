"""`GUGASolver` as PySCF's fcisolver: CASCI, CASSCF (mc1step) and state-averaged CASSCF give
PySCF's own energies."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from cuscikit.guga import GUGASolver

pytest.importorskip("pyscf")
from pyscf import fci, gto, mcscf, scf  # noqa: E402


@functools.cache
def _mf(name):
    if name == "H2O":
        mol = gto.M(
            atom="O 0 0 0.1173; H 0 0.7572 -0.4692; H 0 -0.7572 -0.4692",
            basis="sto-3g",
            verbose=0,
        )
        return scf.RHF(mol).run()
    mol = gto.M(atom="O 0 0 0; O 0 0 1.2075", basis="sto-3g", spin=2, verbose=0)
    return scf.ROHF(mol).run()


def _singlet(solver):
    return fci.addons.fix_spin_(solver, shift=1.0, ss=0)


def test_casci_singlet_and_open_shell():
    mf = _mf("H2O")
    ref = mcscf.CASCI(mf, 4, 4)
    ref.fcisolver = _singlet(ref.fcisolver)
    ours = mcscf.CASCI(mf, 4, 4)
    ours.fcisolver = GUGASolver(mf.mol)
    assert ours.kernel()[0] == pytest.approx(ref.kernel()[0], abs=1e-8)
    mf = _mf("O2")
    ref = mcscf.CASCI(mf, 6, (5, 3))
    ref.fcisolver = fci.addons.fix_spin_(ref.fcisolver, shift=1.0, ss=2)
    ours = mcscf.CASCI(mf, 6, (5, 3))
    ours.fcisolver = GUGASolver(mf.mol)
    assert ours.kernel()[0] == pytest.approx(ref.kernel()[0], abs=1e-8)
    np.testing.assert_allclose(ours.fcisolver.make_rdm1(ours.ci, 6, (5, 3)).trace(), 8)


@pytest.mark.slow
def test_casscf_matches_pyscf():
    mf = _mf("H2O")
    ref = mcscf.CASSCF(mf, 4, 4)
    ref.conv_tol = 1e-11
    ref.fcisolver = _singlet(ref.fcisolver)
    ours = mcscf.CASSCF(mf, 4, 4)
    ours.conv_tol = 1e-11
    ours.fcisolver = GUGASolver(mf.mol)
    e = ours.kernel()[0]
    assert ours.converged
    assert e == pytest.approx(ref.kernel()[0], abs=1e-8)


@pytest.mark.slow
def test_state_averaged_casscf_matches_pyscf():
    mf = _mf("H2O")
    ref = mcscf.CASSCF(mf, 4, 4)
    ref.fcisolver = _singlet(ref.fcisolver)
    ref = ref.state_average_([0.5, 0.5])
    ref.conv_tol = 1e-11
    ours = mcscf.CASSCF(mf, 4, 4)
    ours.fcisolver = GUGASolver(mf.mol)
    ours = ours.state_average_([0.5, 0.5])
    ours.conv_tol = 1e-11
    e = ours.kernel()[0]
    assert e == pytest.approx(ref.kernel()[0], abs=1e-8)
    np.testing.assert_allclose(ours.e_states, ref.e_states, atol=1e-7)


def test_fix_spin_is_harmless_and_a_wrong_spin_is_refused():
    mf = _mf("H2O")
    plain = mcscf.CASCI(mf, 4, 4)
    plain.fcisolver = GUGASolver(mf.mol)
    fixed = mcscf.CASCI(mf, 4, 4)
    fixed.fcisolver = fci.addons.fix_spin_(GUGASolver(mf.mol), ss=0)
    assert fixed.kernel()[0] == pytest.approx(plain.kernel()[0], abs=1e-10)
    wrong = mcscf.CASCI(mf, 4, 4)
    wrong.fcisolver = fci.addons.fix_spin_(GUGASolver(mf.mol), ss=2)
    with pytest.raises(ValueError, match="S\\(S\\+1\\)"):
        wrong.kernel()
    ci = plain.ci
    top = GUGASolver().large_ci(ci, 4, (2, 2), tol=0.1)
    assert top and abs(top[0][0]) > 0.9 and top[0][1] == "2200"


def test_wfnsym_selects_the_irrep_as_pyscf_symmetric_casci():
    mol = gto.M(atom="N 0 0 0; N 0 0 1.098", basis="6-31g", symmetry="D2h", verbose=0)
    mf = scf.RHF(mol).run()
    for wfnsym in (None, "B1u"):
        ref = mcscf.CASCI(mf, 6, 6)  # singlets of one irrep (B1u: spin0 alone finds a triplet)
        ref.fcisolver = fci.addons.fix_spin_(fci.direct_spin1_symm.FCI(mol), ss=0)
        ref.fcisolver.wfnsym = wfnsym
        ref.fcisolver.conv_tol = 1e-12
        ours = mcscf.CASCI(mf, 6, 6)
        ours.fcisolver = GUGASolver(mol, wfnsym=wfnsym, conv_tol=1e-12)
        e_ref, e = ref.kernel()[0], ours.kernel()[0]
        assert e == pytest.approx(e_ref, abs=1e-8)
        assert ours.fcisolver.orbsym is not None  # set by PySCF's casci_symm
    assert e > mf.e_tot  # the B1u singlet is an excited state


def test_wfnsym_needs_orbsym_and_a_populated_irrep():
    h1 = np.diag([-1.0, -0.5, 0.5, 1.0])
    eri = np.zeros((4, 4, 4, 4))
    with pytest.raises(ValueError, match="orbsym is not"):
        GUGASolver(wfnsym=1).kernel(h1, eri, 4, (2, 2))
    with pytest.raises(ValueError, match="no CSF"):  # all orbitals Ag: only Ag states
        GUGASolver(wfnsym=1, orbsym=[0, 0, 0, 0]).kernel(h1, eri, 4, (2, 2))
    e, c = GUGASolver(wfnsym=1, orbsym=[0, 1, 0, 0]).kernel(h1, eri, 4, (2, 2))
    assert e == pytest.approx(2 * -1.0 - 0.5 + 0.5)  # 0^2 1^1 2^1: orbital 1 open
    assert GUGASolver().kernel(h1, eri, 4, (2, 2))[0] == pytest.approx(-3.0)  # 0^2 1^2
