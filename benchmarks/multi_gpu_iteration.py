"""One NNQS-SCI iteration of the library Runner on P GPUs (one rank per GPU, NCCL).

Every rank builds the same source space S (breadth-first excitations of HF, seeded), a Runner
with the gpu pipeline on ``cuda:LOCAL_RANK`` and a `TorchComm`, takes one untimed warm-up
iteration on a small space, then times one iteration from S. Rank 0 prints the stage breakdown,
the per-rank loads and the energies, and appends the run to a JSON file; launched for P = 1 and
P = 2 one after the other, the table compares them (speed-up, |dE| between rank counts).

    torchrun --standalone --nproc-per-node 1 benchmarks/multi_gpu_iteration.py --out it.json
    torchrun --standalone --nproc-per-node 2 benchmarks/multi_gpu_iteration.py --out it.json

Anchor: the published two-A100 run of this iteration (N2/cc-pVDZ, 256,000 sources) took 825 s
("A Fully GPU-Accelerated Framework for High-Performance Configuration Interaction Selection
with Neural Network Quantum States"); on one H200 our single-GPU pipeline took 177 s with the
compiled network (benchmarks/results/gpu_pipeline_h200.md).
"""

from __future__ import annotations

import os

# Shared GPU hosts need NVLink multicast off; set before torch.distributed starts NCCL.
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import socket  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
from _common import machine, print_table  # noqa: E402
from benchmarks_space import sample_space  # noqa: E402

from cuscikit import Ansatz, Molecule, Runner, SCISpace  # noqa: E402
from cuscikit.parallel.comm import TorchComm, local_rank  # noqa: E402

STAGES = ("generation", "dedup", "inference", "energy", "optimizer", "other")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--molecule", default="N2/cc-pVDZ")
    ap.add_argument("--sources", type=int, default=256_000)
    ap.add_argument("--topk", type=int, default=1024)
    ap.add_argument("--batch-size", type=int, default=65536)
    ap.add_argument("--compile", action="store_true", help="torch.compile the inference")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default="multi_gpu_iteration.json")
    ap.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default="cuda",
        help="cpu: CPU ranks on gloo with the baseline pipeline (a small-size rehearsal)",
    )
    args = ap.parse_args()
    if "WORLD_SIZE" not in os.environ:  # plain python: one rank
        os.environ.update(
            RANK="0",
            WORLD_SIZE="1",
            LOCAL_RANK="0",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(_free_port()),
        )
    if args.device == "cuda":
        dev = torch.device("cuda", local_rank() % torch.cuda.device_count())
        torch.cuda.set_device(dev)
        comm = TorchComm(backend="nccl")
    else:
        dev = torch.device("cpu")
        comm = TorchComm(backend="gloo")
    P = comm.size
    mol = Molecule.load(args.molecule)
    t0 = time.perf_counter()
    S = sample_space(mol, args.sources, seed=args.seed, device=dev)  # the same on every rank
    t_space = time.perf_counter() - t0

    def runner(space) -> Runner:
        ansatz = Ansatz.for_molecule(mol, seed=0, device=dev)
        return Runner(
            mol,
            ansatz,
            SCISpace(mol, space),
            comm=comm,
            max_space=None,
            topk=args.topk,
            pipeline="gpu" if dev.type == "cuda" else "baseline",
            batch_size=args.batch_size,
            compile_inference=args.compile,
            # the pipeline's stages alike on every P: no inner steps and no teacher (whose
            # eigensolve and inner steps over a sampled S this size are another measurement)
            inner_steps=0,
            teacher=0,
            verbose=0,
        )

    t0 = time.perf_counter()
    # warm-up: CUDA context, kernels, NCCL, cuBLAS, compilation
    runner(S[: min(4000, len(S))]).step()
    t_warm = time.perf_counter() - t0
    comm.barrier()
    r = runner(S)
    row = r.step()
    comm.barrier()
    if comm.rank != 0:
        comm.close()
        return
    run = {
        "ranks": P,
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "molecule": args.molecule,
        "sources": int(row["n_space"]),
        "coupled": int(row["n_coupled"]),
        "unique": int(row["n_unique"]),
        "e_coupled": row["e_coupled"],
        "e_variational": row["e_variational"],
        "compile": args.compile,
        "seconds": {s: row[f"t_{s}"] for s in STAGES} | {"total": row["t_total"]},
        "busy_max": row.get("t_busy_max"),
        "busy_min": row.get("t_busy_min"),
        "unique_per_rank": [row.get("unique_min"), row.get("unique_max")],
        "peak_gib": row["peak_memory_bytes"] / 2**30,
        "peak_theoretical_gib": row["peak_theoretical_bytes"] / 2**30,
        "space_s": t_space,
        "warmup_s": t_warm,
        "machine": machine(),
        "torch": torch.__version__,
    }
    out = Path(args.out)
    runs = json.loads(out.read_text())["runs"] if out.exists() else []
    runs = [
        x
        for x in runs
        if (x["ranks"], x["sources"], x["compile"]) != (P, run["sources"], args.compile)
    ] + [run]
    runs.sort(key=lambda x: (x["sources"], x["compile"], x["ranks"]))
    out.write_text(json.dumps({"runs": runs}, indent=1))
    base = {(x["sources"], x["compile"]): x for x in runs if x["ranks"] == 1}
    rows = []
    for x in runs:
        one = base.get((x["sources"], x["compile"]))
        sec = x["seconds"]
        speed = f"{one['seconds']['total'] / sec['total']:.2f}x" if one else "-"
        de = f"{abs(x['e_coupled'] - one['e_coupled']):.1e}" if one else "-"
        rows.append(
            [x["ranks"], f"{x['sources']:,}", f"{x['coupled']:,}", f"{x['unique']:,}"]
            + [f"{sec[s]:.2f}" for s in STAGES]
            + [f"{sec['total']:.2f}", speed, de, f"{x['peak_gib']:.1f}"]
        )
    print(f"\n{machine()}; {args.molecule}; compiled inference: {args.compile}")
    print_table(
        "One NNQS-SCI iteration of the library Runner, one rank per GPU (rank 0's stage "
        "seconds; anchor: 825 s on 2 A100 in the published run, 177 s on 1 H200 before)",
        [
            "GPUs",
            "|S|",
            "coupled (rank 0)",
            "unique",
            *[f"{s} s" for s in STAGES],
            "total s",
            "speed-up vs 1",
            "|dE| vs 1 (Ha)",
            "peak GiB",
        ],
        rows,
    )
    comm.close()


if __name__ == "__main__":
    main()
