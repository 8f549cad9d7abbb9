"""Global de-dup on torch tensors: the keys stay on their device (NCCL on GPUs, gloo on CPU).

The same regular-sampling algorithm as `cuscikit.parallel.dedup.global_dedup` (read its module
docstring for the steps and the two additions, weighted samples and rebalancing), written on
torch tensors so that on a multi-GPU run the coupled configurations never leave the GPUs:

1. local sort + unique with the inverse index (`sort_unique_rows`: the CUDA radix sort
   `cuscikit.gpu.ops.sort_unique` for CUDA tensors, the compiled CPU radix sort
   `cuscikit.sci.dedup.dedup` for CPU tensors, or a pure-torch twin with ``impl="torch"``);
2. weighted regular samples, ``all_gather``-ed (every rank computes the same splitters from
   them, so no broadcast is needed; the P * S samples are small and go through the host);
3. per-rank split counts by binary search of the splitters in the sorted local keys
   (`searchsorted_rows`, vectorised over the splitters, any device);
4. ``all_to_all_single`` of the counts, then of the keys (rows flattened to int64);
5. merge of the received sorted runs by sort + unique (with the inverse index);
6. rebalancing to exact shares ``floor(k U / P)`` (``rebalance=True``) and the routing back:
   every local unique key learns its owner and its row there, so values computed on the
   owners (psi) come back with `GlobalDedupTensors.fetch`.

Keys are ``int64`` tensors (n, words) holding ``uint64`` bit patterns, word ``words-1`` most
significant. int64 compares as signed, so every comparison here flips the sign bit first
(``x ^ 0x8000000000000000``): that maps unsigned order onto signed order.

The communicator: a `cuscikit.parallel.comm.TorchComm` (collectives through ``torch.distributed``
on the default process group, on ``comm.device``: tensors on another device are copied there
for the exchange and back), or any other `Comm` (`SerialComm`, `MPIComm`: the exchanges go
through host numpy arrays). The slices, concatenated over the ranks, equal the single-process
``cuscikit.sci.dedup.dedup`` of the union of the inputs.

Example:
    >>> import torch
    >>> r = global_dedup_tensors(torch.tensor([[7], [3], [7], [-1]]))  # one rank
    >>> r.unique.ravel().tolist(), r.index.tolist()  # -1 is 2**64 - 1: the largest key
    ([3, 7, -1], [1, 0, 1, 2])
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial

import numpy as np
import torch

from cuscikit.parallel.comm import Comm, SerialComm
from cuscikit.parallel.dedup import (
    DEFAULT_SAMPLES_PER_RANK,
    REGULAR_PHASES,
    DedupMetrics,
    GlobalDedup,
    _Clock,
    _splitters_from,
)

__all__ = [
    "GlobalDedupTensors",
    "global_dedup_tensors",
    "searchsorted_rows",
    "sort_rows",
    "sort_unique_rows",
]

_SIGN = -(2**63)


def _flip(t: torch.Tensor) -> torch.Tensor:
    """Sign bit flipped: signed order of the result == unsigned order of the bits."""
    return t ^ _SIGN


def _check_keys(keys: torch.Tensor) -> torch.Tensor:
    if not isinstance(keys, torch.Tensor):
        raise TypeError(f"keys must be a torch tensor, got {type(keys).__name__}")
    if keys.dtype == torch.uint64:
        keys = keys.view(torch.int64)
    if keys.dtype != torch.int64:
        raise TypeError(f"keys must be int64 (uint64 bits), got {keys.dtype}")
    if keys.ndim == 1:
        keys = keys[:, None]
    if keys.ndim != 2 or not 1 <= keys.shape[1] <= 4:
        raise ValueError(
            f"keys must have shape (n, words) with 1..4 words, got {tuple(keys.shape)}"
        )
    return keys.contiguous()


# --- local primitives on tensors -----------------------------------------------------------------


def sort_rows(keys: torch.Tensor) -> torch.Tensor:
    """Permutation that sorts the rows lexicographically as unsigned, last column most significant.

    Stable sorts by each word, least significant first (any device).
    """
    keys = _check_keys(keys)
    n, w = keys.shape
    order = torch.arange(n, device=keys.device)
    for k in range(w):
        _, idx = torch.sort(_flip(keys[order, k]), stable=True)
        order = order[idx]
    return order


def _sort_unique_torch(keys: torch.Tensor):
    n, w = keys.shape
    if n == 0:
        return keys.clone(), torch.zeros(0, dtype=torch.int64, device=keys.device)
    order = sort_rows(keys)
    s = keys[order]
    new = torch.ones(n, dtype=torch.bool, device=keys.device)
    new[1:] = (s[1:] != s[:-1]).any(dim=1)
    inverse = torch.empty(n, dtype=torch.int64, device=keys.device)
    inverse[order] = torch.cumsum(new, 0) - 1
    return s[new].contiguous(), inverse


def _sort_unique_numpy(keys: torch.Tensor):
    from cuscikit.sci.dedup import dedup

    n, w = keys.shape
    if n == 0:
        return keys.clone(), torch.zeros(0, dtype=torch.int64)
    u, inv, _ = dedup(keys.numpy().view(np.uint64))
    return torch.from_numpy(np.ascontiguousarray(u).view(np.int64)), torch.from_numpy(inv)


def sort_unique_rows(keys: torch.Tensor, end_bit: int | None = None, impl: str = "auto"):
    """Sorted unique rows of int64 `keys` (n, words) (unsigned order) and the inverse index.

    Args:
        keys: int64 (n, words) holding uint64 bits, on any device.
        end_bit: passed to the CUDA radix sort (only the lowest `end_bit` bits are sorted; a
            configuration of n_so spin orbitals needs n_so); ignored by the other engines.
        impl: "auto" (CUDA tensors: `cuscikit.gpu.ops.sort_unique`; CPU tensors: the compiled
            CPU radix sort `cuscikit.sci.dedup.dedup`), "kernel", "numpy" or "torch" (stable
            torch.sort per word, any device).

    Returns:
        (unique (u, words) int64 on the keys' device, inverse (n,) int64 with
        ``unique[inverse] == keys``).

    Example:
        >>> u, inv = sort_unique_rows(torch.tensor([[5], [-2], [5], [3]]), impl="torch")
        >>> u.ravel().tolist(), inv.tolist()
        ([3, 5, -2], [1, 2, 1, 0])
    """
    keys = _check_keys(keys)
    if impl == "auto":
        impl = "kernel" if keys.is_cuda else "numpy"
    if impl == "kernel":
        from cuscikit.gpu import ops

        return ops.sort_unique(keys, return_inverse=True, end_bit=end_bit)
    if impl == "numpy":
        if keys.is_cuda:
            u, inv = _sort_unique_numpy(keys.cpu())
            return u.to(keys.device), inv.to(keys.device)
        return _sort_unique_numpy(keys)
    if impl == "torch":
        return _sort_unique_torch(keys)
    raise ValueError(f"impl must be 'auto', 'kernel', 'numpy' or 'torch', got {impl!r}")


def _compare_rows(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """-1, 0, 1 per row (a < b, ==, >) as unsigned, last column most significant."""
    out = torch.zeros(len(a), dtype=torch.int8, device=a.device)
    for k in range(a.shape[1] - 1, -1, -1):
        x, y = _flip(a[:, k]), _flip(b[:, k])
        open_ = out == 0
        out = torch.where(open_ & (x < y), -1, out).to(torch.int8)
        out = torch.where(open_ & (x > y), 1, out).to(torch.int8)
    return out


def searchsorted_rows(sorted_keys: torch.Tensor, queries: torch.Tensor, side: str = "left"):
    """Insertion positions of `queries` in the sorted rows `sorted_keys` (unsigned order).

    ``cuscikit.gpu.ops.search`` finds exact matches only; the splitters need insertion points,
    so this is a vectorised binary search (torch.searchsorted for one word), on any device.

    Example:
        >>> k = torch.tensor([[1, 0], [0, 1], [5, 1], [0, -1]])
        >>> searchsorted_rows(k, torch.tensor([[0, 1], [9, 0], [1, -1]])).tolist()
        [1, 1, 4]
    """
    if side not in ("left", "right"):
        raise ValueError(f"side must be 'left' or 'right', got {side!r}")
    a, q = _check_keys(sorted_keys), _check_keys(queries).to(sorted_keys.device)
    if len(q) and a.shape[1] != q.shape[1]:
        raise ValueError(f"queries have {q.shape[1]} words, keys have {a.shape[1]}")
    if a.shape[1] == 1:
        return torch.searchsorted(
            _flip(a[:, 0]).contiguous(), _flip(q[:, 0]).contiguous(), right=side == "right"
        )
    lo = torch.zeros(len(q), dtype=torch.int64, device=a.device)
    hi = torch.full((len(q),), len(a), dtype=torch.int64, device=a.device)
    if len(a) == 0:
        return lo
    for _ in range(int(len(a)).bit_length() + 1):
        active = lo < hi
        mid = (lo + hi) // 2
        cmp = _compare_rows(a[torch.clamp(mid, max=len(a) - 1)], q)
        right = (cmp < 0) if side == "left" else (cmp <= 0)
        lo = torch.where(active & right, mid + 1, lo)
        hi = torch.where(active & ~right, mid, hi)
    return lo


def _regular_samples(sorted_keys: torch.Tensor, samples: int) -> torch.Tensor:
    n = len(sorted_keys)
    if samples < 1:
        raise ValueError(f"samples per rank must be >= 1, got {samples}")
    if n <= samples:
        return sorted_keys
    pos = ((2 * torch.arange(samples, device=sorted_keys.device) + 1) * n) // (2 * samples)
    return sorted_keys[pos]


def _split_counts(sorted_keys: torch.Tensor, splitters: torch.Tensor) -> list[int]:
    n = len(sorted_keys)
    if len(splitters) == 0:
        return [n]
    cuts = searchsorted_rows(sorted_keys, splitters, side="left").cpu().tolist()
    edges = [0, *cuts, n]
    return [edges[i + 1] - edges[i] for i in range(len(edges) - 1)]


# --- collectives on tensors ----------------------------------------------------------------------


class _Coll:
    """Row collectives on tensors over a `Comm`: torch.distributed for `TorchComm`, host numpy
    arrays through the communicator's own methods for the others (serial, MPI)."""

    def __init__(self, comm: Comm):
        from cuscikit.parallel.comm import TorchComm

        self.comm = comm
        self.rank, self.size = comm.rank, comm.size
        self.torch = isinstance(comm, TorchComm)
        self.device = comm.device if self.torch else torch.device("cpu")

    def _run(self, what, fn, *args, **kw):
        if self.torch:
            return self.comm._run(what, fn, *args, **kw)
        return fn(*args, **kw)

    @staticmethod
    def _flat(t: torch.Tensor) -> tuple[torch.Tensor, tuple, torch.dtype, int]:
        """Rows of `t` as a 1-D tensor of a dtype the engines move (complex -> 2 float64)."""
        dtype = t.dtype
        if t.is_complex():
            t = torch.view_as_real(t)
        if t.dtype == torch.bool:
            t = t.to(torch.uint8)
        t = t.contiguous()
        per_row = int(np.prod(t.shape[1:])) if t.ndim > 1 else 1
        return t.reshape(-1), tuple(t.shape[1:]), dtype, per_row

    @staticmethod
    def _unflat(flat: torch.Tensor, shape: tuple, dtype: torch.dtype) -> torch.Tensor:
        t = flat.reshape(-1, *shape)
        if dtype.is_complex:
            return torch.view_as_complex(t.contiguous())
        return t.to(dtype) if t.dtype != dtype else t

    def alltoall_rows(self, t: torch.Tensor, send_counts: list[int]):
        """Rows ``t[sum(c[:d]) : sum(c[:d+1])]`` to rank d; (received rows, recv counts)."""
        home = t.device
        if self.size == 1:
            return t.clone(), list(send_counts)
        if not self.torch:
            a = t.detach().cpu().numpy()
            recv, rc = self.comm.alltoallv(a, np.asarray(send_counts, np.int64))
            return torch.from_numpy(np.ascontiguousarray(recv)).to(home), rc.tolist()
        import torch.distributed as dist

        flat, shape, dtype, per = self._flat(t.to(self.device))
        send = torch.tensor(send_counts, dtype=torch.int64, device=self.device)
        recv = torch.empty_like(send)
        self._run("all_to_all_single (counts)", dist.all_to_all_single, recv, send)
        rc = recv.cpu().tolist()
        out = torch.empty(sum(rc) * per, dtype=flat.dtype, device=self.device)
        self._run(
            "all_to_all_single",
            dist.all_to_all_single,
            out,
            flat,
            output_split_sizes=[c * per for c in rc],
            input_split_sizes=[c * per for c in send_counts],
        )
        return self._unflat(out, shape, dtype).to(home), rc

    def allgather_rows(self, t: torch.Tensor) -> list[torch.Tensor]:
        """Every rank's rows (row counts may differ), on every rank, on `t`'s device."""
        home = t.device
        if self.size == 1:
            return [t.clone()]
        if not self.torch:
            parts = self.comm.allgather(t.detach().cpu().numpy())
            return [torch.from_numpy(np.ascontiguousarray(p)).to(home) for p in parts]
        import torch.distributed as dist

        flat, shape, dtype, per = self._flat(t.to(self.device))
        n = torch.tensor([len(t)], dtype=torch.int64, device=self.device)
        ns = [torch.empty_like(n) for _ in range(self.size)]
        self._run("all_gather (rows)", dist.all_gather, ns, n)
        rows = [int(x.item()) for x in ns]
        pad = torch.zeros(max(max(rows), 1) * per, dtype=flat.dtype, device=self.device)
        pad[: flat.numel()] = flat
        outs = [torch.empty_like(pad) for _ in range(self.size)]
        self._run("all_gather", dist.all_gather, outs, pad)
        return [
            self._unflat(o[: r * per], shape, dtype).to(home)
            for o, r in zip(outs, rows, strict=True)
        ]

    def allgather_floats(self, values) -> np.ndarray:
        """(P, k) float64 table of one small vector per rank."""
        v = torch.as_tensor(np.asarray(values, dtype=np.float64))
        return np.stack([p.cpu().numpy() for p in self.allgather_rows(v[None])]).reshape(
            self.size, -1
        )


def _agree_words(keys: torch.Tensor, coll: _Coll) -> torch.Tensor:
    """This rank's keys as (n, words) with the words every non-empty rank uses."""
    if keys.numel() == 0:
        keys = keys.reshape(0, keys.shape[-1] if keys.ndim == 2 and keys.shape[-1] else 1)
    keys = _check_keys(keys)
    n, w = keys.shape
    table = coll.allgather_floats([w if n else 0])[:, 0]
    used = {int(x) for x in table if x > 0}
    if len(used) > 1:
        raise ValueError(
            f"rank {coll.rank}: keys differ in words per key between ranks ({sorted(used)}); "
            "every rank must pass (n, words) with the same words"
        )
    if used and not n:
        return torch.zeros((0, used.pop()), dtype=torch.int64, device=keys.device)
    return keys


# --- result --------------------------------------------------------------------------------------


@dataclass
class GlobalDedupTensors:
    """One rank's part of a global de-dup on tensors (the tensor twin of `GlobalDedup`).

    Attributes:
        unique: int64 (u_r, words) on the keys' device, this rank's sorted slice.
        offsets: int64 (P + 1,) numpy: rank d owns global rows ``offsets[d]:offsets[d+1]``.
        owner: int64 (n,) tensor, the rank that owns each local input key.
        index: int64 (n,) tensor, each input key's row in its owner's `unique`.
        metrics: `DedupMetrics` of the call (method "regular-sampling").

    Routing as in `GlobalDedup`: ``request_inverse`` (tensor) picks each input key's answer
    among the requests (``request_counts[d]`` distinct keys asked of rank d); this rank answers
    rank d with ``serve_counts[d]`` rows of its slice, ``serve_index`` (tensor) in order.
    """

    unique: torch.Tensor
    offsets: np.ndarray
    owner: torch.Tensor
    index: torch.Tensor
    metrics: DedupMetrics
    request_inverse: torch.Tensor = field(repr=False)
    request_counts: np.ndarray = field(repr=False)
    serve_index: torch.Tensor = field(repr=False)
    serve_counts: np.ndarray = field(repr=False)

    @property
    def global_index(self) -> torch.Tensor:
        """int64 (n,): each input key's row in the concatenation of all slices."""
        off = torch.as_tensor(self.offsets, device=self.owner.device)
        return off[self.owner] + self.index

    def fetch(self, values: torch.Tensor, comm: Comm | None = None) -> torch.Tensor:
        """Route per-key values from the owners back to every local input key (collective).

        Args:
            values: tensor with one row per row of `unique` (psi on this rank's slice; any
                dtype: complex travels as pairs of reals).
            comm: the communicator of the de-dup call.

        Returns:
            One row per local input key, on the values' device:
            ``out[i] = values_on_owner[owner[i]][index[i]]``.
        """
        coll = _Coll(SerialComm() if comm is None else comm)
        if values.shape[0] != len(self.unique):
            raise ValueError(
                f"fetch needs one value per key of this rank's slice ({len(self.unique)}), "
                f"got {values.shape[0]}"
            )
        serve = self.serve_index.to(values.device)
        recv, rc = coll.alltoall_rows(values[serve], self.serve_counts.tolist())
        if list(rc) != self.request_counts.tolist():  # pragma: no cover - internal invariant
            raise RuntimeError("fetch: answers do not match the requests (different comm?)")
        return recv[self.request_inverse.to(values.device)]

    def as_numpy(self) -> GlobalDedup:
        """The same result as a numpy `GlobalDedup` (uint64 keys; copies to the host)."""

        def host(t):
            return t.detach().cpu().numpy()

        return GlobalDedup(
            unique=np.ascontiguousarray(host(self.unique)).view(np.uint64),
            offsets=self.offsets,
            owner=host(self.owner),
            index=host(self.index),
            metrics=self.metrics,
            request_inverse=host(self.request_inverse),
            request_counts=self.request_counts,
            serve_index=host(self.serve_index),
            serve_counts=self.serve_counts,
        )


def global_dedup_tensors(
    keys: torch.Tensor,
    comm: Comm | None = None,
    samples_per_rank: int = DEFAULT_SAMPLES_PER_RANK,
    end_bit: int | None = None,
    rebalance: bool = True,
    impl: str = "auto",
) -> GlobalDedupTensors:
    """Regular-sampling global de-dup of int64 key tensors held by all ranks (collective).

    Args:
        keys: int64 (n, words) tensor of uint64 bits on this rank (CUDA or CPU; n may be 0 and
            differ between ranks; words must agree, an empty input adopts them).
        comm: a `TorchComm` (NCCL for CUDA tensors, gloo for CPU tensors), or any `Comm`
            (default: `SerialComm`).
        samples_per_rank: S, regularly spaced samples per rank for the splitters.
        end_bit: bits that matter per key for the CUDA radix sort (e.g. 2 * norb).
        rebalance: cut the merged slices at exact equal shares (as `global_dedup`).
        impl: local sort + unique engine, see `sort_unique_rows`.

    Returns:
        `GlobalDedupTensors`: tensors on the keys' device. Concatenating the slices of ranks
        0..P-1 gives ``cuscikit.sci.dedup.dedup`` of the union of all inputs.
    """
    comm = SerialComm() if comm is None else comm
    coll = _Coll(comm)
    P, rank = coll.size, coll.rank
    dev = keys.device
    clock = _Clock(partial(torch.cuda.synchronize, dev) if dev.type == "cuda" else None)
    keys = _agree_words(keys, coll)
    w = keys.shape[1]
    clock.lap()

    # 1. local sort + unique
    local_unique, local_inverse = sort_unique_rows(keys, end_bit=end_bit, impl=impl)
    t_local = clock.lap()

    # 2-3. weighted samples -> every rank -> the same splitters everywhere (host: P * S rows)
    smp = _regular_samples(local_unique, samples_per_rank)
    col = torch.full((len(smp), 1), len(local_unique), dtype=torch.int64, device=dev)
    gathered = coll.allgather_rows(torch.cat([smp, col], dim=1))
    host = [np.ascontiguousarray(g.cpu().numpy()).view(np.uint64) for g in gathered]
    splitters = _splitters_from(host, P)
    spl = torch.from_numpy(np.ascontiguousarray(splitters).view(np.int64)).to(dev)
    send_counts = _split_counts(local_unique, spl)
    t_split = clock.lap()

    # 4. exchange
    received, recv_counts = coll.alltoall_rows(local_unique, send_counts)
    t_exchange = clock.lap()

    # 5. merge the sorted runs and drop duplicates
    merged, recv_inverse = sort_unique_rows(received, end_bit=end_bit, impl=impl)
    t_merge = clock.lap()

    if rebalance:
        sizes = coll.allgather_floats([len(merged)])[:, 0].astype(np.int64)
        pre = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        offsets = (np.arange(P + 1, dtype=np.int64) * int(pre[-1])) // P
        lo, hi = int(pre[rank]), int(pre[rank + 1])
        move = np.clip(np.minimum(hi, offsets[1:]) - np.maximum(lo, offsets[:-1]), 0, None)
        unique, _ = coll.alltoall_rows(merged, move.tolist())
        t_rebalance = clock.lap()
        # 6. global rows back to the senders; each requester then tells the final owners
        g, _ = coll.alltoall_rows(recv_inverse + lo, recv_counts)
        off_t = torch.as_tensor(offsets, device=dev)
        lu_owner = torch.searchsorted(off_t, g, right=True) - 1
        lu_index = g - off_t[lu_owner]
        request_counts = torch.bincount(lu_owner, minlength=P).cpu().numpy().astype(np.int64)
        serve_index, serve_counts = coll.alltoall_rows(lu_index, request_counts.tolist())
    else:
        unique, t_rebalance, offsets = merged, 0.0, None
        lu_index, _ = coll.alltoall_rows(recv_inverse, recv_counts)
        lu_owner = torch.repeat_interleave(
            torch.arange(P, device=dev), torch.tensor(send_counts, device=dev)
        )
        request_counts = np.asarray(send_counts, np.int64)
        serve_index, serve_counts = recv_inverse, recv_counts
    t_route = clock.lap()

    stats = [len(keys), len(received), len(merged), len(unique), clock.total()]
    stats += [t_local, t_split, t_exchange, t_merge, t_rebalance, t_route]
    table = coll.allgather_floats(stats)
    counts = table[:, 3].astype(np.int64)
    metrics = DedupMetrics(
        method="regular-sampling",
        ranks=P,
        words=w,
        items=int(table[:, 0].sum()),
        unique=int(counts.sum()),
        received=table[:, 1].astype(np.int64),
        merged=table[:, 2].astype(np.int64),
        counts=counts,
        seconds={p: float(table[:, 5 + k].max()) for k, p in enumerate(REGULAR_PHASES)},
        total_seconds=float(table[:, 4].max()),
        samples_per_rank=samples_per_rank,
        rebalanced=rebalance,
    )
    if offsets is None:
        offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    return GlobalDedupTensors(
        unique=unique,
        offsets=offsets,
        owner=lu_owner[local_inverse],
        index=lu_index[local_inverse],
        metrics=metrics,
        request_inverse=local_inverse,
        request_counts=request_counts,
        serve_index=serve_index.to(torch.int64),
        serve_counts=np.asarray(serve_counts, np.int64),
    )
