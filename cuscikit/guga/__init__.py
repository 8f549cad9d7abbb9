"""GUGA CI: exact CI in a basis of spin-adapted configuration state functions (CSFs).

`DRT` builds the distinct row table of a CAS space and indexes its CSFs; `GUGASolver` is a
PySCF fcisolver (``mc.fcisolver = GUGASolver(mol)``) whose sigma vectors are operator-direct
over one-body coupling coefficients found by loop search (docs/guga.md).

Example:
    >>> from cuscikit.guga import DRT
    >>> DRT(10, 10, 0).n_csf
    19404
"""

from cuscikit.guga.drt import DRT
from cuscikit.guga.solver import GUGASolver

__all__ = ["DRT", "GUGASolver"]
