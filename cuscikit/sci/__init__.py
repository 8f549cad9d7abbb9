"""Selected CI on determinants: configurations (bitstrings), the Hamiltonian and its tables,
the kernel engines (host and CUDA), SCISpace and the exact solver `FCI`."""

from cuscikit.sci.fci import FCI
from cuscikit.sci.hamiltonian import Hamiltonian
from cuscikit.sci.space import SCISpace

__all__ = ["FCI", "Hamiltonian", "SCISpace"]
