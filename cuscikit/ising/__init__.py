"""dSB Ising solver: `IsingModel` (dense/sparse J, G-set files, networkx graphs, QUBOs, dimod
models), `solve` / `DSBSolver` on the CPU or a GPU with bit-identical trajectories, and the dimod
sampler `DSBSampler` (imported on first use, it needs dimod).

Example:
    >>> from cuscikit.ising import IsingModel, solve
    >>> m = IsingModel.from_edges(3, [(0, 1, 1), (1, 2, 1), (0, 2, 1)])
    >>> solve(m, agents=2, steps=20).cut
    2
"""

from cuscikit.ising.model import IsingModel
from cuscikit.ising.solver import DSBResult, DSBSolver, greedy_descent, solve

__all__ = ["DSBResult", "DSBSampler", "DSBSolver", "IsingModel", "greedy_descent", "solve"]


def __getattr__(name: str):
    if name == "DSBSampler":  # needs dimod: imported on first use
        from cuscikit.ising.sampler import DSBSampler

        return DSBSampler
    raise AttributeError(f"module 'cuscikit.ising' has no attribute {name!r}")
