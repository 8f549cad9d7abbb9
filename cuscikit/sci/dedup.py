"""Local de-duplication of multi-word keys: sort + unique with the inverse index.

Keys are rows of a uint64 array (n, words) and sort lexicographically, most significant word
first; the last word (index words-1) is the most significant, so a configuration compares as a
little-endian big integer.
"""

from __future__ import annotations

import numpy as np

from cuscikit.backends.cpu import core


def _as_keys(keys) -> np.ndarray:
    arr = np.ascontiguousarray(keys, dtype=np.uint64)
    if arr.ndim == 1:
        arr = arr[:, None]
    if arr.ndim != 2 or not 1 <= arr.shape[1] <= 4:
        raise ValueError(f"keys must have shape (n, words) with 1..4 words, got {arr.shape}")
    return arr


def dedup(keys) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sorted unique keys, the inverse index and the multiplicities (parallel radix sort).

    Returns:
        (unique (u, words), inverse (n,) int64 with unique[inverse] == keys, counts (u,) int64)

    Example:
        >>> u, inv, cnt = dedup(np.array([[5], [3], [5]], dtype=np.uint64))
        >>> u.ravel().tolist(), inv.tolist(), cnt.tolist()
        ([3, 5], [1, 0, 1], [1, 2])
    """
    return core().unique_keys(_as_keys(keys))


def dedup_numpy(keys) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pure-numpy twin of `dedup` (lexsort), for tests and small inputs."""
    arr = _as_keys(keys)
    n, w = arr.shape
    if n == 0:
        return arr.copy(), np.zeros(0, np.int64), np.zeros(0, np.int64)
    order = np.lexsort(arr.T)  # lexsort's last key is primary: word w-1 most significant
    s = arr[order]
    new = np.ones(n, dtype=bool)
    new[1:] = np.any(s[1:] != s[:-1], axis=1)
    group = np.cumsum(new) - 1
    inverse = np.empty(n, dtype=np.int64)
    inverse[order] = group
    counts = np.bincount(group).astype(np.int64)
    return np.ascontiguousarray(s[new]), inverse, counts


class KeyIndex:
    """Hash index of a set of unique keys: `find(queries)` gives each query's row or -1.

    Example:
        >>> idx = KeyIndex(np.array([[9], [4]], dtype=np.uint64))
        >>> idx.find(np.array([[4], [7]], dtype=np.uint64)).tolist()
        [1, -1]
    """

    def __init__(self, keys):
        self._keys = _as_keys(keys)
        self._index = core().KeyIndex(self._keys)
        if self._index.has_duplicates:
            raise ValueError("KeyIndex needs unique keys")

    def __len__(self) -> int:
        return len(self._keys)

    def find(self, queries) -> np.ndarray:
        q = _as_keys(queries)
        if q.shape[1] != self._keys.shape[1]:
            raise ValueError("queries and keys differ in words per key")
        return self._index.find(q)
