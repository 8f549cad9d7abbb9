"""Configurations as bitstrings: `uint64` arrays of shape (n, words), interleaved spin orbitals.

Bit `2p` of a configuration is spatial orbital p with alpha spin, bit `2p+1` the same orbital with
beta spin; spin orbital k lives in word k // 64, bit k % 64. Word 0 is the least significant
word, so sorting compares the last word first (see `cuscikit.backends.keys`).
"""

from __future__ import annotations

from itertools import combinations
from math import comb

import numpy as np

from cuscikit.chem.integrals import MAX_ORBITALS  # 256 spin orbitals

MAX_WORDS = (2 * MAX_ORBITALS) // 64

_ALPHA_MASK = np.uint64(0x5555555555555555)
_BETA_MASK = np.uint64(0xAAAAAAAAAAAAAAAA)


def n_words(norb: int) -> int:
    """Number of uint64 words for `norb` spatial orbitals (2*norb spin orbitals).

    Raises:
        ValueError: when norb is not positive or exceeds the supported bit width.

    Example:
        >>> n_words(28), n_words(42)
        (1, 2)
    """
    norb = int(norb)
    if norb <= 0:
        raise ValueError(f"norb must be positive, got {norb}")
    if norb > MAX_ORBITALS:
        raise ValueError(
            f"{norb} orbitals need {2 * norb} spin orbitals, more than the {64 * MAX_WORDS} "
            f"bits ({MAX_WORDS} uint64 words) that cuscikit supports"
        )
    return (2 * norb + 63) // 64


def normalize_nelec(nelec, norb: int | None = None) -> tuple[int, int]:
    """Return (n_alpha, n_beta) from an int (lowest Ms) or a pair, checking that they fit."""
    if isinstance(nelec, (int, np.integer)):
        n = int(nelec)
        if n < 0:
            raise ValueError(f"electron count must be non-negative, got {n}")
        na, nb = (n + 1) // 2, n // 2
    else:
        na, nb = (int(v) for v in nelec)
    if na < 0 or nb < 0:
        raise ValueError(f"electron counts must be non-negative, got ({na}, {nb})")
    if norb is not None and (na > norb or nb > norb):
        raise ValueError(f"({na}, {nb}) electrons do not fit in {norb} spatial orbitals")
    return na, nb


def from_occupations(alpha, beta, norb: int) -> np.ndarray:
    """Build configurations from lists of occupied alpha and beta spatial orbitals.

    Args:
        alpha: sequence (one per configuration) of occupied alpha orbital indices.
        beta: same for beta.
        norb: number of spatial orbitals.

    Returns:
        uint64 array (n, words).

    Example:
        >>> from_occupations([[0, 1]], [[0]], norb=4)   # bits 0, 2 (alpha) and 1 (beta)
        array([[7]], dtype=uint64)
    """
    w = n_words(norb)
    if len(alpha) != len(beta):
        raise ValueError("alpha and beta lists differ in length")
    out = np.zeros((len(alpha), w), dtype=np.uint64)
    for r, (oa, ob) in enumerate(zip(alpha, beta, strict=True)):
        for spin, occ in ((0, oa), (1, ob)):
            occ = [int(p) for p in occ]
            if len(set(occ)) != len(occ):
                raise ValueError(f"configuration {r}: an orbital is listed twice: {occ}")
            for p in occ:
                if not 0 <= p < norb:
                    raise ValueError(f"configuration {r}: orbital {p} outside 0..{norb - 1}")
                k = 2 * p + spin
                out[r, k // 64] |= np.uint64(1) << np.uint64(k % 64)
    return out


def to_bits(configs: np.ndarray, norb: int) -> np.ndarray:
    """Unpack configurations into a (n, 2*norb) uint8 array of spin-orbital occupations."""
    configs = np.ascontiguousarray(configs, dtype=np.uint64)
    if configs.ndim == 1:
        configs = configs[None, :]
    as_bytes = configs.view(np.uint8).reshape(len(configs), -1)  # little endian words
    bits = np.unpackbits(as_bytes, axis=1, bitorder="little")
    return bits[:, : 2 * norb]


def from_bits(bits: np.ndarray) -> np.ndarray:
    """Pack a (n, 2*norb) 0/1 array of spin-orbital occupations into configurations."""
    bits = np.asarray(bits, dtype=np.uint8)
    n, nso = bits.shape
    w = n_words(nso // 2 + nso % 2)
    padded = np.zeros((n, 64 * w), dtype=np.uint8)
    padded[:, :nso] = bits
    packed = np.packbits(padded, axis=1, bitorder="little")
    return np.ascontiguousarray(packed).view(np.uint64).reshape(n, w).copy()


def to_occupations(configs: np.ndarray, norb: int) -> tuple[list[list[int]], list[list[int]]]:
    """Occupied alpha and beta spatial orbitals of each configuration (inverse of
    `from_occupations`)."""
    bits = to_bits(configs, norb)
    alpha = [list(np.flatnonzero(b[0::2])) for b in bits]
    beta = [list(np.flatnonzero(b[1::2])) for b in bits]
    return [[int(p) for p in a] for a in alpha], [[int(p) for p in b] for b in beta]


def electron_counts(configs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Numbers of alpha and beta electrons of each configuration."""
    configs = np.asarray(configs, dtype=np.uint64)
    na = np.bitwise_count(configs & _ALPHA_MASK).sum(axis=1, dtype=np.int64)
    nb = np.bitwise_count(configs & _BETA_MASK).sum(axis=1, dtype=np.int64)
    return na, nb


def check_configurations(configs, norb: int, nelec) -> np.ndarray:
    """Validate a configuration array and return it as C-contiguous uint64 (n, words).

    Raises:
        ValueError: wrong dtype/shape, bits beyond 2*norb, or wrong alpha/beta counts.
    """
    na, nb = normalize_nelec(nelec, norb)
    w = n_words(norb)
    arr = np.asarray(configs)
    if arr.dtype != np.uint64:
        if arr.dtype.kind in "iu" and (arr.size == 0 or arr.min() >= 0):
            arr = arr.astype(np.uint64)
        else:
            raise ValueError(f"configurations must be unsigned 64-bit integers, got {arr.dtype}")
    if arr.ndim == 1 and w == 1:
        arr = arr[:, None]
    if arr.ndim != 2 or arr.shape[1] != w:
        raise ValueError(
            f"configurations must have shape (n, {w}) for norb={norb}, got {arr.shape}"
        )
    arr = np.ascontiguousarray(arr)
    nso = 2 * norb
    if nso % 64:
        stray = arr[:, w - 1] >> np.uint64(nso % 64)
        if np.any(stray):
            bad = int(np.flatnonzero(stray)[0])
            raise ValueError(f"configuration {bad} sets bits beyond spin orbital {nso - 1}")
    ca, cb = electron_counts(arr)
    wrong = np.flatnonzero((ca != na) | (cb != nb))
    if wrong.size:
        r = int(wrong[0])
        raise ValueError(
            f"configuration {r} has ({ca[r]}, {cb[r]}) alpha/beta electrons, expected ({na}, {nb})"
            f"; {wrong.size} of {len(arr)} configurations are wrong"
        )
    return arr


def hf_configuration(norb: int, nelec) -> np.ndarray:
    """The aufbau (Hartree-Fock) determinant: the lowest n_alpha / n_beta orbitals occupied.

    Example:
        >>> hf_configuration(4, (2, 1))   # alpha 0,1 and beta 0 -> bits 0, 1, 2
        array([[7]], dtype=uint64)
    """
    na, nb = normalize_nelec(nelec, norb)
    return from_occupations([list(range(na))], [list(range(nb))], norb)


def start_configuration(system) -> np.ndarray:
    """The determinant a selected-CI run of ``system`` starts from: the one its metadata
    names (``metadata["start"]``: occupied ``alpha`` and ``beta`` orbitals; set by
    `cuscikit.Molecule.hubbard` where a partly filled degenerate shell leaves the aufbau
    determinant without weight), else the aufbau determinant.

    Example:
        >>> from cuscikit import Molecule
        >>> start_configuration(Molecule.load("LiH")) == hf_configuration(6, (2, 2))
        array([[ True]])
        >>> ring = Molecule.hubbard(4, U=4.0, pbc=True)   # a shell of 2 levels, 1 + 1 electrons
        >>> ring.metadata["start"], to_occupations(start_configuration(ring), 4)
        ({'alpha': [0, 1], 'beta': [0, 2]}, ([[0, 1]], [[0, 2]]))
    """
    norb, nelec = system.norb, system.nelec
    start = (getattr(system, "metadata", None) or {}).get("start")
    if start is None:
        return hf_configuration(norb, nelec)
    configs = from_occupations([list(start["alpha"])], [list(start["beta"])], norb)
    return check_configurations(configs, norb, nelec)


def _strings(norb: int, n: int) -> np.ndarray:
    """All occupation strings of n electrons in norb orbitals as a (count, norb) 0/1 array,
    in lexicographic order of the occupied-index tuples."""
    out = np.zeros((comb(norb, n), norb), dtype=np.uint8)
    for r, occ in enumerate(combinations(range(norb), n)):
        out[r, list(occ)] = 1
    return out


def all_determinants(norb: int, nelec) -> np.ndarray:
    """Every determinant of the (n_alpha, n_beta) sector, as configurations (unsorted).

    Raises:
        ValueError: when the sector has more than 2e8 determinants.
    """
    na, nb = normalize_nelec(nelec, norb)
    count = comb(norb, na) * comb(norb, nb)
    if count > 200_000_000:
        raise ValueError(f"the sector has {count:.3e} determinants: too many to enumerate")
    sa, sb = _strings(norb, na), _strings(norb, nb)
    w = n_words(norb)
    # Interleave: alpha bits at even, beta bits at odd positions; combine via packed words.
    ea = np.zeros((len(sa), 2 * norb), dtype=np.uint8)
    ea[:, 0::2] = sa
    eb = np.zeros((len(sb), 2 * norb), dtype=np.uint8)
    eb[:, 1::2] = sb
    pa, pb = from_bits(ea), from_bits(eb)  # disjoint bits: OR combines them
    out = (pa[:, None, :] | pb[None, :, :]).reshape(-1, w)
    return np.ascontiguousarray(out)
