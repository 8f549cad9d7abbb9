"""GPU pipeline measurements on one GPU (the kernels, the de-dup, one iteration, peak memory).

Sections (run any subset; each prints a table, all tables are printed again at the end):

- kernels:   coupled-generation throughput (valid coupled configurations per second), GPU vs
             the compiled CPU kernel in the same run, N2/cc-pVDZ (1 word) and Cr2/SV (2 words).
- dedup:     sort + unique + inverse throughput on random keys over the full key range (1 and
             2 words, about half duplicates), with torch.unique as the anchor and the CPU
             radix sort on a slice.
- iteration: one NNQS-SCI iteration on N2/cc-pVDZ with --sources source configurations,
             baseline pipeline (CPU generation and de-dup, GPU inference) vs the GPU pipeline:
             seconds per stage; --inference module,fused times each pipeline with ln psi
             from the module (eager/recorded, or compiled with --compile) and from the fused
             kernels (cuscikit.nnqs.fast_infer; fused: the library's choice, fused-cuda and
             fused-triton: that kernel, fused-fma, fused-fp64 and fused-tf32x3: the CUDA
             kernel with those products (float32 FMAs, or on the tensor cores), fused-noshare:
             without prefix sharing).
- memory:    theoretical (all intermediates resident) vs measured peak at |S| = --space-size
             for H2O, C2H4O, C2 and N2, and one run under a cap well below the theoretical peak.

    python benchmarks/gpu_pipeline.py kernels dedup iteration memory [--out DIR]

Source sets are breadth-first excitations of HF (random subsets of each level), not the top
configurations of a trained wavefunction: they measure throughput, not a converged run.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import time
from types import SimpleNamespace

import numpy as np
import torch
from _common import machine, print_table, random_excitations
from benchmarks_space import sample_space

from cuscikit import Ansatz, Molecule, Runner, SCISpace
from cuscikit.backends import cuda as kernels
from cuscikit.backends import keys
from cuscikit.backends.keys import dedup
from cuscikit.backends.memory import MemoryBudget
from cuscikit.nnqs.pipeline import Pipeline
from cuscikit.sci import cuda as sci_cuda
from cuscikit.sci.configs import hf_configuration
from cuscikit.sci.engines import CudaEngine
from cuscikit.sci.hamiltonian import Hamiltonian

DEV = torch.device("cuda")


# the kernels under the short names the measurements use
ops = SimpleNamespace(
    DeviceHamiltonian=sci_cuda.DeviceHamiltonian,
    coupled=sci_cuda.coupled,
    coupled_counts=sci_cuda.coupled_counts,
    search=keys.search,
    to_device=keys.to_device,
    to_numpy=keys.to_numpy,
    sort_unique=lambda k, return_inverse=False, end_bit=None: keys.sort_unique(
        k, return_inverse=return_inverse, end_bit=end_bit
    ),
)
TABLES: list[tuple[str, list, list]] = []


def cuda_time(fn, repeat=3):
    """Median seconds of `repeat` calls (after one warm-up), timed with CUDA events."""
    fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(repeat):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        out = fn()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b) / 1e3)
    return float(np.median(ts)), out


def wall(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def table(title, header, rows):
    TABLES.append((title, header, rows))
    print_table(title, header, rows)


# ----------------------------------------------------------------------------------- kernels
def bench_kernels(args):
    rows = []
    cases = [
        ("N2/cc-pVDZ", 1e-12, args.n2_sources),
        ("N2/cc-pVDZ", -1.0, args.n2_sources // 4),
        ("Cr2/SV", 1e-12, args.cr2_sources),
        ("Cr2/SV", -1.0, args.cr2_sources // 4),
    ]
    for name, eps, nsrc in cases:
        mol = Molecule.load(name)
        H = Hamiltonian.from_molecule(mol, eps=eps)
        dh = ops.DeviceHamiltonian(H, DEV)
        src = random_excitations(hf_configuration(mol.norb, mol.nelec), mol.norb, nsrc, 4, 7)
        src_t = ops.to_device(src, DEV)
        t_count, counts = cuda_time(lambda dh=dh, s=src_t: ops.coupled_counts(dh, s))
        t_all, (offs, cfg, val) = cuda_time(lambda dh=dh, s=src_t: ops.coupled(dh, s))
        m = int(offs[-1])
        # CPU kernel on a slice, same sources; counts checked against it.
        ncpu = max(1, min(nsrc, args.cpu_items // max(1, m // nsrc)))
        t_cpu, cs = wall(lambda H=H, s=src[:ncpu]: H.coupled(s))
        ok = np.array_equal(counts[:ncpu].cpu().numpy(), np.bincount(cs.source, minlength=ncpu))
        del offs, cfg, val
        torch.cuda.empty_cache()
        rows.append(
            [
                name,
                H.nwords,
                "none" if eps < 0 else f"{eps:g}",
                nsrc,
                f"{m / nsrc:,.0f}",
                f"{m:,}",
                f"{t_all:.4f}",
                f"{m / t_all:.3e}",
                f"{m / t_count:.3e}",
                f"{len(cs) / t_cpu:.3e}",
                f"{(m / t_all) / (len(cs) / t_cpu):.0f}x",
                "yes" if ok else "NO",
            ]
        )
    table(
        f"Coupled generation, GPU (count + write) vs CPU kernel ({os.cpu_count()} threads), "
        f"{machine()}",
        [
            "system",
            "words",
            "eps",
            "sources",
            "|C(x)|",
            "coupled",
            "GPU s",
            "GPU /s",
            "count-only /s",
            "CPU /s",
            "GPU/CPU",
            "counts = CPU",
        ],
        rows,
    )


# ------------------------------------------------------------------------------------- dedup
def bench_dedup(args):
    rows = []
    rng = np.random.default_rng(0)
    for words, n in ((1, args.dedup_n1), (2, args.dedup_n2)):
        pool = torch.randint(-(2**63), 2**63 - 1, (n // 2, words), dtype=torch.int64, device=DEV)
        keys = pool[torch.randint(0, n // 2, (n,), device=DEV)].contiguous()
        del pool
        t, (u, inv) = cuda_time(lambda k=keys: ops.sort_unique(k, return_inverse=True))
        ok = bool(torch.equal(u[inv], keys))
        nu = len(u)
        del u, inv
        t_nu, _ = cuda_time(lambda k=keys: ops.sort_unique(k))
        rows.append(
            [
                words,
                f"{n:,}",
                f"{nu:,}",
                "full",
                f"{t:.4f}",
                f"{n / t:.3e}",
                f"{n / t_nu:.3e}",
                "yes" if ok else "NO",
            ]
        )
        if words == 1:
            k56 = keys & ((1 << 56) - 1)
            t56, _ = cuda_time(lambda k=k56: ops.sort_unique(k, return_inverse=True, end_bit=56))
            tt, _ = cuda_time(lambda k=k56: torch.unique(k.view(-1), return_inverse=True))
            rows.append([words, f"{n:,}", "", "56 bits", f"{t56:.4f}", f"{n / t56:.3e}", "", ""])
            rows.append(
                ["torch.unique", f"{n:,}", "", "56 bits", f"{tt:.4f}", f"{n / tt:.3e}", "", ""]
            )
            del k56
        ncpu = args.cpu_items
        host = ops.to_numpy(keys[:ncpu])
        t_cpu, _ = wall(lambda h=host: dedup(h))
        rows.append(
            [
                f"CPU {words}w",
                f"{ncpu:,}",
                "",
                "full",
                f"{t_cpu:.3f}",
                f"{ncpu / t_cpu:.3e}",
                "",
                "",
            ]
        )
        del keys
        torch.cuda.empty_cache()
    del rng
    table(
        "De-duplication (sort + unique + inverse), items/s",
        ["words", "items", "unique", "bits", "s", "items/s", "no-inverse /s", "u[inv]==keys"],
        rows,
    )


# --------------------------------------------------------------------------------- iteration
def inference_rate(ansatz, configs, batch_size, fn=None):
    """ln psi evaluations per second (no gradient), measured on `configs`."""
    x = ops.to_device(configs, DEV)
    fn = ansatz.log_psi if fn is None else fn
    with torch.no_grad():
        fn(x[:batch_size])
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for lo in range(0, len(x), batch_size):
            fn(x[lo : lo + batch_size])
        torch.cuda.synchronize()
    return len(x) / (time.perf_counter() - t0)


def unique_count(mol, S):
    """|U| of one iteration from S (GPU stage 1 only)."""
    dh = ops.DeviceHamiltonian.from_molecule(mol, DEV)
    S_t = ops.to_device(S, DEV)
    parts = [S_t]
    for lo in range(0, len(S_t), 32768):
        parts.append(
            ops.sort_unique(ops.coupled(dh, S_t[lo : lo + 32768])[1], end_bit=2 * mol.norb)
        )
    return len(ops.sort_unique(torch.cat(parts), end_bit=2 * mol.norb))


def warm_compiled(runner, configs, batch_size):
    """Compile the runner's inference pass before the timed step: a full batch, then a second
    size so the graph is recompiled once with a symbolic batch (the last, partial batch)."""
    fn = runner._pipeline._infer
    x = torch.from_numpy(np.ascontiguousarray(configs).view(np.int64))
    if runner.active_pipeline == "gpu":
        x = x.to(DEV)
    t0 = time.perf_counter()
    with torch.no_grad():
        for n in (batch_size, batch_size - 1):
            fn(x[:n])
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def fused_for(ansatz, args, share=True, kernel="auto", products=None):
    """The fused inference path with the block shape asked for (None: the library's); share:
    prefix sharing (and the prefix order of U in the pipeline) on or off; kernel: "auto" (the
    library's choice), "cuda" or "triton"; products: the CUDA kernel's (None: its default)."""
    from cuscikit.nnqs.fast_infer import FusedInference

    if products is not None:
        return FusedInference(ansatz, share_prefixes=share, products=products)
    return FusedInference(
        ansatz,
        block=args.fused_block,
        num_warps=args.fused_warps,
        share_prefixes=share,
        kernel=kernel,
    )


FUSED_KINDS = (
    "fused",
    "fused-noshare",
    "fused-cuda",
    "fused-triton",
    "fused-fma",
    "fused-fp64",
    "fused-tf32x3",
)


def _fused_kind(inference):
    """(prefix sharing, kernel, products) of a fused --inference entry."""
    kind = inference.split("-")[1] if "-" in inference else None
    kernel = kind if kind in ("cuda", "triton") else "auto"
    products = kind if kind in ("fma", "fp64", "tf32x3") else None
    return inference != "fused-noshare", kernel, products


def bench_iteration(args):
    mol = Molecule.load("N2/cc-pVDZ")
    base = Ansatz.for_molecule(mol, seed=0, device=DEV)
    pipelines = args.pipelines.split(",")
    inferences = args.inference.split(",")
    runs = [(p, i) for p in pipelines for i in inferences]
    # Every run infers ln psi over U: pick the largest source count whose iterations fit
    # the time budget (256,000 is the target; the table says what ran).
    probe = sample_space(mol, 200_000, seed=1)
    rates = {}
    if "module" in inferences:
        rates["module"] = inference_rate(base, probe, args.batch_size) * (
            2.0 if args.compile else 1.0
        )
    for kind in FUSED_KINDS:
        if kind in inferences:
            share, kernel, products = _fused_kind(kind)
            fn = fused_for(base, args, share=share, kernel=kernel, products=products)
            rates[kind] = inference_rate(base, probe, args.batch_size, fn)
    for k, v in rates.items():
        print(f"# {k} inference: {v:.3e} configurations/s expected (batch {args.batch_size})")
    n = args.sources
    while True:
        t_s, S = wall(lambda n=n: sample_space(mol, n))
        u = unique_count(mol, S)
        est = 1.2 * sum(u / rates[i] for _, i in runs)
        print(
            f"# {n:,} sources (sampled in {t_s:.1f} s): |U| = {u:,}, estimated {est:.0f} s "
            f"for {len(runs)} iteration(s)",
            flush=True,
        )
        if est < args.max_seconds or n <= 8000:
            break
        n //= 2
    # Warm-up on a small space: CUDA context, kernels, cuBLAS handles.
    Runner(mol, copy.deepcopy(base), SCISpace(mol, S[:2000]), max_space=None, pipeline="gpu").step()
    rows = []
    raw = {}
    for pipeline, inference in runs:
        torch.cuda.empty_cache()
        r = Runner(
            mol,
            copy.deepcopy(base),
            SCISpace(mol, S),
            max_space=None,
            topk=args.topk,
            pipeline=pipeline,
            batch_size=args.batch_size,
            compile_inference=args.compile,
            fused_inference=inference.startswith("fused"),
        )
        if inference in FUSED_KINDS[1:] or (
            inference == "fused" and (args.fused_block or args.fused_warps)
        ):  # another block shape, kernel or products, or no prefix sharing
            r._pipeline.fused_inference = fused_for(r.ansatz, args, *_fused_kind(inference))
        compiled = args.compile and inference == "module"
        t_compile = warm_compiled(r, probe, args.batch_size) if compiled else 0.0
        row = r.step()
        raw[(pipeline, inference)] = row
        tot = row["t_total"]
        rows.append(
            [
                pipeline + (" (compiled)" if compiled else "") + f", {inference} ln psi",
                f"{row['n_space']:,}",
                f"{row['n_coupled']:,}",
                f"{row['n_unique']:,}",
            ]
            + [
                f"{row['t_' + s]:.2f}"
                for s in ("generation", "dedup", "inference", "energy", "optimizer", "other")
            ]
            + [
                f"{tot:.2f}",
                f"{100 * row['t_inference'] / tot:.0f}%",
                f"{row['n_unique'] / row['t_inference']:.2e}",
                f"{row['peak_memory_bytes'] / 2**30:.1f}",
                f"{t_compile:.0f}",
                f"{row['e_coupled']:.12f}",
            ]
        )
        print("  ".join(rows[-1]), flush=True)
        del r
    title = f"One NNQS-SCI iteration, N2/cc-pVDZ, {n:,} sources"
    if len(raw) == 2:
        (a, ra), (b, rb) = raw.items()
        speed = ra["t_total"] / rb["t_total"]
        agree = abs(ra["e_coupled"] - rb["e_coupled"])
        title += (
            f": end-to-end speedup {speed:.2f}x; |dE| {'/'.join(a)} vs {'/'.join(b)} {agree:.1e} Ha"
        )
    table(
        title,
        [
            "pipeline",
            "|S|",
            "coupled",
            "unique",
            "gen s",
            "dedup s",
            "infer s",
            "energy s",
            "optim s",
            "other s",
            "total s",
            "infer %",
            "infer /s",
            "peak GiB",
            "compile s (untimed)",
            "E coupled",
        ],
        rows,
    )
    return raw


# ------------------------------------------------------------------------------------ memory
def bench_memory(args):
    rows = []
    for name in ("H2O/cc-pVDZ", "C2H4O", "C2/cc-pVDZ", "N2/cc-pVDZ"):
        mol = Molecule.load(name)
        S = sample_space(mol, args.space_size)
        # A small network: the intermediates measured here do not depend on its size, and
        # the default network would spend minutes on inference over U.
        ansatz = Ansatz.for_molecule(
            mol, seed=0, device=DEV, d_model=8, n_layers=1, phase_hidden=(16,)
        )
        caps = [None] + ([args.cap_fraction] if name == "N2/cc-pVDZ" else [])
        theo = None
        for frac in caps:
            torch.cuda.empty_cache()
            cap = None if frac is None else int(theo * frac)
            eng = CudaEngine(Hamiltonian.from_molecule(mol), DEV)
            pipe = Pipeline(eng, ansatz, batch_size=args.batch_size, budget=MemoryBudget(DEV, cap))
            torch.cuda.reset_peak_memory_stats()
            t, r = wall(lambda p=pipe, S=S: p.run(S, 1024))
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated()
            theo = r.peak_theoretical if theo is None else theo
            rows.append(
                [
                    name,
                    2 * mol.norb,
                    f"{len(S):,}",
                    f"{r.n_coupled:,}",
                    f"{r.n_unique:,}",
                    "-" if cap is None else f"{cap / 2**30:.2f}",
                    f"{theo / 2**30:.2f}",
                    f"{peak / 2**30:.2f}",
                    f"{peak / theo:.2f}",
                    r.n_batches,
                    f"{r.bytes_staged / 2**30:.2f}",
                    f"{t:.2f}",
                ]
            )
            print("  ".join(map(str, rows[-1])) + f"  retries={pipe.retries}", flush=True)
            torch.cuda.set_per_process_memory_fraction(1.0)
            del pipe, r
    table(
        f"Peak GPU memory at |S| = {args.space_size:,}: theoretical (all intermediates "
        "resident) vs measured (torch.cuda.max_memory_allocated)",
        [
            "system",
            "qubits",
            "|S|",
            "coupled",
            "unique",
            "cap GiB",
            "theory GiB",
            "measured GiB",
            "meas/theory",
            "batches",
            "staged GiB",
            "s",
        ],
        rows,
    )


def main():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("sections", nargs="+", choices=["kernels", "dedup", "iteration", "memory"])
    ap.add_argument("--n2-sources", type=int, default=100_000)
    ap.add_argument("--cr2-sources", type=int, default=8_000)
    ap.add_argument("--cpu-items", type=int, default=50_000_000)
    ap.add_argument("--dedup-n1", type=int, default=1 << 28)
    ap.add_argument("--dedup-n2", type=int, default=1 << 27)
    ap.add_argument("--sources", type=int, default=256_000)
    ap.add_argument("--topk", type=int, default=1024)
    ap.add_argument("--batch-size", type=int, default=65536)
    ap.add_argument("--space-size", type=int, default=50_000)
    ap.add_argument(
        "--cap-fraction",
        type=float,
        default=0.5,
        help="memory section: cap as a fraction of the theoretical peak",
    )
    ap.add_argument(
        "--max-seconds",
        type=float,
        default=300.0,
        help="iteration section: time budget of the timed iterations",
    )
    ap.add_argument(
        "--compile",
        action="store_true",
        help="iteration section: torch.compile the inference of both pipelines",
    )
    ap.add_argument(
        "--pipelines",
        default="gpu,baseline",
        help="iteration section: which pipelines to time (comma-separated)",
    )
    ap.add_argument(
        "--inference",
        default="module",
        help="iteration section: ln psi from the module and/or the fused kernel "
        "(comma-separated: module,fused,fused-noshare,fused-cuda,fused-triton,fused-fma, "
        "fused-fp64,fused-tf32x3; fused is the "
        "library's choice of kernel)",
    )
    ap.add_argument("--fused-block", type=int, default=None, help="fused kernel: block")
    ap.add_argument("--fused-warps", type=int, default=None, help="fused kernel: warps")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    info = kernels().device_info()
    print(f"# {machine()}; {info}; kernels built for sm_{kernels().build_arch()}")
    for s in args.sections:
        {
            "kernels": bench_kernels,
            "dedup": bench_dedup,
            "iteration": bench_iteration,
            "memory": bench_memory,
        }[s](args)
    print("\n\n######## summary ########")
    for t in TABLES:
        print_table(*t)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "gpu_pipeline.json"), "w") as f:
            json.dump(
                [{"title": t, "header": h, "rows": r} for t, h, r in TABLES],
                f,
                indent=1,
                default=str,
            )


if __name__ == "__main__":
    main()
