"""Discrete simulated bifurcation (dSB) for Ising models, on the CPU (C++/OpenMP) or a CUDA GPU,
with the same bytes on both for integer couplings.

Method (Goto et al., "High-performance combinatorial optimization based on classical mechanics",
Science Advances 7, eabe7953 (2021), DOI 10.1126/sciadv.abe7953): each of B replicas ("agents")
carries positions x and momenta y in float32, started from small Philox4x32-10 draws. Step
k = 1..S, from the signs s of x:

    a_i = sum_j J_ij s_j + h_i                  (exact integer)
    y_i += dt (c0 a_i - (a0 - a0 k/S) x_i)      (kick; the pump rises linearly 0 -> a0)
    x_i += dt a0 y_i                            (drift)
    |x_i| > 1:  x_i = sgn x_i, y_i = 0          (inelastic walls)

with c0 = 0.5 sqrt(n_e - 1) / sqrt(||J||_F^2 + 2 ||h||^2). Every spin vector met (S + 1 of them
per replica) is scored exactly; the answer is the best one over all replicas (the lowest replica
on ties). ``history`` has one row per spin vector: the step, the lowest energy among the
replicas, the best so far and a 64-bit checksum of all replicas' signs.

Example (a 4-cycle: the two colourings cut all 4 edges):
    >>> from cuscikit.ising import IsingModel, solve
    >>> m = IsingModel.from_edges(4, [(0, 1, 1), (1, 2, 1), (2, 3, 1), (3, 0, 1)])
    >>> r = solve(m, agents=4, steps=50, seed=1)
    >>> r.cut, r.energy, m.energy(r.spins) == r.energy
    (4, -4, True)
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from cuscikit.ising.model import IsingModel
from cuscikit.lib.solver import Solver

__all__ = ["DSBResult", "DSBSolver", "solve", "greedy_descent", "unpack_signs"]

POLISH_ROWS = 32  # replicas that `solve(..., polish=True)` finishes with greedy single flips
# reduce="auto" runs on the kernel when it keeps at most this fraction of the spins
REDUCE_AUTO_FRACTION = 0.5

HISTORY_DTYPE = np.dtype(
    [
        ("restart", np.int32),
        ("step", np.int32),
        ("e_min", np.float64),
        ("e_best", np.float64),
        ("checksum", np.uint64),
    ]
)


@dataclass
class DSBResult:
    """What `solve` returns.

    Attributes:
        spins: (n,) int8, the best spin vector found.
        energy: its energy E = -1/2 s^T J s - h^T s (an int for integer models).
        value: (energy + offset) / scale: the cut, QUBO value or dimod energy.
        cut: the cut weight for graph models, else None.
        replica_energies: (B,) the best energy of each replica (of the best restart).
        replica_spins: (B, n) int8, each replica's best spins.
        history: structured array (restart, step, e_min, e_best, checksum), one row per scored
            spin vector (S + 1 per restart).
        x, y: (B, n) float32 final state of the last restart (of the kernel's spins when reduced).
        kernel_n: spins of the reduced model dSB ran on (`solve(..., reduce=...)`), else None.
        wall_s: wall time of the whole call; timings: per phase.
    """

    spins: np.ndarray
    energy: int | float
    value: int | float
    cut: int | float | None
    replica_energies: np.ndarray
    replica_spins: np.ndarray
    history: np.ndarray
    x: np.ndarray
    y: np.ndarray
    wall_s: float
    device: str
    kind: str
    agents: int
    steps: int
    restarts: int
    polished: bool = False
    kernel_n: int | None = None
    timings: dict = field(default_factory=dict)

    @property
    def binary(self) -> np.ndarray:
        """The best spins as 0/1 variables x = (1 + s) / 2 (QUBO and BINARY models)."""
        return ((self.spins + 1) // 2).astype(np.int8)


def unpack_signs(words: np.ndarray, n: int) -> np.ndarray:
    """(B, W) uint32 sign words to (B, n) int8 spins."""
    words = np.ascontiguousarray(words, dtype="<u4")
    bits = np.unpackbits(words.view(np.uint8), axis=1, bitorder="little")[:, :n]
    return (2 * bits.astype(np.int8) - 1).astype(np.int8)


def greedy_descent(model: IsingModel, spins) -> np.ndarray:
    """Flip single spins while one lowers the energy (the largest decrease first, the lowest
    index on ties): a deterministic local minimum, the same whatever device found `spins`.
    A (k, n) stack descends row by row (each row as it would alone), in one pass over the rows.

    Example:
        >>> m = IsingModel.from_edges(3, [(0, 1, 1), (1, 2, 1)])
        >>> greedy_descent(m, [1, 1, 1]).tolist()
        [1, -1, 1]
        >>> greedy_descent(m, [[1, 1, 1], [1, -1, 1]]).tolist()
        [[1, -1, 1], [1, -1, 1]]
    """
    s = model._spins(spins)
    single = s.ndim == 1
    S = np.atleast_2d(s).copy()
    J = model.J.tocsr()  # symmetric: row i holds column i
    A = np.asarray(J @ S.T).T + model.h  # (k, n) local fields
    active = np.arange(len(S))
    while active.size:
        delta = 2 * S[active] * A[active]  # E(flip i) - E(s), per row
        idx = np.argmin(delta, axis=1)
        go = delta[np.arange(active.size), idx] < 0
        active, idx = active[go], idx[go]
        for r, i in zip(active.tolist(), idx.tolist(), strict=True):
            S[r, i] = -S[r, i]
            row = slice(J.indptr[i], J.indptr[i + 1])
            A[r, J.indices[row]] += 2 * S[r, i] * J.data[row]
    out = S.astype(np.int8)
    return out[0] if single else out


def _backend(device: str):
    if device == "cpu":
        from cuscikit.backends.loader import core

        return core().ising
    if device == "cuda":
        from cuscikit.backends.loader import cuda

        return cuda().ising
    raise ValueError(f"device must be 'cpu', 'cuda' or 'auto', got {device!r}")


def resolve(device) -> str:
    if device in (None, "auto"):
        from cuscikit.backends.loader import cuda_available

        return "cuda" if cuda_available() else "cpu"
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu', 'cuda' or 'auto', got {device!r}")
    return device


def run_kernel(
    model: IsingModel,
    agents: int,
    steps: int,
    dt: float,
    seed: int,
    a0: float = 1.0,
    device: str = "cpu",
    request: int = 0,
    arrays: dict | None = None,
    tile_replicas: int = 0,
):
    """One dSB run in the compiled kernels: (energy[S+1, B], checksum[S+1, B], best_energy[B],
    best_signs[B, W], x[B, n], y[B, n]). `tile_replicas` (CUDA only): replicas per block tile of
    the GPU kernel, 64 or 128 (0: chosen from the sizes); it changes the speed, not the bytes."""
    arrays = model.coupling_arrays() if arrays is None else arrays
    ext = _backend(device)
    c0 = float(model.c0())
    seed = int(seed) & (2**64 - 1)
    if model.kind == "float32":
        if device != "cpu":
            raise ValueError(
                "float32 couplings run on the CPU only; scale J and h to integers (|J| <= 127) "
                "for the GPU"
            )
        return ext.run_float(
            model.n, arrays["J"], arrays["h"], agents, steps, dt, a0, c0, seed, request
        )
    extra = {"tile_replicas": tile_replicas} if device == "cuda" else {}
    return ext.run_exact(
        arrays["kind"],
        model.n,
        arrays["plus"],
        arrays["minus"],
        arrays["degree"],
        arrays["j8"],
        arrays["h"],
        agents,
        steps,
        dt,
        a0,
        c0,
        seed,
        request,
        **extra,
    )


def check_run_options(agents, steps, dt, seed, a0) -> None:
    """The options every dSB run takes (resident or streamed); ValueError before any work."""
    for name, v in (("agents", agents), ("steps", steps)):
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    if agents > 2**31 - 1 or steps > 2**31 - 2:
        raise ValueError("agents and steps must fit in int32")
    for name, v in (("dt", dt), ("a0", a0)):
        if not (isinstance(v, (int, float, np.floating)) and np.isfinite(v) and v > 0):
            raise ValueError(f"{name} must be a positive finite number, got {v!r}")
    if not isinstance(seed, (int, np.integer)) or not 0 <= seed < 2**64:
        raise ValueError(f"seed must be an integer in [0, 2^64), got {seed!r}")


def _check(model, agents, steps, dt, seed, a0, time_limit, restarts, reduce="auto"):
    if not isinstance(model, IsingModel):
        raise ValueError(f"model must be an IsingModel, got {type(model).__name__}")
    if reduce not in ("auto", True, False):
        raise ValueError(f"reduce must be 'auto', True or False, got {reduce!r}")
    if reduce is True and np.any(model.h):
        raise ValueError("reduce=True needs a model without field (h = 0)")
    check_run_options(agents, steps, dt, seed, a0)
    if restarts is not None and (not isinstance(restarts, (int, np.integer)) or restarts < 1):
        raise ValueError(f"restarts must be a positive integer, got {restarts!r}")
    if time_limit is not None and not (np.isfinite(time_limit) and time_limit > 0):
        raise ValueError(f"time_limit must be a positive number of seconds, got {time_limit!r}")


def solve(
    model: IsingModel,
    agents: int = 128,
    steps: int = 2000,
    dt: float = 0.5,
    seed: int = 0,
    device: str | None = "cpu",
    time_limit: float | None = None,
    a0: float = 1.0,
    restarts: int | None = None,
    polish: bool = False,
    reduce: bool | str = "auto",
) -> DSBResult:
    """Minimise the model's energy with dSB.

    Args:
        model: an `IsingModel`.
        agents: replicas B run side by side (replica b's start depends on (seed, b) only).
        steps: S, the length of the pump schedule.
        dt: time step (stable below about 2 / sqrt(a0 (a0 + c0 rho)), rho = -lambda_min(J)).
        seed: 64-bit seed of the Philox draws.
        device: "cpu", "cuda" or "auto"/None (the GPU when usable).
        time_limit: with `restarts` unset, run restarts (restart r draws its start with Philox
            counter word 3 = r) until the next one would end past this many seconds (at least
            one). The number of restarts then depends on the machine's speed; each restart is
            reproducible on its own.
        a0: the pump's final value (and the drift scale).
        restarts: a fixed number of restarts (default 1, or as many as fit in `time_limit`).
        polish: finish the best spins of the best restart's POLISH_ROWS lowest replicas (all
            replicas when fewer) with `greedy_descent` and keep the lowest result (the lowest
            replica on ties); deterministic, on the CPU.
        reduce: run dSB on the exact kernel of `cuscikit.ising.reduce.reduce_model` (spins of
            degree <= 2 eliminated; models without field) and expand its spins: True, False,
            or "auto" (the default): reduce when h = 0, some spin has degree <= 2, and the
            kernel keeps at most half of the spins (REDUCE_AUTO_FRACTION) with couplings as
            exact as the model's. The history's energies are then the model's (kernel energy +
            constant), its checksums the kernel's; CPU and GPU still give the same bytes.

    Returns:
        A `DSBResult`.

    Raises:
        ValueError: bad options (before any work).
    """
    _check(model, agents, steps, dt, seed, a0, time_limit, restarts, reduce)
    device = resolve(device)
    if model.kind == "float32" and device != "cpu":
        raise ValueError(
            "float32 couplings run on the CPU only; scale J and h to integers (|J| <= 127) for "
            "the GPU"
        )
    _backend(device)  # a missing extension or GPU fails here, before any work
    t0 = time.perf_counter()
    red = _reduction(model, reduce)
    if red is not None:
        return _solve_reduced(
            model, red, t0, agents, steps, dt, seed, device, time_limit, a0, restarts, polish
        )
    arrays = model.coupling_arrays()
    t_prep = time.perf_counter() - t0
    n_max = restarts if restarts is not None else (1 if time_limit is None else 2**31 - 1)
    best_e, best = None, None
    history = []
    run_times = []
    r = 0
    while r < n_max:
        if time_limit is not None and r > 0:
            elapsed = time.perf_counter() - t0
            if elapsed + max(run_times) > time_limit:
                break
        t1 = time.perf_counter()
        energy, checksum, rep_e, rep_words, x, y = run_kernel(
            model, agents, steps, dt, seed, a0, device, request=r, arrays=arrays
        )
        run_times.append(time.perf_counter() - t1)
        e_min = energy.min(1)
        prev = np.inf if best_e is None else best_e
        h = np.zeros(steps + 1, HISTORY_DTYPE)
        h["restart"] = r
        h["step"] = np.arange(steps + 1)
        h["e_min"] = e_min
        h["e_best"] = np.minimum.accumulate(np.minimum(e_min, prev))
        with np.errstate(over="ignore"):
            h["checksum"] = checksum.sum(1, dtype=np.uint64)
        history.append(h)
        b = int(np.argmin(rep_e))
        if best_e is None or rep_e[b] < best_e:
            best_e = rep_e[b]
            best = (rep_e, rep_words, b)
        last_state = (x, y)
        r += 1
    rep_e, rep_words, b = best
    replica_spins = unpack_signs(rep_words, model.n)
    spins = replica_spins[b].copy()
    exact = model.exact
    if exact:
        energy = int(best_e)
    else:  # the kernel scored with float32 couplings: rescore in float64
        rep_e = model.energy(replica_spins)
        energy = model.energy(spins)
    spins, energy, t_polish = _polish(model, replica_spins, rep_e, spins, energy, polish)
    value = model.value(spins)
    wall = time.perf_counter() - t0
    return DSBResult(
        spins=spins,
        energy=energy,
        value=value,
        cut=value if model.source == "graph" else None,
        replica_energies=rep_e.astype(np.int64 if exact else np.float64),
        replica_spins=replica_spins,
        history=np.concatenate(history),
        x=last_state[0],
        y=last_state[1],
        wall_s=wall,
        device=device,
        kind=model.kind,
        agents=agents,
        steps=steps,
        restarts=r,
        polished=polish,
        timings={"prepare_s": t_prep, "runs_s": run_times, "polish_s": t_polish},
    )


def _reduction(model: IsingModel, reduce):
    """The reduction `solve` runs on, or None (see `solve`'s `reduce`)."""
    if reduce is False or np.any(model.h):
        return None
    if reduce == "auto":
        if not np.any(model.J.getnnz(axis=1) <= 2):
            return None
    from cuscikit.ising.reduce import reduce_model

    red = reduce_model(model)
    if reduce == "auto" and (
        red.model.n > REDUCE_AUTO_FRACTION * model.n or red.model.exact != model.exact
    ):
        return None
    return red


def _solve_reduced(
    model, red, t0, agents, steps, dt, seed, device, time_limit, a0, restarts, polish
):
    """`solve` on the kernel of `red`, expanded to the model's spins (then polished there)."""
    t_reduce = time.perf_counter() - t0
    left = None if time_limit is None else max(time_limit - t_reduce, 1e-9)
    r = solve(
        red.model, agents, steps, dt, seed, device, left, a0, restarts, polish=False, reduce=False
    )
    t1 = time.perf_counter()
    replica_spins = red.expand(r.replica_spins)
    rep_e = r.replica_energies + red.constant
    spins = replica_spins[int(np.argmin(rep_e))].copy()
    energy = r.energy + red.constant
    t_expand = time.perf_counter() - t1
    history = r.history.copy()
    history["e_min"] += red.constant
    history["e_best"] += red.constant
    spins, energy, t_polish = _polish(model, replica_spins, rep_e, spins, energy, polish)
    value = model.value(spins)
    timings = dict(r.timings, reduce_s=t_reduce, expand_s=t_expand, polish_s=t_polish)
    return DSBResult(
        spins=spins,
        energy=energy,
        value=value,
        cut=value if model.source == "graph" else None,
        replica_energies=rep_e,
        replica_spins=replica_spins,
        history=history,
        x=r.x,
        y=r.y,
        wall_s=time.perf_counter() - t0,
        device=r.device,
        kind=r.kind,
        agents=agents,
        steps=steps,
        restarts=r.restarts,
        polished=polish,
        kernel_n=red.model.n,
        timings=timings,
    )


def _polish(model, replica_spins, rep_e, spins, energy, polish=True):
    """`greedy_descent` from the POLISH_ROWS lowest replicas; the lowest result if it is lower.
    Returns (spins, energy, seconds spent); without `polish`, the input and 0.0."""
    if not polish:
        return spins, energy, 0.0
    t0 = time.perf_counter()
    order = np.argsort(rep_e, kind="stable")[:POLISH_ROWS]
    cand = greedy_descent(model, replica_spins[order])
    e = model.energy(cand)
    j = int(np.argmin(e))
    if e[j] < energy:
        spins, energy = cand[j], e[j].item()
    return spins, energy, time.perf_counter() - t0


class DSBSolver(Solver):
    """`solve` as a solver object (PySCF style): options as attributes, `kernel(model)` stores
    `result`, `energy` and `spins` and returns the energy.

    Example:
        >>> from cuscikit.ising import DSBSolver, IsingModel
        >>> m = IsingModel.from_edges(3, [(0, 1, 2), (1, 2, 2), (0, 2, 2)])
        >>> DSBSolver(agents=4, steps=40).run(m).result.cut
        4
    """

    agents = 128
    steps = 2000
    dt = 0.5
    seed = 0
    device = "cpu"
    time_limit = None
    a0 = 1.0
    restarts = None
    polish = False
    reduce = "auto"
    _keys = {"result", "energy", "spins"}

    def kernel(self, model: IsingModel):
        self.check_sanity()
        self.dump_flags()
        self.result = solve(model, **self.options_for_solve())
        self.energy = self.result.energy
        self.spins = self.result.spins
        return self.energy

    def options_for_solve(self) -> dict:
        opts = self.options()
        opts.pop("verbose", None)
        return opts
