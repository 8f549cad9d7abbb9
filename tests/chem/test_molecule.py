"""Molecule: from atoms (PySCF), from integrals, validation."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from cuscikit.chem import Molecule, SymmetryWarning, parse_geometry, read_fcidump, restore_eri
from cuscikit.chem.molecule import _bse_basis, _pyscf_knows_basis, aufbau_energy

pyscf = pytest.importorskip("pyscf")
from pyscf import fci, gto, mcscf, scf  # noqa: E402

LIH = "Li 3 0 0; H 2 0 0"
H2O = "O 0 0 0; H 0.2774 0.8929 0.2544; H 0.6068 -0.2383 -0.7169"


@pytest.fixture(scope="module")
def lih() -> Molecule:
    return Molecule(LIH, name="LiH")


def _casci(atom: str, ncas: int, nelecas, spin: int = 0) -> float:
    mol = gto.M(atom=atom, basis="sto-3g", spin=spin, verbose=0)
    mf = (scf.RHF if spin == 0 else scf.ROHF)(mol).run(conv_tol=1e-12)
    mc = mcscf.CASCI(mf, ncas, nelecas)
    mc.fcisolver.conv_tol = 1e-13
    return float(mc.kernel()[0])


def test_lih_matches_pyscf_rhf(lih: Molecule) -> None:
    mf = scf.RHF(gto.M(atom=LIH, basis="sto-3g", verbose=0)).run(conv_tol=1e-12)
    assert abs(lih.e_hf - mf.e_tot) < 1e-9
    assert abs(lih.e_scf - mf.e_tot) < 1e-9
    assert lih.norb == 6 and lih.nelec == (2, 2) and lih.n_determinants == 225
    assert lih.eri.shape == (231,) and lih.h1e.shape == (6, 6)
    assert lih.eri_full() is lih.eri_full()
    assert "LiH" in repr(lih) and "norb=6" in repr(lih)
    assert abs(lih.fci() - (-7.78446028)) < 1e-8
    assert "e_fci" in repr(lih)


def test_to_fcidump_round_trip(lih: Molecule, tmp_path: Path) -> None:
    lih.to_fcidump(tmp_path / "lih.fcidump.gz", tol=0.0)
    m2 = Molecule.from_fcidump(tmp_path / "lih.fcidump.gz")
    np.testing.assert_array_equal(m2.h1e, lih.h1e)
    np.testing.assert_array_equal(m2.eri, lih.eri)
    assert m2.nelec == lih.nelec and m2.e_core == lih.e_core
    assert abs(m2.e_hf - lih.e_hf) < 1e-10
    assert read_fcidump(tmp_path / "lih.fcidump.gz").ms2 == 0


def test_frozen_core_matches_casci() -> None:
    m = Molecule(H2O, frozen_core=True)
    assert m.ncore == 1 and m.norb == 6 and m.nelec == (4, 4)
    assert abs(m.fci() - _casci(H2O, 6, 8)) < 1e-9


def test_cas_matches_casci() -> None:
    atom = "N 0.556 0 0; N -0.556 0 0"
    m = Molecule(atom, cas=(6, 6), frozen_core=2)
    assert m.ncore == 4 and m.norb == 6 and m.nelec == (3, 3)
    assert abs(m.fci() - _casci(atom, 6, 6)) < 1e-9


def test_open_shell_rohf_triplet() -> None:
    atom = "C 0 0 0; H 0 0.9 0.6; H 0 -0.9 0.6"
    m = Molecule(atom, spin=2, name="CH2")
    mf = scf.ROHF(gto.M(atom=atom, basis="sto-3g", spin=2, verbose=0)).run(conv_tol=1e-12)
    assert m.nelec == (5, 3)
    assert abs(m.e_hf - mf.e_tot) < 1e-9
    e_ref = fci.direct_spin1.FCI().kernel(m.h1e, m.eri, m.norb, m.nelec, ecore=m.e_core, nroots=3)
    assert abs(m.fci() - min(e_ref[0])) < 1e-9
    assert abs(m.fci() - _casci(atom, 7, (5, 3), spin=2)) < 1e-9


def test_symmetry_orbsym() -> None:
    m = Molecule("N 0 0 0.556; N 0 0 -0.556", symmetry=True)
    assert m.orbsym is not None and len(m.orbsym) == m.norb
    assert set(m.orbsym) <= set(range(1, 9))


def test_from_integrals_and_aufbau() -> None:
    h = np.diag([-1.0, -0.5, 0.2])
    g = np.zeros((3, 3, 3, 3))
    g[0, 0, 0, 0], g[1, 1, 1, 1] = 0.6, 0.5
    g[0, 0, 1, 1] = g[1, 1, 0, 0] = 0.3
    g[0, 1, 1, 0] = g[1, 0, 0, 1] = g[0, 1, 0, 1] = g[1, 0, 1, 0] = 0.1
    m = Molecule.from_integrals(h, g, 3, e_core=0.25)
    assert m.nelec == (2, 1)
    # alpha 0,1 and beta 0: h = -1 -0.5 -1; J(0a,1a) - K = 0.2; J(0a,0b) = 0.6; J(1a,0b) = 0.3
    assert abs(m.e_hf - (0.25 - 2.5 + 0.2 + 0.6 + 0.3)) < 1e-14
    e = fci.direct_spin1.FCI().kernel(h, g, 3, (2, 1), ecore=0.25, nroots=3)[0]
    assert abs(m.fci() - min(e)) < 1e-12
    assert Molecule.from_integrals(h, g, (1, 1), e_hf=-9.0).e_hf == -9.0


def test_aufbau_matches_pyscf_energy_on_random_integrals() -> None:
    rng = np.random.default_rng(3)
    n = 5
    g = rng.standard_normal((n,) * 4)
    g = g + g.transpose(1, 0, 2, 3)
    g = g + g.transpose(0, 1, 3, 2)
    g = g + g.transpose(2, 3, 0, 1)
    h = rng.standard_normal((n, n))
    h = h + h.T
    na, nb = 3, 2
    ci = np.zeros((10, 10))  # C(5,3), C(5,2): the first string is the aufbau one
    ci[0, 0] = 1.0
    ref = fci.direct_spin1.energy(h, g, ci, n, (na, nb))
    assert abs(aufbau_energy(h, restore_eri(g, n, 8), (na, nb)) - ref) < 1e-11


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((np.eye(3), np.zeros(21), (4, 1)), "does not fit"),
        ((np.eye(3), np.zeros(21), (-1, 1)), "negative"),
        ((np.eye(3), np.zeros(21), -2), "negative"),
        ((np.eye(3), np.zeros(21), "two"), "nelec must be"),
        ((np.eye(129), np.zeros(1), 2), "limit of 128"),
        ((np.eye(3), np.zeros(20), 2), "does not match h1e"),
        ((np.eye(3), np.zeros((2, 2, 2, 2)), 2), "does not match h1e"),
        ((np.eye(3) + np.triu(np.ones((3, 3)), 1), np.zeros(21), 2), "not symmetric"),
        ((np.ones((3, 2)), np.zeros(21), 2), "square"),
        ((np.full((3, 3), np.nan), np.zeros(21), 2), "NaN"),
    ],
)
def test_from_integrals_rejects(args: tuple, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Molecule.from_integrals(*args)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(atom="H 0 0 0; H 0 0 0.74", spin=1), "spin"),
        (dict(atom=LIH, cas=(6, 4)), "cas"),
        (dict(atom=LIH, cas=(3, 4)), "cas"),
        (dict(atom=LIH, cas=(2, 9)), "orbitals"),
        (dict(atom=LIH, frozen_core=-1), "frozen_core"),
        (dict(atom=LIH, frozen_core=3), "frozen_core"),
        (dict(atom="H 0 0 0; H 0 0 0.74", basis="no-such-basis"), "basis"),
    ],
)
def test_molecule_rejects(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Molecule(**kwargs)


def test_too_many_orbitals_rejected_before_scf() -> None:
    atom = "; ".join(f"He 0 0 {3.0 * i}" for i in range(30))  # 30 x 5 = 150 orbitals
    with pytest.raises(ValueError, match="limit of 128"):
        Molecule(atom, basis="cc-pvdz")


def test_basis_set_exchange_fallback() -> None:
    assert not _pyscf_knows_basis("no-such-basis", "H 0 0 0", "Angstrom")
    basis = _bse_basis("Ahlrichs VDZ", "Cr 0 0 0", "Angstrom")
    mol = gto.M(atom="Cr 0 0 0", basis=basis, spin=6, verbose=0)
    assert mol.nao == 21


def test_import_without_pyscf() -> None:
    code = (
        "import sys; sys.modules['pyscf'] = None\n"
        "import cuscikit.chem as c\n"
        "m = c.Molecule.load('LiH'); print(m.norb, round(m.e_hf, 6))\n"
        "assert 'pyscf' not in [k for k in sys.modules if sys.modules[k] is not None]\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[0] == "6"


# ------------------------------------------------------------------ geometry and input checks

PAYLOAD = "__import__('os').system('touch${IFS}PWNED')"


@pytest.mark.parametrize(
    "atom",
    [
        f"H 0 0 0; H 0 0 0.74+{PAYLOAD}",
        f"H 0 0 0\nH 0 0 {PAYLOAD}",
        [("H", (0, 0, 0)), ("H", ("0", "0", f"0.74+{PAYLOAD}"))],
        f"H\nH 1 0.74+{PAYLOAD}",
    ],
)
def test_geometry_strings_never_run_code(atom, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="is not a plain number"):
        Molecule(atom)
    for helper in (_pyscf_knows_basis, _bse_basis):
        try:
            helper("sto-3g", atom, "Angstrom")
        except ValueError:
            pass
    assert not (tmp_path / "PWNED").exists()


def test_cli_geometry_never_runs_code(tmp_path: Path) -> None:
    atom = f"H 0 0 0; H 0 0 0.74+{PAYLOAD}"
    out = subprocess.run(
        [sys.executable, "-m", "cuscikit", "fcidump", "--atom", atom, "-o", "F"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert out.returncode == 2
    assert "is not a plain number" in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "PWNED").exists() and not (tmp_path / "F").exists()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(atom=""), "no atoms"),
        (dict(atom="H 0 0; H 0 0 0.74"), "expected 'symbol x y z'"),
        (dict(atom="H 0 0 0; H 0 0 0.74 1"), "got 5 fields"),
        (dict(atom="Qq 0 0 0; H 0 0 0.74"), "unknown element"),
        (dict(atom="H 0 0 0; H 0 0 nan"), "not a plain number"),
        (dict(atom="H 0 0 0; H 0 0 0"), "atoms 1 \\(H\\) and 2 \\(H\\) are 0 Angstrom apart"),
        (dict(atom="H 0 0 0; H 0 0 0.74", unit="furlong"), "unit must be 'Angstrom' or 'Bohr'"),
        (dict(atom="H 0 0 0; H 0 0 0.74", unit=0.52917721092), "unit must be"),
        (dict(atom="H 0 0 0; H 0 0 0.74", charge=5), "charge=5 removes more electrons"),
        (dict(atom="H 0 0 0; H 0 0 0.74", spin=4), "2 electrons cannot have 2S"),
        (dict(atom="H 0 0 0; H 0 0 0.74", spin=1), "parity"),
        (dict(atom="H 0 0 0; H 0 0 0.74", charge=1.5), "charge must be an integer"),
        (dict(atom="H 0 0 0; H 0 0 0.74", charge=float("nan")), "charge must be an integer"),
        (dict(atom="H 0 0 0; H 0 0 0.74", spin=True), "spin must be an integer"),
    ],
)
def test_bad_molecule_input_is_one_line_valueerror(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match) as info:
        Molecule(**kwargs)
    assert "\n" not in str(info.value)


def test_geometry_formats_and_units_agree_with_pyscf() -> None:
    h2 = "H 0 0 0; H 0.1 0.2 0.7"
    ref = scf.RHF(gto.M(atom=h2, basis="sto-3g", verbose=0)).run(conv_tol=1e-12).e_tot
    bohr = [(s, tuple(x / 0.52917721092 for x in c)) for s, c in parse_geometry(h2)]
    for atom, unit in [
        (h2.replace("; ", "\n"), "Angstrom"),
        (h2.replace(" ", ", ").replace(";,", ";"), "ang"),
        (parse_geometry(h2), "A"),
        (bohr, "Bohr"),
        (bohr, "au"),
    ]:
        m = Molecule(atom, unit=unit)
        assert abs(m.e_scf - ref) < 1e-9, (atom, unit)
        assert m.unit in ("Angstrom", "Bohr")
    zmat = "O\nH 1 0.96\nH 1 0.96 2 104.5"
    ref = scf.RHF(gto.M(atom=zmat, basis="sto-3g", verbose=0)).run(conv_tol=1e-12).e_tot
    assert abs(Molecule(zmat).e_scf - ref) < 1e-9


# ------------------------------------------------------------------ the API checks = the reader's


def _h2_full(v0011: float, v1100: float) -> np.ndarray:
    g = np.zeros((2, 2, 2, 2))
    g[0, 0, 0, 0], g[1, 1, 1, 1] = 0.6, 0.5
    g[0, 0, 1, 1], g[1, 1, 0, 0] = v0011, v1100
    return g


def _h2_file(path: Path, v0011: float, v1100: float) -> Path:
    path.write_text(
        " &FCI NORB=2,NELEC=2,MS2=0 &END\n 0.6 1 1 1 1\n 0.5 2 2 2 2\n"
        f" {v0011!r} 1 1 2 2\n {v1100!r} 2 2 1 1\n -1.0 1 1 0 0\n -0.5 2 2 0 0\n 0.1 0 0 0 0\n"
    )
    return path


@pytest.mark.parametrize("scale", [0.3, 50.0])
@pytest.mark.parametrize(("rel", "ok"), [(0.5e-8, True), (2e-8, False), (0.5, False)])
def test_broken_permutation_symmetry_same_verdict_api_and_file(
    tmp_path: Path, scale: float, rel: float, ok: bool
) -> None:
    """One tolerance (1e-8 relative, absolute below 1), one message, both ways in."""
    a, b = scale, scale + rel * max(1.0, scale)
    h = np.diag([-1.0, -0.5])
    full = _h2_full(a, b)
    eri4 = restore_eri(_h2_full(a, a), 2, 4)
    eri4[2, 0] = b  # (11|00) vs (00|11) in the 4-fold layout
    path = _h2_file(tmp_path / "F", a, b)
    tries = {
        "full": lambda: Molecule.from_integrals(h, full, 2, e_core=0.1),
        "full 2-D": lambda: Molecule.from_integrals(h, full.reshape(4, 4), 2, e_core=0.1),
        "4-fold": lambda: Molecule.from_integrals(h, eri4, 2, e_core=0.1),
        "file": lambda: Molecule.from_fcidump(path),
    }
    msg = r"\(ij\|kl\) conflicts with the symmetry-equivalent entry .* must agree to 1e-08 rel"
    for name, make in tries.items():
        if ok:
            assert abs(make().eri_full()[0, 0, 1, 1] - a) <= 1e-8 * max(1.0, a), name
        else:
            with pytest.raises(ValueError, match=msg):
                make()


@pytest.mark.parametrize("perm", ["ij", "kl", "pairs"])
def test_each_permutation_of_a_full_array_is_checked(perm: str) -> None:
    rng = np.random.default_rng(4)
    n = 4
    g = rng.standard_normal((n,) * 4)
    g = g + g.transpose(1, 0, 2, 3)
    g = g + g.transpose(0, 1, 3, 2)
    g = g + g.transpose(2, 3, 0, 1)
    # break exactly one symmetry, keep the other two, for the orbit of (0 1 | 2 3)
    if perm == "ij":  # (01|23) = (01|32) and (01|23) = (23|01) kept, (01|..) != (10|..)
        for idx in [(0, 1, 2, 3), (0, 1, 3, 2), (2, 3, 0, 1), (3, 2, 0, 1)]:
            g[idx] += 0.1
    elif perm == "kl":
        for idx in [(0, 1, 2, 3), (1, 0, 2, 3), (2, 3, 0, 1), (2, 3, 1, 0)]:
            g[idx] += 0.1
    else:
        for idx in [(0, 1, 2, 3), (1, 0, 2, 3), (0, 1, 3, 2), (1, 0, 3, 2)]:
            g[idx] += 0.1
    with pytest.raises(ValueError, match="conflicts with the symmetry-equivalent entry"):
        Molecule.from_integrals(np.eye(n), g, 2)


def test_h1e_asymmetry_same_verdict_api_and_file(tmp_path: Path) -> None:
    h = np.array([[-1.0, 0.1], [0.1 + 1e-6, -0.5]])
    with pytest.raises(ValueError, match="h_ij conflicts with the symmetry-equivalent entry"):
        Molecule.from_integrals(h, _h2_full(0.3, 0.3), 2)
    path = tmp_path / "F"
    path.write_text(
        " &FCI NORB=2,NELEC=2 &END\n 0.6 1 1 1 1\n -1.0 1 1 0 0\n -0.5 2 2 0 0\n"
        " 0.1 1 2 0 0\n 0.100001 2 1 0 0\n 0.0 0 0 0 0\n"
    )
    with pytest.raises(ValueError, match="h_ij conflicts with the symmetry-equivalent entry"):
        Molecule.from_fcidump(path)
    # noise of integral transforms is accepted (and removed) as before
    m = Molecule.from_integrals(h + np.array([[0, 0], [-1e-6 + 1e-14, 0]]), _h2_full(0.3, 0.3), 2)
    assert m.h1e[0, 1] == m.h1e[1, 0]


@pytest.mark.parametrize("where", ["h1e", "eri", "e_core"])
@pytest.mark.parametrize("value", [1e308, -2e8, np.inf, np.nan])
def test_overflowing_integrals_refused_api_and_file(tmp_path: Path, where: str, value) -> None:
    """h = 1e308 used to pass and give E = NaN; now both ways in refuse it, same words."""
    h, g, e = np.diag([-1.0, -0.5]), _h2_full(0.3, 0.3), 0.1
    if where == "h1e":
        h[0, 0] = value
    elif where == "eri":
        g[1, 1, 1, 1] = value
    else:
        e = value
    match = "NaN or inf" if not np.isfinite(value) else "exceeds the largest integral magnitude"
    with pytest.raises(ValueError, match=match):
        Molecule.from_integrals(h, g, 2, e_core=e)
    if np.isfinite(value):
        text = (
            f" &FCI NORB=2,NELEC=2 &END\n {float(g[1, 1, 1, 1])!r} 2 2 2 2\n 0.6 1 1 1 1\n"
            f" {float(h[0, 0])!r} 1 1 0 0\n -0.5 2 2 0 0\n {float(e)!r} 0 0 0 0\n"
        )
        (tmp_path / "F").write_text(text)
        with pytest.raises(ValueError, match=match):
            Molecule.from_fcidump(tmp_path / "F")


def test_largest_accepted_integrals_give_finite_energies() -> None:
    from cuscikit import SCISpace
    from cuscikit.chem.integrals import MAX_ABS_INTEGRAL

    n = 4
    g = np.full((n,) * 4, MAX_ABS_INTEGRAL)
    h = np.full((n, n), -MAX_ABS_INTEGRAL)
    m = Molecule.from_integrals(h, g, 4, e_core=MAX_ABS_INTEGRAL)
    assert np.isfinite(m.e_hf)
    assert np.isfinite(SCISpace.full(m).exact_energy())


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(e_hf=float("nan")), "not finite"),
        (dict(e_hf="x"), "e_hf must be a number"),
        (dict(e_core="x"), "e_core must be a number"),
        (dict(orbsym=[1, 1.5]), "orbsym"),
        (dict(orbsym=[1, -1]), "negative irrep"),
        (dict(orbsym=[1]), "orbsym has 1 entries"),
        (dict(isym=-1), "isym"),
        (dict(isym=1.5), "isym"),
    ],
)
def test_from_integrals_rejects_labels_and_energies(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Molecule.from_integrals(np.diag([-1.0, -0.5]), _h2_full(0.3, 0.3), 2, **kwargs)


def test_isym_warns_and_round_trips(tmp_path: Path) -> None:
    h, g = np.diag([-1.0, -0.5]), _h2_full(0.3, 0.3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert Molecule.from_integrals(h, g, 2, orbsym=[1, 2]).isym == 1
    with pytest.warns(SymmetryWarning, match="ISYM=2 \\(with ORBSYM\\).*any symmetry"):
        m = Molecule.from_integrals(h, g, 2, orbsym=[1, 2], isym=2)
    with pytest.warns(SymmetryWarning, match="without ORBSYM"):
        Molecule.from_integrals(h, g, 2, isym=3)
    m.to_fcidump(tmp_path / "F.gz")
    d = read_fcidump(tmp_path / "F.gz")
    assert (d.isym, d.orbsym) == (2, (1, 2))


def test_solvers_refuse_a_state_irrep_they_cannot_honour(tmp_path: Path) -> None:
    """ISYM other than 1 is a request for one irrep; the solvers (which find the lowest state of
    any symmetry) refuse it before any work, the API and the command line alike; ISYM=1 (what
    writers put when nothing was asked for) is accepted."""
    import json
    import subprocess
    import sys

    from cuscikit.sci import FCI

    h, g = np.diag([-1.0, -0.5]), _h2_full(0.3, 0.3)
    with pytest.warns(SymmetryWarning):
        m = Molecule.from_integrals(h, g, 2, orbsym=[1, 2], isym=2, name="toy")
    with pytest.raises(ValueError, match="ISYM=2 asks for the lowest state of irrep 2"):
        FCI(m).kernel()
    with pytest.raises(ValueError, match="ISYM=2"):
        m.fci()
    torch = pytest.importorskip("torch")  # noqa: F841
    from cuscikit import Ansatz, Runner

    with pytest.raises(ValueError, match="ISYM=2"):
        Runner(m, Ansatz.for_molecule(m, seed=0))
    path = tmp_path / "toy.fcidump"
    m.to_fcidump(path)
    r = subprocess.run(
        [sys.executable, "-m", "cuscikit", "fci", str(path), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2, r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1])["status"] == "error"
    assert "ISYM=2" in r.stdout
    m.isym = 1  # accept the lowest state of any symmetry
    e, _ = FCI(m).kernel()
    assert e == pytest.approx(m.fci(), abs=1e-10)


def test_from_pyscf_mole_and_scf_objects() -> None:
    """`Molecule.from_pyscf` (and `Molecule(mol)`, `Molecule(mf)`) against PySCF's own RHF,
    ROHF and FCI energies; unrestricted or unrun SCF objects and other types are refused."""
    from pyscf import fci, gto, scf

    from cuscikit.sci import FCI

    mol = gto.M(atom="Li 0 0 0; H 0 0 1.6", basis="sto-3g", verbose=0)
    mf = scf.RHF(mol).run(conv_tol=1e-12)
    e_fci = fci.FCI(mf).kernel()[0]
    for m in (Molecule.from_pyscf(mf), Molecule(mf), Molecule.from_pyscf(mol), Molecule(mol)):
        assert m.e_hf == pytest.approx(mf.e_tot, abs=1e-8)
        assert (m.norb, m.nelec) == (6, (2, 2))
        assert FCI(m).kernel()[0] == pytest.approx(e_fci, abs=1e-8)
    assert Molecule.from_pyscf(mf).scf is mf  # the given orbitals, as they are
    m = Molecule.from_pyscf(mf, frozen_core=1)
    assert (m.norb, m.nelec) == (5, (1, 1))

    triplet = gto.M(atom="C 0 0 0; H 0 0.9 0.6; H 0 -0.9 0.6", basis="sto-3g", spin=2, verbose=0)
    rohf = scf.ROHF(triplet).run(conv_tol=1e-12)
    m = Molecule.from_pyscf(rohf)
    assert m.nelec == (5, 3) and m.e_hf == pytest.approx(rohf.e_tot, abs=1e-8)

    with pytest.raises(ValueError, match="two sets of orbitals"):
        Molecule.from_pyscf(scf.UHF(triplet).run())
    with pytest.raises(ValueError, match="has not run"):
        Molecule.from_pyscf(scf.RHF(mol))
    with pytest.raises(ValueError, match="expected a pyscf.gto.Mole"):
        Molecule.from_pyscf("H 0 0 0; H 0 0 0.74")
