"""Stages 1-3 of one NNQS-SCI iteration, written once for every device and every rank count.

The iteration of "A Fully GPU-Accelerated Framework for High-Performance Configuration
Interaction Selection with Neural Network Quantum States" (sections 4.1-4.3; our account in
``docs/nnqs_sci.md``). Two parameters make every combination run through this one code path:

- the *engine* (`cuscikit.sci.engines`): the determinant kernels on the host (compiled C++ on
  numpy arrays) or on a GPU (CUDA kernels on torch tensors);
- the *communicator* (`cuscikit.parallel.comm`): one process, threads, gloo, NCCL or MPI.

On rank r of P (P = 1 is the single-process run):

1. **Generation and local de-dup**, in batches of this rank's sources (a contiguous share of S)
   sized from the memory budget. Each batch's coupled set (the "cold" data: configurations and
   matrix elements) stays where it was made, or waits in pinned host memory when it does not fit
   on the GPU; the batch-unique keys are merged into L, this rank's sorted unique keys (sources
   included).
   *Barrier 1*: the global de-dup of L over the ranks (`cuscikit.parallel.dedup`) gives this
   rank its slice U_r of the unique set U and the routing from U_r back to L.
2. **Inference** of ln psi over U_r in batches, with a running top-K of |psi| over U_r \\ S. The
   rows of U_r that are this rank's sources take their values from the forward pass that keeps
   the graph for the loss (when the sources fit in one batch).
   *Barrier 2*: psi routed from the owners to L, and the top-Ks merged into the global one (the
   same on every rank, and equal to a single-process top-K over U).
3. **Local energies**, batch by batch over the cold data: each coupled configuration is located
   in L (hash lookup on the host, binary search on the GPU) and its H_xx' psi(x') summed per
   source, over all of C(x) (coupled estimator) and over C(x) within S (variational estimator).
   With ``pt2``, the same pass sums sum_x H_ax psi(x) per configuration a outside S; the sums
   are added up on a's owner (`GlobalDedup.reduce`), which also evaluates H_aa: the terms of
   the Epstein-Nesbet second-order energy (the Runner divides by E_var - H_aa).

On one rank, once S has stayed the same for two iterations (the same configurations in the same
order: a space that has stopped growing), everything that depends on S alone is kept from the
second of them and reused while S stays (`Pipeline.reuse_space`): stage 1 and barrier 1 (the coupled
sets, L, U and the routing), the locations of the coupled configurations in L, H_xx of S, the
H_SS pairs, the PT2 rows outside S and their H_aa. Only what depends on psi runs again (the
inference over U, the selection, the numerators), so the results are those of a fresh iteration
exactly, without its sorts, searches and host synchronisations.

A GPU stage that runs out of memory is repeated with smaller batches in single-process runs; on
several ranks the error ends the failing rank's run, and the others stop at their next
collective (`cuscikit.parallel.CommError` under torch.distributed; mpiexec ends the job).
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field

import numpy as np
import torch

from cuscikit.backends.arrays import index_add
from cuscikit.backends.keys import is_tensor, sort_unique
from cuscikit.nnqs.distributed import gather_selection, source_share
from cuscikit.nnqs.topk import RunningTopK, TorchTopK
from cuscikit.parallel.comm import Comm, SerialComm
from cuscikit.parallel.dedup import DedupMetrics, global_dedup

_MAX_RETRIES = 12
_SELECT_ROWS = 1 << 24  # inference rows per update of the top-K on a device (each update waits
# on the device several times; per inference batch those waits left it idle for about a tenth
# of the N2/cc-pVDZ inference, docs/performance.md#iteration-parts)
STAGING = ("auto", "device", "host")


@dataclass
class StageResult:
    """What stages 1-3 hand to the Runner for the loss, the optimiser step and the growth of S.

    Per-source arrays cover this rank's sources, rows ``share[0]:share[1]`` of S, and live on
    the engine's device (numpy on the host, torch tensors on a GPU).

    Attributes:
        share: (lo, hi), this rank's rows of S.
        psi_s: psi(x) = exp(ln psi(x) - shift) of this rank's sources (complex128).
        eloc_coupled: local energies over all of C(x) (complex128).
        eloc_variational: local energies over C(x) within S (complex128).
        hdiag: <x|H|x> of this rank's sources.
        lp_graph: ln psi of this rank's sources with its autograd graph, or None (the loss
            then recomputes them batch by batch).
        space_pairs: (source row in S, target row in S, H value) for the off-diagonal H_SS
            entries of this rank's sources (inner steps), or None.
        new_configs: the top-K new configurations (host uint64), best first; every rank alike.
        keep_rows, keep_configs, keep_scores: global row in U, configuration and ln|psi| of S
            followed by the new ones (host arrays), for a cap on |S|; every rank alike.
        n_coupled: coupled configurations generated by this rank.
        n_unique: |U| over all ranks.
        times: seconds per stage (generation, dedup, inference, energy).
        loads: (sources, coupled, owned unique, busy seconds) of this rank.
        dedup: metrics of the global de-dup.
        bytes_staged: bytes of cold data parked in pinned host memory.
        n_batches: stage-1 batches.
        peak_theoretical: bytes every intermediate would hold at once, unbatched (GPU).
        pt2_numerators: |sum_x H_ax psi(x)|^2 over this rank's owned a outside S (with
            ``pt2``; the psi of `psi_s`, not normalised), else None.
        pt2_diagonal: H_aa of the same a.
        pt2_keys: the same a as engine keys (their first-order weights drive the growth of S
            under ``Runner(growth="weight")``).
    """

    share: tuple[int, int]
    psi_s: object
    eloc_coupled: object
    eloc_variational: object
    hdiag: object
    lp_graph: torch.Tensor | None
    space_pairs: tuple | None
    new_configs: np.ndarray
    keep_rows: np.ndarray
    keep_configs: np.ndarray
    keep_scores: np.ndarray
    n_coupled: int
    n_unique: int
    times: dict = field(default_factory=dict)
    loads: tuple = (0, 0, 0, 0.0)
    dedup: DedupMetrics | None = None
    bytes_staged: int = 0
    n_batches: int = 1
    peak_theoretical: float = float("nan")
    pt2_numerators: object = None
    pt2_diagonal: object = None
    pt2_keys: object = None


class _SpaceData:
    """What stage 1 and barrier 1 give for a space S (the coupled sets, L, U, the routing), and
    the S-only values of stages 2 and 3, computed by the first iteration that needs them
    (`memo`). `Pipeline` keeps one for the next iteration while S does not change (one rank).
    Nothing here is written after it is made: the stages read it, every iteration's results
    are new arrays."""

    def __init__(self, configs, lo, hi, S, m, batches, cold, staged, L, gd, sloc_in_L,
                 in_space_U, in_space_L, model_bytes):  # fmt: skip
        self.configs = np.array(configs, copy=True)  # the host S, for the equality test
        self.lo, self.hi, self.S, self.m = lo, hi, S, m
        self.batches, self.cold, self.staged = batches, cold, staged
        self.L, self.gd, self.U = L, gd, gd.unique
        self.sloc_in_L, self.in_space_U, self.in_space_L = sloc_in_L, in_space_U, in_space_L
        self.model_bytes = model_bytes
        self.memo: dict = {}

    def get(self, key, make):
        """The value of `key`, made by ``make()`` the first time."""
        if key not in self.memo:
            self.memo[key] = make()
        return self.memo[key]


class Pipeline:
    """Runs stages 1-3 for a Runner: one engine, one communicator.

    Args:
        engine: a `cuscikit.sci.engines.Engine` (host or CUDA kernels).
        ansatz: the ansatz (``log_psi``); it may live on another device than the engine (a
            CUDA ansatz over the host kernels: the baseline pipeline on a GPU).
        comm: the communicator (default: one process).
        batch_size: configurations per inference batch.
        budget: a `cuscikit.backends.MemoryBudget` for the engine's device.
        staging: where cold data waits between stages 1 and 3 on a GPU: "auto" (pinned host
            memory only when it does not fit), "device" or "host" (always: tests, measurements).
        compile_inference: evaluate ln psi over U with a `torch.compile`d forward pass (about
            2x the eager throughput of the default network on an H200, after a few seconds of
            compilation; results equal to float32 rounding).
        fused_inference: a `cuscikit.nnqs.fast_infer.FusedInference` of the ansatz: ln psi
            without gradient over U through the fused kernel (None: the module). Its first
            batch is checked against the module in float64 (`FusedInference.errors`); past
            1e-5 in ln psi, and past 4 times the float32 module's own error on that batch
            (a trained network can put the module itself past 1e-5), it is dropped with a
            warning and the module runs instead.
        want_pairs: also return the H_SS entries of this rank's sources (inner steps).
        pt2: also return the terms of the Epstein-Nesbet second-order correction.

    Attributes:
        reuse_space: on one rank, keep the S-only data (its coupled sets included) of an
            iteration whose S equals the last iteration's, and reuse it while S stays the same
            (default True; see the module docstring). A growing S keeps nothing beyond its
            iteration; cold data parked in host memory is not kept.
        reused: iterations so far that reused the S-only data.
    """

    def __init__(
        self,
        engine,
        ansatz,
        *,
        comm: Comm | None = None,
        batch_size: int = 16384,
        budget=None,
        staging: str = "auto",
        compile_inference: bool = False,
        fused_inference=None,
        want_pairs: bool = False,
        pt2: bool = False,
    ):
        if staging not in STAGING:
            raise ValueError(f"staging must be one of {STAGING}, got {staging!r}")
        self.engine, self.ansatz = engine, ansatz
        self.comm = comm if comm is not None else SerialComm()
        self.batch_size = int(batch_size)
        self.tensors = engine.tensors  # torch tensors between stages (else numpy arrays)
        self.gpu = self.tensors and torch.device(engine.device).type == "cuda"
        if budget is None:
            from cuscikit.backends.memory import MemoryBudget

            budget = MemoryBudget(engine.device)
        self.budget, self.staging = budget, staging
        self.want_pairs, self.pt2 = want_pairs, pt2
        self._infer = torch.compile(ansatz.log_psi) if compile_inference else ansatz.log_psi
        self.fused_inference = fused_inference
        self._fused_checked = False
        self._stash = None
        if self.gpu:
            from cuscikit.backends.staging import HostStaging

            self._stash = HostStaging(engine.device)
        self.item_cap = 0  # coupled configurations per stage-1 batch (set per iteration)
        self.item_limit: int | None = None  # set by out-of-memory retries, kept for later
        self.largest_batch = 0
        self.retries = 0  # out-of-memory retries so far
        self._stage = ""  # the stage running, for the retry policy
        # ln psi of the sources keeps its autograd graph for the loss (False: the Runner's
        # graphed optimiser stage recomputes it, so the values come without one)
        self.keep_graph = True
        # ln psi without gradient of at most `batch_size` rows through recorded CUDA graphs
        # (`cuscikit.nnqs.graphs.InferenceGraph`; set by the Runner with `graphs`), or None
        self.inference_graph = None
        self.reuse_space = True
        self.reused = 0
        self._space_cache: _SpaceData | None = None
        self._last_space: np.ndarray | None = None  # the last S (host copy)

    # ------------------------------------------------------------------------- memory plan
    def _bytes_per_item(self) -> int:
        """Bytes per coupled configuration while a stage-1 batch is processed: the
        configuration and its element, the sort's workspace and the unique output."""
        w8 = 8 * self.engine.words
        return (w8 + 8) + (w8 + 4) + w8 + 64 // max(1, self.engine.words)

    def _plan(self, counts: np.ndarray, resident: bool) -> list[tuple[int, int]]:
        """Split sources into batches whose coupled sets fit `item_cap`."""
        n = len(counts)
        avail = self.budget.available()
        if resident and self.gpu:  # the whole coupled set stays on the device: leave it room
            avail -= int(counts.sum()) * (8 * self.engine.words + 8)
        self.item_cap = max(1, avail // (2 * self._bytes_per_item()))
        if self.item_limit is not None:
            self.item_cap = min(self.item_cap, self.item_limit)
        cum = np.cumsum(counts)
        batches, lo = [], 0
        while lo < n:
            base = cum[lo - 1] if lo else 0
            hi = int(np.searchsorted(cum, base + self.item_cap, side="right"))
            hi = max(hi, lo + 1)
            batches.append((lo, min(hi, n)))
            lo = hi
        sizes = [int(cum[b - 1] - (cum[a - 1] if a else 0)) for a, b in batches]
        self.largest_batch = max(sizes, default=0)
        return batches

    def theoretical_peak(self, n: int, m: int, u: int, model_bytes: int) -> int:
        """Bytes held if every intermediate were resident at once (no batching): S, the
        coupled set, the global sort with its inverse index, U and its amplitudes."""
        from cuscikit.backends.keys import sort_unique_workspace_bytes

        w8 = 8 * self.engine.words
        sort_ws = sort_unique_workspace_bytes(n + m, self.engine.words, True) if n + m else 0
        return int(
            model_bytes
            + n * (w8 + 3 * 8 + 16)
            + m * (w8 + 8)
            + sort_ws
            + (n + m) * (8 + w8)
            + u * (16 + 16 + 1)
        )

    # ------------------------------------------------------------------------------ stages
    def run(self, space_configs: np.ndarray, topk: int) -> StageResult:
        """Stages 1-3 over the space S (host uint64, sorted, the same on every rank)."""
        if not self.gpu or self.comm.size > 1:
            return self._run(space_configs, topk)
        for attempt in range(_MAX_RETRIES):
            try:
                return self._run(space_configs, topk)
            except torch.cuda.OutOfMemoryError:
                stuck = (
                    self.batch_size <= 1 if self._stage == "inference" else self.largest_batch <= 1
                )
                if attempt == _MAX_RETRIES - 1 or stuck:
                    raise
                # Shrink what was running: the inference batches, or the stage-1/3 batches.
                if self._stage == "inference":
                    self.batch_size = max(1, self.batch_size // 2)
                else:
                    self.item_limit = max(1, self.largest_batch // 2)
                self.retries += 1
                self._space_cache = None  # the retry plans its batches again
                torch.cuda.empty_cache()
                limit = "no limit" if self.item_limit is None else f"{self.item_limit:,}"
                warnings.warn(
                    f"GPU out of memory in {self._stage}: retrying the iteration with "
                    f"{limit} on coupled configurations per batch and inference batches of "
                    f"{self.batch_size:,}",
                    ResourceWarning,
                    stacklevel=2,
                )
        raise AssertionError("unreachable")

    def _clock(self, t0: float) -> float:
        if self.gpu:
            torch.cuda.synchronize(self.engine.device)
        return time.perf_counter() - t0

    def _log_psi(self, configs, *, graph: bool) -> torch.Tensor:
        """ln psi (complex128, on the engine's device) of engine keys; with the graph or not."""
        if graph:
            lp = self.ansatz.log_psi(configs)
        else:
            x = (
                configs
                if is_tensor(configs)
                else torch.from_numpy(np.ascontiguousarray(configs).view(np.int64))
            )  # tensors in: compile-friendly
            lp = self._fused(x) if self.fused_inference is not None else None
            if lp is None and self.inference_graph is not None and len(x) <= self.batch_size:
                lp = self._graphed(x)
            if lp is None:
                lp = self._infer(x).detach()
        return self._to_engine(lp)

    def values(self, configs):
        """ln psi without gradient of host configurations (numpy uint64) or engine keys, as
        the inference stage computes it (the fused kernel, the recorded pass or the module):
        complex128 on the engine's device (numpy on the host engine)."""
        with torch.no_grad():
            return self._log_psi(configs, graph=False)

    def _fused(self, configs) -> torch.Tensor | None:
        """ln psi through the fused kernel; its first batch checked against the module in
        float64 (None, and the module from now on, when it misses both the tolerance and the
        float32 module's own error on that batch times `FusedInference.module_factor`)."""
        fused = self.fused_inference
        if not self._fused_checked:
            self._fused_checked = True
            err, module_err = fused.errors(configs[:256])
            limit = max(fused.tolerance, fused.module_factor * module_err)
            if not err <= limit:
                warnings.warn(
                    f"fused inference differs from the float64 module by {err:.1e} in ln psi "
                    f"(tolerance {fused.tolerance:.0e}, the float32 module {module_err:.1e}); "
                    "the module runs instead",
                    stacklevel=3,
                )
                self.fused_inference = None
                return None
        return fused(configs)

    def _graphed(self, configs) -> torch.Tensor | None:
        """ln psi through the recorded forward passes; None (and eager from now on) when
        recording fails."""
        try:
            return self.inference_graph(configs)
        except RuntimeError as exc:
            warnings.warn(
                f"recorded inference failed ({exc}); eager inference from now on",
                stacklevel=3,
            )
            self.inference_graph = None
            return None

    def _cached_space(self, space_configs: np.ndarray) -> _SpaceData | None:
        """The kept S-only data when S is the one it was made for (one rank, `reuse_space`);
        else None, and the kept data is let go (before the new S's stage 1 allocates)."""
        sd = self._space_cache
        if sd is None:
            return None
        if (
            self.reuse_space
            and self.comm.size == 1
            and sd.configs.shape == np.shape(space_configs)
            and np.array_equal(sd.configs, space_configs)
        ):
            return sd
        self._space_cache = None
        return None

    def _space_data(self, space_configs: np.ndarray, times: dict) -> _SpaceData:
        """Stage 1 and barrier 1 for S: the coupled sets (kept or parked), L, U, the routing."""
        eng, comm = self.engine, self.comm
        model_bytes = torch.cuda.memory_allocated(eng.device) if self.gpu else 0
        n_space = len(space_configs)
        lo, hi = source_share(n_space, comm.size, comm.rank)
        S = eng.keys(space_configs)
        S_loc = S[lo:hi]

        # Stage 1: generation and local de-dup per batch; the cold data stays or is parked.
        self._stage = "generation"
        t0 = time.perf_counter()
        counts = eng.coupled_counts(S_loc)
        m = int(counts.sum())
        resident = (
            not self.gpu
            or self.staging == "device"
            or (self.staging == "auto" and m * (8 * eng.words + 8) * 3 < self.budget.available())
        )
        batches = self._plan(counts, resident)
        times["generation"] += self._clock(t0)
        parts, cold, staged = [S_loc], [], 0
        for a, b in batches:
            t0 = time.perf_counter()
            offs, cfg, val = eng.coupled(S_loc[a:b], counts[a:b])
            times["generation"] += self._clock(t0)
            t0 = time.perf_counter()
            if len(batches) == 1:
                parts.append(cfg)  # one batch: a single sort below
            else:
                parts.append(sort_unique(cfg, return_inverse=False, end_bit=eng.end_bit))
                if sum(len(p) for p in parts) > self.item_cap:  # keep the merge in budget
                    parts = [sort_unique(eng.cat(parts), return_inverse=False, end_bit=eng.end_bit)]
            times["dedup"] += self._clock(t0)
            if resident or not self.gpu:
                cold.append((a, b, self._keep(offs, cfg, val)))
            else:
                parked = self._stash.park(offs, cfg, val)
                staged += parked.nbytes
                cold.append((a, b, parked))
            del cfg, val
        t0 = time.perf_counter()
        L = sort_unique(eng.cat(parts), return_inverse=False, end_bit=eng.end_bit)
        del parts
        # Barrier 1: this rank's slice of the global unique set, and the routing back to L.
        gd = global_dedup(L, comm, end_bit=eng.end_bit, sorted_unique=True)
        sloc_in_L = eng.locate(L, S_loc)
        in_space_U = eng.find(S, gd.unique) >= 0  # S is replicated: the owners know membership
        in_space_L = gd.fetch(in_space_U, comm)
        times["dedup"] += self._clock(t0)
        return _SpaceData(
            space_configs, lo, hi, S, m, batches, cold, staged, L, gd, sloc_in_L,
            in_space_U, in_space_L, model_bytes,
        )  # fmt: skip

    def _run(self, space_configs: np.ndarray, k: int) -> StageResult:
        eng, comm = self.engine, self.comm
        times = {"generation": 0.0, "dedup": 0.0, "inference": 0.0, "energy": 0.0}
        n_space = len(space_configs)
        t0 = time.perf_counter()
        sd = self._cached_space(space_configs)
        times["generation"] += time.perf_counter() - t0  # the equality test
        if sd is None:
            sd = self._space_data(space_configs, times)
            # kept only for an S that repeats the last one: a growing run holds its cold data
            # no longer than before (not through the optimiser stage)
            last, self._last_space = self._last_space, None
            if self.reuse_space and comm.size == 1:
                self._last_space = sd.configs
                if sd.staged == 0 and last is not None and np.array_equal(last, sd.configs):
                    self._space_cache = sd
        else:
            self.reused += 1
        lo, hi, S, m, cold, staged = sd.lo, sd.hi, sd.S, sd.m, sd.cold, sd.staged
        S_loc, n_loc = S[lo:hi], hi - lo
        L, gd, U = sd.L, sd.gd, sd.U
        offset = int(gd.offsets[comm.rank])
        sloc_in_L, in_space_U, in_space_L = sd.sloc_in_L, sd.in_space_U, sd.in_space_L

        # Stage 2: ln psi over U_r with a running top-K over U_r \ S.
        self._stage = "inference"
        t0 = time.perf_counter()
        u = len(U)
        logpsi = self._zeros_complex(u)
        selector = TorchTopK(k) if self.tensors else RunningTopK(k)
        lp_graph = None
        fused = self.fused_inference
        order = fused is not None and fused.share_prefixes and self.tensors
        if 0 < n_loc <= self.batch_size:
            if self.keep_graph and torch.is_grad_enabled():
                lp_graph = self.ansatz.log_psi(S_loc)
            else:
                lp_graph = self._graphed(S_loc) if self.inference_graph is not None else None
                if lp_graph is None:
                    with torch.no_grad():
                        lp_graph = self.ansatz.log_psi(S_loc)
            mine, have, rows = sd.get(("sources in U", order), lambda: self._rest_of_U(sd, order))
            logpsi[mine[have]] = self._to_engine(lp_graph.detach())[have]
        else:
            rows = sd.get(("all of U", order), lambda: self._ordered(U, self._arange(u), order))
        with torch.no_grad():
            done = 0  # rows whose scores the top-K has seen (devices: in chunks of rows)
            for b0 in range(0, len(rows), self.batch_size):
                r = rows[b0 : b0 + self.batch_size]
                lp = self._log_psi(U[r], graph=False)
                logpsi[r] = lp
                end = b0 + len(r)
                if not self.tensors:
                    selector.update(lp.real, index=r + offset, mask=~in_space_U[r])
                elif end - done >= _SELECT_ROWS or end == len(rows):
                    seen = rows[done:end]  # the same selection, fewer waits
                    selector.update(logpsi[seen].real, seen + offset, mask=~in_space_U[seen])
                    done = end
        times["inference"] = self._clock(t0)

        # Barrier 2: psi routed to L; the top-Ks merged with S's rows and scores.
        t0 = time.perf_counter()
        lp_L = gd.fetch(logpsi, comm)
        lp_s = lp_L[sloc_in_L]
        s_rows = sd.get("S rows", lambda: _host(gd.global_rows(sloc_in_L)))
        top = selector.indices()
        if self.tensors:
            top = top.to(eng.device)
        s_rows_all, s_scores_all, new_rows, new_configs, new_scores = gather_selection(
            _host(top),
            _host(selector.scores()),
            eng.to_host(U[top - offset]),
            k,
            s_rows,
            _host(lp_s.real),
            n_space,
            comm,
        )
        times["inference"] += self._clock(t0)

        # Stage 3: local energies from the cold data, located in L batch by batch.
        self._stage = "energy"
        t0 = time.perf_counter()
        shift = float(s_scores_all.max()) if n_space else 0.0  # the same on every rank
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):  # NaN caught later
            psi_L = self._exp(lp_L - shift)
            psi_s = psi_L[sloc_in_L]
            num_c, num_v = self._zeros_complex(n_loc), self._zeros_complex(n_loc)
            acc_L = self._zeros_complex(len(L)) if self.pt2 else None
            pairs = []
            for i, (a, b, item) in enumerate(self._replay(cold)):
                offs, cfg, val = item
                idx = sd.get(("located", i), lambda c=cfg: eng.locate(L, c))
                num_c[a:b], num_v[a:b] = eng.numerators(offs, val, idx, psi_L, in_space_L)
                if self.want_pairs and "pairs" not in sd.memo:
                    pairs.append(self._space_pairs(lo + a, offs, cfg, val, idx, in_space_L, S))
                if self.pt2:  # sum_x H_ax psi(x) for every a outside S
                    src, out, idx_out = sd.get(
                        ("outside S", i),
                        lambda o=offs, j=idx: self._outside(o, j, in_space_L),
                    )
                    contrib = val * psi_s[a:b][src]
                    index_add(acc_L, idx_out, contrib[out])
            hdiag = sd.get("hdiag", lambda: eng.diagonal(S_loc))
            eloc_c = hdiag + num_c / psi_s
            eloc_v = hdiag + num_v / psi_s
            pt2_num = pt2_diag = pt2_keys = None
            if self.pt2:  # the sums meet on the owners, which know H_aa
                acc_U = gd.reduce(acc_L, comm)
                rows, pt2_keys, pt2_diag = sd.get("pt2 rows", lambda: self._pt2_rows(sd))
                pt2_num = acc_U[rows].abs() ** 2 if self.tensors else np.abs(acc_U[rows]) ** 2
        space_pairs = None
        if self.want_pairs:
            space_pairs = sd.get("pairs", lambda: self._join_pairs(pairs))
        times["energy"] = self._clock(t0)
        busy = sum(times.values())
        return StageResult(
            share=(lo, hi),
            psi_s=psi_s,
            eloc_coupled=eloc_c,
            eloc_variational=eloc_v,
            hdiag=hdiag,
            lp_graph=lp_graph,
            space_pairs=space_pairs,
            new_configs=new_configs,
            keep_rows=np.concatenate([s_rows_all, new_rows]),
            keep_configs=np.concatenate([space_configs, new_configs]),
            keep_scores=np.concatenate([s_scores_all, new_scores]),
            n_coupled=m,
            n_unique=gd.metrics.unique,
            times=times,
            loads=(n_loc, m, u, busy),
            dedup=gd.metrics,
            bytes_staged=staged,
            n_batches=len(sd.batches),
            peak_theoretical=self.theoretical_peak(n_loc, m, u, sd.model_bytes)
            if self.gpu
            else float("nan"),
            pt2_numerators=pt2_num,
            pt2_diagonal=pt2_diag,
            pt2_keys=pt2_keys,
        )

    # ---------------------------------------------------------------------------- helpers
    def _rest_of_U(self, sd: _SpaceData, order: bool):
        """(rows of this rank's sources in U_r, which of them it owns, the other rows of U_r
        in inference order): the sources take their ln psi from the pass over S."""
        mine = self.engine.find(sd.U, sd.S[sd.lo : sd.hi])
        have = mine >= 0
        known = self._zeros_bool(len(sd.U))
        known[mine[have]] = True
        return mine, have, self._ordered(sd.U, self._arange(len(sd.U))[~known], order)

    def _ordered(self, U, rows, order: bool):
        """Rows of U in inference order: batches of shared first orbitals for the fused
        kernel (`order`), else as they are."""
        if order and len(rows) > 1:
            return rows[self.fused_inference.order(U[rows])]
        return rows

    def _outside(self, offs, idx, in_space_L):
        """(source of every coupled entry of a batch, which entries lie outside S, their rows
        in L): what the PT2 sums of the batch add where."""
        out = ~in_space_L[idx]
        return self._sources_of(offs), out, idx[out]

    def _pt2_rows(self, sd: _SpaceData):
        """(rows of U_r outside S, their keys, their H_aa)."""
        rows = self._nonzero(~sd.in_space_U)
        keys = sd.U[rows]
        return rows, keys, self.engine.diagonal(keys)

    def _space_pairs(self, first, offs, cfg, val, idx, in_space_L, S):
        """H_SS entries of a batch of sources: (source row in S, target row in S, value)."""
        eng = self.engine
        inside = in_space_L[idx]
        src = self._sources_of(offs) + first
        return src[inside], eng.locate(S, cfg[inside]), val[inside]

    def _sources_of(self, offs):
        """The source (0-based within its batch) of every entry of a batch's coupled set."""
        if self.tensors:
            return torch.repeat_interleave(
                torch.arange(len(offs) - 1, device=self.engine.device), offs[1:] - offs[:-1]
            )
        return np.repeat(np.arange(len(offs) - 1, dtype=np.int64), np.diff(offs))

    def _nonzero(self, mask):
        return torch.nonzero(mask).squeeze(1) if self.tensors else np.flatnonzero(mask)

    def _join_pairs(self, pairs: list) -> tuple:
        if pairs:
            return tuple(self.engine.cat(list(c)) for c in zip(*pairs, strict=True))
        if self.tensors:  # a rank without sources
            dev = self.engine.device
            return (
                torch.zeros(0, dtype=torch.int64, device=dev),
                torch.zeros(0, dtype=torch.int64, device=dev),
                torch.zeros(0, dtype=torch.float64, device=dev),
            )
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float64)

    def _keep(self, offs, cfg, val):
        return self._stash.keep(offs, cfg, val) if self.gpu else (offs, cfg, val)

    def _replay(self, cold):
        if not self.gpu:
            yield from cold
            return
        for (a, b, _), tensors in zip(cold, self._stash.replay(c for _, _, c in cold), strict=True):
            yield a, b, tensors

    def _zeros_complex(self, n: int):
        if self.tensors:
            return torch.zeros(n, dtype=torch.complex128, device=self.engine.device)
        return np.zeros(n, dtype=np.complex128)

    def _zeros_bool(self, n: int):
        if self.tensors:
            return torch.zeros(n, dtype=torch.bool, device=self.engine.device)
        return np.zeros(n, dtype=bool)

    def _arange(self, n: int):
        if self.tensors:
            return torch.arange(n, device=self.engine.device)
        return np.arange(n, dtype=np.int64)

    def _to_engine(self, lp: torch.Tensor):
        lp = lp.to(torch.complex128)
        return lp.to(self.engine.device) if self.tensors else lp.to("cpu").numpy()

    def _exp(self, x):
        return torch.exp(x) if self.tensors else np.exp(x)


def space_bytes(n_space, n_coupled, words: int):
    """Bytes one iteration holds for a space of `n_space` configurations whose coupled sets
    have `n_coupled` entries in all, with every intermediate resident (no batching): the model
    the growth rule's memory limit applies (``Runner(growth="weight")``).

    Per coupled entry: the configuration and its matrix element (cold data), its keys in L and
    U, its location, psi and ln psi in L and U, the membership flags and the PT2 accumulator,
    rounded up to 24 words + 64 bytes. Per source: that again (a source is in L and U too),
    plus its key in S, psi, both local energies, the numerators and H_xx (8 words + 128).

    Integers give an int, arrays an int64 array (element by element).

    Example:
        >>> space_bytes(1000, 50_000, 1)
        4624000
    """
    item = 24 * words + 64
    out = np.asarray(n_coupled, np.int64) * item + np.asarray(n_space, np.int64) * (
        item + 8 * words + 128
    )
    return int(out) if out.ndim == 0 else out


def _host(a) -> np.ndarray:
    return a.detach().to("cpu").numpy() if is_tensor(a) else np.asarray(a)
