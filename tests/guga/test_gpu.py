"""GUGA CI on the GPU against the CPU engine.

Without a GPU: the per-CSF rows that the CUDA kernels run (``_core.guga_rows``, the same
header) against the CPU engine, and the GPU engine's tiling and chunking on the host through a
twin of the kernels. With a GPU (marked ``gpu``): sigma to 1e-12 (relative, max norm) for
several DRTs and spins, with G whole and in chunks; energies to 1e-10; density matrices;
repeated runs bitwise equal.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cuscikit import _core
from cuscikit.guga import DRT, GUGASolver
from cuscikit.guga.gpu import GpuEngine, generator_map
from cuscikit.guga.sigma import Engine, pair_index
from tests.conftest import packed_random_integrals

# (norb, nelec, 2S): closed and open shells, below and above half filling, high spin
SPACES = [(6, 6, 0), (7, 6, 2), (8, 7, 1), (8, 8, 4), (9, 11, 3), (10, 8, 0)]


def _operator(n: int, seed: int):
    """(V, h) over packed pairs as the solver passes them: symmetric V, any h."""
    rng = np.random.default_rng(seed)
    npair = n * (n + 1) // 2
    V = rng.standard_normal((npair, npair))
    return 0.5 * (V + V.T), rng.standard_normal(npair)


def _rel(a, b) -> float:
    return float(np.abs(np.asarray(a) - np.asarray(b)).max() / np.abs(np.asarray(b)).max())


def _rows_drt(drt: DRT):
    return _core.guga_rows.Drt(
        drt.norb,
        drt.head,
        drt.up.reshape(-1),
        drt.down.reshape(-1),
        drt.b,
        drt.y.reshape(-1),
        drt.n_csf,
    )


# --- the device rows on the host ------------------------------------------------------------------
@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("space", SPACES)
def test_rows_sigma_matches_cpu_engine(space, split):
    drt = DRT(*space)
    n = drt.norb
    rows, eng = _rows_drt(drt), Engine(drt)
    V, h = _operator(n, 1)
    c = np.random.default_rng(2).standard_normal(drt.n_csf)
    ref = eng.contract(c, V, h)
    npair = n * (n + 1) // 2
    T = _core.guga_rows.gather(rows, 0, drt.n_csf, pair_index(n), npair, npair + 1, c, split)
    args = (rows, 0, drt.n_csf, pair_index(n), npair, npair + 1, c, split, None, True)
    assert np.array_equal(_core.guga_rows.gather(*args), T)  # one slot per pair: the same bits
    G = np.ascontiguousarray(T @ np.vstack([V, h[None]]))
    whole = _core.guga_rows.sigma(rows, 0, drt.n_csf, pair_index(n), G, 0, split)
    assert _rel(whole, ref) < 1e-13
    # G in three chunks of rows: the shares add up to the same sigma
    cuts = [0, drt.n_csf // 3, 2 * drt.n_csf // 3, drt.n_csf]
    parts = sum(
        _core.guga_rows.sigma(rows, 0, drt.n_csf, pair_index(n), G[a:b].copy(), a, split)
        for a, b in zip(cuts[:-1], cuts[1:], strict=True)
    )
    assert _rel(parts, ref) < 1e-13


@pytest.mark.parametrize("space", SPACES[:4])
def test_rows_diagonal_and_generators_match_cpu_engine(space):
    drt = DRT(*space)
    n = drt.norb
    rows, eng = _rows_drt(drt), Engine(drt)
    h1, g4, g = packed_random_integrals(n, 3)
    K = np.einsum("pqqp->pq", g)
    J = np.einsum("ppqq->pq", g)
    hp = np.diag(h1) - 0.5 * K.sum(axis=1)
    diag = _core.guga_rows.diagonal(rows, 0, drt.n_csf, hp, J.reshape(-1), K.reshape(-1))
    assert np.abs(diag - eng.diagonal(h1, g4)).max() < 1e-12
    c = np.random.default_rng(4).standard_normal(drt.n_csf)
    d1, M = eng.generator_products(c, c)
    for split in (False, True):
        t = _core.guga_rows.gather(rows, 0, drt.n_csf, generator_map(n), n * n, n * n, c, split)
        assert np.abs(t.T @ t - M).max() < 1e-10 * np.abs(M).max()
        assert np.abs(c @ t - d1.reshape(-1)).max() < 1e-10 * np.abs(d1).max()


def test_rows_reject_bad_input():
    drt = DRT(6, 6, 0)
    rows = _rows_drt(drt)
    c = np.ones(drt.n_csf)
    with pytest.raises(ValueError, match="CSF range"):
        _core.guga_rows.gather(rows, 0, drt.n_csf + 1, pair_index(6), 21, 22, c)
    with pytest.raises(ValueError, match="colmap entries"):
        _core.guga_rows.gather(rows, 0, 4, pair_index(6), 10, 22, c)
    with pytest.raises(ValueError, match="not symmetric"):
        _core.guga_rows.gather(rows, 0, 4, generator_map(6), 36, 36, c, False, None, True)


class _HostKernels:
    """The kernels of ``cuscikit._cuda.guga`` over ``_core.guga_rows`` on torch CPU tensors (the
    warp-split rows, as the GPU runs them)."""

    R = _core.guga_rows

    @staticmethod
    def Drt(norb, head, up, down, b, y, seg, ncsf):
        return _core.guga_rows.Drt(norb, head, up.numpy(), down.numpy(), b.numpy(), y.numpy(), ncsf)

    @staticmethod
    def _np(order):
        return None if order is None else order.numpy()

    def gather(self, core, k0, colmap, ncol, c, T, split, order, symmetric, stream):
        cm, o, ld = colmap.numpy(), self._np(order), T.shape[1]
        out = self.R.gather(core, k0, T.shape[0], cm, ncol, ld, c.numpy(), split, o, symmetric)
        T.copy_(torch.from_numpy(out))

    def sigma(self, core, m0, symmap, G, g0, out, accumulate, split, order, stream):
        G = G.contiguous().numpy()
        s = self.R.sigma(core, m0, out.shape[0], symmap.numpy(), G, g0, split, self._np(order))
        s = torch.from_numpy(s)
        out.copy_(out + s if accumulate else s)

    def coupling_counts(self, core, k0, out, stream):
        out.copy_(torch.from_numpy(self.R.coupling_counts(core, k0, out.shape[0])))

    def scatter(self, core, k0, symmap, G, e, acc, stream):
        G = G.contiguous().numpy()
        acc.copy_(torch.from_numpy(self.R.scatter(core, k0, symmap.numpy(), G, e, acc.numpy())))

    def fixed_values(self, acc, e, out, stream):
        out.copy_(torch.from_numpy(self.R.fixed_values(acc.numpy(), e)))

    def diagonal(self, core, k0, hp, J, K, out, stream):
        out.copy_(
            torch.from_numpy(
                self.R.diagonal(core, k0, out.shape[0], hp.numpy(), J.numpy(), K.numpy())
            )
        )


@pytest.mark.parametrize("space,split", [((8, 7, 1), False), ((9, 11, 3), True)])
def test_engine_tiles_and_chunks_on_host_twin(space, split):
    """Tiles of T and chunks of G (several sigma passes) give the CPU engine's sigma."""
    drt = DRT(*space)
    n = drt.norb
    gpu = GpuEngine(drt, "cpu", tile_rows=97, kernels=_HostKernels())
    gpu.split_gather = gpu.split_sigma = split
    gpu.g_rows = 3 * 97 + 5  # force several chunks of G, the last one short
    V, h = _operator(n, 5)
    c = np.random.default_rng(6).standard_normal(drt.n_csf)
    ref = Engine(drt).contract(c, V, h)
    assert _rel(gpu.contract(c, V, h), ref) < 1e-13
    h1, g4, _ = packed_random_integrals(n, 7)
    assert np.abs(gpu.diagonal(h1, g4) - Engine(drt).diagonal(h1, g4)).max() < 1e-12
    d1, M = gpu.generator_products(c, c)
    d1r, Mr = Engine(drt).generator_products(c, c)
    assert _rel(M, Mr) < 1e-13 and _rel(d1, d1r) < 1e-13


def test_balanced_order_and_factored_operator_on_host_twin():
    """The work-sorted order of the CSFs changes no bit of sigma; a factored operator (A, B)
    gives the CPU engine's factored sigma; the order and the factors are checked."""
    drt = DRT(9, 9, 1)
    n, npair = 9, 45
    V, h = _operator(n, 22)
    c = np.random.default_rng(23).standard_normal(drt.n_csf)
    plain = GpuEngine(drt, "cpu", tile_rows=150, kernels=_HostKernels())
    plain.balance = False
    sorted_ = GpuEngine(drt, "cpu", tile_rows=150, kernels=_HostKernels())
    sorted_.balance = True
    # chunks of G, tiles that do not divide them
    plain.g_rows = sorted_.g_rows = 2 * 150 + 7
    order = sorted_.order().numpy()
    assert sorted(order) == list(range(drt.n_csf)) and not np.array_equal(order, np.sort(order))
    counts = _core.guga_rows.coupling_counts(_rows_drt(drt), 0, drt.n_csf)
    for _, _, tiles in sorted_._tiles():  # every tile keeps its CSFs, most couplings first
        for t0, tc in tiles:
            assert sorted(order[t0 : t0 + tc]) == list(range(t0, t0 + tc))
            assert np.all(np.diff(counts[order[t0 : t0 + tc]]) <= 0)
    assert np.array_equal(sorted_.contract(c, V, h), plain.contract(c, V, h))
    rng = np.random.default_rng(24)
    A, B = rng.standard_normal((npair, 30)), rng.standard_normal((30, npair))
    ref = Engine(drt).contract(c, (A, B), h)
    assert _rel(sorted_.contract(c, (A, B), h), ref) < 1e-13
    assert _rel(sorted_.contract(c, (A, B)), Engine(drt).contract(c, (A, B))) < 1e-13
    with pytest.raises(ValueError, match="factors must be"):
        sorted_.operator((A, B[:, :-1]))
    with pytest.raises(ValueError, match="V must be"):
        sorted_.operator(V[:-1])
    rows = _rows_drt(drt)
    bad = np.arange(drt.n_csf, dtype=np.int32)
    bad[[0, 5]] = bad[[5, 0]]  # swaps CSFs of two different ranges
    with pytest.raises(ValueError, match="order must permute"):
        _core.guga_rows.gather(rows, 0, 4, pair_index(n), npair, npair + 1, c, False, bad)


@pytest.mark.parametrize("space", [(8, 7, 1), (9, 11, 3), (10, 8, 0)])
def test_scatter_on_host_twin_matches_whole_g_and_cpu(space):
    """G by small tiles with the scatter form of sigma (fixed-point sums): the CPU engine's sigma
    and the whole-G gather to 1e-13, dense and factored; repeated runs bitwise equal (the tile
    size may change bits of G through the GEMM, not through the sums)."""
    drt = DRT(*space)
    n, npair = drt.norb, drt.norb * (drt.norb + 1) // 2
    V, h = _operator(n, 31)
    rng = np.random.default_rng(32)
    c = rng.standard_normal(drt.n_csf)
    whole = GpuEngine(drt, "cpu", kernels=_HostKernels())
    assert whole.mode == "whole"
    ref, ref_whole = Engine(drt).contract(c, V, h), whole.contract(c, V, h)
    for rows in (61, 256, drt.n_csf):
        tiles = GpuEngine(drt, "cpu", kernels=_HostKernels())
        tiles.use_scatter(rows)
        got = tiles.contract(c, V, h)
        assert _rel(got, ref) < 1e-13 and _rel(got, ref_whole) < 1e-13
        assert np.array_equal(got, tiles.contract(c, V, h))
    A, B = rng.standard_normal((npair, 2 * n)), rng.standard_normal((2 * n, npair))
    assert _rel(tiles.contract(c, (A, B), h), Engine(drt).contract(c, (A, B), h)) < 1e-13
    # a vector of widely spread magnitudes: the rounding of the terms stays far below 1e-13
    c2 = c * np.exp(rng.uniform(-20, 0, drt.n_csf))
    assert _rel(tiles.contract(c2, V, h), Engine(drt).contract(c2, V, h)) < 1e-13
    assert not np.any(tiles.contract(np.zeros(drt.n_csf), V, h))


def test_scatter_sums_do_not_depend_on_the_order():
    """The fixed-point words after the scatter of the tiles in one order and in reverse are the
    same; they are what the engine turns into sigma."""
    drt = DRT(8, 8, 2)
    n, npair = 8, 36
    R, rows = _core.guga_rows, _rows_drt(drt)
    V, h = _operator(n, 33)
    c = np.random.default_rng(34).standard_normal(drt.n_csf)
    T = R.gather(rows, 0, drt.n_csf, pair_index(n), npair, npair + 1, c, False, None, True)
    G = np.ascontiguousarray(T @ np.vstack([V, h[None, :]]))
    eng = GpuEngine(drt, "cpu", kernels=_HostKernels())
    e = eng.fixed_exponent(torch.from_numpy(c), eng.operator(V, h))
    tiles = [(t0, min(50, drt.n_csf - t0)) for t0 in range(0, drt.n_csf, 50)]
    words = []
    for order in (tiles, tiles[::-1]):
        acc = np.zeros(2 * drt.n_csf, dtype=np.int64)
        for t0, tc in order:
            acc = R.scatter(rows, t0, pair_index(n), G[t0 : t0 + tc], e, acc)
        words.append(acc)
    assert np.array_equal(words[0], words[1])
    sigma = R.fixed_values(words[0], e)
    assert _rel(sigma, Engine(drt).contract(c, V, h)) < 1e-13
    with pytest.raises(ValueError, match="acc"):
        R.scatter(rows, 0, pair_index(n), G[:10], e, acc[:-1])
    with pytest.raises(ValueError, match="2 words"):
        R.fixed_values(acc[:-1], e)


@pytest.mark.parametrize("chunking", ["scatter", "rows"])
def test_tight_budget_picks_the_chunking(chunking):
    """A budget below n_csf rows of G: tiles with the scatter (one pass) or chunks of rows of G
    (several passes); both give the CPU engine's sigma."""
    drt = DRT(9, 9, 1)
    n, npair = 9, 45
    # a host budget (90 % of the cap) of a third of G and the fixed-point sums
    cap = int(((drt.n_csf * 8 * npair) // 3 + 16 * drt.n_csf) / 0.9)
    eng = GpuEngine(drt, "cpu", cap, tile_rows=400, kernels=_HostKernels(), chunking=chunking)
    assert eng.mode == chunking
    assert (eng.n_chunks >= 3) if chunking == "rows" else (eng.g_rows == eng.rows <= 400)
    V, h = _operator(n, 35)
    c = np.random.default_rng(36).standard_normal(drt.n_csf)
    assert _rel(eng.contract(c, V, h), Engine(drt).contract(c, V, h)) < 1e-13
    with pytest.raises(ValueError, match="chunking must be"):
        GpuEngine(drt, "cpu", cap, kernels=_HostKernels(), chunking="columns")


def test_davidson_on_tensors_matches_numpy():
    from cuscikit.linalg.davidson import davidson

    rng = np.random.default_rng(0)
    a = np.diag(np.arange(1.0, 301.0)) + 1e-2 * rng.standard_normal((300, 300))
    a = 0.5 * (a + a.T)
    ref = davidson(lambda v: a @ v, np.diag(a).copy(), nroots=3, tol=1e-12)
    at = torch.from_numpy(a)
    res = davidson(lambda v: at @ v, torch.from_numpy(np.diag(a).copy()), nroots=3, tol=1e-12)
    assert torch.is_tensor(res.vectors) and res.converged
    assert np.abs(res.energies - np.linalg.eigvalsh(a)[:3]).max() < 1e-10
    assert np.abs(res.energies - ref.energies).max() < 1e-10


def test_scatter_fixed_bits_on_host_twin():
    """The fixed-point margin (2^62 by default: one atomic for nearly every term; 2^76 the
    largest the sums allow) changes the sums by roundings far below 1e-13; a margin outside
    60..76 is refused."""
    drt = DRT(9, 9, 1)
    V, h = _operator(9, 41)
    c = np.random.default_rng(42).standard_normal(drt.n_csf)
    ref = Engine(drt).contract(c, V, h)
    for bits in (60, 62, 76):
        eng = GpuEngine(drt, "cpu", kernels=_HostKernels())
        eng.use_scatter(97)
        eng.fixed_bits = bits
        assert _rel(eng.contract(c, V, h), ref) < 1e-13
    eng.fixed_bits = 77
    with pytest.raises(ValueError, match="fixed_bits"):
        eng.contract(c, V, h)


@pytest.mark.parametrize("nroots,max_space", [(1, 5), (3, 12)])
def test_davidson_spilled_subspace_matches_resident(nroots, max_space):
    """Subspace columns spilled to host memory (here CPU tensors; pinned memory on a GPU): the
    same energies as the resident subspace to 1e-10, with restarts; a callback can stop it."""
    from cuscikit.linalg.davidson import davidson

    rng = np.random.default_rng(5)
    a = np.diag(np.arange(1.0, 401.0) ** 1.2) + 1e-1 * rng.standard_normal((400, 400))
    a = torch.from_numpy(0.5 * (a + a.T))
    d = torch.diagonal(a).clone()
    exact = np.linalg.eigvalsh(a.numpy())[:nroots]
    ref = davidson(lambda v: a @ v, d, nroots, tol=1e-12, max_space=max_space)
    assert ref.converged and np.abs(ref.energies - exact).max() < 1e-10
    for resident in (0, 2, max_space - 1):
        got = davidson(
            lambda v: a @ v, d, nroots, tol=1e-12, max_space=max_space, resident=resident
        )
        assert got.converged and np.abs(got.energies - ref.energies).max() < 1e-10
        overlap = np.abs(np.diag(got.vectors.numpy().T @ ref.vectors.numpy()))
        assert np.abs(overlap - 1.0).max() < 1e-8
    seen = []
    stopped = davidson(
        lambda v: a @ v, d, nroots, tol=1e-12, resident=0, callback=lambda *x: seen.append(x) or 1
    )
    assert not stopped.converged and stopped.iterations == 1 and len(seen) == 1


def test_davidson_rows_of_tensors_have_row_strides():
    """Corrections made rows (one or several) have the strides (n, 1) that BLAS needs as a
    leading dimension, also for one column, whose plain transpose has (1, 1)."""
    from cuscikit.linalg.davidson import _TorchOps

    ops = _TorchOps(torch.zeros(1, dtype=torch.float64))
    for k in (1, 3):
        Z = torch.arange(50.0 * k, dtype=torch.float64).reshape(50, k)
        r = ops.rows(Z)
        assert r.shape == (k, 50) and r.stride() == (50, 1) and torch.equal(r, Z.T)


def test_davidson_spilled_rows_written_in_place():
    """A matvec that writes one image into a given row (``into``) with the subspace spilled
    beyond 0 or 3 rows, one and two roots: the energies of the resident subspace to 1e-10."""
    from cuscikit.linalg.davidson import davidson

    rng = np.random.default_rng(6)
    a = np.diag(np.arange(1.0, 301.0)) + 1e-1 * rng.standard_normal((300, 300))
    a = torch.from_numpy(0.5 * (a + a.T))
    d = torch.diagonal(a).clone()
    calls = []

    def matvec(v):
        return a @ v

    def into(v, out):
        calls.append(1)
        torch.matmul(a, v, out=out)

    matvec.into = into
    for nroots in (1, 2):
        ref = davidson(lambda v: a @ v, d, nroots, tol=1e-12, max_space=8)
        for resident in (0, 3):
            calls.clear()
            got = davidson(matvec, d, nroots, tol=1e-12, max_space=8, resident=resident)
            assert got.converged and np.abs(got.energies - ref.energies).max() < 1e-10
            assert calls or nroots > 1  # one root: every new vector's image went through into


def test_solver_spilled_space_on_host_twin(monkeypatch):
    """GUGASolver(device="cuda", gpu_space=k) spills the Davidson space beyond k columns: the
    energies of the resident solve to 1e-10 (host twin in place of the GPU)."""
    import cuscikit.guga.gpu as gpu_mod

    real = gpu_mod.GpuEngine

    def host_engine(drt, device, max_memory=None, reserve=0):
        return real(drt, "cpu", None, reserve, tile_rows=300, kernels=_HostKernels())

    monkeypatch.setattr(gpu_mod, "GpuEngine", host_engine)
    h1, g4, _ = packed_random_integrals(8, 23)
    opts = dict(nroots=2, conv_tol=1e-12, davidson_only=True, max_cycle=200, max_space=6)
    e_res, _ = GUGASolver(device="cuda", **opts).kernel(h1, g4, 8, (4, 4))
    solver = GUGASolver(device="cuda", gpu_space=3, **opts)
    e_spill, _ = solver.kernel(h1, g4, 8, (4, 4))
    assert next(iter(solver._engines.values())).davidson_resident == 3
    assert np.abs(np.asarray(e_spill) - np.asarray(e_res)).max() < 1e-10
    with pytest.raises(ValueError, match="gpu_space"):
        GUGASolver(device="cuda", gpu_space=-1, **opts).kernel(h1, g4, 8, (4, 4))


def test_solver_spills_by_itself_under_a_cap(monkeypatch):
    """Without gpu_space, a cap too small for the whole Davidson space beside one tile makes the
    solver keep what half the budget holds on the device and spill the rest: the energies of
    the uncapped solve to 1e-10 (host twin, whose budget is the cap)."""
    import cuscikit.guga.gpu as gpu_mod

    real = gpu_mod.GpuEngine

    def host_engine(drt, device, max_memory=None, reserve=0):
        return real(drt, "cpu", max_memory, reserve, tile_rows=300, kernels=_HostKernels())

    monkeypatch.setattr(gpu_mod, "GpuEngine", host_engine)
    h1, g4, _ = packed_random_integrals(8, 25)
    opts = dict(nroots=2, conv_tol=1e-12, davidson_only=True, max_cycle=200, max_space=6)
    e_all, _ = GUGASolver(device="cuda", **opts).kernel(h1, g4, 8, (4, 4))
    # 1764 CSFs: the whole space (2 x 14 + 10 vectors) does not fit in 0.9 x 0.55 MB
    solver = GUGASolver(device="cuda", gpu_memory=0.55, **opts)
    e_cap, _ = solver.kernel(h1, g4, 8, (4, 4))
    resident = next(iter(solver._engines.values())).davidson_resident
    assert resident is not None and 0 < resident < 14
    assert np.abs(np.asarray(e_cap) - np.asarray(e_all)).max() < 1e-10


def test_cuda_device_without_gpu_is_a_clear_error():
    from cuscikit.backends import cuda_available
    from cuscikit.backends.loader import CudaUnavailableError

    if cuda_available():
        pytest.skip("a GPU is present: the error path cannot be reached")
    h1, g4, _ = packed_random_integrals(4, 0)
    with pytest.raises(CudaUnavailableError):
        GUGASolver(device="cuda").kernel(h1, g4, 4, (2, 2))
    with pytest.raises(ValueError, match="device must be"):
        GUGASolver(device="tpu").kernel(h1, g4, 4, (2, 2))


# --- on the GPU -----------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("space", SPACES)
def test_gpu_sigma_matches_cpu(space):
    drt = DRT(*space)
    n = drt.norb
    V, h = _operator(n, 11)
    eng = Engine(drt)
    gpu = GpuEngine(drt, "cuda", tile_rows=1000)
    chunked = GpuEngine(drt, "cuda", tile_rows=333)
    chunked.g_rows = 1000  # several passes over chunks of G
    warps = GpuEngine(drt, "cuda", tile_rows=1000)  # one CSF per warp instead of per thread
    warps.split_gather = warps.split_sigma = True
    for seed in (12, 13):
        c = np.random.default_rng(seed).standard_normal(drt.n_csf)
        ref = eng.contract(c, V, h)
        assert _rel(gpu.contract(c, V, h), ref) < 1e-12
        assert _rel(chunked.contract(c, V, h), ref) < 1e-12
        assert _rel(warps.contract(c, V, h), ref) < 1e-12
    h1, g4, _ = packed_random_integrals(n, 14)
    assert np.abs(gpu.diagonal(h1, g4) - eng.diagonal(h1, g4)).max() < 1e-12
    d1r, Mr = eng.generator_products(c, c)
    for e in (gpu, warps):
        d1, M = e.generator_products(c, c)
        assert _rel(M, Mr) < 1e-12 and _rel(d1, d1r) < 1e-12
    b = np.random.default_rng(20).standard_normal(drt.n_csf)  # a transition pair
    d1, M = gpu.generator_products(b, c)
    d1r, Mr = eng.generator_products(b, c)
    assert _rel(M, Mr) < 1e-12 and _rel(d1, d1r) < 1e-12


@pytest.mark.gpu
@pytest.mark.parametrize("space", SPACES)
def test_gpu_scatter_sigma_matches_cpu(space):
    """G by small tiles and the scatter form (integer atomics into fixed-point sums): the CPU
    engine's sigma to 1e-12, dense and factored, the same bits in every run."""
    drt = DRT(*space)
    n, npair = drt.norb, drt.norb * (drt.norb + 1) // 2
    V, h = _operator(n, 37)
    eng = Engine(drt)
    small, large = GpuEngine(drt, "cuda"), GpuEngine(drt, "cuda")
    small.use_scatter(100)
    large.use_scatter(1 << 20)
    rng = np.random.default_rng(38)
    A, B = rng.standard_normal((npair, 2 * n)), rng.standard_normal((2 * n, npair))
    for seed in (39, 40):
        c = np.random.default_rng(seed).standard_normal(drt.n_csf)
        got = small.contract(c, V, h)
        assert _rel(got, eng.contract(c, V, h)) < 1e-12
        assert np.array_equal(got, small.contract(c, V, h))
        assert _rel(large.contract(c, V, h), got) < 1e-13
        assert _rel(small.contract(c, (A, B), h), eng.contract(c, (A, B), h)) < 1e-12


@pytest.mark.gpu
def test_gpu_spilled_davidson_matches_resident():
    """The Davidson space spilled to pinned host memory beyond two columns: the energies of the
    all-resident solve to 1e-10 (two roots, restarts), bitwise equal on repeat."""
    h1, g4, _ = packed_random_integrals(10, 24)
    opts = dict(nroots=2, conv_tol=1e-12, davidson_only=True, max_cycle=200, max_space=6)
    e_res, _ = GUGASolver(device="cuda", **opts).kernel(h1, g4, 10, (5, 5))
    e_spill, _ = GUGASolver(device="cuda", gpu_space=2, **opts).kernel(h1, g4, 10, (5, 5))
    again, _ = GUGASolver(device="cuda", gpu_space=2, **opts).kernel(h1, g4, 10, (5, 5))
    assert np.abs(np.asarray(e_spill) - np.asarray(e_res)).max() < 1e-10
    assert np.array_equal(np.asarray(again), np.asarray(e_spill))
    from cuscikit.linalg.davidson import _Spilled

    block = _Spilled(torch, torch.device("cuda"), 1000, 3, 1)
    block.put(0, torch.ones((3, 1000), dtype=torch.float64, device="cuda"))
    assert block.host[0].is_pinned() and float(block.tmul(block.dev, 3)[0, 2]) == 1000.0


@pytest.mark.gpu
def test_gpu_sigma_is_bitwise_reproducible():
    drt = DRT(10, 10, 0)
    gpu = GpuEngine(drt, "cuda", tile_rows=4096)
    Vh = gpu.operator(*_operator(10, 15))
    c = torch.as_tensor(np.random.default_rng(16).standard_normal(drt.n_csf), device="cuda")
    first = gpu.sigma(c, Vh)
    for _ in range(3):
        assert torch.equal(gpu.sigma(c, Vh), first)
    ordered = GpuEngine(drt, "cuda", tile_rows=4096)  # the order of the threads changes no bit
    ordered.balance = True
    assert torch.equal(ordered.sigma(c, ordered.operator(*_operator(10, 15))), first)


@pytest.mark.gpu
@pytest.mark.parametrize("space", [(8, 7, 1), (10, 10, 0)])
def test_gpu_factored_sigma_and_energies_match_cpu(space):
    """Factored integrals (A, B) on the device: sigma to 1e-12 against the CPU engine's
    factored sigma; a Cholesky (df) solve to 1e-10 against the CPU df solve."""
    from cuscikit.guga.df import cholesky_pairs

    drt = DRT(*space)
    n, npair = drt.norb, drt.norb * (drt.norb + 1) // 2
    rng = np.random.default_rng(25)
    A, B = rng.standard_normal((npair, 2 * n)), rng.standard_normal((2 * n, npair))
    h = rng.standard_normal(npair)
    gpu, eng = GpuEngine(drt, "cuda", tile_rows=500), Engine(drt)
    for seed in (26, 27):
        c = np.random.default_rng(seed).standard_normal(drt.n_csf)
        assert _rel(gpu.contract(c, (A, B), h), eng.contract(c, (A, B), h)) < 1e-12
    h1, _, _ = packed_random_integrals(n, 28)
    Z = 0.1 * rng.standard_normal((npair, 2 * n))
    g4 = Z @ Z.T  # positive semidefinite of rank 2 n: a Cholesky factor of 2 n columns
    L = cholesky_pairs(g4, 1e-12)
    twos = space[2]
    nelec = ((space[1] + twos) // 2, (space[1] - twos) // 2)
    opts = dict(conv_tol=1e-12, davidson_only=True, max_cycle=200, df=True, df_tol=1e-12)
    e_cpu, _ = GUGASolver(**opts).kernel(h1, g4, n, nelec)
    e_gpu, _ = GUGASolver(device="cuda", **opts).kernel(h1, g4, n, nelec)
    assert L.shape[1] < npair and abs(e_gpu - e_cpu) < 1e-10


@pytest.mark.gpu
@pytest.mark.parametrize("space,nroots", [((8, 8, 0), 3), ((9, 9, 3), 2), ((10, 10, 2), 1)])
def test_gpu_solver_energies_match_cpu(space, nroots):
    n, N, twos = space
    h1, g4, _ = packed_random_integrals(n, 17)
    nelec = ((N + twos) // 2, (N - twos) // 2)
    opts = dict(nroots=nroots, conv_tol=1e-12, davidson_only=True, max_cycle=200)
    e_cpu, _ = GUGASolver(**opts).kernel(h1, g4, n, nelec)
    solver = GUGASolver(device="cuda", **opts)
    e_gpu, ci = solver.kernel(h1, g4, n, nelec)
    assert np.abs(np.asarray(e_gpu) - np.asarray(e_cpu)).max() < 1e-10
    again, _ = GUGASolver(device="cuda", **opts).kernel(h1, g4, n, nelec)
    assert np.array_equal(np.asarray(again), np.asarray(e_gpu))  # bitwise, whole solve
    c0 = ci if nroots == 1 else ci[0]
    dm1, dm2 = solver.make_rdm12(c0, n, nelec)
    ref1, ref2 = GUGASolver(**opts).make_rdm12(c0, n, nelec)
    assert np.abs(dm1 - ref1).max() < 1e-12 and np.abs(dm2 - ref2).max() < 1e-12


@pytest.mark.gpu
@pytest.mark.parametrize("chunking", ["rows", "scatter"])
def test_gpu_memory_cap_slows_down_instead_of_failing(chunking):
    drt = DRT(10, 10, 0)
    n = 10
    V, h = _operator(n, 18)
    c = np.random.default_rng(19).standard_normal(drt.n_csf)
    ref = GpuEngine(drt, "cuda").contract(c, V, h)
    # a cap whose budget (3/4 of it, less what is held) fits one tile and a tenth of G: the
    # sigma runs over chunks of G (or tiles of G with the scatter) and gives the same numbers
    rows, npair = 2048, n * (n + 1) // 2
    want = torch.cuda.memory_allocated() + rows * 8 * (npair + 1) + drt.n_csf * npair * 8 // 10
    cap = int(want / 0.75) + 1
    capped = GpuEngine(drt, "cuda", max_memory=cap, tile_rows=rows, chunking=chunking)
    try:
        assert capped.mode == chunking
        assert capped.n_chunks >= 5 if chunking == "rows" else capped.g_rows < drt.n_csf
        tol = 1e-13 if chunking == "rows" else 1e-12
        assert _rel(capped.contract(c, V, h), ref) < tol
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)


def test_solver_device_flow_on_host_twin(monkeypatch):
    """GUGASolver(device="cuda") end to end (device diagonal, guess, Davidson on tensors, density
    matrices) with the kernels' host twin standing in for the GPU."""
    import cuscikit.guga.gpu as gpu_mod

    real = gpu_mod.GpuEngine

    def host_engine(drt, device, max_memory=None, reserve=0):
        return real(drt, "cpu", None, reserve, tile_rows=200, kernels=_HostKernels())

    monkeypatch.setattr(gpu_mod, "GpuEngine", host_engine)
    h1, g4, _ = packed_random_integrals(7, 21)
    opts = dict(nroots=2, conv_tol=1e-12, davidson_only=True, max_cycle=200)
    e_cpu, ci_cpu = GUGASolver(spin=1, **opts).kernel(h1, g4, 7, (4, 3))
    solver = GUGASolver(spin=1, device="cuda", **opts)
    e_dev, ci_dev = solver.kernel(h1, g4, 7, (4, 3))
    assert np.abs(e_dev - e_cpu).max() < 1e-10
    assert isinstance(ci_dev[0], np.ndarray)
    dm1, dm2 = solver.make_rdm12(ci_dev[1], 7, (4, 3))
    ref1, ref2 = GUGASolver(spin=1, **opts).make_rdm12(ci_dev[1], 7, (4, 3))
    assert np.abs(dm1 - ref1).max() < 1e-12 and np.abs(dm2 - ref2).max() < 1e-12


def _cli_json(capsys, *argv):
    import json

    from cuscikit.cli import main

    rc = main(list(argv))
    return rc, json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_cli_device_errors(capsys):
    from cuscikit.backends import cuda_available

    rc, r = _cli_json(capsys, "guga", "H2O", "--device", "gpu", "--json")
    assert rc == 2 and "--device" in r["error"]
    if not cuda_available():
        rc, r = _cli_json(capsys, "guga", "H2O", "--device", "cuda", "--json")
        assert rc == 2 and "--device cuda" in r["error"]


@pytest.mark.gpu
def test_cli_device_cuda_matches_cpu(capsys):
    rc, cpu = _cli_json(capsys, "guga", "H2O", "--nroots", "2", "--json")
    rc2, gpu = _cli_json(capsys, "guga", "H2O", "--nroots", "2", "--device", "cuda", "--json")
    assert rc == rc2 == 0 and gpu["device"] == "cuda"
    assert np.abs(np.array(gpu["e_tot"]) - np.array(cpu["e_tot"])).max() < 1e-10
