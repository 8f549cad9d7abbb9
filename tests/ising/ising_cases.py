"""Random instances shared by the Ising tests."""

from __future__ import annotations

import numpy as np

from cuscikit.ising import IsingModel


def random_model(kind: str, n: int, seed: int, field: bool = False) -> IsingModel:
    """A random symmetric J of the given storage kind (and a small integer field)."""
    rng = np.random.default_rng(seed)
    if kind == "binary":
        J = (2 * rng.integers(0, 2, (n, n), dtype=np.int8) - 1).astype(np.int8)
    elif kind == "ternary":
        J = rng.integers(-1, 2, (n, n), dtype=np.int8)
    elif kind == "int8":
        J = rng.integers(-127, 128, (n, n), dtype=np.int8)
    else:
        J = rng.normal(size=(n, n))
    J = np.triu(J, 1)
    J = J + J.T
    h = None
    if field:
        h = rng.integers(-3, 4, n) if kind != "float32" else rng.normal(size=n)
    m = IsingModel(J, h)
    assert n < 3 or m.kind == kind or (kind == "ternary" and m.kind == "binary"), m.kind
    return m


def brute_force(model: IsingModel) -> int:
    """The exact minimum energy by enumeration (n <= 20)."""
    n = model.n
    best = None
    J = model.J.toarray()
    h = model.h
    for start in range(0, 2**n, 1 << 14):
        idx = np.arange(start, min(2**n, start + (1 << 14)), dtype=np.int64)
        s = 1 - 2 * ((idx[:, None] >> np.arange(n)) & 1)
        e = -0.5 * np.einsum("ki,ij,kj->k", s, J, s) - s @ h
        m = e.min()
        best = m if best is None else min(best, m)
    return best
