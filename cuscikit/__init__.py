"""cuscikit: GPU-accelerated configuration interaction (NNQS-SCI, GUGA CI, dSB Ising).

The public API is a thin layer of re-exports; the implementation lives in the subpackages
(layout and import rules: docs/README.md). Names that need PyTorch (`Ansatz`, `Runner`) are
imported on first use, so ``import cuscikit`` works without it.

Example:
    >>> from cuscikit import FCI, Molecule
    >>> mol = Molecule.load("LiH")
    >>> round(FCI(mol).run().e_tot, 8)
    -7.78446028
"""

from cuscikit._version import __version__
from cuscikit.chem import Molecule
from cuscikit.sci import FCI, Hamiltonian, SCISpace

_LAZY = {
    "Ansatz": "cuscikit.nnqs",
    "Runner": "cuscikit.nnqs",
    "DRT": "cuscikit.guga",
    "GUGASolver": "cuscikit.guga",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'cuscikit' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = ["FCI", "Hamiltonian", "Molecule", "SCISpace", "__version__", *_LAZY]
