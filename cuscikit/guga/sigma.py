"""Operator-direct sigma, diagonal and density matrices over the coupling lists of a DRT.

With real orbitals, H = sum_pq h'_pq E_pq + 1/2 sum_pqrs (pq|rs) E_pq E_rs + ecore where
h'_pq = h_pq - 1/2 sum_r (pr|rq). For a block of kets k and the symmetric pairs P = (p >= q),

1. T[k, P] = ((E_pq + E_qp) c)_k (p != q), T[k, P(r,r)] = n_r(k) c_k: a gather over the lists;
2. G = 1/2 T V + c (x) h' with V the 4-fold packed integrals: one GEMM;
3. sigma_m += sum_P <m|E_pq + E_qp|k> G[k, P] (E_rr for the diagonal pairs): a scatter, each
   thread into a buffer of its own, summed at the end (no races).

The lists hold every <m|E_pq|k> != 0 of a block's kets, found by loop search through the DRT
(one search per ket into per-thread buffers, then copied into place). They are kept between
sigma calls while they fit the memory budget; blocks beyond it are searched again on every call.

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

    The CSFs are split into blocks of `rows` kets. The coupling lists of a block are found by one
    loop search per ket the first time the block is used and kept while the kept lists stay within
    `budget` bytes; blocks beyond it are searched again on every call (streamed), so memory stays
    at the budget plus one block.

    Args:
        drt: the table.
        budget: bytes the kept lists may take.
        nthreads: OpenMP threads (0: the runtime's default).
        rows: kets per block (and per gather / GEMM / scatter step).
    """

    def __init__(self, drt: DRT, budget: int = 2**31, nthreads: int = 0, rows: int = 32768):
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
        self.budget = int(budget)
        rows = max(1, int(rows))
        self.blocks = [(k0, min(rows, self.ncsf - k0)) for k0 in range(0, self.ncsf, rows)]
        self.rows = rows
        self._lists: dict[int, tuple] = {}
        self._held = 0  # bytes of the kept lists
        self._streamed: set[int] = set()  # blocks that did not fit the budget
        self._work = None  # (T, G) buffers reused between calls

    @property
    def cached(self) -> bool:
        """True when the lists of every block are kept (known once each block has been used)."""
        return not self._streamed and len(self._lists) == len(self.blocks)

    @property
    def list_bytes(self) -> int:
        """Bytes of the kept coupling lists."""
        return self._held

    def lists(self, i: int):
        """(offsets, bra, code, w) of block i (kept, or searched again when beyond the budget)."""
        if i in self._lists:
            return self._lists[i]
        k0, count = self.blocks[i]
        lst = self.core.lists(k0, count, self.nthreads)
        size = ENTRY_BYTES * len(lst[3]) + 8 * len(lst[0])
        if i not in self._streamed and self._held + size <= self.budget:
            self._lists[i] = lst
            self._held += size
        else:
            self._streamed.add(i)
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
    def contract(self, c: np.ndarray, V, h: np.ndarray | None = None) -> np.ndarray:
        """sum_PQ V[P,Q] E^sym_P E^sym_Q c + sum_P h[P] E^sym_P c, V and h over packed pairs.

        With V = 1/2 (pq|rs) (4-fold) and h = h' packed, this is (H - ecore) c; with V the
        absorbed h2eff of PySCF's `absorb_h1e` and h None, it is PySCF's `contract_2e`. V may
        also be a factored pair (A, B), A (npair, naux) and B (naux, npair), meaning V = A B
        (density fitting / Cholesky: A = L, B = 1/2 L^T): then g = (T A) B, two GEMMs of
        naux columns instead of one of npair.
        """
        c = np.ascontiguousarray(c, dtype=np.float64).reshape(-1)
        nbuf = self.nthreads or self.mod.max_threads()
        sigma = np.zeros((nbuf, self.ncsf))  # one buffer per thread, summed at the end
        npair = self.npair
        # the GEMMs carry the one-body term too: T gets a column c_k, V a row h
        ld = npair + (h is not None)
        if isinstance(V, tuple):
            A, B = (np.asarray(x, dtype=np.float64) for x in V)
            if A.shape[0] != npair or B.shape != (A.shape[1], npair):
                raise ValueError(f"factors must be (npair, naux) and (naux, npair), npair={npair}")
            if h is not None:  # [T | c] [[A, 0], [0, 1]] = [T A | c]; [[B], [h]] adds c (x) h
                corner = np.ones((1, 1))
                A = np.block([[A, np.zeros((npair, 1))], [np.zeros((1, A.shape[1])), corner]])
                B = np.vstack([B, np.asarray(h, dtype=np.float64)[None, :]])
            A, B = np.ascontiguousarray(A), np.ascontiguousarray(B)
            naux = A.shape[1]
        else:
            if h is not None:
                V = np.vstack([V, np.asarray(h, dtype=np.float64)[None, :]])
            V = np.ascontiguousarray(V, dtype=np.float64)
            A = B = None
            naux = 0
        rows = min(self.rows, max(count for _, count in self.blocks))
        work = self._work
        if work is None or work[0].shape[0] < rows or work[0].shape[1] != ld or work[2] != naux:
            X = np.empty((rows, naux)) if naux else None
            self._work = work = (np.empty((rows, ld)), np.empty((rows, npair)), naux, X)
        T_all, G_all, _, X_all = work
        for i in range(len(self.blocks)):
            for args, _, count in self._chunks(i):
                T, G = T_all[:count], G_all[:count]
                self.mod.gather_pairs(self.core, *args, self.symmap, npair, c, T, self.nthreads)
                if A is None:
                    np.matmul(T, V, out=G)
                else:
                    X = X_all[:count]
                    np.matmul(T, A, out=X)
                    np.matmul(X, B, out=G)
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
