"""Triton where the installation has it (CUDA builds of torch ship it; the package imports
without it) and the helpers the Triton kernels of `fast_infer` and `fused_ops` share."""

from __future__ import annotations

import os

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the installation
    triton = None
    tl = None

__all__ = ["gelu", "interpreting", "pow2", "tl", "triton"]


def pow2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1): Triton's block shapes.

    Example:
        >>> pow2(10), pow2(16), pow2(1)
        (16, 16, 1)
    """
    return 1 << max(0, int(n) - 1).bit_length()


def interpreting() -> bool:
    """Whether Triton runs its kernels in the CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


if triton is not None:

    @triton.jit
    def gelu(x):
        """GELU with the error function, as `torch.nn.functional.gelu`'s default."""
        return 0.5 * x * (1.0 + tl.math.erf(x * 0.7071067811865476))
else:  # pragma: no cover - depends on the installation
    gelu = None
