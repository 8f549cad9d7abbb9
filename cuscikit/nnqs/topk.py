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


class TorchTopK:
    """`RunningTopK` on torch tensors (any device): same selection, same tie-breaking (larger
    score first, then smaller index), so GPU and CPU runs pick the same configurations.

    Example:
        >>> import torch
        >>> t = TorchTopK(2)
        >>> t.update(torch.tensor([0.5, 3.0, 1.0]), torch.tensor([0, 1, 2]))
        >>> t.update(torch.tensor([2.0, 0.1]), torch.tensor([3, 4]))
        >>> t.indices().tolist()
        [1, 3]
    """

    def __init__(self, k: int):
        if k < 0:
            raise ValueError(f"k must be non-negative, got {k}")
        self.k = int(k)
        self._scores = None
        self._idx = None

    def update(self, scores, index, mask=None) -> None:
        """Merge one batch of scores with their global indices (`mask`: eligible entries)."""
        if self.k == 0:
            return
        if mask is not None:
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
        if self._idx is None:
            return torch.zeros(0, dtype=torch.int64)
        return self._idx[self._order()]

    def scores(self):
        if self._scores is None:
            return torch.zeros(0)
        return self._scores[self._order()]
