"""Ansatz inference throughput (ln psi per second, no gradient) on the GPU, by variant.

Variants: eager float32 (the default), eager with TF32 matmuls, bfloat16 autocast, the
float32 pass recorded as a CUDA graph per batch size (`cuscikit.nnqs.graphs.InferenceGraph`,
what `Runner(graphs=...)` uses for batches up to its batch size), torch.compile'd float32 and
the fused Triton kernel (`cuscikit.nnqs.fast_infer`, what `Runner(fused_inference=...)` uses)
in each precision and block shape asked for; each with its largest |ln psi - ln psi(float64)|
on the same batch, and a profiler table of the eager float32 pass (where the time goes).

    python benchmarks/inference.py [--batch 65536] [--systems N2/cc-pVDZ N2]
        [--fused fp64:auto:auto:ordered tf32x3:auto:auto:off] [--json rows.json]
        [--previous path/to/an/older/fast_infer.py ...]

A --fused entry is kernel[:sharing[:rows|products]] for the library's kernels with their
defaults (kernel: "cuda", the compiled kernel, rows: its rows per thread, 1 or 2, products: "fma",
"fp64" or "tf32x3", its products on the tensor cores; "triton"; "auto", what Runner uses), or,
for the Triton kernel,
precision:block:warps[:sharing[:chunk]] (block = configurations per program,
warps per program; "auto" = the library's choice; sharing: "off" = every configuration's whole
sequence, "on" = each batch's shared first orbitals computed once, "ordered" = "on" with the
configurations first put in the prefix order, as the pipeline does; its sort is timed with
it; chunk: the k_chunk of tf32x3, products summed on the tensor cores per chunk, 0 = the whole
product). --previous times other versions of cuscikit/nnqs/fast_infer.py beside (their
defaults, the configurations in the prefix order).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import importlib.util
import json
import time

import torch
from _common import print_table
from benchmarks_space import sample_space

from cuscikit import Ansatz, Molecule
from cuscikit.backends.keys import to_device
from cuscikit.nnqs.fast_infer import KERNELS, FusedInference, unsupported_reason
from cuscikit.nnqs.graphs import InferenceGraph

DEV = torch.device("cuda")


def rate(fn, x, batch, repeat=3):
    with torch.no_grad():
        fn(x[:batch])
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(repeat):
            for lo in range(0, len(x), batch):
                fn(x[lo : lo + batch])
        torch.cuda.synchronize()
    return repeat * len(x) / (time.perf_counter() - t0)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--batch", type=int, default=65536)
    ap.add_argument("--n", type=int, default=524288)
    ap.add_argument("--systems", nargs="+", default=["N2/cc-pVDZ", "N2"])
    ap.add_argument("--compile", action="store_true")
    ap.add_argument(
        "--fused",
        nargs="*",
        default=[
            "cuda:off",
            "cuda:ordered",
            "cuda:ordered:fma",
            "cuda:ordered:fp64",
            "cuda:ordered:tf32x3",
            "fp64:auto:auto:off",
            "fp64:auto:auto:on",
            "fp64:auto:auto:ordered",
            "tf32x3:auto:auto:ordered",
            "ieee:auto:auto:ordered",
            "tf32:auto:auto:ordered",
        ],
        help="fused-kernel variants, cuda|triton|auto[:off|on|ordered[:rows|products]] or "
        "precision:block:warps[:off|on|ordered[:chunk]] (Triton)",
    )
    ap.add_argument(
        "--previous",
        nargs="*",
        default=[],
        help="older fast_infer.py files to time beside (their defaults, in the prefix order)",
    )
    ap.add_argument(
        "--module",
        nargs="*",
        default=["fp64", "tf32", "bf16", "graph"],
        help="module variants beside eager fp32 (fp64 tf32 bf16 graph; --compile adds compiled)",
    )
    ap.add_argument("--no-profile", action="store_true")
    ap.add_argument("--json", default=None, help="also write the rows here")
    args = ap.parse_args()
    rows = []
    for name in args.systems:
        mol = Molecule.load(name)
        x = to_device(sample_space(mol, args.n), DEV)
        distinct = len(x)
        if distinct < args.n:  # a small sector (N2/STO-3G: 14,400): repeat it to fill batches
            x = x.repeat((args.n + distinct - 1) // distinct, 1)[: args.n]
        print(f"# {name}: {len(x):,} configurations ({distinct:,} distinct)")
        a32 = Ansatz.for_molecule(mol, seed=0, device=DEV)
        a64 = copy.deepcopy(a32).to(torch.float64)
        with torch.no_grad():
            ref = a64.log_psi(x[: args.batch])

        def err(fn, x=x, ref=ref):
            with torch.no_grad():
                return float((fn(x[: args.batch]).to(torch.complex128) - ref).abs().max())

        variants = [("eager fp32", a32.log_psi, contextlib.nullcontext)]
        if "fp64" in args.module:
            variants.append(("eager fp64", a64.log_psi, contextlib.nullcontext))

        @contextlib.contextmanager
        def tf32():
            torch.backends.cuda.matmul.allow_tf32 = True
            try:
                yield
            finally:
                torch.backends.cuda.matmul.allow_tf32 = False

        if "tf32" in args.module:
            variants.append(("tf32 matmul", a32.log_psi, tf32))
        if "bf16" in args.module:
            variants.append(
                ("bf16 autocast", a32.log_psi, lambda: torch.autocast("cuda", dtype=torch.bfloat16))
            )
        if "graph" in args.module:
            variants.append(
                ("recorded fp32 (CUDA graph)", InferenceGraph(a32), contextlib.nullcontext)
            )

        def measure(label, fn, ctx, name=name, mol=mol, a32=a32, x=x, err=err):
            with ctx():
                r = rate(fn, x, args.batch)
                e = err(fn)
            rows.append([name, 2 * mol.norb, a32.d_model, label, f"{r:.3e}", f"{e:.1e}"])
            print(rows[-1], flush=True)

        for variant in variants:
            measure(*variant)
        if args.compile:
            comp = torch.compile(a32.log_psi, dynamic=False)
            t0 = time.perf_counter()
            with torch.no_grad():
                comp(x[: args.batch])
            torch.cuda.synchronize()
            print(f"# compile {name}: {time.perf_counter() - t0:.1f} s")
            measure("compiled fp32", comp, contextlib.nullcontext)
        why = unsupported_reason(a32)

        def fused_row(fused, label, sharing, x=x, a64=a64, name=name, mol=mol, a32=a32, err=err):
            xs, e_fn, t_order = x, err, 0.0
            if sharing == "ordered":  # the pipeline's order; the sort counts in the rate
                fused.order(x)  # warm: a first sort pays its one-time set-up, not its time
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                xs = x[fused.order(x)]
                torch.cuda.synchronize()
                t_order = time.perf_counter() - t0
                with torch.no_grad():
                    ref_s = a64.log_psi(xs[: args.batch])

                def e_fn(fn, xs=xs, ref_s=ref_s):
                    with torch.no_grad():
                        got = fn(xs[: args.batch]).to(torch.complex128)
                        return float((got - ref_s).abs().max())

            plans = []
            for lo in range(0, len(xs), args.batch):
                plans.append(fused.plan(xs[lo : lo + args.batch]))
            print(f"# {label}: stages (ends, distinct prefixes) per batch {plans[:4]}")
            alone = 1.0 / (1.0 / rate(fused.amplitude, xs, args.batch) + t_order / len(xs))
            print(
                f"# {label}: the amplitude kernel alone {alone:.3e} configurations/s "
                f"(order {t_order * 1e3:.1f} ms)"
            )
            r = 1.0 / (1.0 / rate(fused, xs, args.batch) + t_order / len(xs))
            e = e_fn(fused)
            rows.append([name, 2 * mol.norb, a32.d_model, label, f"{r:.3e}", f"{e:.1e}"])
            print(rows[-1], flush=True)
            if args.json:  # rows so far, in case a later variant is cut short
                with open(args.json, "w") as fh:
                    json.dump(rows, fh, indent=1)

        for i, path in enumerate(args.previous if why is None else []):
            spec = importlib.util.spec_from_file_location(f"previous_fast_infer{i}", path)
            prev = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(prev)
            fused = prev.FusedInference(a32)  # its defaults, in the pipeline's order
            fused(x[: args.batch])
            fused_row(fused, f"previous fused ({path}) ordered", "ordered")
        for spec in args.fused if why is None else []:
            parts = spec.split(":")
            try:
                if parts[0] in KERNELS:
                    sharing = parts[1] if len(parts) > 1 else "on"
                    # the third field: the CUDA kernel's rows per thread, or its products
                    per_thread = (
                        {}
                        if len(parts) < 3
                        else {"rows": int(parts[2])}
                        if parts[2].isdigit()
                        else {"products": parts[2]}
                    )
                    fused = FusedInference(
                        a32, kernel=parts[0], share_prefixes=sharing != "off", **per_thread
                    )
                else:
                    prec, block, warps, *rest = parts
                    sharing = rest[0] if rest else "on"
                    chunk = {} if len(rest) < 2 or rest[1] == "auto" else {"k_chunk": int(rest[1])}
                    fused = FusedInference(
                        a32,
                        precision=prec,
                        block=None if block == "auto" else int(block),
                        num_warps=None if warps == "auto" else int(warps),
                        share_prefixes=sharing != "off",
                        **chunk,
                    )
                t0 = time.perf_counter()
                fused(x[: args.batch])
                torch.cuda.synchronize()
            except Exception as exc:  # a shape the compiler refuses: say so, measure the rest
                print(f"# fused {spec} failed: {type(exc).__name__}: {exc}"[:2000])
                continue
            if fused.kernel == "cuda":
                per_thread = fused.rows or "default"
                label = (
                    f"fused cuda kernel, sharing {sharing}, float32 FMAs, rows per thread "
                    f"{per_thread}"
                    if fused.products == "fma"
                    else f"fused cuda kernel, sharing {sharing}, {fused.products} tensor cores"
                )
            else:
                label = (
                    f"fused {fused.precision} block {fused.block} warps {fused.num_warps} "
                    f"sharing {sharing} k_chunk {fused.k_chunk}"
                )
            print(f"# {label}: first call (compile) {time.perf_counter() - t0:.1f} s")
            fused_row(fused, label, sharing)
        if why is not None:
            print(f"# fused kernel not run: {why}")
        if args.no_profile:
            continue
        with (
            torch.no_grad(),
            torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof,
        ):
            a32.log_psi(x[: args.batch])
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12))
    print_table(
        "Ansatz inference, configurations per second (no gradient)",
        ["system", "qubits", "d_model", "variant", "configs/s", "max |d ln psi|"],
        rows,
    )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
