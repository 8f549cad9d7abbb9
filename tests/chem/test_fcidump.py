"""FCIDUMP reader/writer and ERI packing, against PySCF; the reader's limits and guards."""

from __future__ import annotations

import gzip
import os
import time
import tracemalloc
import warnings
from pathlib import Path

import numpy as np
import pytest

from cuscikit.chem import (
    FCIDumpError,
    FCIDumpWarning,
    Molecule,
    read_fcidump,
    restore_eri,
    write_fcidump,
)
from cuscikit.chem.datasets import dataset_fcidump_path
from cuscikit.chem.fcidump import MAX_HEADER_BYTES, MAX_LINE_BYTES
from cuscikit.chem.integrals import MAX_ABS_INTEGRAL
from tests.conftest import hubbard_integrals

pyscf = pytest.importorskip("pyscf")
from pyscf import ao2mo, gto, mcscf, scf  # noqa: E402
from pyscf.tools import fcidump as pyscf_fcidump  # noqa: E402


def random_integrals(norb: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    g = rng.standard_normal((norb,) * 4)
    g = g + g.transpose(1, 0, 2, 3)
    g = g + g.transpose(0, 1, 3, 2)
    g = g + g.transpose(2, 3, 0, 1)
    h = rng.standard_normal((norb, norb))
    return h + h.T, g


@pytest.mark.parametrize("norb", [1, 2, 5, 9])
@pytest.mark.parametrize("target", [1, 4, 8])
def test_restore_eri_matches_pyscf(norb: int, target: int) -> None:
    _, g = random_integrals(norb, seed=norb)
    for src in (g, ao2mo.restore(4, g, norb), ao2mo.restore(8, g, norb)):
        ours = restore_eri(src, norb, target)
        ref = ao2mo.restore(target, src, norb)
        assert ours.shape == ref.shape
        np.testing.assert_array_equal(ours, ref)


def test_restore_eri_rejects_bad_shape() -> None:
    with pytest.raises(ValueError, match="layouts"):
        restore_eri(np.zeros(7), 3, 8)
    with pytest.raises(ValueError, match="symmetry"):
        restore_eri(np.zeros(21), 3, 2)


@pytest.mark.parametrize("suffix", ["FCIDUMP", "FCIDUMP.gz"])
@pytest.mark.parametrize("layout", [1, 4, 8])
def test_round_trip_exact(tmp_path: Path, suffix: str, layout: int) -> None:
    norb = 6
    h, g = random_integrals(norb, seed=3)
    h *= np.pi  # values without short decimal forms
    path = tmp_path / suffix
    write_fcidump(
        path, h, ao2mo.restore(layout, g, norb), (4, 2), e_core=-1 / 3, orbsym=[1, 2, 3, 4, 1, 1]
    )
    d = read_fcidump(path)
    assert (d.norb, d.nelec, d.ms2, d.isym) == (norb, 6, 2, 1)
    assert d.nelec_ab == (4, 2)
    assert d.orbsym == (1, 2, 3, 4, 1, 1)
    assert d.e_core == -1 / 3
    np.testing.assert_array_equal(d.h1e, h)
    np.testing.assert_array_equal(d.eri, ao2mo.restore(8, g, norb))
    assert (path.read_bytes()[:2] == b"\x1f\x8b") == suffix.endswith(".gz")


def test_gzip_detected_by_magic_not_suffix(tmp_path: Path) -> None:
    h, g = random_integrals(3)
    write_fcidump(tmp_path / "a.gz", h, g, 2)
    plain_named = tmp_path / "FCIDUMP"
    plain_named.write_bytes((tmp_path / "a.gz").read_bytes())
    np.testing.assert_array_equal(read_fcidump(plain_named).h1e, h)


def test_write_is_deterministic(tmp_path: Path) -> None:
    h, g = random_integrals(4)
    write_fcidump(tmp_path / "a.gz", h, g, 4)
    write_fcidump(tmp_path / "b.gz", h, g, 4)
    assert (tmp_path / "a.gz").read_bytes() == (tmp_path / "b.gz").read_bytes()


def test_write_tol_drops_small_integrals(tmp_path: Path) -> None:
    h, g = random_integrals(3)
    g8 = ao2mo.restore(8, g, 3)
    g8[0] = 1e-14
    write_fcidump(tmp_path / "F", h, g8, 2, tol=1e-13)
    assert read_fcidump(tmp_path / "F").eri[0] == 0.0


def test_read_pyscf_molecule_and_open_shell(tmp_path: Path) -> None:
    mol = gto.M(atom="C 0 0 0; H 0 0.9 0.6; H 0 -0.9 0.6", basis="sto-3g", spin=2, verbose=0)
    mf = scf.ROHF(mol).run(conv_tol=1e-12)
    mc = mcscf.CASCI(mf, mol.nao, mol.nelec)
    h1, ecore = mc.get_h1eff()
    h2 = mc.get_h2eff()
    path = tmp_path / "FCIDUMP"
    pyscf_fcidump.from_integrals(str(path), h1, h2, mol.nao, mol.nelectron, nuc=ecore, ms=2)
    d = read_fcidump(path)
    assert d.nelec_ab == mol.nelec == (5, 3)
    assert abs(d.e_core - ecore) < 1e-15
    # PySCF's writer drops integrals at its 1e-15 threshold after formatting; symmetry-zero
    # elements come out of the SCF as noise of that size (seen: -1.01e-15 written as 0).
    np.testing.assert_allclose(d.h1e, h1, atol=1e-14)
    np.testing.assert_allclose(d.eri, ao2mo.restore(8, h2, mol.nao), atol=1e-14)
    ref = pyscf_fcidump.read(str(path), verbose=False)
    np.testing.assert_array_equal(d.eri, ref["H2"])


def test_read_pyscf_hubbard_pbc(tmp_path: Path) -> None:
    n = 8
    h, g = hubbard_integrals(n, 4.0)
    path = tmp_path / "FCIDUMP"
    pyscf_fcidump.from_integrals(str(path), h, g, n, n, nuc=0.0)
    d = read_fcidump(path)
    np.testing.assert_array_equal(d.h1e, h)
    np.testing.assert_array_equal(d.eri_full(), g)
    assert d.orbsym == (1,) * n and d.nelec_ab == (4, 4)


DIALECT_BODY = (
    " 0.5 1 1 1 1\n 0.25 2 2 1 1\n 0.3 2 2 2 2\n"
    " -1.0 1 1 0 0\n -0.5 2 2 0 0\n 0.1 2 1 0 0\n 0.7 0 0 0 0\n"
)


@pytest.mark.parametrize(
    "header",
    [
        " &FCI NORB=2,NELEC=2,MS2=0,\n  ORBSYM=1,1,\n  ISYM=1,\n &END\n",  # PySCF
        " &FCI NORB=  2,NELEC=2,MS2=0,\n  ORBSYM=1,1,\n  ISYM=1\n /\n",  # Molpro
        "&FCI\nNORB=2,\nNELEC=2,\nMS2=0,\nUHF=.FALSE.,\nORBSYM=1,1\nISYM=1,\n&END\n",  # Psi4
        "&fci norb=2, nelec=2, ms2=0, orbsym=2*1, isym=1 &end\n",  # lower case, repeat
        "$FCI NORB=2 NELEC=2\n $END\n",  # minimal, $-style
    ],
)
def test_header_dialects(tmp_path: Path, header: str) -> None:
    path = tmp_path / "FCIDUMP"
    path.write_text(header + DIALECT_BODY.replace("0.25", "0.25D0").replace("0.3 ", "3.0d-1 "))
    d = read_fcidump(path)
    assert (d.norb, d.nelec, d.ms2) == (2, 2, 0)
    full = d.eri_full()
    assert full[0, 0, 1, 1] == full[1, 1, 0, 0] == 0.25 and full[1, 1, 1, 1] == 0.3
    assert d.h1e[0, 1] == d.h1e[1, 0] == 0.1 and d.e_core == 0.7


@pytest.mark.filterwarnings("ignore::cuscikit.chem.FCIDumpWarning")  # ERIs only, on purpose
def test_any_permutation_fills_8fold(tmp_path: Path) -> None:
    norb = 4
    _, g = random_integrals(norb, seed=7)
    rng = np.random.default_rng(1)
    lines = [" &FCI NORB=4,NELEC=4,MS2=0, &END"]
    pairs = [(i, j) for i in range(norb) for j in range(i + 1)]
    for a, (i, j) in enumerate(pairs):
        for k, ll in pairs[: a + 1]:
            p, q, r, s = [(i, j, k, ll), (j, i, k, ll), (k, ll, i, j), (ll, k, j, i)][
                rng.integers(4)
            ]
            lines.append(f" {float(g[p, q, r, s])!r} {p + 1} {q + 1} {r + 1} {s + 1}")
    (tmp_path / "F").write_text("\n".join(lines) + "\n")
    np.testing.assert_array_equal(read_fcidump(tmp_path / "F").eri_full(), g)


GOOD = " &FCI NORB=2,NELEC=2,MS2=0,\n  ORBSYM=1,1,\n  ISYM=1,\n &END\n" + DIALECT_BODY


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("", "empty"),
        ("   \n\n", "empty"),
        (DIALECT_BODY, "missing &FCI"),
        (" &FCI NORB=2,NELEC=2,MS2=0,\n" + DIALECT_BODY.replace("/", ""), "not terminated"),
        (" &FCI junk NORB=2,NELEC=2 &END\n" + DIALECT_BODY, "garbled"),
        (" &FCI NELEC=2,MS2=0 &END\n" + DIALECT_BODY, "NORB missing"),
        (" &FCI NORB=2,MS2=0 &END\n" + DIALECT_BODY, "NELEC missing"),
        (" &FCI NORB=2,NELEC=2,MS2=1 &END\n" + DIALECT_BODY, "parity"),
        (" &FCI NORB=4,NELEC=2,MS2=4 &END\n" + DIALECT_BODY, r"\|MS2\|=4 exceeds NELEC"),
        (" &FCI NORB=2,NELEC=6,MS2=0 &END\n" + DIALECT_BODY, "exceeds 2\\*NORB"),
        (" &FCI NORB=-2,NELEC=2 &END\n" + DIALECT_BODY, "NORB=-2 must be a positive"),
        (" &FCI NORB=2,NELEC=-2 &END\n" + DIALECT_BODY, "negative"),
        (" &FCI NORB=2,NELEC=2,ORBSYM=1,1,1 &END\n" + DIALECT_BODY, "ORBSYM has 3 entries"),
        (" &FCI NORB=2,NELEC=2,ORBSYM=1,-1 &END\n" + DIALECT_BODY, "negative irrep"),
        (" &FCI NORB=two,NELEC=2 &END\n" + DIALECT_BODY, "non-integer value 'two' for NORB"),
        (" &FCI NORB=2,NORB=2,NELEC=2 &END\n" + DIALECT_BODY, "given twice"),
        (" &FCI NORB=2,NELEC=2,UHF=.TRUE. &END\n" + DIALECT_BODY, "UHF"),
        (GOOD + " 0.1 3 1 0 0\n", r":12: integral index \(3, 1, 0, 0\) out of range 0..NORB=2"),
        (GOOD + " 0.1 -1 1 0 0\n", "out of range"),
        (GOOD + " 0.1 1 0 1 0\n", ":12: invalid index pattern"),
        (GOOD + " abc 1 1 0 0\n", ":12: non-numeric value 'abc'"),
        (GOOD + " 0.1 1 x 0 0\n", "non-numeric orbital index 'x'"),
        (GOOD + " 0.1 1 1.5 0 0\n", "not an integer"),
        (GOOD + " NaN 1 1 0 0\n", ":12: NaN/inf value"),
        (GOOD + " -inf 1 1 0 0\n", "NaN/inf value"),
        (GOOD + " 1e999 1 1 0 0\n", "overflows to inf"),
        (GOOD + " 0.1 1 1 0\n", ":12: expected 'value i j k l' \\(5 fields\\), got 4"),
        (
            GOOD + " 0.9 1 1 0 0\n",
            ":12: h_ij conflicts with the symmetry-equivalent entry on line 8",
        ),
        (GOOD + " 0.9 1 1 2 2\n", r"\(ij\|kl\) conflicts"),
        (" &FCI NORB=2,NELEC=2 &END\n", "no integrals"),
        (" &FCI NORB=2,NELEC=2 &END 0.5 1 1 1 1\n", "after the namelist terminator"),
        (" &FCI NORB=2000,NELEC=2 &END\n" + DIALECT_BODY, "NORB=2000 exceeds the limit of 128"),
        (" &FCI NORB=129,NELEC=2 &END\n" + DIALECT_BODY, "NORB=129 exceeds the limit of 128"),
        (" &FCI NORB=" + "9" * 30 + ",NELEC=2 &END\n" + DIALECT_BODY, "too large"),
        (" &FCI NORB=2,NELEC=2,ORBSYM=1000000000*1 &END\n" + DIALECT_BODY, "more than 128"),
        (" &FCI NORB=2,NELEC=2,ORBSYM=99999999999999999999*1 &END\n", "bad repeat count"),
        (" &FCI NORB=2,NELEC=2,ORBSYM=129*1 &END\n" + DIALECT_BODY, "more than 128 values"),
        (" &FCI NORB=2,NELEC=2,MS2=2*0 &END\n" + DIALECT_BODY, "MS2 needs one integer"),
        (" &FCI NORB=2,NELEC=2,ISYM=-1 &END\n" + DIALECT_BODY, "ISYM=-1 is negative"),
        (GOOD + " 0.5 100000000000000000000000 1 1 1\n", r":12: integral index \(10+, 1"),
        (GOOD + " 0.5 1 1 1 " + "1" * 4000 + "\n", "out of range"),
        (GOOD + " 1e308 1 1 0 0\n", ":12: value 1e\\+308 exceeds the largest integral magnitude"),
        (GOOD + " -2e8 1 1 1 1\n", ":12: value -2e\\+08 exceeds the largest integral magnitude"),
        (GOOD + " 1.0000001e8 0 0 0 0\n", "exceeds the largest integral magnitude"),
        (GOOD + " 0.5 1 1 1 1\x00\n", ":12: binary data \\(NUL bytes\\)"),
        (GOOD + " 0.7000001 0 0 0 0\n", r":12: core energy \(0 0 0 0\) conflicts .* line 11"),
    ],
)
def test_malformed_raises_fcidumperror(tmp_path: Path, text: str, match: str) -> None:
    path = tmp_path / "FCIDUMP"
    path.write_text(text)
    with pytest.raises(FCIDumpError, match=match) as info:
        read_fcidump(path)
    assert str(path) in str(info.value)


HOSTILE = {
    "norb_5000_digits": (" &FCI NORB=" + "9" * 5000 + ",NELEC=2 &END\n", ":1: line longer than"),
    "long_integral_line": (GOOD + " 1" * 60000 + "\n", ":12: line longer than 4096 characters"),
    "105k_digits_no_newline": (GOOD + "1" * 105000, ":12: line longer than 4096 characters"),
    "header_never_ends": (
        " &FCI NORB=2,NELEC=2,\n" + " ORBSYM=1,1,\n" * 6000,
        "not terminated by &END or / in the first 65536 bytes",
    ),
    "no_header_in_64k": ("\n" * (MAX_HEADER_BYTES + 1) + GOOD, "header is missing in the first"),
    "blank_without_newline": (" " * (2 * MAX_LINE_BYTES), ":1: line longer than"),
    "endless_duplicates": (
        " &FCI NORB=1,NELEC=2 &END\n" + " 0.5 1 1 1 1\n" * 5000,
        ":4114: more than 4112 lines after the namelist",
    ),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_raises_fcidumperror(tmp_path: Path, case: str) -> None:
    text, match = HOSTILE[case]
    path = tmp_path / "FCIDUMP"
    path.write_text(text)
    with pytest.raises(FCIDumpError, match=match) as info:
        read_fcidump(path)
    assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_truncated_gzip(tmp_path: Path) -> None:
    h, g = random_integrals(5)
    write_fcidump(tmp_path / "F.gz", h, g, 4)
    data = (tmp_path / "F.gz").read_bytes()
    (tmp_path / "T.gz").write_bytes(data[: len(data) // 2])
    with pytest.raises(FCIDumpError, match="truncated gzip"):
        read_fcidump(tmp_path / "T.gz")


def test_gz_suffix_but_not_gzip(tmp_path: Path) -> None:
    (tmp_path / "F.gz").write_text(GOOD)
    with pytest.raises(FCIDumpError, match="not gzip"):
        read_fcidump(tmp_path / "F.gz")


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(FCIDumpError, match="cannot read"):
        read_fcidump(tmp_path / "nope")


def test_gzipped_text_of_malformed_file_names_problem(tmp_path: Path) -> None:
    (tmp_path / "F.gz").write_bytes(gzip.compress(b" &FCI NORB=2 &END\n"))
    with pytest.raises(FCIDumpError, match="NELEC missing"):
        read_fcidump(tmp_path / "F.gz")


def test_write_validates(tmp_path: Path) -> None:
    h, g = random_integrals(3)
    with pytest.raises(ValueError, match="symmetric"):
        write_fcidump(tmp_path / "F", h + np.triu(np.ones((3, 3)), 1), g, 2)
    with pytest.raises(ValueError, match="inconsistent"):
        write_fcidump(tmp_path / "F", h, g, 3, ms2=0)
    with pytest.raises(ValueError, match="layouts"):
        write_fcidump(tmp_path / "F", h, np.zeros(5), 2)


# ------------------------------------------------------------------ limits before work


def test_limits_hold_in_bounded_time_and_memory(tmp_path: Path) -> None:
    """Hostile files that cost minutes or gigabytes before: each refused at once, in little
    memory (a repeat count, a 105 KB line of digits, a header that never ends)."""
    cases = {
        "repeat": " &FCI NORB=6,NELEC=4,ORBSYM=1000000000*1 &END\n" + DIALECT_BODY,
        "digits": GOOD + "1" * 105_000 + "\n",
        "no_end": " &FCI NORB=6,NELEC=4,\n" + " 0.1 1 1 1 1\n" * 200_000,
        "no_newline": GOOD + " " * 10_000_000,
    }
    for name, text in cases.items():
        path = tmp_path / name
        path.write_text(text)
        tracemalloc.start()
        t0 = time.perf_counter()
        with pytest.raises(FCIDumpError):
            read_fcidump(path)
        wall = time.perf_counter() - t0
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert wall < 2.0, (name, wall)
        assert peak < 8 << 20, (name, peak)


def test_memory_does_not_grow_with_the_file(tmp_path: Path) -> None:
    """A 17 MB file of (agreeing) duplicate lines is read in about one block of memory."""
    line = " 0.5 1 1 1 1".ljust(MAX_LINE_BYTES - 1) + "\n"
    path = tmp_path / "F"
    with open(path, "w") as fh:
        fh.write(" &FCI NORB=1,NELEC=2 &END\n")
        fh.write(line * 4100)
        fh.write(" -1.0 1 1 0 0\n 0.25 0 0 0 0\n")
    assert path.stat().st_size > 16e6
    tracemalloc.start()
    d = read_fcidump(path)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert d.eri.tolist() == [0.5] and d.e_core == 0.25
    assert peak < 4 << 20, peak


def test_gzip_bomb_and_dev_zero_end_early(tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.gz"
    bomb.write_bytes(gzip.compress(b"\x00" * (16 << 20), compresslevel=1))
    spaces = tmp_path / "spaces.gz"
    spaces.write_bytes(gzip.compress(b" " * (16 << 20), compresslevel=1))
    for path, match in ((bomb, "NUL"), (spaces, "line longer")):
        t0 = time.perf_counter()
        with pytest.raises(FCIDumpError, match=match):
            read_fcidump(path)
        assert time.perf_counter() - t0 < 2.0
    if os.path.exists("/dev/zero"):
        with pytest.raises(FCIDumpError, match="/dev/zero:1: binary data"):
            read_fcidump("/dev/zero")


def test_magnitude_limit_is_inclusive(tmp_path: Path) -> None:
    path = tmp_path / "F"
    path.write_text(GOOD.replace(" 0.3 2 2 2 2", f" {MAX_ABS_INTEGRAL!r} 2 2 2 2"))
    assert read_fcidump(path).eri_full()[1, 1, 1, 1] == MAX_ABS_INTEGRAL


def test_conflict_across_blocks_names_the_earlier_line(tmp_path: Path) -> None:
    """Duplicates are compared even when a megabyte of lines lies between them."""
    pad = " 0.3 2 2 2 2".ljust(MAX_LINE_BYTES - 1) + "\n"  # agrees with line 7
    path = tmp_path / "F"
    path.write_text(GOOD + pad * 300 + " 0.5000001 1 1 1 1\n")
    with pytest.raises(FCIDumpError, match=r":312: \(ij\|kl\) conflicts with .* on line 5 \("):
        read_fcidump(path)


def test_reading_is_not_slower_than_needed(tmp_path: Path) -> None:
    """A 20-orbital file (22k integrals) reads in a fraction of a second (~0.15 s)."""
    h, g = random_integrals(20, 2)
    write_fcidump(tmp_path / "F", h, g, 10)
    t0 = time.perf_counter()
    d = read_fcidump(tmp_path / "F")
    assert time.perf_counter() - t0 < 2.0
    np.testing.assert_array_equal(d.eri_full(), g)


# ------------------------------------------------------------------ physics guards


def _lih_lines() -> list[str]:
    return gzip.decompress(dataset_fcidump_path("LiH").read_bytes()).decode().splitlines(True)


@pytest.mark.parametrize("keep", ["eri", "eri+h1"])
def test_file_cut_at_a_line_boundary_warns(tmp_path: Path, keep: str) -> None:
    lines = _lih_lines()
    end = next(n for n, x in enumerate(lines) if "&END" in x.upper()) + 1
    body = lines[end:]
    n_eri = sum(1 for x in body if x.split()[3:] != ["0", "0"])
    cut = n_eri if keep == "eri" else len(body) - 1  # PySCF order: ERIs, h1e, core
    path = tmp_path / "cut"
    path.write_text("".join(lines[: end + cut]))
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        m = Molecule.from_fcidump(path)
    said = [str(w.message) for w in rec if issubclass(w.category, FCIDumpWarning)]
    assert len(said) == (2 if keep == "eri" else 1)
    assert "no core-energy line (0 0 0 0)" in said[0] and str(path) in said[0]
    assert any("no one-electron integrals" in x for x in said) == (keep == "eri")
    assert m.e_core == 0.0


def test_complete_file_reads_without_warnings() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m = Molecule.load("LiH")
    assert m.isym == 1


def test_isym_is_kept_and_written_back(tmp_path: Path) -> None:
    h, g = random_integrals(3)
    write_fcidump(tmp_path / "F", h, g, 2, orbsym=[1, 2, 2], isym=2)
    text = (tmp_path / "F").read_text()
    assert "ISYM=2," in text
    assert read_fcidump(tmp_path / "F").isym == 2
    with pytest.warns(UserWarning, match="ISYM=2 \\(with ORBSYM\\).*lowest state of any symm"):
        m = Molecule.from_fcidump(tmp_path / "F")
    assert m.isym == 2 and m.orbsym == (1, 2, 2)
    with pytest.warns(UserWarning, match="ISYM=2"):
        m.to_fcidump(tmp_path / "G")
        m2 = Molecule.from_fcidump(tmp_path / "G")
    assert read_fcidump(tmp_path / "G").isym == 2 and m2.isym == 2
    assert "ISYM=2," in (tmp_path / "G").read_text()


def test_write_refuses_what_the_reader_refuses(tmp_path: Path) -> None:
    h, g = random_integrals(3)
    bad = g.copy()
    bad[0, 1, 2, 2] += 0.1  # (01|22) no longer equals (10|22)
    with pytest.raises(ValueError, match="conflicts with the symmetry-equivalent entry"):
        write_fcidump(tmp_path / "F", h, bad, 2)
    big = h.copy()
    big[0, 0] = 1e308
    with pytest.raises(ValueError, match="exceeds the largest integral magnitude"):
        write_fcidump(tmp_path / "F", big, g, 2)
    with pytest.raises(ValueError, match="isym"):
        write_fcidump(tmp_path / "F", h, g, 2, isym=-1)
    with pytest.raises(ValueError, match="orbsym"):
        write_fcidump(tmp_path / "F", h, g, 2, orbsym=[1, 1.5, 1])
    assert not (tmp_path / "F").exists()
