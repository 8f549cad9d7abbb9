"""Where the time of the N2/cc-pVDZ iteration goes on a GPU, part by part.

- the fused ln psi (`FusedInference`, its defaults) per batch: whole, the amplitude kernel
  with its prefix plan, the phase MLP, the tokens, the prefix sort; a torch.profiler table
  of the costliest kernels of one pass;
- the phase MLP alone in float32 (the module) and with TF32 matmuls, each with its largest
  error against float64;
- the optimiser stage's training pass (forward with gradient and backward, batch by batch
  as `Runner._backward_loss` runs it), per configuration, with its profiler table.

    python tools/profile_large_iteration.py [--n 262144] [--batch 65536] [--train 65536]
        [--parts infer phase train] [--top 15]
"""

from __future__ import annotations

import argparse
import copy
import pathlib
import sys
import time

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"))
from benchmarks_space import sample_space  # noqa: E402
from inference import rate  # noqa: E402

from cuscikit import Ansatz, Molecule  # noqa: E402
from cuscikit.backends.keys import to_device  # noqa: E402
from cuscikit.nnqs import fused_ops  # noqa: E402
from cuscikit.nnqs.fast_infer import FusedInference, token_key  # noqa: E402

DEV = torch.device("cuda")


def per_config(fn, x, batch) -> float:
    """Seconds per configuration of fn over x in batches (no gradient; `inference.rate`)."""
    return 1.0 / rate(fn, x, batch)


def profile_table(fn, top: int) -> str:
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return prof.key_averages().table(
        sort_by="cuda_time_total", row_limit=top, max_name_column_width=60
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--system", default="N2/cc-pVDZ")
    ap.add_argument("--n", type=int, default=262144)
    ap.add_argument("--batch", type=int, default=65536)
    ap.add_argument("--train", type=int, default=65536, help="configurations of the training pass")
    ap.add_argument("--train-batch", type=int, default=16384)
    ap.add_argument("--parts", nargs="+", default=["infer", "phase", "train"])
    ap.add_argument("--top", type=int, default=15)
    args = ap.parse_args()

    mol = Molecule.load(args.system)
    a32 = Ansatz.for_molecule(mol, seed=0, device=DEV)
    a64 = copy.deepcopy(a32).to(torch.float64)
    x = to_device(sample_space(mol, args.n), DEV)
    fused = FusedInference(a32)
    x = x[fused.order(x)]
    print(f"# {args.system}: {len(x):,} configurations, kernel {fused.kernel}/{fused.products}")
    b = args.batch

    if "infer" in args.parts:
        parts = {
            "whole ln psi": fused,
            "amplitude (plan + kernel)": fused.amplitude,
            "phase MLP (module)": lambda c: a32.phase(a32.tokens(c)),
            "tokens": a32.tokens,
            "prefix sort": lambda c: torch.sort(token_key(c)),
        }
        print("| part | ns per configuration | configurations/s |")
        print("| --- | --- | --- |")
        for name, fn in parts.items():
            t = per_config(fn, x, b)
            print(f"| {name} | {t * 1e9:.1f} | {1 / t:.3e} |", flush=True)
        with torch.no_grad():
            print(
                profile_table(
                    lambda: [fused(x[lo : lo + b]) for lo in range(0, len(x), b)], args.top
                )
            )

    if "phase" in args.parts:
        tok = a32.tokens(x[:b])
        with torch.no_grad():
            ref = a64.phase(tok)
            variants = {
                "module float32": a32.phase,
                "module, TF32 matmuls": "tf32",
            }
            print("| phase MLP | ns per configuration | max abs error vs float64 | max abs phase |")
            print("| --- | --- | --- | --- |")
            for name, fn in variants.items():
                if fn == "tf32":
                    torch.backends.cuda.matmul.allow_tf32 = True
                    fn = a32.phase
                try:
                    fn(tok)
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    for _ in range(10):
                        got = fn(tok)
                    torch.cuda.synchronize()
                    t = (time.perf_counter() - t0) / (10 * len(tok))
                    err = float((got.double() - ref).abs().max())
                except Exception as exc:  # a tile the compiler refuses: say so, go on
                    print(f"| {name} | failed: {type(exc).__name__}: {str(exc)[:200]} | | |")
                    continue
                finally:
                    torch.backends.cuda.matmul.allow_tf32 = False
                print(f"| {name} | {t * 1e9:.1f} | {err:.1e} | {float(ref.abs().max()):.2f} |")

    if "train" in args.parts:
        S = x[: args.train]
        bs = args.train_batch
        weight = torch.rand(len(S), device=DEV, dtype=torch.float64)
        de = torch.randn(len(S), device=DEV, dtype=torch.complex128)

        def train_pass():
            for lo in range(0, len(S), bs):
                lp = a32.log_psi(S[lo : lo + bs]).to(torch.complex128)
                part = 2.0 * (weight[lo : lo + bs] * (lp.conj() * de[lo : lo + bs])).real.sum()
                part.backward()

        def forward_only():
            for lo in range(0, len(S), bs):
                a32.log_psi(S[lo : lo + bs])

        # the attention of the training pass: the Triton kernels (sequences up to
        # fused_ops._MAX_LENGTH) at 1, 2 and 4 warps per program against torch's kernels (the
        # limit set below the length)
        limit, warps = fused_ops._MAX_LENGTH, fused_ops._ATTN_WARPS
        for name, fn, lim, w in (
            *(
                (
                    f"forward with gradient + backward, Triton attention, {w} warps",
                    train_pass,
                    limit,
                    w,
                )
                for w in (1, 2, 4)
            ),
            ("forward with gradient + backward, torch's attention", train_pass, 1, warps),
            ("forward alone", forward_only, limit, warps),
        ):
            fused_ops._MAX_LENGTH, fused_ops._ATTN_WARPS = lim, w
            fn()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(3):
                fn()
            torch.cuda.synchronize()
            t = (time.perf_counter() - t0) / (3 * len(S))
            print(f"# training pass, {name}: {t * 1e6:.3f} us per configuration (batch {bs})")
        fused_ops._ATTN_WARPS = warps
        fused_ops._MAX_LENGTH = limit
        print(profile_table(train_pass, args.top + 10))


if __name__ == "__main__":
    main()
