"""Dense and iterative linear algebra shared by the solvers: one multi-root Davidson
eigensolver, used by the determinant FCI of `cuscikit.sci` and by the GUGA CI solver."""

from cuscikit.linalg.davidson import DavidsonResult, davidson

__all__ = ["DavidsonResult", "davidson"]
