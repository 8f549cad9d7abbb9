"""`cuscikit guga`: energies in the JSON report, DRT sizes, and one-line errors."""

from __future__ import annotations

import json

import numpy as np

from cuscikit.cli import main
from cuscikit.sci import FCI


def _json(capsys, *argv) -> tuple[int, dict]:
    rc = main(list(argv))
    out = capsys.readouterr().out.strip().splitlines()
    return rc, json.loads(out[-1])


def test_guga_singlet_and_triplet_energies(capsys):
    from cuscikit import Molecule

    mol = Molecule.load("H2O")
    rc, r = _json(capsys, "guga", "H2O", "--nroots", "2", "--json")
    assert rc == 0 and r["status"] == "ok" and r["n_csf"] == 196 and r["wall_s"] > 0
    rc, t = _json(capsys, "guga", "H2O", "--spin", "2", "--json")
    assert rc == 0 and t["n_csf"] == 210
    # the determinant FCI's roots, sorted by spin
    fci = FCI(mol, nroots=6, conv_tol=1e-12)
    e, vecs = fci.kernel()
    ss = np.array([fci.spin_square(v, mol.norb, mol.nelec)[0] for v in vecs])
    singlets, triplets = e[np.abs(ss) < 1e-6], e[np.abs(ss - 2) < 1e-6]
    np.testing.assert_allclose(r["e_tot"], singlets[:2], atol=1e-9)
    np.testing.assert_allclose(t["e_tot"], triplets[:1], atol=1e-9)


def test_guga_drt_sizes_and_errors(capsys):
    rc, r = _json(capsys, "guga", "--drt", "10", "10", "2", "--json")
    assert rc == 0 and r["n_csf"] == 29700
    rc, r = _json(capsys, "guga", "--drt", "4", "4", "1", "--json")
    assert rc == 2 and r["status"] == "error" and "impossible" in r["error"]
    rc, r = _json(capsys, "guga", "H2O", "--spin", "1", "--json")
    assert rc == 2 and "impossible" in r["error"]
