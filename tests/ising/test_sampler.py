"""The dimod sampler (skipped without dimod, except under CI, where the test extras install it)."""

from __future__ import annotations

import os

import numpy as np
import pytest

try:
    import dimod
except ImportError:
    if os.environ.get("CI"):
        raise  # a missing test extra, not a reason to skip
    pytest.skip("needs dimod", allow_module_level=True)

from cuscikit.ising import DSBSampler, IsingModel  # noqa: E402


def test_sample_ising_energies_and_reads():
    rng = np.random.default_rng(1)
    h = {i: int(rng.integers(-2, 3)) for i in range(12)}
    J = {(i, j): int(rng.integers(-2, 3)) for i in range(12) for j in range(i + 1, 12)}
    ss = DSBSampler().sample_ising(h, J, num_reads=8, steps=300, seed=2)
    assert len(ss) == 8
    bqm = dimod.BinaryQuadraticModel.from_ising(h, J)
    assert np.allclose(ss.record.energy, bqm.energies(ss))
    exact = dimod.ExactSolver().sample(bqm).first.energy
    assert ss.first.energy == exact


def test_sample_qubo_with_offset():
    Q = {("x", "x"): -3, ("y", "y"): 2, ("x", "y"): 4, ("z", "z"): -1, ("y", "z"): -5}
    bqm = dimod.BinaryQuadraticModel.from_qubo(Q, offset=7)
    ss = DSBSampler().sample(bqm, num_reads=4, steps=100)
    exact = dimod.ExactSolver().sample(bqm).first
    assert ss.first.energy == exact.energy
    m = IsingModel.from_bqm(bqm)
    s = np.array([2 * ss.first.sample[v] - 1 for v in m.labels])
    assert m.value(s) == exact.energy
    assert DSBSampler().sample_qubo(Q, num_reads=2, steps=100).first.energy == exact.energy - 7


def test_spin_bqm_offset_and_labels():
    bqm = dimod.BinaryQuadraticModel({"a": 1.0, 5: -2.0}, {("a", 5): -1.0}, 3.0, dimod.SPIN)
    m = IsingModel.from_bqm(bqm)
    for s in ([1, 1], [1, -1], [-1, 1], [-1, -1]):
        assert m.value(s) == bqm.energy(dict(zip(m.labels, s, strict=True)))
    ss = DSBSampler().sample(bqm, num_reads=2, steps=50, polish=True)
    assert ss.first.energy == dimod.ExactSolver().sample(bqm).first.energy


def test_unknown_parameter():
    with pytest.raises(ValueError, match="unknown parameters"):
        DSBSampler().sample_ising({0: 1}, {}, num_read=3)
