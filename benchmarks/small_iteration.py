"""Seconds per NNQS-SCI iteration of a small system on one GPU: the eager optimiser stage
against the CUDA-graph one (`Runner(graphs=...)`), same seed, in one process.

Defaults are the command line's (topk, inner steps, |S| cap, rate with its tail decay, float32
ansatz); the table gives the median seconds per stage over iterations --from..--iterations and
the largest difference of the energies from the first variant's run, and the first iteration
where it exceeds 1e-10. The optimisation amplifies any rounding difference: on N2 in float64 two
eager runs of the same process (``--variants eager eager``) differ by 1e-14 at iteration 20,
by more than 1e-10 from iteration 43 and by 1e-3 at iteration 100, so compare paths over the
first few dozen iterations, and against the eager path's own spread after that.

    python benchmarks/small_iteration.py [--systems N2 Hubbard-10-chain-U4] [--iterations 200]
        [--from 20] [--float64] [--options '{"growth": "weight"}']
        [--variants eager graph graph-teacher0 graph-torch-ops ...] [--profile]
        [--profile-compile]
        [--attn-warps {1,2,4,8}]
    python benchmarks/small_iteration.py --kernels [--kernel-rows 1920] [--float64]
    python benchmarks/small_iteration.py --kernels-attention [--kernel-rows 1920] [--float64]

A variant named twice runs twice (``--variants eager eager``: is the path reproducible?).
``--history-out DIR`` writes each variant's energies, |S| and stage times per iteration;
``--reference DIR`` compares each variant
with the same variant's energies in DIR (another process, e.g. another version of the package).
``--trace-out DIR`` (with --profile) writes the profiled iteration and the profiled stage replay
as gzipped Chrome traces (per-stream kernel timelines, for Perfetto).
``graph-torch-ops`` and ``eager-torch-ops`` run with torch's kernels in the training pass instead
of the Triton ones of `cuscikit.nnqs.fused_ops` (``fused_ops.ENABLED = False``): before/after
in one process (``--variants graph-torch-ops graph``); ``graph-block`` and ``eager-block`` run
each transformer block of the pass as one kernel each way (``fused_ops.BLOCK_ENABLED``),
``graph-amplitude`` and ``eager-amplitude`` the whole ln|psi| (``fused_ops.AMPLITUDE_ENABLED``). A
run's "run s" includes the Triton compilation of the first use in the process (about 9 s on
the H200 for the N2 shapes).

``graph-module-tail`` runs the amplitude's tail (ln_f, the head, the masked log-softmax and
the sum over positions) with the module's kernels instead of one Triton kernel each way
(``fused_ops.TAIL_ENABLED = False``); ``graph-adamw-kernel`` runs the recorded stage's flat
AdamW step's moments and update as one Triton kernel instead of torch's eight
(``graphs.ADAMW_KERNEL = True``; off by default);
``graph-attn-tiles`` runs the attention's tile kernels (one sequence's head a program, its
positions and head padded to 16 for the products) instead of float32's row-wise ones (a
program of ``fused_ops._ATTN_ROWS[torch.float32]`` rows, a row one position of one head; float64
takes the tile kernels either way); ``graph-attn-heads-all``
(``-2``) runs the tile kernels with every head (two heads) of a sequence in one program
(``fused_ops._ATTN_HEADS``); ``graph-attn-rows-128`` runs the row-wise kernels with 128 rows and
4 warps a program.

``graph-tc-products`` runs the float32 linear layers' products (forward, input and weight
gradients) as one Triton kernel each with three TF32 products on the tensor cores
(``cuscikit.nnqs.products.ENABLED``, the package's default) for the layers the package's
``products.MAX_WIDTH`` admits, each MLP's GELUs in those kernels (``products.FUSED_MLP``;
``graph-tc-products-apart`` without); ``graph-tc-wide`` for every layer (the phase MLP's
512-wide ones included), ``graph-tc-narrow`` for those no wider than 256 (the transformer's),
``graph-torch-products`` with cuBLAS's everywhere, ``graph-tf32`` with cuBLAS's in one TF32
pass (``torch.backends.cuda.matmul.allow_tf32``; about 1e-3 relative error a product: a speed
comparison, not a path within float32's accuracy).

``graph-noprefetch`` waits for the recorded stage before the next iteration's ln psi over S is
queued (``graphs.PREFETCH = False``; by default it is queued right after the stage).

``graph-shared`` and ``eager-shared`` run the passes with gradient over S's prefix tree
(`Runner(shared_prefix_training=True)`): ``--variants graph graph-shared`` on a lattice,
whose sorted S shares long prefixes.

By default the recorded stage runs its parameter gradients on side streams beside the pass,
layer by layer in turn over ``aside.GRADIENT_STREAMS`` of them, and its phase MLP on another
(`cuscikit.nnqs.aside`, ``aside.ENABLED`` and ``aside.PHASE``); ``graph-one-stream`` (and
``graph-teacher0-one-stream``) keep everything on the pass's own stream, ``graph-aside`` only
the parameter gradients beside it, ``graph-phase`` only the phase MLP,
``graph-one-gradient-stream`` puts all parameter gradients on one side stream
(``graph-gradient-streams-2`` / ``-8`` on two / eight): before/after in one process
(``--variants graph graph-one-gradient-stream graph-one-stream``). While S stays the same
the recorded stage writes only the per-stage values into its buffers
(``OptimizerGraph.reuse_inputs``); ``graph-rewrite`` writes S's tokens, pairs and diagonal
every iteration, ``graph-rewrite-one-gradient-stream`` also keeps the gradients on one stream
(the stage as it was before both). ``graph-torch-energy`` computes the inner steps' local
energies with torch's operations instead of `cuscikit.nnqs.local_energy`'s kernels.

``graph-onebatch`` records the stage only while |S| fits one batch of 16,384 (the eager stage
above it); ``graph`` records it for any S whose autograd graph fits the GPU's free memory
(`Runner(graph_space="auto")`): before/after on a system whose S outgrows one batch (the
10-site Hubbard chain with ``--options '{"growth": "weight"}'``).

Variants ending in ``-teacher0`` run without the selected-CI teacher (``teacher=0``), so with
`inner_steps` inner steps instead of the teacher's; the table's "inner" is the median of the
iteration's inner steps.

--profile: after each run with a recorded optimiser stage, one more iteration keeps the stage's
inputs; the stage is then replayed 20 times (wall milliseconds per stage) and once under
torch.profiler: kernels per stage and per pass (forward, backward and AdamW over S), their
summed GPU time and the GPU span of the replay, the costliest kernels; and the iteration that
supplied the inputs as a whole: kernels, GPU time, host synchronisations.
With --profile-compile the same for a `torch.compile`d ln psi recorded in the stage through
`OptimizerGraph(log_psi=...)`, with the seconds its first call took (compilation, warm-up and
recording). (The phase MLP on a stream of its own is the variant ``graph-phase``.)
The replays apply their AdamW steps: the profile comes after the timed run.

--kernels: only the Triton training kernels at the model's shapes (--kernel-rows sequences,
1,920 = N2's padded |S|), microseconds per forward and backward call against torch's, the
attention with 1, 2 and 4 warps per program; prints the fastest. The calls are launched one by
one from Python, so a call's time includes its launch and autograd overhead where that exceeds
the kernel (on the H200 it does for the backward passes): a coarse choice, not kernel times.
--attn-warps sets the warps of the attention programs for the runs (default:
`cuscikit.nnqs.fused_ops._ATTN_WARPS`).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
import torch
from _common import machine, print_table, write_json

from cuscikit import Ansatz, Molecule, Runner
from cuscikit.nnqs import aside, fused_ops, graphs
from cuscikit.nnqs.graphs import OptimizerGraph
from cuscikit.nnqs.runner import STAGES, LearningRateDecay
from cuscikit.sci.configs import all_determinants

try:  # another version of the package (--reference, BASE_NNQS) may not have it
    from cuscikit.nnqs import local_energy
except ImportError:
    local_energy = None
try:
    from cuscikit.nnqs import products
except ImportError:
    products = None

VARIANTS = {  # label: Runner options; "fused_ops": the Triton training kernels on or off
    "eager": {"graphs": False},
    "graph": {"graphs": True},
    # the defaults without the selected-CI teacher (and so without its inner steps)
    "eager-teacher0": {"graphs": False, "teacher": 0},
    "graph-teacher0": {"graphs": True, "teacher": 0},
    # the pipeline without the reuse of S-only data (`Pipeline.reuse_space`; ignored where the
    # package has no such option)
    "graph-noreuse": {"graphs": True, "reuse_space": False},
    "graph-teacher0-noreuse": {"graphs": True, "teacher": 0, "reuse_space": False},
    "graph-torch-ops": {"graphs": True, "fused_ops": False},
    # without the next iteration's ln psi over S queued right after the recorded stage
    # (``graphs.PREFETCH = False``)
    "graph-noprefetch": {"graphs": True, "prefetch": False},
    "eager-torch-ops": {"graphs": False, "fused_ops": False},
    # each transformer block of the training pass as one Triton kernel each way
    # (``fused_ops.BLOCK_ENABLED``)
    "graph-block": {"graphs": True, "fused_block": True},
    "eager-block": {"graphs": False, "fused_block": True},
    # ln|psi| of the training pass as one Triton kernel each way (``fused_ops.AMPLITUDE_ENABLED``)
    "graph-amplitude": {"graphs": True, "fused_amplitude": True},
    "eager-amplitude": {"graphs": False, "fused_amplitude": True},
    # the same with their float32 products as three TF32 products on the tensor cores
    # (``fused_ops.COARSE_PRODUCTS = "tf32x3"``; programs of one sequence, 16 rows, 4 warps)
    "graph-block-tc": {"graphs": True, "fused_block": True, "coarse_products": "tf32x3"},
    "graph-amplitude-tc": {"graphs": True, "fused_amplitude": True, "coarse_products": "tf32x3"},
    "eager-compiled": {"graphs": False, "compile_inference": True},
    # the recorded stage only while S fits one batch (the eager stage above it)
    "graph-onebatch": {"graphs": True, "graph_space": 16384},
    # the transformer once per distinct prefix of S in the passes with gradient
    # (`Runner(shared_prefix_training=True)`)
    "graph-shared": {"graphs": True, "shared_prefix_training": True},
    "eager-shared": {"graphs": False, "shared_prefix_training": True},
    # the recorded stage on one stream (``aside.ENABLED = aside.PHASE = False``), with only
    # its parameter gradients on a second stream, with only its phase MLP on another
    "graph-one-stream": {"graphs": True, "aside": False, "aside_phase": False},
    "graph-teacher0-one-stream": {
        "graphs": True,
        "teacher": 0,
        "aside": False,
        "aside_phase": False,
    },
    "graph-aside": {"graphs": True, "aside": True, "aside_phase": False},
    "graph-phase": {"graphs": True, "aside": False, "aside_phase": True},
    # the parameter gradients on one side stream instead of `aside.GRADIENT_STREAMS` in turn
    "graph-one-gradient-stream": {"graphs": True, "gradient_streams": 1},
    "graph-gradient-streams-2": {"graphs": True, "gradient_streams": 2},
    "graph-gradient-streams-8": {"graphs": True, "gradient_streams": 8},
    # the inner steps' local energies by torch's operations instead of `local_energy`'s kernels
    "graph-torch-energy": {"graphs": True, "local_energy": False},
    # the amplitude's tail (ln_f, head, masked log-softmax) by the module's kernels instead of
    # one Triton kernel each way (``fused_ops.TAIL_ENABLED = False``)
    "graph-module-tail": {"graphs": True, "tail": False},
    # each residual sum and the LayerNorm after it as two kernels each way, as the blocks run
    # one by one (``fused_ops.ADD_NORM_ENABLED = False``)
    "graph-apart-norms": {"graphs": True, "add_norm": False},
    # the bias and LayerNorm gradients' sums over rows by torch's reduction instead of a
    # product with a ones vector (``aside._ONES_ROWS = 0``)
    "graph-reduce-sums": {"graphs": True, "ones_rows": 0},
    # the flat AdamW step's moments and update as one Triton kernel (``graphs.ADAMW_KERNEL``)
    "graph-adamw-kernel": {"graphs": True, "adamw_kernel": True},
    # the training pass's attention kernels with every head of a sequence in one program
    "graph-attn-heads-all": {"graphs": True, "attn_heads": 0, "attn_rows": {}},
    "graph-attn-heads-2": {"graphs": True, "attn_heads": 2, "attn_rows": {}},
    # the attention's tile kernels (one sequence's head a program) instead of the row-wise ones
    "graph-attn-tiles": {"graphs": True, "attn_rows": {}},
    "graph-attn-rows-128": {"graphs": True, "attn_rows": {torch.float32: (128, 4)}},
    # the float32 linear layers' products as three TF32 products on the tensor cores, one
    # Triton kernel a product (``products.ENABLED``), and with torch's (cuBLAS) products
    "graph-tc-products": {"graphs": True, "products": True},
    # the same with each MLP's layers and GELUs apart (``products.FUSED_MLP = False``)
    "graph-tc-products-apart": {"graphs": True, "products": True, "fused_mlp": False},
    "graph-torch-products": {"graphs": True, "products": False},
    # the tensor-core products only for layers no wider than 256 (``products.MAX_WIDTH``:
    # the transformer's), the phase MLP's 512-wide layers with cuBLAS's; and for every layer
    "graph-tc-narrow": {"graphs": True, "products": True, "max_width": 256},
    "graph-tc-wide": {"graphs": True, "products": True, "max_width": None},
    # the recorded stage captured on a stream of the highest priority, its side streams' work
    # (parameter gradients, phase MLP) at the default one (``graphs.CHAIN_PRIORITY``), and not
    "graph-priority": {"graphs": True, "chain_priority": True},
    "graph-no-priority": {"graphs": True, "chain_priority": False},
    # cuBLAS's float32 products in one TF32 pass (torch.backends.cuda.matmul.allow_tf32):
    # about 1e-3 relative error a product, not float32's accuracy; a speed comparison only
    "graph-tf32": {"graphs": True, "tf32": True},
    # the recorded stage writing S's tokens, pairs and diagonal into its buffers every
    # iteration (``OptimizerGraph.reuse_inputs = False``) and with the gradients on one stream
    "graph-rewrite": {"graphs": True, "reuse_inputs": False},
    "graph-rewrite-one-gradient-stream": {
        "graphs": True,
        "reuse_inputs": False,
        "gradient_streams": 1,
    },
}
# the package defaults, restored per variant where a package has them (another version of the
# package, --reference, may lack some)
_ASIDE_DEFAULTS = (
    aside.ENABLED,
    aside.PHASE,
    getattr(aside, "GRADIENT_STREAMS", None),
    getattr(OptimizerGraph, "reuse_inputs", None),
    getattr(local_energy, "ENABLED", None) if local_energy is not None else None,
)


_ATTN_ROWS = dict(getattr(fused_ops, "_ATTN_ROWS", {}))  # the package's default
_PRODUCTS_DEFAULT = getattr(products, "ENABLED", False)
_MAX_WIDTH = getattr(products, "MAX_WIDTH", None)
_CHAIN_PRIORITY = getattr(graphs, "CHAIN_PRIORITY", False)


def load_system(name: str):
    """A bundled molecule, or a lattice by its name (``Hubbard-<L>-<chain|ring>-U<U>``, its
    default working basis; `Molecule.load`)."""
    return Molecule.load(name)


def run(mol, options: dict, iterations: int, dtype, extra: dict | None = None):
    options = {**(extra or {}), **options}
    fused_ops.ENABLED = options.pop("fused_ops", True)
    fused_ops.BLOCK_ENABLED = options.pop("fused_block", False)
    fused_ops.AMPLITUDE_ENABLED = options.pop("fused_amplitude", False)
    fused_ops.COARSE_PRODUCTS = options.pop("coarse_products", "ieee")
    tail = options.pop("tail", True)
    if hasattr(fused_ops, "TAIL_ENABLED"):  # a package with the fused tail
        fused_ops.TAIL_ENABLED = tail
    add_norm = options.pop("add_norm", True)
    if hasattr(fused_ops, "ADD_NORM_ENABLED"):  # a package with the residual sums in the norms
        fused_ops.ADD_NORM_ENABLED = add_norm
    ones_rows = options.pop("ones_rows", 1 << 20)
    if hasattr(aside, "_ONES_ROWS"):  # a package with the sums as products
        aside._ONES_ROWS = ones_rows
    attn_heads = options.pop("attn_heads", 1)
    if hasattr(fused_ops, "_ATTN_HEADS"):  # a package with the option
        fused_ops._ATTN_HEADS = attn_heads
    attn_rows = options.pop("attn_rows", _ATTN_ROWS)
    if hasattr(fused_ops, "_ATTN_ROWS"):  # a package with the row-wise attention kernels
        fused_ops._ATTN_ROWS = attn_rows
    adamw_kernel = options.pop("adamw_kernel", False)
    if hasattr(graphs, "ADAMW_KERNEL"):  # a package with the AdamW kernel
        graphs.ADAMW_KERNEL = adamw_kernel
    aside.ENABLED = options.pop("aside", _ASIDE_DEFAULTS[0])
    aside.PHASE = options.pop("aside_phase", _ASIDE_DEFAULTS[1])
    streams = options.pop("gradient_streams", _ASIDE_DEFAULTS[2])
    if streams is not None:
        aside.GRADIENT_STREAMS = streams
    reuse_inputs = options.pop("reuse_inputs", _ASIDE_DEFAULTS[3])
    if reuse_inputs is not None:
        OptimizerGraph.reuse_inputs = reuse_inputs
    kernels = options.pop("local_energy", _ASIDE_DEFAULTS[4])
    if kernels is not None:
        local_energy.ENABLED = kernels
    prefetch = options.pop("prefetch", True)
    if hasattr(graphs, "PREFETCH"):  # a package with the prefetch
        graphs.PREFETCH = prefetch
    priority = options.pop("chain_priority", _CHAIN_PRIORITY)
    if hasattr(graphs, "CHAIN_PRIORITY"):  # a package with the option
        graphs.CHAIN_PRIORITY = priority
    tc = options.pop("products", _PRODUCTS_DEFAULT)
    fused_mlp = options.pop("fused_mlp", True)
    max_width = options.pop("max_width", _MAX_WIDTH)
    if products is not None:  # a package with the tensor-core products
        products.ENABLED = tc
        products.FUSED_MLP = fused_mlp
        if hasattr(products, "MAX_WIDTH"):
            products.MAX_WIDTH = max_width
    torch.backends.cuda.matmul.allow_tf32 = options.pop("tf32", False)
    reuse = options.pop("reuse_space", True)
    ansatz = Ansatz.for_molecule(mol, seed=0, dtype=dtype, device="cuda")
    runner = Runner(mol, ansatz, seed=0, verbose=0, **options)
    if hasattr(runner._pipeline, "reuse_space"):
        runner._pipeline.reuse_space = reuse
    _time_teacher(runner)
    t0 = time.perf_counter()
    runner.run(iterations, [LearningRateDecay.over_tail(iterations)], progress=False)
    torch.cuda.synchronize()
    for what, why in (
        ("Triton", fused_ops._failed),
        ("fused", fused_ops._coarse_failed),
        ("tail", getattr(fused_ops, "_tail_failed", None)),
    ):
        if why is not None:  # the run (and any after it) took the module's pass instead
            print(f"# the {what} training kernels were turned off: {why}", flush=True)
    return runner, time.perf_counter() - t0


_TEACHER_S: dict = {}  # (piece, iteration) -> seconds, for the run in progress
_RUNNING: dict = {}
TEACHER_PIECES = ("solve", "loss", "pull")


def _timed(fn, piece: str):
    """`fn` with its seconds added to _TEACHER_S under (piece, the iteration running)."""

    def timed(*a, **kw):
        t0 = time.perf_counter()
        out = fn(*a, **kw)
        key = (piece, _RUNNING["runner"].iteration + 1)
        _TEACHER_S[key] = _TEACHER_S.get(key, 0.0) + time.perf_counter() - t0
        return out

    return timed


def _time_teacher(runner) -> None:
    """Time the teacher's host-side pieces of every iteration of this run: "solve" (the
    eigensolve of H_SS or the reuse of the last one) in the "energy" stage, and "pull" (its
    coefficients and loss for the iteration's step, launched without waiting for the device)
    in the "energy" stage too. A package from before `pull_and_loss` is timed by its
    `fidelity_loss` ("loss") and `_with_teacher` ("pull", in the "optimizer" stage)."""
    import cuscikit.nnqs.runner as runner_module
    import cuscikit.nnqs.teacher as teacher_module

    if not _RUNNING:  # once per process: the module functions the Runner looks up per call
        if hasattr(teacher_module, "pull_and_loss"):
            teacher_module.pull_and_loss = _timed(teacher_module.pull_and_loss, "pull")
        else:
            teacher_module.fidelity_loss = _timed(teacher_module.fidelity_loss, "loss")
            runner_module._with_teacher = _timed(runner_module._with_teacher, "pull")
    _RUNNING["runner"] = runner
    _TEACHER_S.clear()
    runner._teacher_solution = _timed(runner._teacher_solution, "solve")


def _teacher_label(first: int) -> str:
    """ " (teacher solve/loss/pull ms)": medians over iterations from `first`, or ""."""
    parts = []
    for piece in TEACHER_PIECES:
        v = [s for (p, it), s in _TEACHER_S.items() if p == piece and it >= first]
        if v:
            parts.append(f"{piece} {np.median(v) * 1e3:.2f}")
    return f" (teacher ms: {', '.join(parts)})" if parts else ""


def _device_events(prof):
    """(kernels, copies/sets) of a torch.profiler run: (name, start us, duration us) each."""
    from torch.autograd import DeviceType

    kernels, copies = [], []
    for e in prof.events():
        if e.device_type != DeviceType.CUDA:
            continue
        item = (e.name, e.time_range.start, e.time_range.elapsed_us())
        (copies if e.name.startswith(("Memcpy", "Memset")) else kernels).append(item)
    return kernels, copies


def _kernel_stats(kernels) -> tuple[float, float]:
    """(summed kernel time, span from the first start to the last end), milliseconds."""
    if not kernels:
        return 0.0, 0.0
    busy = sum(d for _, _, d in kernels)
    span = max(t + d for _, t, d in kernels) - min(t for _, t, _ in kernels)
    return busy / 1e3, span / 1e3


def _top(kernels, n: int = 12) -> list[str]:
    by = {}
    for name, _, d in kernels:
        c, t = by.get(name, (0, 0.0))
        by[name] = (c + 1, t + d)
    order = sorted(by.items(), key=lambda kv: -kv[1][1])[:n]
    return [f"  {t / 1e3:7.3f} ms {c:5d}x  {name[:110]}" for name, (c, t) in order]


def _host_waits(prof) -> list[str]:
    """Counts of the cuda*Synchronize calls and of the scalar reads (``.item()``,
    ``float(tensor)``; of CPU tensors too) in a profile."""
    by = {}
    for e in prof.events():
        name = e.name
        if (name.startswith("cuda") and "Synchronize" in name) or (
            name == "aten::_local_scalar_dense"
        ):
            by[name] = by.get(name, 0) + 1
    return [f"  {c:4d}x  {name}" for name, c in sorted(by.items(), key=lambda kv: -kv[1])]


def _export_trace(prof, name: str) -> None:
    """The profile as a gzipped Chrome trace in --trace-out (when given): per-stream kernel
    timelines, for looking at in Perfetto or chrome://tracing."""
    if not TRACE_DIR:
        return
    import gzip

    os.makedirs(TRACE_DIR, exist_ok=True)
    raw = os.path.join(TRACE_DIR, f"{TRACE_TAG}{name}.json")
    prof.export_chrome_trace(raw)
    with open(raw, "rb") as f, gzip.open(raw + ".gz", "wb") as g:
        g.write(f.read())
    os.remove(raw)
    print(f"# trace: {raw}.gz", flush=True)


TRACE_DIR = None  # --trace-out
TRACE_TAG = ""  # the variant's label, before each trace's name


def _profile_stage(label: str, fn, passes: int) -> list:
    """Wall ms per call over 20 calls, then one call under the profiler."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) / 20 * 1e3
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    kernels, copies = _device_events(prof)
    busy, span = _kernel_stats(kernels)
    _export_trace(prof, f"stage_{passes}_passes")
    print(f"# {label}: top kernels of one replay (summed GPU time, count, name)")
    print("\n".join(_top(kernels)), flush=True)
    return [
        label,
        f"{wall:.2f}",
        len(kernels),
        f"{len(kernels) / passes:.0f}",
        f"{busy:.2f}",
        f"{span:.2f}",
        f"{busy / passes:.3f}",
        len(copies),
    ]


def profile_run(runner, compile_too: bool) -> list:
    """The profile rows of `--profile` for a run whose optimiser stage was recorded (with
    `compile_too`, a compiled ln psi's too)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    stage = runner._graph_stage
    if stage is None:
        return []
    seen = {}
    run_stage = stage.run

    def keep(*a, **kw):  # the Runner passes the teacher by keyword
        seen["args"], seen["kw"] = a, kw
        return run_stage(*a, **kw)

    stage.run = keep
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], with_stack=True) as prof:
        t0 = time.perf_counter()
        row = runner.step()  # one more iteration: the stage's inputs, and the whole iteration
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t0) * 1e3
    stage.run = run_stage
    _export_trace(prof, f"iteration_{runner.iteration}")
    kernels, copies = _device_events(prof)
    busy, span = _kernel_stats(kernels)
    syncs = sum(
        1
        for e in prof.events()
        if e.device_type == DeviceType.CPU and "Synchronize" in e.name and e.name.startswith("cuda")
    )
    d2h = sum(1 for name, _, _ in copies if "DtoH" in name)
    print(
        f"# one whole iteration (|S| = {row['n_space']}, profiled): {wall:.2f} ms wall, "
        f"{len(kernels)} kernels, {busy:.2f} ms summed kernel time, GPU span {span:.2f} ms, "
        f"{syncs} cuda*Synchronize calls, {d2h} device-to-host copies, "
        f"{len(copies)} copies/sets in all",
        flush=True,
    )
    print("# host waits and scalar reads of that iteration")
    print("\n".join(_host_waits(prof)), flush=True)
    if "args" not in seen:
        print("# the profiled iteration did not take the recorded stage")
        return []
    args, kw = seen["args"], seen["kw"]
    passes = 1 + int(args[5])  # the iteration's step and its inner steps
    rows = [_profile_stage("recorded stage", lambda: stage.run(*args, **kw), passes)]
    _launch_time(stage)
    variants = []
    if compile_too:
        variants.append(("compiled ln psi", lambda: torch.compile(runner.ansatz._log_psi_tokens)))
    for label, make in variants:
        try:
            graph = OptimizerGraph(runner.ansatz, runner.optimizer, log_psi=make())
            t0 = time.perf_counter()
            graph.run(*args, **kw)
            torch.cuda.synchronize()
            first = time.perf_counter() - t0
            label = f"{label} (first call {first:.1f} s)"
            rows.append(_profile_stage(label, lambda g=graph: g.run(*args, **kw), passes))
        except Exception as exc:  # noqa: BLE001 - a lever that cannot be recorded is a result
            print(f"# {label}: failed: {type(exc).__name__}: {exc}", flush=True)
    return rows


def _launch_time(stage, reps: int = 5) -> None:
    """Print the host's time in ``replay()`` of the recorded stage (the graph's launch; the
    device idle until its first kernel is submitted), the device idle before each."""
    graph = getattr(stage, "_graph", None)
    if graph is None:
        return
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        graph.replay()
        times.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    print(
        f"# recorded stage: replay() returns after {np.median(times) * 1e6:.0f} us on the host "
        f"(median of {reps}, an idle device each time)",
        flush=True,
    )


# the block and amplitude kernels' launch settings in `kernel_times`: rows of a program,
# warps, float32 products (`fused_ops.COARSE_PRODUCTS`)
TILES = (
    (16, 4, "ieee"),
    (32, 4, "ieee"),
    (64, 8, "ieee"),
    (128, 8, "ieee"),
    (16, 4, "tf32x3"),
    (32, 4, "tf32x3"),
)


def kernel_times(mol, dtype, n: int, reps: int = 200, attention_only: bool = False) -> int:
    """--kernels: microseconds per call of the training kernels at the model's shapes (n
    sequences), forward and backward, the attention's tile kernels for 1, 2 and 4 warps per
    program and its row-wise kernels for several program sizes, against torch's written-out
    attention and LayerNorm, and (unless ``attention_only``) a block and the whole ln|psi| as
    one kernel each way for the launch settings of TILES against the module's pass; returns the
    fastest attention warps of the tile kernels."""
    psi = Ansatz.for_molecule(mol, seed=0, dtype=dtype, device="cuda")
    length, d, h = psi.norb, psi.d_model, psi.n_heads
    g = torch.Generator(device="cuda").manual_seed(0)
    qkv = torch.randn(n, length, 3 * d, dtype=dtype, device="cuda", generator=g)
    qkv.requires_grad_()
    x = torch.randn(n, length, d, dtype=dtype, device="cuda", generator=g).requires_grad_()
    w = torch.ones(d, dtype=dtype, device="cuda", requires_grad=True)
    b = torch.zeros(d, dtype=dtype, device="cuda", requires_grad=True)
    gy = torch.randn(n, length, d, dtype=dtype, device="cuda", generator=g)

    def torch_attention(t):
        q, k, v = (u.reshape(n, length, h, d // h).transpose(1, 2) for u in t.split(d, -1))
        att = (q @ k.transpose(-2, -1)) * (1.0 / (d // h) ** 0.5)
        future = torch.ones(length, length, dtype=torch.bool, device="cuda").triu(1)
        y = torch.softmax(att.masked_fill(future, -float("inf")), -1) @ v
        return y.transpose(1, 2).reshape(n, length, d)

    def timed(fn) -> float:
        for _ in range(3):
            fn()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / reps * 1e3

    def both(forward, inputs, grad_out=gy) -> tuple[float, float]:
        y = forward()
        fwd = timed(forward)
        bwd = timed(lambda: torch.autograd.grad(y, inputs, grad_out, retain_graph=True))
        return fwd, bwd

    rows, best = [], (float("inf"), fused_ops._ATTN_WARPS)
    keep = fused_ops._ATTN_WARPS, getattr(fused_ops, "_ATTN_ROWS", None)
    y_torch = torch_attention(qkv).detach()
    fused_ops._ATTN_ROWS = {}  # the tile kernels
    for warps in (1, 2, 4):
        fused_ops._ATTN_WARPS = warps
        fwd, bwd = both(lambda: fused_ops.causal_attention(qkv, h), qkv)
        err = float((fused_ops.causal_attention(qkv, h).detach() - y_torch).abs().max())
        rows.append([f"attention, Triton, {warps} warps", f"{fwd:.1f}", f"{bwd:.1f}", f"{err:.1e}"])
        best = min(best, (fwd + bwd, warps))
    fused_ops._ATTN_WARPS = keep[0]
    if keep[1] is not None:  # a package with the row-wise kernels: (rows, warps) a program
        for tile in ((32, 1), (64, 1), (64, 2), (128, 2), (128, 4), (256, 4), (256, 8)):
            fused_ops._ATTN_ROWS = {dtype: tile}
            fwd, bwd = both(lambda: fused_ops.causal_attention(qkv, h), qkv)
            err = float((fused_ops.causal_attention(qkv, h).detach() - y_torch).abs().max())
            label = f"attention, Triton rows, {tile[0]} rows, {tile[1]} warps"
            rows.append([label, f"{fwd:.1f}", f"{bwd:.1f}", f"{err:.1e}"])
        fused_ops._ATTN_ROWS = keep[1]
    fwd, bwd = both(lambda: torch_attention(qkv), qkv)
    rows.append(["attention, torch (written out)", f"{fwd:.1f}", f"{bwd:.1f}", "-"])
    if attention_only:
        print_table(
            f"Attention kernels at {mol.name}'s shapes: {n} sequences x {length} positions, "
            f"d_model {d}, {h} heads, {dtype}; microseconds per call launched from Python, CUDA "
            f"events over {reps} calls",
            ["kernel", "forward us", "backward us", "max |y - torch|"],
            rows,
        )
        return best[1]
    y_ln = torch.nn.functional.layer_norm(x, (d,), w, b, 1e-5).detach()
    fwd, bwd = both(lambda: fused_ops.layer_norm(x, w, b, 1e-5), (x, w, b))
    err = float((fused_ops.layer_norm(x, w, b, 1e-5).detach() - y_ln).abs().max())
    rows.append(["LayerNorm, Triton", f"{fwd:.1f}", f"{bwd:.1f}", f"{err:.1e}"])
    fwd, bwd = both(lambda: torch.nn.functional.layer_norm(x, (d,), w, b, 1e-5), (x, w, b))
    rows.append(["LayerNorm, torch", f"{fwd:.1f}", f"{bwd:.1f}", "-"])
    # a whole transformer block: one kernel each way, for several tiles, against the module's
    # pass with the kernels above
    blk = psi.blocks[0]
    inputs = (x, *blk.parameters())
    fused_ops.BLOCK_ENABLED = False
    fwd, bwd = both(lambda: blk(x), inputs)
    y_blk = blk(x).detach()
    rows.append(["block, module (the kernels above)", f"{fwd:.1f}", f"{bwd:.1f}", "-"])
    keep = dict(fused_ops._TILES)

    def launch_with(tile: int, warps: int, products: str) -> None:
        fused_ops.COARSE_PRODUCTS = products
        fused_ops._set_tile(dtype, tile, warps)

    fused_ops.BLOCK_ENABLED = True
    for tile, warps, products in TILES:
        launch_with(tile, warps, products)
        fwd, bwd = both(lambda: blk(x), inputs)
        err = float((blk(x).detach() - y_blk).abs().max())
        label = f"block, one kernel each way, {tile} rows, {warps} warps, {products}"
        rows.append([label, f"{fwd:.1f}", f"{bwd:.1f}", f"{err:.1e}"])
    fused_ops.BLOCK_ENABLED = False
    # the whole ln|psi| of n configurations: the module's pass (the kernels above) against one
    # kernel each way
    # n configurations of the sector, spread over it (the untrained model's samples repeat)
    every = all_determinants(psi.norb, psi.nelec)
    pick = np.linspace(0, len(every) - 1, min(n, len(every))).astype(np.int64)
    tok = psi.tokens(torch.as_tensor(every[pick].view(np.int64), device="cuda"))
    amp_inputs = [p for name, p in psi.named_parameters() if not name.startswith("phase")]
    g_amp = torch.randn(len(tok), dtype=dtype, device="cuda", generator=g)
    fwd, bwd = both(lambda: psi.log_amplitude(tok), amp_inputs, g_amp)
    a_ref = psi.log_amplitude(tok).detach()
    rows.append([f"ln|psi|, module, {len(tok)} configurations", f"{fwd:.1f}", f"{bwd:.1f}", "-"])
    fused_ops.AMPLITUDE_ENABLED = True
    for tile, warps, products in TILES:
        launch_with(tile, warps, products)
        fwd, bwd = both(lambda: psi.log_amplitude(tok), amp_inputs, g_amp)
        err = float((psi.log_amplitude(tok).detach() - a_ref).abs().max())
        label = f"ln|psi|, one kernel each way, {tile} rows, {warps} warps, {products}"
        rows.append([label, f"{fwd:.1f}", f"{bwd:.1f}", f"{err:.1e}"])
    fused_ops.AMPLITUDE_ENABLED = False
    fused_ops._TILES.update(keep)
    fused_ops.COARSE_PRODUCTS = "ieee"
    for what, why in (
        ("Triton", fused_ops._failed),
        ("fused", fused_ops._coarse_failed),
        ("tail", getattr(fused_ops, "_tail_failed", None)),
    ):
        if why is not None:
            print(f"# the {what} training kernels were turned off: {why}", flush=True)
    print_table(
        f"Training kernels at {mol.name}'s shapes: {n} sequences x {length} positions, d_model "
        f"{d}, {h} heads, {dtype}; microseconds per call launched from Python, CUDA events over "
        f"{reps} calls: the host's launch and autograd overhead included (the profile of "
        "--profile gives the kernels' own times)",
        ["kernel", "forward us", "backward us", "max |y - torch|"],
        rows,
    )
    print(f"# best attention warps: {best[1]}", flush=True)
    return best[1]


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument(
        "--systems",
        nargs="+",
        default=["N2"],
        help="bundled molecules, or lattices as Hubbard-<L>-<chain|ring>-U<U>",
    )
    ap.add_argument(
        "--options",
        type=json.loads,
        default={},
        help='Runner options for every variant, as JSON (e.g. \'{"growth": "weight"}\')',
    )
    ap.add_argument("--iterations", type=int, default=200)
    ap.add_argument("--from", dest="first", type=int, default=20)
    ap.add_argument("--float64", action="store_true")
    ap.add_argument("--variants", nargs="+", default=["eager", "graph"], choices=list(VARIANTS))
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--profile-compile", action="store_true")
    ap.add_argument("--kernels", action="store_true")
    ap.add_argument(
        "--kernels-attention", action="store_true", help="--kernels for the attention alone"
    )
    ap.add_argument("--kernel-rows", type=int, default=1920)
    ap.add_argument("--attn-warps", type=int, choices=(1, 2, 4, 8))
    ap.add_argument("--trace-out", help="with --profile: write the profiles as Chrome traces here")
    ap.add_argument("--json-out", help="write the tables' rows as benchmarks/results keeps them")
    ap.add_argument("--note", default="", help="how the machine was shared, for --json-out")
    ap.add_argument(
        "--history-out",
        help="write each variant's energies, |S| and stage times (CSV) to this folder",
    )
    ap.add_argument(
        "--reference",
        help="a --history-out folder of another run: each variant's energies are compared with "
        "the same variant's there (e.g. another package's, --float64)",
    )
    args = ap.parse_args()
    global TRACE_DIR, TRACE_TAG
    TRACE_DIR = args.trace_out
    if args.attn_warps:
        fused_ops._ATTN_WARPS = args.attn_warps
    profiles = []
    dtype = torch.float64 if args.float64 else torch.float32
    print(f"# {machine()}, torch {torch.__version__}, {dtype}")
    rows = []
    if args.kernels or args.kernels_attention:
        for name in args.systems:
            kernel_times(Molecule.load(name), dtype, args.kernel_rows, 200, args.kernels_attention)
        return
    warps = getattr(fused_ops, "_ATTN_WARPS", None)  # None: a package without the option
    tile = getattr(fused_ops, "_ATTN_ROWS", None)
    print(f"# attention programs of {warps} warps, row-wise (rows, warps) {tile}")
    for name in args.systems:
        mol = load_system(name)
        hist = {}
        for i, kind in enumerate(args.variants):
            # a variant named twice is run twice (is the path reproducible?): "eager #2"
            variant = kind if kind not in args.variants[:i] else f"{kind} #{i + 1}"
            runner, wall = run(mol, VARIANTS[kind], args.iterations, dtype, args.options)
            if fused_ops._failed:
                print(f"# {variant}: the Triton training kernels are off: {fused_ops._failed}")
            h = runner.history
            hist[variant] = h
            tail = h[h["iteration"] >= args.first]
            med = {s: float(np.median(tail[f"t_{s}"])) * 1e3 for s in STAGES}
            label = variant
            label += _teacher_label(args.first)
            if runner._graph_stage is not None:
                label += f" ({runner._graph_stage.captures} captures)"
            reused = getattr(runner._pipeline, "reused", None)
            if reused is not None:
                label += f" (S reused {reused}x)"
            prefetched = getattr(runner._pipeline.inference_graph, "prefetched", None)
            if prefetched:
                label += f" (prefetched {prefetched}x)"
            if runner._graphs_off is not None:
                label += " (graphs failed: eager)"
                print("#", runner._graphs_off)
            inner = (
                f"{tail['inner_steps'].median():g}"
                if "inner_steps" in tail
                else str(runner.inner_steps)
            )
            rows.append(
                [
                    name,
                    label,
                    int(tail["n_space"].median()),
                    inner,
                    f"{float(np.median(tail['t_total'])) * 1e3:.2f}",
                    *(f"{med[s]:.2f}" for s in STAGES),
                    f"{wall:.1f}",
                    f"{h['e_tot'].iloc[-1]:.10f}",
                ]
            )
            print(rows[-1], flush=True)
            if args.profile or args.profile_compile:
                TRACE_TAG = f"{name}_{variant}_".replace("/", "-").replace(" ", "").replace("#", "")
                for prow in profile_run(runner, args.profile_compile):
                    profiles.append([name, f"{variant}: {prow[0]}", *prow[1:]])
                    print(profiles[-1], flush=True)
        if args.history_out:  # for --reference in another process (another package)
            os.makedirs(args.history_out, exist_ok=True)
            for variant, h in hist.items():
                path = os.path.join(args.history_out, f"{name}_{variant.replace(' ', '')}.csv")
                cols = ["iteration", "e_coupled", "e_variational", "n_space", "t_total"]
                cols += [f"t_{s}" for s in STAGES]
                h[[c for c in cols if c in h]].to_csv(path, index=False)
        pairs = []
        first_variant = next(iter(hist))
        pairs += [(v, hist[v], first_variant, hist[first_variant]) for v in list(hist)[1:]]
        if args.reference:
            import pandas as pd

            for variant, h in hist.items():
                path = os.path.join(args.reference, f"{name}_{variant.replace(' ', '')}.csv")
                if os.path.exists(path):
                    pairs.append((variant, h, f"{variant} (--reference)", pd.read_csv(path)))
        for variant, h, ref_name, ref_h in pairs:
            k = min(len(h), len(ref_h))
            ref = ref_h[["e_coupled", "e_variational"]].iloc[:k].reset_index(drop=True)
            mine = h[["e_coupled", "e_variational"]].iloc[:k].reset_index(drop=True)
            d = (mine - ref).abs().max(axis=1)
            first = float(d.iloc[: args.first].max())
            its = h["iteration"].to_numpy()[:k]
            worst_it = int(its[int(np.argmax(d.to_numpy()))])
            over = np.flatnonzero(d.to_numpy() > 1e-10)
            print(
                f"# {name}, {variant} - {ref_name}: first iteration with |dE| > 1e-10: "
                f"{int(its[over[0]]) if len(over) else 'none'}; |dE| at iterations "
                + ", ".join(
                    f"{int(i)}: {x:.1e}"
                    for i, x in zip(its, d.to_numpy(), strict=True)
                    if i in (1, 10, 20, 50, 100, 150, 200) or i == its[-1]
                ),
                flush=True,
            )
            rows.append(
                [
                    name,
                    f"max |dE| {variant} - {ref_name}",
                    "",
                    "",
                    f"{first:.1e} (it<{args.first})",
                    *[""] * len(STAGES),
                    "",
                    f"{float(d.max()):.1e} (all; iteration {worst_it})",
                ]
            )
    header = ["system", "optimiser stage", "|S|", "inner", "total ms", *STAGES, "run s", "final E"]
    print_table(
        f"Milliseconds per iteration (median over iterations {args.first}..{args.iterations}), "
        f"{dtype}",
        header,
        rows,
    )
    profile_header = [
        "system",
        "stage",
        "wall ms",
        "kernels",
        "per pass",
        "kernel ms",
        "GPU span ms",
        "kernel ms per pass",
        "copies/sets",
    ]
    if args.json_out:
        table = [dict(zip(header, r, strict=True)) for r in rows]
        table += [
            {"table": "profile", **dict(zip(profile_header, r, strict=True))} for r in profiles
        ]
        write_json(
            args.json_out, "small_iteration.py", "small-systems", args, table, note=args.note
        )
    if profiles:
        print_table(
            f"The recorded optimiser stage, replayed after the run (one replay profiled), {dtype}",
            profile_header,
            profiles,
        )


if __name__ == "__main__":
    main()
