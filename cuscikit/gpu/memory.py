"""GPU memory: one pool, a user cap, and batch sizes derived from what is free.

All of cuscikit's GPU buffers come from PyTorch's caching allocator; `share_pool_with_cupy`
routes CuPy's allocations there too, so that `torch.cuda.max_memory_allocated` measures the
peak of everything in one place (ARCHITECTURE.md: one memory pool on the GPU).
"""

from __future__ import annotations

import torch


def share_pool_with_cupy(device=None) -> None:
    """Make CuPy allocate through PyTorch's caching allocator (no-op without CuPy)."""
    try:
        import cupy
    except ImportError:
        return
    dev = torch.device(device or "cuda")

    def _malloc(nbytes: int):
        t = torch.empty(max(int(nbytes), 1), dtype=torch.uint8, device=dev)
        mem = cupy.cuda.UnownedMemory(t.data_ptr(), int(nbytes), t)
        return cupy.cuda.MemoryPointer(mem, 0)

    cupy.cuda.set_allocator(_malloc)


class MemoryBudget:
    """How many bytes the pipeline may hold on `device`.

    Args:
        device: a CUDA device.
        max_gpu_memory: a cap in bytes (None: what the card has). With a cap, PyTorch's
            allocator is limited to it as well, so the cap holds even where an estimate is off:
            an allocation beyond it raises OutOfMemoryError, which the pipeline answers by
            shrinking its batches and retrying.
        headroom: fraction of the budget kept free for the allocator's fragmentation
            (default 0.1, or 0.25 under a cap, where the allocator cannot grow past it).

    Under a tight cap, fragmentation of the caching allocator's segments is what runs out
    first; starting the process with ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``
    avoids most of it.
    """

    def __init__(self, device, max_gpu_memory: int | None = None,
                 headroom: float | None = None):
        self.device = torch.device(device)
        free, total = torch.cuda.mem_get_info(self.device)
        self.total = total
        if max_gpu_memory is not None:
            max_gpu_memory = int(max_gpu_memory)
            if max_gpu_memory <= 0:
                raise ValueError(f"max_gpu_memory must be positive, got {max_gpu_memory}")
            if max_gpu_memory > total:
                raise ValueError(
                    f"max_gpu_memory={max_gpu_memory} exceeds the card's {total} bytes"
                )
            torch.cuda.set_per_process_memory_fraction(max_gpu_memory / total, self.device)
        self.cap = max_gpu_memory
        if headroom is None:
            headroom = 0.1 if max_gpu_memory is None else 0.25
        self.headroom = float(headroom)

    def limit(self) -> int:
        """Bytes the process may hold in all (the cap, or what the card offers)."""
        if self.cap is not None:
            return self.cap
        free, _ = torch.cuda.mem_get_info(self.device)
        return free + torch.cuda.memory_reserved(self.device)

    def available(self) -> int:
        """Bytes that may still be allocated now, headroom kept."""
        in_use = torch.cuda.memory_allocated(self.device)
        return max(0, int(self.limit() * (1.0 - self.headroom)) - in_use)
