"""Integral layouts: two-electron integrals in full, 4-fold and 8-fold packed form, and the
orbital limit shared by every solver."""

from __future__ import annotations

import numpy as np

__all__ = ["MAX_ORBITALS", "eri_layout", "eri_pair_index", "n_pairs", "restore_eri"]

MAX_ORBITALS = 128
"""The most spatial orbitals cuscikit accepts: 256 spin orbitals, the width (four 64-bit words)
of the determinant kernels' configurations."""


def n_pairs(norb: int) -> int:
    return norb * (norb + 1) // 2


def eri_pair_index(norb: int) -> np.ndarray:
    """Return the ``(norb, norb)`` map ``(i, j) -> max*(max+1)/2 + min`` of PySCF's packing.

    Args:
        norb: number of orbitals.

    Returns:
        An ``int64`` symmetric matrix of compound pair indices.

    Example:
        >>> eri_pair_index(2).tolist()
        [[0, 1], [1, 2]]
    """
    i = np.arange(norb, dtype=np.int64)
    hi = np.maximum(i[:, None], i[None, :])
    lo = np.minimum(i[:, None], i[None, :])
    return hi * (hi + 1) // 2 + lo


def eri_layout(eri: np.ndarray, norb: int) -> int:
    npair = n_pairs(norb)
    if eri.ndim == 4 and eri.shape == (norb,) * 4:
        return 1
    if eri.ndim == 2 and eri.shape == (npair, npair):
        return 4
    if eri.ndim == 1 and eri.size == n_pairs(npair):
        return 8
    if eri.ndim == 2 and eri.shape == (norb * norb, norb * norb):
        return 1
    raise ValueError(
        f"ERI of shape {eri.shape} fits none of the layouts for norb={norb}: full "
        f"{(norb,) * 4}, 4-fold {(npair, npair)} or 8-fold ({n_pairs(npair)},)"
    )


def restore_eri(eri: np.ndarray, norb: int, symmetry: int | str) -> np.ndarray:
    """Convert two-electron integrals between full, 4-fold and 8-fold packed layouts.

    The layouts are those of ``pyscf.ao2mo.restore``: symmetry 1 is the full
    ``(norb, norb, norb, norb)`` array in chemists' notation, 4 is ``(npair, npair)`` over
    lower-triangular pairs ``ij = i*(i+1)/2 + j`` (``i >= j``), 8 is the 1-D lower triangle of
    that matrix. The input layout is detected from its shape; real integrals are assumed.

    Args:
        eri: integrals in any of the three layouts.
        norb: number of orbitals.
        symmetry: target layout, 1, 4 or 8 (``"s1"``, ``"s4"``, ``"s8"`` also accepted).

    Returns:
        A new ``float64`` array in the requested layout (a copy even when no conversion is done).

    Example:
        >>> import numpy as np
        >>> g = np.random.default_rng(0).random((3, 3, 3, 3))
        >>> g8 = restore_eri(g + g.transpose(1, 0, 2, 3), 3, 8)  # symmetrise one pair
        >>> restore_eri(g8, 3, 1).shape
        (3, 3, 3, 3)
    """
    if isinstance(symmetry, str):
        symmetry = int(symmetry.lower().lstrip("s"))
    if symmetry not in (1, 4, 8):
        raise ValueError(f"symmetry must be 1, 4 or 8, not {symmetry!r}")
    eri = np.asarray(eri, dtype=np.float64)
    kind = eri_layout(eri, norb)
    npair = n_pairs(norb)
    if kind == 1:
        full = eri.reshape((norb,) * 4)
        if symmetry == 1:
            return full.copy()
        ti, tj = np.tril_indices(norb)
        eri4 = full[ti, tj][:, ti, tj]
        if symmetry == 4:
            return np.ascontiguousarray(eri4)
        return eri4[np.tril_indices(npair)]
    if kind == 4:
        eri4 = eri
    else:
        # 8-fold -> symmetric (npair, npair): unpack the lower triangle into both halves.
        eri4 = eri[eri_pair_index(npair)]
        if symmetry == 8:
            return eri.copy()
    if symmetry == 4:
        return np.array(eri4, copy=True)
    if symmetry == 8:
        return eri4[np.tril_indices(npair)]
    pidx = eri_pair_index(norb)
    return eri4[pidx[:, :, None, None], pidx[None, None, :, :]]
