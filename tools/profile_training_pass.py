"""Where a training pass of the recorded optimiser stage spends its GPU time, part by part.

The optimiser stage of a small system replays one forward pass with gradient and one backward
pass over S per optimiser step (17 per iteration with the teacher's inner steps). This tool
records each part of that pass as a CUDA graph of its own, forward and backward over the same
rows, and replays it: wall time per replay, then one replay under torch.profiler for the
number of kernels and their summed time.

Parts: the whole ln psi and the amplitude (transformer, masks, log-softmax), each also with the
transformer run once per distinct prefix (`prefix_tree`); the transformer body
alone (embedding, blocks, final LayerNorm and head); one block; its attention sublayer and its
MLP sublayer; the phase MLP; the token-only work of a pass (masks and the phase MLP's input);
a flat AdamW step over all parameters. The whole ln psi, the block and the phase MLP are
timed again with their parameter gradients on a second stream beside the pass
(`cuscikit.nnqs.aside`, as the recorded stage runs them with ``aside.ENABLED``; with
``aside.PHASE``, the default, the whole ln psi's phase MLP on a third). `--tf32`
repeats the whole ln psi with TF32 matmuls; `--variants` times the whole ln psi, a block and
its attention sublayer under other settings of the training kernels (`cuscikit.nnqs.fused_ops`),
e.g. the attention's warps per program.

    python tools/profile_training_pass.py [--system N2] [--n 1920] [--float64] [--top 20]
        [--tf32] [--variants warps2:_ATTN_WARPS=2
                  amp-tc:AMPLITUDE_ENABLED=1,COARSE_PRODUCTS=tf32x3 ...]
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"))
from benchmarks_space import sample_space  # noqa: E402
from small_iteration import _device_events, _kernel_stats, _top  # noqa: E402

from cuscikit import Ansatz, Molecule  # noqa: E402
from cuscikit.backends.keys import to_device  # noqa: E402
from cuscikit.nnqs import aside, fused_ops, graphs  # noqa: E402
from cuscikit.nnqs.ansatz import prefix_tree  # noqa: E402

DEV = torch.device("cuda")


def record(fn):
    """fn recorded as a CUDA graph after two warm-up calls on a side stream."""
    return graphs.record(fn, DEV)[0]


def measure(graph, reps: int = 50) -> tuple[float, int, float, float]:
    """(wall us per replay, kernels, summed kernel us, GPU span us) of a recorded graph; the
    kernels of the profiled replay are left in ``measure.last``."""
    from torch.profiler import ProfilerActivity, profile

    graph.replay()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        graph.replay()
    torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) / reps * 1e6
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        graph.replay()
        torch.cuda.synchronize()
    kernels, _ = _device_events(prof)
    busy, span = _kernel_stats(kernels)
    measure.last = kernels
    return wall, len(kernels), busy * 1e3, span * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--system", default="N2")
    ap.add_argument("--n", type=int, default=1920, help="rows of the pass (S padded)")
    ap.add_argument("--float64", action="store_true")
    ap.add_argument("--tf32", action="store_true")
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument(
        "--variants",
        nargs="*",
        default=[],
        help="NAME:ATTR=VALUE,... settings of cuscikit.nnqs.fused_ops (integers, or words) to "
        "time the whole ln psi, a block and its attention sublayer with, e.g. "
        "warps2:_ATTN_WARPS=2 or amp-tc:AMPLITUDE_ENABLED=1,COARSE_PRODUCTS=tf32x3",
    )
    args = ap.parse_args()

    mol = Molecule.load(args.system)
    dtype = torch.float64 if args.float64 else torch.float32
    psi = Ansatz.for_molecule(mol, seed=0, device=DEV, dtype=dtype)
    x = to_device(sample_space(mol, args.n), DEV)
    tok = psi.tokens(x)
    n, norb = tok.shape
    params = [p for p in psi.parameters() if p.requires_grad]
    g = torch.Generator(device=DEV).manual_seed(1)
    coef = torch.randn(n, dtype=dtype, device=DEV, generator=g)
    start = torch.full((n, 1), 4, dtype=torch.long, device=DEV)
    inputs = torch.cat((start, tok[:, :-1]), dim=1)
    d = psi.d_model
    h0 = torch.randn(n, norb, d, dtype=dtype, device=DEV, generator=g, requires_grad=True)
    dh = torch.randn(n, norb, d, dtype=dtype, device=DEV, generator=g)
    block = psi.blocks[0]

    def backward(out, ct):
        return torch.autograd.grad((out * ct).sum(), [*params, h0], allow_unused=True)

    def whole():
        lp = psi._log_psi_tokens(tok)
        backward(lp.real + lp.imag, coef)

    def amplitude():
        backward(psi.log_amplitude(tok), coef)

    tree = prefix_tree(tok)  # built once, outside the recorded parts

    def whole_shared():
        lp = psi._log_psi_tokens(tok, tree)
        backward(lp.real + lp.imag, coef)

    def amplitude_shared():
        backward(psi.log_amplitude(tok, tree=tree), coef)

    def body():
        backward(psi._logits(inputs).sum(-1), coef[:, None])

    def one_block():
        backward(block(h0), dh)

    def attention():
        backward(block.attn(block.ln1(h0)), dh)

    def mlp():
        backward(block.proj(torch.nn.functional.gelu(block.fc(block.ln2(h0)))), dh)

    def phase():
        backward(psi.phase(tok), coef)

    def token_work():
        with torch.no_grad():
            psi._allowed(tok, torch.arange(norb, device=DEV)).any(dim=-1)
            occ = torch.stack((tok & 1, tok >> 1), dim=-1).reshape(n, -1)
            (2 * occ - 1).to(dtype)

    total = sum(p.numel() for p in params)
    flat = [torch.zeros(total, dtype=dtype, device=DEV) for _ in range(5)]
    grads = [torch.randn_like(p) for p in params]
    views, off = [], 0
    for p in params:
        views.append(flat[4][off : off + p.numel()].view_as(p))
        off += p.numel()

    def adamw():  # the operations of the recorded stage's flat AdamW (graphs.OptimizerGraph)
        with torch.no_grad():
            m, v, gr, dd, u = flat
            torch.cat([t.reshape(-1) for t in grads], out=gr)
            torch._foreach_mul_(params, 0.99)
            m.lerp_(gr, 0.1)
            v.mul_(0.999)
            v.addcmul_(gr, gr, value=0.001)
            torch.sqrt(v, out=dd)
            dd.div_(0.5)
            dd.add_(1e-8)
            torch.div(m, dd, out=u)
            u.mul_(0.0)  # no change of the weights: every part sees the same ones
            torch._foreach_sub_(params, views)

    def beside(fn):  # the part with its parameter gradients on a second stream (`aside`)
        def run():
            saved, aside.ENABLED = aside.ENABLED, True
            try:
                with aside.gradients_aside():
                    fn()
            finally:
                aside.ENABLED = saved

        return run

    parts = [
        ("whole ln psi", whole),
        ("whole ln psi, gradients aside", beside(whole)),
        ("whole ln psi, shared prefixes", whole_shared),
        ("amplitude", amplitude),
        ("amplitude, shared prefixes", amplitude_shared),
        ("transformer body", body),
        ("one block", one_block),
        ("one block, gradients aside", beside(one_block)),
        ("  its attention sublayer", attention),
        ("  its MLP sublayer", mlp),
        ("phase MLP", phase),
        ("phase MLP, gradients aside", beside(phase)),
        ("token-only work (no gradient)", token_work),
        ("flat AdamW step", adamw),
    ]
    print(
        f"# {args.system}: {n} rows of {norb} positions, d_model {d}, {len(psi.blocks)} blocks, "
        f"{total:,} parameters, {dtype}, forward with gradient and backward per part; "
        f"{len(tree.first):,} distinct prefixes of the {n * norb:,} positions (shared prefixes: "
        "the transformer once a prefix, Ansatz.log_amplitude(tree=))"
    )
    print("| part | wall us per replay | kernels | summed kernel us | GPU span us |")
    print("| --- | --- | --- | --- | --- |")
    profiles = {}
    for name, fn in parts:
        try:
            graph = record(fn)
        except RuntimeError as exc:  # a part that cannot be recorded: say so, go on
            print(f"| {name} | not recorded: {str(exc).splitlines()[0]} | | | |", flush=True)
            torch.cuda.synchronize()
            continue
        wall, k, busy, span = measure(graph)
        profiles[name] = measure.last
        print(f"| {name} | {wall:.1f} | {k} | {busy:.1f} | {span:.1f} |", flush=True)
    for variant in args.variants:  # the parts that a setting of the kernels changes
        name, _, settings = variant.partition(":")
        saved = {}
        for item in filter(None, settings.split(",")):
            key, value = item.split("=")
            saved[key] = getattr(fused_ops, key)
            setattr(fused_ops, key, int(value) if value.lstrip("-").isdigit() else value)
        for part, fn in (
            ("whole ln psi", whole),
            ("one block", one_block),
            ("attention", attention),
        ):
            wall, k, busy, span = measure(record(fn))
            print(f"| {name}: {part} | {wall:.1f} | {k} | {busy:.1f} | {span:.1f} |")
        for key, value in saved.items():
            setattr(fused_ops, key, value)
    if args.tf32:
        torch.backends.cuda.matmul.allow_tf32 = True
        wall, k, busy, span = measure(record(whole))
        torch.backends.cuda.matmul.allow_tf32 = False
        print(f"| whole ln psi, TF32 matmuls | {wall:.1f} | {k} | {busy:.1f} | {span:.1f} |")
    if fused_ops._failed is not None:
        print(f"# the training kernels were turned off: {fused_ops._failed}")
    if fused_ops._coarse_failed is not None:
        print(f"# the block and amplitude kernels were turned off: {fused_ops._coarse_failed}")
    for name in ("whole ln psi", "whole ln psi, gradients aside", "one block"):
        print(f"# {name}: costliest kernels of one replay (summed time, count, name)")
        print("\n".join(_top(profiles[name], args.top)), flush=True)


if __name__ == "__main__":
    main()
