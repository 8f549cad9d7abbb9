"""A dimod sampler over the dSB solver: one sample per replica (``num_reads`` = agents).

Example:
    >>> import dimod
    >>> from cuscikit.ising import DSBSampler
    >>> ss = DSBSampler().sample_ising({"a": 0, "b": 0}, {("a", "b"): 1}, num_reads=4, steps=50)
    >>> float(ss.first.energy), len(ss)
    (-1.0, 4)
"""

from __future__ import annotations

import dimod
import numpy as np

from cuscikit.ising.model import IsingModel
from cuscikit.ising.solver import solve

__all__ = ["DSBSampler"]


class DSBSampler(dimod.Sampler):
    """dSB as a `dimod.Sampler`: `sample(bqm)` (and the mixins' `sample_ising`, `sample_qubo`)
    return a `dimod.SampleSet` with one row per replica (its best spins), energies from
    ``bqm.energies``. Parameters: `num_reads` (replicas), `steps`, `dt`, `seed`, `device`,
    `a0`, `polish` (a greedy descent on every row)."""

    parameters = {
        "num_reads": [],
        "steps": [],
        "dt": [],
        "seed": [],
        "device": [],
        "a0": [],
        "polish": [],
    }
    properties = {"description": "discrete simulated bifurcation (cuscikit.ising)"}

    def sample(
        self,
        bqm,
        num_reads: int = 128,
        steps: int = 2000,
        dt: float = 0.5,
        seed: int = 0,
        device: str | None = "cpu",
        a0: float = 1.0,
        polish: bool = False,
        **kwargs,
    ) -> dimod.SampleSet:
        if kwargs:
            raise ValueError(
                f"unknown parameters {sorted(kwargs)}; known: {sorted(self.parameters)}"
            )
        labels = list(bqm.variables)
        if not labels:
            return dimod.SampleSet.from_samples([], bqm.vartype, energy=[])
        model = IsingModel.from_bqm(bqm)
        r = solve(model, agents=num_reads, steps=steps, dt=dt, seed=seed, device=device, a0=a0)
        spins = r.replica_spins
        if polish:
            from cuscikit.ising.solver import greedy_descent

            spins = greedy_descent(model, spins)
        samples = spins if bqm.vartype is dimod.SPIN else ((spins + 1) // 2).astype(np.int8)
        return dimod.SampleSet.from_samples_bqm((samples, labels), bqm, info={"wall_s": r.wall_s})
