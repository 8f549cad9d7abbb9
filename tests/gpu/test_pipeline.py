"""The GPU pipeline against the CPU pipeline, host staging, the memory cap and OOM retries."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from cuscikit import Ansatz, Molecule, Runner, SCISpace  # noqa: E402

pytestmark = pytest.mark.gpu


def _runner(mol, device, **kw):
    ansatz = Ansatz.for_molecule(mol, seed=0, dtype=torch.float64, device=device)
    return Runner(mol, ansatz, topk=64, seed=0, **kw)


def test_gpu_run_matches_cpu_run():
    """Same seed, float64: the GPU pipeline and the CPU run agree to 1e-6 Ha per iteration."""
    mol = Molecule.load("H2O")
    cpu = _runner(mol, "cpu").run(50, progress=False)
    gpu_runner = _runner(mol, "cuda", pipeline="gpu")
    gpu = gpu_runner.run(50, progress=False)
    assert gpu_runner.pipeline == "gpu"
    np.testing.assert_allclose(gpu["e_coupled"], cpu["e_coupled"], rtol=0, atol=1e-6)
    np.testing.assert_allclose(gpu["e_variational"], cpu["e_variational"], rtol=0, atol=1e-6)
    np.testing.assert_array_equal(gpu["n_space"], cpu["n_space"])
    np.testing.assert_array_equal(gpu["n_unique"], cpu["n_unique"])
    np.testing.assert_array_equal(gpu["n_coupled"], cpu["n_coupled"])


def test_baseline_on_gpu_matches_gpu_pipeline():
    mol = Molecule.load("LiH")
    base = _runner(mol, "cuda", pipeline="baseline").run(20, progress=False)
    gpu = _runner(mol, "cuda", pipeline="gpu").run(20, progress=False)
    np.testing.assert_allclose(gpu["e_coupled"], base["e_coupled"], rtol=0, atol=1e-9)


def test_host_staging_gives_the_same_iteration():
    mol = Molecule.load("N2")
    dev = _runner(mol, "cuda", pipeline="gpu", staging="device").run(8, progress=False)
    host = _runner(mol, "cuda", pipeline="gpu", staging="host").run(8, progress=False)
    assert (host["bytes_staged"] > 0).all() and (dev["bytes_staged"] == 0).all()
    np.testing.assert_array_equal(host["e_coupled"].to_numpy(), dev["e_coupled"].to_numpy())


def _big_space(mol, n):
    """S of n configurations: breadth-first excitations of HF."""
    from cuscikit.sci.dedup import dedup
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
    return Ansatz.for_molecule(mol, seed=0, device="cuda", dtype=torch.float64, d_model=8,
                               n_layers=1, phase_hidden=(16,))


@pytest.fixture
def restore_memory_fraction():
    yield
    torch.cuda.set_per_process_memory_fraction(1.0)
    torch.cuda.empty_cache()


def test_memory_cap_is_respected(restore_memory_fraction):
    """Under a cap well below the theoretical peak the iteration completes in batches, with
    the same energy, and the measured peak stays under the cap."""
    from cuscikit.gpu.pipeline import GpuPipeline

    mol = Molecule.load("N2/cc-pVDZ")
    space = _big_space(mol, 3000)
    ansatz = _small_float64_ansatz(mol)
    free = GpuPipeline(mol, ansatz, eps=1e-12, batch_size=8192)
    r_free = free.run(space, 64)
    theoretical = r_free.peak_theoretical
    unique_free = r_free.unique.cpu().numpy()
    num_free = r_free.num_coupled.cpu().numpy()
    del free, r_free
    cap = int(theoretical * 0.5)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    capped = GpuPipeline(mol, ansatz, eps=1e-12, batch_size=8192, max_gpu_memory=cap)
    r_cap = capped.run(space, 64)
    torch.cuda.synchronize()
    assert r_cap.n_batches > 1
    assert torch.cuda.max_memory_allocated() <= cap
    np.testing.assert_array_equal(r_cap.unique.cpu().numpy(), unique_free)
    np.testing.assert_allclose(r_cap.num_coupled.cpu().numpy(), num_free, rtol=1e-12, atol=0)


def test_out_of_memory_shrinks_batches(restore_memory_fraction, monkeypatch):
    """A plan that overestimates free memory hits OutOfMemoryError; the stage is retried with
    smaller batches instead of ending the run."""
    from cuscikit.gpu.pipeline import GpuPipeline

    mol = Molecule.load("N2/cc-pVDZ")
    space = _big_space(mol, 2000)
    ansatz = _small_float64_ansatz(mol)
    ref = GpuPipeline(mol, ansatz, eps=1e-12, batch_size=8192).run(space, 16)
    ref_num, theoretical = ref.num_coupled.cpu().numpy(), ref.peak_theoretical
    del ref
    torch.cuda.empty_cache()
    pipe = GpuPipeline(mol, ansatz, eps=1e-12, batch_size=8192, staging="host",
                       max_gpu_memory=int(theoretical * 0.5))
    monkeypatch.setattr(pipe.budget, "available", lambda: 1 << 40)  # a wrong, huge estimate
    r = pipe.run(space, 16)
    assert pipe.item_limit is not None  # it did retry
    np.testing.assert_allclose(r.num_coupled.cpu().numpy(), ref_num, rtol=1e-12, atol=0)


def test_gpu_pipeline_needs_cuda_ansatz():
    mol = Molecule.load("LiH")
    with pytest.raises(ValueError, match="CUDA device"):
        _runner(mol, "cpu", pipeline="gpu")


def test_compiled_inference_matches_eager():
    from cuscikit.gpu.pipeline import GpuPipeline

    mol = Molecule.load("N2")
    space = _big_space(mol, 500)
    ansatz = Ansatz.for_molecule(mol, seed=0, device="cuda")
    eager = GpuPipeline(mol, ansatz, eps=1e-12, batch_size=4096).run(space, 32)
    comp = GpuPipeline(mol, ansatz, eps=1e-12, batch_size=4096, compile_inference=True)
    r = comp.run(space, 32)
    torch.testing.assert_close(r.logpsi, eager.logpsi, rtol=1e-5, atol=1e-5)
    # The same selection up to near-ties: every row the compiled pass picked scores within
    # rounding of the eager pass's weakest pick.
    eager_scores = eager.logpsi.real
    assert len(r.topk_rows) == len(eager.topk_rows)
    assert eager_scores[r.topk_rows].min() >= eager_scores[eager.topk_rows].min() - 1e-5


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
    more_gpu = gpu.run(3, progress=False)
    more_cpu = cpu.run(3, progress=False)
    np.testing.assert_allclose(more_cpu["e_coupled"], more_gpu["e_coupled"], rtol=0, atol=1e-6)
    np.testing.assert_array_equal(more_cpu["n_space"], more_gpu["n_space"])
    back = tmp_path / "cpu.h5"  # and a CPU checkpoint resumes on the GPU
    cpu.save(back)
    again = _runner(mol, "cuda", pipeline="gpu").load(back)
    assert again.iteration == 8
    np.testing.assert_allclose(
        again.run(2, progress=False)["e_coupled"].to_numpy()[-2:],
        cpu.run(2, progress=False)["e_coupled"].to_numpy()[-2:], rtol=0, atol=1e-6)


def test_gpu_inner_steps_match_cpu_inner_steps():
    """The GPU pipeline's H_SS pairs equal H restricted to S, and a run with inner steps
    follows the CPU run with inner steps."""
    mol = Molecule.load("H2O")
    gpu_runner = _runner(mol, "cuda", pipeline="gpu", inner_steps=2)
    for _ in range(3):
        gpu_runner.step()
    S = gpu_runner.space.configs
    r = gpu_runner._gpu.run(S, gpu_runner.topk, space_pairs=True)
    src, dst, val = (a.cpu().numpy() for a in r.space_pairs)
    h = np.zeros((len(S), len(S)))
    np.add.at(h, (src, dst), val)
    h += np.diag(r.hdiag.cpu().numpy())
    ref = SCISpace(mol, S).hamiltonian.restricted(S).toarray()
    np.testing.assert_allclose(h, ref, rtol=0, atol=1e-12)

    cpu = _runner(mol, "cpu", inner_steps=2).run(20, progress=False)
    gpu = _runner(mol, "cuda", pipeline="gpu", inner_steps=2).run(20, progress=False)
    np.testing.assert_allclose(gpu["e_coupled"], cpu["e_coupled"], rtol=0, atol=1e-6)
    np.testing.assert_array_equal(gpu["n_space"], cpu["n_space"])
