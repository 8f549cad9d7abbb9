"""The tensor-core products of `cuscikit.nnqs.products` against cuBLAS's float32 products at the
shapes of a training pass (N2/STO-3G by default: 1,920 configurations of 10 orbitals, d_model
32, the phase MLP's 512-wide layers): microseconds a call (50 calls recorded in one CUDA graph,
replayed) and the largest error against float64, relative to the largest entry.

    python tools/products_bench.py [--rows 1920] [--length 10] [--d 32] [--hidden 512]
"""

from __future__ import annotations

import argparse

import torch
from stage_parts import wall_ms  # the same replay timer (tools/ is on the path)

from cuscikit.nnqs import aside, graphs, products

DEV = torch.device("cuda")


def per_call_us(fn, calls: int = 50, reps: int = 20) -> float:
    """Microseconds a call: ``calls`` calls recorded in one graph, median of ``reps`` replays."""

    def many():
        for _ in range(calls):
            fn()

    return wall_ms(graphs.record(many, DEV)[0], reps) / calls * 1e3


def rel(a, ref) -> float:
    """The largest error of ``a`` against ``ref`` relative to ref's largest entry (of pairs of
    tensors: the larger of the two)."""
    if isinstance(ref, tuple):
        return max(rel(x, r) for x, r in zip(a, ref, strict=True))
    return float((a.double() - ref).abs().max() / ref.abs().max())


def layer_cases(m: int, k: int, n: int, g: torch.Generator) -> list:
    """(product, cuBLAS's call, the kernel's call, float64's result) of a random layer
    ``k -> n`` over ``m`` rows: its forward, input gradient and weight gradient with the bias."""
    x = torch.randn(m, k, device=DEV, generator=g)
    w = torch.randn(n, k, device=DEV, generator=g) / k**0.5
    b = torch.randn(n, device=DEV, generator=g)
    dy = torch.randn(m, n, device=DEV, generator=g)
    x64, w64, dy64 = x.double(), w.double(), dy.double()
    return [
        (
            "forward",
            lambda: torch.addmm(b, x, w.t()),
            lambda: products.mm(x, w.t(), b),
            x64 @ w64.t() + b.double(),
        ),
        ("input gradient", lambda: dy.mm(w), lambda: products.mm(dy, w), dy64 @ w64),
        (
            "weight gradient + bias",
            lambda: (dy.t().mm(x), aside.column_sums(dy)),
            lambda: products.weight_grad(dy, x, True),
            (dy64.t() @ x64, dy64.sum(0)),
        ),
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1920)
    ap.add_argument("--length", type=int, default=10)
    ap.add_argument("--d", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=512)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU")
    tokens, d, h = args.rows * args.length, args.d, args.hidden
    shapes = [  # (label, rows, in, out)
        ("qkv", tokens, d, 3 * d),
        ("attention proj", tokens, d, d),
        ("fc", tokens, d, 4 * d),
        ("mlp proj", tokens, 4 * d, d),
        ("phase in", args.rows, 2 * args.length, h),
        ("phase hidden", args.rows, h, h),
        ("phase out", args.rows, h, 1),
    ]
    g = torch.Generator(device=DEV).manual_seed(0)
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print(
        "| layer | rows x in -> out | product | cuBLAS us | tc us | cuBLAS err | tc err |\n"
        "| --- | --- | --- | --- | --- | --- | --- |"
    )
    for label, m, k, n in shapes:
        for what, ref_fn, tc_fn, want in layer_cases(m, k, n, g):
            e_ref, e_tc = rel(ref_fn(), want), rel(tc_fn(), want)
            us_ref, us_tc = per_call_us(ref_fn), per_call_us(tc_fn)
            print(
                f"| {label} | {m} x {k} -> {n} | {what} | {us_ref:.1f} | {us_tc:.1f} "
                f"| {e_ref:.1e} | {e_tc:.1e} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
