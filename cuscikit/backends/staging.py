"""Pinned host staging with double buffering: device data that must wait between two stages
goes to page-locked host memory on a side stream, and comes back one batch ahead of use.

Example (on a GPU):
    >>> stage = HostStaging("cuda")  # doctest: +SKIP
    >>> parked = [stage.park(a, b) for a, b in batches]  # doctest: +SKIP
    >>> for a, b in stage.replay(parked):  # doctest: +SKIP
    ...     use(a, b)                       # batch k+1 is copied in while batch k is used
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch


class Parked:
    """Tensors of one batch, either still on the device or in pinned host memory."""

    def __init__(self, tensors: tuple, done: torch.cuda.Event | None):
        self.tensors, self.done = tensors, done

    @property
    def on_host(self) -> bool:
        return self.done is not None

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors) if self.on_host else 0


class HostStaging:
    """A copy stream on `device` and the two moves of the double buffer.

    Args:
        device: the CUDA device whose data is staged.
    """

    def __init__(self, device):
        self.device = torch.device(device)
        if self.device.type != "cuda":
            raise ValueError(f"host staging is for CUDA devices, got {self.device}")
        self.stream = torch.cuda.Stream(self.device)

    def keep(self, *tensors: torch.Tensor) -> Parked:
        """Leave the batch on the device (nothing to copy)."""
        return Parked(tensors, None)

    def park(self, *tensors: torch.Tensor) -> Parked:
        """Copy the batch to pinned host memory on the copy stream (asynchronous)."""
        host = tuple(torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for t in tensors)
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            for h, t in zip(host, tensors, strict=True):
                h.copy_(t, non_blocking=True)
        for t in tensors:
            t.record_stream(self.stream)  # not reused before the copy is done
        done = torch.cuda.Event()
        done.record(self.stream)
        return Parked(host, done)

    def _upload(self, item: Parked):
        if not item.on_host:
            return item.tensors, None
        self.stream.wait_event(item.done)
        with torch.cuda.stream(self.stream):
            dev = tuple(h.to(self.device, non_blocking=True) for h in item.tensors)
        ready = torch.cuda.Event()
        ready.record(self.stream)
        return dev, ready

    def replay(self, parked: Iterable[Parked]) -> Iterator[tuple]:
        """Yield each batch's tensors on the device; host batches are copied in on the copy
        stream one batch ahead of the one in use."""
        items = list(parked)
        compute = torch.cuda.current_stream(self.device)
        pending = self._upload(items[0]) if items else None
        for i in range(len(items)):
            tensors, ready = pending
            pending = self._upload(items[i + 1]) if i + 1 < len(items) else None
            if ready is not None:
                compute.wait_event(ready)
                for t in tensors:
                    t.record_stream(compute)
            yield tensors
