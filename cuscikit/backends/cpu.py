"""Access to the compiled CPU extension, with a clear error when it is missing."""

from __future__ import annotations

from functools import lru_cache
from types import ModuleType


class ExtensionMissingError(ImportError):
    """The compiled extension `cuscikit._core` could not be imported."""


@lru_cache(maxsize=1)
def core() -> ModuleType:
    """Return the compiled CPU module `cuscikit._core`.

    Raises:
        ExtensionMissingError: when the package was not built (e.g. imported from a source tree
            without `pip install -e .`).
    """
    try:
        from cuscikit import _core
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ExtensionMissingError(
            "cuscikit's compiled extension (cuscikit._core) is missing: build it with "
            "`pip install -e .` (needs a C++17 compiler and CMake >= 3.18)"
        ) from exc
    return _core
