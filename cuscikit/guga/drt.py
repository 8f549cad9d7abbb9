"""The distinct row table (DRT) of a CAS space and the lexical index of its CSFs.

A CSF of n orbitals, N electrons and spin S is a walk from the tail (0, 0, 0) to the head
(N/2 - S, 2S, n - N/2 - S) through vertices (a, b, c) with a + b + c = k at level k; arc k takes
a step d in {0, 1, 2, 3} (occupation 0, 1, 1, 2), lowering the upper vertex by (0, 0, 1),
(0, 1, 0), (1, -1, 1) or (1, 0, 0). L[v] counts the walks from the tail to v; the arc weights
y[v, d] = sum_{d' < d} L[down[v, d']] give each walk its index rank = sum_k y[v_k, d_k] (v_k the
upper vertex of arc k), a bijection onto 0 .. n_csf - 1 computed in O(n) both ways (Shavitt,
"Graph theoretical concept of the unitary group approach to the many-electron correlation
problem", Int. J. Quantum Chem. 12 S11, 131 (1977), doi:10.1002/qua.560120819).

Example:
    >>> drt = DRT(6, 6, 0)
    >>> drt.n_csf, DRT.weyl(6, 6, 0)
    (175, 175)
    >>> steps = drt.unrank(42)
    >>> drt.rank(steps)
    42
"""

from __future__ import annotations

import math
from functools import cached_property

import numpy as np

__all__ = ["DRT", "MAX_NORB", "split_nelec"]

# Step d lowers the upper vertex (a, b, c) by DELTA[d]; it puts OCC[d] electrons on the orbital.
DELTA = ((0, 0, 1), (0, 1, 0), (1, -1, 1), (1, 0, 0))
OCC = np.array([0, 1, 1, 2], dtype=np.int64)
STEP_CHARS = "0ud2"
# The loop search keeps its stack on the machine stack and codes pairs in 16 bits.
MAX_NORB = 64


def split_nelec(nelec, twos: int | None = None) -> tuple[tuple[int, int], int]:
    """((n_alpha, n_beta), 2S) from PySCF's nelec (int or pair) and an optional 2S.

    Without `twos`, 2S = n_alpha - n_beta (for an int: N mod 2); PySCF passes the projection M,
    so a pair with n_alpha - n_beta < 2S is a state of spin S at M = (n_alpha - n_beta) / 2.

    Example:
        >>> split_nelec((4, 2)), split_nelec(6, 2), split_nelec((3, 3), 2)
        (((4, 2), 2), ((4, 2), 2), ((3, 3), 2))
    """
    if isinstance(nelec, (int, np.integer)):
        n = int(nelec)
        s = n % 2 if twos is None else int(twos)
        nb = (n - s) // 2
        na = n - nb
    else:
        na, nb = (int(x) for x in nelec)
        s = abs(na - nb) if twos is None else int(twos)
    return (na, nb), s


class DRT:
    """Distinct row table of `norb` active orbitals, `nelec` electrons and 2S = `twos`.

    Args:
        norb: active orbitals (1..64).
        nelec: electrons in them (an int or a PySCF pair, whose sum is used).
        twos: 2S.
        ncore: doubly occupied orbitals below the active ones; they stay out of the table (fold
            them into the integrals and the core energy), kept here only for bookkeeping.

    Attributes:
        abc: (nvert, 3) vertices, head first, level descending; ``level`` = a + b + c.
        up, down: (nvert, 4) int32 neighbour along step d (-1: none).
        L: (nvert,) int64 walks from the tail; y: (nvert, 4) int64 arc weights.
        n_csf: number of CSFs (= L[head]).

    Example:
        >>> DRT(10, 10, 4).n_csf
        12375
    """

    def __init__(self, norb: int, nelec, twos: int, ncore: int = 0):
        norb = int(norb)
        n = int(sum(nelec)) if not isinstance(nelec, (int, np.integer)) else int(nelec)
        twos = int(twos)
        if not 1 <= norb <= MAX_NORB:
            raise ValueError(f"norb must be in 1..{MAX_NORB}, got {norb}")
        if not 0 <= n <= 2 * norb:
            raise ValueError(f"{n} electrons do not fit in {norb} orbitals")
        if twos < 0 or (n - twos) % 2 or twos > min(n, 2 * norb - n):
            raise ValueError(
                f"2S = {twos} is impossible for {n} electrons in {norb} orbitals "
                f"(need 2S = N mod 2, ..., min(N, 2 norb - N) in steps of 2)"
            )
        self.norb, self.nelec, self.twos, self.ncore = norb, n, twos, int(ncore)
        a0 = (n - twos) // 2
        head = (a0, twos, norb - a0 - twos)
        levels = [[head]]
        for _ in range(norb):
            nxt: dict[tuple, None] = {}
            for a, b, c in levels[-1]:
                for da, db, dc in DELTA:
                    v = (a - da, b - db, c - dc)
                    if min(v) >= 0:
                        nxt[v] = None
            levels.append(sorted(nxt, reverse=True))
        abc = [v for lev in levels for v in lev]
        index = {v: i for i, v in enumerate(abc)}
        nv = len(abc)
        down = np.full((nv, 4), -1, dtype=np.int32)
        up = np.full((nv, 4), -1, dtype=np.int32)
        for i, (a, b, c) in enumerate(abc):
            if a + b + c == 0:
                continue
            for d, (da, db, dc) in enumerate(DELTA):
                j = index.get((a - da, b - db, c - dc))
                if j is not None:
                    down[i, d] = j
                    up[j, d] = i
        L = [0] * nv
        for i in range(nv - 1, -1, -1):
            if sum(abc[i]) == 0:
                L[i] = 1
            else:
                L[i] = sum(L[j] for j in down[i] if j >= 0)
        if L[0] >= 2**62:
            raise ValueError(f"{L[0]} CSFs: beyond the 64-bit index (2^62)")
        self.abc = np.array(abc, dtype=np.int64)
        self.level = self.abc.sum(axis=1)
        self.b = self.abc[:, 1].astype(np.int32)
        self.up, self.down = up, down
        self.L = np.array(L, dtype=np.int64)
        y = np.zeros((nv, 4), dtype=np.int64)
        for i in range(nv):
            acc = 0
            for d in range(4):
                y[i, d] = acc
                if down[i, d] >= 0:
                    acc += L[down[i, d]]
        self.y = y
        self.head = 0
        self.tail = index[(0, 0, 0)]
        self.n_csf = int(L[0])

    # --- sizes ------------------------------------------------------------------------------------
    @staticmethod
    def weyl(norb: int, nelec: int, twos: int) -> int:
        """The Weyl-Paldus dimension (2S+1)/(n+1) C(n+1, N/2-S) C(n+1, n-N/2-S).

        Example:
            >>> DRT.weyl(12, 12, 0)
            226512
        """
        n, N, s = int(norb), int(nelec), int(twos)
        if (N - s) % 2 or s < 0 or s > min(N, 2 * n - N):
            return 0
        num = (s + 1) * math.comb(n + 1, (N - s) // 2) * math.comb(n + 1, n - (N + s) // 2)
        return num // (n + 1)

    @property
    def n_vertices(self) -> int:
        return len(self.abc)

    @property
    def n_arcs(self) -> int:
        return int((self.down >= 0).sum())

    def sizes(self) -> dict:
        """Sizes of the table: orbitals, electrons, 2S, vertices, arcs, CSFs."""
        return {
            "norb": self.norb,
            "nelec": self.nelec,
            "twos": self.twos,
            "n_vertices": self.n_vertices,
            "n_arcs": self.n_arcs,
            "n_csf": self.n_csf,
        }

    def __repr__(self) -> str:
        return (
            f"DRT(norb={self.norb}, nelec={self.nelec}, twos={self.twos}: "
            f"{self.n_vertices} vertices, {self.n_csf} CSFs)"
        )

    # --- index <-> step vector -------------------------------------------------------------------
    def rank(self, steps) -> int:
        """Index of the CSF with these steps (orbital 0 first; ints or a '0ud2' string)."""
        if isinstance(steps, str):
            steps = [STEP_CHARS.index(ch) for ch in steps]
        steps = [int(d) for d in steps]
        if len(steps) != self.norb:
            raise ValueError(f"a step vector has {self.norb} entries, got {len(steps)}")
        v, r = self.tail, 0
        for d in steps:
            u = int(self.up[v, d])
            if u < 0:
                raise ValueError(f"steps {steps} are not a walk of this DRT")
            r += int(self.y[u, d])
            v = u
        if v != self.head:
            raise ValueError(f"steps {steps} do not end at the head (wrong N or S)")
        return r

    def unrank(self, r: int) -> np.ndarray:
        """Step vector (orbital 0 first) of the CSF of index r."""
        r = int(r)
        if not 0 <= r < self.n_csf:
            raise ValueError(f"CSF index {r} outside 0..{self.n_csf - 1}")
        steps = np.empty(self.norb, dtype=np.int64)
        v = self.head
        for k in range(self.norb - 1, -1, -1):
            for d in range(3, -1, -1):
                if self.down[v, d] >= 0 and self.y[v, d] <= r:
                    break
            r -= int(self.y[v, d])
            steps[k] = d
            v = int(self.down[v, d])
        return steps

    @cached_property
    def core(self):
        """The compiled table (`cuscikit._core.guga.DrtCore`)."""
        from cuscikit.guga._ext import load

        return load().DrtCore(
            self.norb,
            self.head,
            np.ascontiguousarray(self.up),
            np.ascontiguousarray(self.down),
            np.ascontiguousarray(self.b),
            np.ascontiguousarray(self.L),
            np.ascontiguousarray(self.y.reshape(-1)),
        )

    def steps(self, start: int = 0, count: int | None = None) -> np.ndarray:
        """Step vectors (count, norb) uint8 of CSFs start .. start + count - 1 (compiled)."""
        count = self.n_csf - start if count is None else int(count)
        return self.core.steps(int(start), count)

    def occupations(self) -> np.ndarray:
        """(n_csf, norb) orbital occupations."""
        return OCC[self.steps()].astype(np.int8)

    # --- determinant expansion -------------------------------------------------------------------
    def csf_to_dets(self, twom: int | None = None) -> tuple[np.ndarray, tuple[int, int]]:
        """The CSFs in PySCF's determinant basis at 2M = `twom` (default 2S).

        Returns (X, (n_alpha, n_beta)) with X of shape (n_csf, n_alpha_strings, n_beta_strings):
        X[i] is CSF i as a PySCF FCI vector (alpha string address, beta string address; strings
        in ascending bit order), built from the genealogical spin couplings
        (Clebsch-Gordan coefficients) and the phase that brings the orbital-ordered product
        (alpha before beta on each orbital) to PySCF's alpha-string-then-beta-string order.
        Dense: meant for small spaces (tests, exports).

        Example:
            >>> X, _ = DRT(4, 4, 2).csf_to_dets()
            >>> S = X.reshape(len(X), -1)
            >>> bool(np.allclose(S @ S.T, np.eye(len(X))))
            True
        """
        twom = self.twos if twom is None else int(twom)
        if abs(twom) > self.twos or (self.twos - twom) % 2:
            raise ValueError(f"2M = {twom} is impossible for 2S = {self.twos}")
        n = self.norb
        na = (self.nelec + twom) // 2
        nb = self.nelec - na
        nsa, nsb = math.comb(n, na), math.comb(n, nb)
        if self.n_csf * nsa * nsb > 50_000_000:
            raise ValueError("csf_to_dets is dense: too large a space")
        X = np.zeros((self.n_csf, nsa, nsb))
        steps = self.steps()
        for i in range(self.n_csf):
            for alpha, beta, coef in _expand(steps[i], twom):
                X[i, _string_address(alpha), _string_address(beta)] += coef
        return X, (na, nb)


def _string_address(occ: list[int]) -> int:
    """Address of a string (sorted occupied orbitals) in ascending-bit order."""
    return sum(math.comb(k, i + 1) for i, k in enumerate(occ))


def _expand(steps, twom: int):
    """(alpha orbitals, beta orbitals, coefficient) of one CSF at 2M = twom."""
    out = []
    n = len(steps)
    opens = [k for k in range(n) if steps[k] in (1, 2)]
    nopen = len(opens)
    need_up = (twom + nopen) // 2
    from itertools import combinations

    for ups in combinations(range(nopen), need_up):
        spin_up = set(opens[i] for i in ups)
        coef = 1.0
        b = 0  # 2S of the partial coupling
        m = 0  # 2M of the partial coupling
        a_below = 0  # steps 2 or 3 below
        phase = 0
        alpha, beta = [], []
        for k in range(n):
            d = int(steps[k])
            if d in (1, 2):
                phase += a_below
                is_up = k in spin_up
                m += 1 if is_up else -1  # the cumulative 2M after this orbital
                if d == 1:
                    f = (b + m + 1 if is_up else b - m + 1) / (2 * b + 2)
                    coef *= math.sqrt(max(f, 0.0))
                else:
                    f = (b - m + 1 if is_up else b + m + 1) / (2 * b + 2)
                    coef *= -math.sqrt(max(f, 0.0)) if is_up else math.sqrt(max(f, 0.0))
                b += 1 if d == 1 else -1
                (alpha if is_up else beta).append(k)
            elif d == 3:
                alpha.append(k)
                beta.append(k)
            if d in (2, 3):
                a_below += 1
            if coef == 0.0:
                break
        if coef == 0.0:
            continue
        # beta electron on orbital k passes the alpha electrons on orbitals <= k
        for k in beta:
            phase += sum(1 for j in alpha if j <= k)
        out.append((alpha, beta, coef * (-1.0) ** phase))
    return out
