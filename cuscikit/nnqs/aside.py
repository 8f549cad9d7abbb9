"""Parameter gradients beside the backward pass, on side CUDA streams (and the phase MLP on a
stream of its own).

In the backward pass of a linear layer only the input gradient ``dy @ W`` is on the path the
rest of the pass waits for; the weight and bias gradients (``dy^T @ x`` and the column sums of
``dy``) are read only by the optimiser, after the whole pass. On a small system (N2/STO-3G: 19,200
token rows of width 32) each of these is a kernel of a few microseconds that keeps the GPU
mostly idle, so running them one after another on one stream makes the pass a chain of small
kernels. Within `gradients_aside`, the training pass's linear layers (`linear`), embeddings
(`embed`) and LayerNorms (`cuscikit.nnqs.fused_ops.layer_norm`) fork their parameter gradients
onto side streams, layer by layer in turn over `GRADIENT_STREAMS` of them (on one side stream
the gradients of the pass's 20-odd layers ran one after another and ended well after the pass's
own backward work); `join` makes the current stream wait for them (in a recorded CUDA graph the
forks and the join become parallel branches).

With ``PHASE`` as well, the pass's phase MLP (`branch_stream`, `branch`, `merge`) runs on a
stream of its own, forward and backward (autograd runs a backward function on the stream of its
forward), beside the transformer: the two parts of ln psi meet only in the complex sum.

Only for callers that take the gradients with `torch.autograd.grad` and call `join` before
reading them (`cuscikit.nnqs.graphs.OptimizerGraph`): a ``.backward()`` would accumulate the
gradients on the current stream without waiting. Tensors read on the side streams are held
until `join`, so their memory is not reused while it is still being read. The arithmetic is
that of `torch.nn.functional.linear` and `torch.nn.functional.embedding` (the same products
and sums; the token embedding's gradient as a one-hot product instead of a sort, so float64
agrees to rounding). Both are on by default: on an H100 they took the default N2/STO-3G
iteration from 40.60 to 35.95 ms and its recorded stage (five passes) from 11.31 to 9.57 ms
(docs/performance.md, "Parameter gradients beside the pass"), with the gradients on one side
stream; four gradient streams took the iteration after the teacher from 10.80 to 9.10 ms on
another H100 (docs/performance.md, "The parameter gradients on four streams").
``ENABLED = False`` and ``PHASE = False`` keep everything on one stream.

The side streams, the tensors they hold and the streams waiting for a join are per device, as
the autograd engine runs CUDA backward functions on a thread of its own: passes on one device
inside `gradients_aside` take turns (a lock per device), so two recorded stages on one GPU in
two threads do not join each other's work.

Example (needs a CUDA GPU):
    >>> import torch
    >>> x = torch.randn(100, 32, device="cuda", requires_grad=True)     # doctest: +SKIP
    >>> w = torch.randn(8, 32, device="cuda", requires_grad=True)       # doctest: +SKIP
    >>> with gradients_aside():                                          # doctest: +SKIP
    ...     gx, gw = torch.autograd.grad(linear(x, w, None).sum(), (x, w))
    ...     join(x.device)
    >>> bool(torch.allclose(gw, torch.ones(100, 8, device="cuda").t() @ x))  # doctest: +SKIP
    True
"""

from __future__ import annotations

import contextlib
import threading

import torch
import torch.nn.functional as F

from cuscikit.nnqs import products

__all__ = [
    "ENABLED",
    "GRADIENT_STREAMS",
    "PHASE",
    "branch",
    "branch_stream",
    "column_sums",
    "embed",
    "fork",
    "gradients_aside",
    "join",
    "linear",
    "merge",
    "mlp",
    "stream_for",
]

#: True (default): the recorded stage's parameter gradients run on side streams.
ENABLED = True
#: Side streams the parameter gradients take in turn: each layer of a pass (linear layer,
#: embedding, LayerNorm) gets the next one, so the gradients of consecutive layers run side by
#: side instead of one after another behind the pass (1: all on one stream).
GRADIENT_STREAMS = 4
#: True (default): the recorded stage's phase MLP runs on a stream of its own, beside the
#: transformer.
PHASE = True
# .depth: nesting of `gradients_aside` in this thread; .devices: the devices its passes used;
# .off: inside a `branch` (its work keeps to the branch's stream)
_local = threading.local()
# the side streams of each device, by role ("gradients", "phase")
_streams: dict[tuple[torch.device, str], torch.cuda.Stream] = {}
# per device: tensors read on its side streams, kept until its `join` (ranks in threads each
# have their own device; the autograd engine runs CUDA backward functions on its own threads),
# and the side streams forked since its last `join`
_held: dict[torch.device, list[torch.Tensor]] = {}
_pending: dict[torch.device, list[torch.cuda.Stream]] = {}
_lock = threading.Lock()
_device_locks: dict[torch.device, threading.RLock] = {}  # one stage at a time on a device


@contextlib.contextmanager
def gradients_aside(device: torch.device | str | None = None):
    """Within (in this thread): `stream_for` gives a CUDA training pass's layers the gradient
    streams (see the module). The caller calls `join` before reading the gradients; the
    outermost exit joins every device whose side streams this thread's passes were given.
    With a CUDA ``device``, other threads' contexts on that device wait until this one is
    left."""
    held = contextlib.nullcontext()
    if device is not None and torch.device(device).type == "cuda":
        dev = torch.device(device)
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        with _lock:
            held = _device_locks.setdefault(dev, threading.RLock())
    with held:
        depth = getattr(_local, "depth", 0)
        if not depth:
            _local.devices = set()
            _local.turn = 0  # every stage hands out the gradient streams in the same order
        _local.depth = depth + 1
        try:
            yield
        finally:
            _local.depth = depth
            if not depth:
                for dev in _local.devices:
                    join(dev)


def _side(x: torch.Tensor, switch: bool, role: str) -> torch.cuda.Stream | None:
    """The ``role`` side stream of ``x``'s device for a pass inside `gradients_aside` (switch
    on, a CUDA tensor, a gradient being recorded, not inside a `branch` or `torch.compile`);
    None otherwise."""
    if not (switch and getattr(_local, "depth", 0) and x.is_cuda and torch.is_grad_enabled()):
        return None
    if getattr(_local, "off", False) or torch.compiler.is_compiling():
        return None
    s = _streams.get((x.device, role))
    if s is None:
        with _lock:
            s = _streams.setdefault((x.device, role), torch.cuda.Stream(device=x.device))
    _local.devices.add(x.device)
    return s


def stream_for(x: torch.Tensor) -> torch.cuda.Stream | None:
    """The side stream for the parameter gradients of a layer of a pass over ``x`` inside
    `gradients_aside` (``ENABLED``, a CUDA tensor, a gradient being recorded, not inside a
    `branch` or `torch.compile`), the next of `GRADIENT_STREAMS` in turn; None otherwise."""
    turn = getattr(_local, "turn", 0)
    s = _side(x, ENABLED, f"gradients {turn}")
    if s is not None:
        _local.turn = (turn + 1) % max(1, int(GRADIENT_STREAMS))
    return s


def fork(stream: torch.cuda.Stream | None, *tensors: torch.Tensor):
    """``stream`` waits for the work queued so far on the current stream, and ``tensors``
    (read on ``stream``) are held until `join`; returns the context that queues work on
    ``stream`` (a null context for ``stream=None``: the work stays on the current stream).
    Fork first, then queue the pass's own work, then the parameter gradients in the context."""
    if stream is None:
        return contextlib.nullcontext()
    stream.wait_stream(torch.cuda.current_stream(stream.device))
    with _lock:
        _held.setdefault(stream.device, []).extend(tensors)
        pending = _pending.setdefault(stream.device, [])
        if not any(p is stream for p in pending):
            pending.append(stream)
    return torch.cuda.stream(stream)


def join(device: torch.device | str) -> None:
    """The current stream of ``device`` waits for the work queued on its side streams since
    the last join (parameter gradients, a phase branch); the tensors they read are released.
    A no-op on a device without such work."""
    dev = torch.device(device)
    if dev.type != "cuda" or not _pending:
        return
    if dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    with _lock:
        pending = _pending.pop(dev, [])
    here = torch.cuda.current_stream(dev)
    for s in pending:  # only streams forked since: a wait on one outside a recording is invalid
        here.wait_stream(s)
    with _lock:
        _held.pop(dev, None)


def branch_stream(x: torch.Tensor) -> torch.cuda.Stream | None:
    """The stream for a branch of a pass over ``x`` (the phase MLP) inside `gradients_aside`
    with ``PHASE``; None otherwise (the branch then stays on the current stream)."""
    return _side(x, PHASE, "phase")


@contextlib.contextmanager
def branch(stream: torch.cuda.Stream | None, *tensors: torch.Tensor):
    """Queue the forward work of a branch of the pass on ``stream`` after the work queued so
    far (its backward follows it there); ``tensors`` are held until `join`. Within, layers
    keep their parameter gradients on the branch's own stream. `merge` brings the branch's
    result back. ``stream=None``: nothing changes.

    Example (the phase MLP beside the amplitude, `cuscikit.Ansatz`):
        >>> side = branch_stream(tokens)                          # doctest: +SKIP
        >>> with branch(side, tokens):                            # doctest: +SKIP
        ...     phase = ansatz.phase(tokens)
        >>> amp = ansatz.log_amplitude(tokens)                    # doctest: +SKIP
        >>> merge(side, phase)                                    # doctest: +SKIP
    """
    if stream is None:
        yield
        return
    saved = getattr(_local, "off", False)
    with fork(stream, *tensors):
        _local.off = True
        try:
            yield
        finally:
            _local.off = saved


def merge(stream: torch.cuda.Stream | None, *results: torch.Tensor) -> None:
    """The current stream waits for the forward work of `branch` on ``stream``, whose
    ``results`` it reads next (held until `join`). A no-op for ``stream=None``."""
    if stream is None:
        return
    torch.cuda.current_stream(stream.device).wait_stream(stream)
    with _lock:
        _held.setdefault(stream.device, []).extend(results)


# (device, dtype, rows) -> a ones vector of that many rows, made once outside any recording
_ONES_ROWS = 1 << 20
_ones: dict[tuple[torch.device, torch.dtype, int], torch.Tensor] = {}


def column_sums(t: torch.Tensor) -> torch.Tensor:
    """The sums over the rows of ``t`` (m, n): (n,), as the product of a ones vector with
    ``t`` (one cuBLAS product). For the tall, narrow gradients of a pass on a GPU (19,200 rows
    of 32-128 columns) it takes 4.4-6.5 us on an H100 where ``t.sum(0)`` takes 7.7-22.6 us
    (``tools/grad_sums_bench.py``); the same sums in another order. Above `_ONES_ROWS` rows
    torch's reduction (which has rows enough to spread by then), so the kept vectors stay small.

    Example:
        >>> column_sums(torch.arange(6.0).reshape(3, 2)).tolist()
        [6.0, 9.0]
    """
    m = t.shape[0]
    if m > _ONES_ROWS:
        return t.sum(0)
    key = (t.device, t.dtype, m)
    ones = _ones.get(key)
    if ones is None:
        ones = torch.ones(m, dtype=t.dtype, device=t.device)
        if not (t.is_cuda and torch.cuda.is_current_stream_capturing()):
            if t.is_cuda:  # filled before any other stream reads it
                torch.cuda.current_stream(t.device).synchronize()
            _ones[key] = ones
    return ones @ t


def _with_products(fn, tc: bool):
    """``fn(tc)``; where the products' kernel fails to build or run, the products turned off
    (`cuscikit.nnqs.products.turn_off`) and ``fn(False)``, torch's."""
    try:
        return fn(tc)
    except Exception as exc:  # noqa: BLE001 - a kernel that does not build: torch's
        if not tc:
            raise
        products.turn_off(exc)
        return fn(False)


def _weight_grads(dy: torch.Tensor, x: torch.Tensor, want_w: bool, want_b: bool, tc: bool):
    """A linear layer's ``(dy^T x, dy's column sums)``, None where not wanted: with ``tc`` the
    products' kernel (the bias's sums from the same loads), else torch's."""
    if want_w and tc:
        return products.weight_grad(dy, x, want_b)
    return (dy.t().mm(x) if want_w else None, column_sums(dy) if want_b else None)


class _Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, stream, tc):
        x2 = x.reshape(-1, x.shape[-1])

        def product(on: bool) -> torch.Tensor:
            if on:
                return products.mm(x2, weight.t(), bias)
            return x2.mm(weight.t()) if bias is None else torch.addmm(bias, x2, weight.t())

        y = _with_products(product, tc)
        ctx.save_for_backward(x2, weight)
        ctx.stream, ctx.shape, ctx.has_bias = stream, x.shape, bias is not None
        ctx.tc = tc and products.usable()
        return y.view(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, dy):
        x2, weight = ctx.saved_tensors
        dy2 = dy.reshape(-1, dy.shape[-1])
        want_x, want_w, want_b = ctx.needs_input_grad[:3]
        want_b = want_b and ctx.has_bias
        side = fork(ctx.stream if (want_w or want_b) else None, x2, dy2)

        def grads(tc: bool):
            dx = None
            if want_x:
                dx = (products.mm(dy2, weight) if tc else dy2.mm(weight)).view(ctx.shape)
            with side:
                dw, db = _weight_grads(dy2, x2, want_w, want_b, tc)
            return dx, dw, db, None, None

        return _with_products(grads, ctx.tc and products.usable())


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """`torch.nn.functional.linear`, with the weight and bias gradients on a side stream
    inside `gradients_aside` (`stream_for`)."""
    s = stream_for(x)
    tc = products.applies(x, weight)
    if s is None and not tc:
        return F.linear(x, weight, bias)
    return _Linear.apply(x, weight, bias, s, tc)


class _GeluMLP(torch.autograd.Function):
    """Linear layers with a GELU between each two (``x -> L0 -> gelu -> L1 -> ...``) through
    the tensor-core products (`cuscikit.nnqs.products`), each GELU in the kernel of the layer
    before it (forward) and of the layer after it (the input gradient), the layers' weight
    and bias gradients on their side streams as `linear`'s."""

    @staticmethod
    def forward(ctx, x, streams, *wb):
        n = len(wb) // 2
        h = x.reshape(-1, x.shape[-1])
        ins, pre = [h], []
        for i in range(n):
            w, b = wb[2 * i], wb[2 * i + 1]
            if i < n - 1:
                u, h = products.mm_gelu(h, w.t(), b)
                ins.append(h)
                pre.append(u)
            else:
                h = products.mm(h, w.t(), b)
        ctx.save_for_backward(*ins, *pre, *wb[::2])
        ctx.n, ctx.streams, ctx.shape = n, streams, x.shape
        ctx.has_bias = [b is not None for b in wb[1::2]]
        return h.view(*x.shape[:-1], h.shape[-1])

    @staticmethod
    def backward(ctx, dout):
        return _with_products(lambda tc: _GeluMLP._backward(ctx, dout, tc), products.usable())

    @staticmethod
    def _backward(ctx, dout, tc: bool):
        n = ctx.n
        saved = ctx.saved_tensors
        ins, pre, ws = saved[:n], saved[n : 2 * n - 1], saved[2 * n - 1 :]
        need = ctx.needs_input_grad
        g = dout.reshape(-1, dout.shape[-1])
        grads: list = [None] * (2 * n)
        dx = None
        for i in reversed(range(n)):
            want_w, want_b = need[2 + 2 * i], need[3 + 2 * i] and ctx.has_bias[i]
            side = fork(ctx.streams[i] if (want_w or want_b) else None, ins[i], g)
            g_in = None
            if i > 0:  # back through the GELU before layer i
                if tc:
                    g_in = products.mm_gelu_grad(g, ws[i], pre[i - 1])
                else:
                    g_in = torch.ops.aten.gelu_backward(g.mm(ws[i]), pre[i - 1])
            elif need[0]:
                dx = (products.mm(g, ws[0]) if tc else g.mm(ws[0])).view(ctx.shape)
            with side:
                grads[2 * i], grads[2 * i + 1] = _weight_grads(g, ins[i], want_w, want_b, tc)
            g = g_in
        return (dx, None, *grads)


def mlp(x: torch.Tensor, layers) -> torch.Tensor:
    """``layers[-1](gelu(... gelu(layers[0](x))))`` for linear modules (``.weight``, ``.bias``
    or None) with torch's exact GELU between each two: the Ansatz's MLP sublayer and its phase
    MLP. In a pass that takes the tensor-core products (`cuscikit.nnqs.products.applies`, with
    ``products.FUSED_MLP``) one autograd function whose GELUs are in the products' kernels;
    otherwise the layers one by one (through `linear`) with `torch.nn.functional.gelu`."""

    def run(fused: bool) -> torch.Tensor:
        if fused:
            streams = tuple(stream_for(x) for _ in layers)
            wb = [t for m in layers for t in (m.weight, m.bias)]
            return _GeluMLP.apply(x, streams, *wb)
        h = x
        for i, m in enumerate(layers):
            h = m(h)
            if i < len(layers) - 1:
                h = F.gelu(h)
        return h

    w0 = layers[0].weight
    fused = products.FUSED_MLP and products.applies(x, w0)
    return _with_products(run, fused and all(m.weight.dtype == w0.dtype for m in layers))


class _Embed(torch.autograd.Function):
    @staticmethod
    def forward(ctx, inputs, tok_w, pos_w, stream):
        length = inputs.shape[-1]
        ctx.save_for_backward(inputs)
        ctx.stream, ctx.n_tok, ctx.n_pos = stream, tok_w.shape[0], pos_w.shape[0]
        return F.embedding(inputs, tok_w) + pos_w[:length]

    @staticmethod
    def backward(ctx, dh):
        (inputs,) = ctx.saved_tensors
        length, d = inputs.shape[-1], dh.shape[-1]
        want_tok, want_pos = ctx.needs_input_grad[1:3]
        with fork(ctx.stream, inputs, dh):
            dtok = dpos = None
            if want_tok:  # the rows of each token summed as one product (no sort)
                hot = F.one_hot(inputs.reshape(-1), ctx.n_tok).to(dh.dtype)
                dtok = hot.t().mm(dh.reshape(-1, d))
            if want_pos:
                dpos = dh.new_zeros((ctx.n_pos, d))
                dpos[:length] = column_sums(dh.reshape(-1, length * d)).view(length, d)
        return None, dtok, dpos, None


def embed(inputs: torch.Tensor, tok_w: torch.Tensor, pos_w: torch.Tensor) -> torch.Tensor:
    """Token plus position embedding of ``inputs`` (..., L): ``tok_w[inputs] + pos_w[:L]``,
    with the two tables' gradients on a side stream inside `gradients_aside`."""
    s = stream_for(tok_w)
    if s is None:
        length = inputs.shape[-1]
        pos = torch.arange(length, device=inputs.device)
        return F.embedding(inputs, tok_w) + F.embedding(pos, pos_w)
    return _Embed.apply(inputs, tok_w, pos_w, s)
