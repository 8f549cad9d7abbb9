"""Global de-duplication of configurations spread over ranks (seed 000, section 4.1).

Regular-sampling sort-based de-dup (ALGORITHMS.md, "Distributed de-duplication"):

1. each rank sorts its keys and drops local duplicates (`cuscikit.sci.dedup.dedup`, radix sort);
2. takes ``S`` regularly spaced samples of its sorted unique keys (`regular_samples`);
3. rank 0 gathers the samples, sorts them and picks ``P - 1`` splitters at equal intervals
   (`choose_splitters`), which it broadcasts;
4. each rank binary-searches the splitters in its sorted keys (`searchsorted_keys`; multi-word
   keys compare lexicographically, most significant word = last column), so that rank ``d``
   receives the keys ``splitter[d-1] <= key < splitter[d]``;
5. ``alltoallv``; each rank merges the sorted runs it received and drops duplicates (the runs
   are concatenated and radix-sorted, which costs the same as a k-way merge and yields the
   inverse index needed for the routing);
6. each key's row in its owner's slice goes back to its sender with a second ``alltoallv``, so
   that values computed on the owners (psi) can be routed back to every input key (`fetch`).

Two additions to the textbook scheme, both measured in ``benchmarks/dedup_balance.py``:

- *Weighted samples.* A rank with n_r unique keys sends min(S, n_r) samples, each standing for
  n_r / min(S, n_r) keys; the splitters are chosen at equal intervals of that weight, not of the
  sample count. With uneven partitions (a rank count that does not divide the work, empty ranks)
  equal-count intervals would give small ranks' keys up to S/n_r times their share.
- *Rebalancing* (``rebalance=True``, the default). Sampling balances the keys each rank
  *receives*; the keys it *owns* after dropping duplicates can differ by far more, because keys
  near the reference configuration are held by many ranks and others by one (N2/cc-pVDZ coupled
  sets at P = 8: received max/min 1.03, owned 1.21). After the merge the slices are sorted and
  disjoint, so one more ``alltoallv`` moves the surplus between neighbouring ranks to exact
  shares ``floor(k U / P)`` (max/min <= 1 + P/U), and one more returns the routing.

The slices, concatenated over ranks, are exactly the single-process ``dedup`` of the union of
the inputs. `centralised_dedup` is the baseline (gather to rank 0, unique there, scatter back);
`simulate_partition` runs the same steps on P slices inside one process (P = 32, 64, ...).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from cuscikit.parallel.comm import Comm, SerialComm
from cuscikit.sci.dedup import _as_keys, dedup

__all__ = [
    "DEFAULT_SAMPLES_PER_RANK",
    "DedupMetrics",
    "GlobalDedup",
    "balance",
    "centralised_dedup",
    "choose_splitters",
    "global_dedup",
    "regular_samples",
    "searchsorted_keys",
    "simulate_partition",
    "split_counts",
]

DEFAULT_SAMPLES_PER_RANK = 1024
"""S, samples per rank. The splitters fix what each rank receives to within about one sample
interval of every rank, so the received balance improves with S until runs of equal keys limit
it: on the bundled coupled sets at P = 64 (benchmarks/dedup_balance.py) S = 64, 256, 1024, 4096
give received max/min 2.08, 1.15, 1.05, 1.05 (CV 0.15, 0.024, 0.009, 0.009). The gather on
rank 0 is P * S keys. What each rank owns after the merge is set by cross-rank duplicates, not
by S; the rebalancing step makes it exact."""

REGULAR_PHASES = ("local", "splitters", "exchange", "merge", "rebalance", "route")
CENTRAL_PHASES = ("gather", "unique", "scatter", "route")


# --- pure pieces ---------------------------------------------------------------------------------


def _compare_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """-1, 0 or 1 per row: a < b, a == b, a > b lexicographically, last column most significant."""
    out = np.zeros(len(a), dtype=np.int8)
    for k in range(a.shape[1] - 1, -1, -1):
        open_ = out == 0
        out[open_ & (a[:, k] < b[:, k])] = -1
        out[open_ & (a[:, k] > b[:, k])] = 1
    return out


def _sort_rows(a: np.ndarray) -> np.ndarray:
    """Rows sorted lexicographically (duplicates kept); np.lexsort's last key is primary."""
    if len(a) == 0:
        return a.copy()
    return np.ascontiguousarray(a[np.lexsort(a.T)])


def searchsorted_keys(sorted_keys, queries, side: str = "left") -> np.ndarray:
    """np.searchsorted for multi-word keys: where each query would go in `sorted_keys`.

    Args:
        sorted_keys: uint64 (n, words), sorted (most significant word = last column).
        queries: uint64 (q, words).
        side: "left" (first position with key >= query) or "right" (first with key > query).

    Returns:
        int64 (q,) insertion positions.

    Example:
        >>> k = np.array([[1, 0], [0, 1], [5, 1]], dtype=np.uint64)
        >>> searchsorted_keys(k, np.array([[0, 1], [9, 0]], dtype=np.uint64)).tolist()
        [1, 1]
    """
    if side not in ("left", "right"):
        raise ValueError(f"side must be 'left' or 'right', got {side!r}")
    a, q = _as_keys(sorted_keys), _as_keys(queries)
    if len(q) and a.shape[1] != q.shape[1]:
        raise ValueError(f"queries have {q.shape[1]} words, keys have {a.shape[1]}")
    if a.shape[1] == 1:
        return np.searchsorted(a[:, 0], q[:, 0], side=side).astype(np.int64)
    lo = np.zeros(len(q), dtype=np.int64)
    hi = np.full(len(q), len(a), dtype=np.int64)
    while True:
        active = lo < hi
        if not active.any():
            return lo
        mid = (lo + hi) // 2
        cmp = _compare_rows(a[np.minimum(mid, len(a) - 1)], q)
        right = (cmp < 0) if side == "left" else (cmp <= 0)
        lo = np.where(active & right, mid + 1, lo)
        hi = np.where(active & ~right, mid, hi)


def regular_samples(sorted_keys: np.ndarray, samples: int) -> np.ndarray:
    """`samples` regularly spaced rows of a sorted array (all rows when it has fewer).

    Sample i is row ``floor((2 i + 1) n / (2 S))``: the middle of the i-th of S equal intervals.

    Example:
        >>> regular_samples(np.arange(10, dtype=np.uint64)[:, None], 3).ravel().tolist()
        [1, 5, 8]
    """
    n = len(sorted_keys)
    if samples < 1:
        raise ValueError(f"samples per rank must be >= 1, got {samples}")
    if n <= samples:
        return np.ascontiguousarray(sorted_keys)
    pos = ((2 * np.arange(samples, dtype=np.int64) + 1) * n) // (2 * samples)
    return np.ascontiguousarray(sorted_keys[pos])


def choose_splitters(sorted_samples, P: int, weights=None) -> np.ndarray:
    """P - 1 splitters at equal intervals of the sorted, gathered samples.

    Sample j stands for ``weights[j]`` keys (default 1) and sits in the middle of them, so about
    ``c_j = sum(weights[:j]) + weights[j] / 2`` keys lie below it. Splitter k (k = 1..P-1) is the
    sample whose ``c_j`` is nearest to ``k W / P`` (W the total weight; the upper one on a tie);
    with unit weights that is sample ``floor(k m / P)`` of m. Rank d then owns the keys
    ``splitter[d-1] <= key < splitter[d]``.
    Fewer distinct samples than ranks give repeated splitters, i.e. empty ranks, which is fine.

    Args:
        sorted_samples: uint64 (m, words), sorted (duplicates allowed).
        P: number of ranks (>= 1).
        weights: (m,) non-negative keys per sample, or None for equal weights.

    Returns:
        uint64 (P - 1, words), non-decreasing.

    Example:
        >>> s = np.arange(8, dtype=np.uint64)[:, None]
        >>> choose_splitters(s, 4).ravel().tolist()
        [2, 4, 6]
        >>> choose_splitters(s, 2, weights=[5, 1, 1, 1, 1, 1, 1, 1]).ravel().tolist()
        [2]
    """
    s = _as_keys(sorted_samples)
    if P < 1:
        raise ValueError(f"P must be >= 1, got {P}")
    m = len(s)
    if m > 1 and (_compare_rows(s[1:], s[:-1]) < 0).any():
        raise ValueError("choose_splitters needs sorted samples")
    wts = np.ones(m) if weights is None else np.asarray(weights, dtype=np.float64).reshape(-1)
    if wts.shape != (m,) or (wts < 0).any():
        raise ValueError(f"weights must be {m} non-negative numbers, got shape {wts.shape}")
    if m == 0 or P == 1:  # no keys anywhere, or one rank: any splitters will do
        return np.zeros((P - 1, s.shape[1]), dtype=np.uint64)
    centre = np.cumsum(wts) - wts / 2
    targets = np.arange(1, P) * (wts.sum() / P)
    upper = np.minimum(np.searchsorted(centre, targets, side="left"), m - 1)
    lower = np.maximum(upper - 1, 0)
    nearer_below = targets - centre[lower] < centre[upper] - targets
    return np.ascontiguousarray(s[np.where(nearer_below, lower, upper)])


def split_counts(sorted_keys, splitters) -> np.ndarray:
    """How many rows of a sorted array go to each of the P = len(splitters) + 1 ranks.

    Example:
        >>> k = np.array([1, 2, 4, 6, 7], dtype=np.uint64)[:, None]
        >>> split_counts(k, np.array([[2], [6]], dtype=np.uint64)).tolist()
        [1, 2, 2]
    """
    keys = _as_keys(sorted_keys)
    cuts = searchsorted_keys(keys, splitters, side="left") if len(splitters) else []
    return np.diff(np.concatenate([[0], cuts, [len(keys)]]).astype(np.int64))


def _shares(total: int, P: int) -> np.ndarray:
    """Exact equal shares: rank k owns global rows floor(k U / P) .. floor((k+1) U / P)."""
    return (np.arange(P + 1, dtype=np.int64) * total) // P


def _overlaps(lo: int, hi: int, bounds: np.ndarray) -> np.ndarray:
    """Rows of [lo, hi) that fall into each [bounds[k], bounds[k+1])."""
    return np.clip(np.minimum(hi, bounds[1:]) - np.maximum(lo, bounds[:-1]), 0, None)


def balance(counts) -> tuple[float, float]:
    """(max/min, coefficient of variation) of per-rank counts.

    max/min is 1 when every count is 0 and inf when only some are; CV is std / mean.

    Example:
        >>> balance([10, 10, 12, 8])
        (1.5, 0.1414213562373095)
    """
    c = np.asarray(counts, dtype=np.float64)
    hi, lo, mean = c.max(), c.min(), c.mean()
    ratio = 1.0 if hi == 0 else (float("inf") if lo == 0 else float(hi / lo))
    return ratio, (0.0 if mean == 0 else float(c.std() / mean))


# --- results -------------------------------------------------------------------------------------


@dataclass
class DedupMetrics:
    """What one de-dup call did, the same on every rank.

    Attributes:
        method: "regular-sampling" or "centralised".
        ranks: P.
        words: 64-bit words per key.
        items: keys in, over all ranks (duplicates included).
        unique: globally unique keys.
        received: int64 (P,) rows each rank received in the exchange (before merging).
        merged: int64 (P,) unique keys per rank after the merge (before rebalancing).
        counts: int64 (P,) unique keys each rank owns at the end (its slice).
        seconds: per phase, the slowest rank's time.
        total_seconds: wall time of the call on the slowest rank.
        samples_per_rank: S (0 for the centralised baseline).
        rebalanced: whether the rebalancing step ran.
        simulated: True for `simulate_partition` (times are compute only, communication free).
    """

    method: str
    ranks: int
    words: int
    items: int
    unique: int
    received: np.ndarray
    merged: np.ndarray
    counts: np.ndarray
    seconds: dict[str, float]
    total_seconds: float
    samples_per_rank: int = 0
    rebalanced: bool = False
    simulated: bool = False

    @property
    def max_min(self) -> float:
        """max(counts) / min(counts): 1 when there are no keys, inf when a rank owns none."""
        return balance(self.counts)[0]

    @property
    def cv(self) -> float:
        """Coefficient of variation of `counts` (population std / mean)."""
        return balance(self.counts)[1]

    @property
    def items_per_s(self) -> float:
        """Keys in (all ranks) per second of wall time."""
        return self.items / self.total_seconds if self.total_seconds > 0 else float("inf")

    @property
    def label(self) -> str:
        """Short name for tables: the method, '+rebalance', '(simulated)'."""
        name = self.method + ("+rebalance" if self.rebalanced else "")
        return name + (" (simulated)" if self.simulated else "")

    def as_dict(self) -> dict:
        """A flat dict (for a pandas row): the scalars, balance before rebalancing, phases."""
        row = {
            "method": self.label,
            "ranks": self.ranks,
            "words": self.words,
            "items": self.items,
            "unique": self.unique,
            "max_min": self.max_min,
            "cv": self.cv,
            "merged_max_min": balance(self.merged)[0],
            "merged_cv": balance(self.merged)[1],
            "received_max_min": balance(self.received)[0],
            "received_cv": balance(self.received)[1],
            "items_per_s": self.items_per_s,
            "seconds": self.total_seconds,
            "samples_per_rank": self.samples_per_rank,
        }
        row.update({f"t_{k}": v for k, v in self.seconds.items()})
        return row


@dataclass
class GlobalDedup:
    """One rank's part of a global de-dup.

    Attributes:
        unique: uint64 (u_r, words), this rank's slice of the global unique set, sorted.
        offsets: int64 (P + 1,): rank d owns global rows ``offsets[d]:offsets[d+1]``.
        owner: int64 (n,) the rank that owns each local input key.
        index: int64 (n,) each input key's row in its owner's `unique`.
        metrics: `DedupMetrics` of the call.

    Routing (used by `fetch`): this rank asked owner d for ``request_counts[d]`` distinct keys;
    the answers arrive in request order and ``request_inverse`` picks each input key's answer.
    It answers requester d with ``serve_counts[d]`` rows of `unique`, ``serve_index`` in order.
    """

    unique: np.ndarray
    offsets: np.ndarray
    owner: np.ndarray
    index: np.ndarray
    metrics: DedupMetrics
    request_inverse: np.ndarray = field(repr=False)
    request_counts: np.ndarray = field(repr=False)
    serve_index: np.ndarray = field(repr=False)
    serve_counts: np.ndarray = field(repr=False)

    @property
    def global_index(self) -> np.ndarray:
        """int64 (n,): each input key's row in the concatenation of all slices."""
        return self.offsets[self.owner] + self.index

    def fetch(self, values, comm: Comm) -> np.ndarray:
        """Route per-key values from the owners back to every local input key (collective).

        Args:
            values: one row per row of `unique` (e.g. psi on this rank's slice); a row must be a
                whole number of 8-byte words (float64, complex128, int64, ...).
            comm: the communicator of the de-dup call.

        Returns:
            One row per local input key: ``out[i] = values_on_owner[owner[i]][index[i]]``.
        """
        values = np.asarray(values)
        if values.shape[0] != len(self.unique):
            raise ValueError(
                f"fetch needs one value per key of this rank's slice ({len(self.unique)}), "
                f"got {values.shape[0]}"
            )
        recv, rc = comm.alltoallv(values[self.serve_index], self.serve_counts)
        if not np.array_equal(rc, self.request_counts):  # pragma: no cover - internal invariant
            raise RuntimeError("fetch: answers do not match the requests (different comm?)")
        return recv[self.request_inverse]


# --- distributed --------------------------------------------------------------------------------


def _common_words(arrays_words: list[tuple[int, int]]) -> int | None:
    """The words per key shared by the non-empty inputs; None when all are empty."""
    words = {w for n, w in arrays_words if n}
    if len(words) > 1:
        raise ValueError(f"inputs differ in words per key: {sorted(words)}")
    return words.pop() if words else None


def _check_words(keys, comm: Comm) -> tuple[np.ndarray, int]:
    """This rank's keys as (n, words), words agreed by all ranks (an empty input adopts it)."""
    arr = np.asarray(keys, dtype=np.uint64)
    if arr.size == 0:
        arr = arr.reshape(0, arr.shape[-1] if arr.ndim == 2 and arr.shape[-1] else 1)
    arr = _as_keys(arr)
    n, w = arr.shape
    # one collective: max of w and of -w over the ranks that hold keys
    hi, neg_lo = comm.allreduce(np.array([w, -w] if n else [0, -5], dtype=np.int64), op="max")
    if hi == 0:  # nobody holds a key
        return arr, w
    if hi != -neg_lo:
        raise ValueError(
            f"rank {comm.rank}: keys differ in words per key between ranks ({-neg_lo} and "
            f"{hi}); every rank must pass (n, words) with the same words"
        )
    return (arr if n else np.zeros((0, int(hi)), np.uint64)), int(hi)


class _Clock:
    """Phase timer. `sync` (e.g. a CUDA synchronise) runs before each reading, so that
    asynchronous device work is charged to the phase that queued it."""

    def __init__(self, sync=None):
        self.sync = sync
        self.start = self.last = self._now()

    def _now(self) -> float:
        if self.sync is not None:
            self.sync()
        return time.perf_counter()

    def lap(self) -> float:
        now = self._now()
        dt, self.last = now - self.last, now
        return dt

    def total(self) -> float:
        return self._now() - self.start


def _metrics(comm: Comm, w: int, stats: list[float], phases, **kw) -> DedupMetrics:
    """Allgather per-rank [items, received, merged, owned, total, *phase seconds]."""
    table = np.stack(comm.allgather(np.asarray(stats, dtype=np.float64)))
    counts = table[:, 3].astype(np.int64)
    return DedupMetrics(
        ranks=comm.size,
        words=w,
        items=int(table[:, 0].sum()),
        unique=int(counts.sum()),
        received=table[:, 1].astype(np.int64),
        merged=table[:, 2].astype(np.int64),
        counts=counts,
        seconds={p: float(table[:, 5 + k].max()) for k, p in enumerate(phases)},
        total_seconds=float(table[:, 4].max()),
        **kw,
    )


def _samples_with_weight(local_unique: np.ndarray, S: int) -> np.ndarray:
    """Regular samples plus one column holding the local unique count (for the weights)."""
    smp = regular_samples(local_unique, S)
    col = np.full((len(smp), 1), len(local_unique), dtype=np.uint64)
    return np.hstack([smp, col])


def _splitters_from(gathered: list[np.ndarray], P: int) -> np.ndarray:
    """Rank 0's step: sort the gathered samples and choose weighted splitters."""
    rows = np.concatenate(gathered)
    keys, n_local = rows[:, :-1], rows[:, -1].astype(np.float64)
    per_rank = np.concatenate([np.full(len(g), len(g)) for g in gathered]).astype(np.float64)
    order = np.lexsort(keys.T) if len(keys) else np.zeros(0, np.int64)
    weights = n_local / np.maximum(per_rank, 1)
    return choose_splitters(np.ascontiguousarray(keys[order]), P, weights[order])


def global_dedup(
    keys,
    comm: Comm | None = None,
    samples_per_rank: int = DEFAULT_SAMPLES_PER_RANK,
    rebalance: bool = True,
) -> GlobalDedup:
    """Regular-sampling global de-dup of the keys held by all ranks (collective).

    Args:
        keys: uint64 (n, words) on this rank (n may differ between ranks and may be 0; words
            must agree, an empty input may have any shape).
        comm: a `Comm` (default: a single-process `SerialComm`).
        samples_per_rank: S, regularly spaced samples per rank for the splitters.
        rebalance: move the surplus of the merged slices to exact equal shares (see the module
            docstring); False stops after the merge, as in the textbook scheme.

    Returns:
        `GlobalDedup`: this rank's sorted slice of the unique set, the owner and index of each
        input key, and the metrics. Concatenating the slices of ranks 0..P-1 gives
        ``cuscikit.sci.dedup.dedup`` of the union of all inputs.

    Example:
        >>> keys = np.array([[7], [3], [7], [1]], dtype=np.uint64)
        >>> r = global_dedup(keys)  # one rank
        >>> r.unique.ravel().tolist(), r.index.tolist()
        ([1, 3, 7], [2, 1, 2, 0])
    """
    comm = SerialComm() if comm is None else comm
    P, rank = comm.size, comm.rank
    clock = _Clock()
    arr, w = _check_words(keys, comm)
    clock.lap()

    # 1. local sort + unique
    local_unique, local_inverse, _ = dedup(arr)
    t_local = clock.lap()

    # 2-3. weighted samples -> rank 0 -> splitters -> everyone
    gathered = comm.gather(_samples_with_weight(local_unique, samples_per_rank), root=0)
    splitters = _splitters_from(gathered, P) if rank == 0 else None
    splitters = comm.bcast(splitters, root=0)
    send_counts = split_counts(local_unique, splitters)
    t_split = clock.lap()

    # 4. exchange
    received, recv_counts = comm.alltoallv(local_unique, send_counts)
    t_exchange = clock.lap()

    # 5. merge the sorted runs and drop duplicates
    merged, recv_inverse, _ = dedup(received)
    t_merge = clock.lap()

    if rebalance:
        # 5b. the slices are sorted and disjoint: cut them at exact equal shares
        pre = np.concatenate([[0], np.cumsum(np.stack(comm.allgather(np.int64(len(merged)))))])
        offsets = _shares(int(pre[-1]), P)
        unique, _ = comm.alltoallv(merged, _overlaps(pre[rank], pre[rank + 1], offsets))
        t_rebalance = clock.lap()
        # 6. global rows back to the senders; then each requester tells the final owners
        g, _ = comm.alltoallv(pre[rank] + recv_inverse, recv_counts)
        lu_owner = np.searchsorted(offsets, g, side="right") - 1
        lu_index = g - offsets[lu_owner]
        request_counts = np.bincount(lu_owner, minlength=P).astype(np.int64)
        serve_index, serve_counts = comm.alltoallv(lu_index, request_counts)
    else:
        unique, t_rebalance = merged, 0.0
        # 6. each received key's row in the owner's slice goes back to its sender
        lu_index, _ = comm.alltoallv(recv_inverse, recv_counts)
        lu_owner = np.repeat(np.arange(P, dtype=np.int64), send_counts)
        request_counts, serve_index, serve_counts = send_counts, recv_inverse, recv_counts
        offsets = None
    t_route = clock.lap()

    stats = [len(arr), len(received), len(merged), len(unique), clock.total()]
    stats += [t_local, t_split, t_exchange, t_merge, t_rebalance, t_route]
    metrics = _metrics(
        comm,
        w,
        stats,
        REGULAR_PHASES,
        method="regular-sampling",
        samples_per_rank=samples_per_rank,
        rebalanced=rebalance,
    )
    if offsets is None:
        offsets = np.concatenate([[0], np.cumsum(metrics.counts)]).astype(np.int64)
    return GlobalDedup(
        unique=unique,
        offsets=offsets,
        owner=lu_owner[local_inverse],
        index=lu_index[local_inverse],
        metrics=metrics,
        request_inverse=local_inverse,
        request_counts=request_counts,
        serve_index=serve_index,
        serve_counts=serve_counts,
    )


def centralised_dedup(keys, comm: Comm | None = None) -> GlobalDedup:
    """The baseline: gather every key on rank 0, unique there, scatter equal slices back.

    Same arguments and result as `global_dedup` (the slices are equal shares by construction;
    rank 0 alone sorts everything).
    """
    comm = SerialComm() if comm is None else comm
    P = comm.size
    clock = _Clock()
    arr, w = _check_words(keys, comm)
    clock.lap()

    parts = comm.gather(arr, root=0)
    t_gather = clock.lap()
    rows = np.zeros(P, np.int64)
    if comm.rank == 0:
        everything, inverse, _ = dedup(np.concatenate(parts))
        offsets = _shares(len(everything), P)
        rows = np.array([len(p) for p in parts], dtype=np.int64)
    else:
        everything, inverse, offsets = np.zeros((0, w), np.uint64), np.zeros(0, np.int64), None
    t_unique = clock.lap()

    offsets = comm.bcast(offsets, root=0)
    scatter_counts = np.diff(offsets) if comm.rank == 0 else np.zeros(P, np.int64)
    unique, _ = comm.alltoallv(everything, scatter_counts)
    g, _ = comm.alltoallv(inverse, rows)  # each input key's global row
    t_scatter = clock.lap()

    # routing for fetch: ask each owner once per distinct key
    wanted, request_inverse = np.unique(g, return_inverse=True)
    owner_of = np.searchsorted(offsets, wanted, side="right") - 1
    request_counts = np.bincount(owner_of, minlength=P).astype(np.int64)
    serve_index, serve_counts = comm.alltoallv(wanted - offsets[owner_of], request_counts)
    owner = np.searchsorted(offsets, g, side="right") - 1
    t_route = clock.lap()

    received = int(rows.sum())
    stats = [len(arr), received, len(unique), len(unique), clock.total()]
    stats += [t_gather, t_unique, t_scatter, t_route]
    metrics = _metrics(comm, w, stats, CENTRAL_PHASES, method="centralised")
    return GlobalDedup(
        unique=unique,
        offsets=offsets,
        owner=owner.astype(np.int64),
        index=(g - offsets[owner]).astype(np.int64),
        metrics=metrics,
        request_inverse=request_inverse.astype(np.int64).reshape(-1),
        request_counts=request_counts,
        serve_index=serve_index.astype(np.int64),
        serve_counts=serve_counts,
    )


# --- simulation ----------------------------------------------------------------------------------


def simulate_partition(
    keys,
    P: int | None = None,
    samples_per_rank: int = DEFAULT_SAMPLES_PER_RANK,
    rebalance: bool = True,
) -> list[GlobalDedup]:
    """Run the regular-sampling de-dup on P slices inside one process (no communicator).

    The steps of `global_dedup`, with every exchange done by slicing. Phase times are the
    slowest simulated rank's compute time (communication is free), so ``items_per_s`` is an
    upper bound for P real ranks; the balance metrics are what P real ranks would see.

    Args:
        keys: a sequence of P uint64 (n_r, words) arrays (one per simulated rank), or one array
            split into P near-equal contiguous slices.
        P: number of simulated ranks (required when `keys` is one array).
        samples_per_rank: S.
        rebalance: as in `global_dedup`.

    Returns:
        One `GlobalDedup` per simulated rank (``fetch`` needs a real communicator; use
        ``owner``/``index`` instead).

    Example:
        >>> parts = simulate_partition(np.arange(9, dtype=np.uint64)[::-1, None], P=3)
        >>> [p.unique.ravel().tolist() for p in parts]
        [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    """
    if isinstance(keys, np.ndarray):
        if P is None:
            raise ValueError("pass P when keys is one array")
        if P < 1:
            raise ValueError(f"P must be >= 1, got {P}")
        slices = np.array_split(_as_keys(keys), P)
    else:
        slices = [np.asarray(k, dtype=np.uint64) for k in keys]
        if P is not None and P != len(slices):
            raise ValueError(f"P={P} but {len(slices)} slices were given")
        P = len(slices)
        if P < 1:
            raise ValueError("simulate_partition needs at least one slice")
        w = _common_words([(k.size, k.shape[-1] if k.ndim == 2 else 1) for k in slices])
        if w is None:  # nothing anywhere: keep the words of the empty (0, words) arrays
            w = max([k.shape[1] for k in slices if k.ndim == 2 and k.shape[1]], default=1)
        slices = [_as_keys(k) if k.size else np.zeros((0, w), np.uint64) for k in slices]
    w = slices[0].shape[1]
    t = {p: np.zeros(P) for p in REGULAR_PHASES}

    def timed(phase: str, r: int, fn, *args):
        t0 = time.perf_counter()
        out = fn(*args)
        t[phase][r] += time.perf_counter() - t0
        return out

    local = [timed("local", r, dedup, k)[:2] for r, k in enumerate(slices)]
    gathered = [
        timed("splitters", r, _samples_with_weight, lu, samples_per_rank)
        for r, (lu, _) in enumerate(local)
    ]
    splitters = timed("splitters", 0, _splitters_from, gathered, P)
    send = [timed("splitters", r, split_counts, lu, splitters) for r, (lu, _) in enumerate(local)]
    starts = [np.concatenate([[0], np.cumsum(c)]) for c in send]

    merged, recv_inverse, recv_counts = [], [], []
    for d in range(P):
        t0 = time.perf_counter()
        runs = [lu[s[d] : s[d + 1]] for (lu, _), s in zip(local, starts, strict=True)]
        received = np.concatenate(runs)
        t["exchange"][d] += time.perf_counter() - t0
        u, rinv, _ = timed("merge", d, dedup, received)
        merged.append(u)
        recv_inverse.append(rinv)
        recv_counts.append(np.array([len(x) for x in runs], dtype=np.int64))
    received_rows = np.array([len(x) for x in recv_inverse], dtype=np.int64)
    merged_rows = np.array([len(u) for u in merged], dtype=np.int64)
    pre = np.concatenate([[0], np.cumsum(merged_rows)]).astype(np.int64)
    rstarts = [np.concatenate([[0], np.cumsum(rc)]) for rc in recv_counts]

    # each sender's local unique keys -> row in the pre-rebalance concatenation
    g_local = []
    for r in range(P):
        t0 = time.perf_counter()
        g_local.append(
            np.concatenate(
                [pre[d] + recv_inverse[d][rstarts[d][r] : rstarts[d][r + 1]] for d in range(P)]
            ).astype(np.int64)
        )
        t["route"][r] += time.perf_counter() - t0

    if rebalance:
        offsets = _shares(int(pre[-1]), P)
        everything = np.concatenate(merged)
        unique = []
        for d in range(P):
            t0 = time.perf_counter()
            unique.append(np.ascontiguousarray(everything[offsets[d] : offsets[d + 1]]))
            t["rebalance"][d] += time.perf_counter() - t0
    else:
        offsets, unique = pre, merged

    lu_owner = [np.searchsorted(offsets, g, side="right") - 1 for g in g_local]
    lu_index = [g - offsets[o] for g, o in zip(g_local, lu_owner, strict=True)]
    request_counts = [np.bincount(o, minlength=P).astype(np.int64) for o in lu_owner]
    # lu_owner is non-decreasing (sorted keys), so each requester's requests split by counts
    pieces = [np.split(i, np.cumsum(c)[:-1]) for i, c in zip(lu_index, request_counts, strict=True)]
    serve_index, serve_counts = [], []
    for d in range(P):
        t0 = time.perf_counter()
        serve_index.append(np.concatenate([p[d] for p in pieces]).astype(np.int64))
        serve_counts.append(np.array([rc[d] for rc in request_counts], dtype=np.int64))
        t["route"][d] += time.perf_counter() - t0

    seconds = {p: float(v.max()) for p, v in t.items()}
    metrics = DedupMetrics(
        method="regular-sampling",
        ranks=P,
        words=w,
        items=int(sum(len(k) for k in slices)),
        unique=int(pre[-1]),
        received=received_rows,
        merged=merged_rows,
        counts=np.array([len(u) for u in unique], dtype=np.int64),
        seconds=seconds,
        total_seconds=float(sum(seconds.values())),
        samples_per_rank=samples_per_rank,
        rebalanced=rebalance,
        simulated=True,
    )
    return [
        GlobalDedup(
            unique=unique[r],
            offsets=offsets,
            owner=lu_owner[r][inv],
            index=lu_index[r][inv],
            metrics=metrics,
            request_inverse=inv,
            request_counts=request_counts[r],
            serve_index=serve_index[r],
            serve_counts=serve_counts[r],
        )
        for r, (_, inv) in enumerate(local)
    ]
