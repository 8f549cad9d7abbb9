"""`global_dedup` on torch tensors: the same code as on numpy arrays, keys on their device.

In process (one rank, SerialComm): the tensor primitives against their numpy twins. Real ranks:
2 gloo ranks under torchrun and 2 MPI ranks on CPU tensors (`mpi` marker), and 2 NCCL ranks on
2 GPUs (`multi_gpu` marker; skipped without two GPUs). Every run is compared with the
single-process numpy de-dup of the union: slices in rank order, routing, fetched values.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from _cases import CASES, case_keys, check_partition, key_values

from cuscikit.backends.keys import dedup_numpy, searchsorted, sort_unique
from cuscikit.parallel import SerialComm, global_dedup

WORKER = Path(__file__).with_name("_gpu_dedup_worker.py")


def _t(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.uint64).view(np.int64))


def _keys(words: int, n: int = 1500, seed: int = 0) -> np.ndarray:
    """Random keys with the sign bit set in many words, small values and duplicates."""
    rng = np.random.default_rng([seed, words])
    k = rng.integers(0, 4, (n, words), dtype=np.uint64)
    k[::3] = rng.integers(0, 2**64, (len(k[::3]), words), dtype=np.uint64)
    k[::5, -1] |= np.uint64(2**63)
    return k


@pytest.mark.parametrize("words", [1, 2, 3, 4])
@pytest.mark.parametrize("impl", ["auto", "torch"])
def test_sort_unique_and_search_match_numpy(words, impl):
    k = _keys(words)
    u, inv, _ = dedup_numpy(k)
    tu, tinv = sort_unique(_t(k), impl=impl)
    assert np.array_equal(tu.numpy().view(np.uint64), u)
    assert np.array_equal(tinv.numpy(), inv)
    q = _keys(words, 80, seed=1)
    q[::2] = u[np.random.default_rng(2).integers(0, len(u), len(q[::2]))]
    for side in ("left", "right"):
        got = searchsorted(_t(u), _t(q), side=side).numpy()
        assert np.array_equal(got, searchsorted(u, q, side=side)), side


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("impl", ["auto", "torch"])
def test_one_rank_equals_numpy_global_dedup(case, impl):
    for words in (1, 3) if case != "coupled" else (1,):
        keys = case_keys(case, words, 0, 1)
        ref = global_dedup(keys, SerialComm(), samples_per_rank=64)
        res = global_dedup(_t(keys), SerialComm(), samples_per_rank=64, impl=impl)
        got = res.as_numpy()
        assert np.array_equal(got.unique.reshape(-1, words), ref.unique.reshape(-1, words))
        for name in ("offsets", "owner", "index", "request_counts", "serve_counts"):
            assert np.array_equal(getattr(got, name), getattr(ref, name)), name
        vals = torch.from_numpy(key_values(got.unique.reshape(-1, words)))
        assert np.array_equal(res.fetch(vals).numpy(), key_values(keys.reshape(-1, words)))
        assert res.metrics.items == len(keys) and res.metrics.unique == len(ref.unique)


def test_bad_input():
    with pytest.raises(TypeError, match="int64"):
        global_dedup(torch.zeros((3, 1), dtype=torch.float64))
    with pytest.raises(ValueError, match="1..4 words"):
        global_dedup(torch.zeros((3, 5), dtype=torch.int64))
    with pytest.raises(ValueError, match="impl"):
        sort_unique(torch.zeros((3, 1), dtype=torch.int64), impl="bogus")


# --- real ranks ----------------------------------------------------------------------------------


def _verify(out: Path, P: int, variants: list[str]) -> None:
    sys.path.insert(0, str(WORKER.parent))
    from _gpu_dedup_worker import WORDS

    for r in range(P):
        rep = json.loads((out / f"rank{r}.json").read_text())
        assert rep["status"] == "ok", rep.get("traceback")
        assert (rep["rank"], rep["size"]) == (r, P)
    for case in CASES:
        for words in WORDS[case]:
            inputs = [case_keys(case, words, r, P).reshape(-1, words) for r in range(P)]
            ref = dedup_numpy(np.concatenate(inputs))[0]
            for v in variants:
                what = f"{case}, {words} words, {v}, P={P}"
                parts = [np.load(out / f"{case}-{words}-{v}-r{r}.npz") for r in range(P)]
                sizes = check_partition(parts, inputs, ref, what)
                if "norebalance" not in v:
                    assert max(sizes) - min(sizes) <= 1, (what, sizes)


@pytest.mark.mpi
def test_torchrun_gloo_two_ranks(tmp_path):
    from _launch import launch, torchrun

    launch(torchrun(2) + [str(WORKER), str(tmp_path), "cpu"], tmp_path)
    _verify(tmp_path, 2, ["numpy", "numpy-norebalance", "torch"])


@pytest.mark.mpi
def test_mpiexec_two_ranks(tmp_path):
    from _launch import launch, mpiexec

    cmd = mpiexec() + ["-n", "2", sys.executable, "-m", "mpi4py"]
    launch(cmd + [str(WORKER), str(tmp_path), "cpu"], tmp_path)
    _verify(tmp_path, 2, ["numpy", "numpy-norebalance", "torch"])


@pytest.mark.multi_gpu
@pytest.mark.mpi
def test_torchrun_nccl_two_gpus(tmp_path, monkeypatch):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA GPUs")
    from _launch import launch, torchrun

    monkeypatch.setenv("NCCL_NVLS_ENABLE", "0")
    monkeypatch.setenv("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    assert os.environ["NCCL_NVLS_ENABLE"] == "0"  # _launch.env copies os.environ
    launch(torchrun(2) + [str(WORKER), str(tmp_path), "cuda"], tmp_path, gpus=True)
    _verify(tmp_path, 2, ["kernel", "kernel-norebalance", "torch"])
