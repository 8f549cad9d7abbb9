"""Per-rank inputs for the distributed de-dup tests, a pure function of (case, words, rank, P).

Both the multi-process workers and the checking test process call it, so the test can rebuild
every rank's input and compare with the single-process numpy de-dup of the union.
"""

from __future__ import annotations

import numpy as np

CASES = ("uneven", "empty-ranks", "heavy", "all-empty", "top-word-ties", "coupled")


def case_keys(case: str, words: int, rank: int, P: int) -> np.ndarray:
    rng = np.random.default_rng([CASES.index(case), words, rank, P])
    if case == "uneven":
        # different sizes on every rank, ~30% duplicates within and across ranks
        n = 400 + 700 * (rank % 5) + 37 * rank
        pool = np.random.default_rng([99, words]).integers(0, 2**64, (3000, words), np.uint64)
        fresh = rng.integers(0, 2**64, (n, words), dtype=np.uint64)
        return np.where(rng.random((n, 1)) < 0.3, pool[rng.integers(0, len(pool), n)], fresh)
    if case == "empty-ranks":
        # rank 1 (and the last rank) hold nothing; given as shape (0,), not (0, words)
        if rank == 1 or (P > 2 and rank == P - 1):
            return np.zeros(0, dtype=np.uint64)
        return rng.integers(0, 1 << 20, (1500, words), dtype=np.uint64)
    if case == "heavy":
        # 3 distinct keys in total, many copies on every rank: fewer keys than ranks
        pool = np.array([[5] * words, [1] * words, [2**64 - 1] * words], dtype=np.uint64)
        return pool[rng.integers(0, 3, 400 + 50 * rank)]
    if case == "all-empty":
        return np.zeros((0, words), dtype=np.uint64)
    if case == "top-word-ties":
        # keys that tie in the most significant word(s) and differ below, and the reverse
        n = 1200
        k = rng.integers(0, 4, (n, words), dtype=np.uint64)
        k[: n // 2, -1] = np.uint64(2**63)
        k[n // 2 :, 0] = rng.integers(0, 2**64, n - n // 2, dtype=np.uint64)
        return k
    if case == "coupled":
        # coupled configurations of the N2/STO-3G HF determinant's single/double excitations,
        # sources split unevenly over the ranks (1 word; wider keys get zero high words)
        from cuscikit import Molecule
        from cuscikit.sci.hamiltonian import Hamiltonian
        from cuscikit.sci.space import SCISpace

        mol = Molecule.load("N2")
        src = SCISpace.singles_doubles(mol).configs
        cuts = np.linspace(0, len(src), P + 1).astype(int)
        cuts[1:-1] += 7 * (np.arange(1, P) % 2)  # uneven
        mine = src[cuts[rank] : cuts[rank + 1]]
        cfg = Hamiltonian.from_molecule(mol).coupled(mine).configs
        out = np.zeros((len(cfg), words), dtype=np.uint64)
        out[:, :1] = cfg
        return out
    raise KeyError(case)


def key_values(keys: np.ndarray) -> np.ndarray:
    """A complex value per key (what an owner would compute, e.g. psi), to test routing."""
    k = np.asarray(keys, dtype=np.uint64)
    k = k[:, None] if k.ndim == 1 else k
    re = (k[:, 0] % np.uint64(1_000_003)).astype(np.float64)
    im = (k[:, -1] % np.uint64(999_983)).astype(np.float64) + k.shape[1]
    return re + 1j * im


def check_partition(parts: list, inputs: list[np.ndarray], ref: np.ndarray, what: str) -> list:
    """Assert that the per-rank results `parts` (the workers' npz files) of one de-dup call are
    the single-process de-dup `ref` of the union of `inputs`, partitioned in rank order: slices,
    offsets, counts, every input key's (owner, index), and the fetched values. Returns the
    slice sizes."""
    words = ref.shape[1]
    slices = [p["unique"].reshape(-1, words) for p in parts]
    # the slices, in rank order, are the single-process de-dup of the union
    assert np.array_equal(np.concatenate(slices), ref), what
    offsets = parts[0]["offsets"]
    assert np.array_equal(offsets, np.cumsum([0] + [len(s) for s in slices])), what
    for r, p in enumerate(parts):
        assert int(p["items"]) == sum(map(len, inputs)), what
        assert int(p["unique_total"]) == len(ref), what
        # every input key maps to its row on its owner; values route back
        g = offsets[p["owner"]] + p["index"]
        assert np.array_equal(ref[g], inputs[r]), what
        assert np.array_equal(p["fetched"], key_values(inputs[r])), what
    return [len(s) for s in slices]
