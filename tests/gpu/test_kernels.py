"""Every CUDA kernel against its CPU twin (skipped without a GPU)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from cuscikit import Molecule  # noqa: E402
from cuscikit.backends.keys import dedup_numpy  # noqa: E402
from cuscikit.sci.hamiltonian import Hamiltonian  # noqa: E402

pytestmark = pytest.mark.gpu


def _hf(mol):
    from cuscikit import SCISpace

    return SCISpace.hf(mol).configs


@pytest.fixture(scope="module")
def ops():
    """The CUDA kernels as the tests call them: `cuscikit.sci.cuda` and the key primitives."""
    from types import SimpleNamespace

    from cuscikit.backends import keys
    from cuscikit.sci import cuda as sci_cuda

    def sort_unique(k, return_inverse=False, end_bit=None):
        return keys.sort_unique(k, return_inverse=return_inverse, end_bit=end_bit)

    return SimpleNamespace(
        DeviceHamiltonian=sci_cuda.DeviceHamiltonian,
        coupled=sci_cuda.coupled,
        coupled_counts=sci_cuda.coupled_counts,
        diagonal=sci_cuda.diagonal,
        local_energy_sums=sci_cuda.local_energy_sums,
        to_device=keys.to_device,
        to_numpy=keys.to_numpy,
        search=keys.search,
        sort_unique=sort_unique,
    )


def _random_sources(mol, n, seed):
    """HF with up to 4 random same-spin moves per source (unique rows)."""
    from cuscikit.sci.configs import from_bits, to_bits

    rng = np.random.default_rng(seed)
    base = to_bits(_hf(mol), mol.norb)[0]
    out = np.repeat(base[None], n, axis=0)
    for row in out:
        for _ in range(rng.integers(0, 5)):
            spin = rng.integers(2)
            occ = np.flatnonzero(row[spin::2])
            vir = np.flatnonzero(row[spin::2] == 0)
            if len(occ) and len(vir):
                row[2 * rng.choice(occ) + spin] = 0
                row[2 * rng.choice(vir) + spin] = 1
    return np.unique(from_bits(out), axis=0)


@pytest.mark.parametrize(
    "name, eps, n",
    [
        ("LiH", 1e-12, 50),
        ("N2", 1e-12, 200),
        ("N2", -1.0, 100),
        ("N2/cc-pVDZ", 1e-12, 64),
        ("N2/cc-pVDZ", 1e-6, 64),
        ("Cr2/SV", 1e-8, 8),
    ],
)
def test_coupled_matches_cpu(ops, name, eps, n):
    mol = Molecule.load(name)
    H = Hamiltonian.from_molecule(mol, eps=min(eps, 1e-12) if eps > 0 else eps)
    src = _random_sources(mol, n, seed=1)
    cpu = H.coupled(src, eps=eps)
    dh = ops.DeviceHamiltonian(H, "cuda")
    offs, cfg, val = ops.coupled(dh, ops.to_device(src, "cuda"), eps=eps)
    offs, cfg, val = offs.cpu().numpy(), ops.to_numpy(cfg), val.cpu().numpy()
    cpu_counts = np.bincount(cpu.source, minlength=len(src))
    np.testing.assert_array_equal(np.diff(offs), cpu_counts)
    # Same configurations bit for bit and same elements per source (order-free comparison).
    src_gpu = np.repeat(np.arange(len(src)), np.diff(offs))
    key_c = np.lexsort(np.column_stack([cpu.configs, cpu.source]).T[::-1])
    key_g = np.lexsort(np.column_stack([cfg, src_gpu]).T[::-1])
    np.testing.assert_array_equal(cfg[key_g], cpu.configs[key_c])
    np.testing.assert_allclose(val[key_g], cpu.values[key_c], rtol=0, atol=1e-14)
    counts = ops.coupled_counts(dh, ops.to_device(src, "cuda"), eps=eps).cpu().numpy()
    np.testing.assert_array_equal(counts, cpu_counts)


def test_diagonal_matches_cpu(ops):
    for name in ("N2", "Cr2/SV"):
        mol = Molecule.load(name)
        H = Hamiltonian.from_molecule(mol)
        src = _random_sources(mol, 300, seed=2)
        got = ops.diagonal(ops.DeviceHamiltonian(H, "cuda"), ops.to_device(src, "cuda"))
        np.testing.assert_allclose(got.cpu().numpy(), H.diagonal(src), rtol=1e-13, atol=1e-11)


@pytest.mark.parametrize("words", [1, 2, 3, 4])
@pytest.mark.parametrize("n", [1, 1000, 300_001])
def test_sort_unique_matches_numpy(ops, words, n):
    rng = np.random.default_rng(words * 7 + n)
    pool = rng.integers(0, 2**64, size=(max(1, n // 3), words), dtype=np.uint64)
    keys = pool[rng.integers(0, len(pool), size=n)]  # about 1/3 unique: many duplicates
    u_ref, inv_ref, _ = dedup_numpy(keys)
    u, inv = ops.sort_unique(ops.to_device(keys, "cuda"), return_inverse=True)
    np.testing.assert_array_equal(ops.to_numpy(u), u_ref)
    np.testing.assert_array_equal(inv.cpu().numpy(), inv_ref)
    only = ops.sort_unique(ops.to_device(keys, "cuda"))
    np.testing.assert_array_equal(ops.to_numpy(only), u_ref)


def test_sort_unique_end_bit(ops):
    """Keys that use only the low bits sort right with a shortened radix range."""
    rng = np.random.default_rng(3)
    keys = rng.integers(0, 2**20, size=(100_000, 2), dtype=np.uint64)
    keys[:, 1] &= np.uint64(0xF)  # 64 + 4 significant bits
    u_ref, inv_ref, _ = dedup_numpy(keys)
    u, inv = ops.sort_unique(ops.to_device(keys, "cuda"), return_inverse=True, end_bit=68)
    np.testing.assert_array_equal(ops.to_numpy(u), u_ref)
    np.testing.assert_array_equal(inv.cpu().numpy(), inv_ref)


@pytest.mark.parametrize("words", [1, 2, 4])
def test_search_matches_numpy(ops, words):
    rng = np.random.default_rng(words)
    keys = np.unique(rng.integers(0, 2**64, size=(5000, words), dtype=np.uint64), axis=0)
    u_ref, _, _ = dedup_numpy(keys)
    present = u_ref[rng.integers(0, len(u_ref), size=3000)]
    absent = rng.integers(0, 2**64, size=(1000, words), dtype=np.uint64)
    q = np.concatenate([present, absent])
    got = ops.search(ops.to_device(u_ref, "cuda"), ops.to_device(q, "cuda")).cpu().numpy()
    lookup = {tuple(r): i for i, r in enumerate(u_ref.tolist())}
    want = np.array([lookup.get(tuple(r), -1) for r in q.tolist()])
    np.testing.assert_array_equal(got, want)


def test_local_energy_sums_match_numpy(ops):
    rng = np.random.default_rng(5)
    n, u = 500, 2000
    counts = rng.integers(0, 80, size=n)
    offs = np.concatenate([[0], np.cumsum(counts)])
    m = offs[-1]
    idx = rng.integers(0, u, size=m)
    vals = rng.normal(size=m)
    psi = rng.normal(size=u) + 1j * rng.normal(size=u)
    in_space = rng.random(u) < 0.3
    src = np.repeat(np.arange(n), counts)
    contrib = vals * psi[idx]
    want_c = np.zeros(n, complex)
    np.add.at(want_c, src, contrib)
    want_v = np.zeros(n, complex)
    np.add.at(want_v, src[in_space[idx]], contrib[in_space[idx]])
    c, v = ops.local_energy_sums(
        *(torch.as_tensor(a, device="cuda") for a in (offs, vals, idx, psi, in_space))
    )
    np.testing.assert_allclose(c.cpu().numpy(), want_c, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(v.cpu().numpy(), want_v, rtol=1e-12, atol=1e-12)


def test_kernels_reject_bad_input(ops):
    """The typed bindings check dtype, shape and device before launching anything."""
    from cuscikit.backends import cuda

    with pytest.raises(TypeError, match="int64"):
        ops.sort_unique(torch.zeros((3, 1), dtype=torch.int32, device="cuda"))
    with pytest.raises(ValueError, match="1..4 words"):
        ops.sort_unique(torch.zeros((3, 5), dtype=torch.int64, device="cuda"))
    out = torch.empty(3, dtype=torch.int64, device="cuda")
    keys_cpu = torch.zeros((3, 1), dtype=torch.int64)  # host memory where device memory is due
    with pytest.raises(TypeError):
        cuda().search_keys(keys_cpu, keys_cpu, out, 0)
    with pytest.raises(ValueError, match="one entry per query"):
        k = torch.zeros((3, 1), dtype=torch.int64, device="cuda")
        cuda().search_keys(k, k, out[:2], 0)
