"""Shared fixtures: small reference systems built with PySCF (skipped cleanly without it)."""

from __future__ import annotations

import functools

import numpy as np
import pytest


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


def pytest_collection_modifyitems(config, items):
    if _has_cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords or "multi_gpu" in item.keywords:
            item.add_marker(skip)


def count_calls(monkeypatch, owner, name: str) -> list:
    """Replace ``owner.name`` (a function or method) by one that records each call's
    positional arguments in the returned list, then calls the original."""
    original = getattr(owner, name)
    calls: list = []

    def counted(*args, **kwargs):
        calls.append(args)
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, counted)
    return calls


def next_recorded_stage(runner) -> dict:
    """One more iteration of ``runner`` (a Runner with a recorded optimiser stage); returns the
    stage's arguments (``args``, ``kw``) and the weights and AdamW state just before it
    (``weights``, ``adamw``)."""
    import copy

    stage, seen = runner._graph_stage, {}
    run = stage.run

    def spy(*args, **kw):
        seen.update(args=args, kw=kw)
        seen["weights"] = copy.deepcopy(runner.ansatz.state_dict())
        seen["adamw"] = copy.deepcopy(runner.optimizer.state_dict())
        return run(*args, **kw)

    stage.run = spy
    try:
        runner.run(1, progress=False)
    finally:
        del stage.run
    return seen


def run_interpreted(script: str, timeout: float = 300):
    """Run a Python script in a fresh process under Triton's interpreter (the kernels on the
    CPU); skips without Triton, fails with the process's output if it fails. Returns its
    stdout."""
    import os
    import subprocess
    import sys

    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1")
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=timeout
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


@functools.cache
def pyscf_integrals(atom: str, basis: str = "sto-3g", spin: int = 0, charge: int = 0):
    """(h1e, eri 4-fold, e_core, norb, (na, nb)) from an RHF/ROHF run."""
    pyscf = pytest.importorskip("pyscf")
    from pyscf import ao2mo, gto, scf

    mol = gto.M(atom=atom, basis=basis, spin=spin, charge=charge, verbose=0)
    mf = (scf.RHF(mol) if spin == 0 else scf.ROHF(mol)).run(conv_tol=1e-12)
    c = mf.mo_coeff
    h1 = c.T @ mf.get_hcore() @ c
    eri = ao2mo.full(mol, c)
    del pyscf
    return h1, eri, mol.energy_nuc(), c.shape[1], mol.nelec


SYSTEMS = {
    "LiH": "Li 3 0 0; H 2 0 0",
    "H2O": "O 0 0 0; H 0.2774 0.8929 0.2544; H 0.6068 -0.2383 -0.7169",
    "N2": "N 0.556 0 0; N -0.556 0 0",
    "C2": "C 0 0 0; C 1.26 0 0",
}


def random_integrals(norb: int, seed: int = 0, scale: float = 0.1):
    """Random real integrals with the 8-fold symmetry of real orbitals (a non-molecular H)."""
    rng = np.random.default_rng(seed)
    h1 = rng.normal(size=(norb, norb))
    h1 = 0.5 * (h1 + h1.T)
    g = rng.normal(size=(norb,) * 4) * scale
    g = g + g.transpose(1, 0, 2, 3)
    g = g + g.transpose(0, 1, 3, 2)
    g = g + g.transpose(2, 3, 0, 1)
    return h1, g, 0.7


def packed_random_integrals(norb: int, seed: int):
    """`random_integrals` (scale 0.1) as h1, the 4-fold packed ERIs and the full tensor."""
    from cuscikit.chem.integrals import restore_eri

    h1, g, _ = random_integrals(norb, seed)
    return h1, np.ascontiguousarray(restore_eri(g, norb, 4)), g


def hubbard_integrals(n: int, u: float):
    """1-D Hubbard ring (periodic): hopping -1 between neighbours, on-site U."""
    h1 = np.zeros((n, n))
    for i in range(n):
        h1[i, (i + 1) % n] = h1[(i + 1) % n, i] = -1.0
    eri = np.zeros((n,) * 4)
    for i in range(n):
        eri[i, i, i, i] = u
    return h1, eri
