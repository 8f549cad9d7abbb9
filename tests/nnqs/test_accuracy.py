"""The method's claim: chemical accuracy (1.6 mHa) against FCI with the default settings.

Fast cases run in CI; the rest are marked slow (`benchmarks/accuracy_small.py` runs the whole
set and prints the table)."""

import pytest

from cuscikit import Molecule
from cuscikit.nnqs import Ansatz, LearningRateDecay, Runner
from cuscikit.nnqs.defaults import DEFAULT_ITERATIONS

CHEMICAL_ACCURACY = 1.6e-3


def run_defaults(name: str, iters: int):
    """The last history row of a default run (the command line's: with the rate's tail decay)."""
    mol = Molecule.load(name)
    runner = Runner(mol, Ansatz.for_molecule(mol, seed=0), seed=0, device="cpu")
    return runner.run(iters, [LearningRateDecay.over_tail(iters)], progress=False).history.iloc[-1]


def test_lih_reaches_chemical_accuracy():
    last = run_defaults("LiH", 400)
    assert abs(last["error"]) < CHEMICAL_ACCURACY
    assert abs(last["error_variational"]) < CHEMICAL_ACCURACY
    assert last["error_variational"] > -1e-9  # the variational estimator is an upper bound


@pytest.mark.slow
@pytest.mark.parametrize("name", ["H2O", "O2-triplet", "N2", "N2-stretched", "H8-chain"])
def test_small_systems_reach_chemical_accuracy(name):
    last = run_defaults(name, DEFAULT_ITERATIONS)
    assert abs(last["error"]) < CHEMICAL_ACCURACY
    assert abs(last["error_variational"]) < CHEMICAL_ACCURACY
