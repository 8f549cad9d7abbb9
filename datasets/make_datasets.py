"""Regenerate the bundled datasets: gzipped FCIDUMP + JSON metadata with reference energies.

Usage::

    python datasets/make_datasets.py            # all datasets
    python datasets/make_datasets.py LiH N2     # only these (any spelling list_datasets accepts)

Each system: PySCF RHF (or ROHF) converged with every strategy of ``Molecule(thorough_scf=True)``
in point-group symmetry, all electrons, all orbitals, canonical RHF orbitals. Reference energy:
PySCF FCI (``direct_spin1``, 3 roots, lowest) when the FCI space has at most ``FCI_MAX_DETS``
determinants; otherwise a literature value (docs/conventions.md), checked against PySCF CCSD(T).
"""

from __future__ import annotations

import datetime
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # run from a source checkout without installing

from cuscikit.chem.datasets import dataset_slug  # noqa: E402
from cuscikit.chem.molecule import Molecule, aufbau_energy  # noqa: E402
from cuscikit.lib.datasets import record  # noqa: E402

FCI_MAX_DETS = 2_000_000
ALGO = "literature FCI value of the NNQS benchmark set (docs/conventions.md)"
NNQS_GEOM = "NNQS STO-3G benchmark-set geometry (docs/conventions.md)"

# Ethylene oxide: gas-phase microwave r_s structure (C. Hirose, Bull. Chem. Soc. Jpn. 47, 1311
# (1974)): r(CC) 1.466, r(CO) 1.431, r(CH) 1.085 A, angle HCH 116.6 deg, CH2 plane tilted so
# that the HCH bisector makes 158.0 deg with the C-C bond. Built in C2v below.
_C2H4O_PARAMS = {"rCC": 1.466, "rCO": 1.431, "rCH": 1.085, "aHCH": 116.6, "aBisCC": 158.0}


def _c2h4o_atoms() -> list[tuple[str, tuple[float, float, float]]]:
    import math

    p = _C2H4O_PARAMS
    x = p["rCC"] / 2
    z_o = math.sqrt(p["rCO"] ** 2 - x**2)
    # HCH bisector in the xz plane, pointing away from the ring (negative z, outward in x)
    tilt = math.radians(180.0 - p["aBisCC"])  # angle of the bisector below the -x/+x axis
    half = math.radians(p["aHCH"] / 2)
    atoms: list[tuple[str, tuple[float, float, float]]] = [("O", (0.0, 0.0, z_o))]
    for sgn in (1.0, -1.0):
        atoms.append(("C", (sgn * x, 0.0, 0.0)))
    for sgn in (1.0, -1.0):
        bx, bz = sgn * math.cos(tilt), -math.sin(tilt)
        for ys in (1.0, -1.0):
            h = (
                sgn * x + p["rCH"] * math.cos(half) * bx,
                ys * p["rCH"] * math.sin(half),
                p["rCH"] * math.cos(half) * bz,
            )
            atoms.append(("H", tuple(round(c, 6) for c in h)))
    return atoms


BOHR_N2 = 2.118
SYSTEMS: dict[str, dict] = {
    "LiH": dict(atom=[("Li", (3, 0, 0)), ("H", (2, 0, 0))], basis="sto-3g", geom=NNQS_GEOM),
    "H2O": dict(
        atom=[
            ("O", (0, 0, 0)),
            ("H", (0.2774, 0.8929, 0.2544)),
            ("H", (0.6068, -0.2383, -0.7169)),
        ],
        basis="sto-3g",
        geom=NNQS_GEOM,
    ),
    "N2": dict(atom=[("N", (0.556, 0, 0)), ("N", (-0.556, 0, 0))], basis="sto-3g", geom=NNQS_GEOM),
    "C2": dict(atom=[("C", (0.63, 0, 0)), ("C", (-0.63, 0, 0))], basis="sto-3g", geom=NNQS_GEOM),
    "LiF": dict(atom=[("F", (3, 0, 0)), ("Li", (2, 0, 0))], basis="sto-3g", geom=NNQS_GEOM),
    "LiCl": dict(atom=[("Cl", (3, 0, 0)), ("Li", (2, 0, 0))], basis="sto-3g", geom=NNQS_GEOM),
    "Li2O": dict(
        atom=[("O", (2.866, -0.25, 0)), ("Li", (3.732, 0.25, 0)), ("Li", (2, 0.25, 0))],
        basis="sto-3g",
        geom=NNQS_GEOM,
        literature=(-87.89269325, "FCI", ALGO),
    ),
    "C2H4O": dict(
        atom=_c2h4o_atoms(),
        basis="sto-3g",
        geom=(
            "experimental gas-phase r_s structure, C. Hirose, Bull. Chem. Soc. Jpn. 47, 1311 "
            f"(1974), parameters {_C2H4O_PARAMS} (A, deg), C2v; parameters quoted from memory of "
            "the CCCBDB listing, not re-verified"
        ),
        literature=None,
    ),
    "H2O/cc-pVDZ": dict(
        atom=[
            ("O", (0, 0, 0)),
            ("H", (0.2774, 0.8929, 0.2544)),
            ("H", (0.6068, -0.2383, -0.7169)),
        ],
        basis="cc-pvdz",
        geom="the geometry of the bundled STO-3G H2O",
        literature=(-76.2424840428, "FCI", "literature FCI value (docs/conventions.md)"),
    ),
    "N2/cc-pVDZ": dict(
        atom=[("N", (0, 0, BOHR_N2 / 2)), ("N", (0, 0, -BOHR_N2 / 2))],
        unit="Bohr",
        basis="cc-pvdz",
        geom=f"R(N-N) = {BOHR_N2} bohr, the geometry of the CDFCI reference",
        literature=(
            -109.2821727,
            "CDFCI",
            "literature CDFCI value, all-electron, R = 2.118 bohr (docs/conventions.md)",
        ),
    ),
    "C2/cc-pVDZ": dict(
        atom=[("C", (0, 0, 0.63)), ("C", (0, 0, -0.63))],
        basis="cc-pvdz",
        geom="R(C-C) = 1.26 A (as the STO-3G C2)",
        literature=None,
    ),
    # Strongly correlated and open-shell cases for the NNQS accuracy set.
    "N2-stretched": dict(
        atom=[("N", (1.0, 0, 0)), ("N", (-1.0, 0, 0))],
        basis="sto-3g",
        geom="R(N-N) = 2.0 A: stretched, multireference",
    ),
    "H8-chain": dict(
        atom=[("H", (0, 0, 1.5 * k)) for k in range(8)],
        basis="sto-3g",
        geom="linear chain of 8 H atoms, 1.5 A apart: strongly correlated",
    ),
    "O2-triplet": dict(
        atom=[("O", (0, 0, 0.605)), ("O", (0, 0, -0.605))],
        basis="sto-3g",
        spin=2,
        geom="R(O-O) = 1.21 A, triplet ground state (ROHF orbitals)",
    ),
    "Cr2/SV": dict(
        atom=[("Cr", (0, 0, 0.75)), ("Cr", (0, 0, -0.75))],
        basis="Ahlrichs VDZ",
        geom="R(Cr-Cr) = 1.50 A",
        literature=(-2086.44456, "SHCI", "literature SHCI value (docs/conventions.md)"),
    ),
}


def _ccsd_t(mol: Molecule) -> dict:
    from pyscf import cc

    t0 = time.time()
    mycc = cc.CCSD(mol.scf)
    mycc.verbose = 0
    mycc.conv_tol = 1e-9
    mycc.max_cycle = 300
    mycc.kernel()
    e_t = mycc.ccsd_t() if mycc.converged else float("nan")
    return {
        "method": "CCSD(T) on the RHF reference (PySCF)",
        "energy": float(mycc.e_tot + e_t),
        "ccsd_energy": float(mycc.e_tot),
        "converged": bool(mycc.converged),
        "seconds": round(time.time() - t0, 1),
    }


def make(name: str) -> dict:
    """Build one dataset; write ``<slug>.fcidump.gz`` and ``<slug>.json`` next to this script."""
    import pyscf

    spec = SYSTEMS[name]
    slug = dataset_slug(name)
    t0 = time.time()
    mol = Molecule(
        spec["atom"],
        basis=spec["basis"],
        unit=spec.get("unit", "Angstrom"),
        spin=spec.get("spin", 0),
        symmetry=True,
        thorough_scf=True,
        name=name,
    )
    e_check = aufbau_energy(mol.h1e, mol.eri, mol.nelec, mol.e_core)
    if abs(e_check - mol.e_scf) > 1e-8:
        raise RuntimeError(f"{name}: aufbau energy {e_check} != SCF energy {mol.e_scf}")
    tol = 1e-13 if mol.norb > 20 else 1e-15
    fcidump = HERE / f"{slug}.fcidump.gz"
    mol.to_fcidump(fcidump, tol=tol)

    notes = []
    checks: dict = {}
    if mol.n_determinants <= FCI_MAX_DETS:
        e_fci = mol.fci(nroots=3)
        reference = {
            "energy": e_fci,
            "method": "FCI",
            "source": f"PySCF {pyscf.__version__} fci.direct_spin1, nroots=3, lowest root, "
            "conv_tol 1e-12 (computed by make_datasets.py)",
        }
    else:
        lit = spec.get("literature")
        checks["ccsd_t"] = _ccsd_t(mol)
        if lit is None:
            reference = {"energy": None, "method": None, "source": None}
            notes.append(
                "no exact or literature reference energy is bundled for this system and "
                "geometry; the CCSD(T) energy in checks is only a sanity value"
            )
        else:
            reference = {"energy": lit[0], "method": lit[1], "source": lit[2]}
            diff = (checks["ccsd_t"]["energy"] - lit[0]) * 1e3
            checks["ccsd_t"]["minus_reference_mHa"] = round(diff, 3)
            verdict = "within" if abs(diff) < 5 else "NOT within"
            notes.append(
                f"CCSD(T) - reference = {diff:+.2f} mHa: {verdict} a few mHa of the reference"
                + (
                    "; geometry and basis likely match"
                    if abs(diff) < 5
                    else "; CCSD(T) is unreliable here or the geometry/basis differ"
                )
            )

    meta = {
        "name": name,
        "slug": slug,
        "formula": mol.mol.formula if hasattr(mol.mol, "formula") else name.split("/")[0],
        "geometry": {
            "atoms": [[s, [float(c) for c in xyz]] for s, xyz in spec["atom"]],
            "unit": spec.get("unit", "Angstrom"),
            "source": spec["geom"],
        },
        "basis": spec["basis"],
        "charge": 0,
        "spin": spec.get("spin", 0),
        "norb": mol.norb,
        "nelec": list(mol.nelec),
        "n_electrons": mol.n_electrons,
        "n_qubits": 2 * mol.norb,
        "n_determinants": mol.n_determinants,
        "frozen_core": 0,
        "orbitals": "ROHF canonical" if spec.get("spin", 0) else "RHF canonical",
        "point_group": mol.mol.groupname,
        "orbsym_convention": "Molpro irrep numbers (as pyscf.tools.fcidump ORBSYM_MAP)",
        "scf": {"strategy": mol.scf.scf_strategy, "internally_stable": mol.scf.scf_stable},
        "e_hf": mol.e_scf,
        "e_core": mol.e_core,
        "reference": reference,
        "checks": checks,
        "notes": "; ".join(notes),
        "fcidump": fcidump.name,
        "integral_threshold": tol,
        "pyscf_version": pyscf.__version__,
        "date": datetime.date.today().isoformat(),
        "generator": "datasets/make_datasets.py",
        "seconds": round(time.time() - t0, 1),
    }
    meta["formula"] = name.split("/")[0]
    (HERE / f"{slug}.json").write_text(json.dumps(meta, indent=2) + "\n")
    record(
        name,
        "molecule",
        slug,
        {"data": fcidump.name, "meta": f"{slug}.json"},
        f"{meta['formula']} {meta['basis']}, {meta['norb']} orbitals, "
        f"{meta['n_electrons']} electrons",
    )
    return meta


def main(argv: list[str]) -> None:
    slugs = {dataset_slug(a) for a in argv}
    names = [n for n in SYSTEMS if not slugs or dataset_slug(n) in slugs]
    for name in names:
        meta = make(name)
        ref = meta["reference"]["energy"]
        print(
            f"{name:12s} norb={meta['norb']:3d} nelec={meta['n_electrons']:3d} "
            f"e_hf={meta['e_hf']:.10f} ref={ref} ({meta['reference']['method']}) "
            f"{meta['seconds']}s {meta['notes']}",
            flush=True,
        )


if __name__ == "__main__":
    main(sys.argv[1:])
