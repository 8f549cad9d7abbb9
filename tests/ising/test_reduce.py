"""The exact degree <= 2 reduction (`cuscikit.ising.reduce`) and `solve(..., reduce=...)`."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from cuscikit.ising import IsingModel, solve
from cuscikit.ising.reduce import reduce_model


def sparse_graph(n: int, m: int, seed: int, weights=(1,)) -> IsingModel:
    """A random simple graph with n vertices and about m edges (MAX-CUT model)."""
    rng = np.random.default_rng(seed)
    edges = {}
    for _ in range(m):
        i, j = (int(v) for v in rng.choice(n, 2, replace=False))
        edges[(min(i, j), max(i, j))] = int(rng.choice(weights))
    return IsingModel.from_edges(n, [(i, j, w) for (i, j), w in edges.items()])


def all_spins(n: int) -> np.ndarray:
    return np.array(list(itertools.product([-1, 1], repeat=n)), np.int8)


@pytest.mark.parametrize("seed", range(40))
def test_kernel_minimum_and_expansion_are_exact(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 12))
    m = sparse_graph(n, int(rng.integers(1, 2 * n)), seed, weights=(-3, -1, 1, 2, 5))
    red = reduce_model(m)
    assert red.model.n <= n and red.model.exact
    K = all_spins(red.model.n)
    # every kernel vector expands to a model vector with exactly kernel energy + constant ...
    expanded = red.expand(K)
    assert np.array_equal(m.energy(expanded), red.model.energy(K) + red.constant)
    assert np.array_equal(expanded[:, red.kept], K)
    # ... so the kernel's minimum is the model's (brute force)
    assert red.model.energy(K).min() + red.constant == m.energy(all_spins(n)).min()


def test_reduction_leaves_degree_three_or_more():
    m = sparse_graph(3000, 3000, seed=1)
    red = reduce_model(m)
    deg = red.model.J.getnnz(axis=1)
    assert red.model.n < 3000 // 2 and deg.min() >= 3
    assert red.model.kind == "ternary"
    rng = np.random.default_rng(2)
    K = rng.choice(np.array([-1, 1], np.int8), (5, red.model.n))
    assert np.array_equal(m.energy(red.expand(K)), red.model.energy(K) + red.constant)


def test_dense_model_is_not_reduced_by_auto():
    m = IsingModel.from_edges(5, [(i, j, 1) for i in range(5) for j in range(i + 1, 5)])
    assert solve(m, agents=4, steps=20).kernel_n is None
    assert reduce_model(m).model.n == 5  # nothing has degree <= 2


def test_field_is_refused():
    m = IsingModel(np.array([[0, 1], [1, 0]]), h=[1, 0])
    with pytest.raises(ValueError, match="without field"):
        reduce_model(m)
    with pytest.raises(ValueError, match="without field"):
        solve(m, agents=2, steps=5, reduce=True)
    with pytest.raises(ValueError, match="reduce must be"):
        solve(m, agents=2, steps=5, reduce="yes")
    assert solve(m, agents=2, steps=5).kernel_n is None  # auto: no reduction with a field


def test_solve_on_kernel_matches_kernel_run():
    m = sparse_graph(2000, 2000, seed=4)
    r = solve(m, agents=16, steps=200, seed=9, device="cpu", polish=True)
    red = reduce_model(m)
    assert r.kernel_n == red.model.n < 1000  # auto picked the kernel
    k = solve(red.model, agents=16, steps=200, seed=9, device="cpu", reduce=False)
    assert np.array_equal(r.history["checksum"], k.history["checksum"])
    assert np.array_equal(r.history["e_best"], k.history["e_best"] + red.constant)
    assert r.replica_spins.shape == (16, 2000)
    assert np.array_equal(m.energy(r.replica_spins), r.replica_energies)
    assert m.energy(r.spins) == r.energy <= k.energy + red.constant
    assert r.cut == m.cut(r.spins)
    off = solve(m, agents=16, steps=200, seed=9, device="cpu", reduce=False)
    assert off.kernel_n is None and off.replica_spins.shape == (16, 2000)


@pytest.mark.gpu
def test_gpu_reduced_solve_equals_cpu():
    m = sparse_graph(5000, 5000, seed=6)
    a = solve(m, agents=64, steps=300, seed=5, device="cpu", restarts=2)
    b = solve(m, agents=64, steps=300, seed=5, device="cuda", restarts=2)
    assert a.kernel_n == b.kernel_n is not None
    assert a.history.tobytes() == b.history.tobytes()
    assert a.spins.tobytes() == b.spins.tobytes() and a.energy == b.energy
    assert a.x.tobytes() == b.x.tobytes() and a.y.tobytes() == b.y.tobytes()
