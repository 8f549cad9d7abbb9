"""The loop-driven sigma (a table of loops between vertex pairs applied to contiguous ranges of
CSFs) against the per-ket coupling lists: the gather T, the scatter, the exchange diagonal and
the generator products term by term, on several DRTs and spins, with and without the table's
split into lower and upper parts, on blocks that begin and end on cell borders and on blocks
that cut loops; then whole sigma vectors, PySCF's max_memory and bad input."""

from __future__ import annotations

import numpy as np
import pytest

from cuscikit.guga import DRT, GUGASolver
from cuscikit.guga._ext import load
from cuscikit.guga.sigma import Engine, pair_index

SPACES = [(5, 4, 0), (6, 6, 0), (6, 5, 1), (7, 6, 2), (8, 8, 0), (8, 7, 3), (8, 6, 4)]


def _lists_reference(drt, c, G, K):
    """Gather T (ncsf, npair + 1), scatter of G, exchange diagonal and generator gather, all
    from the coupling lists."""
    mod = load()
    n, ncsf = drt.norb, drt.n_csf
    npair, sym = n * (n + 1) // 2, pair_index(n)
    off, bra, code, w = drt.core.lists(0, ncsf)
    steps = drt.steps()
    T = np.empty((ncsf, npair + 1))
    mod.gather_pairs(drt.core, off, bra, code, w, steps, 0, sym, npair, c, T, 1)
    sig = np.zeros((1, ncsf))
    mod.scatter_pairs(drt.core, off, bra, code, w, steps, 0, sym, npair, G.T.copy(), sig, 1)
    ex = mod.exchange_diagonal(drt.core, off, bra, code, w, steps, 0, K, 1)
    gen = mod.gather_generators(drt.core, off, bra, code, w, steps, 0, c, 1)
    return T, sig[0], ex, gen


def _loop_terms(drt, table, c, G, K, blocks, nthreads):
    mod = load()
    n, ncsf = drt.norb, drt.n_csf
    npair, sym = n * (n + 1) // 2, pair_index(n)
    T = np.empty((npair + 1, ncsf))
    sig = np.zeros((nthreads, ncsf))
    ex = np.empty(ncsf)
    gen = np.empty((ncsf, n * n))
    for k0, count in blocks:
        Tb = np.empty((npair + 1, count))
        mod.loop_gather_pairs(drt.core, table, sym, npair, c, Tb, k0, count, nthreads)
        T[:, k0 : k0 + count] = Tb
        Gb = np.ascontiguousarray(G[:, k0 : k0 + count])
        mod.loop_scatter_pairs(drt.core, table, sym, npair, Gb, k0, count, sig, nthreads)
        ex[k0 : k0 + count] = mod.loop_exchange_diagonal(drt.core, table, K, k0, count, nthreads)
        gen[k0 : k0 + count] = mod.loop_gather_generators(drt.core, table, c, k0, count, nthreads)
    return T.T, sig.sum(axis=0), ex, gen


@pytest.mark.parametrize("space", SPACES)
@pytest.mark.parametrize("split", [-1, 0, 3])  # the smallest table, no split, level 3
def test_loop_terms_equal_the_lists(space, split):
    drt = DRT(*space)
    n, ncsf = drt.norb, drt.n_csf
    rng = np.random.default_rng(sum(space) + split)
    c = rng.standard_normal(ncsf)
    G = rng.standard_normal((n * (n + 1) // 2, ncsf))
    K = rng.standard_normal(n * n)
    ref = _lists_reference(drt, c, G, K)
    table = load().LoopTable(drt.core, split)
    cells = table.cells()
    # one block; blocks on cell borders (nothing cut); blocks of 7 or 61 CSFs (loops cut)
    cuts = [0] + [int(x) for x in cells[2::3]] + [ncsf] if len(cells) else [0, ncsf]
    cuts = sorted(set(cuts))
    cut = 7 if ncsf < 500 else 61
    layouts = [
        ([(0, ncsf)], (1, 2)),
        ([(a, b - a) for a, b in zip(cuts[:-1], cuts[1:], strict=True)], (2,)),
        ([(k, min(cut, ncsf - k)) for k in range(0, ncsf, cut)], (2,)),
    ]
    for blocks, threads in layouts:
        for nthreads in threads:
            got = _loop_terms(drt, table, c, G, K, blocks, nthreads)
            for a, b in zip(got, ref, strict=True):
                np.testing.assert_allclose(a, b, rtol=0, atol=1e-12 * max(1.0, np.abs(b).max()))


@pytest.mark.parametrize("space", [(6, 6, 0), (7, 5, 1), (8, 6, 2), (8, 8, 4), (9, 8, 0)])
def test_loop_sigma_equals_list_sigma(space):
    drt = DRT(*space)
    npair = drt.norb * (drt.norb + 1) // 2
    rng = np.random.default_rng(7)
    c = rng.standard_normal(drt.n_csf)
    V = rng.standard_normal((npair, npair))
    V = V + V.T
    h = rng.standard_normal(npair)
    lists = Engine(drt, method="lists")
    ref = lists.contract(c, V, h)
    for rows in (drt.n_csf, 397):
        loops = Engine(drt, rows=rows, nthreads=2, method="loops")
        assert loops.list_bytes == 0 and loops.loop_bytes > 0
        np.testing.assert_allclose(loops.contract(c, V, h), ref, rtol=0, atol=1e-12 * 100)
        np.testing.assert_allclose(loops.contract(c, V), lists.contract(c, V), atol=1e-10)
        # factored integrals V = A B
        A = rng.standard_normal((npair, 5))
        B = np.ascontiguousarray(A.T)
        np.testing.assert_allclose(
            loops.contract(c, (A, B), h), lists.contract(c, (A, B), h), atol=1e-10
        )
    # the blocks cover the CSFs in order and begin on cell borders
    eng = Engine(drt, rows=50, method="loops")
    starts = [k0 for k0, _ in eng.blocks]
    assert starts[0] == 0 and sum(n for _, n in eng.blocks) == drt.n_csf
    cells = set(int(x) for x in eng.table.cells())
    assert all(k0 in cells or k0 == 0 for k0 in starts) or not cells


@pytest.mark.parametrize("space", [(7, 6, 0), (8, 6, 2), (8, 8, 4), (9, 9, 1)])
@pytest.mark.parametrize("split", [-1, 0, 3])
def test_one_pass_sigma_equals_the_block_path_and_the_lists(space, split, monkeypatch):
    """loop_sigma (gather, GEMM and scatter per range of CSFs, one pass) against the lists and
    against the per-block path it replaces, for ranges of 7 and 61 CSFs (many ranges, loops cut
    at their borders or, without a split, not aligned to cells) and one range, 1 and 2 threads,
    with h', without (PySCF's absorbed form) and with factored integrals."""
    import cuscikit.guga.sigma as sigma_mod

    drt = DRT(*space)
    npair = drt.norb * (drt.norb + 1) // 2
    rng = np.random.default_rng(11)
    c = rng.standard_normal(drt.n_csf)
    V = rng.standard_normal((npair, npair))
    V = V + V.T
    h = rng.standard_normal(npair)
    A = rng.standard_normal((npair, 4))
    B = np.ascontiguousarray(0.5 * A.T)
    lists = Engine(drt, method="lists")
    refs = [lists.contract(c, V, h), lists.contract(c, V), lists.contract(c, (A, B), h)]
    table = load().LoopTable(drt.core, split)
    for size, nthreads in ((7, 1), (61, 2), (10**6, 2)):
        eng = Engine(drt, nthreads=nthreads, rows=97)
        eng.table, eng.range = table, size
        got = [eng.contract(c, V, h), eng.contract(c, V), eng.contract(c, (A, B), h)]
        for a, b in zip(got, refs, strict=True):
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-12 * max(1.0, np.abs(b).max()))
    monkeypatch.setattr(sigma_mod, "_dgemm", lambda: None)  # the per-block path
    eng = Engine(drt, nthreads=2, rows=97)
    eng.table = table
    blocks = [eng.contract(c, V, h), eng.contract(c, V), eng.contract(c, (A, B), h)]
    for a, b in zip(got, blocks, strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-12 * max(1.0, np.abs(b).max()))


@pytest.mark.parametrize("nthreads", [2, 3])
def test_one_pass_sigma_into_the_result_equals_the_summed_buffers(nthreads):
    """With `first`, loop_sigma's thread 0 adds into the caller's vector and the other threads
    into the rows of sigma: the result, summed in buffer order, equals the sum of nthreads
    buffers bit for bit (one vector fewer), and `contract` returns it with or without `out`."""
    from cuscikit.guga.sigma import _dgemm

    drt = DRT(8, 8, 2)
    eng = Engine(drt, nthreads=nthreads)
    eng.range = 61  # many ranges: every thread has some
    npair = eng.npair
    rng = np.random.default_rng(21)
    c = rng.standard_normal(drt.n_csf)
    V = rng.standard_normal((npair, npair))
    V = V + V.T
    W = np.ascontiguousarray(V.T)
    args = (eng.core, eng.table, eng.symmap, npair, c, npair, W, None)
    bufs = np.zeros((nthreads, drt.n_csf))
    eng.mod.loop_sigma(*args, bufs, _dgemm(), eng.range, nthreads)
    ref = bufs[0] + bufs[1]
    for b in bufs[2:]:
        ref += b
    first, rest = np.zeros(drt.n_csf), np.zeros((nthreads - 1, drt.n_csf))
    eng.mod.loop_sigma(*args, rest, _dgemm(), eng.range, nthreads, first)
    np.testing.assert_array_equal(rest, bufs[1:])
    for b in rest:
        first += b
    np.testing.assert_array_equal(first, ref)
    got = eng.contract(c, V)
    out = np.full(drt.n_csf, np.nan)
    strided = np.full((drt.n_csf, 2), np.nan)
    eng.contract(c, V, out=out)
    eng.contract(c, V, out=strided[:, 1])
    np.testing.assert_array_equal(got, ref)
    np.testing.assert_array_equal(out, ref)
    np.testing.assert_array_equal(strided[:, 1], ref)
    with pytest.raises(ValueError, match="first"):
        eng.mod.loop_sigma(*args, rest, _dgemm(), eng.range, nthreads, first[:-1])
    # the kept buffer lent as scratch (the P-space correction's work vector): whatever is left
    # in it, the next sigma starts from zero
    work = eng.scratch()
    assert work is not None and np.shares_memory(work, eng._sigma_bufs)
    work.fill(np.nan)
    np.testing.assert_array_equal(eng.contract(c, V), ref)
    assert eng.scratch() is not None and np.shares_memory(eng.scratch(), work)
    assert Engine(drt, nthreads=1).scratch() is None


def test_one_pass_sigma_refuses_bad_input():
    drt = DRT(6, 6, 0)
    eng = Engine(drt)
    from cuscikit.guga.sigma import _dgemm

    npair, c = eng.npair, np.ones(drt.n_csf)
    W = np.zeros((npair, npair + 1))
    sig = np.zeros((1, drt.n_csf))
    args = (eng.core, eng.table, eng.symmap, npair)
    with pytest.raises(ValueError, match="range"):
        eng.mod.loop_sigma(*args, c, npair + 1, W, None, sig, _dgemm(), 0)
    with pytest.raises(ValueError, match="W1"):
        eng.mod.loop_sigma(*args, c, npair, W, None, sig, _dgemm())
    with pytest.raises(ValueError, match="c must"):
        eng.mod.loop_sigma(*args, c[:-1], npair + 1, W, None, sig, _dgemm())
    # the kernels split a pair row into a head's and an entry's part: only the packed pair map
    other = eng.symmap.copy()
    other[[1, 6]] = 5  # pairs (0, 1) and (1, 0) sent to another row
    with pytest.raises(ValueError, match="pair_index"):
        eng.mod.loop_sigma(eng.core, eng.table, other, npair, c, npair + 1, W, None, sig, _dgemm())
    with pytest.raises(ValueError, match="pair_index"):
        T = np.zeros((npair, drt.n_csf))
        eng.mod.loop_gather_pairs(eng.core, eng.table, other, npair, c, T, 0, drt.n_csf)


def test_loop_table_is_small_and_independent_of_the_blocks():
    drt = DRT(10, 10, 0)
    table = load().LoopTable(drt.core)
    n_couplings = len(drt.core.lists(0, drt.n_csf)[3])
    # far less than 14 bytes per coupling of the lists
    assert table.nbytes < 0.05 * 14 * n_couplings
    assert 0 < table.split < drt.norb
    assert table.nloops == load().LoopTable(drt.core, 0).nloops  # the split loses no loop


def test_solver_honours_max_memory_from_kernel_and_checks_the_method():
    pytest.importorskip("pyscf")
    drt = DRT(6, 6, 0)
    rng = np.random.default_rng(0)
    h1 = rng.standard_normal((6, 6))
    h1 = h1 + h1.T
    eri = np.zeros((21, 21))
    # mcscf.CASCI passes mol.max_memory (MB) to kernel: too little is refused as the option is
    with pytest.raises(ValueError, match="max_memory"):
        GUGASolver().kernel(h1, eri, 6, (3, 3), max_memory=0.001)
    e_loops = GUGASolver().kernel(h1, eri, 6, (3, 3), max_memory=4000)[0]
    e_lists = GUGASolver(sigma_method="lists").kernel(h1, eri, 6, (3, 3))[0]
    assert e_loops == pytest.approx(e_lists, abs=1e-10)
    assert drt.n_csf == 175
    with pytest.raises(ValueError, match="method"):
        GUGASolver(sigma_method="rows").kernel(h1, eri, 6, (3, 3))
    with pytest.raises(ValueError, match="split"):
        load().LoopTable(drt.core, 6)


def test_diagonal_in_small_steps_is_exact_and_holds_few_vectors():
    """The diagonal over 29,700 CSFs (several blocks, each taken 4096 CSFs at a time) equals
    the row-by-row diagonal of the compiled rows module, and its temporaries stay within a few
    vectors (a whole block's occupation products took 23)."""
    import tracemalloc

    from cuscikit import _core
    from cuscikit.guga.pspace import _rows_drt
    from tests.conftest import packed_random_integrals

    drt = DRT(10, 10, 2)
    n = drt.norb
    h1, g4, g = packed_random_integrals(n, 3)
    K, J = np.einsum("pqqp->pq", g), np.einsum("ppqq->pq", g)
    hp = np.diag(h1) - 0.5 * K.sum(axis=1)
    ref = _core.guga_rows.diagonal(_rows_drt(drt), 0, drt.n_csf, hp, J.reshape(-1), K.reshape(-1))
    eng = Engine(drt, rows=10000)
    assert len(eng.blocks) >= 3
    eng.diagonal(h1, g4)  # the loop kernels' first call outside the count
    tracemalloc.start()
    try:
        d = eng.diagonal(h1, g4)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert np.abs(d - ref).max() < 1e-12 * np.abs(ref).max()
    assert peak < 6 * 8 * drt.n_csf
