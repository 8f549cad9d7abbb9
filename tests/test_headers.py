"""The shared physics headers compile as device code too (one primitive, two backends), and
every CUDA source compiles. Needs nvcc; skipped without it."""

import shutil
import subprocess
from pathlib import Path

import pytest

INCLUDE = Path(__file__).parents[1] / "ext" / "include"

KERNEL = r"""
#include "cuscikit/slater_condon.hpp"
__global__ void element(csk::HamiltonianView H, const csk_u64* x, const csk_u64* y, double* out,
                        int nwords) {
  const int t = threadIdx.x;
  out[t] = csk::matrix_element(H, y + t * nwords, x + t * nwords, nwords);
}
"""


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_slater_condon_header_compiles_for_sm90(tmp_path):
    src = tmp_path / "check.cu"
    src.write_text(KERNEL)
    r = subprocess.run(
        [
            "nvcc",
            "-std=c++17",
            "-arch=sm_90",
            f"-I{INCLUDE}",
            "-c",
            str(src),
            "-o",
            str(tmp_path / "check.o"),
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_cuda_kernel_sources_compile_for_sm90(tmp_path):
    """ext/cuda compiles on machines without a GPU too, so a broken kernel shows up in CI
    (the package build only compiles it where a driver is present)."""
    cuda = INCLUDE.parent / "cuda"
    procs = [
        subprocess.Popen(
            [
                "nvcc",
                "-std=c++17",
                "-arch=sm_90",
                "--expt-relaxed-constexpr",
                f"-I{INCLUDE}",
                f"-I{cuda}",
                '-DCSK_CUDA_ARCHS="90"',
                "-c",
                str(src),
                "-o",
                str(tmp_path / ("_".join(src.relative_to(cuda).parts) + ".o")),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for src in sorted(cuda.rglob("*.cu"))
    ]
    assert len(procs) >= 4
    for p in procs:
        _, err = p.communicate()
        assert p.returncode == 0, err
