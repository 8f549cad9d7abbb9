"""What every system stands on to reach compiled code and devices.

- `core` / `cuda`: the compiled CPU and CUDA modules (``cuscikit._core``, ``cuscikit._cuda``),
  loaded on first use with a clear error naming what is missing; each system's kernels live in
  a submodule (``core().guga``, ``cuda().ising``).
- `resolve_device`: a device name checked once, when an object is built.
- `MemoryBudget`: how many bytes a solver may hold on a device (a user cap, the free memory).
- `HostStaging`: pinned host buffers and a side stream for data that waits between stages,
  copied back one batch ahead (double buffering).
- `cuscikit.backends.keys`: sort + unique, search and hashing of multi-word uint64 keys on numpy
  arrays and on torch tensors (CPU or CUDA).

Nothing here touches a GPU at import.
"""

from cuscikit.backends.loader import (
    CudaUnavailableError,
    ExtensionMissingError,
    core,
    cuda,
    cuda_available,
    cuda_build,
    resolve_device,
)

__all__ = [
    "CudaUnavailableError",
    "ExtensionMissingError",
    "HostStaging",
    "MemoryBudget",
    "core",
    "cuda",
    "cuda_available",
    "cuda_build",
    "resolve_device",
]


def __getattr__(name: str):
    # torch is imported by these two only
    if name == "MemoryBudget":
        from cuscikit.backends.memory import MemoryBudget

        return MemoryBudget
    if name == "HostStaging":
        from cuscikit.backends.staging import HostStaging

        return HostStaging
    raise AttributeError(f"module 'cuscikit.backends' has no attribute {name!r}")
