"""Memory budgets: one cap per device, and batch sizes derived from what is free.

On a GPU, all of cuscikit's buffers come from PyTorch's caching allocator; `share_pool_with_cupy`
routes CuPy's allocations there too, so that ``torch.cuda.max_memory_allocated`` measures the
peak of everything in one place. On the CPU the budget is the host memory the operating system
reports as available (or a user cap).

PyTorch is imported where a budget or pool is made, not with this module, so that host-only
code (`host_available_bytes`) stays light.
"""

from __future__ import annotations

import os


def share_pool_with_cupy(device=None) -> None:
    """Make CuPy allocate through PyTorch's caching allocator (no-op without CuPy)."""
    import torch

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


def host_available_bytes() -> int:
    """Host memory available to new allocations (Linux: MemAvailable), or a large number where
    the system does not say.

    Example:
        >>> host_available_bytes() > 0
        True
    """
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:  # pragma: no cover - not Linux
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):  # pragma: no cover
        return 1 << 62


def resident_bytes() -> int | None:
    """This process's resident memory now (Linux: /proc/self/statm), or None elsewhere."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, AttributeError):  # pragma: no cover - not Linux
        return None


class HostPeak:
    """The peak resident memory of this process over a stretch of code: a thread samples it
    every `interval` seconds (and at both ends), so what was freed before the stretch does not
    count, unlike the lifetime peak (``ru_maxrss``). A spike shorter than the interval can be
    missed. Where the resident size cannot be read, `peak` is the lifetime peak.

    Example (fresh pages from the system, so that no allocator can reuse resident ones):
        >>> import mmap
        >>> with HostPeak() as hp:
        ...     block = mmap.mmap(-1, 50_000_000)
        ...     for page in range(0, 50_000_000, 4096):  # 50 MB, touched
        ...         block[page] = 1
        >>> bool(hp.peak - hp.start > 45_000_000)
        True
        >>> block.close()
    """

    def __init__(self, interval: float = 0.005):
        self.interval = float(interval)
        self.start = self.peak = 0

    def _sample(self) -> None:
        rss = resident_bytes()
        if rss is not None and rss > self.peak:
            self.peak = rss

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def __enter__(self) -> HostPeak:
        import threading

        self.start = self.peak = resident_bytes() or 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="cuscikit-host-peak", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()
        if resident_bytes() is None:  # pragma: no cover - not Linux
            import resource

            self.peak = int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


class MemoryBudget:
    """How many bytes a solver may hold on `device`.

    Args:
        device: a CUDA device, or "cpu" (host memory).
        max_memory: a cap in bytes (None: what the device has). On a GPU, PyTorch's allocator
            is limited to it as well, so the cap holds even where an estimate is off: an
            allocation beyond it raises OutOfMemoryError, which the NNQS pipeline answers by
            shrinking its batches and retrying.
        headroom: fraction of the budget kept free for the allocator's fragmentation
            (default 0.1, or 0.25 under a GPU cap, where the allocator cannot grow past it).

    Under a tight GPU cap, fragmentation of the caching allocator's segments is what runs out
    first; starting the process with ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``
    avoids most of it.

    Example:
        >>> MemoryBudget("cpu", max_memory=2**30).limit()
        1073741824
    """

    def __init__(self, device, max_memory: int | None = None, headroom: float | None = None):
        import torch

        self.device = torch.device(device)
        self.gpu = self.device.type == "cuda"
        if self.gpu and self.device.index is None:  # "cuda": the current device, by number
            self.device = torch.device("cuda", torch.cuda.current_device())
        if max_memory is not None:
            if isinstance(max_memory, float) and not max_memory == max_memory:  # NaN
                raise ValueError("the memory cap must be a positive number of bytes, got nan")
            max_memory = int(max_memory)
            if max_memory <= 0:
                raise ValueError(f"the memory cap must be positive, got {max_memory}")
        if self.gpu:
            _, total = torch.cuda.mem_get_info(self.device)
            self.total = total
            if max_memory is not None:
                if max_memory > total:
                    raise ValueError(
                        f"the memory cap {max_memory} exceeds the card's {total} bytes"
                    )
                torch.cuda.set_per_process_memory_fraction(max_memory / total, self.device)
        else:
            self.total = host_available_bytes()
        self.cap = max_memory
        if headroom is None:
            headroom = 0.25 if (max_memory is not None and self.gpu) else 0.1
        self.headroom = float(headroom)

    def limit(self) -> int:
        """Bytes the process may hold in all (the cap, or what the device offers)."""
        if self.cap is not None:
            return self.cap
        if self.gpu:
            import torch

            free, _ = torch.cuda.mem_get_info(self.device)
            return free + torch.cuda.memory_reserved(self.device)
        return host_available_bytes()

    def in_use(self) -> int:
        """Bytes held now (GPU: PyTorch's allocator; CPU: not tracked, 0)."""
        if not self.gpu:
            return 0
        import torch

        return int(torch.cuda.memory_allocated(self.device))

    def available(self) -> int:
        """Bytes that may still be allocated now, headroom kept."""
        return max(0, int(self.limit() * (1.0 - self.headroom)) - self.in_use())
