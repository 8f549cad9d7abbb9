"""Loading the compiled modules and choosing a device, with errors that say what is missing."""

from __future__ import annotations

from functools import lru_cache
from types import ModuleType
from typing import Any


class ExtensionMissingError(ImportError):
    """The compiled CPU extension `cuscikit._core` could not be imported."""


class CudaUnavailableError(RuntimeError):
    """The GPU path was asked for but cannot run here (no GPU, no PyTorch CUDA, no kernels)."""


@lru_cache(maxsize=1)
def core() -> ModuleType:
    """The compiled CPU module `cuscikit._core`.

    Raises:
        ExtensionMissingError: the package was not built (e.g. imported from a source tree
            without `pip install -e .`).

    Example:
        >>> core().build_info()["max_words"]
        4
    """
    try:
        from cuscikit import _core
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ExtensionMissingError(
            "cuscikit's compiled extension (cuscikit._core) is missing: build it with "
            "`pip install -e .` (needs a C++17 compiler and CMake >= 3.18)"
        ) from exc
    return _core


@lru_cache(maxsize=1)
def cuda() -> ModuleType:
    """The compiled CUDA module `cuscikit._cuda`, or a `CudaUnavailableError` naming what is
    missing (PyTorch with CUDA, a visible GPU, or kernels built at install time)."""
    try:
        import torch
    except ImportError as exc:
        raise CudaUnavailableError("the GPU path needs PyTorch with CUDA") from exc
    if not torch.cuda.is_available():
        raise CudaUnavailableError(
            "no CUDA GPU is visible to PyTorch (torch.cuda.is_available() is False)"
        )
    try:
        from cuscikit import _cuda
    except ImportError as exc:
        raise CudaUnavailableError(
            "cuscikit was built without its CUDA kernels (cuscikit._cuda is missing). Rebuild "
            "on a machine with nvcc (CUDA >= 12) and an NVIDIA driver: "
            "`pip install --no-build-isolation -e .`, or force it with "
            "`pip install -e . -C cmake.define.CUSCIKIT_CUDA=ON`"
        ) from exc
    return _cuda


def cuda_build() -> str | None:
    """The architectures the CUDA kernels were built for (e.g. "90"), or None when the package
    was built without them; loads no GPU state.

    Example:
        >>> cuda_build() is None or cuda_build().isdigit()
        True
    """
    try:
        from cuscikit import _cuda
    except ImportError:
        return None
    return str(_cuda.build_arch())


def cuda_available() -> bool:
    """True when the CUDA kernels can run here.

    Example:
        >>> isinstance(cuda_available(), bool)
        True
    """
    try:
        cuda()
    except CudaUnavailableError:
        return False
    return True


def resolve_device(device: Any = None):
    """A usable ``torch.device`` from a name or device (None: torch's default), else ValueError.

    Example:
        >>> resolve_device("cpu")
        device(type='cpu')
    """
    import torch

    if device is None:
        return torch.empty(0).device  # torch's default device
    try:
        dev = torch.device(device)
        torch.empty(0, device=dev)  # fails for unknown or unavailable devices
    except (RuntimeError, TypeError, AssertionError) as exc:
        raise ValueError(
            f"device {device!r} is not usable here ({exc}); use e.g. 'cpu' or 'cuda'"
        ) from exc
    return dev
