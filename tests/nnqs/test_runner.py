"""The NNQS-SCI Runner: estimators against dense linear algebra, checkpoints, bad input."""

import copy

import numpy as np
import pytest
import torch

from cuscikit import Molecule, SCISpace
from cuscikit.nnqs import Ansatz
from cuscikit.nnqs.checkpoint import CheckpointError, saved_settings
from cuscikit.nnqs.runner import (
    Callback,
    EarlyStopping,
    LearningRateDecay,
    NonFiniteLossError,
    Runner,
)
from cuscikit.nnqs.topk import RunningTopK
from cuscikit.sci.configs import all_determinants

ENERGY_COLUMNS = ["e_tot", "e_coupled", "e_variational", "loss", "n_space", "n_unique", "n_new"]


def make_runner(name="LiH", seed=0, **kw):
    mol = Molecule.load(name)
    ansatz = Ansatz.for_molecule(mol, seed=seed, dtype=torch.float64)
    kw.setdefault("topk", 16)
    return Runner(mol, ansatz, seed=seed, **kw)


def test_estimators_match_dense_linear_algebra():
    runner = make_runner("H2O", topk=40)
    for _ in range(3):
        runner.step()
    mol, H = runner.molecule, runner.hamiltonian
    space = runner.space.configs.copy()
    model = copy.deepcopy(runner.ansatz)
    row = runner.step()

    full = SCISpace.full(mol).configs
    hmat = H.csr(full).toarray()
    with torch.no_grad():
        psi = torch.exp(model.log_psi(full)).numpy().astype(np.complex128)
    in_s = np.isin(full[:, 0], space[:, 0])
    psi_s = np.where(in_s, psi, 0.0)
    norm = np.vdot(psi_s, psi_s).real
    e_var = np.vdot(psi_s, hmat @ psi_s).real / norm
    e_cpl = np.vdot(psi_s, hmat @ psi).real / norm  # sum over x in S, x' anywhere
    assert row["e_variational"] == pytest.approx(e_var, abs=1e-10)
    assert row["e_coupled"] == pytest.approx(e_cpl, abs=1e-10)
    assert row["e_variational"] >= SCISpace(mol, space).exact_energy() - 1e-10


def test_space_grows_by_topk_of_new_configurations():
    runner = make_runner("N2", topk=7)
    row = runner.step()
    assert row["n_space"] == 1 and row["n_new"] == 7 and len(runner.space) == 8
    row = runner.step()
    assert row["n_new"] == 7 and len(runner.space) == 15


def test_max_space_cap():
    runner = make_runner("N2", topk=50, max_space=60)
    for _ in range(3):
        runner.step()
    assert len(runner.space) == 60


def test_history_has_both_estimators_and_stage_timings():
    runner = make_runner()
    h = runner.run(3, progress=False).history
    assert len(h) == 3 and list(h["iteration"]) == [1, 2, 3]
    for col in (
        "e_coupled",
        "e_variational",
        "error",
        "n_coupled",
        "n_unique",
        "t_generation",
        "t_dedup",
        "t_inference",
        "t_energy",
        "t_optimizer",
        "peak_memory_bytes",
    ):
        assert col in h and h[col].notna().all()
    assert runner.e_tot == h["e_tot"].iloc[-1]


def test_same_seed_same_history_and_resume_is_exact(tmp_path):
    a = make_runner(seed=3)
    full = a.run(8, progress=False).history
    b = make_runner(seed=3)
    b.run(4, progress=False, checkpoint=str(tmp_path / "ck.h5"), checkpoint_every=4)
    c = make_runner(seed=99)  # different init: everything must come from the checkpoint
    c.load(tmp_path / "ck.h5")
    assert c.iteration == 4
    resumed = c.run(4, progress=False).history
    np.testing.assert_array_equal(
        full[ENERGY_COLUMNS].to_numpy(), resumed[ENERGY_COLUMNS].to_numpy()
    )


def test_checkpoint_errors(tmp_path):
    r = make_runner()
    r.step()
    path = tmp_path / "ck.h5"
    r.save(path)
    other = make_runner("H2O")
    with pytest.raises(CheckpointError, match="another molecule"):
        other.load(path)
    with pytest.raises(CheckpointError, match="estimator"):
        make_runner(estimator="variational").load(path)
    bad = tmp_path / "bad.h5"
    data = path.read_bytes()
    bad.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="corrupted|unreadable"):
        make_runner().load(bad)
    with pytest.raises(CheckpointError, match="no such"):
        make_runner().load(tmp_path / "missing.h5")


def test_checkpoint_from_before_the_inner_steps(tmp_path):
    """A file written before `inner_steps` was saved ran without them: a default Runner (4 inner
    steps) refuses it by name, and a Runner built from `saved_settings` resumes it."""
    import json

    import h5py

    path = tmp_path / "old.h5"
    r = make_runner(topk=8, inner_steps=0)
    r.run(2, progress=False)
    r.save(path)
    with h5py.File(path, "r+") as f:  # as files written before the inner_steps setting existed
        settings = json.loads(f.attrs["settings"])
        del settings["inner_steps"]
        f.attrs["settings"] = json.dumps(settings)
    with pytest.raises(CheckpointError, match="inner_steps=0, this runner has 4"):
        make_runner(topk=8).load(path)
    kw = saved_settings(path)
    assert kw["inner_steps"] == 0 and kw["topk"] == 8
    mol = Molecule.load("LiH")
    again = Runner(mol, Ansatz.for_molecule(mol, seed=5, dtype=torch.float64), **kw).load(path)
    assert again.iteration == 2 and again.inner_steps == 0
    np.testing.assert_array_equal(again.space.configs, r.space.configs)
    with pytest.raises(CheckpointError, match="not a cuscikit"):
        saved_settings(_plain_h5(tmp_path / "plain.h5"))


def _plain_h5(path):
    import h5py

    with h5py.File(path, "w") as f:
        f["x"] = 1
    return path


def test_bad_input():
    mol = Molecule.load("LiH")
    ansatz = Ansatz.for_molecule(mol, seed=0)
    with pytest.raises(ValueError, match="topk"):
        Runner(mol, ansatz, topk=0)
    with pytest.raises(ValueError, match="estimator"):
        Runner(mol, ansatz, estimator="exact")
    with pytest.raises(ValueError, match="device"):
        Runner(mol, ansatz, device="tpu")
    with pytest.raises(ValueError, match="inner_steps"):
        Runner(mol, ansatz, inner_steps=-1)
    h2o = Molecule.load("H2O")
    with pytest.raises(ValueError, match="orbitals"):
        Runner(h2o, ansatz)


def test_nan_loss_stops_and_keeps_last_good_state(tmp_path, capsys):
    r = make_runner()
    ck = tmp_path / "ck.h5"
    r.run(2, progress=False, checkpoint=str(ck), checkpoint_every=1)
    good = {k: v.clone() for k, v in r.ansatz.state_dict().items()}
    with torch.no_grad():
        next(r.ansatz.parameters()).fill_(float("nan"))
    with pytest.raises(NonFiniteLossError):
        r.step()
    h = r.run(5, progress=False, checkpoint=str(ck), checkpoint_every=1).history
    assert len(h) == 2 and "stopped" in capsys.readouterr().out
    fresh = make_runner()
    fresh.load(ck)
    assert all(torch.equal(fresh.ansatz.state_dict()[k], good[k]) for k in good)


def test_early_stopping():
    r = make_runner()
    h = r.run(50, progress=False, callbacks=[EarlyStopping(tol=1e9, patience=3)]).history
    assert len(h) == 4


def test_running_topk_matches_global_sort():
    rng = np.random.default_rng(0)
    scores = rng.normal(size=1000).round(1)  # many ties
    mask = rng.random(1000) < 0.7
    t = RunningTopK(37)
    for lo in range(0, 1000, 64):
        t.update(scores[lo : lo + 64], offset=lo, mask=mask[lo : lo + 64])
    idx = np.flatnonzero(mask)
    expect = idx[np.lexsort((idx, -scores[idx]))][:37]
    assert t.indices().tolist() == expect.tolist()


def test_full_space_reaches_every_determinant():
    # with K large, S becomes the whole symmetry-allowed space and both estimators coincide
    r = make_runner("LiH", topk=1000)
    for _ in range(4):
        row = r.step()
    assert row["e_coupled"] == pytest.approx(row["e_variational"], abs=1e-12)
    assert len(r.space) <= len(all_determinants(6, (2, 2)))


def test_streamed_and_single_batch_paths_agree():
    # S in one batch reuses its forward pass; smaller batches recompute S for the loss
    rows = []
    for batch_size in (100_000, 7):
        r = make_runner("H2O", seed=1, topk=20, batch_size=batch_size)
        h = r.run(5, progress=False).history
        rows.append(h[["e_coupled", "e_variational", "n_space"]].to_numpy())
    np.testing.assert_allclose(rows[0], rows[1], atol=1e-11, rtol=0)


def test_torch_topk_matches_running_topk():
    """The tensor top-K (used by the GPU pipeline) picks what the numpy one picks, ties too,
    whether it merges every batch, every 100 rows (across batches) or once at the end."""
    import torch

    from cuscikit.nnqs.topk import RunningTopK, TorchTopK

    rng = np.random.default_rng(0)
    for k, merge in [(k, m) for k in (0, 1, 7, 50) for m in (1, 100, None)]:
        a, b = RunningTopK(k), TorchTopK(k, rows_per_merge=merge)
        for lo in range(0, 400, 64):
            scores = rng.integers(0, 20, size=64).astype(float)  # many ties
            mask = rng.random(64) < 0.7
            idx = np.arange(lo, lo + 64)
            a.update(scores, index=idx, mask=mask)
            b.update(torch.as_tensor(scores), torch.as_tensor(idx), mask=torch.as_tensor(mask))
        assert b.indices().tolist() == a.indices().tolist()


def test_gpu_pipeline_refused_on_cpu():
    mol = Molecule.load("LiH")
    ansatz = Ansatz.for_molecule(mol, seed=0)
    with pytest.raises(ValueError, match="CUDA device"):
        Runner(mol, ansatz, pipeline="gpu")
    with pytest.raises(ValueError, match="unknown pipeline"):
        Runner(mol, ansatz, pipeline="fast")
    with pytest.raises(ValueError, match="gpu pipeline only"):
        Runner(mol, ansatz, max_gpu_memory=10**9)


def test_compiled_inference_matches_eager():
    """The baseline's compiled ln psi pass changes rounding only."""
    mol = Molecule.load("LiH")
    runs = []
    for compiled in (False, True):
        ansatz = Ansatz.for_molecule(
            mol, seed=0, d_model=8, n_layers=1, phase_hidden=(8,), dtype=torch.float64
        )
        r = Runner(mol, ansatz, seed=0, compile_inference=compiled)
        r.run(3, progress=False)
        runs.append(r.history)
    for col in ("e_coupled", "e_variational", "n_space", "n_unique"):
        np.testing.assert_allclose(runs[1][col], runs[0][col], rtol=0, atol=1e-10)


def _space_matrix(pairs, hdiag, n):
    """Dense H_SS from the (source, target, value) pairs inside S and the diagonal."""
    src, dst, val = (np.asarray(torch.as_tensor(a).cpu()) for a in pairs)
    h = np.zeros((n, n))
    np.add.at(h, (src, dst), val)
    return h + np.diag(np.asarray(torch.as_tensor(hdiag).cpu()))


def test_pairs_inside_the_space_are_h_restricted_to_it():
    """The inner steps' H_SS (pairs of the coupled sets that land in S) equals H restricted
    to S, on a partial S where most coupled configurations lie outside it."""
    runner = make_runner("H2O", topk=40, inner_steps=1)
    for _ in range(3):
        runner.step()
    S = runner.space.configs
    out = runner._pipeline.run(S, runner.topk)
    assert len(out.space_pairs[0]) < out.n_coupled  # some pairs leave S
    h = _space_matrix(out.space_pairs, out.hdiag, len(S))
    ref = SCISpace(runner.molecule, S).hamiltonian.restricted(S).toarray()
    np.testing.assert_allclose(h, ref, rtol=0, atol=1e-12)


def test_an_inner_step_is_a_variational_step_on_the_same_space():
    """With S the whole sector nothing is added, so an iteration with one inner step takes the
    same two AdamW steps as two plain iterations of the variational estimator."""
    mol = Molecule.load("LiH")
    full = SCISpace.full(mol)
    two = make_runner(space=full, estimator="variational", inner_steps=0, teacher=0)
    two.run(2, progress=False)
    inner = make_runner(space=SCISpace.full(mol), estimator="variational", inner_steps=1, teacher=0)
    inner.run(1, progress=False)
    for a, b in zip(two.ansatz.parameters(), inner.ansatz.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    # and the steps do something: a third plain iteration moves away
    two.step()
    moved = max(
        float((a - b).detach().abs().max())
        for a, b in zip(two.ansatz.parameters(), inner.ansatz.parameters(), strict=True)
    )
    assert moved > 1e-8


def test_inner_steps_lower_the_energy_per_iteration():
    plain = make_runner("H2O", topk=32, inner_steps=0, teacher=0).run(30, progress=False).history
    inner = make_runner("H2O", topk=32, inner_steps=3, teacher=0).run(30, progress=False).history
    assert inner["e_variational"].iloc[-1] < plain["e_variational"].iloc[-1] - 1e-3


def test_learning_rate_decay_schedule_and_exact_resume(tmp_path):
    decay = LearningRateDecay(start=4, end=8, final_lr=1e-4)
    rates = [decay.rate(1e-3, t) for t in range(1, 11)]
    np.testing.assert_allclose(rates[:5], 1e-3)  # iterations 1..start+1 keep the rate
    np.testing.assert_allclose(rates[8:], 1e-4)  # from end+1 on: final_lr
    assert all(a > b for a, b in zip(rates[4:9], rates[5:9], strict=False))
    np.testing.assert_allclose(rates[6], 1e-3 * 0.1**0.5)  # geometric: halfway at t=7
    seen = []

    class Spy(Callback):
        def on_step_end(self, runner, row):
            seen.append(runner.optimizer.param_groups[0]["lr"])

    a = make_runner(seed=3)
    full = a.run(10, [LearningRateDecay(4, 8, 1e-4), Spy()], progress=False).history
    np.testing.assert_allclose(seen, rates[1:] + [1e-4])  # set for the next iteration
    b = make_runner(seed=3)
    b.run(
        6,
        [LearningRateDecay(4, 8, 1e-4)],
        progress=False,
        checkpoint=str(tmp_path / "c.h5"),
        checkpoint_every=3,
    )
    c = make_runner(seed=99).load(tmp_path / "c.h5")
    resumed = c.run(4, [LearningRateDecay(4, 8, 1e-4)], progress=False).history
    np.testing.assert_array_equal(
        full[ENERGY_COLUMNS].to_numpy(), resumed[ENERGY_COLUMNS].to_numpy()
    )
    plain = make_runner(seed=3).run(10, progress=False).history  # and the decay changes the run
    assert not np.array_equal(plain["e_tot"].to_numpy(), full["e_tot"].to_numpy())
    with pytest.raises(ValueError, match="start < end"):
        LearningRateDecay(8, 8, 1e-4)


def test_ctrl_c_stops_after_the_iteration_with_a_consistent_checkpoint(tmp_path):
    """SIGINT (a notebook's interrupt) during iteration 3: the run ends after it, the
    checkpoint holds iteration 3, and the run resumes from it as if never stopped."""
    import os
    import signal

    class CtrlC(Callback):
        def on_step_end(self, runner, row):
            if runner.iteration == 3:
                os.kill(os.getpid(), signal.SIGINT)
            return False

    ck = tmp_path / "ck.h5"
    r = make_runner(seed=4)
    r.run(8, [CtrlC()], progress=False, checkpoint=str(ck), checkpoint_every=5)
    assert r.status.status == "interrupted" and r.iteration == 3
    again = make_runner(seed=4).load(ck)
    assert again.iteration == 3
    full = make_runner(seed=4).run(5, progress=False).history
    resumed = again.run(2, progress=False).history
    np.testing.assert_array_equal(full["e_tot"], resumed["e_tot"])


def test_runner_options_are_checked_like_a_solvers():
    r = make_runner()
    r.topk_ = 5  # misspelt
    with pytest.raises(AttributeError, match="did you mean 'topk'"):
        r.step()
    with pytest.raises(AttributeError, match="no option 'learning_rate'"):
        make_runner(learning_rate=1e-3)
    r = make_runner()
    r.lr = 5e-4  # a new base rate applies at once
    r.step()
    assert r.optimizer.param_groups[0]["lr"] == 5e-4
    r.eps = 1e-10  # a structural option after the run started is refused
    with pytest.raises(ValueError, match="fixed once a run has started"):
        r.step()


def test_cpu_peak_memory_is_the_iterations_own():
    """An array allocated and freed between iterations is not the next iteration's peak (the
    process's lifetime peak would be)."""
    import mmap
    import resource

    r = make_runner()
    r.step()
    big = mmap.mmap(-1, 400_000_000)  # 400 MB of fresh pages, touched, then returned
    for page in range(0, 400_000_000, 4096):
        big[page] = 1
    big.close()
    row = r.step()
    lifetime = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    assert 0 < row["peak_memory_bytes"] < lifetime - 300_000_000
