"""The Runner on one rank per GPU: the gpu pipeline on every rank, the global de-dup over NCCL
on GPU tensors, energies equal to a single-GPU run to 1e-8 Ha per iteration (float64).

Needs two GPUs (`multi_gpu`); started with torchrun through `_runner_worker.py gpu`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from _launch import env, launch, torchrun
from _runner_worker import CASES, make_runner, summary
from test_runner_ranks import TOL, check_against_reference

torch = pytest.importorskip("torch")

WORKER = Path(__file__).with_name("_runner_worker.py")
pytestmark = [
    pytest.mark.multi_gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs two CUDA GPUs"
    ),
]
GPU_CASES = ["LiH-capped", "H2O", "H2O-teacher"]
# NVLink multicast stays off on shared hosts
NCCL = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}


def _single_gpu(name: str) -> dict:
    runner = make_runner(CASES[name], device="cuda:0")
    runner.run(CASES[name]["iters"], progress=False)
    assert runner.active_pipeline == "gpu"
    return summary(runner)


def test_two_gpus_match_one_gpu(tmp_path, monkeypatch):
    for k, v in NCCL.items():
        monkeypatch.setenv(k, v)
    launch(
        torchrun(2) + [str(WORKER), str(tmp_path), "gpu", ",".join(GPU_CASES)], tmp_path, gpus=True
    )
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for r, rep in enumerate(reports):
        assert rep["status"] == "ok", rep.get("traceback")
        assert (rep["rank"], rep["size"]) == (r, 2)
        assert rep["backend"] == "nccl" and rep["device"] == f"cuda:{r}"
    for name in GPU_CASES:
        got = [rep["cases"][name] for rep in reports]
        assert got[1] == got[0], name  # identical replicas, histories and S on both GPUs
        check_against_reference(got[0], _single_gpu(name), f"2 GPUs {name}", 2)


def test_cli_on_two_gpus_matches_one_gpu(tmp_path, monkeypatch):
    argv = [
        "nnqs",
        "LiH",
        "--iters",
        "6",
        "--topk",
        "16",
        "--device",
        "cuda",
        "--dtype",
        "float64",
        "--teacher",  # the plain method here (the teacher on two GPUs: H2O-teacher above)
        "0",
        "--json",
    ]
    one = subprocess.run(
        [sys.executable, "-m", "cuscikit", *argv],
        capture_output=True,
        text=True,
        env=env(gpus=True),
        timeout=300,
    )
    assert one.returncode == 0, one.stderr
    cmd = torchrun(2) + ["-m", "cuscikit", *argv]
    two = subprocess.run(
        cmd, capture_output=True, text=True, env=env(gpus=True, **NCCL), timeout=300
    )
    assert two.returncode == 0, two.stderr
    a, b = json.loads(one.stdout.splitlines()[-1]), json.loads(two.stdout.splitlines()[-1])
    assert (a["ranks"], b["ranks"]) == (1, 2) and a["pipeline"] == b["pipeline"] == "gpu"
    assert abs(a["e_tot"] - b["e_tot"]) <= TOL and a["n_space"] == b["n_space"]
