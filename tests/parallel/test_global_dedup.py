"""The sampling de-dup's pieces and its simulated partitions against the single-process numpy
de-dup of the union (``dedup_numpy``, an independent lexsort implementation)."""

from __future__ import annotations

import bisect

import numpy as np
import pytest
from _cases import CASES, case_keys, key_values
from hypothesis import given, settings
from hypothesis import strategies as st

from cuscikit.backends.keys import dedup_numpy
from cuscikit.backends.keys import searchsorted as searchsorted_keys
from cuscikit.parallel import (
    SerialComm,
    centralised_dedup,
    choose_splitters,
    global_dedup,
    simulate_partition,
)
from cuscikit.parallel.dedup import balance, regular_samples, split_counts


def as_int(row) -> int:
    """A key as a Python integer (word words-1 most significant): an independent order."""
    return sum(int(w) << (64 * k) for k, w in enumerate(row))


def check_partition(parts, inputs, words: int, exact_shares: bool) -> None:
    inputs = [np.asarray(k, dtype=np.uint64).reshape(-1, words) for k in inputs]
    ref = dedup_numpy(np.concatenate(inputs))[0]
    slices = [p.unique for p in parts]
    assert np.array_equal(np.concatenate(slices), ref)
    offsets = parts[0].offsets
    assert offsets.tolist() == np.cumsum([0] + [len(s) for s in slices]).tolist()
    m = parts[0].metrics
    assert m.items == sum(map(len, inputs)) and m.unique == len(ref)
    assert m.counts.tolist() == [len(s) for s in slices]
    assert m.received.sum() >= len(ref) and m.merged.sum() == len(ref)
    for p, keys in zip(parts, inputs, strict=True):
        assert p.owner.shape == p.index.shape == (len(keys),)
        assert np.array_equal(ref[p.global_index], keys)
        assert ((p.index >= 0) & (p.index < np.diff(offsets)[p.owner])).all()
    if exact_shares:
        assert max(m.counts) - min(m.counts) <= 1
    else:
        assert np.array_equal(m.counts, m.merged)


# --- pure pieces ---------------------------------------------------------------------------------


@pytest.mark.parametrize("words", [1, 2, 3, 4])
@pytest.mark.parametrize("side", ["left", "right"])
def test_searchsorted_keys_matches_python_integers(words, side):
    rng = np.random.default_rng(words)
    keys = rng.integers(0, 3, (400, words), dtype=np.uint64)  # many ties in every word
    keys[::7, -1] = np.uint64(2**64 - 1)
    keys = dedup_numpy(np.concatenate([keys, keys[:50]]))[0]
    keys = np.repeat(keys, rng.integers(1, 3, len(keys)), axis=0)  # sorted, with duplicates
    other = rng.integers(0, 4, (60, words), dtype=np.uint64)
    queries = np.concatenate([keys[rng.integers(0, len(keys), 60)], other])
    ints = [as_int(k) for k in keys]
    find = bisect.bisect_left if side == "left" else bisect.bisect_right
    expect = [find(ints, as_int(q)) for q in queries]
    assert searchsorted_keys(keys, queries, side=side).tolist() == expect
    assert searchsorted_keys(keys[:0], queries, side=side).tolist() == [0] * len(queries)


def test_regular_samples():
    k = np.arange(100, dtype=np.uint64)[:, None]
    assert regular_samples(k, 4).ravel().tolist() == [12, 37, 62, 87]  # interval middles
    assert np.array_equal(regular_samples(k[:3], 4), k[:3])  # fewer rows than samples: all
    with pytest.raises(ValueError, match=">= 1"):
        regular_samples(k, 0)


def test_choose_splitters():
    s = np.arange(10, dtype=np.uint64)[:, None]
    assert choose_splitters(s, 5).ravel().tolist() == [2, 4, 6, 8]
    assert choose_splitters(s, 1).shape == (0, 1)
    assert choose_splitters(s[:0], 3).shape == (2, 1)
    assert choose_splitters(s[:2], 4).ravel().tolist() == [0, 1, 1]  # repeats: empty ranks
    # sample 3 stands for 91 keys, about 48.5 of them below it: the splitters nearest to
    # 20, 40, 60 and 80 keys are samples 2 (2.5 keys below), 3, 3 and 4 (95.5 below)
    w = [1, 1, 1, 91, 1, 1, 1, 1, 1, 1]
    assert choose_splitters(s, 5, weights=w).ravel().tolist() == [2, 3, 3, 4]
    two = np.array([[3, 0], [1, 1], [0, 2]], dtype=np.uint64)  # sorted by the last word
    assert choose_splitters(two, 2).tolist() == [[1, 1]]
    with pytest.raises(ValueError, match="sorted"):
        choose_splitters(s[::-1], 2)
    with pytest.raises(ValueError, match="weights"):
        choose_splitters(s, 2, weights=[1, 2])


def test_split_counts_sends_a_key_equal_to_a_splitter_up():
    k = np.array([1, 2, 2, 3, 5, 5, 9], dtype=np.uint64)[:, None]
    assert split_counts(k, np.array([[2], [5]], dtype=np.uint64)).tolist() == [1, 3, 3]
    assert split_counts(k, np.zeros((0, 1), np.uint64)).tolist() == [7]


def test_balance():
    assert balance([10, 10, 12, 8]) == (1.5, pytest.approx(0.1414213562))
    assert balance([0, 0]) == (1.0, 0.0)
    assert balance([0, 4])[0] == float("inf")


# --- simulated partitions ------------------------------------------------------------------------


# the coupled case has 88 sources: P = 32 and 64 would leave most ranks one source or none
CASE_P = [(c, P) for c in CASES for P in (1, 3, 32, 64) if c != "coupled" or P <= 3]


@pytest.mark.parametrize("case, P", CASE_P)
@pytest.mark.parametrize("words", [1, 2, 3, 4])
@pytest.mark.parametrize("rebalance", [True, False])
def test_simulated_partition_equals_single_process(case, words, P, rebalance):
    inputs = [case_keys(case, words, r, P) for r in range(P)]
    parts = simulate_partition(inputs, samples_per_rank=16, rebalance=rebalance)
    check_partition(parts, inputs, words, exact_shares=rebalance)


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 40), min_size=1, max_size=9),
    words=st.integers(1, 3),
    spread=st.sampled_from([2, 5, 2**64]),
    samples=st.integers(1, 9),
    rebalance=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_simulated_partition_property(sizes, words, spread, samples, rebalance, seed):
    rng = np.random.default_rng(seed)
    inputs = [rng.integers(0, spread, (n, words), dtype=np.uint64) for n in sizes]
    parts = simulate_partition(inputs, samples_per_rank=samples, rebalance=rebalance)
    check_partition(parts, inputs, words, exact_shares=rebalance)


def test_simulate_partition_splits_one_array_and_checks_input():
    keys = np.random.default_rng(1).integers(0, 50, (1001, 2), dtype=np.uint64)
    parts = simulate_partition(keys, P=6)
    check_partition(parts, np.array_split(keys, 6), 2, exact_shares=True)
    with pytest.raises(ValueError, match="pass P"):
        simulate_partition(keys)
    with pytest.raises(ValueError, match="words per key"):
        simulate_partition([keys, np.zeros((3, 1), np.uint64)])


def test_weighted_samples_balance_uneven_ranks():
    """Four ranks hold 400 keys in the low half of the key space, four hold 16,000 in the high
    half. Each sends 256 samples; weighted by the keys they stand for, the splitters give every
    rank within 5% of its share of received keys. Counted per sample, half the splitters would
    fall in the low half and four ranks would share 1,600 keys while four share 64,000."""
    rng = np.random.default_rng(3)
    low = [rng.integers(0, 2**63, (400, 1), dtype=np.uint64) for _ in range(4)]
    high = [rng.integers(2**63, 2**64, (16000, 1), dtype=np.uint64) for _ in range(4)]
    inputs = [k for pair in zip(low, high, strict=True) for k in pair]
    m = simulate_partition(inputs, samples_per_rank=256, rebalance=False)[0].metrics
    assert balance(m.received)[0] < 1.05
    local = [np.sort(k, axis=0) for k in inputs]
    samples = np.sort(np.concatenate([regular_samples(k, 256) for k in local]), axis=0)
    unweighted = choose_splitters(samples, 8)
    received = sum(split_counts(k, unweighted) for k in local)
    assert balance(received)[0] > 10


def test_default_samples_meet_the_balance_goal_on_received_keys():
    """Without duplicates, received = owned: the default S gives max/min <= 1.05, CV <= 0.01."""
    rng = np.random.default_rng(4)
    keys = rng.integers(0, 2**64, (400_000, 2), dtype=np.uint64)
    for P in (8, 64):
        m = simulate_partition(keys, P=P, rebalance=False)[0].metrics
        assert m.max_min <= 1.05 and m.cv <= 0.01, (P, m.max_min, m.cv)


def test_rebalance_fixes_duplicate_skew():
    """Keys shared by every rank in one key range, private keys elsewhere: sampling balances
    what each rank receives, not what it owns; rebalancing gives exact shares."""
    rng = np.random.default_rng(5)
    shared = rng.integers(0, 2**62, (4000, 1), dtype=np.uint64)  # low half of the key space
    inputs = [
        np.concatenate([shared, rng.integers(2**63, 2**64, (4000, 1), dtype=np.uint64)])
        for _ in range(4)
    ]
    plain = simulate_partition(inputs, rebalance=False)[0].metrics
    assert balance(plain.received)[0] < 1.05 and plain.max_min > 1.5
    fixed = simulate_partition(inputs, rebalance=True)[0].metrics
    assert fixed.max_min <= 1.0001 and fixed.cv < 1e-4


# --- one rank, real entry points -----------------------------------------------------------------


@pytest.mark.parametrize("method", ["sampling", "centralised"])
@pytest.mark.parametrize("words", [1, 3])
def test_single_rank_entry_points(method, words):
    keys = case_keys("uneven", words, 0, 1)
    comm = SerialComm()
    res = global_dedup(keys, comm) if method == "sampling" else centralised_dedup(keys, comm)
    check_partition([res], [keys], words, exact_shares=True)
    assert np.array_equal(res.fetch(key_values(res.unique), comm), key_values(keys))
    row = res.metrics.as_dict()
    assert row["items"] == len(keys) and row["ranks"] == 1 and row["items_per_s"] > 0
    assert set(res.metrics.seconds) <= {k[2:] for k in row if k.startswith("t_")}
    with pytest.raises(ValueError, match="one value per key"):
        res.fetch(np.zeros(len(res.unique) + 1), comm)


def test_empty_input_of_any_shape():
    res = global_dedup(np.zeros(0, np.uint64))
    assert res.unique.shape == (0, 1) and res.owner.shape == (0,)
    assert res.metrics.max_min == 1.0 and res.metrics.cv == 0.0
