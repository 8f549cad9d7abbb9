"""Bundled datasets: loading, metadata, reference energies."""

from __future__ import annotations

import shutil

import pytest

from cuscikit.chem import Molecule, UnknownDatasetError, list_datasets
from cuscikit.chem.datasets import (
    dataset_fcidump_path,
    dataset_metadata,
    dataset_slug,
    datasets_dir,
)
from cuscikit.chem.molecule import aufbau_energy

# FCI energies of the NNQS benchmark set (STO-3G, all electron, RHF orbitals), as published
TABLE = {
    "LiH": -7.78446028,
    "H2O": -75.01553019,
    "N2": -107.66020642,
    "C2": -74.69078192,
    "LiF": -105.16617206,
    "LiCl": -460.84961818,
    "Li2O": -87.89269325,
}
QUBITS = {
    "LiH": 12,
    "H2O": 14,
    "N2": 20,
    "C2": 20,
    "LiF": 20,
    "LiCl": 28,
    "Li2O": 30,
    "C2H4O": 38,
    "H2O/cc-pVDZ": 48,
    "N2/cc-pVDZ": 56,
    "Cr2/SV": 84,
}


@pytest.mark.parametrize("name", list_datasets())
def test_dataset_loads(name: str) -> None:
    mol = Molecule.load(name)
    meta = mol.metadata
    assert meta["name"] == name == mol.name
    assert mol.norb == meta["norb"] and list(mol.nelec) == meta["nelec"]
    assert abs(aufbau_energy(mol.h1e, mol.eri, mol.nelec, mol.e_core) - meta["e_hf"]) < 1e-8
    assert abs(mol.e_hf - meta["e_hf"]) < 1e-8
    if name in QUBITS:
        assert 2 * mol.norb == QUBITS[name]
    ref = meta["reference"]
    assert set(ref) >= {"energy", "method", "source"}
    if ref["energy"] is not None:
        assert ref["energy"] < meta["e_hf"]
    assert meta["orbitals"] in ("RHF canonical", "ROHF canonical") and meta["pyscf_version"]
    assert mol.orbsym is not None and len(mol.orbsym) == mol.norb


@pytest.mark.parametrize("name", list(TABLE))
def test_sto3g_reference_matches_table(name: str) -> None:
    ref = dataset_metadata(name)["reference"]["energy"]
    assert abs(round(ref, 8) - TABLE[name]) < 1e-12


@pytest.mark.parametrize("name", ["LiH", "H2O", "N2"])
def test_fci_reproduces_reference(name: str) -> None:
    pytest.importorskip("pyscf")  # Molecule.fci() is PySCF's solver
    mol = Molecule.load(name)
    assert abs(mol.fci() - mol.metadata["reference"]["energy"]) < 1e-9


@pytest.mark.slow
@pytest.mark.parametrize("name", ["C2", "LiF", "LiCl"])
def test_fci_reproduces_reference_slow(name: str) -> None:
    pytest.importorskip("pyscf")
    mol = Molecule.load(name)
    assert abs(mol.fci() - mol.metadata["reference"]["energy"]) < 1e-9


@pytest.mark.parametrize(
    ("alias", "slug"),
    [
        ("n2", "n2_sto3g"),
        ("N2", "n2_sto3g"),
        ("N2/cc-pvdz", "n2_ccpvdz"),
        ("n2_ccpvdz", "n2_ccpvdz"),
        ("N2-cc-pVDZ", "n2_ccpvdz"),
        ("Cr2", "cr2_sv"),
        ("cr2/sv", "cr2_sv"),
        ("LICL", "licl_sto3g"),
        ("c2h4o", "c2h4o_sto3g"),
        ("h2o_sto3g", "h2o_sto3g"),
    ],
)
def test_lookup_is_tolerant(alias: str, slug: str) -> None:
    assert dataset_slug(alias) == slug
    assert dataset_fcidump_path(alias).name == f"{slug}.fcidump.gz"


def test_unknown_dataset() -> None:
    with pytest.raises(UnknownDatasetError, match="available: LiH, H2O") as info:
        Molecule.load("benzene")
    assert isinstance(info.value, KeyError)
    assert "Cr2/SV" in str(info.value)


def test_env_var_overrides_folder(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    real = datasets_dir()
    monkeypatch.setenv("CUSCIKIT_DATASETS", str(tmp_path))
    assert datasets_dir() == tmp_path
    with pytest.raises(FileNotFoundError, match="index.json"):
        dataset_metadata("LiH")
    shutil.copy(real / "index.json", tmp_path / "index.json")  # the index, not the files
    with pytest.raises(FileNotFoundError, match="lih_sto3g"):
        dataset_metadata("LiH")
    monkeypatch.delenv("CUSCIKIT_DATASETS")
    assert datasets_dir() == real


def test_every_file_matches_its_checksum_and_a_damaged_one_is_refused(tmp_path, monkeypatch):
    from cuscikit.lib.datasets import data_path, entries, sha256_of

    folder = datasets_dir()
    listed = set()
    for d in entries():
        for f in d.files.values():
            assert sha256_of(folder / f) == d.sha256[f], f
            listed.add(f)
    on_disk = {p.name for p in folder.iterdir() if p.suffix in (".gz", ".json")}
    assert on_disk - {"index.json"} == listed  # no unlisted data, no missing files
    for f in ("index.json", "lih_sto3g.json", "lih_sto3g.fcidump.gz"):
        shutil.copy(folder / f, tmp_path / f)
    raw = bytearray((tmp_path / "lih_sto3g.fcidump.gz").read_bytes())
    raw[len(raw) // 2] ^= 0x01  # one flipped bit
    (tmp_path / "lih_sto3g.fcidump.gz").write_bytes(bytes(raw))
    monkeypatch.setenv("CUSCIKIT_DATASETS", str(tmp_path))
    with pytest.raises(ValueError, match="damaged"):
        data_path("LiH")
    with pytest.raises(ValueError, match="damaged"):
        Molecule.load("LiH")


def test_datasets_folder_is_small() -> None:
    total = sum(p.stat().st_size for p in datasets_dir().iterdir() if p.is_file())
    assert total < 15 * 2**20
