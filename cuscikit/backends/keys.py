"""Multi-word keys: sort + unique, search and hashing, on numpy arrays and torch tensors.

A key is a row of 64-bit words (a configuration: ``(n, words)``, 1..4 words); keys compare as
little-endian big integers, so the last word is the most significant. On the host keys are
``uint64`` numpy arrays; on a device they are ``int64`` torch tensors holding the same bits
(torch has no unsigned 64-bit arithmetic), converted with `to_device` / `to_numpy`.

Every function here takes either kind and returns the same kind, on the same device:

- `sort_unique`: sorted unique rows and the inverse index (compiled radix sorts: C++/OpenMP on
  the host, CUB on a GPU; ``impl="torch"`` is a pure-torch twin for tests);
- `searchsorted`: insertion points of queries in sorted keys (vectorised binary search);
- `search`: the row of each query in sorted unique keys, or -1;
- `dedup` (numpy: with multiplicities), `dedup_numpy` (its pure-numpy twin), `KeyIndex` (hash
  lookup of host keys).

Example:
    >>> import numpy as np
    >>> u, inv = sort_unique(np.array([[5], [3], [5]], dtype=np.uint64))
    >>> u.ravel().tolist(), inv.tolist()
    ([3, 5], [1, 0, 1])
    >>> search(u, np.array([[5], [4]], dtype=np.uint64)).tolist()
    [1, -1]
"""

from __future__ import annotations

import numpy as np

from cuscikit.backends.loader import core, cuda

__all__ = [
    "KeyIndex",
    "as_keys",
    "as_tensor_keys",
    "dedup",
    "dedup_numpy",
    "is_tensor",
    "search",
    "searchsorted",
    "sort_unique",
    "to_device",
    "to_numpy",
]

_SIGN = -(2**63)


def is_tensor(a) -> bool:
    """True for a torch tensor (checked without importing torch)."""
    return type(a).__module__.startswith("torch")


def as_keys(keys) -> np.ndarray:
    """Host keys as a C-contiguous uint64 (n, words) array (1-D input: one word per key)."""
    arr = np.ascontiguousarray(keys, dtype=np.uint64)
    if arr.ndim == 1:
        arr = arr[:, None]
    if arr.ndim != 2 or not 1 <= arr.shape[1] <= 4:
        raise ValueError(f"keys must have shape (n, words) with 1..4 words, got {arr.shape}")
    return arr


def as_tensor_keys(keys):
    """Device keys as a contiguous int64 (n, words) tensor (uint64 tensors are viewed as int64;
    1-D input: one word per key)."""
    import torch

    if keys.dtype == torch.uint64:
        keys = keys.view(torch.int64)
    if keys.dtype != torch.int64:
        raise TypeError(f"key tensors must be int64 (uint64 bits), got {keys.dtype}")
    if keys.ndim == 1:
        keys = keys[:, None]
    if keys.ndim != 2 or not 1 <= keys.shape[1] <= 4:
        raise ValueError(
            f"keys must have shape (n, words) with 1..4 words, got {tuple(keys.shape)}"
        )
    return keys.contiguous()


def to_device(configs, device):
    """uint64 (n, words) host keys as an int64 torch tensor on `device` (same bits)."""
    import torch

    arr = np.ascontiguousarray(configs, dtype=np.uint64)
    return torch.from_numpy(arr.view(np.int64)).to(device)


def to_numpy(configs) -> np.ndarray:
    """Inverse of `to_device`: any key tensor (or array) as host uint64 keys."""
    if not is_tensor(configs):
        return as_keys(configs)
    return configs.detach().to("cpu").contiguous().numpy().view(np.uint64)


# --- host: compiled radix sort, its numpy twin, hashing --------------------------------------


def dedup(keys) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sorted unique host keys, the inverse index and the multiplicities (parallel radix sort).

    Returns:
        (unique (u, words), inverse (n,) int64 with unique[inverse] == keys, counts (u,) int64)

    Example:
        >>> u, inv, cnt = dedup(np.array([[5], [3], [5]], dtype=np.uint64))
        >>> u.ravel().tolist(), inv.tolist(), cnt.tolist()
        ([3, 5], [1, 0, 1], [1, 2])
    """
    return core().unique_keys(as_keys(keys))


def dedup_numpy(keys) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pure-numpy twin of `dedup` (lexsort), for tests and small inputs."""
    arr = as_keys(keys)
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
    """Hash index of a set of unique host keys: `find(queries)` gives each query's row or -1.

    Example:
        >>> idx = KeyIndex(np.array([[9], [4]], dtype=np.uint64))
        >>> idx.find(np.array([[4], [7]], dtype=np.uint64)).tolist()
        [1, -1]
    """

    def __init__(self, keys):
        self._keys = as_keys(keys)
        self._index = core().KeyIndex(self._keys)
        if self._index.has_duplicates:
            raise ValueError("KeyIndex needs unique keys")

    def __len__(self) -> int:
        return len(self._keys)

    def find(self, queries) -> np.ndarray:
        q = as_keys(queries)
        if q.shape[1] != self._keys.shape[1]:
            raise ValueError("queries and keys differ in words per key")
        return self._index.find(q)


# --- both kinds ------------------------------------------------------------------------------


def _stream(device) -> int:
    import torch

    return torch.cuda.current_stream(device).cuda_stream


def sort_unique_workspace_bytes(n: int, words: int, return_inverse: bool = False) -> int:
    """Device bytes the GPU `sort_unique` allocates besides its outputs."""
    return int(cuda().sort_unique_workspace(int(n), int(words), bool(return_inverse)))


def _sort_unique_cuda(keys, return_inverse: bool, end_bit: int | None):
    import torch

    n, w = keys.shape
    dev = keys.device
    inverse = torch.empty(n, dtype=torch.int64, device=dev) if return_inverse else None
    if n == 0:
        return keys.new_empty((0, w)), inverse
    k = cuda()
    ws = torch.empty(k.sort_unique_workspace(n, w, return_inverse), dtype=torch.uint8, device=dev)
    unique = torch.empty((n, w), dtype=torch.int64, device=dev)
    u = k.sort_unique(keys, int(end_bit or 64 * w), unique, inverse, ws, _stream(dev))
    del ws
    return (unique[:u].clone() if u < n else unique), inverse


def _sort_unique_torch(keys):
    """Pure-torch twin (stable sorts per word, least significant first), any device."""
    import torch

    n = len(keys)
    if n == 0:
        return keys.clone(), torch.zeros(0, dtype=torch.int64, device=keys.device)
    order = torch.arange(n, device=keys.device)
    for k in range(keys.shape[1]):
        _, idx = torch.sort(keys[order, k] ^ _SIGN, stable=True)
        order = order[idx]
    s = keys[order]
    new = torch.ones(n, dtype=torch.bool, device=keys.device)
    new[1:] = (s[1:] != s[:-1]).any(dim=1)
    inverse = torch.empty(n, dtype=torch.int64, device=keys.device)
    inverse[order] = torch.cumsum(new, 0) - 1
    return s[new].contiguous(), inverse


def sort_unique(keys, return_inverse: bool = True, end_bit: int | None = None, impl: str = "auto"):
    """Sorted unique rows of `keys` and, by default, the inverse index.

    Args:
        keys: uint64 (n, words) numpy array, or an int64 torch tensor (any device).
        return_inverse: also return ``inverse`` (n,) int64 with ``unique[inverse] == keys``.
        end_bit: only the lowest `end_bit` bits of the concatenated key take part in the GPU
            radix sort (a configuration of n_so spin orbitals needs n_so); the others ignore it.
        impl: "auto" (compiled: the C++ radix sort for host keys and CPU tensors, CUB for CUDA
            tensors) or "torch" (the pure-torch twin, tensors only).

    Returns:
        ``(unique, inverse)``, or ``unique`` without the inverse; the kind and device of `keys`.
    """
    if impl not in ("auto", "torch"):
        raise ValueError(f"impl must be 'auto' or 'torch', got {impl!r}")
    if not is_tensor(keys):
        if impl == "torch":
            raise ValueError("impl='torch' takes torch tensors")
        u, inv, _ = dedup(keys)
        return (u, inv) if return_inverse else u
    import torch

    keys = as_tensor_keys(keys)
    if impl == "torch":
        u, inv = _sort_unique_torch(keys)
    elif keys.is_cuda:
        u, inv = _sort_unique_cuda(keys, return_inverse, end_bit)
    else:
        u, inv, _ = dedup(keys.numpy().view(np.uint64))
        u = torch.from_numpy(np.ascontiguousarray(u).view(np.int64))
        inv = torch.from_numpy(inv)
    return (u, inv) if return_inverse else u


def _flipped(a):
    """Keys with the sign bit flipped, as int64: signed order == the keys' unsigned order."""
    if is_tensor(a):
        return a ^ _SIGN
    return a.view(np.int64) ^ np.int64(_SIGN)


def searchsorted(sorted_keys, queries, side: str = "left"):
    """np.searchsorted for multi-word keys: where each query would go in sorted keys.

    Args:
        sorted_keys: sorted keys (duplicates allowed), numpy or torch.
        queries: keys of the same kind and words.
        side: "left" (first position with key >= query) or "right" (first with key > query).

    Returns:
        int64 (q,) insertion positions, of the kind of `sorted_keys`.

    Example:
        >>> k = np.array([[1, 0], [0, 1], [5, 1]], dtype=np.uint64)
        >>> searchsorted(k, np.array([[0, 1], [9, 0]], dtype=np.uint64)).tolist()
        [1, 1]
    """
    if side not in ("left", "right"):
        raise ValueError(f"side must be 'left' or 'right', got {side!r}")
    tensor = is_tensor(sorted_keys)
    if tensor:
        import torch

        a, q = as_tensor_keys(sorted_keys), as_tensor_keys(queries).to(sorted_keys.device)
        where, full = (
            torch.where,
            (lambda n, v: torch.full((n,), v, dtype=torch.int64, device=a.device)),
        )
    else:
        a, q = as_keys(sorted_keys), as_keys(queries)
        where, full = np.where, (lambda n, v: np.full(n, v, dtype=np.int64))
    if len(q) and a.shape[1] != q.shape[1]:
        raise ValueError(f"queries have {q.shape[1]} words, keys have {a.shape[1]}")
    af, qf = _flipped(a), _flipped(q)
    if a.shape[1] == 1:
        if tensor:
            return torch.searchsorted(
                af[:, 0].contiguous(), qf[:, 0].contiguous(), right=side == "right"
            )
        return np.searchsorted(af[:, 0], qf[:, 0], side=side).astype(np.int64)
    lo, hi = full(len(q), 0), full(len(q), len(a))
    if len(a) == 0:
        return lo
    for _ in range(int(len(a)).bit_length() + 1):
        active = lo < hi
        mid = (lo + hi) // 2
        row = af[where(mid < len(a) - 1, mid, len(a) - 1)]
        # lexicographic compare, last column most significant: -1 / 0 / +1 per query
        less, greater = row[:, -1] < qf[:, -1], row[:, -1] > qf[:, -1]
        for k in range(a.shape[1] - 2, -1, -1):
            tie = ~(less | greater)
            less = less | (tie & (row[:, k] < qf[:, k]))
            greater = greater | (tie & (row[:, k] > qf[:, k]))
        right = less if side == "left" else ~greater
        lo = where(active & right, mid + 1, lo)
        hi = where(active & ~right, mid, hi)
    return lo


def search(sorted_keys, queries):
    """Row of each query in sorted unique keys, or -1 (CUDA tensors: a GPU binary search).

    Example:
        >>> k = np.array([[2], [4], [9]], dtype=np.uint64)
        >>> search(k, np.array([[9], [3]], dtype=np.uint64)).tolist()
        [2, -1]
    """
    if is_tensor(sorted_keys) and sorted_keys.is_cuda:
        import torch

        s, q = as_tensor_keys(sorted_keys), as_tensor_keys(queries)
        if s.shape[1] != q.shape[1]:
            raise ValueError(f"queries have {q.shape[1]} words, keys have {s.shape[1]}")
        out = torch.empty(len(q), dtype=torch.int64, device=q.device)
        cuda().search_keys(s, q, out, _stream(q.device))
        return out
    pos = searchsorted(sorted_keys, queries, side="left")
    n = len(sorted_keys)
    if is_tensor(sorted_keys):
        import torch

        s, q = as_tensor_keys(sorted_keys), as_tensor_keys(queries)
        hit = torch.zeros(len(q), dtype=torch.bool, device=q.device)
        inside = pos < n
        hit[inside] = (s[pos[inside]] == q[inside]).all(dim=1)
        return torch.where(hit, pos, torch.full_like(pos, -1))
    s, q = as_keys(sorted_keys), as_keys(queries)
    hit = np.zeros(len(q), dtype=bool)
    inside = pos < n
    hit[inside] = (s[pos[inside]] == q[inside]).all(axis=1)
    return np.where(hit, pos, -1)
