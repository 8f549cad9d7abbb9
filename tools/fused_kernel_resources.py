"""Compile the fused training kernels of `cuscikit.nnqs.fused_ops` (a whole block, the whole
ln|psi|) for an NVIDIA target without a GPU, and print each one's registers, local-memory
spills (stack bytes a thread), shared memory and compile time: a kernel that spills, or needs
more shared memory than a block gets (227 KiB on sm_90), shows here before any device time is
spent. Needs Triton with its bundled ptxas and cuobjdump.

    python tools/fused_kernel_resources.py [--arch 90] [--norb 10] [--d-model 32] [--heads 4]
        [--layers 4] [--float64 | --products tf32x3] [--stages 1] [--tiles 32:4 64:8 128:8]
    python tools/fused_kernel_resources.py --attention [--tiles 64:2 128:4] [--float64] ...

``--attention``: the attention kernels of the training pass instead, the row-wise ones at each
tile (rows a program : warps) and the tile kernels at its warps.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
import time

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from cuscikit.nnqs import fused_ops as fo

_SCALARS = {"eps_hi", "eps_lo", "sc_hi", "sc_lo", "scale_hi", "scale_lo"}


def resources(kernel, pointers: dict, consts: dict, target, warps: int, stages: int) -> str:
    signature = {}
    for name in kernel.arg_names:
        if name in pointers:
            signature[name] = pointers[name]
        elif name in ("n", "rows"):
            signature[name] = "i32"
        elif name in _SCALARS:
            signature[name] = "fp32"
        else:
            signature[name] = "constexpr"
    constexprs = {(kernel.arg_names.index(k),): v for k, v in consts.items()}
    # the pointers 16-byte aligned, as Triton's launcher finds torch's tensors
    attrs = {
        (kernel.arg_names.index(k),): [["tt.divisibility", 16]]
        for k in pointers
        if k in kernel.arg_names
    }
    t0 = time.perf_counter()
    try:
        compiled = triton.compile(
            ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs),
            target=target,
            options={"num_warps": warps, "num_stages": stages},
        )
    except Exception as exc:  # noqa: BLE001 - reported, the next kernel is tried
        return f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    seconds = time.perf_counter() - t0
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(compiled.asm["cubin"])
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    usage = subprocess.run(
        [tool, "--dump-resource-usage", f.name], capture_output=True, text=True, check=False
    ).stdout
    os.unlink(f.name)
    line = next((ln.strip() for ln in usage.splitlines() if "REG:" in ln), "")
    fields = dict(kv.split(":") for kv in line.split() if kv.count(":") == 1)
    return (
        f"{fields.get('REG', '?'):>4} {fields.get('STACK', '?'):>6} "
        f"{compiled.metadata.shared:>9} {seconds:>8.1f}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", type=int, default=90)
    ap.add_argument("--norb", type=int, default=10)
    ap.add_argument("--d-model", type=int, default=32)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--float64", action="store_true")
    ap.add_argument(
        "--products",
        choices=("ieee", "tf32x3"),
        default="ieee",
        help="float32 products (fused_ops.COARSE_PRODUCTS)",
    )
    ap.add_argument("--stages", type=int, default=fo._LAUNCH_STAGES)
    ap.add_argument("--tiles", nargs="+", default=["32:4", "64:8", "128:8"], help="rows:warps")
    ap.add_argument("--attention", action="store_true", help="the attention kernels instead")
    args = ap.parse_args()
    target = GPUTarget("cuda", args.arch, 32)
    fo.COARSE_PRODUCTS = args.products
    dtype = torch.float64 if args.float64 else torch.float32
    length, d, ff = args.norb, args.d_model, 4 * args.d_model
    ptr = "*fp64" if args.float64 else "*fp32"
    na = nb = args.norb // 2
    print(
        f"sm_{args.arch}, {length} positions, d_model {d}, {args.heads} heads, {args.layers} "
        f"blocks, {'float64' if args.float64 else 'float32 ' + args.products}, "
        f"{args.stages} stage(s)"
    )
    print(
        f"{'kernel':<16} {'rows':>5} {'warps':>5} {'regs':>4} {'stack':>6} {'shared B':>9} "
        f"{'compile s':>8}"
    )
    if args.attention:
        hd = args.d_model // args.heads
        prec = fo._prec(dtype)
        io = ("qkv_ptr", "y_ptr", "dy_ptr", "lse_ptr", "dqkv_ptr")
        for tile in args.tiles:
            rows, warps = (int(v) for v in tile.split(":"))
            row = dict(L=length, H=args.heads, HD=hd, HDP=fo.pow2(hd), PREC=prec, R=rows)
            row.update(A=hd & -hd, full=hd == fo.pow2(hd))
            lp, hdp = max(16, fo.pow2(length)), max(16, fo.pow2(hd))
            tiles = dict(L=length, LP=lp, H=args.heads, HD=hd, HDP=hdp, PREC=prec, HG=1)
            for label, kernel, consts in (
                ("rows forward", fo._attn_row_fwd_kernel, row),
                ("rows backward", fo._attn_row_bwd_kernel, row),
                ("tiles forward", fo._attn_fwd_kernel, tiles),
                ("tiles backward", fo._attn_bwd_kernel, tiles),
            ):
                pointers = {name: ptr for name in io}
                got = resources(kernel, pointers, consts, target, warps, args.stages)
                shown = rows if label.startswith("rows") else 1
                print(f"{label:<16} {shown:>5} {warps:>5} {got}", flush=True)
        return
    for tile in args.tiles:
        rows, warps = (int(v) for v in tile.split(":"))
        fo._set_tile(dtype, rows, warps)
        names = ("L", "LP", "BN", "D", "H", "FF", "FC", "NP", "PREC")
        base = dict(zip(names, fo._block_consts(length, d, args.heads, ff, dtype), strict=True))
        amp = dict(base, NL=args.layers, NA=na, NB=nb)
        runs = [
            ("block forward", fo._block_fwd_kernel, ("h_ptr", "out_ptr", "mid_ptr", "w"), base),
            (
                "block backward",
                fo._block_bwd_kernel,
                ("h_ptr", "mid_ptr", "dout_ptr", "dh_ptr", "w", "part_ptr"),
                base,
            ),
            ("ln|psi| forward", fo._amp_fwd_kernel, ("w", "hs_ptr", "amp_ptr"), amp),
            (
                "ln|psi| backward",
                fo._amp_bwd_kernel,
                ("w", "hs_ptr", "damp_ptr", "part_ptr"),
                dict(amp, NW=1),
            ),
        ]
        for label, kernel, names, consts in runs:
            pointers = {name: ptr for name in names}
            pointers["tok_ptr"] = "*i64"
            got = resources(kernel, pointers, consts, target, warps, args.stages)
            print(f"{label:<16} {rows:>5} {warps:>5} {got}", flush=True)


if __name__ == "__main__":
    main()
