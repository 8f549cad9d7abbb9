"""The compiled GUGA kernels (`cuscikit._core.guga`), with a clear error when they are missing."""

from __future__ import annotations


def load():
    """The `cuscikit._core.guga` module.

    Example:
        >>> hasattr(load(), "DrtCore")
        True
    """
    try:
        from cuscikit import _core
    except ImportError as exc:  # pragma: no cover - a broken install
        raise ImportError(f"cuscikit's compiled extension is missing ({exc}); reinstall") from exc
    mod = getattr(_core, "guga", None)
    if mod is None:  # pragma: no cover - built without ext/cpu/guga
        raise ImportError("cuscikit was built without the GUGA kernels (ext/cpu/guga)")
    return mod
