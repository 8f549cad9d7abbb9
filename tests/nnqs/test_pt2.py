"""The Epstein-Nesbet PT2 correction of the Runner against a direct evaluation with the dense
Hamiltonian of the whole determinant space."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from cuscikit import Ansatz, Molecule, Runner, SCISpace  # noqa: E402


def _direct_pt2(mol, ansatz, S: np.ndarray) -> tuple[float, float]:
    """(E_var, E_PT2) of ansatz's psi on S: sum over a outside S of |(H psi)_a|^2/(E - H_aa)."""
    full = SCISpace.full(mol)
    F = full.configs
    H = full.hamiltonian.restricted(F, complete_sector=True).toarray()
    pos = full.index(S)
    assert (pos >= 0).all()
    with torch.no_grad():
        psi = torch.exp(ansatz.log_psi(S).to(torch.complex128)).numpy()
    psi = psi / np.linalg.norm(psi)
    e_var = float(np.real(psi.conj() @ H[np.ix_(pos, pos)] @ psi))
    outside = np.setdiff1d(np.arange(len(F)), pos)
    v = H[np.ix_(outside, pos)] @ psi
    return e_var, float(np.sum(np.abs(v) ** 2 / (e_var - np.diag(H)[outside])))


@pytest.mark.parametrize(
    "name, steps, batch", [("LiH", 2, 16384), ("H2O", 3, 16384), ("H2O", 3, 7)]
)
def test_pt2_equals_the_direct_evaluation(name, steps, batch):
    mol = Molecule.load(name)
    ansatz = Ansatz.for_molecule(mol, seed=1, dtype=torch.float64)
    r = Runner(mol, ansatz, topk=12, seed=1, inner_steps=0, batch_size=batch)
    for _ in range(steps):
        r.step()
    S = r.space.configs.copy()
    e_var, e_pt2 = _direct_pt2(mol, ansatz, S)  # the weights the next step starts from
    row = r.step()
    assert abs(row["e_variational"] - e_var) < 1e-10
    assert abs(row["e_pt2"] - e_pt2) < 1e-10 and row["e_pt2"] != 0.0
    assert abs(row["e_tot_pt2"] - (e_var + e_pt2)) < 1e-10


def test_pt2_is_zero_when_s_is_the_whole_space_and_can_be_switched_off():
    mol = Molecule.load("LiH")
    ansatz = Ansatz.for_molecule(mol, seed=0, dtype=torch.float64)
    r = Runner(mol, ansatz, SCISpace.full(mol), topk=4, inner_steps=0)
    assert r.step()["e_pt2"] == 0.0
    r = Runner(mol, Ansatz.for_molecule(mol, seed=0), topk=4, pt2=False)
    assert np.isnan(r.step()["e_pt2"])
