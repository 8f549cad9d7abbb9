"""cuscikit: GPU-accelerated configuration interaction (NNQS-SCI, GUGA CI, dSB Ising).

The public API is a thin layer of re-exports; the implementation lives in the subpackages.

Example:
    >>> from cuscikit import Molecule, SCISpace
    >>> mol = Molecule.load("LiH")
    >>> e = SCISpace.full(mol).exact_energy()   # FCI with cuscikit's own solver
"""

from cuscikit._version import __version__
from cuscikit.chem import Molecule
from cuscikit.sci.hamiltonian import Hamiltonian
from cuscikit.sci.space import SCISpace


def __getattr__(name: str):
    # The NNQS classes need PyTorch: imported on first use, so `import cuscikit` works without it.
    if name in ("Ansatz", "Runner"):
        from cuscikit import nnqs

        return getattr(nnqs, name)
    raise AttributeError(f"module 'cuscikit' has no attribute {name!r}")


__all__ = ["Ansatz", "Hamiltonian", "Molecule", "Runner", "SCISpace", "__version__"]
