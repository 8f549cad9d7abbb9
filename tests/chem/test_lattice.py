"""Lattice models: Hubbard integrals, the mean-field working basis, and exact energies that do
not depend on the basis."""

from __future__ import annotations

import numpy as np
import pytest

from cuscikit import FCI, Molecule
from cuscikit.chem.lattice import hubbard_integrals, lattice_bonds, rhf_orbitals, rotate_integrals


def test_bonds_of_chains_and_lattices():
    assert lattice_bonds(4) == [(0, 1), (1, 2), (2, 3)]
    assert lattice_bonds(4, pbc=True) == [(0, 1), (0, 3), (1, 2), (2, 3)]
    assert lattice_bonds(2, pbc=True) == [(0, 1)]  # one bond, not two
    assert len(lattice_bonds((3, 4))) == 3 * 3 + 2 * 4
    assert len(lattice_bonds((3, 4), pbc=True)) == 2 * 12
    assert len(lattice_bonds((3, 4), pbc=(True, False))) == 12 + 9
    with pytest.raises(ValueError, match="lattice shape"):
        lattice_bonds((2, 2, 2))
    with pytest.raises(ValueError, match="one flag per axis"):
        lattice_bonds((2, 3), pbc=(True,))


def test_non_interacting_chain_is_the_tight_binding_band():
    """U = 0: the ground state fills the lowest -2t cos(k) levels."""
    n = 6
    m = Molecule.hubbard(n, U=0.0, pbc=True, basis="site")
    k = 2 * np.pi * np.arange(n) / n
    levels = np.sort(-2 * np.cos(k))
    assert abs(FCI(m).run().e_tot - 2 * levels[:3].sum()) < 1e-10


@pytest.mark.parametrize(
    "shape, pbc, nelec",
    [
        (6, False, None),
        (6, True, None),
        ((2, 3), True, None),
        (5, False, (3, 2)),
        ((2, 3), False, (2, 2)),
    ],
)
@pytest.mark.parametrize("U", [1.0, 4.0, 8.0])
def test_exact_energies_do_not_depend_on_the_basis(shape, pbc, nelec, U):
    site = Molecule.hubbard(shape, U, pbc=pbc, nelec=nelec, basis="site")
    rhf = Molecule.hubbard(shape, U, pbc=pbc, nelec=nelec)
    assert rhf.metadata["basis"] == "rhf" and site.metadata["basis"] == "site"
    C = np.array(rhf.metadata["orbitals"])
    np.testing.assert_allclose(C.T @ C, np.eye(len(C)), atol=1e-10)
    e_site = FCI(site, nroots=2).run().e_tot
    e_rhf = FCI(rhf, nroots=2).run().e_tot
    np.testing.assert_allclose(e_rhf, e_site, rtol=0, atol=1e-9)


def test_the_mean_field_basis_puts_weight_on_the_reference():
    """The aufbau determinant carries far more weight in the mean-field orbitals (8-site chain,
    U = 2: 0.81 against 1e-14 on the sites)."""
    weights = {}
    for basis in ("site", "rhf"):
        m = Molecule.hubbard(8, U=2.0, basis=basis)
        s = FCI(m)
        _, ci = s.kernel()
        from cuscikit.sci import SCISpace

        full = SCISpace.full(m)
        hf = SCISpace.hf(m).configs
        weights[basis] = float(ci[full.index(hf)[0]] ** 2)
    assert weights["rhf"] > 0.5 and weights["site"] < 1e-6


def test_rotation_checks_orthonormality_and_rhf_is_a_mean_field():
    h1, eri = hubbard_integrals(4, U=2.0)
    with pytest.raises(ValueError, match="orthonormal"):
        rotate_integrals(h1, eri, np.ones((4, 4)))
    C = rhf_orbitals(h1, eri, 4)
    h, g = rotate_integrals(h1, eri, C)
    D = np.diag([2.0, 2.0, 0.0, 0.0])
    F = h + np.einsum("pqrs,rs->pq", g, D) - 0.5 * np.einsum("prqs,rs->pq", g, D)
    np.testing.assert_allclose(F - np.diag(np.diag(F)), 0.0, atol=1e-7)  # diagonal Fock


def test_bad_models():
    with pytest.raises(ValueError, match="finite"):
        hubbard_integrals(4, U=float("nan"))
    with pytest.raises(ValueError, match="basis"):
        Molecule.hubbard(4, U=1.0, basis="nao")
    with pytest.raises(ValueError):
        Molecule.hubbard(4, U=1.0, nelec=(5, 0))


def test_a_lattice_runs_through_the_fcidump_writer_and_the_nnqs_runner(tmp_path):
    torch = pytest.importorskip("torch")
    from cuscikit.nnqs import Ansatz, Runner

    m = Molecule.hubbard(6, U=4.0, pbc=True)
    path = tmp_path / "h6.fcidump"
    m.to_fcidump(path)
    back = Molecule.from_fcidump(path)
    assert abs(FCI(back).run().e_tot - FCI(m).run().e_tot) < 1e-10
    r = Runner(m, Ansatz.for_molecule(m, seed=0, dtype=torch.float64), topk=16, seed=0)
    row = r.step()
    assert np.isfinite(row["e_variational"]) and np.isfinite(row["e_pt2"])


@pytest.mark.parametrize("shape, pbc", [(6, True), (8, False), (10, False), ((4, 3), False)])
@pytest.mark.parametrize("U", [4.0, 8.0, 16.0])
def test_rhf_basis_is_the_uniform_mean_field_at_strong_coupling(shape, pbc, U):
    """Half-filled bipartite lattices: the restricted mean field has density 1 on every site,
    so the Hartree-Fock determinant of the working basis has E = 2 sum_{i<L/2} eps_i + U L / 4
    (eps: the hopping matrix's levels). A damped iteration from a perturbed start used to
    settle on a density wave tens of Hartree higher from U = 4 on."""
    from cuscikit.sci import SCISpace

    h1, _ = hubbard_integrals(shape, U=U, pbc=pbc)
    L = h1.shape[0]
    expect = 2.0 * np.linalg.eigvalsh(h1)[: L // 2].sum() + U * L / 4
    m = Molecule.hubbard(shape, U=U, pbc=pbc)
    hf = SCISpace.hf(m)
    assert abs(float(hf.hamiltonian.diagonal(hf.configs)[0]) - expect) < 1e-9


def test_rhf_of_an_open_shell_ring_converges():
    h1, eri = hubbard_integrals(12, U=4.0, pbc=True)  # a degenerate pair at the Fermi level
    C = rhf_orbitals(h1, eri, 12)
    np.testing.assert_allclose(C.T @ C, np.eye(12), atol=1e-10)
    # the shell shared equally leaves the density uniform, the Fock matrix h1 + U/2: C diagonalises
    # the hopping
    h = C.T @ h1 @ C
    np.testing.assert_allclose(h - np.diag(np.diag(h)), 0.0, atol=1e-8)


def test_shell_fillings_list_the_ways_a_partly_filled_shell_can_be_filled():
    from cuscikit.chem.lattice import shell_fillings

    e = np.array([-2.0, 0.0, 0.0, 0.0, 2.0])
    assert shell_fillings(e, (1, 1)) == [([0], [0])]  # below the shell: one filling
    got = shell_fillings(e, (2, 1))
    assert got == [([0, 1], [0]), ([0, 2], [0]), ([0, 3], [0])]  # aufbau first
    assert len(shell_fillings(e, (3, 2))) == 3 * 3 and len(shell_fillings(e, (4, 2))) == 3
    assert len(shell_fillings(e, (3, 3), limit=4)) == 4
    assert shell_fillings(e, (0, 0)) == [([], [])]


@pytest.mark.parametrize("n", [4, 8, 12])
def test_rings_of_4n_sites_start_from_a_determinant_the_ground_state_holds(n):
    """At half filling a ring of 4n sites has a degenerate pair of levels at the Fermi level
    holding one electron of each spin. Its aufbau determinant (both in the same orbital of the
    pair) has no weight in the exact ground state (zero by symmetry); the start the lattice names
    is the filling of the pair with the lowest diagonal energy (the two electrons in different
    orbitals), which holds a large weight. Checked by FCI for 4 and 8 sites; for 12 by the
    diagonal energies alone."""
    from cuscikit.chem.lattice import shell_fillings
    from cuscikit.sci import SCISpace
    from cuscikit.sci.configs import from_occupations, hf_configuration, start_configuration

    m = Molecule.hubbard(n, U=4.0, pbc=True)
    start = start_configuration(m)
    aufbau = hf_configuration(n, (n // 2, n // 2))
    assert m.metadata["start"]["alpha"] == list(range(n // 2))
    assert m.metadata["start"]["beta"] == [*range(n // 2 - 1), n // 2]
    levels = np.linalg.eigvalsh(hubbard_integrals(n, U=0.0, pbc=True)[0])
    fillings = shell_fillings(levels, (n // 2, n // 2))
    assert len(fillings) == 4
    H = SCISpace.start(m).hamiltonian
    diag = H.diagonal(from_occupations([a for a, _ in fillings], [b for _, b in fillings], n))
    assert float(H.diagonal(start)[0]) == pytest.approx(diag.min(), abs=1e-12)
    assert float(H.diagonal(aufbau)[0]) > diag.min() + 0.1
    assert np.array_equal(SCISpace.start(m).configs, start)
    if n <= 8:
        _, ci = FCI(m).kernel()
        full = SCISpace.full(m)
        w_start, w_aufbau = (float(ci[full.index(c)[0]] ** 2) for c in (start, aufbau))
        assert w_aufbau < 1e-12 and w_start > 0.15, (w_start, w_aufbau)


def test_closed_shells_and_molecules_start_from_the_aufbau_determinant():
    from cuscikit.sci.configs import hf_configuration, start_configuration

    for m in (Molecule.hubbard(6, U=4.0, pbc=True), Molecule.hubbard(10, U=4.0)):
        assert np.array_equal(start_configuration(m), hf_configuration(m.norb, m.nelec))
    assert "start" not in Molecule.hubbard(4, U=4.0, pbc=True, basis="site").metadata
    lih = Molecule.load("LiH")
    assert np.array_equal(start_configuration(lih), hf_configuration(lih.norb, lih.nelec))


def test_a_runner_and_its_ansatz_start_from_the_named_determinant():
    torch = pytest.importorskip("torch")
    from cuscikit.nnqs import Ansatz, Runner
    from cuscikit.sci.configs import start_configuration

    m = Molecule.hubbard(4, U=4.0, pbc=True)
    ansatz = Ansatz.for_molecule(m, seed=0, dtype=torch.float64)
    r = Runner(m, ansatz, seed=0)
    assert np.array_equal(r.space.configs, start_configuration(m))
    x = ansatz.sample(2000, generator=0)
    top = x[0][np.argmax(x[1])]
    assert np.array_equal(top, start_configuration(m)[0])  # the reference bias leans on it


@pytest.mark.parametrize(
    "name, kw",
    [
        ("Hubbard-8-chain-U4", dict(shape=8, U=4.0, pbc=False)),
        ("Hubbard-6-ring-U2.5", dict(shape=6, U=2.5, pbc=True)),
        ("hubbard-3x2-open-u8", dict(shape=(3, 2), U=8.0, pbc=False)),
        ("Hubbard-4x2-pbc-U4-site", dict(shape=(4, 2), U=4.0, pbc=True, basis="site")),
    ],
)
def test_a_lattice_name_loads_the_model_it_names(name, kw):
    m, ref = Molecule.load(name), Molecule.hubbard(**kw)
    assert (m.norb, m.nelec) == (ref.norb, ref.nelec)
    np.testing.assert_array_equal(m.h1e, ref.h1e)
    np.testing.assert_array_equal(m.eri, ref.eri)
    assert m.metadata == ref.metadata
    assert m.metadata["model"]["pbc"] == kw["pbc"]
    assert m.metadata["basis"] == kw.get("basis", "rhf")


def test_aufbau_suffix_drops_the_named_start():
    assert Molecule.load("Hubbard-8-ring-U4").metadata["start"] is not None
    assert "start" not in Molecule.load("Hubbard-8-ring-U4-aufbau").metadata


@pytest.mark.parametrize(
    "name", ["Hubbard-8-U4", "Hubbard-8-chain", "Hubbard-8-chain-U4-pbc", "Hubbard-8-line-U4"]
)
def test_malformed_lattice_names_say_the_grammar(name):
    from cuscikit.chem.lattice import LATTICE_NAMES, lattice_from_name

    with pytest.raises(ValueError, match="not a lattice name") as info:
        Molecule.load(name)
    assert LATTICE_NAMES in str(info.value)
    assert lattice_from_name("N2") is None


def test_the_command_line_takes_lattice_names(capsys):
    import json

    from cuscikit.cli import main

    e_ring = FCI(Molecule.hubbard(6, U=4.0, pbc=True, basis="site")).run().e_tot
    assert main(["fci", "Hubbard-6-ring-U4", "--json"]) == 0
    r = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert abs(r["e_tot"] - e_ring) < 1e-10 and r["n_det"] == 400
    assert r["energy_unit"] == "t"
    assert main(["fci", "Hubbard-6-ring-U4"]) == 0
    assert f"E = {e_ring:.12f} t" in capsys.readouterr().out
    e_patch = FCI(Molecule.hubbard((2, 3), U=4.0, basis="site")).run().e_tot
    assert main(["guga", "Hubbard-2x3-open-U4", "--json"]) == 0
    r = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert abs(r["e_tot"][0] - e_patch) < 1e-10
    assert main(["fci", "Hubbard-6-U4"]) == 2
    assert "not a lattice name" in capsys.readouterr().err


@pytest.mark.parametrize("shape, pbc", [(8, True), (12, True), ((4, 4), True), (6, False)])
def test_rhf_orbitals_do_not_depend_on_the_eigensolver(shape, pbc):
    """Whatever basis of a degenerate shell, and whatever signs, an eigensolver returns, the
    canonical orbitals are the same: random rotations within every shell and random signs
    give back the same matrix; the shells' spans and the mean-field levels are kept."""
    from cuscikit.chem.lattice import canonical_orbitals, rhf_levels

    h1, eri = hubbard_integrals(shape, U=4.0, pbc=pbc)
    n = h1.shape[0]
    e, C = rhf_levels(h1, eri, n)
    F = C @ np.diag(e) @ C.T  # the converged Fock matrix
    rng = np.random.default_rng(0)
    shells = np.split(np.arange(n), np.flatnonzero(np.diff(e) > 1e-8) + 1)
    assert max(map(len, shells)) > 1 or not pbc  # the rings and the torus have shells
    for _ in range(5):
        mixed = C * rng.choice([-1.0, 1.0], size=n)
        for sh in shells:
            Q, _ = np.linalg.qr(rng.normal(size=(len(sh), len(sh))))
            mixed[:, sh] = mixed[:, sh] @ Q
        again = canonical_orbitals(e, mixed)
        np.testing.assert_allclose(again, C, atol=1e-10)
    np.testing.assert_allclose(C.T @ C, np.eye(n), atol=1e-12)
    np.testing.assert_allclose(C.T @ F @ C, np.diag(e), atol=1e-10)
