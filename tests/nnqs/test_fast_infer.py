"""The fused inference path on the CPU: which sizes it takes, the Runner option, and (where
Triton is installed) the kernel through Triton's interpreter against the module."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

from cuscikit import Ansatz, Molecule, Runner  # noqa: E402
from cuscikit.nnqs.fast_infer import FusedInference, unsupported_reason  # noqa: E402


def test_unsupported_sizes_have_reasons():
    assert "d_model=96" in unsupported_reason(Ansatz(6, (3, 2), d_model=96, seed=0))
    assert "float64" in unsupported_reason(Ansatz(6, (3, 2), seed=0, dtype=torch.float64))
    assert "head width 12" in unsupported_reason(Ansatz(6, (3, 2), d_model=48, n_heads=4))
    assert "norb=70" in unsupported_reason(Ansatz(70, (3, 2), d_model=16, n_heads=2))
    assert "is not a cuscikit Ansatz" in unsupported_reason(torch.nn.Linear(2, 2))


def test_cpu_ansatz_is_refused():
    with pytest.raises(ValueError, match="fused inference unavailable"):
        FusedInference(Ansatz(6, (3, 2), seed=0))


def test_runner_option():
    mol = Molecule.load("LiH")
    with pytest.raises(ValueError, match="fused_inference must be"):
        Runner(mol, Ansatz.for_molecule(mol, seed=0), fused_inference="yes")
    with pytest.raises(ValueError, match="fused_inference=True, but"):
        Runner(mol, Ansatz.for_molecule(mol, seed=0), fused_inference=True)
    r = Runner(mol, Ansatz.for_molecule(mol, seed=0))  # "auto" on a CPU: the module
    assert r._pipeline.fused_inference is None


_INTERPRETED = textwrap.dedent(
    """
    import copy, torch
    from cuscikit import Ansatz
    from cuscikit.nnqs.fast_infer import FusedInference
    from cuscikit.sci.configs import all_determinants
    for norb, nelec, d, h in [(6, (3, 2), 16, 2), (5, (2, 2), 32, 4)]:
        a = Ansatz(norb, nelec, d_model=d, n_heads=h, n_layers=2, phase_hidden=(8,), seed=0)
        g = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for p in a.parameters():
                p.add_(0.2 * torch.randn(p.shape, generator=g))
        x = all_determinants(norb, nelec)[:24]
        fast = FusedInference(a, block=2)
        ref = copy.deepcopy(a).double().log_psi(x)
        err = float((fast(x).to(torch.complex128) - ref).abs().max())
        print(norb, d, err)
        assert err < 1e-5, err
        bad = all_determinants(norb, (nelec[0] - 1, nelec[1]))[:3]
        assert torch.isneginf(fast(bad).real).all()
    """
)


def test_kernel_in_triton_interpreter():
    """The kernel's arithmetic (layout, masks, attention groups, log-softmax) on the CPU."""
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1")
    out = subprocess.run(
        [sys.executable, "-c", _INTERPRETED], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stdout + out.stderr
