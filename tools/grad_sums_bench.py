"""How long a training pass's parameter-gradient pieces take on a GPU at the small system's
shapes, each recorded in a CUDA graph of 20 calls and replayed alone (microseconds a call).

A linear layer's backward computes, besides its input gradient, the weight gradient
dy^T x and the bias gradient (a column sum of dy over all rows); the recorded optimiser stage
runs them beside the pass on side streams (`cuscikit.nnqs.aside`). This times the ways of
forming them that torch offers: the column sum by `sum(0)`, by a product with a ones vector
(`ones @ dy`, `mv`), and the weight gradient by `mm`, at the shapes of N2/STO-3G's pass
(1,920 sequences x 10 positions = 19,200 token rows of width 32, 96 and 128; the phase MLP's
1,920 rows of width 512).

    python tools/grad_sums_bench.py [--dtype float32|float64] [--reps 20]
"""

from __future__ import annotations

import argparse

import torch

SHAPES = (  # (rows, output width, input width): the layers of a pass
    (19200, 96, 32),  # attention's q/k/v projection
    (19200, 32, 32),  # attention's output projection
    (19200, 128, 32),  # the MLP's first layer
    (19200, 32, 128),  # the MLP's second layer
    (1920, 512, 512),  # the phase MLP's hidden layers
    (1920, 512, 20),  # the phase MLP's first layer
)


def timed(fn, reps: int) -> float:
    """Microseconds per call of ``fn`` replayed in a CUDA graph of ``reps`` calls."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    g.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = float("inf")
    for _ in range(5):
        start.record()
        g.replay()
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end) * 1e3 / reps)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    dt = getattr(torch, args.dtype)
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, {args.dtype}")
    print("| rows x out x in | dy.sum(0) | ones @ dy | mv(dy^T, ones) | dy^T @ x | max diff |")
    print("| --- | --- | --- | --- | --- | --- |")
    for m, n, k in SHAPES:
        dy = torch.randn(m, n, device="cuda", dtype=dt)
        x = torch.randn(m, k, device="cuda", dtype=dt)
        ones = torch.ones(m, device="cuda", dtype=dt)
        ref = dy.sum(0)
        diff = max(
            float((ones @ dy - ref).abs().max()), float((torch.mv(dy.t(), ones) - ref).abs().max())
        )
        row = [
            timed(lambda dy=dy: dy.sum(0), args.reps),
            timed(lambda dy=dy, o=ones: o @ dy, args.reps),
            timed(lambda dy=dy, o=ones: torch.mv(dy.t(), o), args.reps),
            timed(lambda dy=dy, x=x: dy.t().mm(x), args.reps),
        ]
        print(f"| {m} x {n} x {k} | " + " | ".join(f"{t:.1f}" for t in row) + f" | {diff:.1e} |")


if __name__ == "__main__":
    main()
