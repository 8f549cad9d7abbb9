"""IsingModel: storage kinds, energies and constants, the G-set parser and input validation."""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from cuscikit.ising import IsingModel

GSET = Path(os.environ.get("CUSCIKIT_GSET_DIR", "/nonexistent"))  # the G-set folder


def _write(tmp_path, text, name="g.txt"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_kinds():
    J = np.array([[0, 1, -1], [1, 0, 1], [-1, 1, 0]])
    assert IsingModel(J).kind == "binary"
    J[0, 2] = J[2, 0] = 0
    assert IsingModel(J).kind == "ternary"
    assert IsingModel(5 * J).kind == "int8"
    assert IsingModel(200 * J).kind == "float32"
    assert IsingModel(0.5 * J).kind == "float32"
    assert IsingModel(J, h=[0.5, 0, 0]).kind == "float32"
    assert IsingModel(sp.csr_matrix(J)).kind == "ternary"


def test_energy_against_definition():
    rng = np.random.default_rng(0)
    J = np.triu(rng.integers(-9, 10, (7, 7)), 1)
    J = J + J.T
    h = rng.integers(-4, 5, 7)
    m = IsingModel(J, h, offset=3)
    for _ in range(5):
        s = rng.choice([-1, 1], 7)
        e = -0.5 * s @ J @ s - h @ s
        assert m.energy(s) == e and isinstance(m.energy(s), int)
        assert m.value(s) == e + 3
    S = rng.choice([-1, 1], (4, 7))
    assert np.array_equal(m.energy(S), [m.energy(s) for s in S])


def test_maxcut_offset_and_cut():
    m = IsingModel.from_edges(4, [(0, 1, 3), (1, 2, -2), (2, 3, 5), (0, 3, 1)])
    assert m.offset == -7 and m.scale == -2
    s = np.array([1, -1, -1, 1])  # cuts (0,1) and (2,3)
    assert m.cut(s) == 8
    assert m.energy(s) == 7 - 2 * 8
    with pytest.raises(ValueError, match="graph"):
        IsingModel(np.zeros((2, 2))).cut([1, 1])


def test_networkx_labels():
    nx = pytest.importorskip("networkx")
    G = nx.Graph()
    G.add_edge("u", "v", weight=2)
    G.add_edge("v", "w")
    m = IsingModel.from_networkx(G)
    assert m.labels == ["u", "v", "w"] and m.cut([1, -1, 1]) == 3
    G.add_edge("w", "w")
    with pytest.raises(ValueError, match="self-loop"):
        IsingModel.from_networkx(G)
    with pytest.raises(ValueError, match="multigraph"):
        IsingModel.from_networkx(nx.MultiGraph([(0, 1), (0, 1)]))


def test_gset_file(tmp_path):
    p = _write(tmp_path, "4 3\n1 2 1\n2 3 -1\n3 4 1\n")
    m = IsingModel.from_gset(p)
    assert m.n == 4 and m.J.nnz == 6 and m.cut([1, -1, 1, -1]) == 1
    gz = tmp_path / "g.txt.gz"
    gz.write_bytes(gzip.compress(b"3 1\r\n1 3 2\r\n"))
    assert IsingModel.from_gset(gz).cut([1, 1, -1]) == 2


@pytest.mark.skipif(
    not (GSET / "G1.txt.gz").exists(), reason="set CUSCIKIT_GSET_DIR to the G-set folder"
)
def test_gset_g1():
    m = IsingModel.from_gset(GSET / "G1.txt.gz")
    assert m.n == 800 and m.J.nnz == 2 * 19176 and m.offset == -19176
    assert m.kind == "ternary"


@pytest.mark.parametrize(
    "text,match",
    [
        ("", "empty"),
        ("4\n1 2 1\n", "first line"),
        ("four 1\n1 2 1\n", "first line"),
        ("4 2\n1 2 1\n", "says 2 edges"),
        ("4 1\n1 2\n", "must be 'i j w'"),
        ("4 1\n1 2 1.5\n", "integers"),
        ("4 1\n1 5 1\n", "out of range"),
        ("4 1\n0 2 1\n", "out of range"),
        ("4 1\n2 2 1\n", "self-loop"),
        ("4 2\n1 2 1\n2 1 3\n", "conflicting"),
        ("4 2\n1 2 1\n1 2 1\n", "twice"),
    ],
)
def test_gset_bad_files(tmp_path, text, match):
    with pytest.raises(ValueError, match=match):
        IsingModel.from_gset(_write(tmp_path, text))


@pytest.mark.parametrize(
    "J,h,match",
    [
        (np.array([[0, 1], [2, 0]]), None, "not symmetric"),
        (np.array([[1, 1], [1, 0]]), None, "diagonal"),
        (np.array([[0, np.nan], [np.nan, 0]]), None, "NaN"),
        (np.zeros((2, 3)), None, "square"),
        (np.zeros(3), None, "2-D"),
        (np.zeros((2, 2)), [1, 2, 3], "shape"),
        (np.zeros((2, 2)), [np.inf, 0], "NaN or infinite"),
        (np.array([["a", "b"], ["c", "d"]]), None, "numeric"),
    ],
)
def test_bad_models(J, h, match):
    with pytest.raises(ValueError, match=match):
        IsingModel(J, h)


def test_edges_validation():
    with pytest.raises(ValueError, match="out of range"):
        IsingModel.from_edges(3, [(0, 3, 1)])
    with pytest.raises(ValueError, match="conflicting"):
        IsingModel.from_edges(3, [(0, 1, 1), (1, 0, 2)])
    with pytest.raises(ValueError, match="NaN"):
        IsingModel.from_edges(3, [(0, 1, np.nan)])


def test_memory_budget_refused_with_size():
    J = sp.diags([np.ones(2999), np.ones(2999)], [1, -1], dtype=np.int64)  # a path
    with pytest.raises(ValueError, match=r"need 2\.2 MiB as ternary.*limit of 2\.0 MiB"):
        IsingModel(J, max_bytes=2**21)
    huge = sp.csr_matrix((10**6, 10**6), dtype=np.int64)  # refused before any conversion
    with pytest.raises(ValueError, match=r"at least 116\.4 GiB \(n = 1000000\)"):
        IsingModel(huge)


def test_qubo_matrix_and_dict_agree():
    Q = np.array([[1, -2, 0], [0, -1, 3], [0, 0, 2]])
    a = IsingModel.from_qubo(Q)
    b = IsingModel.from_qubo({(i, j): Q[i, j] for i in range(3) for j in range(3) if Q[i, j]})
    for x in np.ndindex(2, 2, 2):
        x = np.array(x)
        assert a.value(2 * x - 1) == b.value(2 * x - 1) == x @ Q @ x
    with pytest.raises(ValueError, match="square"):
        IsingModel.from_qubo(np.zeros((2, 3)))
