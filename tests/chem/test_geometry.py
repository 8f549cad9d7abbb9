"""Geometry parsing: plain numbers only, the formats PySCF users write, one-line errors.

Runs without PySCF except where a result is compared with PySCF's own parser.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cuscikit.chem.geometry import (
    MIN_DISTANCE_BOHR,
    check_geometry,
    normalize_unit,
    nuclear_charge,
    parse_geometry,
)

H2 = [("H", (0.0, 0.0, 0.0)), ("H", (0.0, 0.0, 0.74))]


@pytest.mark.parametrize(
    "atom",
    [
        "H 0 0 0; H 0 0 0.74",
        "H 0 0 0\nH 0 0 0.74\n",
        "  H  0  0  0 ;\n\n# a comment\n H\t0\t0\t0.74 ; ",
        "H,0,0,0;H,0,0,0.74",
        "H 0, 0, 0\nH 0.0 0.0 7.4e-1",
        "1 0 0 0; 1 0 0 .74",
        [("H", (0, 0, 0)), ("H", (0, 0, 0.74))],
        [("H", 0, 0, 0), ["H", [0.0, 0.0, 0.74]]],
        ["H 0 0 0", "H, 0, 0, 0.74"],
        (("H", np.zeros(3)), ("H", np.array([0.0, 0.0, 0.74]))),
        [("H", ("0", "0", "0")), ("H", ("0", "0", "0.74"))],
    ],
)
def test_formats_give_the_same_atoms(atom) -> None:
    assert parse_geometry(atom) == H2


def test_labels_as_pyscf_reads_them() -> None:
    atoms = parse_geometry("h1 0 0 0; H@2 0 0 1; X-H 0 0 2; ghost-Li 0 0 3; 8 0 0 4; Xe 0 0 5")
    assert [a for a, _ in atoms] == ["h1", "H@2", "X-H", "ghost-Li", "O", "Xe"]
    assert [nuclear_charge(a) for a, _ in atoms] == [1, 1, 0, 0, 8, 54]


CODE = "__import__('os').system('touch${IFS}PWNED')"


@pytest.mark.parametrize(
    ("atom", "match"),
    [
        (f"H 0 0 0; H 0 0 0.74+{CODE}", "atom 2 .*coordinate .* is not a plain number"),
        (f"H 0 0 0; H 0 0 {CODE}", "is not a plain number"),
        ([("H", (0, 0, 0)), ("H", ("0", "0", f"0.74+{CODE}"))], "not a plain number"),
        ([("H", (0, 0, 0)), (CODE, (0, 0, 1))], "not an atom label"),
        (f"{CODE} 0 0 0", "not an atom label"),
        ("O\nH 1 0.96\nH 1 0.96 2 104.5+1", "not a plain number"),
        ("O\nH 1 0.96\nH 1 0.96 2 __import__('os')", "not a plain number"),
        ("", "no atoms"),
        ("  ;\n ; # nothing\n", "no atoms"),
        ([], "no atoms"),
        ("H 0 0", "expected 'symbol x y z', got 3 fields"),
        ("H 0 0 0; H 0 0", "atom 2 .*got 3 fields"),
        ("H 0 0 0 0", "got 5 fields"),
        ("H 0 0 x", "'x' is not a plain number"),
        ("H 0 0 nan", "'nan' is not a plain number"),
        ("H 0 0 inf", "is not a plain number"),
        ("H 0 0 1e999", "not finite"),
        ("H 0 0 1_000", "not a plain number"),
        ("H 0 0 0x10", "not a plain number"),
        ("H 0 0 2e7", "exceeds"),
        ("Qq 0 0 0", "unknown element in atom label 'Qq'"),
        ("0 0 0 0", "no element has atomic number 0"),
        ("119 0 0 0", "no element has atomic number 119"),
        ([("H", (0, 0))], "expected 3 coordinates"),
        ([("H", (0, 0, np.nan))], "not finite"),
        ([("H", (0, 0, True))], "is not a number"),
        ([("H", (0, 0, [1]))], "is not a number"),
        ([("H",)], "expected"),
        ([42], "expected"),
        (42, "atom must be a geometry string"),
        (None, "atom must be a geometry string"),
        ("O\nH 1 0.96 5", "Z-matrix line 2 needs 3 fields"),
        ("O\nH 2 0.96", "reference '2' is not an earlier atom"),
        ("O\nH 1 -0.96", "bond length -0.96 must be positive"),
        ("O\nH 1 0.96\nH 1 0.96 1 104.5", "the angle needs a second, different atom"),
        ("O\nH 1 0.96\nH 1 0.96 2 190", "angle 190 must lie in 0..180 degrees"),
        ("O\nH 1 0.96\nH 1 0.96 2 104\nH 1 1 2 100 2 0", "dihedral needs a third"),
    ],
)
def test_bad_geometry_one_line_valueerror(atom, match: str, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=match) as info:
        parse_geometry(atom)
    assert "\n" not in str(info.value)
    assert not (tmp_path / "PWNED").exists()


def test_zmatrix_matches_pyscf() -> None:
    gto = pytest.importorskip("pyscf.gto")
    for z in (
        "O\nH 1 0.96\nH 1 0.96 2 104.5",
        "O\nO 1 1.45\nH 1 0.97 2 100.0\nH 2 0.97 1 100.0 3 120.0",
        "C\nC 1 1.54\nC 2 1.54 1 109.5\nC 3 1.54 2 109.5 1 180; H 1 1.09 2 109.5 3 60",
        "N;N 1 1.1",
        "H\nH 1 1\nH 2 1 1 180\nH 3 1 2 90 1 0",  # linear start, then a collinear case
    ):
        ours = parse_geometry(z)
        ref = gto.mole.from_zmatrix(z)
        assert [a for a, _ in ours] == [a for a, _ in ref]
        np.testing.assert_allclose([c for _, c in ours], [c for _, c in ref], atol=1e-12)


def test_xyz_and_plain_files(tmp_path: Path) -> None:
    xyz = tmp_path / "h2.xyz"
    xyz.write_text("2\nhydrogen molecule\nH 0 0 0\nH 0 0 0.74\nthis line is ignored\n")
    assert parse_geometry(str(xyz)) == H2
    raw = tmp_path / "h2.txt"
    raw.write_text("H 0 0 0\nH 0 0 0.74\n")
    assert parse_geometry(str(raw)) == H2
    bad = tmp_path / "bad.xyz"
    bad.write_text("3\n\nH 0 0 0\n")
    with pytest.raises(ValueError, match="3 atoms announced, 1 found"):
        parse_geometry(str(bad))
    (tmp_path / "code.xyz").write_text(f"1\n\nH 0 0 {CODE}\n")
    with pytest.raises(ValueError, match="not a plain number"):
        parse_geometry(str(tmp_path / "code.xyz"))


@pytest.mark.parametrize(
    ("unit", "norm"),
    [("Angstrom", "Angstrom"), ("ang", "Angstrom"), ("A", "Angstrom"), (" bohr ", "Bohr")]
    + [("AU", "Bohr"), ("B", "Bohr"), ("a.u.", "Bohr")],
)
def test_units(unit: str, norm: str) -> None:
    assert normalize_unit(unit) == norm


@pytest.mark.parametrize("unit", ["furlong", "nm", "pm", "", 0.529, None, "Bohrium"])
def test_other_units_refused(unit) -> None:
    with pytest.raises(ValueError, match="unit must be 'Angstrom' or 'Bohr'"):
        normalize_unit(unit)


@pytest.mark.parametrize(
    ("atoms", "unit", "match"),
    [
        ("H 0 0 0; H 0 0 0", "Angstrom", "atoms 1 \\(H\\) and 2 \\(H\\) are 0 Angstrom apart"),
        ("H 0 0 0; H 0 0 1; H 0 0 1.05", "Bohr", "atoms 2 \\(H\\) and 3 \\(H\\) are 0.05 Bohr"),
        ("Li 0 0 0; H 0 0 0.05", "Angstrom", "closer than 0.1 Bohr"),
    ],
)
def test_atoms_at_one_point_refused(atoms: str, unit: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        check_geometry(parse_geometry(atoms), unit)


def test_distance_threshold_and_many_atoms() -> None:
    d = 1.01 * MIN_DISTANCE_BOHR
    check_geometry(parse_geometry(f"H 0 0 0; H 0 0 {d}"), "Bohr")
    grid = [("He", (float(i), float(j), 0.0)) for i in range(60) for j in range(60)]
    check_geometry(grid, "Angstrom")  # 3600 atoms: checked in blocks
    grid.append(("He", (59.0, 59.0, 0.01)))
    with pytest.raises(ValueError, match="atoms 3600 \\(He\\) and 3601 \\(He\\)"):
        check_geometry(grid, "Angstrom")


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(st.text(alphabet="HLiOe0123456789 .,;+-*/_()'\"\n\t#eEx@", max_size=60))
def test_fuzz_geometry_strings(text: str) -> None:
    """Any string: atoms with finite float coordinates, or a one-line ValueError."""
    try:
        atoms = parse_geometry(text)
    except ValueError as exc:
        assert str(exc) and "\n" not in str(exc)
        return
    assert atoms
    for label, xyz in atoms:
        assert isinstance(label, str) and len(xyz) == 3
        assert all(isinstance(v, float) and np.isfinite(v) for v in xyz)
