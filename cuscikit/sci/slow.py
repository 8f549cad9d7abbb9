"""Pure-numpy twins of the compiled kernels: obviously-correct, slow, used by tests and as the
baseline in benchmarks. Each takes the spatial integrals (h1e (n,n), full eri (n,n,n,n), e_core).
"""

from __future__ import annotations

from itertools import combinations

import numpy as np

from cuscikit.sci.configs import from_bits, to_bits


def _occupied(bits_row: np.ndarray) -> np.ndarray:
    return np.flatnonzero(bits_row)


def diagonal_slow(h1e, eri, e_core, configs, norb) -> np.ndarray:
    """<x|H|x> by the Slater-Condon rule, one configuration at a time."""
    out = np.empty(len(configs))
    for r, b in enumerate(to_bits(configs, norb)):
        occ = _occupied(b)
        sp, sg = occ >> 1, occ & 1
        e = e_core + h1e[sp, sp].sum()
        coul = eri[sp[:, None], sp[:, None], sp[None, :], sp[None, :]]
        exch = eri[sp[:, None], sp[None, :], sp[None, :], sp[:, None]] * (sg[:, None] == sg[None])
        out[r] = e + 0.5 * (coul - exch).sum()
    return out


def _apply(ops, occ: list[int]) -> tuple[int, list[int]] | tuple[int, None]:
    """Apply operators right to left: ops is a list of ('c'|'a', k) in the written order."""
    occ = list(occ)
    sign = 1
    for kind, k in reversed(ops):
        pos = sum(1 for o in occ if o < k)
        if kind == "a":
            if k not in occ:
                return 0, None
            occ.remove(k)
        else:
            if k in occ:
                return 0, None
            occ.append(k)
            occ.sort()
        sign *= -1 if pos % 2 else 1
    return sign, occ


def _antisym(eri, a, b, i, j) -> float:
    v = 0.0
    if a % 2 == i % 2 and b % 2 == j % 2:
        v += eri[a >> 1, i >> 1, b >> 1, j >> 1]
    if a % 2 == j % 2 and b % 2 == i % 2:
        v -= eri[a >> 1, j >> 1, b >> 1, i >> 1]
    return v


def coupled_configurations_slow(h1e, eri, e_core, configs, norb, eps=1e-12):
    """Every single and double excitation x' of each source with |<x'|H|x>| > eps, by explicit
    operator algebra on occupation lists.

    Returns:
        (source int64 (m,), configs uint64 (m, words), values float64 (m,)), grouped by source.
    """
    src, out_bits, vals = [], [], []
    nso = 2 * norb
    for r, b in enumerate(to_bits(configs, norb)):
        occ = [int(k) for k in _occupied(b)]
        vir = [k for k in range(nso) if k not in occ]
        for i in occ:
            for a in vir:
                if (a - i) % 2:
                    continue
                sign, new = _apply([("c", a), ("a", i)], occ)
                v = h1e[a >> 1, i >> 1] + sum(_antisym(eri, a, j, i, j) for j in occ if j != i)
                v *= sign
                if abs(v) > eps:
                    src.append(r)
                    out_bits.append(new)
                    vals.append(v)
        for i, j in combinations(occ, 2):
            for a, b2 in combinations(vir, 2):
                if (a % 2) + (b2 % 2) != (i % 2) + (j % 2):
                    continue
                g = _antisym(eri, a, b2, i, j)
                sign, new = _apply([("c", a), ("c", b2), ("a", j), ("a", i)], occ)
                v = sign * g
                if abs(v) > eps:
                    src.append(r)
                    out_bits.append(new)
                    vals.append(v)
    bits = np.zeros((len(out_bits), nso), dtype=np.uint8)
    for k, new in enumerate(out_bits):
        bits[k, new] = 1
    w = (nso + 63) // 64
    cfg = from_bits(bits) if len(bits) else np.zeros((0, w), np.uint64)
    return np.asarray(src, np.int64), cfg, np.asarray(vals, np.float64)


def coupled_configurations_numpy(h1e, eri, e_core, configs, norb, eps=1e-12):
    """Vectorised numpy version of the coupled generator (one source at a time, all of its
    excitations at once): the CPU baseline that the compiled kernel is benchmarked against."""
    nso = 2 * norb
    w = (nso + 63) // 64
    one = np.uint64(1)
    srcs, cfgs, vals = [], [], []
    for r, b in enumerate(to_bits(configs, norb)):
        x = configs[r]
        occ = np.flatnonzero(b)
        vir = np.flatnonzero(b == 0)
        below = np.concatenate([[0], np.cumsum(b)])[:-1]  # occupied orbitals below k
        po, so = occ >> 1, occ & 1
        # singles: v = h_ai + sum_j (ai|jj) - sum_{j same spin} (aj|ji); the j = i term is zero
        I, A = np.meshgrid(occ, vir, indexing="ij")
        I, A = I.ravel(), A.ravel()
        keep = (I & 1) == (A & 1)
        I, A = I[keep], A[keep]
        pi, pa = I >> 1, A >> 1
        coul = eri[pa[:, None], pi[:, None], po[None], po[None]].sum(axis=1)
        same = so[None] == (I & 1)[:, None]
        exch = (eri[pa[:, None], po[None], po[None], pi[:, None]] * same).sum(axis=1)
        v1 = h1e[pa, pi] + coul - exch
        n1 = below[I] + below[A] - (I < A)
        v1 = np.where(n1 % 2, -v1, v1)
        # doubles over all occupied pairs i<j and virtual pairs a<b with conserved spin
        oi, oj = np.triu_indices(len(occ), 1)
        vi, vj = np.triu_indices(len(vir), 1)
        Ip, Jp = occ[oi], occ[oj]
        Ap, Bp = vir[vi], vir[vj]
        I2 = np.repeat(Ip, len(Ap))
        J2 = np.repeat(Jp, len(Ap))
        A2 = np.tile(Ap, len(Ip))
        B2 = np.tile(Bp, len(Ip))
        keep = (A2 & 1) + (B2 & 1) == (I2 & 1) + (J2 & 1)
        I2, J2, A2, B2 = I2[keep], J2[keep], A2[keep], B2[keep]
        d1 = ((A2 & 1) == (I2 & 1)) & ((B2 & 1) == (J2 & 1))
        d2 = ((A2 & 1) == (J2 & 1)) & ((B2 & 1) == (I2 & 1))
        g = np.where(d1, eri[A2 >> 1, I2 >> 1, B2 >> 1, J2 >> 1], 0.0) - np.where(
            d2, eri[A2 >> 1, J2 >> 1, B2 >> 1, I2 >> 1], 0.0
        )
        n2 = (
            below[I2]
            + below[J2]
            - 1
            + below[B2]
            - (I2 < B2)
            - (J2 < B2)
            + below[A2]
            - (I2 < A2)
            - (J2 < A2)
        )
        v2 = np.where(n2 % 2, -g, g)
        for holes, parts, v in (((I,), (A,), v1), ((I2, J2), (A2, B2), v2)):
            sel = np.abs(v) > eps
            y = np.repeat(x[None, :], int(sel.sum()), axis=0)
            for k in (*holes, *parts):
                k = k[sel]
                for word in range(w):
                    m = (k >> 6) == word
                    y[m, word] ^= one << (k[m] & 63).astype(np.uint64)
            srcs.append(np.full(len(y), r, np.int64))
            cfgs.append(y)
            vals.append(v[sel])
    if not srcs:
        return np.zeros(0, np.int64), np.zeros((0, w), np.uint64), np.zeros(0)
    return np.concatenate(srcs), np.concatenate(cfgs), np.concatenate(vals)
