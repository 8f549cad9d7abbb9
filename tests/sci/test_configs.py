import numpy as np
import pytest

from cuscikit.sci import configs as C


def test_occupation_round_trip_multiword():
    norb = 70  # 140 spin orbitals: 3 words
    rng = np.random.default_rng(1)
    alpha = [sorted(rng.choice(norb, 9, replace=False)) for _ in range(20)]
    beta = [sorted(rng.choice(norb, 7, replace=False)) for _ in range(20)]
    x = C.from_occupations(alpha, beta, norb)
    assert x.shape == (20, 3) and x.dtype == np.uint64
    a2, b2 = C.to_occupations(x, norb)
    assert a2 == [list(map(int, a)) for a in alpha] and b2 == [list(map(int, b)) for b in beta]
    na, nb = C.electron_counts(x)
    assert (na == 9).all() and (nb == 7).all()
    assert np.array_equal(C.from_bits(C.to_bits(x, norb)), x)


def test_interleaved_bit_layout():
    # orbital 40 alpha is spin orbital 80: word 1, bit 16; orbital 0 beta is bit 1 of word 0
    x = C.from_occupations([[40]], [[0]], norb=42)
    assert x[0, 0] == 2 and x[0, 1] == 1 << 16


def test_hf_configuration():
    assert C.hf_configuration(5, (3, 2)).tolist() == [[0b11111]]
    assert C.hf_configuration(4, 3).tolist() == [[0b111]]


def test_all_determinants_counts_and_uniqueness():
    x = C.all_determinants(6, (3, 2))
    assert len(x) == 20 * 15
    assert len(np.unique(x[:, 0])) == len(x)
    na, nb = C.electron_counts(x)
    assert (na == 3).all() and (nb == 2).all()


def test_check_configurations_errors():
    good = C.hf_configuration(4, (2, 2))
    assert C.check_configurations(good, 4, (2, 2)).shape == (1, 1)
    with pytest.raises(ValueError, match="alpha/beta electrons"):
        C.check_configurations(good, 4, (3, 1))
    with pytest.raises(ValueError, match="beyond spin orbital"):
        C.check_configurations(np.array([[1 << 10]], np.uint64), 4, (1, 0))
    with pytest.raises(ValueError, match="shape"):
        C.check_configurations(np.zeros((2, 2), np.uint64), 4, (0, 0))
    with pytest.raises(ValueError, match="unsigned"):
        C.check_configurations(np.array([[-1.0]]), 4, (1, 0))


def test_bit_width_and_fit_errors():
    with pytest.raises(ValueError, match="256 bits"):
        C.n_words(129)
    assert C.n_words(128) == 4
    with pytest.raises(ValueError, match="do not fit"):
        C.hf_configuration(3, (4, 0))
    with pytest.raises(ValueError, match="listed twice"):
        C.from_occupations([[1, 1]], [[]], 4)
