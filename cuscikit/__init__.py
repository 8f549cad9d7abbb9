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

__all__ = ["Hamiltonian", "Molecule", "SCISpace", "__version__"]
