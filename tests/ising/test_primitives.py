"""Philox known answers, the bit-plane sums, and the C++ reference against its numpy twin."""

from __future__ import annotations

import numpy as np
import pytest
from ising_cases import random_model

from cuscikit.backends.loader import core
from cuscikit.ising import IsingModel
from cuscikit.ising.reference import philox4x32_10, run_reference
from cuscikit.ising.solver import run_kernel, unpack_signs

# Random123's known-answer vectors for philox4x32-10 (kat_vectors): counter, key, output.
KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    (
        (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
        (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
    ),
]


@pytest.mark.parametrize("counter,key,expected", KAT)
def test_philox_known_answers(counter, key, expected):
    assert core().ising.philox4x32_10(*counter, *key) == expected
    assert philox4x32_10(counter, key) == expected


def _cases(sizes):
    """(kind, n) pairs; a single spin has no +-1 coupling, so no binary model of one spin."""
    return [(k, n) for k in ("binary", "ternary", "int8") for n in sizes if (k, n) != ("binary", 1)]


@pytest.mark.parametrize("kind,n", _cases([1, 2, 31, 32, 33, 100]))
def test_twin_is_byte_identical(kind, n):
    """Every record, checksum, best energy and sign word and the final x, y: same bytes."""
    m = random_model(kind, n, seed=n, field=(n % 2 == 1))
    got = run_kernel(m, agents=3, steps=40, dt=0.5, seed=12345 + n)
    want = run_reference(m, replicas=3, steps=40, dt=0.5, seed=12345 + n)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        assert g.tobytes() == w.tobytes()


def test_twin_request_and_seed_words():
    """The restart index (counter word 3) and the seed's high word change the draws."""
    m = random_model("ternary", 40, seed=3)
    big = 2**63 + 17
    for request in (0, 5):
        got = run_kernel(m, 2, 10, 0.75, big, request=request)
        want = run_reference(m, 2, 10, 0.75, big, request=request)
        assert all(g.tobytes() == w.tobytes() for g, w in zip(got, want, strict=True))
    a = run_kernel(m, 2, 10, 0.5, 1)[4]
    b = run_kernel(m, 2, 10, 0.5, 1 + 2**32)[4]
    assert not np.array_equal(a, b)


def test_replica_independent_of_count():
    m = random_model("int8", 50, seed=4)
    few = run_kernel(m, 2, 30, 0.5, 9)
    many = run_kernel(m, 5, 30, 0.5, 9)
    assert np.array_equal(few[0], many[0][:, :2])  # energies of replicas 0 and 1
    assert np.array_equal(few[4], many[4][:2])


@pytest.mark.parametrize("kind,n", _cases([1, 31, 33, 1000]))
def test_plane_sums_equal_matmul(kind, n):
    """The first record is E(s0) from the plane sums; it equals -1/2 s J s - h s of s0."""
    m = random_model(kind, n, seed=7, field=True)
    energy, _, _, words, *_ = run_kernel(m, 2, 1, 0.5, 3)
    x0, *_ = run_reference(m, 2, 1, 0.5, 3)
    assert np.array_equal(energy, x0)
    s = unpack_signs(words, n)
    assert [m.energy(v) for v in s] == list(np.minimum(energy[0], energy[1]))


def test_pump_and_walls_keep_x_bounded():
    m = random_model("binary", 64, seed=1)
    *_, x, y = run_kernel(m, 4, 200, 0.5, 1)
    assert np.all(np.abs(x) <= 1)
    assert np.all(y[np.abs(x) == 1] == 0)


def test_c0_dense_pm1():
    """Dense +-1 couplings give 0.5 / sqrt(n); scaling J and h together changes nothing."""
    m = random_model("binary", 64, seed=2)
    assert m.c0() == np.float32(0.5 / np.sqrt(64))
    m3 = IsingModel(3 * m.J.toarray())
    assert m3.c0() * 3 == pytest.approx(m.c0(), rel=1e-6)
