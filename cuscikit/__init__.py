"""cuscikit: GPU-accelerated configuration interaction (NNQS-SCI, GUGA CI, dSB Ising)."""

from cuscikit._version import __version__

__all__ = ["__version__"]
