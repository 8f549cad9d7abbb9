"""The command line: JSON output, exact energies and clear errors."""

import json
import subprocess
import sys

import pytest

from cuscikit.cli import main


def run_json(capsys, *argv) -> dict:
    assert main(list(argv)) == 0
    out = capsys.readouterr().out.strip().splitlines()
    return json.loads(out[-1])


def test_info(capsys):
    info = run_json(capsys, "info", "--json")
    assert info["extension"]["max_words"] == 4
    assert info["extension"]["max_threads"] >= 1
    assert "openmp" in info["extension"]["flags"].lower()


def test_fci_on_dataset(capsys):
    r = run_json(capsys, "fci", "H2O", "--json")
    assert r["n_det"] == 441
    assert abs(r["e_tot"] - r["e_reference"]) < 1e-9


def test_fcidump_then_fci_roots(capsys, tmp_path):
    pytest.importorskip("pyscf")
    out = tmp_path / "lih.fcidump"
    r = run_json(
        capsys,
        "fcidump",
        "--atom",
        "Li 0 0 0; H 0 0 1.6",
        "--basis",
        "sto-3g",
        "-o",
        str(out),
        "--json",
    )
    assert out.exists() and r["norb"] == 6
    r2 = run_json(capsys, "fci", str(out), "--nroots", "3", "--json")
    from pyscf import fci, gto, scf

    mol = gto.M(atom="Li 0 0 0; H 0 0 1.6", basis="sto-3g", verbose=0)
    ref = fci.FCI(scf.RHF(mol).run(conv_tol=1e-12))
    ref.nroots = 3
    ref.conv_tol = 1e-12
    e_ref = sorted(ref.kernel()[0])
    assert r2["energies"] == pytest.approx(e_ref, abs=1e-9)


def test_fcidump_frozen_core_and_cas(capsys, tmp_path):
    pytest.importorskip("pyscf")
    out = tmp_path / "n2cas.fcidump.gz"
    r = run_json(
        capsys,
        "fcidump",
        "--atom",
        "N 0 0 0; N 0 0 1.1",
        "--frozen-core",
        "--cas",
        "6",
        "6",
        "-o",
        str(out),
        "--json",
    )
    assert r["norb"] == 6 and r["nelec"] == [3, 3]
    assert run_json(capsys, "fci", str(out), "--json")["n_det"] == 400


@pytest.mark.parametrize(
    "argv, message",
    [
        (["fci", "NoSuchMolecule"], "neither a file nor a bundled dataset"),
        (["fci", "LiH", "--nroots", "0"], "--nroots"),
        (["fci", "C2H4O"], "--max-det"),
    ],
)
def test_bad_input_gives_one_line_and_status_2(capsys, argv, message):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_malformed_fcidump_file(capsys, tmp_path):
    bad = tmp_path / "bad.fcidump"
    bad.write_text("&FCI NORB=2, NELEC=2, MS2=0,\n&END\n 1.0 1 1 1 1\n 0.5 3 3 0 0\n")
    assert main(["fci", str(bad)]) == 2
    assert "error" in capsys.readouterr().err


def test_module_entry_point():
    r = subprocess.run(
        [sys.executable, "-m", "cuscikit", "fci", "LiH", "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(r.stdout.strip().splitlines()[-1])["n_det"] == 225
