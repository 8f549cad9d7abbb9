"""Triton where the installation has it (CUDA builds of torch ship it; the package imports
without it) and the helpers the Triton kernels of `fast_infer`, `fused_ops` and `products`
share."""

from __future__ import annotations

import os

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the installation
    triton = None
    tl = None

__all__ = [
    "gelu",
    "gelu_grad",
    "interpreting",
    "pow2",
    "tf32",
    "tf32x3",
    "tl",
    "training_pass",
    "triton",
]


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


def training_pass(x) -> bool:
    """Whether a pass over the tensor ``x`` may take Triton's training kernels: Triton present,
    a gradient being recorded, ``x`` on a CUDA device (any device under the interpreter), not
    inside `torch.compile` (which traces torch's own operations).

    Example:
        >>> import torch
        >>> training_pass(torch.zeros(3))   # a CPU tensor
        False
    """
    import torch

    if triton is None or not torch.is_grad_enabled():
        return False
    if not (x.is_cuda or interpreting()):
        return False
    return not torch.compiler.is_compiling()


if triton is not None:

    @triton.jit
    def gelu(x):
        """GELU with the error function, as `torch.nn.functional.gelu`'s default."""
        return 0.5 * x * (1.0 + tl.math.erf(x * 0.7071067811865476))

    @triton.jit
    def gelu_grad(u):
        """The derivative of `gelu` at u: Phi(u) + u phi(u), as torch's GELU backward."""
        cdf = 0.5 * (1.0 + tl.math.erf(u * 0.7071067811865476))
        return cdf + u * tl.exp(-0.5 * u * u) * 0.3989422804014327

    @triton.jit
    def tf32(x):
        """x rounded to the nearest TF32 value (10 mantissa bits; ties away from zero)."""
        bits = x.to(tl.int32, bitcast=True)
        return ((bits + 0x1000) & -0x2000).to(tl.float32, bitcast=True)

    @triton.jit
    def tf32x3(a, b):
        """a @ b from three TF32 products in one accumulator: each operand split into a TF32
        part rounded to nearest and the TF32-rounded remainder (exact for the tensor cores), the
        two small cross products first (low*high + high*low), then high*high."""
        ah = tf32(a)
        bh = tf32(b)
        acc = tl.dot(tf32(a - ah), bh, input_precision="tf32")
        acc = tl.dot(ah, tf32(b - bh), acc, input_precision="tf32")
        return tl.dot(ah, bh, acc, input_precision="tf32")
else:  # pragma: no cover - depends on the installation
    gelu = gelu_grad = tf32 = tf32x3 = None
