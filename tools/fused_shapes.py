"""Where the fused amplitude kernel's time goes, by shape: N2/cc-pVDZ configurations (28
orbitals) through `FusedInference.amplitude` for several model widths (head width 8) and
product precisions, batches in the pipeline's prefix order. A width that costs as much as the
next power of two says the padding of d_model dominates; a precision that costs as much as
another says the products do not. --launch scans the launch settings of the default model of
--system (warps per program, Triton's pipelining stages, the register limit per thread, the
configurations per program: they decide how many programs share an SM) and checks that each
gives the same ln|psi| to the bit as the first. With --one, a single batch of the default model
only (for a profiler such as Nsight Compute). --ends times the default model's stages as
given (e.g. 12,28 or 8,12,16,20,28) against the plan's own choice, for --kernel. Needs a CUDA
GPU.

usage: python tools/fused_shapes.py [--n 262144] [--widths 32 48 64] [--precisions fp64 tf32x3]
       python tools/fused_shapes.py [--system N2] --widths --launch 4:auto:auto 4:1:168 ...
       python tools/fused_shapes.py --one
       python tools/fused_shapes.py --kernel cuda --ends 12,28 8,12,16,20,28
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from benchmarks_space import sample_space  # noqa: E402
from inference import rate  # noqa: E402

from cuscikit import Ansatz, Molecule  # noqa: E402
from cuscikit.backends.keys import to_device  # noqa: E402
from cuscikit.nnqs.fast_infer import FusedInference  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=262144)
    ap.add_argument("--batch", type=int, default=65536)
    ap.add_argument("--widths", type=int, nargs="*", default=[32, 48, 64])
    ap.add_argument("--precisions", nargs="+", default=["fp64", "tf32x3", "ieee"])
    ap.add_argument(
        "--launch", nargs="*", default=[], help="WARPS:STAGES:MAXNREG[:BLOCK] (auto: default)"
    )
    ap.add_argument("--system", default="N2/cc-pVDZ", help="the molecule of the default model")
    ap.add_argument("--one", action="store_true")
    ap.add_argument(
        "--kernel", default="auto", help="--one, --ends: the kernel (auto, cuda, triton)"
    )
    ap.add_argument("--ends", nargs="*", default=[], help="stage plans to time, e.g. 12,28")
    ap.add_argument(
        "--products", default=None, help="--one, --ends: the CUDA kernel's (fma, fp64, tf32x3)"
    )
    args = ap.parse_args()
    cuda_kw = {} if args.products is None else {"products": args.products}
    mol = Molecule.load(args.system)
    x = to_device(sample_space(mol, args.n), "cuda")
    if len(x) < args.n:  # a small sector (N2/STO-3G: 14,400): repeated to fill the batches
        x = x.repeat((args.n + len(x) - 1) // len(x), 1)[: args.n]
    if args.one:
        a = Ansatz.for_molecule(mol, seed=0, device="cuda")
        fused = FusedInference(a, kernel=args.kernel, **cuda_kw)
        xs = x[fused.order(x)][: args.batch]
        fused.amplitude(xs)
        torch.cuda.synchronize()
        return
    if args.ends:
        a = Ansatz.for_molecule(mol, seed=0, device="cuda")
        fused = FusedInference(a, kernel=args.kernel, **cuda_kw)
        xs = x[fused.order(x)]
        plans = [None] + [[int(e) for e in spec.split(",")] for spec in args.ends]
        print(f"# {args.system}, {fused.kernel} kernel: {len(x):,} configurations")
        print("| stages | amplitude configurations/s | largest difference from the plan's |")
        print("| --- | --- | --- |")
        ref = None
        for ends in plans:
            with torch.no_grad():
                out = torch.cat(
                    [
                        fused.amplitude(xs[lo : lo + args.batch], ends)
                        for lo in range(0, len(xs), args.batch)
                    ]
                )
            ref = out if ref is None else ref
            r = rate(lambda b, ends=ends: fused.amplitude(b, ends), xs, args.batch)
            label = f"plan's own {fused.last_plan}" if ends is None else str(ends)
            print(f"| {label} | {r:.3e} | {float((out - ref).abs().max()):.1e} |", flush=True)
        return
    print(f"# {args.system}: {len(x):,} configurations, batch {args.batch:,}")
    print("| d_model | heads | precision | plan of the last batch | kernel configurations/s |")
    print("| --- | --- | --- | --- | --- |")
    for d in args.widths:
        a = Ansatz.for_molecule(mol, seed=0, device="cuda", d_model=d, n_heads=d // 8)
        for prec in args.precisions:
            fused = FusedInference(a, precision=prec)  # the Triton kernel
            xs = x[fused.order(x)]
            r = rate(fused.amplitude, xs, args.batch)
            print(f"| {d} | {d // 8} | {prec} | {fused.last_plan} | {r:.3e} |", flush=True)
    if args.launch:
        launch_scan(mol, x, args)


def launch_scan(mol, x, args) -> None:
    """The default model's kernel under each launch setting, batches in prefix order."""
    a = Ansatz.for_molecule(mol, seed=0, device="cuda")
    ref = None
    print("\n| block | warps | stages | maxnreg | configurations/s | same ln psi |")
    print("| --- | --- | --- | --- | --- | --- |")
    for spec in args.launch:
        w, st, reg, *blk = (None if v == "auto" else int(v) for v in spec.split(":"))
        blk = blk[0] if blk else None
        fused = FusedInference(a, num_warps=w, num_stages=st, maxnreg=reg, block=blk)
        xs = x[fused.order(x)]
        try:
            r = rate(fused.amplitude, xs, args.batch)
        except Exception as exc:  # a setting the compiler refuses: say so, go on
            print(f"| {spec} | failed: {type(exc).__name__}: {str(exc)[:200]} |", flush=True)
            continue
        with torch.no_grad():
            out = fused.amplitude(xs[: args.batch])
        same = "(reference)" if ref is None else str(bool(torch.equal(out, ref)))
        ref = out if ref is None else ref
        print(
            f"| {fused.block} | {fused.num_warps} | {st or 'auto'} | {reg or 'auto'} | {r:.3e} "
            f"| {same} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
