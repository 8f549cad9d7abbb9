"""The optimiser stage of an NNQS-SCI iteration as one CUDA graph.

On a small system the optimiser stage (the loss's backward pass, the AdamW step and the inner
steps on the energy within S) is a few thousand kernels of a few microseconds each, launched
one by one from Python, with a host synchronisation in every inner step. `OptimizerGraph`
records the whole stage once per size bucket and replays it with one launch:

1. a copy of the weights (so the stage can be undone) and the AdamW moments gathered into one
   flat buffer per moment;
2. the iteration's step: ln psi over S, L = 2 Re sum_x w(x) conj(ln psi(x)) (E_loc(x) - E),
   its gradient and AdamW;
3. ``inner_steps`` times: ln psi over S, the Rayleigh quotient of psi on S with H_SS from the
   iteration's pairs (`cuscikit.nnqs.local_energy`: three Triton kernels on a GPU, the pairs
   stored by row), its loss, gradient and AdamW;
   With a teacher (``run(..., teacher=(weight, c))``, `cuscikit.nnqs.teacher`) every inner
   step adds ``weight`` times the teacher's coefficients on S to the energy's (the caller passes
   the iteration's step already combined: unit weights and the combined coefficients);
4. flags: the loss of step 2, whether any inner step met a non-finite local energy, whether the
   weights are finite.

The host reads the flags once, after the replay; with ``after_replay`` set (the Runner's
`InferenceGraph.prefetch`), from a pinned copy, so that the work it queues after the stage
runs while the host finishes the iteration. The arithmetic is that of the eager stage in
`cuscikit.nnqs.runner.Runner`, written for static shapes: S and the H_SS pairs are padded to a
bucket (rows of weight zero that repeat the first configuration, pairs of value zero), and the
AdamW update is the one of `torch.optim.AdamW` (not amsgrad) with the rate and the step count
in device scalars, written over flat buffers (the gradients concatenated, the moments in one
buffer each): one kernel per operation for all parameters, about a dozen per step (on
N2/STO-3G nine fewer a step than the per-tensor-group form). The host copies the moments back
into the optimiser's state after a good replay, so the state (and a checkpoint) keeps its
per-parameter tensors. The eager stage and this one agree to rounding (1e-10 in float64 in the
tests). When an inner step meets a non-finite local energy, the stage is undone and the Runner
runs the eager stage instead, which stops the inner steps at that point.

``use_graph=False`` runs the same body without capturing (any device): the tests compare it
with the eager stage on the CPU. ``log_psi`` replaces the ansatz's ln psi of token rows inside
the stage (for example a `torch.compile`d ``ansatz._log_psi_tokens``, compiled during the
warm-up before the recording; `benchmarks/small_iteration.py --profile-compile` measures it).
``shared_prefixes=True`` runs the transformer once per distinct prefix of S
(`cuscikit.nnqs.ansatz.prefix_tree`, built on the host's side of the replay once a stage,
since S is the same in every step of it) with the tree padded to a bucket of its own: the same
values and gradients to rounding, fewer rows where S shares prefixes.

`InferenceGraph` does the same for ln psi without gradient (the iteration's inference over S
and the coupled set when they fit one batch): one recorded forward pass per size bucket, and
its `prefetch` replays the last input's pass ahead of the next call (the next iteration's S,
queued right after the recorded stage), which then returns it if the weights are the same.

Example:
    >>> import torch
    >>> from cuscikit import Ansatz, Molecule, Runner
    >>> mol = Molecule.load("LiH")
    >>> runner = Runner(mol, Ansatz.for_molecule(mol, seed=0), seed=0)
    >>> runner.graphs_active   # on a CPU: the eager stage
    False
"""

from __future__ import annotations

import warnings
import weakref
from typing import NamedTuple

import numpy as np
import torch
from torch.autograd.graph import increment_version

from cuscikit.nnqs import aside, local_energy
from cuscikit.nnqs._triton import interpreting, tl, triton
from cuscikit.nnqs.ansatz import PrefixTree, reuse_token_work

__all__ = [
    "InferenceGraph",
    "OptimizerGraph",
    "bucket",
    "pair_signature",
    "read_later",
    "record",
    "saved_bytes_per_row",
    "spread_rows",
    "unsupported_reason",
]

_MIN_BUCKET = 64
#: True: the flat AdamW step's moments and update are one Triton kernel on a GPU (`_adamw`)
#: instead of eight torch kernels. Off by default: on an H100 it took 0.08 ms off a recorded
#: stage of 21 ms, within the spread of two runs (docs/performance.md, "#add-norm").
ADAMW_KERNEL = False
_adamw_failed: str | None = None  # why the AdamW kernel was turned off
_ADAMW_BLOCK = 1024
#: True: the Runner queues the next iteration's ln psi over S (`InferenceGraph.prefetch`)
#: right after its recorded optimiser stage, ahead of the host's wait for the stage.
PREFETCH = True
#: True: `record` captures on a stream of the device's highest priority. torch instantiates
#: graphs with their nodes' own priorities, so the recorded stage's chain (the pass's forward
#: and input gradients) is then scheduled ahead of its side streams' work (the parameter
#: gradients and the phase MLP, `cuscikit.nnqs.aside`), which is captured at the default
#: priority, wherever both wait for the same multiprocessors.
CHAIN_PRIORITY = False
_SIDE_STREAMS: dict = {}
_CAPTURE_STREAMS: dict = {}


def _side_stream(device) -> torch.cuda.Stream:
    """The warm-up stream of a device, one for the process: torch keeps a cuBLAS workspace for
    every stream that ran a product, so a new stream per recording would hold tens of MiB each
    until the process ends."""
    device = torch.device(device)
    key = device.index if device.index is not None else torch.cuda.current_device()
    if key not in _SIDE_STREAMS:
        _SIDE_STREAMS[key] = torch.cuda.Stream(key)
    return _SIDE_STREAMS[key]


def _capture_stream(device: torch.device) -> torch.cuda.Stream | None:
    """The stream `record` captures on: with ``CHAIN_PRIORITY`` one of the highest priority a
    device, kept for the process (None: torch's own capture stream, of the default priority)."""
    if not CHAIN_PRIORITY:
        return None
    key = device.index if device.index is not None else torch.cuda.current_device()
    if key not in _CAPTURE_STREAMS:  # torch maps a priority beyond the range to its end
        _CAPTURE_STREAMS[key] = torch.cuda.Stream(key, priority=-(1 << 10))
    return _CAPTURE_STREAMS[key]


def record(fn, device=None, *, warm_up=None, warm_ups: int = 2):
    """``fn()`` recorded as a CUDA graph: ``warm_ups`` calls of ``warm_up`` (default ``fn``)
    on the device's side stream first (lazy initialisation and workspaces outside the
    recording), then ``fn()`` captured. Returns ``(graph, what fn returned while recorded)``;
    ``graph.replay()`` reruns it on the same tensors. With ``CHAIN_PRIORITY`` the capture runs
    on a stream of the highest priority (see there).

    Example (needs a CUDA GPU):
        >>> x = torch.ones(4, device="cuda")                     # doctest: +SKIP
        >>> graph, y = record(lambda: x * 2)                      # doctest: +SKIP
        >>> x.fill_(3); graph.replay(); y.tolist()                # doctest: +SKIP
        [6.0, 6.0, 6.0, 6.0]
    """
    device = torch.device("cuda") if device is None else torch.device(device)
    side = _side_stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(warm_ups):
            (warm_up or fn)()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=_capture_stream(device)):
        out = fn()
    return graph, out


def read_later(t: torch.Tensor):
    """A function returning ``t.tolist()`` as ``t`` is now (a float for a 0-d tensor). On a
    CUDA device ``t`` is copied to pinned memory at once, without waiting, and the function
    waits for that copy alone, not for the work queued after it (the recorded stage's flags
    and the teacher's loss, read while the next iteration's ln psi over S runs).

    Example:
        >>> import torch
        >>> x = torch.tensor(2.5)
        >>> read = read_later(x)
        >>> _ = x.fill_(0.0)
        >>> read()
        2.5
    """
    if t.device.type != "cuda":
        value = t.tolist()
        return lambda: value
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    host.copy_(t, non_blocking=True)
    copied = torch.cuda.Event()
    copied.record()

    def read():
        copied.synchronize()
        return host.tolist()

    return read


def bucket(n: int) -> int:
    """The smallest capacity ``2^k * j / 8`` (j = 8..16, at least 64) that holds ``n``: at most
    an eighth of a padded pass is padding.

    Example:
        >>> [bucket(n) for n in (0, 64, 65, 1824, 2048, 2049)]
        [64, 64, 72, 1920, 2048, 2304]
    """
    n = max(int(n), _MIN_BUCKET)
    base = 1 << (n.bit_length() - 1)
    if base == n:
        return n
    for j in range(9, 17):
        cap = base * j // 8
        if cap >= n:
            return cap
    raise AssertionError("unreachable")


def saved_bytes_per_row(log_psi, tokens: torch.Tensor, rows: tuple[int, int] = (32, 96)) -> float:
    """Bytes the autograd graph of ``log_psi`` keeps per configuration: the storages of the
    tensors saved for the backward pass, counted once each, over two forward passes of
    ``rows`` configurations (the first rows of `tokens`, repeated as needed), divided by the
    difference. What both passes save alike (the parameters) cancels. Measured on the
    tokens' device, so with the kernels that device runs (the Triton training kernels on a
    GPU). Nothing is kept: the saved tensors are not even held by the graphs, which are gone
    before this returns (an autograd graph alive from outside a CUDA graph's recording, whose
    parameters' gradient nodes belong to another stream, would break the recording).

    Example:
        >>> import torch
        >>> from cuscikit import Ansatz
        >>> psi = Ansatz(6, (2, 2), seed=0)
        >>> tok = psi.tokens(torch.tensor([0b0101_0011_0000]))
        >>> saved_bytes_per_row(psi._log_psi_tokens, tok) > 0
        True
    """
    if tokens.ndim != 2 or tokens.shape[0] == 0:
        raise ValueError("tokens must be a non-empty (n, norb) tensor")
    lo, hi = rows
    if not 0 < lo < hi:
        raise ValueError(f"rows must be two increasing positive counts, got {rows!r}")

    def saved(n: int) -> int:
        reps = -(-n // tokens.shape[0])
        tok = tokens.repeat(reps, 1)[:n]
        seen: dict[int, int] = {}
        held = []  # alive until the count is done (a freed storage's address is reused)

        def pack(t):  # the graph keeps nothing: a saved output would make a cycle with it
            st = t.untyped_storage()
            seen[st.data_ptr()] = st.nbytes()
            held.append(t)

        def unpack(_):
            raise RuntimeError("a measurement pass has no backward")

        with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            out = log_psi(tok)
        del out, held[:]
        return sum(seen.values())

    return max(saved(hi) - saved(lo), 0) / (hi - lo)


class _Key(NamedTuple):
    """A recording's identity (`OptimizerGraph.key_for`): its size buckets first (the fields a
    larger recording may serve, `OptimizerGraph._fits`), then what must be equal."""

    rows: int
    pairs: int
    prefixes: int  # 0 without shared prefixes
    inner: int
    consts: tuple
    ptrs: tuple
    teacher: bool
    csr: bool  # the local energies by `local_energy`'s kernels, over pairs in rows


_BUCKETS = 3  # _Key's leading size buckets


def unsupported_reason(ansatz, optimizer) -> str | None:
    """Why the graphed stage cannot run this ansatz/optimiser pair (None: it can)."""
    if not (hasattr(ansatz, "tokens") and hasattr(ansatz, "_log_psi_tokens")):
        return "the ansatz is not a cuscikit Ansatz (needs tokens and _log_psi_tokens)"
    if type(optimizer) is not torch.optim.AdamW:
        return f"the optimiser is {type(optimizer).__name__}, not torch.optim.AdamW"
    if len(optimizer.param_groups) != 1:
        return "the optimiser has more than one parameter group"
    g = optimizer.param_groups[0]
    for flag in ("amsgrad", "maximize", "differentiable"):
        if g.get(flag):
            return f"AdamW with {flag}=True"
    params = list(ansatz.parameters())
    if len(params) != len(g["params"]) or any(
        a is not b for a, b in zip(params, g["params"], strict=True)
    ):
        return "the optimiser's parameters are not the ansatz's"
    if not all(p.requires_grad for p in params):
        return "some parameters are frozen"
    if len({(p.dtype, p.device) for p in params}) != 1:
        return "the parameters do not share one dtype and device (flat AdamW buffers)"
    return None


def pair_signature(ansatz, optimizer) -> tuple:
    """What `unsupported_reason`'s verdict on the same ansatz and optimiser can change with,
    read without walking the ansatz's modules (about 20 us against 150 for N2's 63
    parameters): the objects, the optimiser's groups, flags and parameter list, and each
    parameter's requires_grad, dtype and device. A caller may keep a verdict while this stays
    equal (a new parameter module added to the ansatz alone is not seen; the optimiser would
    not train it either way)."""
    groups = optimizer.param_groups
    g = groups[0] if groups else {}
    params = g.get("params", ())
    flags = tuple(g.get(k) for k in ("amsgrad", "maximize", "differentiable"))
    return (
        id(ansatz),
        id(optimizer),
        type(optimizer),
        len(groups),
        id(params),
        len(params),
        flags,
        tuple([p.requires_grad for p in params]),
        tuple([p.dtype for p in params]),
        tuple([p.device for p in params]),
    )


def spread_rows(src: torch.Tensor, n_rows: int) -> torch.Tensor:
    """An order of the pairs with rows ``src`` (m,) in ``[0, n_rows)`` that takes every row's
    first pair, then every row's second pair, and so on: the local energies' ``index_add_``
    (the torch operations of `local_energy.terms`, where its kernels do not run) then has
    consecutive threads add into different rows. In the order the pipeline gives
    (by row) a warp's 32 atomic additions all go to one address and run one after another.
    The sums are the same up to the order of their terms.

    Example:
        >>> spread_rows(torch.tensor([0, 0, 0, 1, 2, 2]), 3).tolist()
        [0, 3, 4, 1, 5, 2]
    """
    src = src.to(torch.long)
    by_row = torch.argsort(src, stable=True)
    rows = src[by_row]
    rank = torch.arange(len(rows), device=src.device) - torch.searchsorted(rows, rows)
    return by_row[torch.argsort(rank * n_rows + rows, stable=True)]


class _KeptState(NamedTuple):
    """An optimiser's per-parameter AdamW state, gathered once: the state dicts, the moments,
    the step counts and numpy views of those (CPU scalars: a stage reads and advances all of
    them in a few microseconds, where a torch operation per tensor took about 150 us for
    N2's 63 parameters). Valid while the optimiser holds the same dicts and tensors (a
    `load_state_dict`, or torch's first step, replaces them)."""

    params: list
    dicts: list
    exp_avg: list
    exp_avg_sq: list
    steps: list
    step_views: list

    @staticmethod
    def of(state, params) -> _KeptState:
        from torch.optim.optimizer import _get_scalar_dtype

        for p in params:
            st = state[p]
            if not st:  # created as torch.optim.AdamW creates it on its first step
                st["step"] = torch.tensor(0.0, dtype=_get_scalar_dtype())
                st["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                st["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        dicts = [state[p] for p in params]
        steps = [st["step"] for st in dicts]
        return _KeptState(
            list(params),
            dicts,
            [st["exp_avg"] for st in dicts],
            [st["exp_avg_sq"] for st in dicts],
            steps,
            [t.numpy() if t.device.type == "cpu" else t for t in steps],  # both add in place
        )

    def holds(self, state) -> bool:
        """Whether `state` still holds these dicts and tensors."""
        for p, st, m, v, k in zip(
            self.params, self.dicts, self.exp_avg, self.exp_avg_sq, self.steps, strict=True
        ):
            if (
                state.get(p) is not st
                or st.get("exp_avg") is not m
                or st.get("exp_avg_sq") is not v
                or st.get("step") is not k
            ):
                return False
        return True


class _Held(NamedTuple):
    """What a recording's static inputs hold (an `OptimizerGraph`'s buffers of S,
    `OptimizerGraph._write_space`; an `InferenceGraph`'s recording of a bucket): where they
    were written, rows and prefixes, and the inputs they were written from, a copy of a host
    array or a weak reference to a tensor with its version counter (so a tensor changed in
    place, or another tensor, is written again; a weak reference keeps no memory alive)."""

    buf: object
    n: int
    prefixes: int
    inputs: tuple

    @staticmethod
    def of(buf, n, prefixes, *inputs) -> _Held:
        return _Held(buf, n, prefixes, tuple(_Held._mark(a) for a in inputs))

    @staticmethod
    def _mark(a):
        if torch.is_tensor(a):
            return ("tensor", weakref.ref(a), a._version, a.shape)
        a = np.asarray(a)
        return ("array", a.copy(), a.dtype, a.shape)

    def holds(self, *inputs) -> bool:
        """Whether `inputs` are the ones the buffers were written from, unchanged."""
        for a, (kind, ref, tag, shape) in zip(inputs, self.inputs, strict=True):
            if kind == "tensor":
                if not (torch.is_tensor(a) and ref() is a and a._version == tag):
                    return False
            elif torch.is_tensor(a):
                return False
            else:
                a = np.asarray(a)
                if a.dtype != tag or a.shape != shape or not np.array_equal(a, ref):
                    return False
        return True


class OptimizerGraph:
    """The optimiser stage (the iteration's AdamW step plus the inner steps) replayed as one
    CUDA graph per size bucket. See the module docstring.

    Args:
        ansatz: a `cuscikit.Ansatz` (single process).
        optimizer: its `torch.optim.AdamW` (one parameter group).
        use_graph: capture and replay (CUDA); False runs the body directly (tests, any device).
        log_psi: ln psi of token rows (n, norb) -> complex (n,) used in the stage; default
            ``ansatz._log_psi_tokens``. Must compute the same function with the ansatz's
            parameters (the gradients are taken with respect to them). With
            `shared_prefixes` it is called as ``log_psi(tokens, tree)``.
        shared_prefixes: run the transformer once per distinct prefix of S (a `PrefixTree`
            of the padded S, recorded in static buffers whose size is bucketed like S's).

    Example:
        >>> import torch
        >>> from cuscikit import Ansatz
        >>> psi = Ansatz(4, (2, 1), seed=0, dtype=torch.float64)
        >>> opt = torch.optim.AdamW(psi.parameters(), lr=1e-3)
        >>> stage = OptimizerGraph(psi, opt, use_graph=False)
        >>> stage.key_for(100, 10, 4)[:3]    # rows, pairs, prefixes (0: not shared)
        (104, 64, 0)
    """

    #: True: while S, its pairs and its diagonal stay the same inputs, a run writes only the
    #: per-stage values (weights, offsets, rate, step, teacher) into the buffers; False: all of
    #: them every run.
    reuse_inputs = True

    def __init__(
        self, ansatz, optimizer, *, use_graph: bool = True, log_psi=None, shared_prefixes=False
    ) -> None:
        reason = unsupported_reason(ansatz, optimizer)
        if reason is not None:
            raise ValueError(f"the graphed optimiser stage cannot run: {reason}")
        if log_psi is not None and not callable(log_psi):
            raise ValueError(f"log_psi must be callable (tokens -> ln psi), got {log_psi!r}")
        if not isinstance(shared_prefixes, bool):
            raise ValueError(f"shared_prefixes must be True or False, got {shared_prefixes!r}")
        self.ansatz, self.optimizer, self.use_graph = ansatz, optimizer, bool(use_graph)
        self.shared_prefixes = shared_prefixes
        self.log_psi = log_psi if log_psi is not None else ansatz._log_psi_tokens
        # the default: ln|psi| and phi apart, the loss's gradient written by the local energies
        self._parts = ansatz._log_psi_parts if log_psi is None else None
        self.params = list(ansatz.parameters())
        self.sizes = [p.numel() for p in self.params]
        self.device = self.params[0].device
        self._key = None
        self._graph = None
        self._buf: dict = {}
        self._held = None  # what the buffers hold of S (`_Held`), while it is the same S
        self._kept = None  # the optimiser's state tensors, while it holds them (`_KeptState`)
        self.captures = 0  # graphs recorded so far (one per new bucket or new state tensors)
        self.replays = 0
        #: None, or a function queued on the device right after a replay, before the host
        #: waits for the stage's flags (which then waits for the stage alone): the Runner's
        #: `InferenceGraph.prefetch` of the next iteration's ln psi over S
        self.after_replay = None

    # ----------------------------------------------------------------------------- state
    def _state(self) -> tuple[list, list, float]:
        """AdamW moments (created as torch would on the first step) and the common step count.
        The optimiser's state tensors are gathered once and kept while it holds the same ones
        (`_KeptState`); the step counts (CPU scalars) are read through numpy views of them."""
        kept = self._kept
        if kept is None or not kept.holds(self.optimizer.state):
            kept = self._kept = _KeptState.of(self.optimizer.state, self.params)
        steps = [a.item() for a in kept.step_views]
        lo, hi = min(steps), max(steps)
        if lo != hi:
            raise ValueError("the parameters are at different AdamW step counts")
        return kept.exp_avg, kept.exp_avg_sq, lo

    def key_for(
        self, n: int, m: int, inner_steps: int, teacher: bool = False, prefixes: int = 0
    ) -> tuple:
        """The graph's identity: buckets (rows, pairs, prefixes: 0 without `shared_prefixes`),
        inner steps, AdamW constants, the tensors it reads, whether the inner steps carry a
        teacher."""
        g = self.optimizer.param_groups[0]
        state = self.optimizer.state
        ptrs = [p.data_ptr() for p in self.params]
        for p in self.params:
            st = state.get(p) or {}
            ptrs += [st[k].data_ptr() for k in ("exp_avg", "exp_avg_sq") if k in st]
        consts = (tuple(g["betas"]), float(g["eps"]), float(g["weight_decay"]))
        shared = bucket(prefixes) if self.shared_prefixes else 0
        csr = local_energy.kernels_for(self.device)
        return _Key(
            bucket(n), bucket(m), shared, int(inner_steps), consts, tuple(ptrs), bool(teacher), csr
        )

    # ------------------------------------------------------------------------------ run
    def run(
        self, configs, w, de, hdiag, pairs, inner_steps: int, teacher=None
    ) -> tuple[float, bool, bool]:
        """Run the stage over S = ``configs``; returns ``(loss, inner_ok, weights_finite)``.

        Args:
            configs: S (uint64 host array or int64 tensor), n rows.
            w: weights |psi|^2 / sum_S |psi|^2 (n,), real.
            de: E_loc(x) - E (n,), complex.
            hdiag: <x|H|x> over S (n,).
            pairs: (source row, target row, H value) of the off-diagonal H_SS entries.
            inner_steps: inner steps after the iteration's step.
            teacher: None, or (weight, c): the teacher's weight and vector on S (n,), added to
                every inner step (`cuscikit.nnqs.teacher.teacher_coefficients`).

        When the loss is not finite, an inner step met a non-finite local energy, or the
        weights end non-finite, the weights and the AdamW state are put back as they were and
        the step count is left alone; otherwise the step count advances by 1 + inner_steps.
        """
        exp_avg, exp_avg_sq, step = self._state()
        src, dst, val = pairs if pairs is not None else ((), (), ())
        src, dst, val = (torch.as_tensor(a).to(self.device) for a in (src, dst, val))
        m = src.shape[0]
        space = (configs, src, dst, val, hdiag)
        held = self._held
        if held is not None and not (held.buf is self._buf and held.holds(*space)):
            held = self._held = None
        if held is not None:  # S as the buffers hold it: only the per-stage values are written
            n = held.n
            key = self.key_for(n, m, inner_steps, teacher is not None, held.prefixes)
            if not self._fits(key):  # new buffers (other inner steps, teacher or state)
                held = self._held = None
        if held is None:
            n, prefixes = self._write_space(*space, inner_steps, teacher, exp_avg, exp_avg_sq)
            if self.reuse_inputs:
                self._held = _Held.of(self._buf, n, prefixes, *space)
        b = self._buf
        dev = self.device
        b["w0"][:n].copy_(torch.as_tensor(w).to(dev))  # the padding rows stay 0
        b["de0"][:n].copy_(torch.as_tensor(de).to(dev))
        b["lr"].fill_(float(self.optimizer.param_groups[0]["lr"]))
        b["step"].fill_(step)
        if teacher is not None:
            b["tw"].fill_(float(teacher[0]))
            b["tc"][:n].copy_(torch.as_tensor(teacher[1]).to(dev))
        if self.use_graph:
            if self._graph is None:
                self._capture()
            self._graph.replay()
            # A replay writes the weights behind autograd's back: their version counters stay
            # where they were, and a cache keyed on them (the fused inference's packed weights)
            # would keep serving the weights of before. Count the write as autograd would.
            for p in self.params:
                increment_version(p)
        else:
            self._body(apply=True)
        self.replays += 1
        loss, bad, finite = self._flags()
        ok = bad == 0 and finite == 1 and loss == loss and abs(loss) != float("inf")
        with torch.no_grad():
            if not ok:  # the moments were not written yet: only the weights go back
                torch._foreach_copy_(self.params, b["bk_p"])
            else:
                torch._foreach_copy_(exp_avg, b["m_views"])
                torch._foreach_copy_(exp_avg_sq, b["v_views"])
                for a in self._kept.step_views:  # the step counts, through their numpy views
                    a += 1 + inner_steps
        return loss, bad == 0, finite == 1

    def _flags(self) -> list[float]:
        """(loss, bad, finite) of the stage just queued. With `after_replay` on a CUDA device
        they are copied to pinned memory first, and the host waits for that copy alone, not
        for what `after_replay` queues after it."""
        flags = self._buf["flags"]
        if self.after_replay is None:
            return flags.tolist()
        read = read_later(flags)
        try:
            self.after_replay()
        except Exception as exc:  # noqa: BLE001 - the stage is applied: its result stands
            self.after_replay = None
            warnings.warn(f"after the recorded stage: {exc}", RuntimeWarning, stacklevel=3)
        return read()

    def _write_space(
        self, configs, src, dst, val, hdiag, inner_steps, teacher, exp_avg, exp_avg_sq
    ) -> tuple[int, int]:
        """Write what depends on S alone into the buffers (allocated anew when the key does
        not fit them): the tokens (and prefix tree) padded by row 0, the row mask, the
        diagonal and the pairs, by row with a row pointer for `local_energy`'s kernels
        (``key.csr``) or else in `spread_rows` order; the per-stage rows zeroed. Returns
        (rows, prefixes: 0 without `shared_prefixes`)."""
        tokens = self.ansatz.tokens(configs)
        n, m = tokens.shape[0], src.shape[0]
        tree = None
        if self.shared_prefixes:  # the padding rows repeat row 0: no prefix of their own
            from cuscikit.nnqs.ansatz import prefix_tree  # looked up at call time (tests spy)

            tree = prefix_tree(tokens)
        key = self.key_for(n, m, inner_steps, teacher is not None, len(tree.first) if tree else 0)
        if not self._fits(key):
            if key.csr:  # room for a quarter more pairs: the kernels read a row's pairs only
                key = key._replace(pairs=bucket(m + m // 4))
            self._allocate(key, tokens.shape[1], exp_avg, exp_avg_sq)
        b = self._buf
        n_cap = self._key.rows  # the recording's bucket: key's, or a larger one it fits
        b["tok"][:n].copy_(tokens)
        b["tok"][n:].copy_(tokens[:1].expand(n_cap - n, -1))
        if tree is not None:
            b["node"][:n].copy_(tree.node)
            b["node"][n:].copy_(tree.node[:1].expand(n_cap - n, -1))
            # a padding prefix reads row 0's input and is read by no row: no gradient
            b["first"].zero_()[: len(tree.first)].copy_(tree.first)
        b["mask"].zero_()[:n] = 1
        b["hd"].zero_()[:n].copy_(torch.as_tensor(hdiag).to(self.device))
        if self._key.csr:  # the pairs in rows, for `local_energy`'s kernels
            rowptr, src, dst, val = local_energy.csr(src, dst, val, n_cap)
            b["rowptr"].copy_(rowptr)
        else:
            order = spread_rows(src, n_cap)  # no two threads of a warp add into one row
            src, dst, val = src[order], dst[order], val[order]
        b["src"].zero_()[:m].copy_(src)
        b["dst"].zero_()[:m].copy_(dst)
        b["val"].zero_()[:m].copy_(val)
        for name in ("w0", "de0", "tc"):  # the rows past n stay 0 while these inputs are held
            b[name].zero_()
        return n, len(tree.first) if tree is not None else 0

    def _fits(self, key) -> bool:
        """Whether the recorded graph can take a run of `key`: the same inner steps,
        constants, tensors and teacher, and buckets at least as large as `key`'s but at most
        twice (a space whose size moves back and forth across a bucket's edge keeps its
        recording, padded a little more, instead of recording again every iteration)."""
        if self._key is None or not self._buf or self._key[_BUCKETS:] != key[_BUCKETS:]:
            return False
        pairs = zip(key[:_BUCKETS], self._key[:_BUCKETS], strict=True)
        return all(want <= have <= 2 * want for want, have in pairs)

    def _allocate(self, key, norb, exp_avg, exp_avg_sq) -> None:
        self._graph = None  # the old graph's memory goes with it
        self._buf = {}
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        n_cap, m_cap, p_cap, n_inner = key.rows, key.pairs, key.prefixes, key.inner
        dev, rdt, pdt = self.device, torch.float64, self.params[0].dtype
        c128, long = torch.complex128, torch.long
        total = sum(self.sizes)

        def flat():  # a buffer over all parameters and its per-parameter views
            buf = torch.zeros(total, dtype=pdt, device=dev)
            parts = zip(buf.split(self.sizes), self.params, strict=True)
            return buf, [v.view_as(p) for v, p in parts]

        (m, m_views), (v, v_views), (u, u_views) = flat(), flat(), flat()
        self._buf = {
            "tok": torch.zeros((n_cap, norb), dtype=long, device=dev),
            # the prefix tree of S (`shared_prefixes`): rows' prefixes, prefixes' first rows
            "node": torch.zeros((n_cap, norb), dtype=long, device=dev),
            "first": torch.zeros(p_cap, dtype=long, device=dev),
            "mask": torch.zeros(n_cap, dtype=rdt, device=dev),
            "w0": torch.zeros(n_cap, dtype=rdt, device=dev),
            "de0": torch.zeros(n_cap, dtype=c128, device=dev),
            "hd": torch.zeros(n_cap, dtype=rdt, device=dev),
            "src": torch.zeros(m_cap, dtype=long, device=dev),
            "rowptr": torch.zeros(n_cap + 1, dtype=long, device=dev),  # with key.csr
            "dst": torch.zeros(m_cap, dtype=long, device=dev),
            "val": torch.zeros(m_cap, dtype=c128, device=dev),
            "lr": torch.zeros((), dtype=rdt, device=dev),
            "step": torch.zeros((), dtype=rdt, device=dev),
            # the AdamW steps of one stage are step + 1 .. step + 1 + inner_steps
            "ahead": torch.arange(1, n_inner + 2, dtype=rdt, device=dev),
            "flags": torch.zeros(3, dtype=rdt, device=dev),
            # the teacher's weight and vector (padded with 0), read only by a teacher's graph
            "tw": torch.zeros((), dtype=rdt, device=dev),
            "tc": torch.zeros(n_cap, dtype=rdt, device=dev),
            "exp_avg": exp_avg,
            "exp_avg_sq": exp_avg_sq,
            # flat AdamW: moments, gradient, denominator and update over all parameters
            "m": m,
            "m_views": m_views,
            "v": v,
            "v_views": v_views,
            "g": torch.zeros(total, dtype=pdt, device=dev),
            "d": torch.zeros(total, dtype=pdt, device=dev),
            "u": u,
            "u_views": u_views,
            "bk_p": [torch.empty_like(p) for p in self.params],
        }
        self._key = key

    def _capture(self) -> None:
        """Warm up (gradients only, nothing applied) on a side stream, then record. A warm-up
        runs the iteration's step and at most one inner step: the other inner steps launch the
        same kernels on the same buffers, so running them too only made a recording slower
        (twice 17 passes instead of twice 2 with the teacher's 16 inner steps)."""
        self._graph, _ = record(
            lambda: self._body(apply=True),
            self.device,
            warm_up=lambda: self._body(apply=False, inner=min(1, self._key.inner)),
        )
        self.captures += 1

    # ----------------------------------------------------------------------------- body
    def _grads(self, outputs, grad_outputs=None) -> list[torch.Tensor]:
        # every parameter has a gradient here (an unused one is an error, not a zero step)
        grads = list(torch.autograd.grad(outputs, self.params, grad_outputs))
        aside.join(self.device)  # the gradients computed on the side streams
        return grads

    def _scalars(self) -> dict:
        """The per-step AdamW scalars of the whole stage, computed once, in the parameters'
        dtype as torch's kernels take its Python-float ones: row k is step step + 1 + k."""
        b, g = self._buf, self.optimizer.param_groups[0]
        beta1, beta2 = g["betas"]
        pdt = self.params[0].dtype
        lr, steps = b["lr"], b["step"] + b["ahead"]
        bias1 = 1 - torch.pow(beta1, steps)
        # AdamW's kernel takes the step's constants as torch's kernels take Python floats, in
        # the parameters' dtype (filled on the device: no copy from the host in a recording)
        consts = torch.empty(4 if ADAMW_KERNEL else 0, dtype=pdt, device=lr.device)
        if ADAMW_KERNEL:
            for i, c in enumerate((1 - beta1, beta2, 1 - beta2, float(g["eps"]))):
                consts[i].fill_(c)
        return {
            "decay": (1 - lr * float(g["weight_decay"])).to(pdt),
            "bias2_sqrt": torch.sqrt(1 - torch.pow(beta2, steps)).to(pdt),
            "rate": (lr / bias1).to(pdt),
            "consts": consts,
        }

    def _adamw(self, grads: list[torch.Tensor], k: int, sc: dict) -> None:
        """AdamW step ``k`` of the stage (`torch.optim.AdamW`'s arithmetic, not amsgrad) on flat
        buffers: one kernel per operation over all parameters instead of one per tensor group.
        The moments live in the flat buffers for the whole stage; the host copies them into
        the optimiser's state after a good replay."""
        b, g = self._buf, self.optimizer.param_groups[0]
        beta1, beta2 = g["betas"]
        eps, wd = float(g["eps"]), float(g["weight_decay"])
        m, v, grad, d, u = b["m"], b["v"], b["g"], b["d"], b["u"]
        torch.cat([t.reshape(-1) for t in grads], out=grad)
        if wd:
            torch._foreach_mul_(self.params, sc["decay"])
        if not _adamw_moments(m, v, grad, u, sc, k):
            m.lerp_(grad, 1 - beta1)
            v.mul_(beta2)
            v.addcmul_(grad, grad, value=1 - beta2)
            torch.sqrt(v, out=d)
            d.div_(sc["bias2_sqrt"][k])
            d.add_(eps)
            torch.div(m, d, out=u)
            u.mul_(sc["rate"][k])
        torch._foreach_sub_(self.params, b["u_views"])

    def _body(self, apply: bool, inner: int | None = None) -> None:
        """The recorded work; with ``apply=False`` only the gradients (warm-up), with `inner`
        inner steps instead of the key's. The passes' parameter gradients run beside them on
        side streams and their phase MLP on another (`aside`; `_grads` joins), and what they
        compute from S's tokens alone is computed once (`reuse_token_work`)."""
        if apply and inner is not None and inner != self._key.inner:
            raise ValueError("a stage that applies its steps runs the key's inner steps")
        with aside.gradients_aside(self.device), reuse_token_work():
            self._steps(apply, self._key.inner if inner is None else int(inner))

    def _steps(self, apply: bool, n_inner: int) -> None:
        """The passes. With the default ln psi each pass gives ln|psi| and phi apart and the
        loss 2 Re sum conj(ln psi) T enters autograd as its gradient (2 Re T, 2 Im T) with
        respect to them, written by `local_energy.terms` (the numbers autograd forms through
        the complex loss, without its dozen kernels each way; only the phase MLP's last bias
        sums its column in another order); with a caller's ``log_psi``, through the complex
        loss."""
        b = self._buf
        c128 = torch.complex128
        tok, mask, hd = b["tok"], b["mask"], b["hd"]
        tree = PrefixTree(b["node"], b["first"]) if self.shared_prefixes else None
        parts = self._parts

        def forward():  # (autograd's outputs, ln psi for the local energies)
            with torch.enable_grad():
                if parts is not None:
                    amp, phase = parts(tok, tree)
                    return (amp, phase), (amp.detach(), phase.detach())
                lp = (self.log_psi(tok) if tree is None else self.log_psi(tok, tree)).to(c128)
                return lp, lp.detach()

        def complex_lp(lp):
            return torch.complex(*lp).to(c128) if parts is not None else lp

        sc = None
        with torch.no_grad():
            if apply:
                torch._foreach_copy_(b["bk_p"], self.params)
                torch.cat([t.reshape(-1) for t in b["exp_avg"]], out=b["m"])
                torch.cat([t.reshape(-1) for t in b["exp_avg_sq"]], out=b["v"])
                sc = self._scalars()
        # The iteration's step: the loss with the pipeline's weights and local energies.
        out0, lp0 = forward()
        if parts is not None:
            with torch.no_grad():  # d loss / d (ln|psi|, phi) = 2 w (Re, Im) (E_loc - E)
                g0 = (2.0 * b["w0"])[:, None] * torch.view_as_real(b["de0"])
                g0 = out0[0].new_empty((2, tok.shape[0])).copy_(g0.t())
            grads = self._grads(out0, (g0[0], g0[1]))
        else:
            with torch.enable_grad():
                grads = self._grads(2.0 * (b["w0"] * (out0.conj() * b["de0"])).real.sum())
        with torch.no_grad():
            if apply:
                self._adamw(grads, 0, sc)
        bad = torch.zeros((), dtype=torch.bool, device=tok.device)
        rowptr = b["rowptr"] if self._key.csr else None
        pairs = (b["src"], b["dst"], b["val"])
        # with a teacher, its pull added to the energy's coefficients
        teach = (b["tw"], b["tc"]) if self._key.teacher else None
        for k in range(n_inner):
            out, lp = forward()
            with torch.no_grad():  # psi, the local energies and the loss's coefficients
                g = None
                if parts is not None:
                    g = torch.empty((2, tok.shape[0]), dtype=lp[0].dtype, device=tok.device)
                _, coef, _, flag = local_energy.terms(lp, mask, hd, pairs, rowptr, teach, g)
                bad = bad | flag
            if parts is not None:
                grads = self._grads(out, (g[0], g[1]))
            else:
                with torch.enable_grad():
                    grads = self._grads(2.0 * (out.conj() * coef).real.sum())
            with torch.no_grad():
                if apply:
                    self._adamw(grads, 1 + k, sc)
        with torch.no_grad():
            loss0 = 2.0 * (b["w0"] * (complex_lp(lp0).conj() * b["de0"])).real.sum()
            zeros = torch._foreach_mul(self.params, 0.0)  # 0 where finite, NaN elsewhere
            finite = torch.isfinite(torch.stack(torch._foreach_norm(zeros))).all()
            flags = (loss0, bad.to(loss0.dtype), finite.to(loss0.dtype))
            b["flags"].copy_(torch.stack(flags))


def _adamw_moments(m, v, grad, u, sc: dict, k: int) -> bool:
    """AdamW's moments and update of step ``k`` of the stage over the flat buffers in one
    Triton kernel (a GPU, or Triton's interpreter): the eight operations of `_adamw`'s torch
    form, in the same order and each rounded as there (square root and divisions correctly
    rounded; a multiplication and an addition may fuse into one rounding). False where it does
    not run (``ADAMW_KERNEL`` off, no Triton, a CPU tensor, a kernel that failed: warned once),
    so the caller runs the torch form."""
    global _adamw_failed
    if not ADAMW_KERNEL or triton is None or _adamw_failed is not None:
        return False
    if not (m.is_cuda or interpreting()):
        return False
    n = m.numel()
    try:
        _adamw_kernel[(triton.cdiv(n, _ADAMW_BLOCK),)](
            grad,
            m,
            v,
            u,
            sc["consts"],
            sc["bias2_sqrt"],
            sc["rate"],
            k,
            n,
            BLOCK=_ADAMW_BLOCK,
            F64=m.dtype == torch.float64,
        )
    except Exception as exc:  # noqa: BLE001 - a Triton that cannot build it here: torch's form
        _adamw_failed = f"{type(exc).__name__}: {exc}"
        warnings.warn(
            f"the AdamW kernel failed ({_adamw_failed}); using torch's operations",
            RuntimeWarning,
            stacklevel=3,
        )
        return False
    return True


if triton is not None:

    @triton.jit(do_not_specialize=["k", "n"])
    def _adamw_kernel(
        g_ptr,
        m_ptr,
        v_ptr,
        u_ptr,
        c_ptr,
        b2_ptr,
        rate_ptr,
        k,
        n,
        BLOCK: tl.constexpr,
        F64: tl.constexpr,
    ):
        """m = lerp(m, g, 1 - beta1); v = v beta2 + (1 - beta2) g g; u = m / (sqrt(v) /
        sqrt(1 - beta2^t) + eps) * lr / (1 - beta1^t), with the constants at c_ptr (1 - beta1,
        beta2, 1 - beta2, eps) and step k's bias terms at b2_ptr[k] and rate_ptr[k]."""
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        ok = i < n
        g = tl.load(g_ptr + i, mask=ok, other=0.0)
        m = tl.load(m_ptr + i, mask=ok, other=0.0)
        v = tl.load(v_ptr + i, mask=ok, other=0.0)
        w1, beta2, w2, eps = (
            tl.load(c_ptr),
            tl.load(c_ptr + 1),
            tl.load(c_ptr + 2),
            tl.load(c_ptr + 3),
        )
        m = m + w1 * (g - m)  # torch's lerp for a weight below 0.5
        v = v * beta2
        v = v + w2 * g * g
        if F64:  # float64's square root and division round correctly as written
            d = tl.sqrt(v) / tl.load(b2_ptr + k) + eps
            u = m / d * tl.load(rate_ptr + k)
        else:  # float32's need asking for it (the defaults approximate)
            d = tl.div_rn(tl.sqrt_rn(v), tl.load(b2_ptr + k)) + eps
            u = tl.div_rn(m, d) * tl.load(rate_ptr + k)
        tl.store(m_ptr + i, m, mask=ok)
        tl.store(v_ptr + i, v, mask=ok)
        tl.store(u_ptr + i, u, mask=ok)
else:  # pragma: no cover - depends on the installation
    _adamw_kernel = None


class InferenceGraph:
    """ln psi without gradient through a recorded forward pass per size bucket (CUDA).

    Inputs are padded to `bucket` (rows repeating the first configuration) and the result is
    cut back, so the values are those of the eager pass up to the rounding of a different batch
    size. The last ``max_graphs`` buckets are kept.

    Args:
        ansatz: a `cuscikit.Ansatz` on a CUDA device.
        max_graphs: recorded buckets kept at once.

    Example:
        >>> import torch
        >>> from cuscikit import Ansatz
        >>> psi = Ansatz(4, (2, 1), seed=0, device="cuda")  # doctest: +SKIP
        >>> InferenceGraph(psi)(psi.sample(100)[0]).shape  # doctest: +SKIP
        torch.Size([...])
    """

    def __init__(self, ansatz, max_graphs: int = 2) -> None:
        if not (hasattr(ansatz, "tokens") and hasattr(ansatz, "_log_psi_tokens")):
            raise ValueError("InferenceGraph needs a cuscikit Ansatz (tokens, _log_psi_tokens)")
        self.ansatz, self.max_graphs = ansatz, int(max_graphs)
        self._graphs: dict[int, tuple] = {}
        self._held = None  # the input of the last call and its recording (`_Held`)
        self._ready = None  # (recording, the parameters' versions) of a `prefetch`
        self.captures = 0
        self.prefetched = 0  # calls answered by a prefetch

    def _versions(self) -> tuple:
        return tuple(p._version for p in self.ansatz.parameters())

    def prefetch(self) -> bool:
        """Replay the recording of the last call's input now, so that the next call with that
        input returns its result without replaying, if the parameters have not changed since
        (their version counters: an optimiser step, a `load_state_dict` or any in-place write
        through autograd's tensors). The Runner calls it right after the recorded optimiser
        stage, so that the device computes ln psi over the next iteration's S while the host
        finishes the iteration. Returns whether it replayed."""
        held = self._held
        if held is None or self._graphs.get(bucket(held.n)) is not held.buf:
            return False
        held.buf[0].replay()
        self._ready = (held.buf, self._versions())
        return True

    def __call__(self, configs) -> torch.Tensor:
        """ln psi (n,) of configurations (as `Ansatz.log_psi`), without gradient. The tensor
        of the last call, unchanged, is not written again (the iteration's S while it stays),
        nor computed again after a `prefetch` with the same parameters."""
        held, ready, self._ready = self._held, self._ready, None
        if held is not None and held.holds(configs):
            cap = bucket(held.n)
            if self._graphs.get(cap) is held.buf:
                self._graphs[cap] = self._graphs.pop(cap)  # most recent last
                graph, _, out = held.buf
                if ready is not None and ready[0] is held.buf and ready[1] == self._versions():
                    self.prefetched += 1
                else:
                    graph.replay()
                return out[: held.n].clone()
        self._held = None
        tokens = self.ansatz.tokens(configs)
        n = tokens.shape[0]
        if n == 0:
            with torch.no_grad():
                return self.ansatz._log_psi_tokens(tokens)
        cap = bucket(n)
        entry = self._graphs.pop(cap, None)
        if entry is None:
            entry = self._capture(cap, tokens)
        self._graphs[cap] = entry  # most recent last
        graph, tok, out = entry
        tok[:n].copy_(tokens)
        tok[n:].copy_(tokens[:1].expand(cap - n, -1))
        if torch.is_tensor(configs):
            self._held = _Held.of(entry, n, 0, configs)
        graph.replay()
        return out[:n].clone()

    def _capture(self, cap: int, tokens: torch.Tensor) -> tuple:
        while len(self._graphs) >= self.max_graphs:
            self._graphs.pop(next(iter(self._graphs)))
        tok = tokens[:1].expand(cap, -1).clone()
        with torch.no_grad():
            graph, out = record(lambda: self.ansatz._log_psi_tokens(tok), tokens.device)
        self.captures += 1
        return graph, tok, out
