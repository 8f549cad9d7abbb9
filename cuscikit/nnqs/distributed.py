"""The collective pieces of a multi-rank NNQS-SCI iteration (the rank bookkeeping around the
global de-dup; ``docs/nnqs_sci.md``).

One model replica and one copy of S per rank; the sources of S are split into contiguous
shares (`source_share`), the coupled sets are de-duplicated across ranks
(`cuscikit.parallel.global_dedup`), and these helpers keep the replicas identical:

- `sync_replicas`: at start-up, check that every rank was built with the same molecule and
  settings, then broadcast rank 0's model and S (as DistributedDataParallel does);
- `gather_selection`: every rank's top-K over its slice of U, merged on every rank with the
  single-rank rule (larger score first, then the smaller global row of U), and the rows of U
  and scores of all of S (for the max_space cap), in one collective (on one rank it is the
  identity on the local top-K);
- `allreduce_gradients`: the loss gradient summed over ranks, so that every replica takes the
  identical AdamW step;
- `all_rows`: every rank's rows of a per-source array, concatenated in rank order (S order) on
  every rank (the selected-CI teacher's psi on S and H_SS gathers).

All functions are collective: every rank calls them in the same order.
"""

from __future__ import annotations

import hashlib
import json

import numpy as np
import torch

from cuscikit.nnqs.topk import RunningTopK


def source_share(n: int, size: int, rank: int) -> tuple[int, int]:
    """Rows ``lo:hi`` of S whose coupled sets rank `rank` of `size` generates.

    Contiguous near-equal shares (``floor(r n / P)``); ranks beyond n get none.

    Example:
        >>> [source_share(5, 3, r) for r in range(3)]
        [(0, 1), (1, 3), (3, 5)]
        >>> source_share(1, 4, 2)
        (0, 0)
    """
    return (rank * n) // size, ((rank + 1) * n) // size


def all_rows(x, comm):
    """Every rank's rows of `x` (numpy, or a torch tensor kept on its device), concatenated in
    rank order on every rank: with the contiguous shares of `source_share`, an array over this
    rank's sources becomes the array over all of S. On one rank (or `comm` None), `x` itself.

    Example (three thread ranks, each with its share of five rows):
        >>> from cuscikit.parallel import run_ranks
        >>> run_ranks(3, lambda c: all_rows(np.arange(*source_share(5, 3, c.rank)), c).tolist())
        [[0, 1, 2, 3, 4], [0, 1, 2, 3, 4], [0, 1, 2, 3, 4]]
    """
    if comm is None or comm.size == 1:
        return x
    if torch.is_tensor(x):
        parts = comm.allgather(x.detach().cpu().numpy())
        return torch.from_numpy(np.concatenate(parts)).to(x.device)
    return np.concatenate(comm.allgather(np.asarray(x)))


def _digest(text: str) -> np.ndarray:
    return np.frombuffer(hashlib.sha256(text.encode()).digest(), dtype=np.uint64).copy()


def sync_replicas(runner, comm) -> None:
    """Check that all ranks run the same problem, then give every rank rank 0's model and S.

    Raises:
        ValueError (on every rank): the ranks were built for different molecules or with
            different settings (topk, estimator, max_space, eps).
    """
    from cuscikit.nnqs.checkpoint import molecule_fingerprint

    settings = json.dumps(
        [
            runner.topk,
            runner.estimator,
            runner.space_cap,
            runner.eps,
            type(runner.ansatz).__name__,
            runner.growth_rule,
        ]
    )
    mine = np.concatenate([_digest(molecule_fingerprint(runner.molecule)), _digest(settings)])
    table = np.stack(comm.allgather(mine))
    for what, cols in (("molecule", slice(0, 4)), ("settings", slice(4, 8))):
        differ = [r for r in range(comm.size) if not np.array_equal(table[r, cols], table[0, cols])]
        if differ:
            raise ValueError(
                f"rank {comm.rank} of {comm.size}: ranks {differ} were built with another "
                f"{what} than rank 0; every rank must build the Runner with the same molecule, "
                "topk, estimator, max_space and eps"
            )
    # the model as one buffer of raw bytes (one collective, exact for every dtype)
    tensors = list(runner.ansatz.state_dict().values())
    arrays = [t.detach().cpu().contiguous().numpy() for t in tensors]
    sizes = [a.nbytes for a in arrays]
    mine = np.concatenate([a.reshape(-1).view(np.uint8) for a in arrays] or [np.zeros(0, np.uint8)])
    got = comm.bcast(mine if comm.rank == 0 else None, root=0)
    if got.size != mine.size:
        raise ValueError(
            f"rank {comm.rank}: the ansatz has {mine.size} bytes of parameters, rank 0's "
            f"{got.size}; build the same ansatz on every rank"
        )
    with torch.no_grad():
        pos = 0
        for t, a, n in zip(tensors, arrays, sizes, strict=True):
            chunk = got[pos : pos + n].view(a.dtype).reshape(a.shape)
            t.copy_(torch.from_numpy(chunk.copy()))
            pos += n
    configs = comm.bcast(runner.space.configs if comm.rank == 0 else None, root=0)
    if not np.array_equal(configs, runner.space.configs):
        from cuscikit.sci.space import SCISpace

        runner.space = SCISpace(runner.molecule, configs, eps=runner.eps)


def gather_selection(
    top_rows: np.ndarray,
    top_scores: np.ndarray,
    top_configs: np.ndarray,
    k: int,
    space_rows: np.ndarray,
    space_scores: np.ndarray,
    n_space: int,
    comm,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """What the growth of S needs, on every rank, in one collective.

    Each rank contributes its sources' rows of U and scores (its share of S, in S order) and
    its top-K over its slice of U; the top-Ks are merged with the single-rank rule (larger
    score first, then the smaller global row of U).

    Args:
        top_rows, top_scores, top_configs: this rank's top-K over its slice of U: global rows
            of U, scores (ln|psi|) and configurations (host uint64).
        k: K.
        space_rows, space_scores: global row of U and score of each of this rank's sources
            (rows ``source_share(n_space, P, rank)`` of S).
        n_space: |S|.
        comm: the communicator.

    Returns:
        (S rows, S scores) over all of S in S order, then (rows, configurations, scores) of
        the global top-K, best first: identical on every rank and equal to a single-rank top-K
        over all of U (same tie rule).
    """
    top_rows = np.asarray(top_rows, np.int64)
    words = top_configs.shape[1]
    n_s = len(space_rows)
    packed = np.zeros((n_s + len(top_rows), 2 + words), dtype=np.uint64)
    packed[:n_s, 0] = np.asarray(space_scores, np.float64).view(np.uint64)
    packed[:n_s, 1] = np.asarray(space_rows, np.int64).view(np.uint64)
    packed[n_s:, 0] = np.asarray(top_scores, np.float64).view(np.uint64)
    packed[n_s:, 1] = top_rows.view(np.uint64)
    packed[n_s:, 2:] = top_configs
    parts = comm.allgather(packed)
    # every rank knows every rank's number of sources: split each part into S rows and top-K
    s_sizes = [np.subtract(*source_share(n_space, comm.size, r)[::-1]) for r in range(comm.size)]
    if s_sizes[comm.rank] != n_s:
        raise ValueError(f"rank {comm.rank} has {n_s} sources, its share of |S|={n_space} differs")
    space = np.concatenate([p[:m] for p, m in zip(parts, s_sizes, strict=True)])
    top = np.concatenate([p[m:] for p, m in zip(parts, s_sizes, strict=True)])
    all_scores = np.ascontiguousarray(top[:, 0]).view(np.float64)
    rows_all = np.ascontiguousarray(top[:, 1]).view(np.int64)
    merged = RunningTopK(k)
    merged.update(all_scores, index=rows_all)
    best = merged.indices()
    # rows are unique over ranks (disjoint slices): locate each selected row in the table
    order = np.argsort(rows_all, kind="stable")
    pos = order[np.searchsorted(rows_all[order], best)]
    s_rows = np.ascontiguousarray(space[:, 1]).view(np.int64)
    s_scores = np.ascontiguousarray(space[:, 0]).view(np.float64)
    return s_rows, s_scores, best, np.ascontiguousarray(top[pos, 2:]), all_scores[pos]


def allreduce_gradients(params, comm, extra=()) -> np.ndarray:
    """Sum every parameter's gradient over the ranks (one collective), in place.

    A parameter that has no gradient on any rank keeps ``grad = None`` (AdamW then skips it, as
    on one rank); one that has a gradient somewhere gets the sum, zeros standing in for the
    ranks that had none (e.g. ranks without sources). `extra` numbers travel in the same
    buffer and come back summed (the loss).

    Returns:
        float64 array: the summed `extra`.
    """
    params = [p for p in params if p.requires_grad]
    extra = np.asarray(extra, dtype=np.float64).reshape(-1)
    has = np.array([p.grad is not None for p in params], dtype=np.float64)
    chunks, sizes = [extra, has], []
    for p in params:
        g = p.grad if p.grad is not None else torch.zeros_like(p)
        g = torch.view_as_real(g) if g.is_complex() else g
        flat = g.detach().to("cpu", torch.float64).reshape(-1).numpy()
        chunks.append(flat)
        sizes.append(flat.size)
    total = comm.allreduce(np.concatenate(chunks), op="sum")
    pos = len(extra) + len(params)
    for p, count, n in zip(params, total[len(extra) : pos], sizes, strict=True):
        seg = torch.from_numpy(total[pos : pos + n].copy())
        pos += n
        if count == 0:
            p.grad = None
            continue
        if p.is_complex():
            seg = torch.view_as_complex(seg.reshape(*p.shape, 2))
        p.grad = seg.reshape(p.shape).to(device=p.device, dtype=p.dtype)
    return total[: len(extra)]
