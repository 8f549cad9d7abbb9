"""The tensor-core products' launch settings swept at the transformer's shapes of a training
pass (N2/STO-3G by default: 19,200 token rows, d_model 32, layers 32 -> 96, 32 -> 32,
32 -> 128 and 128 -> 32): for each setting of `cuscikit.nnqs.products` (the reduction's step,
warps, Triton's pipelining depth, the tile rule, a weight gradient's programs a multiprocessor)
the microseconds of each layer's forward, input gradient and weight gradient with the bias's
sums (50 calls recorded in one CUDA graph, median of 20 replays), their sum over the four
layers (one block's twelve products), and the largest error against float64 relative to the
largest entry, beside cuBLAS's float32 products. A setting whose error passes 3e-6 is marked;
one Triton cannot launch (shared memory) is reported and skipped. ``--phase`` sweeps the phase
MLP's products instead (1,920 rows, 2 L -> hidden, hidden -> hidden, hidden -> 1).

    python tools/products_sweep.py [--rows 1920] [--length 10] [--d 32] [--phase]
        [--hidden 512] [--json-out F]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time

import torch
from products_bench import DEV, layer_cases, per_call_us, rel  # tools/ is on the path

from cuscikit.nnqs import products

_PACKAGE_TILE = products._tile


def _tile_rule(side: int):
    """A tile rule whose largest side is ``side``: that side where it divides n (or n is large),
    else the package's own rule."""
    if side == 64:
        return _PACKAGE_TILE

    def rule(n: int) -> int:
        if n % side == 0 or n > 4 * side:
            return side
        return min(side, _PACKAGE_TILE(n))

    return rule


# (label, the reduction's step, warps or None, stages or None, tile side, weight-gradient
# programs/SM); None: the package's rule (warps: 4 for a forward, 2 for the gradients; stages:
# 1 for a one-step reduction, else Triton's own)
BASE = ("package", 32, None, None, 64, 2)
SETTINGS = [
    BASE,
    ("warps4", 32, 4, None, 64, 2),
    ("bk16", 16, None, None, 64, 2),
    ("bk64", 64, None, None, 64, 2),
    ("warps2", 32, 2, None, 64, 2),
    ("warps8", 32, 8, None, 64, 2),
    ("stages1", 32, None, 1, 64, 2),
    ("stages2", 32, None, 2, 64, 2),
    ("stages3", 32, None, 3, 64, 2),
    ("stages4", 32, None, 4, 64, 2),
    ("tile32", 32, None, None, 32, 2),
    ("tile128", 32, None, None, 128, 2),
    ("tile128-warps8", 32, 8, None, 128, 2),
    ("wg1", 32, None, None, 64, 1),
    ("wg4", 32, None, None, 64, 4),
    ("wg8", 32, None, None, 64, 8),
    ("bk64-warps8-tile128", 64, 8, None, 128, 2),
    ("bk64-stages3", 64, None, 3, 64, 2),
]


@contextlib.contextmanager
def setting(bk: int, warps, stages, side: int, wg: int):
    """The products' module settings for the duration, restored after (``warps`` None: the
    package's rule, else that many warps for every product; ``stages`` None: the package's)."""
    names = ("_BK", "_WARPS", "_WARPS_ROWS", "_STAGES", "_tile", "_WG_PER_SM")
    saved = [getattr(products, name) for name in names]
    products._BK, products._STAGES = bk, stages
    if warps is not None:
        products._WARPS = products._WARPS_ROWS = warps
    products._tile, products._WG_PER_SM = _tile_rule(side), wg
    try:
        yield
    finally:
        for name, value in zip(names, saved, strict=True):
            setattr(products, name, value)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1920)
    ap.add_argument("--length", type=int, default=10)
    ap.add_argument("--d", type=int, default=32)
    ap.add_argument("--phase", action="store_true", help="the phase MLP's layers instead")
    ap.add_argument("--hidden", type=int, default=512, help="the phase MLP's width")
    ap.add_argument("--json-out", default=None)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU")
    tokens, d = args.rows * args.length, args.d
    shapes = [("qkv", d, 3 * d), ("attention proj", d, d), ("fc", d, 4 * d), ("mlp proj", 4 * d, d)]
    what = "block's 12 products"
    if args.phase:
        tokens, h = args.rows, args.hidden
        shapes = [("phase in", 2 * args.length, h), ("phase hidden", h, h), ("phase out", h, 1)]
        what = "the phase MLP's 9 products"
    g = torch.Generator(device=DEV).manual_seed(0)
    layers = [(label, layer_cases(tokens, k, n, g)) for label, k, n in shapes]
    kinds = ("forward", "input gradient", "weight gradient + bias")

    def measure(which: int) -> tuple[dict, float]:
        """{(layer, product): us} and the largest error, for cuBLAS (0) or the kernel (1)."""
        times, worst = {}, 0.0
        for label, cases in layers:
            for case in cases:
                fn, want = case[1 + which], case[3]
                worst = max(worst, rel(fn(), want))
                times[(label, case[0])] = per_call_us(fn)
        return times, worst

    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, {tokens} rows, d {d}")
    print(
        "| setting | BK | warps | stages | tile | wg/SM | forward us | input gradient us "
        f"| weight gradient us | {what} us | largest error |\n"
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
    )
    rows = []

    def report(label, cfg, times, worst):
        sums = [sum(t for (_, kind), t in times.items() if kind == k) for k in kinds]
        mark = "" if worst <= 3e-6 else " (over 3e-6)"
        cols = " | ".join(str(c) for c in cfg)
        print(
            f"| {label} | {cols} | {sums[0]:.1f} | {sums[1]:.1f} | {sums[2]:.1f} "
            f"| {sum(sums):.1f} | {worst:.1e}{mark} |",
            flush=True,
        )
        rows.append(
            {
                "setting": label,
                "config": list(cfg),
                "us": {f"{a} / {b}": t for (a, b), t in times.items()},
                "largest_error": worst,
            }
        )

    times, worst = measure(0)
    report("cuBLAS float32", ("-",) * 5, times, worst)
    for label, *cfg in SETTINGS:
        t0 = time.perf_counter()
        try:
            with setting(*cfg):
                times, worst = measure(1)
        except Exception as exc:  # noqa: BLE001 - a setting Triton cannot launch: next one
            print(f"| {label} | {' | '.join(str(c) for c in cfg)} | failed: {exc!s:.80} |")
            continue
        report(label, cfg, times, worst)
        rows[-1]["seconds"] = time.perf_counter() - t0
    if args.json_out:
        meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, **vars(args)}
        with open(args.json_out, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
