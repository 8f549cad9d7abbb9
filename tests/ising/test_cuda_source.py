"""The dSB kernels compile for sm_90, their PTX has no fused multiply-add and the coupling sums
use the int8 tensor-core product (where nvcc exists; the GPU build may happen elsewhere)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

EXT = Path(__file__).parents[2] / "ext"


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_dsb_kernel_ptx_has_no_fma(tmp_path):
    ptx = tmp_path / "dsb.ptx"
    r = subprocess.run(
        [
            "nvcc", "-std=c++17", "-arch=sm_90", "-O3", "--expt-relaxed-constexpr",
            "--fmad=false", f"-I{EXT / 'include'}", f"-I{EXT / 'cuda'}", "-ptx",
            str(EXT / "cuda" / "ising" / "dsb.cu"), "-o", str(ptx),
        ],
        capture_output=True,
        text=True,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    text = ptx.read_text()
    assert re.search(r"\bfma\.", text) is None
    for op in ("mul.rn.f32", "add.rn.f32", "sub.rn.f32", "div.rn.f32", "cvt.rn.f32.s32"):
        assert op in text, op
    # the step (128- and 64-replica tiles), the initial state, the J expansion, the final flush
    assert text.count(".entry") == 5
    # the coupling sums are int8 tensor-core products with int32 accumulation
    assert "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32" in text
