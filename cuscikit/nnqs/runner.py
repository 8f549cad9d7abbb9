"""The NNQS-SCI driver: optimise a neural wavefunction over a growing selected-CI space.

Each iteration runs stages 1-3 through `cuscikit.nnqs.pipeline` (generation, de-dup, inference,
selection, local energies: one code path for every device and rank count), then the energy of
both estimators, the loss, an AdamW step (plus optional inner steps within S) and the growth of
S. The Runner follows the solver shape of `cuscikit.lib.Solver`: options are attributes with
defaults, `kernel` runs and returns the energy, `run` returns the runner, `step` runs one
iteration for notebooks, and every iteration appends a row to `history`.

Our account of the method, its conventions and the measured defaults: ``docs/nnqs_sci.md``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable

import numpy as np
import pandas as pd
import torch

from cuscikit.backends import resolve_device
from cuscikit.backends.memory import HostPeak
from cuscikit.chem.molecule import check_state_symmetry
from cuscikit.lib.callbacks import Callback, EarlyStopping, RunLoop, RunStatus
from cuscikit.lib.logger import NOTE, new_logger
from cuscikit.lib.solver import Solver
from cuscikit.nnqs.defaults import (
    DEFAULT_GROWTH,
    DEFAULT_INNER_STEPS,
    DEFAULT_ITERATIONS,
    DEFAULT_LATTICE_GROWTH,
    DEFAULT_LATTICE_TEACHER_INNER_STEPS,
    DEFAULT_LR,
    DEFAULT_LR_DECAY_FROM,
    DEFAULT_LR_FINAL,
    DEFAULT_MAX_SPACE,
    DEFAULT_TEACHER,
    DEFAULT_TEACHER_GAP,
    DEFAULT_TEACHER_HOLD,
    DEFAULT_TEACHER_INNER_STEPS,
    DEFAULT_TEACHER_UNTIL,
    DEFAULT_TOPK,
    DEFAULT_WEIGHT_ADD,
    DEFAULT_WEIGHT_PRUNE,
)
from cuscikit.parallel.comm import SerialComm
from cuscikit.sci.hamiltonian import DEFAULT_EPS, Hamiltonian
from cuscikit.sci.space import SCISpace

__all__ = ["Callback", "EarlyStopping", "LearningRateDecay", "NonFiniteLossError", "Runner"]

ESTIMATORS = ("coupled", "variational")
STAGES = ("generation", "dedup", "inference", "energy", "optimizer", "other")
PIPELINES = ("auto", "gpu", "baseline")
GROWTH = ("count", "weight", "auto")


class NonFiniteLossError(FloatingPointError):
    """The loss or the energy became NaN or infinite; the step was not applied."""


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
        >>> decay = LearningRateDecay(start=2, end=4, final_lr=1e-4)
        >>> runner.run(4, [decay], progress=False).optimizer.param_groups[0]["lr"]
        0.0001

        The command line's default schedule for a run of 2000 iterations (constant to 1000,
        then down to 1e-4 at 2000):

        >>> runner.run(2000, [LearningRateDecay.over_tail(2000)])  # doctest: +SKIP
    """

    def __init__(self, start: int, end: int, final_lr: float):
        if not 0 <= start < end:
            raise ValueError(f"need 0 <= start < end, got start={start}, end={end}")
        if not (math.isfinite(final_lr) and 0 < final_lr < 3e38):
            raise ValueError(f"final_lr must be a positive finite rate, got {final_lr}")
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


def _with_teacher(w, de, pull, weight: float, rows: tuple[int, int] | None = None):
    """(weights, coefficients) for `Runner._backward_loss` with the teacher's pull added to
    the energy's: unit weights and w * de + weight * pull, where pull is
    `cuscikit.nnqs.teacher.teacher_coefficients` (psi, c) over all of S. w and de cover `rows`
    (lo, hi) of S, this rank's (None: all of S), and so does the result."""
    if rows is not None:
        pull = pull[rows[0] : rows[1]]
    coef = w.to(de.device) * de
    coef = coef + weight * pull.to(coef.device)
    return torch.ones(len(coef), dtype=torch.float64, device=coef.device), coef


def systematic_draw(coef: torch.Tensor, m: int, u: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of `coef` drawn m times by systematic sampling with probability |coef| / sum |coef|
    (the points (u + j) / m, j < m, on the cumulative probabilities), each row once, and the
    factors count / (m p) that make ``sum_rows factor * coef * g`` an unbiased estimate of
    ``sum_x coef_x * g_x`` for any g (the expected count of a row is m p). A row of
    probability at least 1/m is always drawn. Empty when every coefficient is 0.

    Example:
        >>> import torch
        >>> rows, f = systematic_draw(torch.tensor([3.0, 0.0, 1.0]), 2, 0.9)
        >>> rows.tolist(), f.tolist()
        ([0, 2], [0.6666666666666666, 2.0])
    """
    mag = coef.abs().to(torch.float64)
    total = mag.sum()
    if not float(total) > 0:
        empty = torch.zeros(0, dtype=torch.long, device=coef.device)
        return empty, torch.zeros(0, dtype=torch.float64, device=coef.device)
    cum = torch.cumsum(mag, 0)
    # points below cum[-1] itself: no rounding can send one past the last row of weight
    pos = (u + torch.arange(m, dtype=torch.float64, device=coef.device)) * (cum[-1] / m)
    idx = torch.searchsorted(cum, pos, right=True)
    rows, counts = torch.unique_consecutive(idx, return_counts=True)
    return rows, counts.to(torch.float64) * (total / (m * mag[rows]))


class Runner(Solver):
    """NNQS-SCI: optimise a neural wavefunction over a growing selected-CI space.

    Every iteration: coupled configurations C(x) of all x in S (|H_xx'| > eps), sort + unique
    over S and C(S) (across ranks when there are several), batched inference of ln psi on the
    unique set, a hierarchical top-K of |psi| over the new configurations, both energy
    estimators, the loss L = 2 Re sum_x w(x) conj(ln psi(x)) (E_loc(x) - E) with
    w = |psi|^2 / sum_S |psi|^2, an AdamW step, and S <- S + top-K (optionally capped at
    `max_space`, dropping the smallest |psi|).

    Args:
        molecule: a `cuscikit.Molecule` (or anything with norb, nelec, h1e, eri_full(), e_core).
        ansatz: a `cuscikit.Ansatz` (any module with ``log_psi(configs) -> complex tensor``).
        space: the starting space (default: `SCISpace.start`, the Hartree-Fock determinant unless
            the molecule names another start, as lattices with a partly filled shell do).
        comm: a `cuscikit.parallel.Comm` (``get_comm()`` under torchrun or mpiexec). P > 1
            ranks: every rank builds the Runner with the same molecule and options (rank 0's
            model and S are broadcast at construction) and runs its share of every stage;
            energies equal the single-rank run's to rounding. One rank per GPU with
            ``pipeline="gpu"`` and NCCL keeps every stage on the GPUs. The progress bar,
            messages and checkpoint files come from rank 0. History rows (one rank or several)
            carry the loads: ``n_ranks``, ``sources_max``/``_min``, ``coupled_max``/``_min``,
            ``unique_max``/``_min``, ``t_busy_max``/``_min``, each rank k's ``sources_r<k>``,
            ``coupled_r<k>``, ``unique_r<k>``, ``received_r<k>`` (de-dup exchange) and
            ``t_busy_r<k>``, and on several ranks the de-dup metrics (``dedup_*``).
        device: must match the ansatz ("cpu", "cuda"; default: the ansatz's device).
        **options: any of the options below.

    Options (attributes; set them by keyword, by assignment before the first iteration, or
    with `set`):
        topk: configurations added per iteration (K).
        estimator: "coupled" (sum over all of C(x), the papers' form) or "variational" (only
            x' in S: the Rayleigh quotient of psi restricted to S). Drives the loss; both are
            computed and kept in the history.
        growth: how S grows and shrinks. "auto" (default): "weight" for a lattice model
            (`Molecule.is_lattice`, `DEFAULT_LATTICE_GROWTH`), "count" otherwise
            (`DEFAULT_GROWTH`); `growth_rule` is the one in force. "count": S <- S + the top-K new
            configurations by |psi|, capped at `max_space`. "weight": the new configurations
            are ranked by their first-order weight |c_a|^2 = |sum_x H_ax psi(x)|^2 /
            (E_var - H_aa)^2 (psi normalised on S; the PT2 terms the iteration already has), the
            top-K of those with |c_a|^2 >= `add_weight` are added, S is pruned by weight
            (`prune_weight`), and the memory budget is the hard limit: S keeps the longest
            prefix (S by decreasing |psi|, then the new ones by weight) whose next iteration
            fits `space_memory` (`cuscikit.nnqs.pipeline.space_bytes` of its exact coupled
            counts). History columns ``weight_outside`` (sum of |c_a|^2 over all a coupled to
            S and outside it) and ``bytes_planned`` (the model's bytes for the next S).
        max_space: cap on |S|; None: no cap; "auto" (default): `DEFAULT_MAX_SPACE` under
            growth="count", no cap under growth="weight" (the memory budget alone limits S).
        prune_weight: a weight w or None: after each growth step the configurations of
            smallest |psi| whose summed share of sum |psi|^2 is at most w are dropped (pruning
            by weight, not by count). Under growth="count" (default None: off) the share is
            over S and the new configurations and the cap still applies; under
            growth="weight" (None: `DEFAULT_WEIGHT_PRUNE`) it is over S only, before the new
            ones are added (their |psi| has not been trained yet; default off). The history's
            ``weight_dropped`` is the share dropped, whichever rule dropped configurations.
        add_weight: growth="weight" only: the least first-order weight |c_a|^2 of a new
            configuration (None: `DEFAULT_WEIGHT_ADD`).
        space_memory: growth="weight" only: bytes S and its coupled set may take (None: what
            the pipeline's `cuscikit.backends.MemoryBudget` has available at each iteration:
            host memory on the CPU, the GPU's on a GPU).
        eps: screening threshold of the coupled sets.
        lr, betas, weight_decay, adam_eps: AdamW settings.
        batch_size: configurations per inference batch.
        seed: seeds the torch and numpy generators used by the run.
        reference: exact energy for the error column (default: the molecule's bundled one).
        pipeline: "gpu" (every stage on the GPU), "baseline" (generation and de-dup on the
            CPU, inference where the ansatz lives) or "auto" (gpu on a CUDA device with the
            kernels built).
        max_gpu_memory: cap in bytes on what the process holds on the GPU (gpu pipeline); a
            problem whose intermediates exceed it still runs, in smaller batches.
        staging: where the gpu pipeline keeps coupled sets between stages 1 and 3: "auto"
            (pinned host memory only when they do not fit), "device" or "host".
        compile_inference: evaluate ln psi over the unique set with a `torch.compile`d pass
            (about 2x faster on an H200 after a few seconds of compilation; equal to float32
            rounding). With it, ``graphs="auto"`` stays off (``graphs=True`` records the eager
            ansatz for the optimiser stage beside the compiled inference).
        fused_inference: ln psi without gradient over the unique set through the fused Triton
            kernel (`cuscikit.nnqs.fast_infer`): "auto" (default: on for a float32 ansatz of a
            supported size on a CUDA device with Triton; its first batch is checked against
            the module in float64 and the module runs instead past 1e-5 in ln psi and past 4
            times the float32 module's own error there), True (the same, but an error where
            it cannot run) or False (the module).
        inner_steps: after each iteration's AdamW step, this many more on the Rayleigh quotient
            of psi restricted to S (the variational estimator's loss, with H_SS from the
            iteration's coupled pairs inside S). Each costs a forward and backward pass over S,
            no inference over the unique set.
        inner_batch: None (default): every inner step's gradient runs over all of S. A count
            M: while |S| > M, each inner step takes its gradient from about M configurations
            drawn with probability proportional to the size of their coefficient in the loss
            (`systematic_draw`, an unbiased estimate of the full gradient); the local energies
            and weights still come from psi over all of S without gradient (the pipeline's
            pass: the fused kernel on a GPU), and the iteration's own step stays over all of
            S. Such iterations take the eager optimiser stage (`graphs` records full inner
            steps only). For spaces far larger than M, where a pass with gradient over S
            costs far more than one without.
        graphs: run the optimiser stage (the iteration's AdamW step and the inner steps) as
            one recorded CUDA graph per size bucket (`cuscikit.nnqs.graphs`): "auto" (default:
            on a CUDA device, single process, without `compile_inference`, for |S| up to
            `graph_space`), True (the same, compiled or not, but an error on a CPU or on
            several ranks) or False (the eager stage). Same arithmetic as the eager stage
            (equal to rounding); on N2/STO-3G it removes most of the launch overhead of a
            small system (docs/performance.md).
        graph_space: the largest |S| the recorded optimiser stage takes (it runs S as one
            pass; a larger S takes the eager stage, batch by batch): "auto" (default: any S of
            at most `batch_size` configurations, and a larger one while twice the bytes its
            autograd graph keeps, measured once per run with
            `cuscikit.nnqs.graphs.saved_bytes_per_row`, fit in half the GPU memory free at
            that moment) or a count (`batch_size` gives the rule of one batch).
        shared_prefix_training: the passes with gradient of the optimiser stage (every pass of the
            recorded stage; the inner steps of the eager one, whose iteration step reuses the
            pipeline's pass) run the transformer once per distinct prefix of S
            (`cuscikit.nnqs.ansatz.prefix_tree`) instead of once per configuration and
            position: the same values and gradients to rounding, fewer rows where S shares
            prefixes (a lattice's S shares many; docs/performance.md). False (default) or
            True; needs a `cuscikit.Ansatz`. On an H100 it made the 12-site ring's iteration
            3.9 times slower (the gathers' backward), so it stays off there; on a 2-core CPU
            1.07 times faster (8-site chain). The passes without gradient share prefixes
            already, in the fused inference kernel (`FusedInference(share_prefixes=True)`).
        pt2: report the Epstein-Nesbet second-order correction of the iteration's psi on S,
            E_PT2 = sum_{a not in S} |sum_{x in S} H_ax psi(x)|^2 / (E_var - H_aa) with psi
            normalised on S and E_var the variational energy, from the coupled sets the
            iteration already has (history columns ``e_pt2``, ``e_tot_pt2`` = E_var + E_PT2,
            ``error_pt2``).
        teacher: weight (in energy units) of the selected-CI teacher at iteration 1
            (`cuscikit.nnqs.teacher`; 0: off). While it is on, every iteration diagonalises
            H restricted to S (from the pairs the inner steps use; an S equal to the last one
            diagonalised reuses that solution) and adds to the gradient of
            the energy, in the iteration's step and in each inner step, `teacher` times the
            gradient of a fidelity loss that pulls the network's amplitudes and signs on S
            towards that eigenvector; the weight falls linearly to 0 at iteration
            `teacher_until` (unless held, `teacher_hold`), after which the run is the plain
            method (but for the inner steps, below). Only the gradient changes: the energies
            reported are the network's own. History columns (with the teacher on):
            ``teacher_weight``, ``e_teacher`` (the CI energy within S; after `teacher_until`
            while S is the one last solved, else NaN), ``teacher_loss``, ``inner_steps`` (this
            iteration's) and, with `teacher_hold` > 0, ``teacher_released``. "auto" (default):
            `DEFAULT_TEACHER`. On several ranks every rank runs the same eigensolve from its own
            rows of H_SS (`space_ground_state(comm=)`) and pulls its own rows. The
            pull is part of the recorded optimiser stage (`graphs`).
        teacher_until: the iteration from which the teacher's weight is 0.
        teacher_inner_steps: inner steps while the teacher's weight is above 0; with
            `teacher_hold` = 0 also after it while S is the space the teacher last solved and
            the network's variational energy is above that CI energy by more than `teacher_gap`
            (`inner_steps` otherwise; with a hold, `inner_steps` once the weight is 0, so the
            count changes once a run).
            "auto" (default): `DEFAULT_LATTICE_TEACHER_INNER_STEPS` for a lattice model,
            otherwise `DEFAULT_TEACHER_INNER_STEPS` on a CUDA device and `inner_steps` on a
            CPU; None: `inner_steps`.
        teacher_gap: the energy of that test and of the hold's (None: the teacher's inner
            steps end with its weight; needs `teacher_hold` = 0).
        teacher_hold: a fraction h in [0, 1] (0: off): while the network's variational energy
            is above the CI energy of S by more than `teacher_gap`, the teacher's weight is at
            least h times its weight at iteration 1, tested against the teacher's solution of
            each S (with `teacher_resolve`; else from `teacher_until` on only while S is the
            space last solved). The first iteration where the schedule is below that and the
            test fails (or, without `teacher_resolve`, S has changed after `teacher_until`)
            releases the hold for good (`teacher_released`, kept by `save` / `load`: a resumed
            run is the same run); from then on the weight is the linear schedule's.
        teacher_resolve: while the hold is in force after `teacher_until`, solve each new S
            (the eigensolve started from the last solution, carried over to the rows the two
            spaces share) instead of releasing the hold when S changes (default True; False:
            the rule before, for spaces that keep changing under a count cap where a solve per
            iteration is not wanted). Without a change of S after `teacher_until` (every run
            whose S stops growing before it) both give the same run.
        verbose: PySCF-style verbosity (messages at NOTE and above; `dump_flags` at INFO).

    Example:
        >>> from cuscikit import Ansatz, Molecule, Runner
        >>> mol = Molecule.load("LiH")
        >>> runner = Runner(mol, Ansatz.for_molecule(mol, seed=0), topk=64, seed=0)
        >>> e = runner.kernel(3, progress=False)
        >>> runner.history[["iteration", "n_space"]].iloc[-1].tolist()
        [3, 69]

        On several ranks (``torchrun --nproc-per-node 4 script.py`` or ``mpiexec -n 4 python
        -m mpi4py script.py``), the same script with ``comm=get_comm()``:

        >>> from cuscikit.parallel import get_comm
        >>> comm = get_comm()  # doctest: +SKIP
        >>> runner = Runner(mol, Ansatz.for_molecule(mol, seed=0), comm=comm)  # doctest: +SKIP
    """

    topk: int = DEFAULT_TOPK
    estimator: str = "coupled"
    growth: str = "auto"
    max_space: int | None | str = "auto"
    prune_weight: float | None = None
    add_weight: float | None = None
    space_memory: int | None = None
    eps: float = DEFAULT_EPS
    lr: float = DEFAULT_LR
    betas: tuple[float, float] = (0.9, 0.99)
    weight_decay: float = 0.0
    adam_eps: float = 1e-9
    batch_size: int = 16384
    seed: int = 0
    reference: float | None = None
    pipeline: str = "auto"
    max_gpu_memory: int | None = None
    staging: str = "auto"
    compile_inference: bool = False
    fused_inference: bool | str = "auto"
    inner_steps: int = DEFAULT_INNER_STEPS
    inner_batch: int | None = None
    graphs: bool | str = "auto"
    graph_space: int | str = "auto"
    shared_prefix_training: bool = False
    pt2: bool = True
    teacher: float | str = "auto"
    teacher_until: int = DEFAULT_TEACHER_UNTIL
    teacher_inner_steps: int | None | str = "auto"
    teacher_gap: float | None = DEFAULT_TEACHER_GAP
    teacher_hold: float = DEFAULT_TEACHER_HOLD
    teacher_resolve: bool = True
    verbose: int = NOTE

    _keys = {
        "molecule",
        "ansatz",
        "space",
        "comm",
        "device",
        "rank",
        "hamiltonian",
        "optimizer",
        "iteration",
        "rng",
        "status",
        "schedule",
    }
    # options that shape the machinery built at construction
    _structural = (
        "eps",
        "batch_size",
        "pipeline",
        "max_gpu_memory",
        "staging",
        "compile_inference",
        "fused_inference",
        "seed",
    )

    def __init__(
        self,
        molecule,
        ansatz: torch.nn.Module,
        space: SCISpace | None = None,
        *,
        comm=None,
        device=None,
        **options,
    ):
        super().__init__(**options)
        self.molecule = molecule  # the "auto" options depend on it
        self._validate()
        check_state_symmetry(molecule)
        self.comm = comm if comm is not None else SerialComm()
        self.rank = self.comm.rank
        a_norb, a_nelec = getattr(ansatz, "norb", None), getattr(ansatz, "nelec", None)
        if a_norb is not None and a_norb != molecule.norb:
            raise ValueError(f"the ansatz has {a_norb} orbitals, the molecule {molecule.norb}")
        if self.shared_prefix_training and not hasattr(ansatz, "_log_psi_tokens"):
            raise ValueError(
                "shared_prefix_training=True needs a cuscikit Ansatz (ln psi over a prefix "
                f"tree), got {type(ansatz).__name__}"
            )
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
        self.space = space if space is not None else SCISpace.start(molecule, eps=self.eps)
        if self.space.norb != molecule.norb or tuple(self.space.nelec) != tuple(molecule.nelec):
            raise ValueError("the space belongs to another molecule (norb or nelec differ)")
        if self.reference is None:
            ref = (getattr(molecule, "metadata", None) or {}).get("reference") or {}
            self.reference = ref.get("energy")
        self.optimizer = torch.optim.AdamW(
            ansatz.parameters(),
            lr=self.lr,
            betas=self.betas,
            weight_decay=self.weight_decay,
            eps=self.adam_eps,
        )
        self.iteration = 0
        self.status: RunStatus | None = None
        self._rows: list[dict] = []
        self.rng = np.random.default_rng(self.seed)
        torch.manual_seed(self.seed)
        self._build()
        if self.distributed:
            from cuscikit.nnqs.distributed import sync_replicas

            sync_replicas(self, self.comm)

    # ------------------------------------------------------------------------------ options
    def _validate(self) -> None:
        """Clear errors for bad options, before any work."""

        def positive_int(name, value, allow_none=False, minimum=1):
            if value is None and allow_none:
                return
            if isinstance(value, bool) or int(value) != value or value < minimum:
                what = "a positive" if minimum == 1 else "a non-negative"
                raise ValueError(f"{name} must be {what} integer, got {value!r}")

        positive_int("topk", self.topk)
        if self.growth not in GROWTH:
            raise ValueError(f"unknown growth {self.growth!r}: use one of {GROWTH}")
        if self.max_space != "auto":
            positive_int("max_space", self.max_space, allow_none=True)
        for name in ("prune_weight", "add_weight"):
            v = getattr(self, name)
            if v is not None and not (
                isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < 1
            ):
                raise ValueError(f"{name} must be None or in [0, 1), got {v!r}")
        positive_int("space_memory", self.space_memory, allow_none=True)
        rule = self.growth_rule
        why = f' ("auto" is "{rule}" for {self.molecule.name})' if self.growth == "auto" else ""
        if rule == "count" and (self.add_weight, self.space_memory) != (None, None):
            raise ValueError(f'add_weight and space_memory apply to growth="weight" only{why}')
        if rule == "weight" and not self.pt2:
            raise ValueError(
                f'growth="weight" needs pt2=True (the first-order weights){why}; with pt2=False '
                'pass growth="count"'
            )
        positive_int("batch_size", self.batch_size)
        positive_int("inner_steps", self.inner_steps, minimum=0)
        positive_int("inner_batch", self.inner_batch, allow_none=True)
        if self.teacher != "auto" and not (
            isinstance(self.teacher, (int, float))
            and not isinstance(self.teacher, bool)
            and math.isfinite(self.teacher)
            and self.teacher >= 0
        ):
            raise ValueError(
                f'teacher must be "auto" or a finite weight >= 0, got {self.teacher!r}'
            )
        positive_int("teacher_until", self.teacher_until)
        if isinstance(self.teacher_inner_steps, str) and self.teacher_inner_steps != "auto":
            raise ValueError(
                'teacher_inner_steps must be "auto", None or an integer >= 0, got '
                f"{self.teacher_inner_steps!r}"
            )
        if self.teacher_inner_steps != "auto":
            positive_int(
                "teacher_inner_steps", self.teacher_inner_steps, allow_none=True, minimum=0
            )
        g = self.teacher_gap
        if g is not None and not (
            isinstance(g, (int, float)) and not isinstance(g, bool) and math.isfinite(g) and g >= 0
        ):
            raise ValueError(f"teacher_gap must be None or a finite energy >= 0, got {g!r}")
        h = self.teacher_hold
        if isinstance(h, bool) or not (
            isinstance(h, (int, float)) and math.isfinite(h) and 0 <= h <= 1
        ):
            raise ValueError(
                f"teacher_hold must be a fraction in [0, 1] of the teacher's weight, got {h!r}"
            )
        if not isinstance(self.teacher_resolve, bool):
            raise ValueError(f"teacher_resolve must be True or False, got {self.teacher_resolve!r}")
        if h > 0 and g is None and self.teacher != 0:
            raise ValueError(
                "teacher_hold > 0 releases the teacher once the network is within teacher_gap "
                "of the CI energy of S: give teacher_gap, or teacher_hold=0"
            )
        if not (isinstance(self.graphs, bool) or self.graphs == "auto"):
            raise ValueError(f"graphs must be True, False or 'auto', got {self.graphs!r}")
        if self.graph_space != "auto":
            if isinstance(self.graph_space, str):
                raise ValueError(
                    f'graph_space must be "auto" or a positive integer, got {self.graph_space!r}'
                )
            positive_int("graph_space", self.graph_space)
        if not isinstance(self.shared_prefix_training, bool):
            raise ValueError(
                f"shared_prefix_training must be True or False, got {self.shared_prefix_training!r}"
            )
        if not (isinstance(self.fused_inference, bool) or self.fused_inference == "auto"):
            raise ValueError(
                f"fused_inference must be True, False or 'auto', got {self.fused_inference!r}"
            )
        if self.estimator not in ESTIMATORS:
            raise ValueError(f"unknown estimator {self.estimator!r}: use one of {ESTIMATORS}")
        if self.pipeline not in PIPELINES:
            raise ValueError(f"unknown pipeline {self.pipeline!r}: use one of {PIPELINES}")
        for name in ("lr", "adam_eps"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and 0 < v < 3e38):
                raise ValueError(f"{name} must be a positive finite number, got {v!r}")
        if not (math.isfinite(self.weight_decay) and self.weight_decay >= 0):
            raise ValueError(f"weight_decay must be finite and >= 0, got {self.weight_decay!r}")
        if not all(math.isfinite(b) and 0 <= b < 1 for b in self.betas):
            raise ValueError(f"betas must lie in [0, 1), got {self.betas!r}")
        if not (isinstance(self.eps, (int, float)) and math.isfinite(self.eps)):
            raise ValueError(f"eps must be a finite number, got {self.eps!r}")
        if self.reference is not None and not math.isfinite(self.reference):
            raise ValueError(f"reference must be a finite energy, got {self.reference!r}")

    def _build(self) -> None:
        """The Hamiltonian, the engine and the pipeline, from the options (at construction,
        and again if a structural option changes before the first iteration)."""
        from cuscikit.nnqs.pipeline import Pipeline
        from cuscikit.sci.engines import CudaEngine, HostEngine

        kind = self._choose_pipeline()
        if kind != "gpu" and self.max_gpu_memory is not None:
            raise ValueError("max_gpu_memory applies to the gpu pipeline only")
        self.hamiltonian = Hamiltonian.from_molecule(self.molecule, eps=self.eps)
        budget = None
        if kind == "gpu":
            from cuscikit.backends.memory import MemoryBudget

            engine = CudaEngine(self.hamiltonian, self.device)
            budget = MemoryBudget(self.device, self.max_gpu_memory)
        else:
            engine = HostEngine(self.hamiltonian)
        self._pipeline = Pipeline(
            engine,
            self.ansatz,
            comm=self.comm,
            batch_size=self.batch_size,
            budget=budget,
            staging=self.staging,
            compile_inference=self.compile_inference,
            fused_inference=self._fused_inference(),
            want_pairs=self._want_pairs(),
            pt2=bool(self.pt2),
        )
        self._kind = kind
        self._graph_stage = None
        self._graph_row_bytes: float | None = None  # autograd bytes per configuration
        self._graph_oom: int | None = None  # the bucket whose recording ran out of memory
        self._graphs_off: str | None = None
        self._teacher_last = None  # (S, energy, vector) of the last teacher solve
        self._teacher_on_device = None  # (that vector, its copy on the device)
        self._teacher_released = False  # the hold's one-way end (`teacher_hold`)
        self._set_graph_inference()  # raises for graphs=True where graphs cannot run
        self._built_with = {k: getattr(self, k) for k in self._structural}

    def _fused_inference(self):
        """The `fused_inference` option resolved: a FusedInference of the ansatz, or None."""
        if self.fused_inference is False:
            return None
        from cuscikit.nnqs.fast_infer import FusedInference, unsupported_reason

        why = unsupported_reason(self.ansatz)
        if why is None and self.device.type != "cuda":
            why = f"the runner is on {self.device.type}, the fused kernel needs CUDA"
        if why is not None:
            if self.fused_inference is True:
                raise ValueError(f"fused_inference=True, but {why}")
            return None
        return FusedInference(self.ansatz)

    def _choose_pipeline(self) -> str:
        if self.device.type != "cuda":
            if self.pipeline == "gpu":
                raise ValueError("pipeline='gpu' needs the ansatz and runner on a CUDA device")
            return "baseline"
        from cuscikit.backends import cuda, cuda_available

        if self.pipeline == "auto":
            return "gpu" if cuda_available() else "baseline"
        if self.pipeline == "gpu":
            cuda()  # raises a clear error when the kernels are missing
        return self.pipeline

    def _sync_options(self) -> None:
        """Apply options changed since construction: the AdamW settings at once, structural
        ones by rebuilding before the first iteration (refused mid-run)."""
        self.check_sanity()
        self._validate()
        changed = [k for k, v in self._built_with.items() if getattr(self, k) != v]
        if changed:
            if self.iteration:
                raise ValueError(
                    f"{', '.join(changed)} changed after iteration {self.iteration}; these "
                    "options are fixed once a run has started (build a new Runner)"
                )
            if "seed" in changed:
                self.rng = np.random.default_rng(self.seed)
                torch.manual_seed(self.seed)
            self._build()
        self._pipeline.want_pairs = self._want_pairs()
        self._set_graph_inference()
        self._pipeline.pt2 = bool(self.pt2)
        d = self.optimizer.defaults
        if (d["betas"], d["weight_decay"], d["eps"]) != (
            tuple(self.betas),
            self.weight_decay,
            self.adam_eps,
        ):
            d.update(betas=tuple(self.betas), weight_decay=self.weight_decay, eps=self.adam_eps)
            for g in self.optimizer.param_groups:
                g.update(betas=tuple(self.betas), weight_decay=self.weight_decay, eps=self.adam_eps)
        if d["lr"] != self.lr:  # a new base rate (a LearningRateDecay scales from it)
            d["lr"] = self.lr
            for g in self.optimizer.param_groups:
                g["lr"] = self.lr

    def _want_pairs(self) -> bool:
        """Whether stage 3 returns the H_SS pairs (inner steps, a teacher still on, or the
        teacher's inner steps possibly still running after it)."""
        return (
            self.inner_steps > 0
            or self.teacher_weight(self.iteration + 1) > 0
            or (self.teacher_on > 0 and self.teacher_inner_count > 0)
            or self._holding
        )

    @property
    def teacher_on(self) -> float:
        """The teacher's weight at iteration 1 in force: `teacher` with "auto" resolved
        (`DEFAULT_TEACHER`)."""
        if self.teacher == "auto":
            return DEFAULT_TEACHER
        return float(self.teacher)

    @property
    def growth_rule(self) -> str:
        """The growth rule in force: `growth` with "auto" resolved (`DEFAULT_LATTICE_GROWTH`
        for a lattice model, `DEFAULT_GROWTH` otherwise)."""
        if self.growth != "auto":
            return self.growth
        return DEFAULT_LATTICE_GROWTH if self._lattice else DEFAULT_GROWTH

    @property
    def _lattice(self) -> bool:
        """Whether the molecule is a lattice model (`Molecule.is_lattice`): the "auto" options
        resolve by it."""
        return bool(getattr(self.molecule, "is_lattice", False))

    @property
    def teacher_inner_count(self) -> int:
        """The teacher's inner steps: `teacher_inner_steps`; None: `inner_steps`; "auto":
        `DEFAULT_LATTICE_TEACHER_INNER_STEPS` for a lattice model (on any device: its network,
        not S, limits it), otherwise `DEFAULT_TEACHER_INNER_STEPS` on a CUDA device and
        `inner_steps` on a CPU (where an inner step over S costs about as much as the
        iteration's inference)."""
        n = self.teacher_inner_steps
        if n == "auto":
            if self._lattice:
                return DEFAULT_LATTICE_TEACHER_INNER_STEPS
            return DEFAULT_TEACHER_INNER_STEPS if self.device.type == "cuda" else self.inner_steps
        return self.inner_steps if n is None else int(n)

    @property
    def teacher_released(self) -> bool:
        """Whether the teacher's hold (`teacher_hold`) has ended: from then on its weight is
        `teacher_weight` and its inner steps end with it. For good: a checkpoint keeps it."""
        return self._teacher_released

    @property
    def _holding(self) -> bool:
        """Whether the hold is still in force (a teacher, `teacher_hold` > 0, not released)."""
        return self.teacher_on > 0 and self.teacher_hold > 0 and not self._teacher_released

    def teacher_weight(self, t: int) -> float:
        """The teacher's scheduled weight at iteration t (1-based): the resolved `teacher` at
        t = 1, falling linearly to 0 at `teacher_until` (the hold, `teacher_hold`, may keep the
        weight of an iteration above it)."""
        lam0 = self.teacher_on
        if not lam0 or t >= self.teacher_until:
            return 0.0
        return lam0 * (self.teacher_until - t) / (self.teacher_until - 1)

    def _held_weight(self, lam: float, S: np.ndarray, e_v: float, r) -> tuple[float, bool]:
        """(the teacher's weight of this iteration, whether this iteration releases the hold).
        The weight is the scheduled `lam`, or `teacher_hold` times the starting weight while
        the hold is in force and binds (`lam` below it) and the network's variational energy
        is above the CI energy of S by more than `teacher_gap`, from the teacher's solution of
        S (which a held weight needs anyway); without `teacher_resolve`, after the schedule
        only from the last solution, while S is the space it solved (no new eigensolve). The
        first iteration that fails the test releases the hold for good (`_step` records it
        once the iteration is applied)."""
        if not self._holding or r.space_pairs is None or not len(S) or not math.isfinite(e_v):
            return lam, False
        held = self.teacher_hold * self.teacher_on
        if lam >= held:
            return lam, False  # the schedule is not below the hold: nothing to decide yet
        if lam > 0 or self.teacher_resolve:
            e_ci = self._teacher_solution(S, r)[0]
        else:
            e_ci = self._kept_ci_energy(S)
        if e_ci is not None and e_v - e_ci > self.teacher_gap:
            return held, False
        return lam, True

    def _inner_count(self, lam: float, S: np.ndarray, e_v: float, r) -> tuple[int, float]:
        """(inner steps of this iteration, the CI energy of S if at hand else NaN): the
        teacher's `teacher_inner_steps` while its weight is above 0, and after it while the
        last teacher solution belongs to this very S (no new eigensolve; a run resumed from a
        checkpoint solves once) and the network's variational energy trails that CI energy by
        more than `teacher_gap`; else `inner_steps`."""
        if not self.teacher_on:
            return self.inner_steps, np.nan
        if r.space_pairs is None or not len(S):
            return 0, np.nan
        if lam > 0:
            return self.teacher_inner_count, np.nan
        if self.teacher_hold == 0 and self._teacher_last is None and self.teacher_gap is not None:
            self._teacher_solution(S, r)
        e_ci = self._kept_ci_energy(S)
        if e_ci is None:
            return self.inner_steps, np.nan
        # with a hold, the hold decided: its end is the end of the inner steps
        gap = self.teacher_gap
        trailing = self.teacher_hold == 0 and gap is not None and e_v - e_ci > gap
        return (self.teacher_inner_count if trailing else self.inner_steps), e_ci

    def _kept_ci_energy(self, S: np.ndarray) -> float | None:
        """The CI energy of the teacher's last solution if it was for this very S (same
        configurations, same order), else None: no new eigensolve."""
        last = self._teacher_last
        return last[1] if last is not None and np.array_equal(last[0], S) else None

    # ------------------------------------------------------------------------------ results
    @property
    def space_cap(self) -> int | None:
        """The cap on |S| in force: `max_space` with "auto" resolved (None: no cap)."""
        if self.max_space == "auto":
            return DEFAULT_MAX_SPACE if self.growth_rule == "count" else None
        return self.max_space

    @property
    def distributed(self) -> bool:
        """True on more than one rank."""
        return self.comm.size > 1

    @property
    def graphs_active(self) -> bool:
        """Whether the optimiser stage runs as a CUDA graph (the `graphs` option resolved;
        a single iteration still runs eagerly when |S| exceeds `graph_space`)."""
        return self._graphs_reason() is None

    def _graphs_reason(self, fresh: bool = True) -> str | None:
        """Why the graphed optimiser stage is off (None: it is on). ``fresh=False`` takes the
        ansatz/optimiser check of the last call (made at this iteration's start); a fresh
        call checks again only when `cuscikit.nnqs.graphs.pair_signature` changed (the full
        check walks every parameter: 0.3 ms of an N2 iteration on an H100's host)."""
        if self.graphs is False:
            return "graphs=False"
        if self._graphs_off is not None:
            return self._graphs_off
        if self.device.type != "cuda":
            why = f"the runner is on {self.device.type}, CUDA graphs need a CUDA device"
        elif self.distributed:
            why = "several ranks (the gradients are summed between the passes)"
        else:
            from cuscikit.nnqs.graphs import pair_signature, unsupported_reason

            kept = getattr(self, "_unsupported", None)  # (signature, verdict)
            if kept is None or fresh:
                sig = pair_signature(self.ansatz, self.optimizer)
                if kept is None or sig != kept[0]:
                    why = unsupported_reason(self.ansatz, self.optimizer)
                    kept = self._unsupported = (sig, why)
            why = kept[1]
        if why is not None and self.graphs is True:
            raise ValueError(f"graphs=True, but {why}")
        if why is None and self.graphs == "auto" and self.compile_inference:
            why = "compile_inference (graphs='auto' leaves compiled runs eager)"
        return why

    def _set_graph_inference(self) -> None:
        """With graphs on: the pipeline's ln psi without autograd graph, through recorded
        forward passes (the compiled pass instead with `compile_inference`), and the
        optimiser stage graphed."""
        active = self._graphs_reason() is None
        p = self._pipeline
        p.keep_graph = not active
        if not active or self.compile_inference or self.device.type != "cuda":
            p.inference_graph = None
        elif p.inference_graph is None:
            from cuscikit.nnqs.graphs import InferenceGraph

            p.inference_graph = InferenceGraph(self.ansatz)

    def _graphed_stage(self, S, w, de, r, n_inner, teach=None) -> tuple[float, bool] | None:
        """The optimiser stage as a CUDA graph: (loss, weights finite), or None when this
        iteration takes the eager stage (graphs off, |S| above `graph_space`, a non-finite
        local energy in an inner step: then nothing was applied)."""
        if self._graphs_reason(fresh=False) is not None or not (
            0 < len(S) <= self._graph_space_limit(S, r)
        ):
            return None
        if n_inner and r.space_pairs is None:
            return None
        from cuscikit.nnqs import graphs
        from cuscikit.nnqs.graphs import OptimizerGraph

        try:
            stage = self._graph_stage
            if stage is None or stage.shared_prefixes != self.shared_prefix_training:
                stage = self._graph_stage = OptimizerGraph(
                    self.ansatz, self.optimizer, shared_prefixes=self.shared_prefix_training
                )
            infer = self._pipeline.inference_graph
            stage.after_replay = infer.prefetch if infer is not None and graphs.PREFETCH else None
            loss, inner_ok, finite = stage.run(
                S, w, de, r.hdiag, r.space_pairs, n_inner, teacher=teach
            )
        except torch.OutOfMemoryError:
            if len(S) <= self.batch_size or self.graph_space != "auto":
                raise
            # the memory estimate was short: nothing was applied yet (recording comes before
            # the replay); this size and larger ones take the eager stage from now on
            from cuscikit.nnqs.graphs import bucket

            self._graph_stage = None
            torch.cuda.empty_cache()
            self._graph_oom = bucket(len(S))
            new_logger(self).note(
                "the recorded optimiser stage ran out of GPU memory at |S| = %d; the eager "
                "stage runs from this size on",
                len(S),
            )
            return None
        except (RuntimeError, ValueError) as exc:  # e.g. an operation CUDA cannot capture
            if self.graphs is True:
                raise
            import warnings

            self._graphs_off = f"the graphed stage failed ({exc})"
            self._set_graph_inference()
            warnings.warn(
                f"{self._graphs_off}; the eager optimiser stage runs instead", stacklevel=3
            )
            return None
        if math.isfinite(loss) and not inner_ok:
            return None  # undone; the eager stage stops the inner steps where it must
        return loss, finite

    def _graph_space_limit(self, S, r) -> int:
        """The largest |S| the recorded stage takes now (the `graph_space` option resolved):
        with "auto", `batch_size`, or |S| itself while twice the bytes of its autograd graph
        (per configuration, measured once on the first such S) and the H_SS pairs fit in
        half the memory free on the GPU (free to the driver plus cached by torch), or while
        the stage recorded last is at least this large (its memory is held already)."""
        n = len(S)
        if self.graph_space != "auto":
            return int(self.graph_space)
        if n <= self.batch_size:
            return self.batch_size
        from cuscikit.nnqs.graphs import bucket, saved_bytes_per_row

        if self._graph_oom is not None and bucket(n) >= self._graph_oom:
            return self.batch_size
        held = self._graph_stage._key if self._graph_stage is not None else None
        if held is not None and bucket(n) <= held[0]:
            return n  # a recording this size already holds its memory
        if self._graph_row_bytes is None:
            tok = self.ansatz.tokens(S[: min(n, 256)])
            self._graph_row_bytes = saved_bytes_per_row(self.ansatz._log_psi_tokens, tok)
        pairs = 0 if r.space_pairs is None else len(r.space_pairs[0])
        need = 2 * self._graph_row_bytes * bucket(n) + 32 * bucket(pairs)
        dev = self.device
        free, _ = torch.cuda.mem_get_info(dev)
        free += torch.cuda.memory_reserved(dev) - torch.cuda.memory_allocated(dev)
        return n if need <= free / 2 else self.batch_size

    @property
    def active_pipeline(self) -> str:
        """The pipeline in use: "gpu" or "baseline" ("auto" resolved)."""
        return self._kind

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
    def _allreduce(self, values) -> np.ndarray:
        """Sums over the ranks (identity on one rank)."""
        values = np.asarray(values, dtype=np.float64)
        return self.comm.allreduce(values, op="sum") if self.distributed else values

    def _inner(
        self,
        S: np.ndarray,
        hdiag,
        pairs,
        share: tuple[int, int] | None = None,
        teach=None,
        n_inner: int | None = None,
    ) -> None:
        """`inner_steps` (or `n_inner`) more AdamW steps on the Rayleigh quotient of psi
        restricted to S (the variational estimator's loss), with H_SS from this iteration's
        coupled pairs inside S.
        Each costs a forward and backward pass over S and a sparse product, no inference over
        U: cheap next to an iteration where U is much larger than S.

        On P ranks, `pairs` and `hdiag` are the rows of this rank's sources S[lo:hi] (`share`):
        every rank evaluates psi over its rows and gathers it over the replicated S, then its
        rows' local energies and the gradient of its rows; the energy and the gradients are
        summed over the ranks, so the step equals the single-rank one to rounding. `teach`: (weight,
        teacher vector on all of S) adds the teacher's pull to every inner step (each rank its
        rows')."""
        dev, n, bs = self.device, len(S), self.batch_size
        lo, hi = share if share is not None else (0, n)

        def on_device(a):
            return (a if isinstance(a, torch.Tensor) else torch.as_tensor(np.asarray(a))).to(dev)

        src, dst, val = (on_device(a) for a in pairs)
        src, val = src - lo, val.to(torch.complex128)
        hd = on_device(hdiag).to(torch.float64)
        mini = self._mini_batch(n)
        # each rank draws from its own rows, in proportion to their number
        m_own = max(1, math.ceil(self.inner_batch * (hi - lo) / n)) if mini else 0

        def no_grad_log_psi(a: int, b: int) -> list[torch.Tensor]:
            # the pipeline's pass without gradient: the fused kernel where it runs (a
            # float32 ansatz on a GPU, within its tolerance of the module), else the module
            with torch.no_grad():
                return [
                    torch.as_tensor(self._pipeline.values(S[c : min(c + bs, b)])).to(dev)
                    for c in range(a, b, bs)
                ]

        for _ in range(self.inner_steps if n_inner is None else n_inner):
            self.optimizer.zero_grad(set_to_none=True)
            # this rank's rows keep their graph when they fit in one batch (else the loss
            # recomputes them batch by batch); every rank evaluates its own rows only, and
            # the other ranks' values arrive by one gather
            own = self._log_psi_grad(S[lo:hi]) if 0 < hi - lo <= bs and not mini else None
            parts = [own.detach()] if own is not None else no_grad_log_psi(lo, hi)
            lpd = torch.cat(
                [p.to(torch.complex128) for p in parts]
                or [torch.zeros(0, dtype=torch.complex128, device=dev)]
            )
            lpd = self._all_rows(lpd)
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
            rows_of = S[lo:hi]
            if teach is None:
                a, b = w, eloc - e
            else:
                from cuscikit.nnqs.teacher import teacher_coefficients

                pull = teacher_coefficients(psi, teach[1])
                a, b = _with_teacher(w, eloc - e, pull, teach[0], (lo, hi))
            if mini:  # the gradient from a draw of rows, unbiased (a and b are on dev)
                rows, factor = systematic_draw(a * b, m_own, float(self.rng.random()))
                self._backward_loss(rows_of[rows.cpu().numpy()], None, a[rows] * factor, b[rows])
            else:
                self._backward_loss(rows_of, own, a, b)
            if self.distributed:
                from cuscikit.nnqs.distributed import allreduce_gradients

                allreduce_gradients(self.ansatz.parameters(), self.comm)
            self.optimizer.step()

    def _all_rows(self, x):
        """This rank's rows of S as all of S on every rank (`all_rows`; `x` on one rank)."""
        from cuscikit.nnqs.distributed import all_rows

        return all_rows(x, self.comm)

    def _mini_batch(self, n: int) -> bool:
        """Whether the inner steps over a space of n configurations draw their gradient from
        a mini-batch (`inner_batch`)."""
        return self.inner_batch is not None and n > self.inner_batch

    def _teacher_solution(self, S: np.ndarray, r) -> tuple[float, np.ndarray]:
        """The teacher's (energy, vector) in S: H_SS depends on S alone, so an iteration whose
        S equals (same configurations, same order) the last solved one reuses that solution
        instead of diagonalising again (once S has stopped growing, every iteration)."""
        from cuscikit.nnqs.teacher import space_ground_state

        if self._kept_ci_energy(S) is not None:
            return self._teacher_last[1], self._teacher_last[2]
        guess = self._teacher_guess(S, r)  # over all of S; each rank keeps its rows of H_SS
        e_t, c = space_ground_state(r.hdiag, r.space_pairs, guess=guess, comm=self.comm)
        self._teacher_last = (np.array(S, copy=True), e_t, c)
        return e_t, c

    def _teacher_vector(self, c: np.ndarray, device) -> torch.Tensor:
        """The teacher's vector `c` (a solution of `_teacher_solution`) as a float64 tensor on
        `device`, copied there once per solution (an unchanged S reuses its solution)."""
        held = self._teacher_on_device
        if held is None or held[0] is not c or held[1].device != torch.device(device):
            held = self._teacher_on_device = (
                c,
                torch.as_tensor(c, dtype=torch.float64, device=device),
            )
        return held[1]

    def _teacher_guess(self, S: np.ndarray, r):
        """The eigensolve's start on S: the last solution on the rows S shares with the space
        it solved, the network's psi (scaled to the same norm on those rows) on the others;
        the network's psi alone before the first solve. Once S changes by a few
        configurations an iteration, the last solution is most of the answer."""
        last, psi_s = self._teacher_last, self._all_rows(r.psi_s)
        if last is None:
            return psi_s
        from cuscikit.backends.keys import KeyIndex
        from cuscikit.nnqs.teacher import aligned_real

        rows = KeyIndex(last[0]).find(S)
        shared = rows >= 0
        if not shared.any():
            return psi_s
        psi = aligned_real(psi_s)  # the network's phase, aligned as the solver reads it
        guess = np.where(shared, 0.0, psi)
        norm_psi = np.linalg.norm(psi[shared])
        if norm_psi > 0:
            guess *= np.linalg.norm(last[2][rows[shared]]) / norm_psi
        guess[shared] = last[2][rows[shared]]
        return guess

    def _log_psi_grad(self, configs) -> torch.Tensor:
        """ln psi of `configs` for a gradient: over their prefix tree with
        `shared_prefix_training`."""
        if not self.shared_prefix_training:
            return self.ansatz.log_psi(configs)
        from cuscikit.nnqs.ansatz import prefix_tree

        tok = self.ansatz.tokens(configs)
        return self.ansatz._log_psi_tokens(tok, prefix_tree(tok))

    def _backward_loss(self, configs: np.ndarray, lp_graph, w, de) -> float:
        """Accumulate the gradient of L = 2 Re sum_x w(x) conj(ln psi(x)) de(x) (w and de
        detached) over `configs`, batch by batch unless `lp_graph` holds ln psi of all of them
        with its graph; returns L."""
        loss = 0.0
        for lo in range(0, len(configs), self.batch_size):
            hi = min(lo + self.batch_size, len(configs))
            lp = lp_graph if lp_graph is not None else self._log_psi_grad(configs[lo:hi])
            lp = lp.to(torch.complex128)
            dev = lp.device
            part = 2.0 * (w[lo:hi].to(dev) * (lp.conj() * de[lo:hi].to(dev))).real.sum()
            part.backward()
            loss += float(part.detach())
        return loss

    def _check_loss(self, loss_val: float, e_c: float, e_v: float) -> None:
        if not (math.isfinite(loss_val) and math.isfinite(e_c) and math.isfinite(e_v)):
            self.optimizer.zero_grad(set_to_none=True)
            raise NonFiniteLossError(
                f"iteration {self.iteration + 1}: non-finite loss {loss_val} or energies "
                f"({e_c}, {e_v}); the step was not applied"
            )

    def _nonfinite_weights(self) -> None:
        raise NonFiniteLossError(
            f"iteration {self.iteration + 1}: the optimiser step made the weights "
            "non-finite; the last good weights and optimiser state were kept"
        )

    def _snapshot(self) -> tuple[dict, dict]:
        """Copies of the weights and of the optimiser state (a step can be undone)."""
        import copy

        model = {k: v.detach().clone() for k, v in self.ansatz.state_dict().items()}
        return model, copy.deepcopy(self.optimizer.state_dict())

    def _restore(self, snapshot: tuple[dict, dict]) -> None:
        model, opt = snapshot
        self.ansatz.load_state_dict(model)
        self.optimizer.load_state_dict(opt)

    def _finite_weights(self) -> bool:
        return all(bool(torch.isfinite(p).all()) for p in self.ansatz.parameters())

    def step(self) -> dict:
        """One NNQS-SCI iteration. Returns its history row (also appended to `history`).

        ``peak_memory_bytes`` is this iteration's peak: on a GPU PyTorch's allocator peak
        (reset first), on the CPU the process's resident size sampled during the iteration
        (`cuscikit.backends.memory.HostPeak`), not its lifetime peak."""
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            row = self._step()
            row["peak_memory_bytes"] = int(torch.cuda.max_memory_allocated(self.device))
            return row
        with HostPeak() as hp:
            row = self._step()
        row["peak_memory_bytes"] = hp.peak
        return row

    def _step(self) -> dict:
        self._sync_options()
        t = {s: 0.0 for s in STAGES}
        t_start = time.perf_counter()
        S = self.space.configs
        n = len(S)
        r = self._pipeline.run(S, self.topk)
        t.update(r.times)
        lo, hi = r.share

        # Weights over S and both energies, summed over the ranks' sources.
        t0 = time.perf_counter()
        psi_s, eloc_c, eloc_v = (
            torch.as_tensor(x) for x in (r.psi_s, r.eloc_coupled, r.eloc_variational)
        )
        prob = psi_s.abs() ** 2
        (z,) = self._allreduce([float(prob.sum())])
        w = prob / z
        e_c, e_v = self._allreduce([float((w * eloc_c).real.sum()), float((w * eloc_v).real.sum())])
        e_c, e_v = float(e_c), float(e_v)
        eloc = eloc_c if self.estimator == "coupled" else eloc_v
        e_est = e_c if self.estimator == "coupled" else e_v
        e_pt2 = np.nan
        if r.pt2_numerators is not None:  # sum over the owners' a outside S, then / z
            part = (r.pt2_numerators / (e_v - r.pt2_diagonal)).sum()
            (e_pt2,) = self._allreduce([float(part)])
            e_pt2 = float(e_pt2) / z
        t["energy"] += time.perf_counter() - t0

        # The selected-CI teacher (on while its weight is above 0): the lowest eigenvector of
        # H_SS, and its pull on this iteration's psi.
        t0 = time.perf_counter()
        lam, release = self._held_weight(self.teacher_weight(self.iteration + 1), S, e_v, r)
        teach, extra = None, {}
        n_inner, e_kept = self._inner_count(lam, S, e_v, r)
        if self.teacher_on:
            extra = {"teacher_weight": lam, "e_teacher": e_kept, "teacher_loss": np.nan}
            extra["inner_steps"] = n_inner
            if self.teacher_hold > 0:
                extra["teacher_released"] = self._teacher_released or release
        pull = teacher_loss = None  # the teacher's coefficients over all of S, and its loss
        if lam > 0 and r.space_pairs is not None and n > 0:
            from cuscikit.nnqs.graphs import read_later
            from cuscikit.nnqs.teacher import pull_and_loss

            e_t, c = self._teacher_solution(S, r)
            teach = (lam, self._teacher_vector(c, psi_s.device))
            # psi gathered from the ranks; the loss is read after the optimiser stage, from a
            # copy made now (a read then would wait for the work queued after the stage)
            pull, teacher_loss = pull_and_loss(self._all_rows(psi_s), teach[1])
            teacher_loss = read_later(teacher_loss)
            extra["e_teacher"] = e_t
        t["energy"] += time.perf_counter() - t0

        # Loss with detached E_loc and E, backward, AdamW.
        t0 = time.perf_counter()
        self.optimizer.zero_grad(set_to_none=True)
        eloc_t = (eloc - e_est).to(torch.complex128)
        graphed = None
        if math.isfinite(e_c) and math.isfinite(e_v) and not (n_inner and self._mini_batch(n)):
            if teach is None:
                graphed = self._graphed_stage(S, w, eloc_t, r, n_inner)
            else:  # the iteration's step with the teacher's pull, unit weights
                w1, coef = _with_teacher(w, eloc_t, pull, lam, (lo, hi))
                graphed = self._graphed_stage(S, w1, coef, r, n_inner, teach)
        if graphed is not None:  # applied (or undone when the loss or the weights are bad)
            loss_val, finite = graphed
            self._check_loss(loss_val, e_c, e_v)
            if not finite:
                self._nonfinite_weights()
        else:
            lp_graph = r.lp_graph if r.lp_graph is not None and r.lp_graph.requires_grad else None
            if teach is None:
                loss_val = self._backward_loss(S[lo:hi], lp_graph, w, eloc_t)
            else:  # this rank's rows, the teacher's pull from psi on all of S
                pulled = _with_teacher(w, eloc_t, pull, lam, (lo, hi))
                loss_val = self._backward_loss(S[lo:hi], lp_graph, *pulled)
            if self.distributed:  # one gradient for every replica; the loss travels along
                from cuscikit.nnqs.distributed import allreduce_gradients

                (loss_val,) = allreduce_gradients(self.ansatz.parameters(), self.comm, [loss_val])
                loss_val = float(loss_val)
            self._check_loss(loss_val, e_c, e_v)
            before = self._snapshot()
            self.optimizer.step()
            if n_inner:
                self._inner(S, r.hdiag, r.space_pairs, r.share, teach, n_inner)
            if not self._finite_weights():  # e.g. an infinite rate: keep the last good state
                self._restore(before)
                self._nonfinite_weights()
        if teacher_loss is not None:
            extra["teacher_loss"] = teacher_loss()
        t["optimizer"] = time.perf_counter() - t0

        # Growth: S <- S + top-K new configurations (capped, dropping the smallest |psi|), or
        # the weight-driven rule.
        t0 = time.perf_counter()
        if self.growth_rule == "count":
            n_new, weight_dropped, grown = self._grow_by_count(r)
        else:
            n_new, weight_dropped, grown = self._grow_by_weight(r, e_v, z, n)
        self.iteration += 1
        self._teacher_released = self._teacher_released or release
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
            "e_pt2": e_pt2,
            "e_tot_pt2": e_v + e_pt2,
            "error_pt2": (e_v + e_pt2 - self.reference) if self.reference is not None else np.nan,
            "loss": loss_val,
            "n_space": n,
            "n_coupled": r.n_coupled,
            "n_unique": r.n_unique,
            "n_new": n_new,
            "n_space_next": len(self.space),
            "weight_dropped": weight_dropped,
        }
        row.update(grown)
        row.update(extra)
        row.update({f"t_{s}": t[s] for s in STAGES})
        row["t_total"] = total
        row["peak_memory_bytes"] = 0  # set by `step` once the iteration's peak is known
        row["peak_theoretical_bytes"] = r.peak_theoretical
        row["bytes_staged"] = r.bytes_staged
        row["n_batches"] = r.n_batches
        row.update(self._load_columns(r))
        self._rows.append(row)
        return row

    def _grow_by_count(self, r) -> tuple[int, float, dict]:
        """growth="count": S <- S + top-K by |psi|, then the cap (and `prune_weight`) over S
        and the new ones. Returns (configurations added, share dropped, history columns)."""
        n_new = self.space.add(r.new_configs) if len(r.new_configs) else 0
        keep, weight_dropped = _kept(r.keep_rows, r.keep_scores, self.space_cap, self.prune_weight)
        if keep is not None:
            self.space = SCISpace(self.molecule, r.keep_configs[keep], eps=self.eps)
        return n_new, weight_dropped, {}

    def _grow_by_weight(self, r, e_v: float, z: float, n: int) -> tuple[int, float, dict]:
        """growth="weight": prune S by |psi|^2 share, add the top-K new configurations by
        first-order weight (at least `add_weight`), and keep the longest prefix that fits the
        memory budget. Returns (configurations added, share of S dropped, history columns)."""
        eng = self._pipeline.engine
        prune = self.prune_weight if self.prune_weight is not None else DEFAULT_WEIGHT_PRUNE
        add = DEFAULT_WEIGHT_ADD if self.add_weight is None else self.add_weight
        # S ranked by |psi| (ties by row), and the tail of weight at most `prune` dropped
        scores, rows = r.keep_scores[:n], r.keep_rows[:n]
        order = np.lexsort((rows, -scores))
        share = np.exp(2.0 * (scores[order] - scores[order[0]]))
        share /= share.sum()
        tail = np.cumsum(share[::-1])[::-1]
        k_s = n if prune is None else max(1, int(np.count_nonzero(tail > prune)))
        # the new configurations: first-order weights on their owners, top-K over the ranks
        weight_outside, new = self._first_order_top(r, e_v, z, add)
        cand = np.concatenate([r.keep_configs[:n][order[:k_s]], new])
        # the hard limit: the longest prefix whose next iteration fits the budget
        counts = np.asarray(_host_array(eng.coupled_counts(eng.keys(cand))), dtype=np.int64)
        from cuscikit.nnqs.pipeline import space_bytes

        words = cand.shape[1]
        need = space_bytes(np.arange(1, len(cand) + 1), np.cumsum(counts), words)
        budget = (
            int(self.space_memory)
            if self.space_memory is not None
            else int(self._pipeline.budget.available())
        )
        if self.distributed:  # one decision on every rank: the tightest rank's budget
            budget = -int(self.comm.allreduce(np.array([-budget], np.int64), op="max")[0])
        m = max(1, int(np.searchsorted(need, budget, side="right")))
        m = min(m, len(cand))
        if self.space_cap is not None:
            m = min(m, int(self.space_cap))
        k_s = min(k_s, m)
        dropped = float(tail[k_s]) if k_s < n else 0.0
        self.space = SCISpace(self.molecule, cand[:m], eps=self.eps)
        planned = space_bytes(m, int(counts[:m].sum()), words)
        return (
            m - k_s,
            dropped,
            {"weight_outside": weight_outside, "bytes_planned": planned, "bytes_budget": budget},
        )

    def _first_order_top(self, r, e_v: float, z: float, add: float) -> tuple[float, np.ndarray]:
        """(sum of |c_a|^2 over every a outside S, the top-K a with |c_a|^2 >= add, best
        first; ties by key), from this iteration's PT2 terms, the same on every rank."""
        num, diag, keys = r.pt2_numerators, r.pt2_diagonal, r.pt2_keys
        words = self.space.configs.shape[1]
        q = num / ((e_v - diag) ** 2 * z)
        total = float(q.sum()) if len(q) else 0.0
        k = self.topk
        if len(q) > k:  # this rank's top-K, ties at the K-th value included
            kth = torch.topk(q, k).values[-1] if torch.is_tensor(q) else np.partition(q, -k)[-k]
            mask = q >= max(float(kth), add)
        else:
            mask = q >= add
        idx = torch.nonzero(mask).squeeze(1) if torch.is_tensor(q) else np.flatnonzero(mask)
        q_sel = _host_array(q[idx]).astype(np.float64)
        k_sel = np.asarray(self._pipeline.engine.to_host(keys[idx]), np.uint64).reshape(-1, words)
        if self.distributed:
            (total,) = self._allreduce([total])
            total = float(total)
            packed = np.concatenate([q_sel.view(np.uint64)[:, None], k_sel], axis=1)
            packed = np.concatenate(self.comm.allgather(packed))
            q_sel, k_sel = packed[:, 0].view(np.float64), packed[:, 1:]
        order = np.lexsort((*[k_sel[:, w] for w in range(words)], -q_sel))[:k]
        return total, k_sel[order]

    def _load_columns(self, r) -> dict:
        """History columns of the loads, on one rank or several (the same on every rank): the
        extremes over ranks, each rank's own counts (``sources_r<k>``, ``coupled_r<k>``,
        ``unique_r<k>``, ``received_r<k>``: rows the de-dup exchange delivered to rank k,
        ``t_busy_r<k>``: its seconds in the stages) and, on several ranks, the de-dup metrics."""
        table = np.stack(self.comm.allgather(np.asarray(r.loads, dtype=np.float64)))
        sources, coupled, unique = (table[:, k].astype(np.int64) for k in range(3))
        received = np.asarray(r.dedup.received, dtype=np.int64)
        row = {
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
        }
        for k in range(self.comm.size):
            row[f"sources_r{k}"] = int(sources[k])
            row[f"coupled_r{k}"] = int(coupled[k])
            row[f"unique_r{k}"] = int(unique[k])
            row[f"received_r{k}"] = int(received[k])
            row[f"t_busy_r{k}"] = float(table[k, 3])
        if self.distributed:
            row.update({f"dedup_{k}": v for k, v in r.dedup.as_dict().items() if k != "method"})
        return row

    # ------------------------------------------------------------------------------ running
    def kernel(
        self,
        n_iter: int = DEFAULT_ITERATIONS,
        callbacks: Iterable[Callback] = (),
        *,
        progress: bool = True,
        checkpoint: str | None = None,
        checkpoint_every: int = 10,
    ) -> float:
        """Run `n_iter` iterations (fewer if a callback, Ctrl-C or a non-finite loss stops it)
        and return the last energy of the chosen estimator (also `e_tot`; the way the run
        ended is in `status`).

        A non-finite loss stops the run cleanly; the model keeps its last good weights and the
        checkpoint file (if any) its last good state. Ctrl-C (a notebook's interrupt) or
        SIGTERM stops after the current iteration, with a consistent runner and checkpoint. On
        several ranks every rank calls `kernel`; rank 0 shows the progress bar and messages and
        writes the checkpoint, and a stop on any rank stops all of them.
        """
        self._sync_options()
        lock = None
        if checkpoint is not None and self.rank == 0:
            from cuscikit.nnqs.checkpoint import (
                CheckpointLock,
                check_writable,
                remove_stale_temporaries,
            )

            check_writable(checkpoint)
            lock = CheckpointLock(checkpoint).acquire()  # one writer per file
            remove_stale_temporaries(checkpoint)  # left by a killed run
        log = new_logger(self)

        def postfix(row: dict) -> dict:
            post = {"E": f"{row['e_tot']:.8f}", "|S|": row["n_space_next"]}
            if self.reference is not None:
                post["err"] = f"{row['error']:.2e}"
            return post

        loop = RunLoop(
            self,
            callbacks,
            progress=progress and self.verbose > 0,
            desc="NNQS-SCI",
            postfix=postfix,
            checkpoint=(lambda: self._save_good(checkpoint, log)) if checkpoint else None,
            checkpoint_every=checkpoint_every,
            stop_on=(NonFiniteLossError,),
            rank=self.rank,
            agree=(lambda flag: bool(self.comm.allreduce(int(flag), op="max")))
            if self.distributed
            else None,
            announce=lambda msg: log.note("NNQS-SCI: %s", msg) if self.rank == 0 else None,
        )
        try:
            self.status = loop.run(n_iter)
        finally:
            if lock is not None:
                lock.release()
        if self.status.status != "ok" and self.rank == 0:
            log.note("NNQS-SCI stopped after iteration %d: %s", self.iteration, self.status.reason)
        return self.e_tot if self._rows else float("nan")

    def _save_good(self, path: str, log) -> None:
        """`save` during a run: a state that is not finite (weights made non-finite outside
        a step) leaves the checkpoint as it was and stops nothing more than the save; the bad
        state goes beside it (``*.nonfinite.h5``) and the run reports it."""
        from cuscikit.nnqs.checkpoint import NonFiniteStateError

        try:
            self.save(path)
        except NonFiniteStateError as exc:
            if self.rank == 0:
                log.warn("NNQS-SCI: %s", exc)

    def run(self, *args, **kwargs) -> Runner:
        """`kernel` with the same arguments; returns the runner (``runner.run(100).history``)."""
        self.kernel(*args, **kwargs)
        return self

    def dump_flags(self, verbose: int | None = None) -> Runner:
        """Log the options and the setup (molecule, device, pipeline, ranks)."""
        super().dump_flags(verbose)
        log = new_logger(self, verbose=verbose)
        log.info(
            "molecule = %s, |S| = %d, device = %s, pipeline = %s, ranks = %d",
            getattr(self.molecule, "name", "?"),
            len(self.space),
            self.device,
            self._kind,
            self.comm.size,
        )
        return self

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


def _host_array(a) -> np.ndarray:
    return a.detach().to("cpu").numpy() if torch.is_tensor(a) else np.asarray(a)


def _kept(rows, scores, max_space, prune_weight):
    """Which configurations of S + new stay: ``(indices or None, dropped weight share)``.

    Ordered by decreasing ln|psi| (`scores`), ties by global row. Pruning drops the longest tail
    whose share of sum |psi|^2 is at most `prune_weight`; the cap keeps the first `max_space`.
    None: all stay (S is left as grown)."""
    n = len(scores)
    limit = n if max_space is None else min(n, int(max_space))
    if prune_weight is None and limit == n:
        return None, 0.0
    order = np.lexsort((rows, -scores))
    w = np.exp(2.0 * (scores[order] - scores[order[0]])) if n else np.zeros(0)
    share = w / w.sum() if n else w
    tail = np.cumsum(share[::-1])[::-1]  # tail[i]: share of order[i:]
    k = limit
    if prune_weight is not None:
        k = min(k, max(1, int(np.count_nonzero(tail > prune_weight))))
    if k == n:
        return None, 0.0
    return order[:k], float(tail[k])
