"""The streamed GPU run (couplings copied as 1-bit tiles from pinned host buffers): the same bytes
as the resident GPU run and the C++ reference on the same matrix, whatever the tile and buffer
counts; Mattis instances reach their exact energy (skipped without a GPU)."""

from __future__ import annotations

import numpy as np
import pytest

from cuscikit.ising import IsingModel
from cuscikit.ising.solver import run_kernel
from cuscikit.ising.stream import (
    MattisSource,
    MemmapSource,
    RandomSource,
    h2d_rate,
    score_streamed,
    solve_streamed,
    write_bitmatrix,
)

pytestmark = pytest.mark.gpu

NAMES = ("energy", "checksum", "best_energy", "best_signs", "x", "y")


def _records(r):
    return (*r.timings["raw"], r.x, r.y)


def _same(a, b):
    for name, u, v in zip(NAMES, a, b, strict=True):
        assert u.dtype == v.dtype and u.shape == v.shape, name
        assert u.tobytes() == v.tobytes(), f"{name} differs"


def test_random_10000_streamed_gpu_equals_resident_gpu_and_cpu():
    src = RandomSource(10_000, seed=42)
    model = src.model()
    r = solve_streamed(src, agents=8, steps=50, seed=42, device="cuda", tile_bytes=2**20)
    assert r.passes == 51 and r.device == "cuda"
    gpu = run_kernel(model, 8, 50, 0.5, 42, device="cuda")
    cpu = run_kernel(model, 8, 50, 0.5, 42, device="cpu")
    _same(_records(r), gpu)
    _same(_records(r), cpu)
    assert r.energy == model.energy(r.spins)


@pytest.mark.parametrize(
    "n,rows,slots,buffers,agents",
    [(300, 7, 2, 2, 5), (1000, 1000, 8, 3, 9), (4097, 64, 3, 2, 17), (33, 1, 2, 2, 1)],
)
def test_streamed_gpu_equals_cpu_stream_and_reference(n, rows, slots, buffers, agents):
    src = RandomSource(n, seed=n)
    h = np.random.default_rng(n).integers(-40, 41, n)
    kw = {"agents": agents, "steps": 30, "dt": 0.45, "seed": 7, "h": h}
    g = solve_streamed(src, device="cuda", tile_bytes=rows * src.row_bytes, slots=slots,
                       device_buffers=buffers, threads=3, **kw)  # fmt: skip
    c = solve_streamed(src, device="cpu", **kw)
    _same(_records(g), _records(c))
    _same(_records(g), run_kernel(IsingModel(src.model().J, h=h), agents, 30, 0.45, 7))


def test_memmap_source_on_the_gpu(tmp_path):
    src = RandomSource(2000, seed=3)
    path = write_bitmatrix(tmp_path / "j.bits", src)
    r = solve_streamed(MemmapSource(path), agents=4, steps=20, seed=5, device="cuda",
                       tile_bytes=100 * src.row_bytes)  # fmt: skip
    _same(_records(r), run_kernel(src.model(), 4, 20, 0.5, 5, device="cuda"))


def test_mattis_on_the_gpu_reaches_its_exact_energy():
    src = MattisSource(20_000, seed=11)
    r = solve_streamed(src, agents=8, steps=50, seed=3, device="cuda", tile_bytes=2**22)
    assert r.energy == src.ground_energy
    assert abs(int(r.spins.astype(np.int64) @ src.xi)) == src.n
    c = solve_streamed(MattisSource(src.xi[:3000]), agents=4, steps=40, seed=3)
    g = solve_streamed(MattisSource(src.xi[:3000]), agents=4, steps=40, seed=3, device="cuda")
    _same(_records(g), _records(c))


def test_score_pass_on_the_gpu():
    src = MattisSource(50_000, seed=2)
    s = score_streamed(src, agents=6, seed=9, device="cuda", tile_bytes=2**22)
    assert s.passes == 1 and s.history.size == 1
    spins = np.unpackbits(s.timings["raw"][3].view(np.uint8), axis=1, bitorder="little")
    for b in range(6):
        sb = 2 * spins[b, : src.n].astype(np.int64) - 1
        assert s.timings["raw"][0][0, b] == src.energy_of(sb)
    run = solve_streamed(src, agents=6, steps=1, seed=9, device="cuda", tile_bytes=2**22)
    assert np.array_equal(run.timings["raw"][0][0], s.timings["raw"][0][0])


def test_h2d_rate_and_time_limit():
    assert 1.0 < h2d_rate(2**26, 4) < 1000.0
    with pytest.raises(TimeoutError, match="GB/s"):
        solve_streamed(MattisSource(200_000), agents=2, steps=1000, device="cuda",
                       time_limit=0.5)  # fmt: skip
