"""dSB finds known optima; the reported energies, cuts and values agree with the spins."""

from __future__ import annotations

import numpy as np
import pytest
from ising_cases import brute_force, random_model

from cuscikit.ising import DSBSolver, IsingModel, greedy_descent, solve


@pytest.mark.parametrize("field", [False, True])
@pytest.mark.parametrize("kind", ["binary", "ternary", "int8"])
def test_brute_force_optimum(kind, field):
    """Never below the exact minimum; reaches it on (nearly) every instance."""
    hits = 0
    cases = 12
    for k in range(cases):
        m = random_model(kind, 12 + k % 5, seed=100 * k + len(kind), field=field)
        exact = brute_force(m)
        r = solve(m, agents=16, steps=300, seed=k)
        assert r.energy >= exact
        assert m.energy(r.spins) == r.energy
        hits += r.energy == exact
    assert hits >= cases - 1


def test_brute_force_float32_model():
    m = random_model("float32", 14, seed=1, field=True)
    r = solve(m, agents=16, steps=300)
    assert r.energy >= brute_force(m) - 1e-9
    assert r.energy == pytest.approx(brute_force(m), abs=1e-9)
    assert m.energy(r.spins) == pytest.approx(r.energy, abs=1e-5)


@pytest.mark.parametrize("field", [False, True])
def test_mattis_planted_ground_state(field):
    """J = xi xi^T (off the diagonal): ground states +-xi with E0 = -n(n-1)/2 (- n with h = xi)."""
    n = 1000
    xi = np.random.default_rng(8).choice([-1, 1], n)
    J = np.outer(xi, xi)
    np.fill_diagonal(J, 0)
    m = IsingModel(J, xi if field else None)
    assert m.kind == "binary"
    r = solve(m, agents=4, steps=100, seed=1)
    e0 = -n * (n - 1) // 2 - (n if field else 0)
    assert r.energy == e0
    if field:
        assert np.array_equal(r.spins, xi)
    else:
        assert abs(int(r.spins @ xi)) == n


def test_records_consistent():
    m = random_model("ternary", 60, seed=2, field=True)
    r = solve(m, agents=6, steps=80, seed=4)
    h = r.history
    assert len(h) == 81 and h["step"].tolist() == list(range(81))
    assert np.all(np.diff(h["e_best"]) <= 0)
    assert h["e_best"][-1] == r.energy == r.replica_energies.min()
    assert np.all(h["e_min"] >= h["e_best"])
    for b in range(6):
        assert m.energy(r.replica_spins[b]) == r.replica_energies[b]
    assert r.replica_energies[np.argmin(r.replica_energies)] == r.energy


def test_reproducible_and_seed_dependent():
    m = random_model("int8", 80, seed=3)
    a = solve(m, agents=4, steps=50, seed=5)
    b = solve(m, agents=4, steps=50, seed=5)
    c = solve(m, agents=4, steps=50, seed=6)
    assert a.history.tobytes() == b.history.tobytes()
    assert a.history["checksum"].tobytes() != c.history["checksum"].tobytes()


def test_cut_matches_edge_sum():
    nx = pytest.importorskip("networkx")
    G = nx.gnm_random_graph(40, 150, seed=3)
    for u, v in G.edges:
        G[u][v]["weight"] = (u * 7 + v) % 5 - 2
    m = IsingModel.from_networkx(G)
    r = solve(m, agents=8, steps=200, seed=1)
    side = dict(zip(m.labels, r.spins, strict=True))
    cut = sum(d["weight"] for u, v, d in G.edges(data=True) if side[u] != side[v])
    assert r.cut == cut == m.cut(r.spins)
    assert isinstance(r.cut, int)


def test_qubo_and_offsets_round_trip():
    rng = np.random.default_rng(4)
    n = 10
    Q = np.triu(rng.integers(-5, 6, (n, n)))
    m = IsingModel.from_qubo(Q)
    xs = (np.arange(2**n)[:, None] >> np.arange(n)) & 1
    f = np.einsum("ki,ij,kj->k", xs, Q, xs)
    assert [m.value(2 * x - 1) for x in xs[:50]] == list(f[:50])
    r = solve(m, agents=16, steps=300, seed=0)
    assert r.value == f.min()
    assert r.value == int(r.binary @ Q @ r.binary)
    d = IsingModel.from_qubo({("a", "a"): -1, ("a", "b"): 2, ("b", "b"): -1})
    assert solve(d, agents=4, steps=50).value == -1


def test_restarts_time_limit_and_polish():
    m = random_model("ternary", 100, seed=9)
    r = solve(m, agents=4, steps=30, seed=2, restarts=3)
    assert r.restarts == 3 and len(r.history) == 93
    assert r.energy == r.history["e_best"][-1]
    r1 = solve(m, agents=4, steps=30, seed=2, restarts=1)
    assert r.energy <= r1.energy
    t = solve(m, agents=4, steps=30, seed=2, time_limit=0.5)
    assert t.restarts >= 1 and t.wall_s < 5
    p = solve(m, agents=4, steps=30, seed=2, polish=True)
    assert p.energy <= r1.energy and m.energy(p.spins) == p.energy
    s = greedy_descent(m, p.spins)
    assert np.array_equal(s, p.spins)  # already a local minimum
    rows = np.array([greedy_descent(m, x) for x in r.replica_spins])
    assert np.array_equal(greedy_descent(m, r.replica_spins), rows)  # a stack: row by row


def test_solver_object_and_bad_options():
    m = random_model("binary", 20, seed=1)
    s = DSBSolver(agents=4, steps=30)
    assert s.kernel(m) == s.result.energy
    s.stpes = 10
    with pytest.raises(AttributeError, match="did you mean 'steps'"):
        s.kernel(m)
    for bad in (
        {"agents": 0},
        {"steps": -1},
        {"dt": float("nan")},
        {"seed": -1},
        {"device": "tpu"},
        {"time_limit": 0},
    ):
        with pytest.raises(ValueError):
            solve(m, **bad)
    with pytest.raises(ValueError, match="IsingModel"):
        solve(np.zeros((3, 3)))
