"""Streamed dSB (couplings as 1-bit row tiles): the same bytes as the resident run on the same
matrix, whatever the tile size; Mattis instances reach their exact energy; files round-trip."""

import numpy as np
import pytest

from cuscikit.ising import IsingModel
from cuscikit.ising.solver import run_kernel
from cuscikit.ising.stream import (
    MattisSource,
    MemmapSource,
    RandomSource,
    score_streamed,
    solve_streamed,
    write_bitmatrix,
)


def _same_as_resident(r, model, agents, steps, dt, seed):
    ref = run_kernel(model, agents, steps, dt, seed)
    names = ("energy", "checksum", "best_energy", "best_signs")
    for name, a, b in zip(names, r.timings["raw"], ref[:4], strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape, name
        assert a.tobytes() == b.tobytes(), name
    assert r.x.tobytes() == ref[4].tobytes() and r.y.tobytes() == ref[5].tobytes()


@pytest.mark.parametrize("rows", [5, 64, 300])
def test_streamed_equals_resident_bytes(rows):
    src = RandomSource(300, seed=5)
    model = src.model()
    assert model.kind == "binary"
    r = solve_streamed(src, agents=5, steps=30, dt=0.45, seed=9, tile_bytes=rows * src.row_bytes)
    _same_as_resident(r, model, 5, 30, 0.45, 9)
    assert r.energy == model.energy(r.spins) and r.passes == 31


def test_streamed_with_a_field_equals_resident():
    src = RandomSource(100, seed=1)
    h = np.random.default_rng(2).integers(-30, 31, 100)
    r = solve_streamed(src, agents=3, steps=25, seed=4, h=h, tile_bytes=64)
    model = IsingModel(src.model().J, h=h)
    _same_as_resident(r, model, 3, 25, 0.5, 4)


def test_mattis_reaches_its_exact_energy():
    src = MattisSource(3000, seed=3)
    r = solve_streamed(src, agents=4, steps=60, seed=1)
    assert r.energy == src.ground_energy == -3000 * 2999 // 2
    assert abs(int(r.spins.astype(int) @ src.xi)) == 3000  # +-xi
    # with h = xi the ground state is xi alone: E0 = -n (n - 1) / 2 - n
    small = MattisSource(500, seed=4)
    r = solve_streamed(small, agents=4, steps=60, seed=2, h=small.xi.astype(int))
    assert r.energy == small.ground_energy - 500
    assert np.array_equal(r.spins, small.xi)


def test_mattis_tiles_match_the_model():
    xi = np.where(np.arange(70) % 3 == 0, -1, 1)
    src = MattisSource(xi)
    J = np.outer(xi, xi)
    np.fill_diagonal(J, 0)
    plus = IsingModel(J).coupling_arrays()["plus"].reshape(70, 3)
    assert np.array_equal(src.tile(0, 70), plus)
    assert np.array_equal(src.tile(33, 5), plus[33:38])


@pytest.mark.parametrize("n", [2, 33, 64, 130, 1001])
def test_mattis_streaming_stores_write_the_same_words(n):
    # the GPU path's producers may write Mattis rows with non-temporal stores
    from cuscikit.backends.loader import core

    xi = np.where(np.random.default_rng(n).random(n) < 0.5, -1, 1).astype(np.int8)
    plain = core().ising.mattis_tile(xi, 0, n)
    for r0 in (0, 1, n // 2):
        nt = core().ising.mattis_tile(xi, r0, n - r0, streaming_stores=True)
        assert np.array_equal(nt, plain[r0:])


def test_memmap_round_trip(tmp_path):
    src = RandomSource(77, seed=8)
    model = src.model()
    path = write_bitmatrix(tmp_path / "j.bits", model)
    mm = MemmapSource(path)
    assert mm.n == 77 and np.array_equal(mm.tile(0, 77), src.tile(0, 77))
    r = solve_streamed(mm, agents=2, steps=20, seed=1, tile_bytes=100)
    _same_as_resident(r, model, 2, 20, 0.5, 1)
    path.write_bytes(path.read_bytes()[:-4])
    with pytest.raises(ValueError, match="bytes"):
        MemmapSource(path)


def test_bad_input_is_refused_before_work(tmp_path):
    src = RandomSource(40)
    for kw, match in (({"agents": 0}, "agents"), ({"steps": 0}, "steps"),
                      ({"dt": -1.0}, "dt"), ({"tile_bytes": 0}, "tile_bytes"),
                      ({"h": np.zeros(3)}, "h must")):  # fmt: skip
        with pytest.raises(ValueError, match=match):
            solve_streamed(src, **kw)
    bad = [({"device": "tpu"}, "device"), ({"threads": -1}, "threads"), ({"slots": 1}, "slots")]
    for kw, match in [*bad, ({"device_buffers": 1.5}, "device_buffers")]:
        with pytest.raises(ValueError, match=match):
            solve_streamed(src, **kw)
        with pytest.raises(ValueError, match=match):
            score_streamed(src, **kw)
    with pytest.raises(ValueError, match="source"):
        solve_streamed(IsingModel(np.array([[0, 1], [1, 0]])))
    with pytest.raises(ValueError, match="xi"):
        MattisSource([1, 0, -1])
    with pytest.raises(ValueError, match="field"):
        write_bitmatrix(tmp_path / "x", IsingModel(np.array([[0, 1], [1, 0]]), h=[1, 0]))
    with pytest.raises(ValueError, match="no such file"):
        MemmapSource(tmp_path / "missing")


def test_tiles_must_come_in_order():
    from cuscikit.backends.loader import core

    run = core().ising.StreamRun(64, np.zeros(64, np.int32), 1, 2, 0.5, 1.0, 0.1, 0, 0)
    tile = RandomSource(64).tile(0, 64)
    with pytest.raises(ValueError, match="row order"):
        run.add_tile(8, tile[8:16])
    with pytest.raises(Exception, match="all 64 rows"):
        run.end_pass()


def test_score_pass_is_the_first_record():
    src = MattisSource(700, seed=6)
    h = np.random.default_rng(1).integers(-5, 6, 700)
    s = score_streamed(src, agents=5, seed=3, h=h, tile_bytes=1000)
    r = solve_streamed(src, agents=5, steps=4, seed=3, h=h)
    assert s.passes == 1 and s.history.size == 1
    energy, checksum, best_e, best_words = s.timings["raw"]
    assert np.array_equal(energy[0], r.timings["raw"][0][0])
    assert np.array_equal(checksum[0], r.timings["raw"][1][0])
    spins = np.unpackbits(best_words.view(np.uint8), axis=1, bitorder="little")[:, :700]
    model = IsingModel(src.model().J, h=h)
    for b in range(5):
        sb = 2 * spins[b].astype(np.int64) - 1
        assert energy[0, b] == best_e[b] == src.energy_of(sb, h) == model.energy(sb)
