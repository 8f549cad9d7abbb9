"""Operator-direct sigma, diagonal and density matrices of a DRT, loop-driven or over lists.

With real orbitals, H = sum_pq h'_pq E_pq + 1/2 sum_pqrs (pq|rs) E_pq E_rs + ecore where
h'_pq = h_pq - 1/2 sum_r (pr|rq). For a block of CSFs k and the symmetric pairs P = (p >= q),

1. T[P, k] = ((E_pq + E_qp) c)_k (p != q), T[P(r,r), k] = n_r(k) c_k: a gather;
2. G = 1/2 V T + h' (x) c with V the 4-fold packed integrals: one GEMM over npair = n(n+1)/2
   pairs (the real-orbital symmetries (pq|rs) = (pq|sr) and g_pq = g_qp);
3. sigma_m += sum_P <m|E_pq + E_qp|k> G[P, k] (E_rr for the diagonal pairs): a scatter, each
   thread into a buffer of its own, summed at the end (no races).

Two forms of steps 1 and 3:

- ``method="loops"`` (default): the loops of the DRT, each a pair of partial walks (ket and bra)
  from a bottom vertex to a top vertex with its coupling value, are enumerated once per DRT
  (factored at a middle level into lower and upper parts, so the table is small) and applied to
  every upper walk U of the top vertex: ket U + off_ket + l and bra U + off_bra + l for the
  lower walks l = 0 .. L[bottom] - 1, one contiguous axpy each. Nothing is stored per CSF; each
  output range of CSFs is written by one thread.
- ``method="lists"``: every <m|E_pq|k> != 0 of a block's kets is found by loop search per ket and
  kept between calls while the lists fit the budget (14 bytes per coupling); blocks beyond it are
  searched again on every call.

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
from cuscikit.guga.drt import DRT

__all__ = ["Engine", "pair_index"]

# bytes per coupling entry: int32 bra, uint16 pair code, float64 value
ENTRY_BYTES = 14


def pair_index(norb: int) -> np.ndarray:
    """(norb*norb,) int32 map from code p*norb + q to the packed pair index max(max+1)/2 + min."""
    p, q = np.divmod(np.arange(norb * norb), norb)
    hi, lo = np.maximum(p, q), np.minimum(p, q)
    return (hi * (hi + 1) // 2 + lo).astype(np.int32)


METHODS = ("loops", "lists")


def _dgemm():
    """A capsule of the Fortran dgemm that SciPy exports for compiled code, or None."""
    try:
        from scipy.linalg import cython_blas
    except ImportError:
        return None
    return cython_blas.__pyx_capi__.get("dgemm")


class _OneThreadBlas:
    """numpy's OpenBLAS on one thread inside the block (restored after), found as threadpoolctl
    finds it: its worker threads busy-wait after every call and take the cores from the loop
    kernels that follow each GEMM (measured: a CAS(12,12) sigma 0.41 s instead of 0.26 s on
    2 cores with the loops). The engine runs its GEMMs on its own threads, one slab of rows
    each, for both methods. A no-op where
    no OpenBLAS is loaded (or not on Linux)."""

    _fns = None

    @classmethod
    def _find(cls):
        if cls._fns is None:
            cls._fns = ()
            _dgemm()  # SciPy's OpenBLAS (the loop sigma's GEMM) loaded first, to be found too
            try:
                import ctypes

                with open("/proc/self/maps") as f:
                    paths = sorted({ln.split()[-1] for ln in f if "openblas" in ln.lower()})
                for path in paths:
                    lib = ctypes.CDLL(path)
                    for pre in ("scipy_openblas_", "openblas_"):
                        for suf in ("64_", ""):
                            get = getattr(lib, f"{pre}get_num_threads{suf}", None)
                            put = getattr(lib, f"{pre}set_num_threads{suf}", None)
                            if get is not None and put is not None:
                                cls._fns += ((get, put),)
                                break
            except OSError:
                cls._fns = ()
        return cls._fns

    def __enter__(self):
        self._old = [(put, get()) for get, put in self._find()]
        for put, _ in self._old:
            put(1)
        return self

    def __exit__(self, *exc):
        for put, n in self._old:
            put(n)


def _summed(sigma: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """The sum of the per-thread buffers in buffer order, into `out` or a new vector (for one
    thread without `out`: the buffer itself, which `contract` allocated for this call)."""
    if sigma.shape[0] == 1:
        if out is None:
            return sigma[0]
        if not np.shares_memory(out, sigma):
            out[...] = sigma[0]
        return out
    out = np.add(sigma[0], sigma[1], out=out)
    for i in range(2, sigma.shape[0]):
        out += sigma[i]
    return out


def _aligned_blocks(cells: np.ndarray, ncsf: int, rows: int) -> list:
    """Blocks of at most `rows` CSFs (or one cell, if larger) that begin and end on cell borders."""
    blocks, k0 = [], 0
    starts = np.append(np.asarray(cells, dtype=np.int64), ncsf)
    while k0 < ncsf:
        # the last border within k0 + rows, but at least the next border
        i = int(np.searchsorted(starts, k0 + rows, side="right")) - 1
        k1 = int(starts[i])
        if k1 <= k0:
            k1 = int(starts[np.searchsorted(starts, k0, side="right")])
        blocks.append((k0, k1 - k0))
        k0 = k1
    return blocks


class Engine:
    """The compiled loop kernels and the sigma / RDM steps for one DRT.

    The CSFs are split into blocks of `rows` (the gather / GEMM / scatter step; T and G take
    8 (2 npair + 1) rows bytes). With ``method="loops"`` the loop table is built once (see
    `loop_bytes`); with ``method="lists"`` the coupling lists of a block are found by one loop
    search per ket the first time the block is used and kept while the kept lists stay within
    `budget` bytes; blocks beyond it are searched again on every call (streamed). With two
    threads or more the per-thread sigma buffers (8 ncsf bytes each) are kept between calls.

    Args:
        drt: the table.
        budget: bytes the kept lists may take (lists only).
        nthreads: OpenMP threads (0: the runtime's default).
        rows: CSFs per block.
        method: "loops" (loop-driven, nothing stored per CSF) or "lists".
    """

    def __init__(
        self,
        drt: DRT,
        budget: int = 2**31,
        nthreads: int = 0,
        rows: int = 32768,
        method: str = "loops",
    ):
        if method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {method!r}")
        self.method = method
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
        self._steps = None
        self.table = self.mod.LoopTable(self.core) if method == "loops" else None
        self.budget = int(budget)
        rows = max(1, int(rows))
        cells = self.table.cells() if self.table is not None else ()
        if len(cells):  # blocks on cell borders: the loop kernels then cut no loop
            self.blocks = _aligned_blocks(cells, self.ncsf, rows)
        else:
            self.blocks = [(k0, min(rows, self.ncsf - k0)) for k0 in range(0, self.ncsf, rows)]
        self.rows = rows
        # CSFs per output range of the one-pass loop sigma (each range's T and G, 8 (2 npair + 1)
        # range bytes per thread, stay in its thread's cache): 4096 from 131,072 CSFs (N2
        # CAS(12,12): smaller ranges cost 6 %), below that ncsf / 128, at least 256: many
        # ranges balance the threads and keep T and G small beside the vectors (N2 CAS(10,10)
        # triplet, 29,700 CSFs, 2 threads: 256 CSFs, T and G 0.45 MB in all against 1.6 MB at
        # 928 = ncsf / 32, for about 15 % more sigma CPU time; 4096 took 1.5x that of 928)
        self.range = 4096 if self.ncsf >= 2**17 else max(256, self.ncsf // 128)
        self._lists: dict[int, tuple] = {}
        self._held = 0  # bytes of the kept lists
        self._streamed: set[int] = set()  # blocks that did not fit the budget
        self._work = None  # (T, G) buffers reused between calls
        self._sigma_bufs = None  # per-thread sigma buffers (two threads or more)

    @property
    def steps(self) -> np.ndarray:
        """(ncsf, norb) uint8 step vectors (made on first use)."""
        if self._steps is None:
            self._steps = self.drt.steps()
        return self._steps

    @property
    def loop_bytes(self) -> int:
        """Bytes of the loop table (0 with the lists)."""
        return 0 if self.table is None else int(self.table.nbytes)

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

    def _thread_buffers(self, nbuf: int, out=None) -> np.ndarray:
        """(nbuf, ncsf) zeroed sigma buffers. Several are kept between calls and zeroed in place:
        fresh pages of that size cost more than the zeroing (page faults, most of all in a
        virtual machine); one is allocated per call (it is the result), or is `out` itself
        when that is contiguous."""
        if nbuf == 1:
            if out is not None and out.flags.c_contiguous:
                out.fill(0.0)
                return out.reshape(1, -1)
            return np.zeros((1, self.ncsf))
        return self._kept_buffers(nbuf)

    def scratch(self) -> np.ndarray | None:
        """A vector of ncsf doubles that the loop sigma keeps between calls (thread 1's buffer)
        and zeroes at the start of each: a caller may use it as work space between sigma calls
        (the host P-space preconditioner does). None where the sigma keeps no such buffer (one
        thread, the lists, no SciPy BLAS)."""
        nbuf = self.nthreads or self.mod.max_threads()
        if self.method != "loops" or nbuf < 2 or _dgemm() is None:
            return None
        buf = self._sigma_bufs
        if buf is None or buf.shape != (nbuf - 1, self.ncsf):
            buf = self._kept_buffers(nbuf - 1)
        return buf[0]

    def _kept_buffers(self, k: int) -> np.ndarray:
        """(k, ncsf) zeroed sigma buffers kept between calls."""
        buf = self._sigma_bufs
        if buf is None or buf.shape != (k, self.ncsf):
            self._sigma_bufs = None  # the old ones go first
            self._sigma_bufs = buf = np.zeros((k, self.ncsf))
        else:
            buf.fill(0.0)
        return buf

    def _chunks(self, i):
        """Row ranges of block i, each at most `rows` kets: the list arguments of each and the
        (start, count) of its kets (work buffers stay small whatever the block)."""
        k0, count = self.blocks[i]
        if self.method == "loops":  # nothing per block: the loop kernels take (k0, count)
            yield None, k0, count
            return
        off, bra, code, w = self.lists(i)
        for a in range(0, count, self.rows):
            b = min(count, a + self.rows)
            yield (off[a : b + 1], bra, code, w, self.steps[k0 + a : k0 + b], k0 + a), k0 + a, b - a

    # --- sigma -----------------------------------------------------------------------------------
    def contract(self, c: np.ndarray, V, h: np.ndarray | None = None, out=None) -> np.ndarray:
        """sum_PQ V[P,Q] E^sym_P E^sym_Q c + sum_P h[P] E^sym_P c, V and h over packed pairs.

        With V = 1/2 (pq|rs) (4-fold) and h = h' packed, this is (H - ecore) c; with V the
        absorbed h2eff of PySCF's `absorb_h1e` and h None, it is PySCF's `contract_2e`. V may
        also be a factored pair (A, B), A (npair, naux) and B (naux, npair), meaning V = A B
        (density fitting / Cholesky: A = L, B = 1/2 L^T): then g = (T A) B, two GEMMs of
        naux columns instead of one of npair. `out`, a float64 vector of ncsf entries (any
        stride; not `c`), receives the result in place of a new vector (returned).
        """
        c = np.ascontiguousarray(c, dtype=np.float64).reshape(-1)
        nbuf = self.nthreads or self.mod.max_threads()
        if out is not None:
            if out.shape != (self.ncsf,) or out.dtype != np.float64:
                raise ValueError(f"out must be a float64 vector of {self.ncsf} entries")
            if np.shares_memory(out, c):
                raise ValueError("out must not share memory with c")
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
        if self.method == "loops":
            return self._contract_loops(c, nbuf, V, A, B, out)
        sigma = self._thread_buffers(nbuf, out)  # one buffer per thread, summed at the end
        rows = min(self.rows, max(count for _, count in self.blocks))
        work = self._work
        if work is None or work[0].shape[0] < rows or work[0].shape[1] != ld or work[2] != naux:
            X = np.empty((rows, naux)) if naux else None
            self._work = work = (np.empty((rows, ld)), np.empty((rows, npair)), naux, X)
        T_all, G_all, _, X_all = work
        with _OneThreadBlas():
            for i in range(len(self.blocks)):
                for args, _, count in self._chunks(i):
                    T, G = T_all[:count], G_all[:count]
                    self.mod.gather_pairs(self.core, *args, self.symmap, npair, c, T, self.nthreads)
                    if A is None:
                        self._gemm(T, V, G)
                    else:
                        X = X_all[:count]
                        self._gemm(T, A, X)
                        self._gemm(X, B, G)
                    self.mod.scatter_pairs(
                        self.core, *args, self.symmap, npair, G, sigma, self.nthreads
                    )
        return _summed(sigma, out)

    def _contract_loops(self, c, nbuf, V, A, B, out=None) -> np.ndarray:
        """The loop-driven sigma in column form: T (ld, count), G = W T (npair, count) with
        W = V^T (V = [V; h] as `contract` extends it), or G = B^T (A^T T) for factors."""
        npair, mod, core, tab, sym, nt = (
            self.npair,
            self.mod,
            self.core,
            self.table,
            self.symmap,
            self.nthreads,
        )
        if A is None:
            ld = V.shape[0]
            W1, W2 = np.ascontiguousarray(V.T), None
        else:
            ld = A.shape[0]
            W1, W2 = np.ascontiguousarray(A.T), np.ascontiguousarray(B.T)
        dgemm = _dgemm()
        if dgemm is not None and nbuf > 1:
            # one pass: gather, GEMM and scatter per range of CSFs; thread 0 adds into the
            # result itself and the others into kept buffers, added to it in buffer order (the
            # sum of nbuf buffers, bit for bit, with one vector fewer)
            if out is not None and out.flags.c_contiguous:
                res = out
                res.fill(0.0)
            else:
                res = np.zeros(self.ncsf)
            others = self._kept_buffers(nbuf - 1)
            with _OneThreadBlas():
                mod.loop_sigma(
                    core, tab, sym, npair, c, ld, W1, W2, others, dgemm, self.range, nt, res
                )
            for buf in others:
                res += buf
            if out is not None and res is not out:
                out[...] = res
                return out
            return res
        sigma = self._thread_buffers(nbuf, out)  # one buffer per thread, summed at the end
        if dgemm is not None:  # one thread: the result is the buffer
            with _OneThreadBlas():
                mod.loop_sigma(core, tab, sym, npair, c, ld, W1, W2, sigma, dgemm, self.range, nt)
            return _summed(sigma, out)
        rows = max(count for _, count in self.blocks)
        key = ("loops", rows, ld, 0 if W2 is None else W1.shape[0])
        if self._work is None or self._work[0] != key:
            naux = 0 if W2 is None else W1.shape[0]
            self._work = (key, np.empty(ld * rows), np.empty(npair * rows), np.empty(naux * rows))
        _, Tb, Gb, Xb = self._work
        gemm = self._gemm
        with _OneThreadBlas():
            for k0, count in self.blocks:
                T = Tb[: ld * count].reshape(ld, count)
                G = Gb[: npair * count].reshape(npair, count)
                mod.loop_gather_pairs(core, tab, sym, npair, c, T, k0, count, nt)
                if W2 is None:
                    gemm(W1, T, G)
                else:
                    X = Xb[: W1.shape[0] * count].reshape(W1.shape[0], count)
                    gemm(W1, T, X)
                    gemm(W2, X, G)
                mod.loop_scatter_pairs(core, tab, sym, npair, G, k0, count, sigma, nt)
        return _summed(sigma, out)

    def _gemm(self, left, right, out) -> None:
        """out = left right, one slab of left's rows per engine thread (BLAS on one thread)."""
        n = self.nthreads or self.mod.max_threads()
        pool = self._pool(n)
        if pool is None or left.shape[0] < 2 * n:
            np.matmul(left, right, out=out)
            return
        cuts = np.linspace(0, left.shape[0], n + 1).astype(int)
        jobs = [
            pool.submit(np.matmul, left[a:b], right, out=out[a:b])
            for a, b in zip(cuts[:-1], cuts[1:], strict=True)
        ]
        for j in jobs:
            j.result()

    def _pool(self, n: int):
        """A pool of n threads for the GEMM slabs (None for one thread)."""
        if n <= 1:
            return None
        if getattr(self, "_gemm_pool", None) is None or self._gemm_pool[0] != n:
            from concurrent.futures import ThreadPoolExecutor

            self._gemm_pool = (n, ThreadPoolExecutor(n, thread_name_prefix="guga-gemm"))
        return self._gemm_pool[1]

    def diagonal(self, h1: np.ndarray, eri4: np.ndarray) -> np.ndarray:
        """Exact <m|H - ecore|m> of every CSF, from h1 (n, n) and 4-fold packed ERIs."""
        n = self.norb
        sym = self.symmap.reshape(n, n)
        g = eri4
        J = g[sym.diagonal()][:, sym.diagonal()]  # (pp|rr)
        K = g[sym, sym.T]  # K[p, q] = (pq|qp)
        hp = np.diag(h1) - 0.5 * K.sum(axis=1)  # h'_pp = h_pp - 1/2 sum_r (pr|rp)
        Kc = np.ascontiguousarray(K.reshape(-1))
        out = np.empty(self.ncsf)
        with _OneThreadBlas():  # small products: BLAS threads cost more than they give
            for k0, count in self.blocks:
                st = self.drt.steps(k0, count)  # steps 0..3: occupations 0, 1, 1, 2
                # 4096 CSFs at a time: the occupations and their products (8 norb bytes per CSF
                # each) stay small beside the vectors (a block's were the largest temporaries
                # of a solve at 30k CSFs); one steps call per block (each has a fixed cost)
                for a in range(0, count, 4096):
                    occ = ((st[a : a + 4096] + 1) >> 1).astype(np.float64)
                    d = occ @ hp
                    d += 0.5 * np.einsum("ij,ij->i", occ @ J, occ)
                    out[k0 + a : k0 + a + len(occ)] = d
        if self.method == "loops":
            for k0, count in self.blocks:
                out[k0 : k0 + count] += 0.5 * self.mod.loop_exchange_diagonal(
                    self.core, self.table, Kc, k0, count, self.nthreads
                )
            return out
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
        if self.method == "loops":
            mod, tab = self.mod, self.table
            for k0, count in self.blocks:
                tk = mod.loop_gather_generators(self.core, tab, ket, k0, count, self.nthreads)
                tb = (
                    tk
                    if same
                    else mod.loop_gather_generators(self.core, tab, bra, k0, count, self.nthreads)
                )
                M += tb.T @ tk
                d1 += bra[k0 : k0 + count] @ tk
            return d1.reshape(n, n), M
        for i in range(len(self.blocks)):
            for args, k0, count in self._chunks(i):
                tk = self.mod.gather_generators(self.core, *args, ket, self.nthreads)
                tb = (
                    tk if same else self.mod.gather_generators(self.core, *args, bra, self.nthreads)
                )
                M += tb.T @ tk
                d1 += bra[k0 : k0 + count] @ tk
        return d1.reshape(n, n), M
