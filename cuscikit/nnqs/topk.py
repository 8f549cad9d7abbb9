"""Hierarchical top-K: per-batch top-K merged into a running global set (stage 2 of the iteration;
docs/nnqs_sci.md)."""

from __future__ import annotations

import numpy as np
import torch


class RunningTopK:
    """Keeps the K largest scores seen so far and their global indices.

    Ties are broken by the smaller index, so the result does not depend on the batch size.

    Example:
        >>> t = RunningTopK(2)
        >>> t.update(np.array([0.5, 3.0, 1.0]), offset=0)
        >>> t.update(np.array([2.0, 0.1]), offset=3)
        >>> t.indices().tolist(), t.scores().tolist()
        ([1, 3], [3.0, 2.0])
    """

    def __init__(self, k: int):
        if k < 0:
            raise ValueError(f"k must be non-negative, got {k}")
        self.k = int(k)
        self._scores = np.zeros(0)
        self._idx = np.zeros(0, dtype=np.int64)

    def update(
        self,
        scores: np.ndarray,
        offset: int = 0,
        mask: np.ndarray | None = None,
        index: np.ndarray | None = None,
    ) -> None:
        """Merge one batch: `scores[i]` belongs to global index `offset + i` (or `index[i]`
        when given); `mask` (optional) marks the eligible entries."""
        if self.k == 0:
            return
        if index is None:
            idx = np.arange(offset, offset + len(scores), dtype=np.int64)
        else:
            idx = np.asarray(index, dtype=np.int64)
        if mask is not None:
            scores, idx = scores[mask], idx[mask]
        batch_scores, batch_idx = self._select(scores, idx)
        self._scores, self._idx = self._select(
            np.concatenate([self._scores, batch_scores]), np.concatenate([self._idx, batch_idx])
        )

    def _select(self, scores: np.ndarray, idx: np.ndarray):
        if len(scores) > self.k:
            # argpartition on (-score, index) keys: exact top-k with index tie-breaking
            order = np.lexsort((idx, -scores))[: self.k]
            return scores[order], idx[order]
        return scores, idx

    def indices(self) -> np.ndarray:
        """Global indices of the kept entries, best first."""
        order = np.lexsort((self._idx, -self._scores))
        return self._idx[order]

    def scores(self) -> np.ndarray:
        order = np.lexsort((self._idx, -self._scores))
        return self._scores[order]


#: rows a `TorchTopK` gathers before it merges them (each merge waits on the device several
#: times: a masked selection, `nonzero`, a count read back; merged every inference batch, those
#: waits left the GPU idle for about a tenth of the N2/cc-pVDZ inference,
#: docs/performance.md#iteration-parts)
MERGE_ROWS = 1 << 24


class TorchTopK:
    """`RunningTopK` on torch tensors (any device): same selection, same tie-breaking (larger
    score first, then smaller index), so GPU and CPU runs pick the same configurations.

    Updates are gathered and merged every `MERGE_ROWS` rows (``rows_per_merge``) and before
    the result is read; the selection does not depend on that grouping. The tensors given to
    `update` are kept until they are merged: do not change them in place meanwhile.

    Example:
        >>> import torch
        >>> t = TorchTopK(2)
        >>> t.update(torch.tensor([0.5, 3.0, 1.0]), torch.tensor([0, 1, 2]))
        >>> t.update(torch.tensor([2.0, 0.1]), torch.tensor([3, 4]))
        >>> t.indices().tolist()
        [1, 3]
    """

    def __init__(self, k: int, rows_per_merge: int | None = None):
        if k < 0:
            raise ValueError(f"k must be non-negative, got {k}")
        self.k = int(k)
        self.rows_per_merge = MERGE_ROWS if rows_per_merge is None else int(rows_per_merge)
        if self.rows_per_merge < 1:
            raise ValueError(f"rows_per_merge must be positive, got {rows_per_merge}")
        self._scores = None
        self._idx = None
        self._pending: list[tuple] = []  # (scores, index, mask) not merged yet
        self._pending_rows = 0

    def update(self, scores, index, mask=None) -> None:
        """Add one batch of scores with their global indices (`mask`: eligible entries)."""
        if self.k == 0:
            return
        self._pending.append((scores, index, mask))
        self._pending_rows += len(scores)
        if self._pending_rows >= self.rows_per_merge:
            self._merge()

    def _merge(self) -> None:
        if not self._pending:
            return
        parts, self._pending, self._pending_rows = self._pending, [], 0
        scores = torch.cat([s for s, _, _ in parts])
        index = torch.cat([i for _, i, _ in parts])
        if any(m is not None for _, _, m in parts):
            mask = torch.cat(
                [torch.ones(len(s), dtype=torch.bool, device=s.device) if m is None else m
                 for s, _, m in parts]
            )  # fmt: skip
            scores, index = scores[mask], index[mask]
        scores, index = self._select(scores, index)
        if self._scores is not None:
            scores, index = self._select(
                torch.cat([self._scores, scores]), torch.cat([self._idx, index])
            )
        self._scores, self._idx = scores, index

    def _select(self, scores, idx):
        if len(scores) <= self.k:
            return scores, idx
        kth = torch.topk(scores, self.k, sorted=True).values[-1]
        above = scores > kth
        tied = torch.nonzero(scores == kth).squeeze(1)
        need = self.k - int(above.sum())
        tied = tied[torch.argsort(idx[tied])[:need]]
        keep = torch.cat([torch.nonzero(above).squeeze(1), tied])
        return scores[keep], idx[keep]

    def _order(self):
        by_idx = torch.argsort(self._idx, stable=True)
        by_score = torch.argsort(-self._scores[by_idx], stable=True)
        return by_idx[by_score]

    def indices(self):
        """Global indices of the kept entries, best first (an int64 tensor)."""
        self._merge()
        if self._idx is None:
            return torch.zeros(0, dtype=torch.int64)
        return self._idx[self._order()]

    def scores(self):
        self._merge()
        if self._scores is None:
            return torch.zeros(0)
        return self._scores[self._order()]
