"""GUGA CI on a CUDA GPU: the operator-direct sigma with every vector resident on the device.

The CPU engine (`cuscikit.guga.sigma.Engine`) applies a table of loops to ranges of CSFs (or
stored coupling lists) and scatters into one buffer per thread. On the GPU nothing is stored:
each CSF's loops are searched again by the thread that owns it (cuscikit/guga_loops.hpp, the
same code the CPU extension runs over a host loop in ``_core.guga_rows``), and both halves of
sigma are gathers, so every output is summed by one thread in a fixed order and repeated runs
agree bit for bit:

1. T[k, P] = ((E_pq + E_qp) c)_k and T[k, P(r,r)] = n_r(k) c_k, plus a column c_k (kernel
   ``gather``, one thread per ket k of a tile of rows; each thread sums the columns of one
   start orbital in shared memory and stores every column of its row once);
2. G = T [1/2 (pq|rs); h'] with a float64 GEMM (torch.matmul, i.e. cuBLAS), tile by tile into
   a resident G of up to ``n_csf`` rows; with factored integrals V = A B (density fitting or
   Cholesky, A = L, B = 1/2 L^T) two GEMMs, G = (T A) B;
3. sigma_m = sum_r n_r(m) G[m, P(r,r)] + sum over the couplings <k|E_pq|m> of m (as a ket) of
   <k|E_pq|m> G[k, P(pq)] (kernel ``sigma``, one thread per output CSF m). E_pq + E_qp is
   symmetric, so the couplings of m as a ket are exactly the terms that reach sigma_m.

The threads take the CSFs of a tile in the order of their number of couplings (counted once
per table, ``balance``), so that the threads of a warp get similar work; each output keeps its
one owner, so the order changes no bit (off by default: slower on the H200).

When G does not fit the memory budget (CAS(18,18): 4.5 x 10^8 CSFs x 171 pairs, 615 GB), the
default (``chunking="scatter"``) keeps G one tile at a time: after the GEMM of a tile, step 3
runs from the tile's kets (kernel ``scatter``): every <m|E^sym_P|k> G[k, P] is rounded to a
multiple of 2^-e and added, as two integer limbs, with atomic reductions into two 64-bit words
per output (a sum whose value does not depend on the order of the additions; e from a bound of
the terms, each term's rounding at most 2^-e-1, far below the double's), and kernel
``fixed_values`` turns the sums into doubles: two loop searches per sigma as with G whole,
16 bytes per CSF for the sums, and the same bits in every run. ``chunking="rows"`` builds G in
chunks of rows and runs step 3 once per chunk instead (each pass adds the chunk's share in
chunk order; one more search of every CSF per chunk). Either way the solve slows down instead
of failing. The density matrices use the same gather with the map (p, q) -> (q, p):
t[k, r s] = (E_rs c)_k, M = t_bra^T t_ket by GEMM.

Example (needs a CUDA GPU and the compiled ``cuscikit._cuda``):
    >>> import numpy as np
    >>> from cuscikit.guga.drt import DRT
    >>> eng = GpuEngine(DRT(4, 4, 0))  # doctest: +SKIP
    >>> h1 = np.diag([-2.0, -1.0, 0.5, 1.0]); g = np.zeros((10, 10))
    >>> float(eng.diagonal(h1, g).min())  # doctest: +SKIP
    -6.0
"""

from __future__ import annotations

import numpy as np

from cuscikit.guga.drt import DRT
from cuscikit.guga.sigma import pair_index

__all__ = ["GpuEngine", "generator_map"]


def generator_map(norb: int) -> np.ndarray:
    """(norb*norb,) int32 map from code p*norb + q to column q*norb + p (and r*norb + r to
    itself): the gather with this map gives t[k, r*norb + s] = (E_rs c)_k."""
    p, q = np.divmod(np.arange(norb * norb), norb)
    return (q * norb + p).astype(np.int32)


def _load_kernels():
    from cuscikit.backends.loader import CudaUnavailableError, cuda

    mod = cuda()  # a CudaUnavailableError naming what is missing
    kernels = getattr(mod, "guga", None)
    if kernels is None:
        raise CudaUnavailableError(
            "cuscikit._cuda was built without the GUGA kernels (ext/cuda/guga); rebuild it"
        )
    return kernels


class GpuEngine:
    """The GUGA sigma, diagonal and density kernels of one DRT on a CUDA device.

    Args:
        drt: the table.
        device: a CUDA device ("cuda", "cuda:1", ...).
        max_memory: bytes the solve may hold on the device in all (None: what is free); PyTorch's
            allocator is capped there too (`cuscikit.backends.MemoryBudget`).
        reserve: bytes kept for the caller's vectors (the Davidson subspace) when the work
            buffers are sized.
        tile_rows: kets per gather / GEMM tile (the T buffer; None: the class default).
        kernels: the module of kernels (default ``cuscikit._cuda.guga``); the tests pass a host
            twin over ``cuscikit._core.guga_rows`` to run this orchestration on the CPU.
        chunking: where G does not fit whole: "scatter" (the class default: G one tile at a
            time, sigma's second half scattered from each tile into order-independent
            fixed-point sums, 16 bytes per CSF) or "rows" (G in chunks of rows, one sigma pass
            over all CSFs per chunk).

    Raises:
        CudaUnavailableError: no GPU, no PyTorch CUDA, or no compiled GUGA kernels.
        ValueError: the budget cannot hold one tile beside the reserve.

    Attributes (class defaults, measured on an H200, docs/guga_gpu.md): ``split_gather`` and
    ``split_sigma`` run the two gathers with one CSF per warp (its searches over the lanes)
    instead of one per thread; ``balance`` sorts the CSFs of every tile by their number of
    couplings for the per-thread kernels (an int32 per CSF; slower on the H200: it loses the
    locality of the lexical order); ``tile_rows`` is the largest tile (the budget decides: G
    whole first, then T as large as fits); ``factor_rows`` the rows of one slice of T A with
    factored integrals. Each tile is one launch that waits for its slowest warp, so larger tiles
    are faster: the gather of CAS(16,16) took 1.73 s with tiles of 2^18 kets, 1.29 s with 2^20
    and 1.17 s with one tile (2n slots per thread; 0.69 s with one tile and n slots).
    """

    split_gather: bool = False
    split_sigma: bool = False
    balance: bool = False
    chunking: str = "scatter"
    tile_rows: int = 1 << 25
    factor_rows: int = 1 << 16
    fixed_bits: int = 62

    def __init__(
        self,
        drt: DRT,
        device="cuda",
        max_memory: int | None = None,
        reserve: int = 0,
        tile_rows: int | None = None,
        kernels=None,
        chunking: str | None = None,
    ):
        self.kernels = _load_kernels() if kernels is None else kernels
        import torch

        from cuscikit.backends.loader import resolve_device
        from cuscikit.backends.memory import MemoryBudget

        self.torch = torch
        dev = resolve_device(device)
        if dev.type != "cuda" and kernels is None:
            raise ValueError(f"GpuEngine needs a CUDA device, got {dev}")
        self.budget = MemoryBudget(dev, max_memory)
        self.device = self.budget.device
        self.drt = drt
        n = drt.norb
        self.norb = n
        self.npair = n * (n + 1) // 2
        self.ncsf = int(drt.n_csf)
        self.symmap = pair_index(n)

        def dev_i32(a):
            return torch.as_tensor(np.ascontiguousarray(a, dtype=np.int32).reshape(-1), device=dev)

        self._tables = (
            dev_i32(drt.up),
            dev_i32(drt.down),
            dev_i32(drt.b),
            torch.as_tensor(np.ascontiguousarray(drt.y, dtype=np.int64).reshape(-1), device=dev),
            torch.empty(6 * 4 * 4 * 2 * (n + 3), dtype=torch.float64, device=dev),
        )
        self.core = self.kernels.Drt(n, int(drt.head), *self._tables, self.ncsf)
        self._symmap = dev_i32(self.symmap)
        self._genmap = dev_i32(generator_map(n))
        self._order = self._order_key = None
        if chunking is not None:
            self.chunking = chunking
        self._plan(int(reserve), int(tile_rows or self.tile_rows))
        self._T = self._G = self._X = self._acc = None
        self._steps = None

    # --- memory ----------------------------------------------------------------------------------
    def _plan(self, reserve: int, tile_rows: int) -> None:
        """Tile rows of T and rows of G from the budget left beside `reserve`: G whole if it
        fits beside a tile, else (``chunking``) G by tiles with the scatter form of sigma, or G
        in chunks of rows with one sigma pass per chunk."""
        avail = self.budget.available() - reserve
        if self._balanced():
            avail -= 4 * self.ncsf  # the order
        t_row, g_row = 8 * (self.npair + 1), 8 * self.npair
        rows = max(1, min(self.ncsf, tile_rows))
        min_rows = min(self.ncsf, 256)
        self.mode = "whole"
        # G whole first (each chunk of G repeats the sigma pass), then the largest tile of T
        # (each tile is one launch that waits for its slowest warp)
        whole = self.ncsf * g_row
        if whole + min(rows, 1 << 20) * t_row <= avail:
            self.rows = int(min(rows, (avail - whole) // t_row))
            self.g_rows = self.ncsf
            self.n_chunks = 1
            return
        if self.chunking not in ("scatter", "rows"):
            raise ValueError(f"chunking must be 'scatter' or 'rows', got {self.chunking!r}")
        if self.chunking == "scatter":  # G lives one tile at a time beside the sums
            avail -= 16 * self.ncsf
            rows = int(min(rows, max(avail, 0) // (t_row + g_row)))
        while rows > min_rows and rows * (t_row + g_row) > avail:
            rows //= 2
        if rows < 1 or rows * (t_row + g_row) > avail:
            rows = max(rows, 1)
            raise ValueError(
                f"the device budget leaves {max(avail, 0):,} bytes beside {reserve:,} for the "
                f"vectors: too little for one tile of {rows} CSFs ({rows * (t_row + g_row):,} "
                f"bytes); raise the memory cap or shrink the Davidson space"
            )
        self.rows = rows
        if self.chunking == "scatter":
            self.mode = "scatter"
            self.g_rows = rows
            self.n_chunks = 1
            return
        self.mode = "rows"
        self.g_rows = int(min(self.ncsf, max(rows, (avail - rows * t_row) // g_row)))
        self.n_chunks = -(-self.ncsf // self.g_rows)

    def use_scatter(self, rows: int) -> None:
        """G by tiles of `rows` kets and the scatter form of sigma, whatever fits (the tests
        force small tiles with it)."""
        self.release()
        self.mode, self.rows, self.g_rows, self.n_chunks = "scatter", int(rows), int(rows), 1

    def _buffers(self):
        if self._T is None:
            torch, f64 = self.torch, self.torch.float64
            self._T = torch.empty((self.rows, self.npair + 1), dtype=f64, device=self.device)
            self._G = torch.empty((self.g_rows, self.npair), dtype=f64, device=self.device)
            if self.mode == "scatter":
                self._acc = torch.empty(2 * self.ncsf, dtype=torch.int64, device=self.device)
        return self._T, self._G

    def release(self) -> None:
        """Free the work buffers (they are made again on the next sigma)."""
        self._T = self._G = self._X = self._acc = None

    def _balanced(self) -> bool:
        return self.balance and self.ncsf < 2**31

    def _tiles(self):
        """(g0, gc, [(t0, tc), ...]) for each chunk of G: the tiles of T, in the order of sigma."""
        for g0 in range(0, self.ncsf, self.g_rows):
            gc = min(self.g_rows, self.ncsf - g0)
            yield (
                g0,
                gc,
                [(t0, min(self.rows, g0 + gc - t0)) for t0 in range(g0, g0 + gc, self.rows)],
            )

    def order(self):
        """The CSFs in the threads' order (a device int32 vector), or None without ``balance``:
        every tile of T sorted by the CSFs' number of couplings, most first (each tile keeps
        its own CSFs, so the rows of T stay in place)."""
        if not self._balanced() or self.split_gather:
            return None
        key = (self.rows, self.g_rows)
        if self._order_key != key:
            torch = self.torch
            self._order = None
            counts = torch.empty(self.ncsf, dtype=torch.int32, device=self.device)
            self.kernels.coupling_counts(self.core, 0, counts, self._stream())
            keys = torch.empty(self.ncsf, dtype=torch.int64, device=self.device)
            i = 0
            for _, _, tiles in self._tiles():
                for t0, tc in tiles:
                    keys[t0 : t0 + tc] = i << 32
                    i += 1
            keys -= counts.to(torch.int64)  # most couplings first within a tile
            del counts
            self._order = torch.argsort(keys, stable=True).to(torch.int32)
            self._order_key = key
        return self._order

    def _stream(self) -> int:
        if self.device.type != "cuda":
            return 0
        return self.torch.cuda.current_stream(self.device).cuda_stream

    def _dev(self, a):
        torch = self.torch
        return torch.as_tensor(a, dtype=torch.float64, device=self.device).contiguous()

    @property
    def steps(self) -> np.ndarray:
        """Step vectors (n_csf, norb) uint8 on the host (made on first use)."""
        if self._steps is None:
            self._steps = self.drt.steps()
        return self._steps

    # --- sigma -----------------------------------------------------------------------------------
    def operator(self, V, h: np.ndarray | None = None):
        """What `sigma` contracts with: the (npair + 1, npair) device matrix [V; h], or for a
        factored V = (A, B) (A (npair, naux), B (naux, npair)) the pair of device matrices
        ([[A, 0], [0, 1]], [B; h]): G = (T A') B' adds c_k h to each row as [V; h] does."""
        npair = self.npair
        h = np.zeros(npair) if h is None else np.asarray(h, dtype=np.float64).reshape(-1)
        if h.shape != (npair,):
            raise ValueError(f"h must hold npair = {npair} entries, got {h.shape}")
        if isinstance(V, tuple):
            A, B = (np.asarray(x, dtype=np.float64) for x in V)
            if A.ndim != 2 or A.shape[0] != npair or B.shape != (A.shape[1], npair):
                raise ValueError(f"factors must be (npair, naux) and (naux, npair), npair={npair}")
            naux = A.shape[1]
            A1 = np.zeros((npair + 1, naux + 1))
            A1[:npair, :naux], A1[npair, naux] = A, 1.0
            return self._dev(A1), self._dev(np.vstack([B, h[None, :]]))
        V = np.asarray(V, dtype=np.float64)
        if V.shape != (npair, npair):
            raise ValueError(f"V must be (npair, npair) = ({npair}, {npair}), got {V.shape}")
        return self._dev(np.vstack([V, h[None, :]]))

    def _gemm(self, T, Vh, out) -> None:
        """out = T Vh, or (T A) B for a factored operator (A, B)."""
        torch = self.torch
        if not isinstance(Vh, tuple):
            torch.matmul(T, Vh, out=out)
            return
        A, B = Vh
        step = min(self.rows, self.factor_rows)
        if self._X is None or self._X.shape != (step, A.shape[1]):
            self._X = torch.empty((step, A.shape[1]), dtype=torch.float64, device=self.device)
        for r0 in range(0, T.shape[0], step):  # T A in slices of factor_rows rows
            r1 = min(r0 + step, T.shape[0])
            X = self._X[: r1 - r0]
            torch.matmul(T[r0:r1], A, out=X)
            torch.matmul(X, B, out=out[r0:r1])

    def sigma(self, c, Vh):
        """sum_PQ V[P,Q] E^sym_P E^sym_Q c + sum_P h[P] E^sym_P c for a device vector c (float64,
        n_csf) and Vh = `operator`(V, h); returns a new device vector."""
        torch, k = self.torch, self.kernels
        c = c.contiguous()
        out = torch.empty(self.ncsf, dtype=torch.float64, device=self.device)
        T_all, G_all = self._buffers()
        s = self._stream()
        if self.mode == "scatter":
            e = self.fixed_exponent(c, Vh)
            acc = self._acc
            acc.zero_()
            for t0 in range(0, self.ncsf, self.rows):
                tc = min(self.rows, self.ncsf - t0)
                T, G = T_all[:tc], G_all[:tc]
                k.gather(self.core, t0, self._symmap, self.npair, c, T, False, None, True, s)
                self._gemm(T, Vh, G)
                k.scatter(self.core, t0, self._symmap, G, e, acc, s)
            k.fixed_values(acc, e, out, s)
            return out
        order = self.order()
        for g0, gc, tiles in self._tiles():
            G = G_all[:gc]
            for t0, tc in tiles:
                T = T_all[:tc]
                k.gather(
                    self.core, t0, self._symmap, self.npair, c, T, self.split_gather, order, True, s
                )
                self._gemm(T, Vh, G[t0 - g0 : t0 - g0 + tc])
            sigma_order = None if self.split_sigma else order
            k.sigma(
                self.core, 0, self._symmap, G, g0, out, g0 > 0, self.split_sigma, sigma_order, s
            )
        return out

    def fixed_exponent(self, c, Vh) -> int:
        """e of the scatter's fixed-point sums (multiples of 2^-e) for this c and operator:
        every term <m|E^sym_P|k> G[k, P] and every diagonal term sum_r n_r G[k, P(r,r)] has
        |t| <= 2^(fixed_bits - 1) 2^-e (the sums allow up to 2^76). With ||E_pq + E_qp|| <= 4,
        |T[k, P]| <= 4 ||c||_2 and |G[k, Q]| <= 4 ||c||_2 max_Q sum_P |Vh[P, Q]|; a term is at
        most 2 n times that. With ``fixed_bits`` = 62 a term needs the hi word (an atomic of its
        own) only when it exceeds about 2^-17 of that bound: one atomic for most terms."""
        torch = self.torch
        if not 60 <= int(self.fixed_bits) <= 76:
            raise ValueError(f"fixed_bits must be in 60..76, got {self.fixed_bits}")
        if isinstance(Vh, tuple):
            col = (Vh[0].abs() @ Vh[1].abs()).sum(0).max()
        else:
            col = Vh.abs().sum(0).max()
        bound = float((8.0 * self.norb * torch.linalg.vector_norm(c) * col).item())
        if not np.isfinite(bound):
            raise ValueError("the vector or the operator holds a non-finite value")
        if bound == 0.0:
            return 0
        top = int(self.fixed_bits) - 1
        return int(np.clip(top - int(np.ceil(np.log2(bound))), -1000, 1000))

    def contract(self, c, V, h=None):
        """`Engine.contract` on the device: numpy in, numpy out (a tensor stays a tensor)."""
        Vh = self.operator(V, h)
        if self.torch.is_tensor(c):
            return self.sigma(self._dev(c).reshape(-1), Vh)
        return self.sigma(self._dev(np.asarray(c).reshape(-1)), Vh).cpu().numpy()

    # --- diagonal --------------------------------------------------------------------------------
    def diagonal_device(self, h1: np.ndarray, eri4: np.ndarray):
        """Exact <m|H - ecore|m> of every CSF as a device vector (h1 (n, n), 4-fold ERIs)."""
        n = self.norb
        sym = self.symmap.reshape(n, n)
        g = np.asarray(eri4, dtype=np.float64)
        J = g[sym.diagonal()][:, sym.diagonal()]  # (pp|rr)
        K = g[sym, sym.T]  # K[p, q] = (pq|qp)
        hp = np.diag(np.asarray(h1, dtype=np.float64)) - 0.5 * K.sum(axis=1)
        out = self.torch.empty(self.ncsf, dtype=self.torch.float64, device=self.device)
        self.kernels.diagonal(
            self.core,
            0,
            self._dev(hp),
            self._dev(J.reshape(-1)),
            self._dev(K.reshape(-1)),
            out,
            self._stream(),
        )
        return out

    def diagonal(self, h1: np.ndarray, eri4: np.ndarray) -> np.ndarray:
        """`Engine.diagonal`: the exact diagonal as a host array."""
        return self.diagonal_device(h1, eri4).cpu().numpy()

    # --- density matrices ------------------------------------------------------------------------
    def generator_products(self, bra, ket) -> tuple:
        """(d1, M) as `Engine.generator_products`: d1[r, s] = <bra|E_rs|ket>,
        M[(q,p), (r,s)] = (E_qp bra).(E_rs ket), accumulated tile by tile on the device."""
        torch, k = self.torch, self.kernels
        n, nn = self.norb, self.norb * self.norb
        same = bra is ket or (
            not torch.is_tensor(bra) and np.array_equal(np.asarray(bra), np.asarray(ket))
        )
        b = self._dev(bra).reshape(-1)
        kt = b if same else self._dev(ket).reshape(-1)
        self.release()  # G's memory goes to the two tiles below (sigma makes it again)
        rows = max(1, min(self.rows, (self.rows * (2 * self.npair + 1)) // (2 * nn)))
        tk_all = torch.empty((rows, nn), dtype=torch.float64, device=self.device)
        tb_all = tk_all if same else torch.empty_like(tk_all)
        M = torch.zeros((nn, nn), dtype=torch.float64, device=self.device)
        d1 = torch.zeros(nn, dtype=torch.float64, device=self.device)
        s = self._stream()
        for t0 in range(0, self.ncsf, rows):
            tc = min(rows, self.ncsf - t0)
            tk = tk_all[:tc]
            k.gather(self.core, t0, self._genmap, nn, kt, tk, self.split_gather, None, False, s)
            tb = tk
            if not same:
                tb = tb_all[:tc]
                k.gather(self.core, t0, self._genmap, nn, b, tb, self.split_gather, None, False, s)
            M += tb.T @ tk
            d1 += b[t0 : t0 + tc] @ tk
        return d1.reshape(n, n).cpu().numpy(), M.cpu().numpy()
