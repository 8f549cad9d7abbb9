"""Operator-direct sigma, diagonal and density matrices over the coupling lists of a DRT.

With real orbitals, H = sum_pq h'_pq E_pq + 1/2 sum_pqrs (pq|rs) E_pq E_rs + ecore where
h'_pq = h_pq - 1/2 sum_r (pr|rq). For a block of kets k and the symmetric pairs P = (p >= q),

1. T[k, P] = ((E_pq + E_qp) c)_k (p != q), T[k, P(r,r)] = n_r(k) c_k: a gather over the lists;
2. G = 1/2 T V + c (x) h' with V the 4-fold packed integrals: one GEMM;
3. sigma_m += sum_P <m|E_pq + E_qp|k> G[k, P] (E_rr for the diagonal pairs): a scatter, each
   thread into a buffer of its own, summed at the end (no races).

The lists hold every <m|E_pq|k> != 0 of the block's kets, found by loop search through the DRT
(count, prefix sum, write). They are kept between sigma calls when they fit the memory budget;
otherwise they are rebuilt block by block on every call.

Example:
    >>> import numpy as np
    >>> from cuscikit.guga.drt import DRT
    >>> eng = Engine(DRT(4, 4, 0))
    >>> h1 = np.diag([-2.0, -1.0, 0.5, 1.0]); g = np.zeros((10, 10))
    >>> hd = eng.diagonal(h1, g)
    >>> float(hd.min())   # two doubly occupied orbitals of the lowest energies
    -6.0
"""

from __future__ import annotations

import numpy as np

from cuscikit.guga._ext import load
from cuscikit.guga.drt import DRT, OCC

__all__ = ["Engine", "pair_index"]

# bytes per coupling entry: int32 bra, uint16 pair code, float64 value
ENTRY_BYTES = 14


def pair_index(norb: int) -> np.ndarray:
    """(norb*norb,) int32 map from code p*norb + q to the packed pair index max(max+1)/2 + min."""
    p, q = np.divmod(np.arange(norb * norb), norb)
    hi, lo = np.maximum(p, q), np.minimum(p, q)
    return (hi * (hi + 1) // 2 + lo).astype(np.int32)


class Engine:
    """The compiled loop search and the sigma / RDM kernels for one DRT.

    Args:
        drt: the table.
        budget: bytes the cached lists may take (beyond it they are rebuilt per call).
        nthreads: OpenMP threads (0: the runtime's default).
        block_bytes: list bytes per block when they are not cached.
    """

    def __init__(self, drt: DRT, budget: int = 2**31, nthreads: int = 0, block_bytes=2**28):
        self.drt = drt
        self.core = drt.core
        self.mod = load()
        # small spaces run on one thread: waking a team costs more than the work, and under
        # PySCF (its own OpenMP team) idle threads compete for the same cores
        self.nthreads = int(nthreads or (1 if drt.n_csf < 20000 else 0))
        n = drt.norb
        self.norb = n
        self.npair = n * (n + 1) // 2
        self.symmap = pair_index(n)
        self.ncsf = drt.n_csf
        self.steps = drt.steps()
        counts = self.core.counts(0, self.ncsf, self.nthreads)
        self.n_entries = int(counts.sum())
        self._counts = counts
        self.cached = ENTRY_BYTES * self.n_entries <= budget
        if self.cached:
            self.blocks = [(0, self.ncsf)]
        else:
            per = max(1, block_bytes // ENTRY_BYTES)
            cum = np.cumsum(counts)
            self.blocks, start = [], 0
            while start < self.ncsf:
                base = cum[start - 1] if start else 0
                stop = int(np.searchsorted(cum, base + per, side="right"))
                stop = min(max(stop, start + 1), self.ncsf)
                self.blocks.append((start, stop - start))
                start = stop
        self._lists: dict[int, tuple] = {}
        self._work = None  # (T, G) buffers reused between calls
        self.rows = 32768  # kets per gather / GEMM / scatter step

    def lists(self, i: int):
        """(offsets, bra, code, w) of block i (cached or rebuilt)."""
        if i in self._lists:
            return self._lists[i]
        k0, count = self.blocks[i]
        known = np.ascontiguousarray(self._counts[k0 : k0 + count])
        lst = self.core.lists(k0, count, self.nthreads, known)
        if self.cached:
            self._lists[i] = lst
        return lst

    def _chunks(self, i):
        """Row ranges of block i, each at most `rows` kets: the list arguments of each and the
        (start, count) of its kets (work buffers stay small whatever the block)."""
        k0, count = self.blocks[i]
        off, bra, code, w = self.lists(i)
        for a in range(0, count, self.rows):
            b = min(count, a + self.rows)
            yield (off[a : b + 1], bra, code, w, self.steps[k0 + a : k0 + b], k0 + a), k0 + a, b - a

    # --- sigma -----------------------------------------------------------------------------------
    def contract(self, c: np.ndarray, V: np.ndarray, h: np.ndarray | None = None) -> np.ndarray:
        """sum_PQ V[P,Q] E^sym_P E^sym_Q c + sum_P h[P] E^sym_P c, V and h over packed pairs.

        With V = 1/2 (pq|rs) (4-fold) and h = h' packed, this is (H - ecore) c; with V the
        absorbed h2eff of PySCF's `absorb_h1e` and h None, it is PySCF's `contract_2e`.
        """
        c = np.ascontiguousarray(c, dtype=np.float64).reshape(-1)
        nbuf = self.nthreads or self.mod.max_threads()
        sigma = np.zeros((nbuf, self.ncsf))  # one buffer per thread, summed at the end
        npair = self.npair
        # one GEMM carries the one-body term too: T gets a column c_k, V a row h
        ld = npair + (h is not None)
        if h is not None:
            V = np.vstack([V, np.asarray(h, dtype=np.float64)[None, :]])
        V = np.ascontiguousarray(V)
        rows = min(self.rows, max(count for _, count in self.blocks))
        if self._work is None or self._work[0].shape[0] < rows or self._work[0].shape[1] != ld:
            self._work = (np.empty((rows, ld)), np.empty((rows, npair)))
        T_all, G_all = self._work
        for i in range(len(self.blocks)):
            for args, _, count in self._chunks(i):
                T, G = T_all[:count], G_all[:count]
                self.mod.gather_pairs(self.core, *args, self.symmap, npair, c, T, self.nthreads)
                np.matmul(T, V, out=G)
                self.mod.scatter_pairs(
                    self.core, *args, self.symmap, npair, G, sigma, self.nthreads
                )
        return sigma[0] if nbuf == 1 else sigma.sum(axis=0)

    def diagonal(self, h1: np.ndarray, eri4: np.ndarray) -> np.ndarray:
        """Exact <m|H - ecore|m> of every CSF, from h1 (n, n) and 4-fold packed ERIs."""
        n = self.norb
        sym = self.symmap.reshape(n, n)
        g = eri4
        J = g[sym.diagonal()][:, sym.diagonal()]  # (pp|rr)
        K = g[sym, sym.T]  # K[p, q] = (pq|qp)
        hp = np.diag(h1) - 0.5 * K.sum(axis=1)  # h'_pp = h_pp - 1/2 sum_r (pr|rp)
        occ = OCC[self.steps].astype(np.float64)
        out = occ @ hp + 0.5 * np.einsum("kp,pr,kr->k", occ, J, occ, optimize=True)
        Kc = np.ascontiguousarray(K.reshape(-1))
        for i in range(len(self.blocks)):
            for args, k0, count in self._chunks(i):
                out[k0 : k0 + count] += 0.5 * self.mod.exchange_diagonal(
                    self.core, *args, Kc, self.nthreads
                )
        return out

    # --- density matrices ------------------------------------------------------------------------
    def generator_products(self, bra: np.ndarray, ket: np.ndarray) -> tuple:
        """(d1, M): d1[r, s] = <bra|E_rs|ket>, M[(q,p), (r,s)] = (E_qp bra).(E_rs ket)."""
        n = self.norb
        bra = np.ascontiguousarray(bra, dtype=np.float64).reshape(-1)
        ket = np.ascontiguousarray(ket, dtype=np.float64).reshape(-1)
        same = bra is ket or np.array_equal(bra, ket)
        M = np.zeros((n * n, n * n))
        d1 = np.zeros(n * n)
        for i in range(len(self.blocks)):
            for args, k0, count in self._chunks(i):
                tk = self.mod.gather_generators(self.core, *args, ket, self.nthreads)
                tb = (
                    tk if same else self.mod.gather_generators(self.core, *args, bra, self.nthreads)
                )
                M += tb.T @ tk
                d1 += bra[k0 : k0 + count] @ tk
        return d1.reshape(n, n), M
