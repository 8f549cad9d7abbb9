"""Ising models for the dSB solver: couplings, field, and the constants that map energies back to
the problem they came from (MAX-CUT, QUBO, a dimod model).

Convention: spins s in {-1, +1}^n, J symmetric with zero diagonal, and

    E(s) = -1/2 s^T J s - h^T s,       value(s) = (E(s) + offset) / scale.

- MAX-CUT with weights W: J = -W, h = 0, offset = -W_tot, scale = -2, so value = cut
  = (W_tot - E) / 2 with W_tot the sum of the edge weights.
- QUBO f(x) = sum_i Q_ii x_i + sum_{i<j} P_ij x_i x_j, P_ij = Q_ij + Q_ji, x = (1 + s) / 2, in
  the times-4 integer form: J = -P, h_i = -(2 Q_ii + sum_{j != i} P_ij), offset = 2 sum_i Q_ii +
  sum_{i<j} P_ij, scale = 4 (integer Q keeps everything integer and exact).
- dimod SPIN model: J = -J_dimod, h = -h_dimod, offset = the model's offset.

Storage (`kind`, chosen from the values): ``"binary"`` (every off-diagonal J_ij = +-1, 1 bit),
``"ternary"`` (J_ij in {-1, 0, 1}, 2 bits), ``"int8"`` (integers with |J_ij| <= 127), all three
with integer h and exact integer sums, bit-identical on CPU and GPU; else ``"float32"`` (CPU
only, float sums: not bit-reproducible across machines or builds).

Example (a triangle: the best cut has 2 edges):
    >>> import numpy as np
    >>> m = IsingModel.from_edges(3, [(0, 1, 1), (1, 2, 1), (0, 2, 1)])
    >>> m.kind, m.n
    ('binary', 3)
    >>> s = np.array([1, -1, -1])
    >>> m.energy(s), m.cut(s)
    (-1, 2)
"""

from __future__ import annotations

import gzip
import math
import os
from pathlib import Path

import numpy as np
import scipy.sparse as sp

__all__ = ["IsingModel", "DEFAULT_MAX_BYTES"]

# Largest coupling storage a model may need (planes or bytes) unless max_bytes says otherwise.
DEFAULT_MAX_BYTES = int(os.environ.get("CUSCIKIT_ISING_MAX_BYTES", 8 * 2**30))

KIND_CODES = {"binary": 0, "ternary": 1, "int8": 2}


def _fmt_bytes(b: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if b < 1024 or unit == "TiB":
            return f"{b:.1f} {unit}" if unit != "B" else f"{int(b)} B"
        b /= 1024
    return f"{b} B"  # pragma: no cover


def coupling_scale(n: int, jnorm2, h) -> np.float32:
    """c0 = 0.5 sqrt(n_e - 1) / sqrt(F), F = ||J||_F^2 + 2 ||h||^2 and n_e = n + [h != 0],
    computed in float64 (F exactly for integers) and rounded once to float32, so that every
    backend uses the same value; 0 without couplings. (The request service's C++ front end
    computes the same expression per request: ext/cpu/ising/server.hpp.)

    Example:
        >>> float(coupling_scale(3, 6, [0, 0, 0]))
        0.28867512941360474
    """
    h = np.asarray(h)
    if h.dtype.kind in "iu":
        F = int(jnorm2) + 2 * sum(int(v) * int(v) for v in h[h != 0])
    else:
        F = float(jnorm2) + 2 * float((h**2).sum())
    ne = n + int(bool(np.any(h)))
    if F == 0 or ne < 2:
        return np.float32(0.0)
    return np.float32(0.5 * math.sqrt(ne - 1) / math.sqrt(F))


def _exact_div(num, den):
    """num / den as an int when it divides exactly (integer models), else a float."""
    if isinstance(num, (int, np.integer)) and isinstance(den, int) and num % den == 0:
        return int(num) // den
    return float(num) / den


class IsingModel:
    """Couplings J (symmetric, zero diagonal), field h and the offset/scale of the source problem.

    Args:
        J: (n, n) dense array or scipy sparse matrix; must be symmetric with a zero diagonal and
            finite entries.
        h: (n,) field (default 0).
        offset, scale: value(s) = (E(s) + offset) / scale (defaults 0 and 1).
        labels: names of the variables (graph nodes, dimod labels); default ``range(n)``.
        max_bytes: refuse models whose coupling storage exceeds this many bytes.

    Raises:
        ValueError: a non-square or non-symmetric J, a non-zero diagonal, NaN or infinite
            values, a field of the wrong length, or storage above `max_bytes`.

    Example:
        >>> import numpy as np
        >>> J = np.array([[0, 1], [1, 0]])
        >>> m = IsingModel(J, h=[0, 2])
        >>> m.kind, m.energy([1, 1]), m.energy([-1, -1])
        ('binary', -3, 1)
    """

    def __init__(
        self,
        J,
        h=None,
        offset=0,
        *,
        scale=1,
        labels=None,
        source: str = "ising",
        max_bytes: int | None = None,
    ):
        limit = DEFAULT_MAX_BYTES if max_bytes is None else int(max_bytes)
        shape = getattr(J, "shape", None)
        if shape is not None and len(shape) == 2 and shape[0] == shape[1]:
            least = shape[0] * ((shape[0] + 31) // 32) * 4  # one bit plane, the smallest kind
            if least > limit:
                raise ValueError(
                    f"the couplings of this model need at least {_fmt_bytes(least)} (n = "
                    f"{shape[0]}), above the limit of {_fmt_bytes(limit)} (max_bytes or "
                    "CUSCIKIT_ISING_MAX_BYTES)"
                )
        if sp.issparse(J):
            J = sp.csr_matrix(J)
        else:
            J = np.asarray(J)
            if J.ndim != 2:
                raise ValueError(f"J must be a 2-D matrix, got shape {J.shape}")
            if J.dtype == object or not np.issubdtype(J.dtype, np.number):
                raise ValueError(f"J must be numeric, got dtype {J.dtype}")
            J = sp.csr_matrix(J)
        if J.shape[0] != J.shape[1]:
            raise ValueError(f"J must be square, got shape {J.shape}")
        n = J.shape[0]
        if n < 1:
            raise ValueError("the model needs at least one spin")
        if np.iscomplexobj(J.data):
            raise ValueError("J must be real")
        J.sum_duplicates()
        if not np.all(np.isfinite(J.data)):
            raise ValueError("J has NaN or infinite entries")
        J.eliminate_zeros()
        if J.diagonal().any():
            i = int(np.flatnonzero(J.diagonal())[0])
            raise ValueError(
                f"J has a non-zero diagonal (J[{i}, {i}] = {J[i, i]}): s_i^2 = 1, so a diagonal "
                "term is a constant; put it into the offset"
            )
        if (J - J.T).count_nonzero():
            d = abs(J - J.T).tocoo()
            k = int(np.argmax(d.data))
            i, j = int(d.row[k]), int(d.col[k])
            raise ValueError(
                f"J is not symmetric: J[{i}, {j}] = {J[i, j]} but J[{j}, {i}] = {J[j, i]}"
            )
        h = np.zeros(n) if h is None else np.asarray(h)
        if h.shape != (n,):
            raise ValueError(f"h must have shape ({n},), got {h.shape}")
        if h.dtype == object or not np.issubdtype(h.dtype, np.number) or np.iscomplexobj(h):
            raise ValueError(f"h must be real numbers, got dtype {h.dtype}")
        if not np.all(np.isfinite(h)):
            raise ValueError("h has NaN or infinite entries")
        if isinstance(offset, float) and not math.isfinite(offset):
            raise ValueError("offset must be finite")
        integral = bool(np.all(J.data == np.round(J.data))) and bool(np.all(h == np.round(h)))
        if integral:
            J = J.astype(np.int64)
            h = h.astype(np.int64)
        else:
            J = J.astype(np.float64)
            h = h.astype(np.float64)
        self.J: sp.csr_matrix = J
        self.h: np.ndarray = h
        self.n = n
        self.offset = int(offset) if float(offset).is_integer() else float(offset)
        self.scale = scale
        self.labels = list(range(n)) if labels is None else list(labels)
        if len(self.labels) != n:
            raise ValueError(f"{len(self.labels)} labels for {n} spins")
        self.source = source
        self.kind = self._choose_kind()
        need = self.storage_bytes()
        if need > limit:
            raise ValueError(
                f"the couplings of this model need {_fmt_bytes(need)} as {self.kind} (n = {n}), "
                f"above the limit of {_fmt_bytes(limit)} (max_bytes or CUSCIKIT_ISING_MAX_BYTES)"
            )

    # --- storage ---------------------------------------------------------------------------------
    def _choose_kind(self) -> str:
        n, J, h = self.n, self.J, self.h
        if J.dtype.kind != "i":
            return "float32"
        jmax = int(abs(J.data).max()) if J.nnz else 0
        hmax = int(abs(h).max())
        # the int32 sums stay exact: |a_i| <= 127 n + |h_i| < 2^31
        if jmax <= 127 and jmax * n + hmax < 2**31 - 1:
            if jmax <= 1:
                return "binary" if n > 1 and J.nnz == n * (n - 1) else "ternary"
            return "int8"
        return "float32"

    @property
    def nwords(self) -> int:
        """32-bit words per row of signs: ceil(n / 32)."""
        return (self.n + 31) // 32

    @property
    def exact(self) -> bool:
        """True when the sums are exact integers (every kind but float32)."""
        return self.kind != "float32"

    def storage_bytes(self) -> int:
        """Bytes of coupling storage the solver builds for this model."""
        rows = self.n * self.nwords * 4
        return {"binary": rows, "ternary": 2 * rows, "int8": 8 * rows}.get(
            self.kind, 4 * self.n * self.n
        )

    def coupling_arrays(self) -> dict:
        """The flat arrays the C++ and CUDA kernels take (see ``cuscikit/dsb.hpp``)."""
        n, W = self.n, self.nwords
        empty_u = np.zeros(0, np.uint32)
        out = {
            "kind": KIND_CODES.get(self.kind, -1),
            "plus": empty_u,
            "minus": empty_u,
            "degree": np.zeros(0, np.int32),
            "j8": np.zeros(0, np.int8),
        }
        if self.kind == "float32":
            out["J"] = self.J.astype(np.float32).toarray().ravel()
            out["h"] = self.h.astype(np.float32)
            return out
        out["h"] = self.h.astype(np.int32)
        plus = np.zeros((n, W), np.uint32) if self.kind != "int8" else None
        minus = np.zeros((n, W), np.uint32) if self.kind == "ternary" else None
        j8 = np.zeros((n, 32 * W), np.int8) if self.kind == "int8" else None
        degree = np.zeros(n, np.int32)
        chunk = max(1, (1 << 24) // (32 * W))
        for r0 in range(0, n, chunk):
            r1 = min(n, r0 + chunk)
            rows = np.zeros((r1 - r0, 32 * W), np.int64)
            rows[:, :n] = self.J[r0:r1].toarray()
            if j8 is not None:
                j8[r0:r1] = rows
                continue
            plus[r0:r1] = _pack(rows > 0)
            if minus is not None:
                minus[r0:r1] = _pack(rows < 0)
                degree[r0:r1] = (rows > 0).sum(1) - (rows < 0).sum(1)
        if plus is not None:
            out["plus"] = plus.ravel()
        if minus is not None:
            out["minus"] = minus.ravel()
            out["degree"] = degree
        if j8 is not None:
            out["j8"] = j8.ravel()
        return out

    @property
    def jnorm2(self) -> int | float:
        """||J||_F^2: exact (an int) for integer couplings (|J_ij| <= 127 cannot overflow int64)."""
        if self.exact:
            return int(np.sum(self.J.data.astype(np.int64) ** 2, dtype=np.int64))
        return float((self.J.data**2).sum())

    def c0(self) -> np.float32:
        """The coupling scale of `coupling_scale` for this model's J and h."""
        return coupling_scale(self.n, self.jnorm2, self.h)

    # --- energies --------------------------------------------------------------------------------
    def _spins(self, s) -> np.ndarray:
        s = np.asarray(s)
        if s.shape[-1:] != (self.n,):
            raise ValueError(f"spins must have {self.n} entries in the last axis, got {s.shape}")
        if not np.all((s == 1) | (s == -1)):
            raise ValueError("spins must be +1 or -1")
        return s.astype(np.int64 if self.exact else np.float64)

    def energy(self, s):
        """E(s) = -1/2 s^T J s - h^T s for one spin vector (an int for integer models) or a
        (k, n) stack (an array)."""
        s = self._spins(s)
        S = np.atleast_2d(s)
        Js = (self.J @ S.T).T
        e = -((S * Js).sum(1) // 2 if self.exact else 0.5 * (S * Js).sum(1)) - S @ self.h
        if s.ndim == 1:
            return int(e[0]) if self.exact else float(e[0])
        return e

    def value(self, s):
        """(E(s) + offset) / scale: the cut of a graph, the QUBO value, the dimod energy."""
        e = self.energy(s)
        if np.ndim(e):
            return (e + self.offset) / self.scale
        return _exact_div(e + self.offset, self.scale)

    def cut(self, s):
        """The weight of the edges cut by s (graph models only)."""
        if self.source != "graph":
            raise ValueError("cut() needs a model built from a graph (from_gset/from_networkx)")
        return self.value(s)

    def __repr__(self) -> str:
        return (
            f"IsingModel(n={self.n}, kind={self.kind!r}, nnz={self.J.nnz}, source={self.source!r})"
        )

    # --- constructors ----------------------------------------------------------------------------
    @classmethod
    def from_dense(cls, J, h=None, offset=0, **kw) -> IsingModel:
        """From a dense J (and h)."""
        return cls(np.asarray(J), h, offset, **kw)

    @classmethod
    def from_sparse(cls, J, h=None, offset=0, **kw) -> IsingModel:
        """From a scipy sparse J (and h)."""
        if not sp.issparse(J):
            raise ValueError("from_sparse needs a scipy sparse matrix")
        return cls(J, h, offset, **kw)

    @classmethod
    def from_maxcut(cls, W, labels=None, **kw) -> IsingModel:
        """MAX-CUT of the symmetric weight matrix W (zero diagonal): J = -W, value = cut."""
        W = sp.csr_matrix(W) if sp.issparse(W) else sp.csr_matrix(np.asarray(W))
        m = cls(-W, None, 0, scale=-2, labels=labels, source="graph", **kw)
        if m.exact:
            m.offset = int(m.J.sum()) // 2  # -W_tot: the sum over i<j of J_ij = -w_ij
        else:
            m.offset = float(m.J.sum()) / 2
        return m

    @classmethod
    def from_edges(cls, n: int, edges, labels=None, **kw) -> IsingModel:
        """MAX-CUT of a graph on n vertices given as (i, j, w) triples, 0-based.

        Raises:
            ValueError: an index out of range, a self-loop, a duplicate edge.
        """
        e = np.asarray(list(edges), dtype=np.float64).reshape(-1, 3)
        if len(e) and not np.all(np.isfinite(e)):
            raise ValueError("edge list has NaN or infinite values")
        i, j, w = e[:, 0], e[:, 1], e[:, 2]
        if len(e) and (not np.all(i == np.round(i)) or not np.all(j == np.round(j))):
            raise ValueError("edge endpoints must be integers")
        i, j = i.astype(np.int64), j.astype(np.int64)
        _check_edges(n, i, j, w, base=0)
        W = sp.coo_matrix((np.r_[w, w], (np.r_[i, j], np.r_[j, i])), shape=(n, n)).tocsr()
        return cls.from_maxcut(W, labels=labels, **kw)

    @classmethod
    def from_gset(cls, path: str | os.PathLike, **kw) -> IsingModel:
        """MAX-CUT of a G-set / rudy file: first line ``n m``, then m lines ``i j w`` (1-based,
        integer weights); ``.gz`` files are read compressed.

        Raises:
            ValueError: a bad header, a wrong edge count, a malformed line, a non-integer weight,
                an index out of range, a self-loop or a duplicate edge.
        """
        path = Path(path)
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt") as f:
            text = f.read()
        lines = [ln.split() for ln in text.splitlines()]
        lines = [ln for ln in lines if ln]
        if not lines:
            raise ValueError(f"{path}: empty file")
        head = lines[0]
        try:
            if len(head) != 2:
                raise ValueError
            n, m = int(head[0]), int(head[1])
        except ValueError:
            raise ValueError(
                f"{path}: the first line must be 'n m', got {' '.join(head)!r}"
            ) from None
        if n < 1 or m < 0:
            raise ValueError(f"{path}: bad header n={n} m={m}")
        body = lines[1:]
        if len(body) != m:
            raise ValueError(f"{path}: the header says {m} edges, the file has {len(body)}")
        bad = [k for k, ln in enumerate(body) if len(ln) != 3]
        if bad:
            raise ValueError(
                f"{path}: line {bad[0] + 2} must be 'i j w': {' '.join(body[bad[0]])!r}"
            )
        try:
            arr = np.array(body, dtype=np.int64).reshape(-1, 3)
        except (ValueError, OverflowError):
            for k, ln in enumerate(body):
                try:
                    [int(t) for t in ln]
                except ValueError:
                    raise ValueError(
                        f"{path}: line {k + 2}: i, j and w must be integers, got {' '.join(ln)!r}"
                    ) from None
            raise ValueError(f"{path}: values out of range") from None
        i, j, w = arr[:, 0], arr[:, 1], arr[:, 2]
        _check_edges(n, i, j, w, base=1, where=str(path))
        i, j = i - 1, j - 1
        W = sp.coo_matrix((np.r_[w, w], (np.r_[i, j], np.r_[j, i])), shape=(n, n)).tocsr()
        return cls.from_maxcut(W, **kw)

    @classmethod
    def from_networkx(cls, G, weight: str = "weight", **kw) -> IsingModel:
        """MAX-CUT of a networkx graph (edge attribute `weight`, default 1); `labels` are the
        nodes in ``G.nodes`` order."""
        if G.is_multigraph():
            raise ValueError("multigraphs are not supported: merge parallel edges first")
        if G.is_directed():
            raise ValueError("the graph must be undirected")
        nodes = list(G.nodes)
        index = {v: k for k, v in enumerate(nodes)}
        edges = [(index[u], index[v], d.get(weight, 1)) for u, v, d in G.edges(data=True)]
        for u, v, _ in edges:
            if u == v:
                raise ValueError(f"self-loop at node {nodes[u]!r}")
        return cls.from_edges(len(nodes), edges, labels=nodes, **kw)

    @classmethod
    def from_qubo(cls, Q, **kw) -> IsingModel:
        """Minimising f(x) = sum_{i<=j} Q_ij x_i x_j over x in {0, 1}^n, from a square matrix
        (dense or sparse, any triangle) or a dict ``{(u, v): q}`` over hashable labels.
        value(s) is f at x = (1 + s) / 2.

        Example:
            >>> m = IsingModel.from_qubo({(0, 0): -1, (1, 1): -1, (0, 1): 2})
            >>> m.value([1, -1]), m.value([1, 1]), m.value([-1, -1])
            (-1, 0, 0)
        """
        labels = None
        if isinstance(Q, dict):
            labels = []
            index: dict = {}
            for u, v in Q:
                for t in (u, v):
                    if t not in index:
                        index[t] = len(labels)
                        labels.append(t)
            n = len(labels)
            rows = [index[u] for u, v in Q]
            cols = [index[v] for u, v in Q]
            vals = np.asarray(list(Q.values()), dtype=np.float64)
            Q = sp.coo_matrix((vals, (rows, cols)), shape=(n, n)).tocsr()  # duplicates add up
        else:
            Q = sp.csr_matrix(Q) if sp.issparse(Q) else sp.csr_matrix(np.asarray(Q, dtype=float))
        if Q.shape[0] != Q.shape[1]:
            raise ValueError(f"Q must be square, got shape {Q.shape}")
        if not np.all(np.isfinite(Q.data)):
            raise ValueError("Q has NaN or infinite entries")
        return cls._from_qubo_matrix(Q, 0, labels, **kw)

    @classmethod
    def _from_qubo_matrix(cls, Q, extra_offset, labels, **kw) -> IsingModel:
        Q = sp.csr_matrix(Q, dtype=np.float64)
        d = Q.diagonal()
        P = Q + Q.T
        P.setdiag(0)
        P.eliminate_zeros()
        integral = bool(np.all(Q.data == np.round(Q.data)))
        if integral:
            P = P.astype(np.int64)
            d = d.astype(np.int64)
        h = -(2 * d + np.asarray(P.sum(1)).ravel())
        pair_sum = P.sum() // 2 if integral else P.sum() / 2
        offset = 2 * d.sum() + pair_sum + 4 * extra_offset
        return cls(-P, h, offset, scale=4, labels=labels, source="qubo", **kw)

    @classmethod
    def from_bqm(cls, bqm, **kw) -> IsingModel:
        """From a dimod BinaryQuadraticModel (SPIN or BINARY); value(s) is the model's energy of
        the spins (or of x = (1 + s) / 2) and `labels` its variables."""
        import dimod

        labels = list(bqm.variables)
        index = {v: k for k, v in enumerate(labels)}
        n = len(labels)
        lin = np.array([bqm.get_linear(v) for v in labels], dtype=np.float64)
        rows, cols, vals = [], [], []
        for (u, v), b in bqm.quadratic.items():
            rows.append(index[u])
            cols.append(index[v])
            vals.append(b)
        A = sp.coo_matrix((vals, (rows, cols)), shape=(n, n)).tocsr()
        if bqm.vartype is dimod.SPIN:
            J = -(A + A.T)
            off = float(bqm.offset)
            return cls(
                J, -lin, int(off) if off.is_integer() else off, labels=labels, source="bqm", **kw
            )
        Q = A + sp.diags(lin)
        off = float(bqm.offset)
        m = cls._from_qubo_matrix(Q, int(off) if off.is_integer() else off, labels, **kw)
        m.source = "bqm"
        return m


def _pack(bits: np.ndarray) -> np.ndarray:
    """Rows of booleans (a multiple of 32 long) to uint32 words, bit j%32 of word j/32."""
    packed = np.packbits(bits, axis=1, bitorder="little")
    return packed.view("<u4").astype(np.uint32)


def _check_edges(n, i, j, w, base: int, where: str = "edge list") -> None:
    lo, hi = base, n - 1 + base
    for a in (i, j):
        bad = np.flatnonzero((a < lo) | (a > hi))
        if len(bad):
            k = int(bad[0])
            raise ValueError(
                f"{where}: edge {k + 1} ({i[k]}, {j[k]}): vertex out of range {lo}..{hi}"
            )
    loops = np.flatnonzero(i == j)
    if len(loops):
        k = int(loops[0])
        raise ValueError(f"{where}: edge {k + 1} is a self-loop at vertex {i[k]}")
    a, b = np.minimum(i, j), np.maximum(i, j)
    key = a * n + b
    order = np.argsort(key, kind="stable")
    dup = np.flatnonzero(np.diff(key[order]) == 0)
    if len(dup):
        k1, k2 = int(order[dup[0]]), int(order[dup[0] + 1])
        how = "with conflicting weights" if w[k1] != w[k2] else "twice"
        raise ValueError(
            f"{where}: edge ({i[k2]}, {j[k2]}) appears {how} (edges {k1 + 1} and {k2 + 1})"
        )
