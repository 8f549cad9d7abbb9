"""Exact reduction of sparse Ising models (h = 0) by eliminating spins of degree 0, 1 and 2.

A spin v with at most two couplings can be set optimally from its neighbours, so it can be taken
out of the model with a constant and at most one new coupling (Ferizovic, Hespe, Lamm, Mnich,
Schulz, Strash, "Engineering kernelization for maximum cut", ALENEX 2020, arXiv:1905.12860, which
gives these and stronger rules for MAX-CUT). With E(s) = -sum_{i<j} J_ij s_i s_j:

- degree 0: v is free; constant 0, s_v = +1;
- degree 1 (coupling w to u): min over s_v of -w s_v s_u = -|w|; s_v = sgn(w) s_u;
- degree 2 (w1 to u, w2 to x): min over s_v of -s_v (w1 s_u + w2 s_x) = -|w1 s_u + w2 s_x|
  = -max(|w1|, |w2|) - J' s_u s_x with J' = sgn(w1 w2) min(|w1|, |w2|): v goes, J'
  is added to the coupling u-x (an existing one included; a sum of 0 drops it), and
  s_v = +1 if w1 s_u + w2 s_x >= 0 else -1.

Eliminations repeat until every remaining spin has degree 3 or more (or one spin is left). The
kernel keeps integer couplings integer (|J'| <= max(|w1|, |w2|); only merged couplings add up),
and for every kernel vector s_K the expansion s = expand(s_K) satisfies
E(s) = E_K(s_K) + constant exactly, so the kernel's minimum gives the model's minimum. Sparse
random graphs shrink a lot: G-set G70 (10,000 vertices, 9,999 edges) keeps 2,164 spins and 3,760
couplings in {-1, +1}. The elimination order is fixed by the input (a stack started from the
low-degree spins in index order), so the kernel and the expansion are deterministic.

Example (a path 0-1-2-3 is a tree: everything but one spin goes, and every edge is cut):
    >>> from cuscikit.ising import IsingModel
    >>> m = IsingModel.from_edges(4, [(0, 1, 1), (1, 2, 1), (2, 3, 1)])
    >>> red = reduce_model(m)
    >>> red.model.n, red.constant
    (1, -3)
    >>> s = red.expand([1])
    >>> m.energy(s), m.cut(s)
    (-3, 3)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from cuscikit.ising.model import IsingModel

__all__ = ["Reduction", "reduce_model"]


@dataclass
class Reduction:
    """An exact reduction: ``model`` (the kernel) on the spins ``kept`` of the original model,
    ``constant`` with E(expand(s)) = model.energy(s) + constant, and the eliminated spins in
    ``eliminated`` (spin, ((neighbour, coupling), ...)) in elimination order; ``n`` is the
    original model's number of spins."""

    model: IsingModel
    kept: np.ndarray
    constant: int | float
    eliminated: list
    n: int

    def expand(self, spins) -> np.ndarray:
        """Kernel spins, (m,) or (k, m), to the original model's (n,) or (k, n) int8 spins, each
        eliminated spin set to its best value given its neighbours (in reverse order)."""
        s = np.asarray(spins)
        single = s.ndim == 1
        S = np.atleast_2d(s)
        if S.shape[1] != len(self.kept):
            raise ValueError(f"kernel spins must have {len(self.kept)} entries, got {S.shape[1]}")
        out = np.ones((self.n, S.shape[0]), np.int8)  # spin-major: each update is one row
        out[self.kept] = S.T
        for v, nb in reversed(self.eliminated):
            if len(nb) == 1:
                ((u, w),) = nb
                if w > 0:
                    out[v] = out[u]
                else:
                    np.negative(out[u], out=out[v])
            elif len(nb) == 2:
                (u, w1), (x, w2) = nb
                f = w1 * out[u].astype(np.int64) + w2 * out[x]
                out[v] = np.where(f >= 0, 1, -1)
        out = np.ascontiguousarray(out.T)
        return out[0] if single else out


def reduce_model(model: IsingModel) -> Reduction:
    """Eliminate the spins of degree <= 2 (repeatedly) from a model without field.

    Raises:
        ValueError: the model has a non-zero field h (not handled by these rules).
    """
    if not isinstance(model, IsingModel):
        raise ValueError(f"model must be an IsingModel, got {type(model).__name__}")
    if np.any(model.h):
        raise ValueError("reduce_model needs a model without field (h = 0)")
    n = model.n
    J = model.J.tocsr()
    J.sort_indices()
    py = int if model.exact else float
    adj = [
        dict(
            zip(
                J.indices[J.indptr[i] : J.indptr[i + 1]].tolist(),
                map(py, J.data[J.indptr[i] : J.indptr[i + 1]].tolist()),
                strict=True,
            )
        )
        for i in range(n)
    ]
    alive = np.ones(n, bool)
    left = n
    constant = py(0)
    eliminated = []
    stack = [v for v in range(n - 1, -1, -1) if len(adj[v]) <= 2]  # pops the lowest index first
    while stack and left > 1:
        v = stack.pop()
        if not alive[v] or len(adj[v]) > 2:
            continue
        nb = tuple(adj[v].items())
        for u, _ in nb:
            del adj[u][v]
        adj[v] = {}
        alive[v] = False
        left -= 1
        eliminated.append((v, nb))
        if len(nb) == 1:
            constant -= abs(nb[0][1])
        elif len(nb) == 2:
            (u, w1), (x, w2) = nb
            constant -= max(abs(w1), abs(w2))
            jp = min(abs(w1), abs(w2)) * (1 if (w1 > 0) == (w2 > 0) else -1)
            w = adj[u].get(x, 0) + jp
            if w == 0:
                adj[u].pop(x, None)
                adj[x].pop(u, None)
            else:
                adj[u][x] = w
                adj[x][u] = w
        stack.extend(u for u, _ in reversed(nb))
    kept = np.flatnonzero(alive)
    pos = np.full(n, -1, np.int64)
    pos[kept] = np.arange(len(kept))
    rows, cols, vals = [], [], []
    for v in kept.tolist():
        for u, w in adj[v].items():
            rows.append(pos[v])
            cols.append(pos[u])
            vals.append(w)
    m = len(kept)
    K = sp.csr_matrix(
        (np.asarray(vals, dtype=J.dtype), (np.asarray(rows, np.int64), np.asarray(cols, np.int64))),
        shape=(m, m),
    )
    kernel = IsingModel(K, np.zeros(m, model.h.dtype))
    return Reduction(model=kernel, kept=kept, constant=constant, eliminated=eliminated, n=n)
