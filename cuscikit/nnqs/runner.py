"""The NNQS-SCI loop (seed 000, ALGORITHMS.md section 1): generate, de-duplicate, infer, select,
evaluate energies, optimise, grow the space.

Two pipelines run the same iteration:

- "baseline" (the seed's "Original"): coupled generation and de-duplication in the compiled CPU
  kernels, inference wherever the ansatz lives. This is the only pipeline on a CPU device.
- "gpu": everything on the GPU, memory-centric (`cuscikit.gpu.pipeline`): CUDA kernels for
  generation, de-duplication and local energies, mini-batches sized from free GPU memory.

With a communicator of P > 1 ranks (`comm=`, baseline pipeline) one iteration is spread over the
ranks: each generates the coupled sets of its share of S's sources, the union is de-duplicated
across ranks (`cuscikit.parallel.global_dedup`), each rank evaluates ln psi on its slice of U
and merges its top-K into the global one, psi values are routed back to the coupled pairs for
the local energies, the energy sums and the loss gradient are all-reduced, and every rank's
model replica and copy of S take the identical step (`cuscikit.nnqs.distributed`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable

import numpy as np
import pandas as pd
import torch

from cuscikit.nnqs.ansatz import resolve_device
from cuscikit.nnqs.defaults import (
    DEFAULT_INNER_STEPS,
    DEFAULT_LR,
    DEFAULT_LR_DECAY_FROM,
    DEFAULT_LR_FINAL,
    DEFAULT_MAX_SPACE,
    DEFAULT_TOPK,
)
from cuscikit.nnqs.topk import RunningTopK
from cuscikit.sci.dedup import dedup
from cuscikit.sci.hamiltonian import DEFAULT_EPS, Hamiltonian
from cuscikit.sci.space import SCISpace

ESTIMATORS = ("coupled", "variational")
STAGES = ("generation", "dedup", "inference", "energy", "optimizer", "other")
PIPELINES = ("auto", "gpu", "baseline")


class NonFiniteLossError(FloatingPointError):
    """The loss or the energy became NaN or infinite; the step was not applied."""


class Callback:
    """Base class for Runner callbacks (NetKet-style). Return True from `on_step_end` to stop."""

    def on_run_start(self, runner: Runner) -> None:  # noqa: B027 - optional hook
        pass

    def on_step_end(self, runner: Runner, row: dict) -> bool | None:
        return None

    def on_run_end(self, runner: Runner) -> None:  # noqa: B027 - optional hook
        pass


class EarlyStopping(Callback):
    """Stop when the chosen energy changed by less than `tol` over the last `patience` steps."""

    def __init__(self, tol: float = 1e-5, patience: int = 20, column: str = "e_tot"):
        self.tol, self.patience, self.column = tol, patience, column

    def on_step_end(self, runner: Runner, row: dict) -> bool:
        h = runner.history
        if len(h) <= self.patience:
            return False
        window = h[self.column].to_numpy()[-self.patience - 1 :]
        return bool(np.ptp(window) < self.tol)


class LearningRateDecay(Callback):
    """A constant AdamW rate up to iteration `start`, then a geometric fall to `final_lr` at
    iteration `end` (and `final_lr` after it). Without it the Runner's rate is constant.

    The rate of iteration t depends only on t, so a run that is interrupted and resumed from its
    checkpoint follows the same schedule. A tail decay removes the single-iteration error spikes
    a constant rate leaves in the last iterations.

    Example:
        >>> from cuscikit import Ansatz, Molecule, Runner
        >>> from cuscikit.nnqs import LearningRateDecay
        >>> mol = Molecule.load("LiH")
        >>> runner = Runner(mol, Ansatz.for_molecule(mol, seed=0), seed=0)
        >>> decay = LearningRateDecay(start=50, end=100, final_lr=1e-4)
        >>> history = runner.run(100, [decay], progress=False)  # doctest: +SKIP

        The command line's default schedule for a run of 2000 iterations (constant to 1000,
        then down to 1e-4 at 2000):

        >>> runner.run(2000, [LearningRateDecay.over_tail(2000)])  # doctest: +SKIP
    """

    def __init__(self, start: int, end: int, final_lr: float):
        if not 0 <= start < end:
            raise ValueError(f"need 0 <= start < end, got start={start}, end={end}")
        if not final_lr > 0:
            raise ValueError(f"final_lr must be positive, got {final_lr}")
        self.start, self.end, self.final_lr = int(start), int(end), float(final_lr)

    @classmethod
    def over_tail(
        cls,
        iterations: int,
        fraction: float = DEFAULT_LR_DECAY_FROM,
        final_lr: float = DEFAULT_LR_FINAL,
    ) -> LearningRateDecay:
        """The decay over the last (1 - fraction) of a run of `iterations`; with the default
        fraction and final rate, the schedule of the command line and the benchmarks
        (--lr-decay-from, --lr-final)."""
        start = int(fraction * iterations)
        return cls(start, max(start + 1, iterations), final_lr)

    def rate(self, lr0: float, t: int) -> float:
        """The rate of iteration t (1-based) when the constant part is `lr0`."""
        frac = min(1.0, max(0.0, (t - 1 - self.start) / (self.end - self.start)))
        return lr0 * (self.final_lr / lr0) ** frac

    def _set(self, runner: Runner) -> None:
        lr = self.rate(runner.optimizer.defaults["lr"], runner.iteration + 1)
        for group in runner.optimizer.param_groups:
            group["lr"] = lr

    def on_run_start(self, runner: Runner) -> None:
        self._set(runner)

    def on_step_end(self, runner: Runner, row: dict) -> bool:
        self._set(runner)
        return False


class Runner:
    """NNQS-SCI: optimise a neural wavefunction over a growing selected-CI space.

    Every iteration: coupled configurations C(x) of all x in S (|H_xx'| > eps), sort + unique
    over S and C(S), batched inference of ln psi on the unique set, a hierarchical top-K of |psi|
    over the new configurations, both energy estimators, the loss
    L = 2 Re sum_x w(x) conj(ln psi(x)) (E_loc(x) - E) with w = |psi|^2 / sum_S |psi|^2, an AdamW
    step, and S <- S + top-K (optionally capped at `max_space`, dropping the smallest |psi|).

    Args:
        molecule: a `cuscikit.Molecule` (or anything with norb, nelec, h1e, eri_full(), e_core).
        ansatz: a `cuscikit.Ansatz` (any module with `log_psi(configs) -> complex tensor`).
        space: the starting space (default: the Hartree-Fock determinant).
        topk: configurations added per iteration (K).
        estimator: "coupled" (sum over all of C(x), the papers' form) or "variational" (only
            x' in S: the Rayleigh quotient of psi restricted to S). Drives the loss; both are
            computed and kept in the history.
        max_space: cap on |S| (default 16384; None for no cap).
        eps: screening threshold of the coupled sets.
        lr, betas, weight_decay, adam_eps: AdamW settings (defaults of ALGORITHMS.md).
        batch_size: configurations per inference batch.
        seed: seeds the torch and numpy generators used by the run.
        device: must match the ansatz ("cpu", "cuda"; default: the ansatz's device).
        reference: exact energy for the error column (default: the molecule's bundled one).
        pipeline: "gpu" (all stages on the GPU), "baseline" (generation and de-dup on the
            CPU) or "auto" (gpu on a CUDA device when the CUDA kernels are built).
        max_gpu_memory: cap in bytes on what the process holds on the GPU (gpu pipeline); a
            problem whose intermediates exceed it still runs, in smaller batches.
        staging: where the gpu pipeline keeps coupled sets between stages 1 and 3: "auto"
            (pinned host memory only when they do not fit), "device" or "host".
        compile_inference: evaluate ln psi over the unique set with a `torch.compile`d
            pass, in either pipeline (about 2x faster on an H200 after a few seconds of
            compilation; equal to float32 rounding).
        inner_steps: after each iteration's AdamW step, this many more on the Rayleigh quotient
            of psi restricted to S (the variational estimator's loss, with H_SS from the
            iteration's coupled pairs inside S). Each costs a forward and backward pass over S,
            no inference over the unique set.
        comm: a `cuscikit.parallel.Comm` (e.g. ``get_comm()`` under torchrun or mpirun). None or
            a single rank: one process. P > 1 ranks: every rank builds the Runner with the same
            molecule and settings (rank 0's model and S are broadcast at construction), runs the
            baseline pipeline on its share of the work, and keeps a replica of the model and of
            S; the energies equal the single-rank run's to rounding. The progress bar, messages
            and checkpoint files come from rank 0; history rows gain per-rank loads (``n_ranks``,
            ``sources_max``/``_min``, ``coupled_max``/``_min``, ``unique_max``/``_min``,
            ``t_busy_max``/``_min``) and the de-dup metrics (``dedup_*``).

    Example:
        >>> from cuscikit import Ansatz, Molecule, Runner
        >>> mol = Molecule.load("LiH")
        >>> runner = Runner(mol, Ansatz.for_molecule(mol, seed=0), topk=64, seed=0)
        >>> history = runner.run(20, progress=False)  # doctest: +SKIP
        >>> history[["e_coupled", "e_variational", "n_space"]].tail(1)  # doctest: +SKIP

        On several ranks (``torchrun --nproc-per-node 4 script.py`` or ``mpiexec -n 4 python
        -m mpi4py script.py``), the same script with ``comm=get_comm()``:

        >>> from cuscikit.parallel import get_comm
        >>> comm = get_comm()  # doctest: +SKIP
        >>> runner = Runner(mol, Ansatz.for_molecule(mol, seed=0), comm=comm)  # doctest: +SKIP
    """

    def __init__(
        self,
        molecule,
        ansatz: torch.nn.Module,
        space: SCISpace | None = None,
        *,
        topk: int = DEFAULT_TOPK,
        estimator: str = "coupled",
        max_space: int | None = DEFAULT_MAX_SPACE,
        eps: float = DEFAULT_EPS,
        lr: float = DEFAULT_LR,
        betas: tuple[float, float] = (0.9, 0.99),
        weight_decay: float = 0.0,
        adam_eps: float = 1e-9,
        batch_size: int = 16384,
        seed: int = 0,
        device=None,
        reference: float | None = None,
        pipeline: str = "auto",
        max_gpu_memory: int | None = None,
        staging: str = "auto",
        compile_inference: bool = False,
        inner_steps: int = DEFAULT_INNER_STEPS,
        comm=None,
    ):
        if int(topk) != topk or topk < 1:
            raise ValueError(f"topk must be a positive integer, got {topk!r}")
        if estimator not in ESTIMATORS:
            raise ValueError(f"unknown estimator {estimator!r}: use one of {ESTIMATORS}")
        if max_space is not None and max_space < 1:
            raise ValueError(f"max_space must be positive, got {max_space}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        if int(inner_steps) != inner_steps or inner_steps < 0:
            raise ValueError(f"inner_steps must be a non-negative integer, got {inner_steps!r}")
        if pipeline not in PIPELINES:
            raise ValueError(f"unknown pipeline {pipeline!r}: use one of {PIPELINES}")
        self.comm = comm
        self.rank = comm.rank if comm is not None else 0
        self.distributed = comm is not None and comm.size > 1
        if self.distributed:
            if pipeline == "gpu":
                raise ValueError(
                    f"pipeline='gpu' runs on one rank; with {comm.size} ranks use "
                    "pipeline='baseline' (or 'auto')"
                )
            pipeline = "baseline"
        a_norb, a_nelec = getattr(ansatz, "norb", None), getattr(ansatz, "nelec", None)
        if a_norb is not None and a_norb != molecule.norb:
            raise ValueError(f"the ansatz has {a_norb} orbitals, the molecule {molecule.norb}")
        if a_nelec is not None and tuple(a_nelec) != tuple(molecule.nelec):
            raise ValueError(
                f"the ansatz is built for nelec={tuple(a_nelec)}, the molecule has "
                f"{tuple(molecule.nelec)}"
            )
        param = next(ansatz.parameters())
        self.device = resolve_device(device if device is not None else param.device)
        if self.device.type != param.device.type:
            raise ValueError(
                f"the ansatz lives on {param.device}, the runner was asked for {self.device}: "
                "move the ansatz with .to(device) first"
            )
        self.molecule = molecule
        self.ansatz = ansatz
        self.hamiltonian = Hamiltonian.from_molecule(molecule, eps=eps)
        self.space = space if space is not None else SCISpace.hf(molecule, eps=eps)
        if self.space.norb != molecule.norb or tuple(self.space.nelec) != tuple(molecule.nelec):
            raise ValueError("the space belongs to another molecule (norb or nelec differ)")
        self.topk, self.estimator, self.max_space = int(topk), estimator, max_space
        self.eps, self.batch_size, self.seed = eps, int(batch_size), seed
        self.inner_steps = int(inner_steps)
        self.optimizer = torch.optim.AdamW(
            ansatz.parameters(), lr=lr, betas=betas, weight_decay=weight_decay, eps=adam_eps
        )
        if reference is None:
            ref = (getattr(molecule, "metadata", None) or {}).get("reference") or {}
            reference = ref.get("energy")
        self.reference = reference
        self.pipeline = self._choose_pipeline(pipeline)
        self._gpu = None
        if self.pipeline == "gpu":
            from cuscikit.gpu.pipeline import GpuPipeline

            self._gpu = GpuPipeline(molecule, ansatz, eps=eps, batch_size=batch_size,
                                    max_gpu_memory=max_gpu_memory, staging=staging,
                                    compile_inference=compile_inference)
        elif max_gpu_memory is not None:
            raise ValueError("max_gpu_memory applies to the gpu pipeline only")
        # The baseline's inference pass (the gpu pipeline holds its own).
        self._log_psi_nograd = (torch.compile(ansatz.log_psi) if compile_inference
                                else ansatz.log_psi)
        self.iteration = 0
        self._rows: list[dict] = []
        self.rng = np.random.default_rng(seed)
        torch.manual_seed(seed)
        if self.distributed:
            from cuscikit.nnqs.distributed import sync_replicas

            sync_replicas(self, comm)

    def _choose_pipeline(self, pipeline: str) -> str:
        if self.device.type != "cuda":
            if pipeline == "gpu":
                raise ValueError("pipeline='gpu' needs the ansatz and runner on a CUDA device")
            return "baseline"
        if pipeline == "auto":
            from cuscikit import gpu

            return "gpu" if gpu.available() else "baseline"
        if pipeline == "gpu":
            from cuscikit import gpu

            gpu.kernels()  # raises a clear error when the kernels are missing
        return pipeline

    # ------------------------------------------------------------------------------- results
    @property
    def history(self) -> pd.DataFrame:
        """One row per iteration: energies, counts, seconds per stage, peak memory."""
        return pd.DataFrame(self._rows)

    @property
    def e_tot(self) -> float:
        """The energy of the chosen estimator at the last iteration."""
        if not self._rows:
            raise RuntimeError("no iteration has run yet")
        return self._rows[-1]["e_tot"]

    # ---------------------------------------------------------------------------------- steps
    def _infer(
        self, configs: np.ndarray, rows: np.ndarray, topk: RunningTopK, eligible: np.ndarray
    ) -> np.ndarray:
        """ln psi of configurations (rows `rows` of the unique set), batch by batch, merging
        each batch's top-K over the `eligible` ones (scored by ln|psi|) into the running one."""
        out = np.empty(len(configs), dtype=np.complex128)
        with torch.no_grad():
            for lo in range(0, len(configs), self.batch_size):
                hi = min(lo + self.batch_size, len(configs))
                # Tensors in, so a compiled pass sees no numpy arrays.
                x = torch.from_numpy(np.ascontiguousarray(configs[lo:hi]).view(np.int64))
                lp = self._log_psi_nograd(x).detach().to("cpu")
                lp = lp.to(torch.complex128).numpy()
                out[lo:hi] = lp
                topk.update(lp.real, index=rows[lo:hi], mask=eligible[lo:hi])
        return out

    def _stages_baseline(self, t: dict) -> dict:
        """Stages 1-3 with the CPU kernels; returns what the loss and the growth need."""
        S = self.space.configs
        n = len(S)
        # Stage 1: coupled generation, then sort + unique over S and C(S) with the inverse index.
        t0 = time.perf_counter()
        cs = self.hamiltonian.coupled(S, eps=self.eps)
        hdiag = self.hamiltonian.diagonal(S)
        t["generation"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        unique, inverse, _ = dedup(np.concatenate([S, cs.configs]))
        inv_s, inv_c = inverse[:n], inverse[n:]
        in_space = np.zeros(len(unique), dtype=bool)
        in_space[inv_s] = True
        t["dedup"] = time.perf_counter() - t0

        # Stage 2: inference on the unique set with a running top-K over U \ S. When S fits in
        # one batch, its forward pass keeps the graph and its values are reused for U and for
        # the loss; otherwise the loss recomputes S batch by batch (memory stays bounded).
        t0 = time.perf_counter()
        topk = RunningTopK(self.topk)
        logpsi = np.empty(len(unique), dtype=np.complex128)
        lp_graph = None
        if n <= self.batch_size:
            lp_graph = self.ansatz.log_psi(S)
            logpsi[inv_s] = lp_graph.detach().to("cpu").to(torch.complex128).numpy()
            rows = np.flatnonzero(~in_space)
        else:
            rows = np.arange(len(unique))
        logpsi[rows] = self._infer(unique[rows], rows, topk, ~in_space[rows])
        t["inference"] = time.perf_counter() - t0

        # Stage 3: local energies of both estimators.
        t0 = time.perf_counter()
        np_err = np.seterr(invalid="ignore", divide="ignore", over="ignore")  # NaN caught later
        shift = logpsi[inv_s].real.max()
        psi_u = np.exp(logpsi - shift)
        psi_s = psi_u[inv_s]
        contrib = cs.values * psi_u[inv_c]
        num_c = _segment_sum(cs.source, contrib, n)
        in_s = in_space[inv_c]
        num_v = _segment_sum(cs.source[in_s], contrib[in_s], n)
        eloc_c = hdiag + num_c / psi_s
        eloc_v = hdiag + num_v / psi_s
        np.seterr(**np_err)
        t["energy"] = time.perf_counter() - t0
        space_pairs = None
        if self.inner_steps:  # H_SS off the diagonal: (source, target) positions in S
            pos_of_row = np.full(len(unique), -1, dtype=np.int64)
            pos_of_row[inv_s] = np.arange(n)
            space_pairs = (cs.source[in_s], pos_of_row[inv_c[in_s]], cs.values[in_s])
        new_idx = topk.indices()
        keep = np.concatenate([inv_s, new_idx])
        return {
            "psi_s": torch.as_tensor(psi_s), "eloc_c": torch.as_tensor(eloc_c),
            "eloc_v": torch.as_tensor(eloc_v), "lp_graph": lp_graph,
            "hdiag": hdiag, "space_pairs": space_pairs,
            "new_configs": unique[new_idx], "keep_rows": keep,
            "keep_configs": unique[keep], "keep_scores": logpsi[keep].real,
            "n_coupled": len(cs), "n_unique": len(unique),
        }

    def _stages_distributed(self, t: dict) -> dict:
        """Stages 1-3 on P ranks (baseline kernels): this rank's share of the sources, the
        global de-dup, inference on this rank's slice of U, routing, local energies, and the
        top-K merged over ranks. Everything the growth needs is identical on every rank."""
        from cuscikit.nnqs.distributed import gather_selection, source_share
        from cuscikit.parallel.dedup import global_dedup
        from cuscikit.sci.dedup import KeyIndex

        comm = self.comm
        S = self.space.configs
        lo, hi = source_share(len(S), comm.size, comm.rank)
        S_loc = S[lo:hi]
        n_loc = hi - lo
        # Stage 1: coupled generation for this rank's sources; de-dup across ranks (barrier 1).
        t0 = time.perf_counter()
        cs = self.hamiltonian.coupled(S_loc, eps=self.eps)
        hdiag = self.hamiltonian.diagonal(S_loc)
        t["generation"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        keys = np.concatenate([S_loc, cs.configs.reshape(-1, S.shape[1])])
        gd = global_dedup(keys, comm)
        unique, offset = gd.unique.reshape(-1, S.shape[1]), int(gd.offsets[comm.rank])
        # S is replicated: each owner finds which rows of its slice are in S without talking
        s_index = KeyIndex(S)
        in_space = s_index.find(unique) >= 0 if len(unique) else np.zeros(0, dtype=bool)
        t["dedup"] = time.perf_counter() - t0

        # Stage 2: ln psi on this rank's slice of U and its top-K over its part of U \ S.
        # The loss re-evaluates this rank's sources with a graph.
        t0 = time.perf_counter()
        topk = RunningTopK(self.topk)
        rows = offset + np.arange(len(unique), dtype=np.int64)
        logpsi = self._infer(unique, rows, topk, ~in_space)
        t["inference"] = time.perf_counter() - t0

        # psi (and membership of S) routed from the owners to every (x, x') pair; the top-Ks
        # merged over ranks by global row of U, with S's rows and scores (barrier 2).
        t0 = time.perf_counter()
        got = gd.fetch(np.stack([logpsi.real, logpsi.imag, in_space], axis=1), comm)
        lp = got[:, 0] + 1j * got[:, 1]
        lp_s, lp_c, in_s = lp[:n_loc], lp[n_loc:], got[n_loc:, 2] > 0.5
        s_rows, s_scores, new_rows, new_configs, new_scores = gather_selection(
            topk, unique, offset, self.topk, gd.global_index[:n_loc], lp_s.real, len(S), comm
        )
        t["inference"] += time.perf_counter() - t0

        # Stage 3: local energies of both estimators for this rank's sources.
        t0 = time.perf_counter()
        np_err = np.seterr(invalid="ignore", divide="ignore", over="ignore")  # NaN caught later
        shift = s_scores.max()  # the same on every rank
        psi_s = np.exp(lp_s - shift)
        contrib = cs.values * np.exp(lp_c - shift)
        num_c = _segment_sum(cs.source, contrib, n_loc)
        num_v = _segment_sum(cs.source[in_s], contrib[in_s], n_loc)
        eloc_c = hdiag + num_c / psi_s
        eloc_v = hdiag + num_v / psi_s
        np.seterr(**np_err)
        space_pairs = None
        if self.inner_steps:  # H_SS rows of this rank's sources: (source, target) positions in S
            targets = cs.configs.reshape(-1, S.shape[1])[in_s]
            space_pairs = (lo + cs.source[in_s], s_index.find(targets), cs.values[in_s])
        t["energy"] = time.perf_counter() - t0
        busy = sum(t[s] for s in ("generation", "dedup", "inference", "energy"))
        return {
            "psi_s": torch.as_tensor(psi_s),
            "eloc_c": torch.as_tensor(eloc_c),
            "eloc_v": torch.as_tensor(eloc_v),
            "lp_graph": None,
            "loss_configs": S_loc,
            "source_share": (lo, hi),
            "hdiag": hdiag,
            "space_pairs": space_pairs,
            "new_configs": new_configs,
            "keep_rows": np.concatenate([s_rows, new_rows]),
            "keep_configs": np.concatenate([S, new_configs]),
            "keep_scores": np.concatenate([s_scores, new_scores]),
            "n_coupled": len(cs),
            "n_unique": gd.metrics.unique,
            "dedup": gd.metrics,
            "loads": (n_loc, len(cs), len(unique), busy),
        }

    def _stages_gpu(self, t: dict) -> dict:
        """Stages 1-3 on the GPU (`cuscikit.gpu.pipeline`)."""
        from cuscikit.gpu.ops import to_numpy

        r = self._gpu.run(self.space.configs, self.topk, space_pairs=self.inner_steps > 0)
        t.update(r.times)
        psi_s = torch.exp(r.logpsi[r.pos_space] - r.shift)
        keep = torch.cat([r.pos_space, r.topk_rows])
        return {
            "psi_s": psi_s, "eloc_c": r.hdiag + r.num_coupled / psi_s,
            "eloc_v": r.hdiag + r.num_variational / psi_s, "lp_graph": r.lp_graph,
            "hdiag": r.hdiag, "space_pairs": r.space_pairs,
            "new_configs": to_numpy(r.unique[r.topk_rows]),
            "keep_rows": keep.to("cpu").numpy(), "keep_configs": to_numpy(r.unique[keep]),
            "keep_scores": r.logpsi[keep].real.to("cpu").numpy(),
            "n_coupled": r.n_coupled, "n_unique": len(r.unique),
            "bytes_staged": r.bytes_staged, "n_batches": r.n_batches,
            "peak_theoretical_bytes": r.peak_theoretical,
        }

    def _load_columns(self, out: dict) -> dict:
        """History columns of a distributed step: per-rank loads and the de-dup metrics; the
        same on every rank."""

        table = out["load_table"]  # one row per rank, summed into the energies' allreduce
        sources, coupled, unique = (table[:, k].astype(np.int64) for k in range(3))
        m = out["dedup"]
        return {
            "n_coupled": int(coupled.sum()),
            "n_ranks": self.comm.size,
            "sources_max": int(sources.max()),
            "sources_min": int(sources.min()),
            "coupled_max": int(coupled.max()),
            "coupled_min": int(coupled.min()),
            "unique_max": int(unique.max()),
            "unique_min": int(unique.min()),
            "t_busy_max": float(table[:, 3].max()),
            "t_busy_min": float(table[:, 3].min()),
        } | {f"dedup_{k}": v for k, v in m.as_dict().items() if k != "method"}

    def _inner(self, S: np.ndarray, hdiag, pairs, share: tuple[int, int] | None = None) -> None:
        """`inner_steps` more AdamW steps on the Rayleigh quotient of psi restricted to S (the
        variational estimator's loss), with H_SS from this iteration's coupled pairs inside S.
        Each costs a forward and backward pass over S and a sparse product, no inference over
        U: cheap next to an iteration where U is much larger than S.

        On P ranks, `pairs` and `hdiag` are the rows of this rank's sources S[lo:hi] (`share`):
        every rank evaluates psi over the replicated S without a graph, its rows' local
        energies, and the gradient of its rows; the energy and the gradients are summed over
        the ranks, so the step equals the single-rank one to rounding."""
        dev, n, bs = self.device, len(S), self.batch_size
        lo, hi = share if share is not None else (0, n)

        def on_device(a):
            return (a if isinstance(a, torch.Tensor) else torch.as_tensor(np.asarray(a))).to(dev)

        src, dst, val = (on_device(a) for a in pairs)
        src, val = src - lo, val.to(torch.complex128)
        hd = on_device(hdiag).to(torch.float64)
        def no_grad_log_psi(a: int, b: int) -> list[torch.Tensor]:
            with torch.no_grad():
                return [self.ansatz.log_psi(S[c:min(c + bs, b)]) for c in range(a, b, bs)]

        for _ in range(self.inner_steps):
            self.optimizer.zero_grad(set_to_none=True)
            # this rank's rows keep their graph when they fit in one batch (else the loss
            # recomputes them batch by batch); the other ranks' rows need values only
            own = self.ansatz.log_psi(S[lo:hi]) if 0 < hi - lo <= bs else None
            parts = [*no_grad_log_psi(0, lo),
                     *([own.detach()] if own is not None else no_grad_log_psi(lo, hi)),
                     *no_grad_log_psi(hi, n)]
            lpd = torch.cat([p.to(torch.complex128) for p in parts])
            psi = torch.exp(lpd - lpd.real.max())
            prob = psi.abs() ** 2
            psi_own = psi[lo:hi]
            num = torch.zeros(hi - lo, dtype=torch.complex128, device=dev)
            num.index_add_(0, src, val * psi[dst])
            w = prob[lo:hi] / prob.sum()
            eloc = hd + num / psi_own
            e = (w * eloc).real.sum()
            bad = float((~torch.isfinite(eloc)).sum()) + float(not torch.isfinite(e))
            if self.distributed:  # E and the verdict on finiteness, the same on every rank
                e_sum, bad = self.comm.allreduce(np.array([float(e), bad]), op="sum")
                e = torch.tensor(e_sum, dtype=torch.float64, device=dev)
            if bad:
                return  # the next iteration's checks report it
            self._backward_loss(S[lo:hi], own, w, eloc - e)
            if self.distributed:
                from cuscikit.nnqs.distributed import allreduce_gradients

                allreduce_gradients(self.ansatz.parameters(), self.comm)
            self.optimizer.step()

    def _backward_loss(self, configs: np.ndarray, lp_graph, w, de) -> float:
        """Accumulate the gradient of L = 2 Re sum_x w(x) conj(ln psi(x)) de(x) (w and de
        detached) over `configs`, batch by batch unless `lp_graph` holds ln psi of all of them
        with its graph; returns L."""
        loss = 0.0
        for lo in range(0, len(configs), self.batch_size):
            hi = min(lo + self.batch_size, len(configs))
            lp = lp_graph if lp_graph is not None else self.ansatz.log_psi(configs[lo:hi])
            lp = lp.to(torch.complex128)
            dev = lp.device
            part = 2.0 * (w[lo:hi].to(dev) * (lp.conj() * de[lo:hi].to(dev))).real.sum()
            part.backward()
            loss += float(part.detach())
        return loss

    def step(self) -> dict:
        """One NNQS-SCI iteration. Returns its history row (also appended to `history`)."""
        t = {s: 0.0 for s in STAGES}
        t_start = time.perf_counter()
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        S = self.space.configs
        n = len(S)
        if self.distributed:
            out = self._stages_distributed(t)
        elif self.pipeline == "gpu":
            out = self._stages_gpu(t)
        else:
            out = self._stages_baseline(t)

        # Weights over S and both energies (on the device the stages left them on).
        t0 = time.perf_counter()
        prob = out["psi_s"].abs() ** 2
        if self.distributed:  # this rank's part of S: sums over all of S (and loads) by allreduce
            sums = [(prob * out[k]).real.sum() for k in ("eloc_c", "eloc_v")]
            loads = np.zeros((self.comm.size, len(out["loads"])))
            loads[self.comm.rank] = out["loads"]
            sums = np.concatenate([[float(prob.sum()), *map(float, sums)], loads.ravel()])
            sums = self.comm.allreduce(sums, op="sum")
            z, num_c, num_v = sums[:3]
            out["load_table"] = sums[3:].reshape(loads.shape)
            w = prob / z
            e_c, e_v = float(num_c / z), float(num_v / z)
        else:
            w = prob / prob.sum()
            e_c = float((w * out["eloc_c"]).real.sum())
            e_v = float((w * out["eloc_v"]).real.sum())
        eloc = out["eloc_c"] if self.estimator == "coupled" else out["eloc_v"]
        e_est = e_c if self.estimator == "coupled" else e_v
        t["energy"] += time.perf_counter() - t0

        # Loss with detached E_loc and E, backward, AdamW.
        t0 = time.perf_counter()
        self.optimizer.zero_grad(set_to_none=True)
        eloc_t = (eloc - e_est).to(torch.complex128)
        S_loss = out.get("loss_configs", S)  # this rank's sources when distributed
        loss_val = self._backward_loss(S_loss, out["lp_graph"], w, eloc_t)
        if self.distributed:  # one gradient for every replica; the loss travels along
            from cuscikit.nnqs.distributed import allreduce_gradients

            (loss_val,) = allreduce_gradients(self.ansatz.parameters(), self.comm, [loss_val])
            loss_val = float(loss_val)
        if not (math.isfinite(loss_val) and math.isfinite(e_c) and math.isfinite(e_v)):
            self.optimizer.zero_grad(set_to_none=True)
            raise NonFiniteLossError(
                f"iteration {self.iteration + 1}: non-finite loss {loss_val} or energies "
                f"({e_c}, {e_v}); the step was not applied"
            )
        self.optimizer.step()
        if self.inner_steps:
            self._inner(S, out["hdiag"], out["space_pairs"], out.get("source_share"))
        t["optimizer"] = time.perf_counter() - t0

        # Growth: S <- S + top-K new configurations (capped, dropping the smallest |psi|).
        t0 = time.perf_counter()
        new = out["new_configs"]
        n_new = self.space.add(new) if len(new) else 0
        if self.max_space is not None and len(self.space) > self.max_space:
            order = np.lexsort((out["keep_rows"], -out["keep_scores"]))[: self.max_space]
            self.space = SCISpace(self.molecule, out["keep_configs"][order], eps=self.eps)
        self.iteration += 1
        t["other"] = time.perf_counter() - t0
        total = time.perf_counter() - t_start
        t["other"] += max(0.0, total - sum(t.values()))  # transfers and bookkeeping

        row = {
            "iteration": self.iteration,
            "e_tot": e_est,
            "e_coupled": e_c,
            "e_variational": e_v,
            "error": (e_est - self.reference) if self.reference is not None else np.nan,
            "error_variational": (e_v - self.reference) if self.reference is not None else np.nan,
            "loss": loss_val,
            "n_space": n,
            "n_coupled": out["n_coupled"],
            "n_unique": out["n_unique"],
            "n_new": n_new,
            "n_space_next": len(self.space),
        }
        row.update({f"t_{s}": t[s] for s in STAGES})
        row["t_total"] = total
        row["peak_memory_bytes"] = _peak_memory(self.device)
        row["peak_theoretical_bytes"] = out.get("peak_theoretical_bytes", np.nan)
        row["bytes_staged"] = out.get("bytes_staged", 0)
        row["n_batches"] = out.get("n_batches", 1)
        if self.distributed:
            row.update(self._load_columns(out))
        self._rows.append(row)
        return row

    def run(
        self,
        n_iter: int,
        callbacks: Iterable[Callback] = (),
        *,
        progress: bool = True,
        checkpoint: str | None = None,
        checkpoint_every: int = 10,
    ) -> pd.DataFrame:
        """Run `n_iter` iterations (fewer if a callback stops it); returns the history.

        A non-finite loss stops the run with a message; the model keeps its last good weights
        and the checkpoint file (if any) its last good state. On several ranks every rank calls
        `run`; rank 0 shows the progress bar and messages and writes the checkpoint, and a
        callback that stops on any rank stops all of them.
        """
        callbacks = list(callbacks)
        for cb in callbacks:
            cb.on_run_start(self)
        bar = None
        if progress and self.rank == 0:
            from tqdm.auto import tqdm

            bar = tqdm(total=n_iter, desc="NNQS-SCI", unit="it", mininterval=1.0)
        try:
            for _ in range(n_iter):
                try:
                    row = self.step()
                except NonFiniteLossError as exc:  # raised on every rank alike
                    if self.rank == 0:
                        print(f"NNQS-SCI stopped: {exc}")
                    break
                if bar is not None:
                    post = {"E": f"{row['e_tot']:.8f}", "|S|": row["n_space_next"]}
                    if self.reference is not None:
                        post["err"] = f"{row['error']:.2e}"
                    bar.set_postfix(post, refresh=False)  # redrawn by update()
                    bar.update(1)
                if checkpoint and self.iteration % checkpoint_every == 0:
                    self.save(checkpoint)
                stop = any(cb.on_step_end(self, row) for cb in callbacks)
                if self.distributed and callbacks:  # all ranks stop together
                    stop = bool(self.comm.allreduce(int(stop), op="max"))
                if stop:
                    break
        finally:
            if bar is not None:
                bar.close()
        if checkpoint and self._rows and self.iteration % checkpoint_every:
            self.save(checkpoint)
        for cb in callbacks:
            cb.on_run_end(self)
        return self.history

    # ---------------------------------------------------------------------------- checkpoints
    def save(self, path: str) -> None:
        """Write model, optimiser state, S, RNG states and history to an HDF5 file.

        On several ranks (collective) rank 0 writes the file and every rank returns once it is
        written, or raises if rank 0 could not write it. The file does not depend on the rank
        count: any number of ranks can resume from it."""
        from cuscikit.nnqs.checkpoint import save_checkpoint

        if not self.distributed:
            save_checkpoint(self, path)
            return
        error = None
        if self.rank == 0:
            try:
                save_checkpoint(self, path)
            except Exception as exc:  # noqa: BLE001 - re-raised below, after telling the others
                error = exc
        if self.comm.allreduce(int(error is not None), op="max"):
            if error is not None:
                raise error
            raise OSError(f"rank 0 could not write the checkpoint {path}")

    def load(self, path: str) -> Runner:
        """Restore a checkpoint written by `save` into this runner (same molecule and ansatz
        shape); later iterations continue exactly where the saved run stopped. The runner's
        device need not be the saved run's: a checkpoint from a GPU run resumes on a CPU-only
        machine and vice versa. On several ranks (collective) every rank reads the file; if any
        rank cannot, all raise."""
        from cuscikit.nnqs.checkpoint import CheckpointError, load_checkpoint

        if not self.distributed:
            load_checkpoint(self, path)
            return self
        error = None
        try:
            load_checkpoint(self, path)
        except Exception as exc:  # noqa: BLE001 - re-raised below, after telling the others
            error = exc
        failed = np.zeros(self.comm.size, dtype=np.int64)
        failed[self.rank] = error is not None
        failed = self.comm.allreduce(failed, op="sum")
        if error is not None:
            raise error
        if failed.any():
            bad = np.flatnonzero(failed).tolist()
            raise CheckpointError(f"{path}: ranks {bad} could not read the checkpoint")
        return self


def _segment_sum(index: np.ndarray, values: np.ndarray, n: int) -> np.ndarray:
    """sum of complex `values` grouped by `index` (length n)."""
    re = np.bincount(index, weights=values.real, minlength=n)
    im = np.bincount(index, weights=values.imag, minlength=n)
    return re + 1j * im


def _peak_memory(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux: KiB
