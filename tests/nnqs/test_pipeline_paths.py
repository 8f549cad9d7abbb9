"""The one NNQS-SCI pipeline: the numpy path and the tensor path (the array kind of the GPU
engine, here on the CPU) give the same stages, on one rank and on several."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from cuscikit import Ansatz, Molecule, SCISpace  # noqa: E402
from cuscikit.nnqs.pipeline import Pipeline  # noqa: E402
from cuscikit.parallel.comm import run_ranks  # noqa: E402
from cuscikit.sci.engines import engine  # noqa: E402


def _host(x):
    return x.numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def _space(mol, n):
    from cuscikit.backends.keys import dedup
    from cuscikit.sci.hamiltonian import Hamiltonian

    H = Hamiltonian.from_molecule(mol)
    S = SCISpace.hf(mol).configs
    while len(S) < n:
        S = dedup(np.concatenate([S, H.coupled(S[:200]).configs]))[0]
    return S[np.sort(np.random.default_rng(0).choice(len(S), n, replace=False))]


def _stages(mol, ansatz, kind, S, comm=None, **kw):
    return Pipeline(engine(kind, mol), ansatz, comm=comm, want_pairs=True, pt2=True, **kw).run(
        S, 24
    )


def _pt2(r, z=None):
    """sum |num|^2 / (E - H_aa) at a fixed E (the terms, without the normalisation)."""
    return float((_host(r.pt2_numerators) / (-80.0 - _host(r.pt2_diagonal))).sum())


FIELDS = ("psi_s", "eloc_coupled", "eloc_variational", "hdiag")


def _same(a, b, exact=True):
    assert (a.n_unique, a.n_coupled, a.share) == (b.n_unique, b.n_coupled, b.share)
    np.testing.assert_array_equal(a.new_configs, b.new_configs)
    np.testing.assert_array_equal(a.keep_rows, b.keep_rows)
    for f in FIELDS:
        if exact:
            np.testing.assert_array_equal(_host(getattr(a, f)), _host(getattr(b, f)), err_msg=f)
        else:
            np.testing.assert_allclose(
                _host(getattr(a, f)), _host(getattr(b, f)), rtol=1e-12, atol=1e-12, err_msg=f
            )
    for x, y in zip(a.space_pairs, b.space_pairs, strict=True):
        np.testing.assert_array_equal(_host(x), _host(y))
    assert abs(_pt2(a) - _pt2(b)) <= 1e-12 * abs(_pt2(a))


@pytest.mark.parametrize("name, n, batch", [("LiH", 60, 16384), ("H2O", 150, 40)])
def test_numpy_and_tensor_paths_agree(name, n, batch):
    mol = Molecule.load(name)
    ansatz = Ansatz.for_molecule(mol, seed=0, dtype=torch.float64)
    S = _space(mol, n)
    a = _stages(mol, ansatz, "cpu", S, batch_size=batch)
    b = _stages(mol, ansatz, "cpu-tensors", S, batch_size=batch)
    _same(a, b, exact=False)  # complex division rounds differently in torch and numpy


@pytest.mark.parametrize("chunk", [1, 7, 100])
def test_top_k_chunks_give_the_same_iteration(monkeypatch, chunk):
    """The tensor path's running top-K merges every `MERGE_ROWS` rows rather than every
    batch (1: every batch of 40; 7 and 100: chunks across batches): the same selection and
    values as one merge over all of U."""
    from cuscikit.nnqs import topk

    mol = Molecule.load("H2O")
    ansatz = Ansatz.for_molecule(mol, seed=0, dtype=torch.float64)
    S = _space(mol, 150)
    whole = _stages(mol, ansatz, "cpu-tensors", S, batch_size=40)
    monkeypatch.setattr(topk, "MERGE_ROWS", chunk)
    _same(_stages(mol, ansatz, "cpu-tensors", S, batch_size=40), whole)


@pytest.mark.parametrize("P", [2, 3])
def test_tensor_path_on_thread_ranks_equals_one_rank(P):
    """Every rank's share of the stages, over the tensor path's global de-dup and routing,
    equals the single-rank stages restricted to that share."""
    mol = Molecule.load("H2O")
    ansatz = Ansatz.for_molecule(mol, seed=0, dtype=torch.float64)
    S = _space(mol, 120)
    one = _stages(mol, ansatz, "cpu", S)
    parts = run_ranks(P, lambda comm: _stages(mol, ansatz, "cpu-tensors", S, comm=comm))
    assert all(p.n_unique == one.n_unique for p in parts)
    assert sum(p.n_coupled for p in parts) == one.n_coupled
    for p in parts:
        lo, hi = p.share
        np.testing.assert_array_equal(p.new_configs, one.new_configs)
        np.testing.assert_array_equal(p.keep_rows, one.keep_rows)
        for f in FIELDS:
            np.testing.assert_allclose(
                _host(getattr(p, f)),
                _host(getattr(one, f))[lo:hi],
                rtol=1e-12,
                atol=1e-12,
                err_msg=f,
            )
    src = np.concatenate([_host(p.space_pairs[0]) for p in parts])
    np.testing.assert_array_equal(src, _host(one.space_pairs[0]))
    # the PT2 sums meet on their owners: the ranks' terms add up to the single-rank sum
    assert abs(sum(_pt2(p) for p in parts) - _pt2(one)) <= 1e-12 * abs(_pt2(one))


@pytest.mark.parametrize("kind, batch", [("cpu", 16384), ("cpu-tensors", 16384), ("cpu", 40)])
def test_unchanged_space_reuses_its_data_exactly(kind, batch):
    """Once S repeats, its S-only data is kept and reused while S stays (`Pipeline.reuse_space`);
    the stages equal a fresh pipeline's with the same network, exactly, and a new S lets the
    kept data go."""
    mol = Molecule.load("H2O")
    ansatz = Ansatz.for_molecule(mol, seed=0, dtype=torch.float64)
    S = _space(mol, 150)
    kept = Pipeline(engine(kind, mol), ansatz, want_pairs=True, pt2=True, batch_size=batch)
    kept.run(S, 24)
    assert kept._space_cache is None  # a first S keeps nothing
    kept.run(S.copy(), 24)  # the same S again: its data is kept
    assert kept.reused == 0 and kept._space_cache is not None
    with torch.no_grad():  # a step of the network between the iterations
        for p in ansatz.parameters():
            p.add_(0.01 * torch.randn_like(p))
    again = kept.run(S.copy(), 24)
    assert kept.reused == 1
    _same(again, _stages(mol, ansatz, kind, S, batch_size=batch))
    other = S[:-1]
    np.testing.assert_array_equal(kept.run(other, 24).keep_configs[: len(other)], other)
    assert kept.reused == 1 and kept._space_cache is None  # a new S lets the old data go
    kept.run(other, 24)
    _same(kept.run(other, 24), _stages(mol, ansatz, kind, other, batch_size=batch))
    assert kept.reused == 2


def test_runner_reuse_leaves_the_history_unchanged():
    """A run whose S stops growing takes the same path with and without the reuse."""
    from cuscikit import Runner

    mol = Molecule.load("LiH")
    hist = []
    for reuse in (True, False):
        ansatz = Ansatz.for_molecule(mol, seed=0, dtype=torch.float64)
        runner = Runner(mol, ansatz, seed=0, topk=256, verbose=0, teacher=0, inner_steps=1)
        runner._pipeline.reuse_space = reuse
        runner.run(6, progress=False)
        assert (runner._pipeline.reused > 0) == reuse
        hist.append(runner.history[["e_coupled", "e_variational", "e_pt2", "loss", "n_space"]])
    np.testing.assert_array_equal(hist[0].to_numpy(), hist[1].to_numpy())
