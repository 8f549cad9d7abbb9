"""The memory-centric NNQS-SCI iteration on one GPU (seed 000, section 4.3).

Three stages separated by two barriers:

1. Coupled generation and local de-duplication, in mini-batches of sources whose coupled sets
   fit the memory budget. Each batch's unique configurations stay on the GPU; its coupled set
   (configurations and matrix elements, the "cold" data) stays there too when everything fits,
   otherwise it is copied to pinned host memory on a side stream while the next batch runs.
   Barrier 1: the batch-unique sets and S are merged into the sorted unique set U.
2. Inference of ln psi over U in batches, with a hierarchical top-K of |psi| over U \\ S.
   Barrier 2: selection (the top-K) and the remap of S into U (binary search).
3. Local energies, batch by batch: the coupled set comes back (from the GPU or, double-
   buffered, from pinned memory), its reverse index into U is rebuilt by binary search, and a
   warp per source sums H_xx' psi(x').

An out-of-memory error halves the batch size and repeats the stage instead of ending the run.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field

import numpy as np
import torch

from cuscikit.gpu import ops
from cuscikit.gpu.memory import MemoryBudget
from cuscikit.nnqs.topk import TorchTopK

_MAX_RETRIES = 12


@dataclass
class StageResult:
    """What one GPU iteration hands back to the Runner (tensors live on the GPU)."""

    unique: torch.Tensor  # U, (u, words) int64, sorted
    logpsi: torch.Tensor  # ln psi over U, complex128
    pos_space: torch.Tensor  # row of each x in S within U
    in_space: torch.Tensor  # bool over U
    hdiag: torch.Tensor  # <x|H|x> over S
    num_coupled: torch.Tensor  # sum_{x' in C(x)} H psi(x'), complex over S (psi unshifted
    num_variational: torch.Tensor  # by `shift`: psi = exp(ln psi - shift))
    shift: float
    topk_rows: torch.Tensor  # rows of U chosen by the top-K, best first
    lp_graph: torch.Tensor | None  # ln psi(S) with its graph, when S fits in one batch
    n_coupled: int = 0
    times: dict = field(default_factory=dict)
    bytes_staged: int = 0
    n_batches: int = 0
    peak_theoretical: int = 0
    # H between configurations of S (off the diagonal): source, target (positions in S),
    # value; only when asked for (the Runner's inner steps)
    space_pairs: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None


class GpuPipeline:
    """Runs stages 1-3 for a Runner on a CUDA device.

    Args:
        molecule: the Runner's molecule.
        ansatz: the ansatz (on the same CUDA device).
        eps: screening threshold of the coupled sets.
        batch_size: configurations per inference batch.
        max_gpu_memory: cap in bytes for everything the process holds on the GPU (None: the
            card's free memory).
        staging: "auto" (pinned host memory only when the coupled set does not fit), "device"
            (never stage) or "host" (always stage: for tests and measurements).
        compile_inference: evaluate ln psi over U with a `torch.compile`d forward pass (about
            2x the eager throughput of the default network on an H200, after a few seconds of
            compilation; results equal to float32 rounding). The pass that keeps the graph for
            the loss stays eager.
    """

    def __init__(self, molecule, ansatz, *, eps: float, batch_size: int,
                 max_gpu_memory: int | None = None, staging: str = "auto",
                 compile_inference: bool = False):
        if staging not in ("auto", "device", "host"):
            raise ValueError(f"staging must be 'auto', 'device' or 'host', got {staging!r}")
        self.device = next(ansatz.parameters()).device
        if self.device.type != "cuda":
            raise ValueError("the GPU pipeline needs the ansatz on a CUDA device")
        self.dh = ops.DeviceHamiltonian.from_molecule(molecule, self.device, eps=eps)
        self.eps = eps
        self.ansatz = ansatz
        self.batch_size = int(batch_size)
        self.budget = MemoryBudget(self.device, max_gpu_memory)
        self.staging = staging
        self.words = self.dh.nwords
        self.end_bit = 2 * self.dh.norb  # configurations use only the n_so low bits
        self.copy_stream = torch.cuda.Stream(self.device)
        self._infer = torch.compile(ansatz.log_psi) if compile_inference else ansatz.log_psi
        self.item_cap = 0  # coupled configurations per stage-1 batch (set per iteration)
        self.item_limit: int | None = None  # set by out-of-memory retries, kept for later
        self.largest_batch = 0
        self.retries = 0  # out-of-memory retries so far
        self._stage = ""  # the stage running, for the retry policy

    # ------------------------------------------------------------------------ memory plan
    def _bytes_per_item(self) -> int:
        """Device bytes per coupled configuration while a stage-1 batch is processed: the
        configuration and its element, the sort's workspace and the unique output."""
        w8 = 8 * self.words
        return (w8 + 8) + (w8 + 4) + w8 + 64 // max(1, self.words)

    def _plan(self, counts: np.ndarray, resident: bool) -> list[tuple[int, int]]:
        """Split sources into batches whose coupled sets fit `item_cap`."""
        n = len(counts)
        avail = self.budget.available()
        if resident:  # the whole coupled set stays: leave it room
            avail -= int(counts.sum()) * (8 * self.words + 8)
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
        w8 = 8 * self.words
        sort_ws = ops.sort_unique_workspace_bytes(n + m, self.words, True) if n + m else 0
        return int(model_bytes + n * (w8 + 3 * 8 + 16) + m * (w8 + 8) + sort_ws
                   + (n + m) * (8 + w8) + u * (16 + 16 + 1))

    # ----------------------------------------------------------------------------- stages
    def run(self, space_configs: np.ndarray, topk: int,
            space_pairs: bool = False) -> StageResult:
        for attempt in range(_MAX_RETRIES):
            try:
                return self._run(space_configs, topk, space_pairs)
            except torch.cuda.OutOfMemoryError:
                stuck = self.batch_size <= 1 if self._stage == "inference" else \
                    self.largest_batch <= 1
                if attempt == _MAX_RETRIES - 1 or stuck:
                    raise
                # Shrink what was running: the inference batches, or the stage-1/3 batches.
                if self._stage == "inference":
                    self.batch_size = max(1, self.batch_size // 2)
                else:
                    self.item_limit = max(1, self.largest_batch // 2)
                self.retries += 1
                torch.cuda.empty_cache()
                limit = "no limit" if self.item_limit is None else f"{self.item_limit:,}"
                warnings.warn(
                    f"GPU out of memory in {self._stage}: retrying the iteration with "
                    f"{limit} on coupled configurations per batch and inference batches of "
                    f"{self.batch_size:,}",
                    ResourceWarning, stacklevel=2,
                )
        raise AssertionError("unreachable")

    def _sync_time(self, t0: float) -> float:
        torch.cuda.synchronize(self.device)
        return time.perf_counter() - t0

    def _run(self, space_configs: np.ndarray, k: int, want_pairs: bool) -> StageResult:
        dev, dh, eps = self.device, self.dh, self.eps
        times = {"generation": 0.0, "dedup": 0.0, "inference": 0.0, "energy": 0.0}
        model_bytes = torch.cuda.memory_allocated(dev)
        S = ops.to_device(space_configs, dev)
        n = len(S)

        # Stage 1: generation and local de-dup per batch; the cold data stays or is staged.
        self._stage = "generation"
        t0 = time.perf_counter()
        counts_t = ops.coupled_counts(dh, S, eps)
        counts = counts_t.to("cpu").numpy()
        m = int(counts.sum())
        resident = self.staging == "device" or (
            self.staging == "auto"
            and m * (8 * self.words + 8) * 3 < self.budget.available()
        )
        batches = self._plan(counts, resident)
        times["generation"] += self._sync_time(t0)
        parts, cold, staged = [S], [], 0
        for lo, hi in batches:
            t0 = time.perf_counter()
            offs, cfg, val = ops.coupled(dh, S[lo:hi], eps, counts_t[lo:hi])
            times["generation"] += self._sync_time(t0)
            t0 = time.perf_counter()
            parts.append(ops.sort_unique(cfg, end_bit=self.end_bit))
            if sum(len(p) for p in parts) > self.item_cap:  # keep the merge within the budget
                parts = [ops.sort_unique(torch.cat(parts), end_bit=self.end_bit)]
            times["dedup"] += self._sync_time(t0)
            if resident:
                cold.append((lo, hi, offs, cfg, val))
            else:
                cold.append((lo, hi, offs, *self._to_host(cfg, val)))
                staged += cfg.numel() * 8 + val.numel() * 8
            del cfg, val
        t0 = time.perf_counter()
        # Barrier 1: the global unique set U (S included), S located in it.
        U = ops.sort_unique(torch.cat(parts), end_bit=self.end_bit)
        del parts
        pos_s = ops.search(U, S)
        in_space = torch.zeros(len(U), dtype=torch.bool, device=dev)
        in_space[pos_s] = True
        times["dedup"] += self._sync_time(t0)

        # Stage 2: ln psi over U with a running top-K over U \ S.
        self._stage = "inference"
        t0 = time.perf_counter()
        u = len(U)
        logpsi = torch.empty(u, dtype=torch.complex128, device=dev)
        selector = TorchTopK(k)
        lp_graph = None
        if n <= self.batch_size:
            lp_graph = self.ansatz.log_psi(S)
            logpsi[pos_s] = lp_graph.detach().to(torch.complex128)
            rows = torch.nonzero(~in_space).squeeze(1)
        else:
            rows = torch.arange(u, device=dev)
        with torch.no_grad():
            for lo in range(0, len(rows), self.batch_size):
                r = rows[lo:lo + self.batch_size]
                lp = self._infer(U[r]).to(torch.complex128)
                logpsi[r] = lp
                selector.update(lp.real, r, mask=~in_space[r])
        times["inference"] = self._sync_time(t0)

        # Stage 3: local energies from the cold data, reverse index rebuilt per batch.
        self._stage = "energy"
        t0 = time.perf_counter()
        shift = float(logpsi[pos_s].real.max())
        psi = torch.exp(logpsi - shift)
        num_c = torch.empty(n, dtype=torch.complex128, device=dev)
        num_v = torch.empty(n, dtype=torch.complex128, device=dev)
        pairs = []
        if want_pairs:
            pos_of_row = torch.full((len(U),), -1, dtype=torch.int64, device=dev)
            pos_of_row[pos_s] = torch.arange(n, device=dev)
        for lo, hi, offs, cfg, val in self._fetch(cold):
            idx = ops.search(U, cfg)
            nc, nv = ops.local_energy_sums(offs, val, idx, psi, in_space)
            num_c[lo:hi], num_v[lo:hi] = nc, nv
            if want_pairs:
                inside = in_space[idx]
                src = torch.repeat_interleave(
                    torch.arange(lo, hi, device=dev), offs[1:] - offs[:-1])[inside]
                pairs.append((src, pos_of_row[idx[inside]], val[inside]))
        hdiag = ops.diagonal(dh, S)
        times["energy"] = self._sync_time(t0)

        return StageResult(
            unique=U, logpsi=logpsi, pos_space=pos_s, in_space=in_space, hdiag=hdiag,
            num_coupled=num_c, num_variational=num_v, shift=shift,
            topk_rows=selector.indices().to(dev), lp_graph=lp_graph, n_coupled=m, times=times,
            bytes_staged=staged, n_batches=len(batches),
            peak_theoretical=self.theoretical_peak(n, m, u, model_bytes),
            space_pairs=tuple(torch.cat(c) for c in zip(*pairs, strict=True)) if want_pairs
            else None,
        )

    # ------------------------------------------------------------------- host staging
    def _to_host(self, cfg: torch.Tensor, val: torch.Tensor):
        """Copy a batch's coupled set to pinned host memory on the copy stream."""
        host_c = torch.empty(cfg.shape, dtype=cfg.dtype, pin_memory=True)
        host_v = torch.empty(val.shape, dtype=val.dtype, pin_memory=True)
        self.copy_stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.copy_stream):
            host_c.copy_(cfg, non_blocking=True)
            host_v.copy_(val, non_blocking=True)
        cfg.record_stream(self.copy_stream)  # not reused before the copy is done
        val.record_stream(self.copy_stream)
        done = torch.cuda.Event()
        done.record(self.copy_stream)
        return host_c, (host_v, done)

    def _fetch(self, cold):
        """Yield (lo, hi, offsets, configs, values) on the GPU, batch by batch; staged
        batches are copied in on the copy stream one batch ahead (double buffering)."""
        compute = torch.cuda.current_stream(self.device)

        def upload(item):
            lo, hi, offs, c, v = item
            if c.device.type == "cuda":
                return item, None
            host_v, staged_done = v
            self.copy_stream.wait_event(staged_done)
            with torch.cuda.stream(self.copy_stream):
                dc = c.to(self.device, non_blocking=True)
                dv = host_v.to(self.device, non_blocking=True)
            ready = torch.cuda.Event()
            ready.record(self.copy_stream)
            return (lo, hi, offs, dc, dv), ready

        pending = upload(cold[0]) if cold else None
        for i in range(len(cold)):
            item, ready = pending
            pending = upload(cold[i + 1]) if i + 1 < len(cold) else None
            if ready is not None:
                compute.wait_event(ready)
                item[3].record_stream(compute)
                item[4].record_stream(compute)
            yield item
