import numpy as np
import pytest

from cuscikit.backends.keys import KeyIndex, dedup, dedup_numpy


@pytest.mark.parametrize("words", [1, 2, 3, 4])
@pytest.mark.parametrize("n", [0, 1, 7, 100_000])
def test_dedup_matches_numpy(words, n):
    rng = np.random.default_rng(words * 1000 + n)
    # Few distinct values per word so that duplicates are frequent, plus full-range words.
    keys = rng.integers(0, 2**64, size=(n, words), dtype=np.uint64)
    if n:
        pool = keys[rng.integers(0, max(1, n // 5), size=n)]
        keys = np.where(rng.random((n, 1)) < 0.7, pool, keys)
    u, inv, cnt = dedup(keys)
    u2, inv2, cnt2 = dedup_numpy(keys)
    assert np.array_equal(u, u2) and np.array_equal(inv, inv2) and np.array_equal(cnt, cnt2)
    assert np.array_equal(u[inv], keys)
    assert cnt.sum() == n


def test_order_is_most_significant_word_first():
    keys = np.array([[5, 1], [9, 0], [0, 1], [9, 0]], dtype=np.uint64)
    u, inv, cnt = dedup(keys)
    # word 1 is most significant: (9,0) < (0,1) < (5,1)
    assert u.tolist() == [[9, 0], [0, 1], [5, 1]]
    assert inv.tolist() == [2, 0, 1, 0] and cnt.tolist() == [2, 1, 1]


def test_radix_digits_in_every_position():
    # keys that differ only in the top 16 bits of the top word, and only in the low bits
    base = np.uint64(1) << np.uint64(63)
    keys = np.array([[3, base], [1, base], [2, 0], [3, base]], dtype=np.uint64)
    u, _, _ = dedup(keys)
    assert u.tolist() == [[2, 0], [1, int(base)], [3, int(base)]]


def test_key_index():
    rng = np.random.default_rng(0)
    keys = dedup(rng.integers(0, 2**64, size=(5000, 2), dtype=np.uint64))[0]
    idx = KeyIndex(keys)
    perm = rng.permutation(len(keys))
    assert np.array_equal(idx.find(keys[perm]), perm)
    missing = keys[:10].copy()
    missing[:, 0] ^= np.uint64(1)
    assert (idx.find(missing) == -1).all()
    with pytest.raises(ValueError, match="unique"):
        KeyIndex(np.array([[1], [1]], np.uint64))
