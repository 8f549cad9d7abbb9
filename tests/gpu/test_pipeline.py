"""The GPU pipeline against the CPU pipeline, host staging, the memory cap and OOM retries."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from cuscikit import Ansatz, Molecule, Runner, SCISpace  # noqa: E402

pytestmark = pytest.mark.gpu


def _runner(mol, device, **kw):
    # The teacher's inner-step count defaults by device ("auto": 16 on CUDA, `inner_steps` on a
    # CPU); a comparison across devices fixes it, so both sides run the same schedule.
    kw.setdefault("teacher_inner_steps", None)
    ansatz = Ansatz.for_molecule(mol, seed=0, dtype=torch.float64, device=device)
    return Runner(mol, ansatz, topk=64, seed=0, **kw)


def test_gpu_run_matches_cpu_run():
    """Same seed, float64: the GPU pipeline and the CPU run agree to 1e-6 Ha per iteration."""
    mol = Molecule.load("H2O")
    cpu = _runner(mol, "cpu").run(50, progress=False).history
    gpu_runner = _runner(mol, "cuda", pipeline="gpu")
    gpu = gpu_runner.run(50, progress=False).history
    assert gpu_runner.active_pipeline == "gpu"
    np.testing.assert_allclose(gpu["e_coupled"], cpu["e_coupled"], rtol=0, atol=1e-6)
    np.testing.assert_allclose(gpu["e_variational"], cpu["e_variational"], rtol=0, atol=1e-6)
    np.testing.assert_array_equal(gpu["n_space"], cpu["n_space"])
    np.testing.assert_array_equal(gpu["n_unique"], cpu["n_unique"])
    np.testing.assert_array_equal(gpu["n_coupled"], cpu["n_coupled"])


def test_baseline_on_gpu_matches_gpu_pipeline():
    mol = Molecule.load("LiH")
    base = _runner(mol, "cuda", pipeline="baseline").run(20, progress=False).history
    gpu = _runner(mol, "cuda", pipeline="gpu").run(20, progress=False).history
    np.testing.assert_allclose(gpu["e_coupled"], base["e_coupled"], rtol=0, atol=1e-9)


def test_host_staging_gives_the_same_iteration():
    mol = Molecule.load("N2")
    dev = _runner(mol, "cuda", pipeline="gpu", staging="device").run(8, progress=False).history
    host = _runner(mol, "cuda", pipeline="gpu", staging="host").run(8, progress=False).history
    assert (host["bytes_staged"] > 0).all() and (dev["bytes_staged"] == 0).all()
    # equal up to the reductions' rounding (their order may follow the buffers' alignment)
    np.testing.assert_allclose(
        host["e_coupled"].to_numpy(), dev["e_coupled"].to_numpy(), rtol=0, atol=1e-12
    )


def _big_space(mol, n):
    """S of n configurations: breadth-first excitations of HF."""
    from cuscikit.backends.keys import dedup
    from cuscikit.sci.hamiltonian import Hamiltonian

    H = Hamiltonian.from_molecule(mol)
    S = SCISpace.hf(mol).configs
    while len(S) < n:
        S = dedup(np.concatenate([S, H.coupled(S[:2000]).configs]))[0]
    rng = np.random.default_rng(0)
    return S[np.sort(rng.choice(len(S), n, replace=False))]


def _small_float64_ansatz(mol):
    """float64, so that batch layouts and library algorithm choices cannot move the results
    beyond rounding; small, so that inference over U stays quick."""
    return Ansatz.for_molecule(
        mol, seed=0, device="cuda", dtype=torch.float64, d_model=8, n_layers=1, phase_hidden=(16,)
    )


def _pipeline(mol, ansatz, engine="cuda", cap=None, **kw):
    """One process's stages 1-3 on the CUDA or the host engine."""
    from cuscikit.backends.memory import MemoryBudget
    from cuscikit.nnqs.pipeline import Pipeline
    from cuscikit.sci.engines import engine as make_engine

    eng = make_engine(engine, mol, eps=1e-12, device="cuda")
    budget = MemoryBudget(eng.device, cap) if engine == "cuda" else None
    return Pipeline(eng, ansatz, batch_size=kw.pop("batch_size", 8192), budget=budget, **kw)


@pytest.fixture
def restore_memory_fraction():
    yield
    torch.cuda.set_per_process_memory_fraction(1.0)
    torch.cuda.empty_cache()


def _held() -> int:
    """Device bytes this process still holds (earlier tests' workspaces included)."""
    import gc

    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return torch.cuda.memory_allocated()


def _host(x):
    return x.cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def test_cuda_and_host_engines_give_the_same_stages():
    """The one pipeline on the CUDA engine and on the host engine: same unique set, same
    selection, local energies equal to rounding."""
    mol = Molecule.load("N2/cc-pVDZ")
    space = _big_space(mol, 1500)
    ansatz = _small_float64_ansatz(mol)
    gpu = _pipeline(mol, ansatz, "cuda", want_pairs=True).run(space, 64)
    cpu = _pipeline(mol, ansatz, "cpu", want_pairs=True).run(space, 64)
    assert (gpu.n_unique, gpu.n_coupled) == (cpu.n_unique, cpu.n_coupled)
    np.testing.assert_array_equal(gpu.new_configs, cpu.new_configs)
    np.testing.assert_array_equal(gpu.keep_rows, cpu.keep_rows)
    for name in ("eloc_coupled", "eloc_variational", "psi_s", "hdiag"):
        np.testing.assert_allclose(
            _host(getattr(gpu, name)),
            _host(getattr(cpu, name)),
            rtol=1e-10,
            atol=1e-10,
            err_msg=name,
        )
    for a, b in zip(gpu.space_pairs, cpu.space_pairs, strict=True):
        np.testing.assert_array_equal(_host(a), _host(b))


def test_memory_cap_is_respected(restore_memory_fraction):
    """Under a cap well below the theoretical peak the iteration completes in batches, with
    the same energy, and the measured peak stays under the cap."""
    mol = Molecule.load("N2/cc-pVDZ")
    space = _big_space(mol, 3000)
    ansatz = _small_float64_ansatz(mol)
    r_free = _pipeline(mol, ansatz).run(space, 64)
    theoretical = r_free.peak_theoretical
    eloc_free, u_free = _host(r_free.eloc_coupled), r_free.n_unique
    del r_free
    cap = _held() + int(theoretical * 0.5)  # the cap is the process's: half the need on top
    torch.cuda.reset_peak_memory_stats()
    r_cap = _pipeline(mol, ansatz, cap=cap).run(space, 64)
    torch.cuda.synchronize()
    assert r_cap.n_batches > 1
    assert torch.cuda.max_memory_allocated() <= cap
    assert r_cap.n_unique == u_free
    np.testing.assert_allclose(_host(r_cap.eloc_coupled), eloc_free, rtol=1e-12, atol=0)


def test_out_of_memory_shrinks_batches(restore_memory_fraction, monkeypatch):
    """A plan that overestimates free memory hits OutOfMemoryError; the stage is retried with
    smaller batches instead of ending the run. The cap is half of what this very plan was
    measured to need on top of what the process holds (not a share of the estimate: memory
    that earlier work left behind and the run frees would otherwise make room)."""
    mol = Molecule.load("N2/cc-pVDZ")
    space = _big_space(mol, 2000)
    ansatz = _small_float64_ansatz(mol)

    def wrong_plan(pipe):  # a wrong, huge estimate of free memory: one batch for everything
        monkeypatch.setattr(pipe.budget, "available", lambda: 1 << 40)
        return pipe

    held = _held()
    torch.cuda.reset_peak_memory_stats()
    ref = wrong_plan(_pipeline(mol, ansatz, staging="host")).run(space, 16)
    need = torch.cuda.max_memory_allocated() - held
    ref_eloc = _host(ref.eloc_coupled)
    del ref
    pipe = wrong_plan(_pipeline(mol, ansatz, cap=_held() + need // 2, staging="host"))
    batch_size = pipe.batch_size
    r = pipe.run(space, 16)
    assert pipe.retries > 0  # it ran out and retried with smaller batches
    assert pipe.item_limit is not None or pipe.batch_size < batch_size
    np.testing.assert_allclose(_host(r.eloc_coupled), ref_eloc, rtol=1e-12, atol=0)


def test_gpu_pipeline_needs_cuda_ansatz():
    mol = Molecule.load("LiH")
    with pytest.raises(ValueError, match="CUDA device"):
        _runner(mol, "cpu", pipeline="gpu")


def test_compiled_inference_matches_eager():
    mol = Molecule.load("N2")
    space = _big_space(mol, 500)
    ansatz = Ansatz.for_molecule(mol, seed=0, device="cuda")
    eager = _pipeline(mol, ansatz, batch_size=4096).run(space, 32)
    comp = _pipeline(mol, ansatz, batch_size=4096, compile_inference=True).run(space, 32)
    torch.testing.assert_close(
        torch.as_tensor(comp.eloc_coupled),
        torch.as_tensor(eager.eloc_coupled),
        rtol=1e-4,
        atol=1e-4,
    )
    # The same selection up to near-ties: the two passes pick equally many configurations and
    # their scores agree to float32 rounding.
    assert len(comp.new_configs) == len(eager.new_configs)
    np.testing.assert_allclose(
        np.sort(comp.keep_scores), np.sort(eager.keep_scores), rtol=0, atol=1e-4
    )


def test_gpu_checkpoint_resumes_on_a_cpu_only_machine(tmp_path, monkeypatch):
    """A checkpoint written by a GPU run loads where CUDA is unavailable (the optimiser state
    was serialised from CUDA tensors) and the run continues as on the GPU."""
    mol = Molecule.load("LiH")
    gpu = _runner(mol, "cuda", pipeline="gpu")
    gpu.run(5, progress=False)
    path = tmp_path / "gpu.h5"
    gpu.save(path)
    cpu = _runner(mol, "cpu")
    with monkeypatch.context() as m:
        m.setattr(torch.cuda, "is_available", lambda: False)
        cpu.load(path)
    assert cpu.iteration == 5
    state = cpu.optimizer.state_dict()["state"]
    assert all(v.device.type == "cpu" for s in state.values() for v in s.values())
    more_gpu = gpu.run(3, progress=False).history
    more_cpu = cpu.run(3, progress=False).history
    np.testing.assert_allclose(more_cpu["e_coupled"], more_gpu["e_coupled"], rtol=0, atol=1e-6)
    np.testing.assert_array_equal(more_cpu["n_space"], more_gpu["n_space"])
    back = tmp_path / "cpu.h5"  # and a CPU checkpoint resumes on the GPU
    cpu.save(back)
    again = _runner(mol, "cuda", pipeline="gpu").load(back)
    assert again.iteration == 8
    np.testing.assert_allclose(
        again.run(2, progress=False).history["e_coupled"].to_numpy()[-2:],
        cpu.run(2, progress=False).history["e_coupled"].to_numpy()[-2:],
        rtol=0,
        atol=1e-6,
    )


def test_gpu_inner_steps_match_cpu_inner_steps():
    """The GPU pipeline's H_SS pairs equal H restricted to S, and a run with inner steps
    follows the CPU run with inner steps."""
    mol = Molecule.load("H2O")
    gpu_runner = _runner(mol, "cuda", pipeline="gpu", inner_steps=2)
    for _ in range(3):
        gpu_runner.step()
    S = gpu_runner.space.configs
    r = gpu_runner._pipeline.run(S, gpu_runner.topk)
    src, dst, val = (a.cpu().numpy() for a in r.space_pairs)
    h = np.zeros((len(S), len(S)))
    np.add.at(h, (src, dst), val)
    h += np.diag(r.hdiag.cpu().numpy())
    ref = SCISpace(mol, S).hamiltonian.restricted(S).toarray()
    np.testing.assert_allclose(h, ref, rtol=0, atol=1e-12)

    cpu = _runner(mol, "cpu", inner_steps=2).run(20, progress=False).history
    gpu = _runner(mol, "cuda", pipeline="gpu", inner_steps=2).run(20, progress=False).history
    np.testing.assert_allclose(gpu["e_coupled"], cpu["e_coupled"], rtol=0, atol=1e-6)
    np.testing.assert_array_equal(gpu["n_space"], cpu["n_space"])


def test_weight_growth_on_the_gpu_matches_the_cpu():
    """Growth by weight (first-order top-K on the device, torch.topk) against the host path:
    the same sizes every iteration, the same energies and weights outside S, the budget kept."""
    mol = Molecule.load("H2O")
    budget = 620_000  # binds from the third iteration on (H2O, K = 64)
    kw = dict(growth="weight", add_weight=1e-7, space_memory=budget)
    cpu = _runner(mol, "cpu", **kw).run(8, progress=False).history
    gpu_runner = _runner(mol, "cuda", pipeline="gpu", **kw)
    gpu = gpu_runner.run(8, progress=False).history
    assert gpu_runner.active_pipeline == "gpu"
    assert cpu["n_new"].sum() > 0  # S grew by weight
    assert cpu["bytes_planned"].max() > 0.9 * budget  # and the budget took part
    np.testing.assert_array_equal(gpu["n_space_next"], cpu["n_space_next"])
    np.testing.assert_array_equal(gpu["n_new"], cpu["n_new"])
    np.testing.assert_allclose(gpu["e_variational"], cpu["e_variational"], rtol=0, atol=1e-6)
    np.testing.assert_allclose(gpu["weight_outside"], cpu["weight_outside"], rtol=1e-6)
    assert (gpu["bytes_planned"] <= budget).all()
