"""Integral layouts: two-electron integrals in full, 4-fold and 8-fold packed form; the orbital
limit shared by every solver; and the checks every way in (FCIDUMP reader, writer, Python API)
applies to integrals, with one tolerance and one set of messages (see ``docs/fcidump.md``)."""

from __future__ import annotations

import math

import numpy as np

__all__ = [
    "MAX_ABS_INTEGRAL",
    "MAX_ORBITALS",
    "SYMMETRY_TOL",
    "IntegralError",
    "check_integral_value",
    "conflict_message",
    "eri_layout",
    "eri_pair_index",
    "eri_symmetry_conflict",
    "n_pairs",
    "restore_eri",
    "validate_integrals",
    "values_agree",
]

MAX_ORBITALS = 128
"""The most spatial orbitals cuscikit accepts: 256 spin orbitals, the width (four 64-bit words)
of the determinant kernels' configurations."""

MAX_ABS_INTEGRAL = 1e8
"""The largest magnitude (Hartree) accepted for any integral or core energy.

Physical values stay far below it: the largest one-electron integral of a real atom is about
-Z^2/2 (some -7e3 Ha for Z = 118), two-electron integrals are below ~100 Ha and a nuclear
repulsion of 1e6 Ha would need thousands of atoms. With |h|, |(ij|kl)| <= 1e8 every sum the
solvers form stays finite by a wide margin: a determinant's diagonal element is at most
~(2 NORB)^2 * 1e8 < 1e13, a row of H has fewer than 1e9 non-zero couplings, so |(H c)_i| < 1e22
and its square < 1e44, against the double-precision limit of 1.8e308. Values near that limit
(1e308 is finite) would instead overflow to inf in the first sum and make every energy NaN."""

SYMMETRY_TOL = 1e-8
"""Two listings of one integral (symmetry-equivalent index orders in a file, or mirrored elements
of an array) must agree to this tolerance, relative to the larger magnitude (absolute below 1):
text writers round to 10-17 significant digits, transforms leave ~1e-14 of noise, while a broken
permutation symmetry differs in the leading digits."""


class IntegralError(ValueError):
    """Integrals that fail a check (shape, finiteness, magnitude, permutation symmetry)."""


def values_agree(a: np.ndarray | float, b: np.ndarray | float) -> np.ndarray | bool:
    """Whether two listings of one integral agree to :data:`SYMMETRY_TOL`.

    Example:
        >>> bool(values_agree(1.0, 1.0 + 1e-12)), bool(values_agree(0.3, 0.9))
        (True, False)
    """
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    scale = np.maximum(1.0, np.maximum(np.abs(a), np.abs(b)))
    return np.abs(a - b) <= SYMMETRY_TOL * scale


def conflict_message(where: str, what: str, other: str, a: float, b: float) -> str:
    """The one message for two symmetry-equivalent listings that disagree.

    ``where`` locates the entry (``file:line`` or ``eri[0, 0, 1, 1]``), ``what`` names the kind
    (``h_ij`` or ``(ij|kl)``), ``other`` locates its partner; ``a`` is the partner's value.
    """
    return (
        f"{where}: {what} conflicts with the symmetry-equivalent entry {other} "
        f"({float(a)!r} vs {float(b)!r}; they must agree to {SYMMETRY_TOL:g} relative)"
    )


def check_integral_value(value: float, where: str, what: str = "value") -> None:
    """Raise :class:`IntegralError` unless ``value`` is finite and ``|value| <= MAX_ABS_INTEGRAL``.

    Example:
        >>> check_integral_value(1e308, "h1e[0, 0]")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        cuscikit.chem.integrals.IntegralError: h1e[0, 0]: value 1e+308 exceeds the largest ...
    """
    v = float(value)
    if not math.isfinite(v):
        raise IntegralError(f"{where}: {what} {v!r} is NaN or inf")
    if abs(v) > MAX_ABS_INTEGRAL:
        raise IntegralError(
            f"{where}: {what} {v:.6g} exceeds the largest integral magnitude accepted, "
            f"{MAX_ABS_INTEGRAL:g} Ha"
        )


def _check_array(arr: np.ndarray, name: str, index_of, block: int = 1 << 22) -> None:
    """Finiteness and magnitude of every element, in blocks (no full-size temporary); the
    first offender is named."""
    flat = arr.reshape(-1)
    for b0 in range(0, flat.size, block):
        part = flat[b0 : b0 + block]
        bad = ~(np.abs(part) <= MAX_ABS_INTEGRAL)  # NaN compares False: caught here too
        if bad.any():
            k = b0 + int(np.flatnonzero(bad)[0])
            check_integral_value(flat[k], f"{name}{index_of(k)}")


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


def _first_conflict(a: np.ndarray, b: np.ndarray) -> int | None:
    """Flat index of the first element where ``a`` and ``b`` disagree, or None."""
    differ = np.flatnonzero(a != b)  # mirrored elements are mostly bit-identical: cheap pass
    if differ.size == 0:
        return None
    bad = ~values_agree(a.reshape(-1)[differ], b.reshape(-1)[differ])
    if not bad.any():
        return None
    return int(differ[np.flatnonzero(bad)[0]])


def eri_symmetry_conflict(
    eri: np.ndarray, norb: int, block_bytes: int = 32 << 20
) -> tuple[tuple[int, ...], tuple[int, ...], float, float] | None:
    """The first pair of symmetry-equivalent elements of ``eri`` that disagree, or None.

    Real orbitals give ``(pq|rs) = (qp|rs) = (pq|sr) = (rs|pq)``. A full ``(norb,)*4`` array (or
    its ``(norb**2, norb**2)`` matrix form) is checked for the first and the last, which imply
    the second (``(pq|sr) = (sr|pq) = (rs|pq) = (pq|rs)``); a 4-fold array for the last; an
    8-fold array holds each integral once. The comparison runs over row blocks of about
    ``block_bytes``, so the extra memory does not grow with ``norb**4``.

    Returns:
        ``(index, partner_index, partner_value, value)`` with indices in the array's own layout,
        or None when all mirrored elements agree to :data:`SYMMETRY_TOL`.

    Example:
        >>> g = np.zeros((2, 2, 2, 2)); g[0, 0, 1, 1] = 0.3; g[1, 1, 0, 0] = 0.9
        >>> eri_symmetry_conflict(g, 2)
        ((0, 0, 1, 1), (1, 1, 0, 0), 0.9, 0.3)
    """
    eri = np.asarray(eri, dtype=np.float64)
    kind = eri_layout(eri, norb)
    if kind == 8:
        return None
    if kind == 4:
        mat = eri

        def unravel(r: int, c: int) -> tuple[int, ...]:
            return (int(r), int(c))

        checks = (("T",),)
    else:
        mat = eri.reshape(norb * norb, norb * norb)

        def unravel(r: int, c: int) -> tuple[int, ...]:
            return (int(r // norb), int(r % norb), int(c // norb), int(c % norb))

        checks = (("rows",), ("T",))
    n = mat.shape[0]
    swap = None
    if kind == 1:
        p = np.arange(n)
        swap = (p % norb) * norb + p // norb  # pq -> qp
    step = max(1, block_bytes // (8 * n))
    for r0 in range(0, n, step):
        r1 = min(n, r0 + step)
        a = mat[r0:r1]
        for (how,) in checks:
            if how == "rows":
                b = mat[swap[r0:r1]]
            elif how == "cols":
                b = a[:, swap]
            else:
                b = mat[:, r0:r1].T
            hit = _first_conflict(a, b)
            if hit is None:
                continue
            r, c = divmod(hit, n)
            r += r0
            if how == "rows":
                pr, pc = int(swap[r]), c
            elif how == "cols":
                pr, pc = r, int(swap[c])
            else:
                pr, pc = c, r
            return unravel(r, c), unravel(pr, pc), float(mat[pr, pc]), float(mat[r, c])
    return None


def validate_integrals(
    h1e: np.ndarray, eri: np.ndarray, e_core: float = 0.0
) -> tuple[np.ndarray, np.ndarray, float]:
    """The checks the FCIDUMP reader applies, for integrals given as arrays.

    ``h1e`` must be square and symmetric, ``eri`` of a layout that fits it with its permutation
    symmetry intact (mirrored elements agreeing to :data:`SYMMETRY_TOL`, as two listings of one
    integral must in a file), every value finite and at most :data:`MAX_ABS_INTEGRAL` in
    magnitude.

    Returns:
        ``(h1e, eri8, e_core)``: ``h1e`` made exactly symmetric (the mean of its two halves),
        the 8-fold packed ``eri``, ``e_core`` as a float.

    Raises:
        IntegralError: the first failed check, in one line.

    Example:
        >>> h, g8, e = validate_integrals(np.eye(2), np.zeros(6), 0.5)
        >>> g8.shape, e
        ((6,), 0.5)
    """
    h1e = np.asarray(h1e, dtype=np.float64)
    if h1e.ndim != 2 or h1e.shape[0] != h1e.shape[1]:
        raise IntegralError(f"h1e must be a square (norb, norb) matrix, got shape {h1e.shape}")
    norb = h1e.shape[0]
    check_integral_value(e_core, "e_core")
    _check_array(h1e, "h1e", lambda f: list(divmod(f, norb)))
    hit = _first_conflict(h1e, h1e.T)
    if hit is not None:
        i, j = divmod(hit, norb)
        raise IntegralError(
            "h1e is not symmetric: "
            + conflict_message(f"h1e[{i}, {j}]", "h_ij", f"h1e[{j}, {i}]", h1e[j, i], h1e[i, j])
        )
    eri = np.asarray(eri, dtype=np.float64)
    try:
        eri_layout(eri, norb)
    except ValueError as exc:
        raise IntegralError(f"eri does not match h1e (norb={norb}): {exc}") from None
    _check_array(eri, "eri", lambda f: [int(x) for x in np.unravel_index(f, eri.shape)])
    found = eri_symmetry_conflict(eri, norb)
    if found is not None:
        here, there, a, b = found
        raise IntegralError(
            "eri breaks the permutation symmetry of real orbitals: "
            + conflict_message(f"eri{list(here)}", "(ij|kl)", f"eri{list(there)}", a, b)
        )
    h1e = 0.5 * (h1e + h1e.T)  # exact symmetry; cannot overflow below MAX_ABS_INTEGRAL
    return h1e, restore_eri(eri, norb, 8), float(e_core)
