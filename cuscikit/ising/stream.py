"""Streamed dSB: ±1 couplings that need not fit in memory, delivered as 1-bit row tiles while the
replicas' state (positions, momenta, signs, row sums) stays put.

A source yields the matrix in the layout of `IsingModel.coupling_arrays()["plus"]`: row i as
ceil(n/32) little-endian 32-bit words, bit j set when J_ij = +1 (every off-diagonal J_ij is
±1), diagonal and padding bits 0. Sources: `MattisSource` (J = ξ ξ^T, generated), `RandomSource`
(seeded, generated), `MemmapSource` (a file written by `write_bitmatrix`, read through
`numpy.memmap`). Each tile serves every replica before the next is fetched; K steps take
K + 1 passes over the matrix (the last scores the final signs). The records equal those of
`solve` on the same matrix (restart 0) byte for byte, so a streamed run can be checked against
a resident one wherever the matrix fits.

Two implementations give the same bytes: device="cpu" (C++, OpenMP over rows; generators fill
tiles on the same threads) and device="cuda" (state on the GPU; host threads fill a ring of
pinned tile buffers, copied on a stream of their own while the previous tile is accumulated).
`score_streamed` makes one pass that only scores the initial signs (the first record of a run):
the cost of a pass where a whole run would not fit the time at hand.

Example (a Mattis instance: the planted ground state has E = -n (n - 1) / 2):
    >>> import numpy as np
    >>> from cuscikit.ising.stream import MattisSource, score_streamed, solve_streamed
    >>> src = MattisSource(np.where(np.arange(300) % 3, 1, -1))
    >>> r = solve_streamed(src, agents=4, steps=60, seed=1)
    >>> r.energy == -300 * 299 // 2
    True
    >>> s = score_streamed(src, agents=4, seed=1)  # E(s) = -((xi . s)^2 - n) / 2 for Mattis
    >>> bool(s.energy == src.energy_of(s.spins)) and s.passes == 1
    True
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

__all__ = [
    "MattisSource",
    "MemmapSource",
    "RandomSource",
    "StreamResult",
    "h2d_rate",
    "score_streamed",
    "solve_streamed",
    "write_bitmatrix",
]


def _ext():
    from cuscikit.backends.loader import core

    return core().ising


class _Source:
    """A ±1 coupling matrix as 1-bit row tiles."""

    n: int

    @property
    def nwords(self) -> int:
        return (self.n + 31) // 32

    @property
    def row_bytes(self) -> int:
        return 4 * self.nwords

    def tile(self, r0: int, rows: int) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    def _gpu_spec(self) -> dict:
        """How the GPU run's host threads make the rows: source name, xi, matrix seed, rows."""
        return {"source": "rows", "xi": np.zeros(0, np.int8), "matrix_seed": 0,
                "rows": np.ascontiguousarray(self.tile(0, self.n), np.uint32)}  # fmt: skip

    def tiles(self, rows: int):
        """(r0, bits[rows, W]) for the whole matrix, in row order."""
        for r0 in range(0, self.n, rows):
            yield r0, self.tile(r0, min(rows, self.n - r0))

    def model(self):
        """The whole matrix as an `IsingModel` (only where it fits: for checks)."""
        from cuscikit.ising.model import IsingModel

        bits = self.tile(0, self.n)
        plus = np.unpackbits(bits.view(np.uint8), axis=1, bitorder="little")[:, : self.n]
        J = 2 * plus.astype(np.int8) - 1
        np.fill_diagonal(J, 0)
        return IsingModel(J)


class MattisSource(_Source):
    """J = ξ ξ^T (zero diagonal) for a ±1 vector ξ: ground states ±ξ with E = -n (n - 1) / 2.

    Args:
        xi: the ±1 vector, or an int n for a random one drawn with `seed`.
    """

    def __init__(self, xi, seed: int = 0):
        if isinstance(xi, (int, np.integer)):
            xi = np.where(np.random.default_rng(seed).random(int(xi)) < 0.5, -1, 1)
        xi = np.asarray(xi)
        if xi.ndim != 1 or xi.size < 2 or not np.all(np.abs(xi) == 1):
            raise ValueError("xi must be a vector of at least 2 entries, each +1 or -1")
        self.xi = xi.astype(np.int8)
        self.n = int(xi.size)

    def tile(self, r0: int, rows: int) -> np.ndarray:
        return _ext().mattis_tile(self.xi, r0, rows)

    @property
    def ground_energy(self) -> int:
        return -self.n * (self.n - 1) // 2

    def energy_of(self, spins, h=None) -> int:
        """E(s) = -((xi . s)^2 - n) / 2 - h . s, exactly (for checks at any n)."""
        s = np.asarray(spins).astype(np.int64)
        m = int(s @ self.xi.astype(np.int64))
        e = -(m * m - self.n) // 2
        return e - int(np.asarray(h, np.int64) @ s) if h is not None else e

    def _gpu_spec(self) -> dict:
        return {"source": "mattis", "xi": self.xi, "matrix_seed": 0,
                "rows": np.zeros((1, 1), np.uint32)}  # fmt: skip


class RandomSource(_Source):
    """A seeded random symmetric ±1 matrix (J_ij from splitmix64 of the pair (min, max) and the
    seed), generated tile by tile: any n, no storage."""

    def __init__(self, n: int, seed: int = 0):
        if not isinstance(n, (int, np.integer)) or n < 2:
            raise ValueError(f"n must be an integer >= 2, got {n!r}")
        if not 0 <= seed < 2**64:
            raise ValueError("seed must be in [0, 2^64)")
        self.n, self.seed = int(n), int(seed)

    def tile(self, r0: int, rows: int) -> np.ndarray:
        return _ext().random_tile(self.n, self.seed, r0, rows)

    def _gpu_spec(self) -> dict:
        return {"source": "random", "xi": np.zeros(0, np.int8), "matrix_seed": self.seed,
                "rows": np.zeros((1, 1), np.uint32)}  # fmt: skip


class MemmapSource(_Source):
    """A matrix stored by `write_bitmatrix`: n then the rows, read through `numpy.memmap`."""

    def __init__(self, path: str | os.PathLike):
        path = Path(path)
        if not path.is_file():
            raise ValueError(f"{path}: no such file")
        head = np.fromfile(path, "<u8", 1)
        if head.size != 1 or head[0] < 2:
            raise ValueError(f"{path}: not a bit matrix (bad header)")
        self.n = int(head[0])
        need = 8 + self.n * self.row_bytes
        if path.stat().st_size != need:
            raise ValueError(
                f"{path}: {path.stat().st_size} bytes, a {self.n}-spin matrix has {need}"
            )
        self.path = path
        self._rows = np.memmap(path, "<u4", "r", 8, (self.n, self.nwords))

    def tile(self, r0: int, rows: int) -> np.ndarray:
        return np.ascontiguousarray(self._rows[r0 : r0 + rows])

    def _gpu_spec(self) -> dict:  # the host threads copy rows straight from the mapping
        return {"source": "rows", "xi": np.zeros(0, np.int8), "matrix_seed": 0,
                "rows": self._rows}  # fmt: skip


def write_bitmatrix(path: str | os.PathLike, source, rows_per_tile: int = 4096) -> Path:
    """Write a ±1 matrix (a source, or an `IsingModel` of kind "binary") for `MemmapSource`:
    u64 n, then n rows of ceil(n/32) little-endian u32 words."""
    from cuscikit.ising.model import IsingModel

    if isinstance(source, IsingModel):
        if source.kind != "binary" or np.any(source.h):
            raise ValueError("only ±1 couplings without a field can be streamed")
        plus = source.coupling_arrays()["plus"].reshape(source.n, source.nwords)

        class _Model(_Source):
            n = source.n

            def tile(self, r0, rows):
                return plus[r0 : r0 + rows]

        source = _Model()
    path = Path(path)
    with open(path, "wb") as fh:
        np.array([source.n], "<u8").tofile(fh)
        for _, bits in source.tiles(rows_per_tile):
            np.ascontiguousarray(bits, "<u4").tofile(fh)
    return path


@dataclass
class StreamResult:
    """What `solve_streamed` returns: best spins and energy, per-pass records (as `solve`'s
    `history`: restart, step, e_min, e_best, checksum), and the streaming rate."""

    spins: np.ndarray
    energy: int
    replica_energies: np.ndarray
    history: np.ndarray
    x: np.ndarray
    y: np.ndarray
    passes: int
    bytes_streamed: int
    wall_s: float
    timings: dict = field(default_factory=dict)
    device: str = "cpu"

    @property
    def gb_per_s(self) -> float:
        """Coupling payload streamed per second of the whole run (10^9 bytes/s)."""
        return self.bytes_streamed / self.wall_s / 1e9 if self.wall_s > 0 else 0.0


def h2d_rate(bytes_per_copy: int = 256 * 2**20, copies: int = 16) -> float:
    """The pinned host-to-device copy rate of the current GPU in 10^9 bytes/s: `copies` copies of
    `bytes_per_copy` queued back to back on one stream (the ceiling a streamed run can reach)."""
    from cuscikit.backends.loader import cuda

    if bytes_per_copy < 1 or copies < 1:
        raise ValueError("bytes_per_copy and copies must be positive")
    return float(cuda().ising.h2d_rate(int(bytes_per_copy), int(copies)))


def _check_stream_options(source, h, tile_bytes, device, threads, slots, device_buffers,
                          streaming_stores):  # fmt: skip
    if not isinstance(source, _Source):
        raise ValueError(f"source must be a coupling source, got {type(source).__name__}")
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
    if tile_bytes is not None and (not isinstance(tile_bytes, (int, np.integer)) or tile_bytes < 1):
        raise ValueError(f"tile_bytes must be a positive integer, got {tile_bytes!r}")
    for name, v, low in (("threads", threads, 0), ("slots", slots, 2),
                         ("device_buffers", device_buffers, 2)):  # fmt: skip
        if not isinstance(v, (int, np.integer)) or v < low:
            raise ValueError(f"{name} must be an integer >= {low}, got {v!r}")
    if not isinstance(streaming_stores, bool):
        raise ValueError(f"streaming_stores must be True or False, got {streaming_stores!r}")
    n = source.n
    h = np.zeros(n, np.int64) if h is None else np.asarray(h)
    if h.shape != (n,) or np.any(h != np.round(h)) or np.abs(h).max(initial=0) > 2**24:
        raise ValueError(f"h must be {n} integers with |h_i| <= 2^24")
    if device == "cuda":
        from cuscikit.backends.loader import cuda

        cuda()  # a missing extension or GPU fails here, before any work
    return h


def _run(source, agents, steps, dt, seed, h, a0, tile_bytes, progress, device, threads, slots,
         device_buffers, time_limit, streaming_stores) -> StreamResult:  # fmt: skip
    from cuscikit.ising.model import coupling_scale
    from cuscikit.ising.solver import HISTORY_DTYPE, unpack_signs

    n = source.n
    c0 = coupling_scale(n, n * (n - 1), h)  # every off-diagonal J_ij is +-1
    if tile_bytes is None:
        tile_bytes = (16 if device == "cuda" else 64) * 2**20
    rows = max(1, min(n, tile_bytes // source.row_bytes))
    timings = {}
    if device == "cuda":
        from cuscikit.backends.loader import cuda

        if threads == 0:  # the cores this process may use (not the host's), less two
            cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 0
            threads = max(1, (cores or os.cpu_count() or 3) - 2)
        *raw, stats = cuda().ising.stream_run(
            h=h.astype(np.int32), replicas=int(agents), steps=int(steps), dt=float(dt),
            a0=float(a0), c0=float(c0), seed=int(seed), request=0, tile_rows=int(rows),
            slots=int(slots), device_buffers=int(device_buffers), threads=int(threads),
            time_limit_s=float(time_limit or 0.0), streaming_stores=streaming_stores, n=n,
            **source._gpu_spec(),
        )  # fmt: skip
        wall, passes = stats["wall_s"], stats["passes"]
        timings.update(stats)
        if not stats["complete"]:
            raise TimeoutError(
                f"time_limit {time_limit} s reached after {stats['tiles']} tiles "
                f"({stats['bytes'] / 1e9:.1f} GB in {wall:.1f} s, "
                f"{stats['bytes'] / wall / 1e9:.2f} GB/s)"
            )
        energy, checksum, best_e, best_words, x, y = raw
    else:
        run = _ext().StreamRun(n, h.astype(np.int32), int(agents), int(steps), float(dt),
                               float(a0), float(c0), int(seed), 0)  # fmt: skip
        bar = None
        if progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=run.passes, desc="passes", unit="pass")
        t0 = time.perf_counter()
        t_fetch = 0.0
        for _ in range(run.passes):
            it = source.tiles(rows)
            while True:
                t1 = time.perf_counter()
                nxt = next(it, None)
                t_fetch += time.perf_counter() - t1
                if nxt is None:
                    break
                run.add_tile(nxt[0], np.ascontiguousarray(nxt[1], np.uint32))
            run.end_pass()
            if bar is not None:
                bar.update(1)
        wall = time.perf_counter() - t0
        if bar is not None:
            bar.close()
        passes = run.passes
        timings["fetch_s"] = t_fetch
        energy, checksum, best_e, best_words, x, y = run.result()
    hist = np.zeros(steps + 1, HISTORY_DTYPE)
    hist["step"] = np.arange(steps + 1)
    hist["e_min"] = energy.min(1)
    hist["e_best"] = np.minimum.accumulate(hist["e_min"])
    with np.errstate(over="ignore"):
        hist["checksum"] = checksum.sum(1, dtype=np.uint64)
    b = int(np.argmin(best_e))
    spins = unpack_signs(best_words[b : b + 1], n)[0]
    timings["raw"] = (energy, checksum, best_e, best_words)
    return StreamResult(
        spins=spins,
        energy=int(best_e[b]),
        replica_energies=best_e,
        history=hist,
        x=x,
        y=y,
        passes=passes,
        bytes_streamed=passes * n * source.row_bytes,
        wall_s=wall,
        timings=timings,
        device=device,
    )


def solve_streamed(
    source,
    agents: int = 8,
    steps: int = 100,
    dt: float = 0.5,
    seed: int = 0,
    h=None,
    a0: float = 1.0,
    tile_bytes: int | None = None,
    progress: bool = False,
    device: str = "cpu",
    threads: int = 0,
    slots: int = 8,
    device_buffers: int = 3,
    time_limit: float | None = None,
    streaming_stores: bool = False,
) -> StreamResult:
    """dSB with the couplings streamed from `source` in row tiles of about `tile_bytes`.

    Args:
        source: a `MattisSource`, `RandomSource` or `MemmapSource`.
        agents, steps, dt, seed, a0: as in `solve` (restart 0).
        h: an integer field (default 0).
        tile_bytes: bytes of couplings per tile (None: 64 MiB on the CPU, 16 MiB on the GPU, the
            fastest of 4, 16 and 64 MiB measured on an H200).
        progress: a tqdm bar over the passes (CPU).
        device: "cpu" or "cuda" (the same records, byte for byte).
        threads: host threads filling tiles on the GPU path (0: the cores this process may use
            less two).
        slots, device_buffers: pinned host and device tile buffers of the GPU path.
        time_limit: seconds after which the GPU path stops issuing tiles and raises TimeoutError
            (with the rate reached); None: no limit.
        streaming_stores: the GPU path's Mattis generator writes its pinned buffers with
            non-temporal stores (no read-for-ownership; the lines leave the caches).

    Raises:
        ValueError: bad options (before any work).
    """
    from cuscikit.ising.solver import check_run_options

    h = _check_stream_options(source, h, tile_bytes, device, threads, slots, device_buffers,
                              streaming_stores)  # fmt: skip
    check_run_options(agents, steps, dt, seed, a0)
    return _run(source, agents, steps, dt, seed, h, a0, tile_bytes, progress, device, threads,
                slots, device_buffers, time_limit, streaming_stores)  # fmt: skip


def score_streamed(
    source,
    agents: int = 8,
    seed: int = 0,
    h=None,
    tile_bytes: int | None = None,
    device: str = "cpu",
    threads: int = 0,
    slots: int = 8,
    device_buffers: int = 3,
    time_limit: float | None = None,
    streaming_stores: bool = False,
) -> StreamResult:
    """One pass over the couplings that scores the initial signs of `agents` replicas (those of
    `solve_streamed` with the same seed: its first record), without a step. Options as in
    `solve_streamed`; `passes` is 1 and `history` has the one record of step 0."""
    from cuscikit.ising.solver import check_run_options

    h = _check_stream_options(source, h, tile_bytes, device, threads, slots, device_buffers,
                              streaming_stores)  # fmt: skip
    check_run_options(agents, 1, 0.5, seed, 1.0)
    return _run(source, agents, 0, 0.5, seed, h, 1.0, tile_bytes, False, device, threads, slots,
                device_buffers, time_limit, streaming_stores)  # fmt: skip
