"""The CUDA backend: coupled generation, de-duplication and local energies on the GPU, and the
memory-centric NNQS-SCI pipeline built on them (seed 000, sections 4.2, 4.3).

Nothing here touches the GPU at import. `kernels()` loads the compiled module `cuscikit._cuda`
(built by `pip install` when a CUDA toolkit and an NVIDIA driver are present) and says what is
missing when it cannot.
"""

from __future__ import annotations

from functools import lru_cache
from types import ModuleType


class CudaUnavailableError(RuntimeError):
    """The GPU path was asked for but cannot run here (no GPU, no PyTorch CUDA, no kernels)."""


@lru_cache(maxsize=1)
def kernels() -> ModuleType:
    """The compiled CUDA module, or a `CudaUnavailableError` naming what is missing."""
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


def available() -> bool:
    """True when the CUDA kernels can run here."""
    try:
        kernels()
    except CudaUnavailableError:
        return False
    return True


__all__ = ["CudaUnavailableError", "available", "kernels"]
