"""A pure-numpy twin of the dSB kernels: the same Philox draws, the same float32 operations in
the same order (one numpy ufunc per IEEE operation, so nothing is fused), the same exact integer
sums and checksums. Slow and obviously correct; tests compare it byte for byte with the C++
reference.

Example:
    >>> [hex(v) for v in philox4x32_10([0, 0, 0, 0], [0, 0])]
    ['0x6627e8d5', '0xe169c58d', '0xbc57ac4c', '0x9b00dbd8']
"""

from __future__ import annotations

import numpy as np

__all__ = ["philox4x32_10", "init_state", "checksum_terms", "run_reference", "pack_signs"]

_M0, _M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
_W0, _W1 = np.uint64(0x9E3779B9), np.uint64(0xBB67AE85)
_MASK32 = np.uint64(0xFFFFFFFF)


def philox4x32_10(counter, key):
    """Philox4x32-10 of counters (4, ...) and key (2, ...) (broadcast), as uint32 arrays; one
    counter gives a tuple of ints."""
    c = [np.asarray(v, dtype=np.uint64) for v in counter]
    k0, k1 = (np.asarray(v, dtype=np.uint64) for v in key)
    for r in range(10):
        if r:
            k0 = (k0 + _W0) & _MASK32
            k1 = (k1 + _W1) & _MASK32
        p0 = _M0 * c[0]
        p1 = _M1 * c[2]
        hi0, lo0 = p0 >> np.uint64(32), p0 & _MASK32
        hi1, lo1 = p1 >> np.uint64(32), p1 & _MASK32
        c = [hi1 ^ c[1] ^ k0, lo1, hi0 ^ c[3] ^ k1, lo0]
    out = [v.astype(np.uint32) for v in c]
    if all(v.ndim == 0 for v in out):
        return tuple(int(v) for v in out)
    return out


def _init_value(r: np.ndarray) -> np.ndarray:
    q = (r >> np.uint32(8)).astype(np.int32) - np.int32(1 << 23)
    return (q.astype(np.float32) * np.float32(1.0 / 8388608.0)) * np.float32(0.01)


def init_state(n: int, replicas: int, seed: int, request: int = 0):
    """x and y (replicas, n) float32: counter (i, b, 0, request), key (seed lo, seed hi)."""
    i = np.arange(n, dtype=np.uint64)[None, :]
    b = np.arange(replicas, dtype=np.uint64)[:, None]
    seed = int(seed) & (2**64 - 1)
    r = philox4x32_10(
        [i + 0 * b, b + 0 * i, np.zeros_like(i + b), np.full_like(i + b, request)],
        [np.uint64(seed & 0xFFFFFFFF), np.uint64(seed >> 32)],
    )
    return _init_value(r[0]), _init_value(r[1])


def pack_signs(x: np.ndarray) -> np.ndarray:
    """(B, n) float32 to (B, W) uint32 words: bit i%32 of word i/32 set where x_i >= 0."""
    B, n = x.shape
    W = (n + 31) // 32
    bits = np.zeros((B, 32 * W), bool)
    bits[:, :n] = x >= 0
    return np.packbits(bits, axis=1, bitorder="little").view("<u4").astype(np.uint32)


def _fmix64(k: np.ndarray) -> np.ndarray:
    k = k ^ (k >> np.uint64(33))
    k = k * np.uint64(0xFF51AFD7ED558CCD)
    k = k ^ (k >> np.uint64(33))
    k = k * np.uint64(0xC4CEB9FE1A85EC53)
    return k ^ (k >> np.uint64(33))


def checksum_terms(words: np.ndarray) -> np.ndarray:
    """Per replica, the sum mod 2^64 of fmix64(((b W + w) << 32) | word) over its words."""
    B, W = words.shape
    pos = np.arange(B * W, dtype=np.uint64).reshape(B, W)
    with np.errstate(over="ignore"):
        return _fmix64((pos << np.uint64(32)) | words.astype(np.uint64)).sum(1, dtype=np.uint64)


def run_reference(
    model,
    replicas: int,
    steps: int,
    dt: float = 0.5,
    seed: int = 0,
    a0: float = 1.0,
    request: int = 0,
):
    """The kernels' outputs for an exact (integer) model: (energy[S+1, B], checksum[S+1, B],
    best_energy[B], best_signs[B, W], x[B, n], y[B, n]), the layout of ``_core.ising``."""
    if not model.exact:
        raise ValueError("the reference covers exact (integer) models only")
    n = model.n
    J = model.J.toarray().astype(np.int64)
    h = model.h.astype(np.int64)
    c0 = model.c0()
    dt, a0 = np.float32(dt), np.float32(a0)
    dta0 = dt * a0
    x, y = init_state(n, replicas, seed, request)
    energy = np.zeros((steps + 1, replicas), np.int64)
    checksum = np.zeros((steps + 1, replicas), np.uint64)
    best = np.full(replicas, np.iinfo(np.int64).max)
    best_signs = np.zeros((replicas, (n + 31) // 32), np.uint32)
    s = np.where(x >= 0, 1, -1).astype(np.int64)
    for k in range(1, steps + 2):
        a = s @ J.T + h  # (B, n): sum_{j != i} J_ij s_j + h_i, exact
        words = pack_signs(s.astype(np.float32))
        e = -((s * (a + h)).sum(1) // 2)
        energy[k - 1] = e
        checksum[k - 1] = checksum_terms(words)
        better = e < best
        best[better] = e[better]
        best_signs[better] = words[better]
        if k == steps + 1:
            break
        p = a0 * (np.float32(steps - k) / np.float32(steps))
        f = a.astype(np.int32).astype(np.float32)
        y = y + dt * ((c0 * f) - (p * x))
        x = x + dta0 * y
        over, under = x > 1, x < -1
        x = np.where(over, np.float32(1), np.where(under, np.float32(-1), x)).astype(np.float32)
        y = np.where(over | under, np.float32(0), y).astype(np.float32)
        s = np.where(x >= 0, 1, -1).astype(np.int64)
    return energy, checksum, best, best_signs, x, y
