"""Small array operations written once for numpy arrays and torch tensors (any device)."""

from __future__ import annotations

import numpy as np

from cuscikit.backends.keys import is_tensor

__all__ = ["index_add", "zeros"]


def zeros(like, n: int, dtype=None):
    """n zeros of `like`'s kind, device and (by default) dtype.

    Example:
        >>> zeros(np.ones(3, complex), 2)
        array([0.+0.j, 0.+0.j])
    """
    if is_tensor(like):
        import torch

        return torch.zeros(n, dtype=dtype or like.dtype, device=like.device)
    return np.zeros(n, dtype=dtype or np.asarray(like).dtype)


def index_add(out, index, values):
    """``out[index[k]] += values[k]`` for every k (repeated indices add up), in place; returns
    `out`. numpy: by bincount (real and imaginary parts apart); torch: ``index_add_``.

    Example:
        >>> index_add(np.zeros(3), np.array([0, 2, 0]), np.array([1.0, 2.0, 3.0])).tolist()
        [4.0, 0.0, 2.0]
    """
    if is_tensor(out):
        return out.index_add_(0, index, values)
    values = np.asarray(values)
    n = len(out)
    if np.iscomplexobj(values):
        out += np.bincount(index, values.real, n) + 1j * np.bincount(index, values.imag, n)
    else:
        out += np.bincount(index, values, n)
    return out
