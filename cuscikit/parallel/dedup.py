"""Global de-duplication of keys spread over ranks: regular-sampling sort-based de-dup.

The algorithm of "A Fully GPU-Accelerated Framework for High-Performance Configuration
Interaction Selection with Neural Network Quantum States" (section 4.1), written once against
the communicator interface (`cuscikit.parallel.comm`) and the key primitives of
`cuscikit.backends.keys`, so one code path serves host numpy arrays (MPI, gloo, threads) and
torch tensors on their device (NCCL between GPUs: the keys never leave them):

1. each rank sorts its keys and drops local duplicates (`sort_unique`, with the inverse index);
2. takes ``S`` regularly spaced samples of its sorted unique keys (`regular_samples`);
3. the samples of all ranks are gathered (``allgather``: P * S small rows) and every rank picks
   the same ``P - 1`` splitters at equal intervals (`choose_splitters`);
4. each rank binary-searches the splitters in its sorted keys (`split_counts`), so that rank
   ``d`` receives the keys ``splitter[d-1] <= key < splitter[d]``;
5. ``alltoallv``; each rank merges the sorted runs it received and drops duplicates (the runs
   are concatenated and radix-sorted, which costs the same as a k-way merge and yields the
   inverse index needed for the routing);
6. each key's row in its owner's slice goes back to its sender, so that values computed on the
   owners (psi) reach every input key (`GlobalDedup.fetch`).

Two additions to the textbook scheme, measured in ``benchmarks/dedup_balance.py`` and described
in ``docs/dedup.md``:

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

The slices, concatenated over ranks, are exactly the single-process `sort_unique` of the union
of the inputs. `centralised_dedup` is the baseline (gather to rank 0, unique there, scatter
back); `simulate_partition` runs `global_dedup` itself on P threads of this process
(`ThreadComm`), for balance studies at P = 32, 64, ... on one machine.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from cuscikit.backends.arrays import index_add, zeros
from cuscikit.backends.keys import (
    as_keys,
    is_tensor,
    searchsorted,
    sort_unique,
)
from cuscikit.parallel.comm import Comm, SerialComm, run_ranks

__all__ = [
    "DEFAULT_SAMPLES_PER_RANK",
    "DedupMetrics",
    "GlobalDedup",
    "balance",
    "centralised_dedup",
    "choose_splitters",
    "global_dedup",
    "regular_samples",
    "simulate_partition",
    "split_counts",
]

DEFAULT_SAMPLES_PER_RANK = 1024
"""S, samples per rank. The splitters fix what each rank receives to within about one sample
interval of every rank, so the received balance improves with S until runs of equal keys limit
it: on the bundled coupled sets at P = 64 (benchmarks/dedup_balance.py) S = 64, 256, 1024, 4096
give received max/min 2.08, 1.15, 1.05, 1.05 (CV 0.15, 0.024, 0.009, 0.009). The gather is
P * S keys. What each rank owns after the merge is set by cross-rank duplicates, not by S; the
rebalancing step makes it exact."""

REGULAR_PHASES = ("local", "splitters", "exchange", "merge", "rebalance", "route")
CENTRAL_PHASES = ("gather", "unique", "scatter", "route")


# --- pure pieces (host arrays) -------------------------------------------------------------------


def regular_samples(sorted_keys, samples: int):
    """`samples` regularly spaced rows of a sorted array (all rows when it has fewer); numpy or
    torch.

    Sample i is row ``floor((2 i + 1) n / (2 S))``: the middle of the i-th of S equal intervals.

    Example:
        >>> regular_samples(np.arange(10, dtype=np.uint64)[:, None], 3).ravel().tolist()
        [1, 5, 8]
    """
    n = len(sorted_keys)
    if samples < 1:
        raise ValueError(f"samples per rank must be >= 1, got {samples}")
    if n <= samples:
        return sorted_keys
    pos = ((2 * np.arange(samples, dtype=np.int64) + 1) * n) // (2 * samples)
    if is_tensor(sorted_keys):
        import torch

        return sorted_keys[torch.from_numpy(pos).to(sorted_keys.device)]
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
    s = as_keys(sorted_samples)
    if P < 1:
        raise ValueError(f"P must be >= 1, got {P}")
    m = len(s)
    if m > 1 and not np.array_equal(s[np.lexsort(s.T)], s):
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
    """How many rows of a sorted array go to each of the P = len(splitters) + 1 ranks (numpy
    or torch keys; numpy splitters).

    Example:
        >>> k = np.array([1, 2, 4, 6, 7], dtype=np.uint64)[:, None]
        >>> split_counts(k, np.array([[2], [6]], dtype=np.uint64)).tolist()
        [1, 2, 2]
    """
    n = len(sorted_keys)
    if len(splitters) == 0:
        return np.array([n], dtype=np.int64)
    if is_tensor(sorted_keys):
        from cuscikit.backends.keys import to_device

        cuts = searchsorted(sorted_keys, to_device(splitters, sorted_keys.device), side="left")
        cuts = cuts.cpu().numpy()
    else:
        cuts = searchsorted(as_keys(sorted_keys), splitters, side="left")
    return np.diff(np.concatenate([[0], cuts, [n]]).astype(np.int64))


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
        simulated: True for `simulate_partition` (ranks are threads of one process).
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


def _host(a) -> np.ndarray:
    return a.detach().cpu().numpy() if is_tensor(a) else np.asarray(a)


@dataclass
class GlobalDedup:
    """One rank's part of a global de-dup; arrays are of the input's kind (numpy, or torch
    tensors on the keys' device), counts and offsets are numpy.

    Attributes:
        unique: (u_r, words), this rank's slice of the global unique set, sorted.
        offsets: int64 (P + 1,): rank d owns global rows ``offsets[d]:offsets[d+1]``.
        owner: int64 (n,) the rank that owns each local input key.
        index: int64 (n,) each input key's row in its owner's `unique`.
        metrics: `DedupMetrics` of the call.

    Routing (used by `fetch`): this rank asked owner d for ``request_counts[d]`` distinct keys;
    the answers arrive in request order and ``request_inverse`` picks each input key's answer.
    It answers requester d with ``serve_counts[d]`` rows of `unique`, ``serve_index`` in order.

    ``identity`` marks the one-rank result of keys that were already sorted and unique: the
    input is the slice, so `owner`, `index` and the routing arrays are None (not built) and
    `fetch` returns the values themselves.
    """

    unique: object
    offsets: np.ndarray
    owner: object
    index: object
    metrics: DedupMetrics
    request_inverse: object = field(repr=False)
    request_counts: np.ndarray = field(repr=False)
    serve_index: object = field(repr=False)
    serve_counts: np.ndarray = field(repr=False)
    identity: bool = False

    @property
    def global_index(self):
        """int64 (n,): each input key's row in the concatenation of all slices."""
        if self.identity:
            return self._on(self.unique, np.arange(len(self.unique), dtype=np.int64))
        if is_tensor(self.owner):
            import torch

            return torch.as_tensor(self.offsets, device=self.owner.device)[self.owner] + self.index
        return self.offsets[self.owner] + self.index

    def fetch(self, values, comm: Comm | None = None):
        """Route per-key values from the owners back to every local input key (collective).

        Args:
            values: one row per row of `unique` (e.g. psi on this rank's slice), numpy or a
                tensor (any dtype: complex travels as pairs of reals).
            comm: the communicator of the de-dup call.

        Returns:
            One row per local input key: ``out[i] = values_on_owner[owner[i]][index[i]]``.
        """
        comm = SerialComm() if comm is None else comm
        if values.shape[0] != len(self.unique):
            raise ValueError(
                f"fetch needs one value per key of this rank's slice ({len(self.unique)}), "
                f"got {values.shape[0]}"
            )
        if self.identity:
            return values
        if comm.size == 1:
            return values[self._on(values, self.index)]
        recv, rc = comm.alltoallv(values[self._on(values, self.serve_index)], self.serve_counts)
        if not np.array_equal(np.asarray(rc), self.request_counts):  # pragma: no cover
            raise RuntimeError("fetch: answers do not match the requests (different comm?)")
        return recv[self._on(recv, self.request_inverse)]

    def reduce(self, values, comm: Comm | None = None):
        """The reverse of `fetch`: sum per-input-key values into their owners' rows
        (collective). Input keys that are the same key, here or on other ranks, add up.

        Args:
            values: one row per local input key (1-D, numpy or a tensor; real or complex).
            comm: the communicator of the de-dup call.

        Returns:
            One row per row of this rank's `unique`: the sum over every rank's input keys
            equal to it.

        Example:
            >>> r = global_dedup(np.array([[7], [3], [7]], dtype=np.uint64))
            >>> r.reduce(np.array([1.0, 10.0, 100.0])).tolist()
            [10.0, 101.0]
        """
        comm = SerialComm() if comm is None else comm
        if values.shape[0] != (len(self.unique) if self.identity else len(self.index)):
            raise ValueError("reduce needs one value per input key")
        if self.identity:
            return values
        n_requests = int(self.request_counts.sum())
        requests = index_add(
            zeros(values, n_requests), self._on(values, self.request_inverse), values
        )
        if comm.size == 1:
            sent, rc = requests, self.serve_counts
        else:
            sent, rc = comm.alltoallv(requests, self.request_counts)
            if not np.array_equal(np.asarray(rc), self.serve_counts):  # pragma: no cover
                raise RuntimeError("reduce: contributions do not match the routing")
        return index_add(zeros(values, len(self.unique)), self._on(sent, self.serve_index), sent)

    def global_rows(self, positions):
        """Global rows (in the concatenation of all slices) of input keys at `positions`."""
        if self.identity:
            return positions
        return self.global_index[self._on(self.owner, positions)]

    @staticmethod
    def _on(like, index):
        """`index` where `like` lives (a tensor's device, or numpy)."""
        if is_tensor(like):
            import torch

            return torch.as_tensor(index).to(like.device)
        return _host(index)

    def as_numpy(self) -> GlobalDedup:
        """The same result with host arrays (uint64 keys)."""
        from cuscikit.backends.keys import to_numpy

        def host(a):
            return None if a is None else _host(a)

        return GlobalDedup(
            unique=to_numpy(self.unique),
            offsets=self.offsets,
            owner=host(self.owner),
            index=host(self.index),
            metrics=self.metrics,
            request_inverse=host(self.request_inverse),
            request_counts=self.request_counts,
            serve_index=host(self.serve_index),
            serve_counts=self.serve_counts,
            identity=self.identity,
        )


# --- distributed --------------------------------------------------------------------------------


class _Ops:
    """The few array operations the algorithm needs, for numpy or for torch on one device."""

    def __init__(self, like):
        self.torch = is_tensor(like)
        if self.torch:
            import torch

            self.t, self.device = torch, like.device

    def keys(self, keys):
        if self.torch:
            from cuscikit.backends.keys import as_tensor_keys

            return as_tensor_keys(keys)
        return as_keys(keys)

    def empty_keys(self, w: int):
        if self.torch:
            return self.t.zeros((0, w), dtype=self.t.int64, device=self.device)
        return np.zeros((0, w), np.uint64)

    def vector(self, a):
        """An int64 host vector as this kind."""
        a = np.asarray(a, dtype=np.int64)
        return self.t.from_numpy(a).to(self.device) if self.torch else a

    def repeat(self, counts):
        ranks = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
        return self.vector(ranks)

    def owner_of(self, offsets: np.ndarray, g):
        if self.torch:
            off = self.t.as_tensor(offsets, device=self.device)
            return self.t.searchsorted(off, g, right=True) - 1, off
        return np.searchsorted(offsets, g, side="right") - 1, offsets

    def bincount(self, x, P: int) -> np.ndarray:
        if self.torch:
            return self.t.bincount(x, minlength=P).cpu().numpy().astype(np.int64)
        return np.bincount(x, minlength=P).astype(np.int64)

    def sync(self):
        if self.torch and self.device.type == "cuda":
            return lambda: self.t.cuda.synchronize(self.device)
        return None


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


def _agree_words(keys, comm: Comm, ops: _Ops):
    """This rank's keys as (n, words), words agreed by all ranks (an empty input adopts them)."""
    n = int(keys.shape[0]) if keys.ndim else 0
    if n == 0:
        w = keys.shape[-1] if keys.ndim == 2 and keys.shape[-1] else 1
        keys = ops.empty_keys(w)
    keys = ops.keys(keys)
    n, w = keys.shape
    # one collective: max of w and of -w over the ranks that hold keys
    hi, neg_lo = comm.allreduce(np.array([w, -w] if n else [0, -5], dtype=np.int64), op="max")
    if hi == 0:  # nobody holds a key
        return keys
    if hi != -neg_lo:
        raise ValueError(
            f"rank {comm.rank}: keys differ in words per key between ranks ({-neg_lo} and "
            f"{hi}); every rank must pass (n, words) with the same words"
        )
    return keys if n else ops.empty_keys(int(hi))


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


def _splitters_from(gathered: list[np.ndarray], P: int) -> np.ndarray:
    """Sort the gathered samples (last column: the sender's unique count) and choose weighted
    splitters; every rank computes the same ones."""
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
    end_bit: int | None = None,
    impl: str = "auto",
    sorted_unique: bool = False,
) -> GlobalDedup:
    """Regular-sampling global de-dup of the keys held by all ranks (collective).

    Args:
        keys: this rank's keys: uint64 (n, words) numpy, or an int64 torch tensor on any device
            (n may differ between ranks and may be 0; words must agree, an empty input adopts
            them). Tensors stay on their device; with a `TorchComm` on NCCL the exchanges run
            GPU to GPU.
        comm: a `Comm` (default: a single-process `SerialComm`).
        samples_per_rank: S, regularly spaced samples per rank for the splitters.
        rebalance: move the surplus of the merged slices to exact equal shares (see the module
            docstring); False stops after the merge, as in the textbook scheme.
        end_bit: bits that matter per key for the GPU radix sort (e.g. 2 * norb).
        impl: local sort engine, see `cuscikit.backends.keys.sort_unique`.
        sorted_unique: the caller guarantees that this rank's keys are already sorted and
            unique (the local sort is skipped).

    Returns:
        `GlobalDedup`: this rank's sorted slice of the unique set, the owner and index of each
        input key, and the metrics. Concatenating the slices of ranks 0..P-1 gives
        `sort_unique` of the union of all inputs.

    Example:
        >>> keys = np.array([[7], [3], [7], [1]], dtype=np.uint64)
        >>> r = global_dedup(keys)  # one rank
        >>> r.unique.ravel().tolist(), r.index.tolist()
        ([1, 3, 7], [2, 1, 2, 0])
    """
    comm = SerialComm() if comm is None else comm
    P, rank = comm.size, comm.rank
    if not is_tensor(keys):
        keys = np.asarray(keys, dtype=np.uint64)
    ops = _Ops(keys)
    clock = _Clock(ops.sync())
    keys = _agree_words(keys, comm, ops)
    w = keys.shape[1]
    clock.lap()

    if P == 1 and sorted_unique:  # the input is the slice: nothing to sort or route
        u = len(keys)
        stats = [u, u, u, u, clock.total(), 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
        metrics = _metrics(
            comm,
            w,
            stats,
            REGULAR_PHASES,
            method="regular-sampling",
            samples_per_rank=samples_per_rank,
            rebalanced=rebalance,
        )
        return GlobalDedup(
            unique=keys,
            offsets=np.array([0, u], dtype=np.int64),
            owner=None,
            index=None,
            metrics=metrics,
            request_inverse=None,
            request_counts=np.array([u], np.int64),
            serve_index=None,
            serve_counts=np.array([u], np.int64),
            identity=True,
        )

    # 1. local sort + unique
    if sorted_unique:
        local_unique, local_inverse = keys, ops.vector(np.arange(len(keys)))
    else:
        local_unique, local_inverse = sort_unique(keys, end_bit=end_bit, impl=impl)
    t_local = clock.lap()

    if P == 1:  # the same result without exchanges: this rank owns everything
        u = len(local_unique)
        stats = [len(keys), u, u, u, clock.total(), t_local, 0.0, 0.0, 0.0, 0.0, 0.0]
        metrics = _metrics(
            comm,
            w,
            stats,
            REGULAR_PHASES,
            method="regular-sampling",
            samples_per_rank=samples_per_rank,
            rebalanced=rebalance,
        )
        return GlobalDedup(
            unique=local_unique,
            offsets=np.array([0, u], dtype=np.int64),
            owner=ops.vector(np.zeros(len(keys), np.int64)),
            index=local_inverse,
            metrics=metrics,
            request_inverse=local_inverse,
            request_counts=np.array([u], np.int64),
            serve_index=ops.vector(np.arange(u)),
            serve_counts=np.array([u], np.int64),
        )

    # 2-3. weighted samples (host) -> every rank -> the same splitters everywhere
    smp = _host(regular_samples(local_unique, samples_per_rank)).view(np.uint64)
    mine = np.hstack([smp, np.full((len(smp), 1), len(local_unique), dtype=np.uint64)])
    splitters = _splitters_from(comm.allgather(mine), P)
    send_counts = split_counts(local_unique, splitters)
    t_split = clock.lap()

    # 4. exchange
    received, recv_counts = comm.alltoallv(local_unique, send_counts)
    recv_counts = np.asarray(recv_counts, np.int64)
    t_exchange = clock.lap()

    # 5. merge the sorted runs and drop duplicates
    merged, recv_inverse = sort_unique(received, end_bit=end_bit, impl=impl)
    t_merge = clock.lap()

    if rebalance:
        # 5b. the slices are sorted and disjoint: cut them at exact equal shares
        sizes = np.concatenate(comm.allgather(np.array([len(merged)], np.int64)))
        pre = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        offsets = _shares(int(pre[-1]), P)
        unique, _ = comm.alltoallv(merged, _overlaps(pre[rank], pre[rank + 1], offsets))
        t_rebalance = clock.lap()
        # 6. global rows back to the senders; then each requester tells the final owners
        g, _ = comm.alltoallv(recv_inverse + int(pre[rank]), recv_counts)
        lu_owner, off = ops.owner_of(offsets, g)
        lu_index = g - off[lu_owner]
        request_counts = ops.bincount(lu_owner, P)
        serve_index, serve_counts = comm.alltoallv(lu_index, request_counts)
    else:
        unique, t_rebalance, offsets = merged, 0.0, None
        # 6. each received key's row in the owner's slice goes back to its sender
        lu_index, _ = comm.alltoallv(recv_inverse, recv_counts)
        lu_owner = ops.repeat(send_counts)
        request_counts, serve_index, serve_counts = send_counts, recv_inverse, recv_counts
    t_route = clock.lap()

    stats = [len(keys), len(received), len(merged), len(unique), clock.total()]
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
        request_counts=np.asarray(request_counts, np.int64),
        serve_index=serve_index,
        serve_counts=np.asarray(serve_counts, np.int64),
    )


def centralised_dedup(keys, comm: Comm | None = None) -> GlobalDedup:
    """The baseline: gather every key on rank 0, unique there, scatter equal slices back.

    Same arguments and result as `global_dedup` for host keys (the slices are equal shares by
    construction; rank 0 alone sorts everything).
    """
    comm = SerialComm() if comm is None else comm
    P = comm.size
    ops = _Ops(np.zeros(0))
    clock = _Clock()
    arr = _agree_words(np.asarray(keys, dtype=np.uint64), comm, ops)
    w = arr.shape[1]
    clock.lap()

    parts = comm.gather(arr, root=0)
    t_gather = clock.lap()
    rows = np.zeros(P, np.int64)
    if comm.rank == 0:
        everything, inverse = sort_unique(np.concatenate(parts))
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
        serve_counts=np.asarray(serve_counts, np.int64),
    )


# --- simulation ----------------------------------------------------------------------------------


def simulate_partition(
    keys,
    P: int | None = None,
    samples_per_rank: int = DEFAULT_SAMPLES_PER_RANK,
    rebalance: bool = True,
    timeout: float = 600.0,
) -> list[GlobalDedup]:
    """`global_dedup` on P ranks that are threads of this process (`ThreadComm`).

    The same code as a real run; the exchanges are in-memory copies, so the balance metrics are
    what P real ranks would see, and the times are those of P threads sharing this machine's
    cores (an upper bound on compute, no network).

    Args:
        keys: a sequence of P uint64 (n_r, words) arrays (one per simulated rank), or one array
            split into P near-equal contiguous slices.
        P: number of simulated ranks (required when `keys` is one array).
        samples_per_rank: S.
        rebalance: as in `global_dedup`.
        timeout: seconds a simulated rank may wait in a collective.

    Returns:
        One `GlobalDedup` per simulated rank (``fetch`` needs the threads' communicator; use
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
        slices = np.array_split(as_keys(keys), P)
    else:
        slices = [np.asarray(k, dtype=np.uint64) for k in keys]
        if P is not None and P != len(slices):
            raise ValueError(f"P={P} but {len(slices)} slices were given")
        P = len(slices)
        if P < 1:
            raise ValueError("simulate_partition needs at least one slice")
        words = {k.shape[-1] if k.ndim == 2 else 1 for k in slices if k.size}
        if len(words) > 1:
            raise ValueError(f"inputs differ in words per key: {sorted(words)}")
    results = run_ranks(
        P,
        lambda comm: global_dedup(slices[comm.rank], comm, samples_per_rank, rebalance),
        timeout=timeout,
    )
    for r in results:
        r.metrics.simulated = True
    return results
