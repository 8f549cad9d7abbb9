"""Multi-GPU scaling of one NNQS-SCI stage 1 (+ inference) for issue 6 (seed 000, figures 10-11).

Launched with torchrun, one process per GPU (NCCL), or on CPU ranks (gloo) where there is no GPU:

    torchrun --standalone --nproc-per-node P benchmarks/multi_gpu_scaling.py \
        --mode both --sources 256000 --sources-per-rank 64000 --out results/scaling.json

Per rank, for its slice of the source set S:

- coupled:   coupled configurations of its sources (`cuscikit.gpu.ops.coupled` on cuda:LOCAL_RANK;
             the compiled CPU `Hamiltonian.coupled` on CPU ranks);
- dedup:     `cuscikit.parallel.gpu_dedup.global_dedup_tensors` (local sort + unique, regular
             samples, splitters, all_to_all of counts and keys, merge, rebalance, routing),
             on the device, NCCL between GPUs;
- infer:     `Ansatz.for_molecule(mol, seed=0).log_psi` over the first ``--infer-limit`` keys of
             the rank's unique slice (all of it with --infer-limit 0 ... -1 skips), in batches;
             nothing is extrapolated: the table says how many were evaluated;
- route:     psi from the owners back to every coupled configuration of the rank (`fetch`; keys that
             were not evaluated carry zeros: the bytes moved are the same).

Strong scaling: --sources in total, split over the P ranks. Weak scaling: --sources-per-rank
on every rank. Stage seconds are the slowest rank's (each rank synchronises its device before
reading the clock). Source sets: random same-spin excitations of HF (up to --max-rank moves
each, vectorised like `_common.random_excitations`, fixed seed), de-duplicated; every rank
builds the same set and takes its contiguous slice.

Rank 0 prints a table and appends the run to the JSON file --out (a list of runs); the table
then includes the earlier runs of the same file, so that launching P = 1, 2, 4, 8 one after the
other gives parallel efficiencies against the P = 1 run.
"""

from __future__ import annotations

import os

# The GPU machines need NVLink multicast off; set before torch.distributed starts NCCL.
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import socket  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
from _common import machine, print_table  # noqa: E402
from cuscikit.parallel.gpu_dedup import global_dedup_tensors  # noqa: E402
from cuscikit.sci.dedup import dedup  # noqa: E402

from cuscikit import Ansatz, Molecule  # noqa: E402
from cuscikit.parallel.comm import TorchComm  # noqa: E402
from cuscikit.sci.configs import from_bits, hf_configuration, to_bits  # noqa: E402
from cuscikit.sci.hamiltonian import Hamiltonian  # noqa: E402

STAGES = ("coupled", "dedup", "infer", "route")


def source_set(mol, n: int, max_rank: int, seed: int) -> np.ndarray:
    """n distinct configurations: HF with 0..max_rank random same-spin moves, shuffled."""
    norb = mol.norb
    base = to_bits(hf_configuration(norb, mol.nelec), norb)[0]
    rng = np.random.default_rng(seed)
    parts: list[np.ndarray] = []
    draw = max(n, 64)
    while True:
        bits = np.repeat(base[None], draw, axis=0)
        moves = rng.integers(0, max_rank + 1, draw)
        for step in range(max_rank):
            spin = rng.integers(0, 2, draw)
            for s in (0, 1):
                rows = np.flatnonzero((moves > step) & (spin == s))
                sub = bits[rows, s::2]
                occ = np.argmax(rng.random(sub.shape) * sub, axis=1)
                vir = np.argmax(rng.random(sub.shape) * (1 - sub), axis=1)
                sub[np.arange(len(rows)), occ] = 0
                sub[np.arange(len(rows)), vir] = 1
                bits[rows, s::2] = sub
        parts.append(from_bits(bits))
        have = dedup(np.concatenate(parts))[0]
        if len(have) >= n:
            break
        parts, draw = [have], draw * 2
    perm = np.random.default_rng(seed + 1).permutation(len(have))[:n]
    return np.ascontiguousarray(have[np.sort(perm)])


class Runner:
    def __init__(self, args, comm: TorchComm, dev: torch.device):
        self.args, self.comm, self.dev = args, comm, dev
        self.mol = Molecule.load(args.molecule)
        self.norb = self.mol.norb
        if dev.type == "cuda":
            from cuscikit.gpu import ops

            self.ops = ops
            self.dh = ops.DeviceHamiltonian.from_molecule(self.mol, dev)
        else:
            self.H = Hamiltonian.from_molecule(self.mol)
        self.ansatz = None
        if args.infer_limit >= 0:
            self.ansatz = Ansatz.for_molecule(self.mol, seed=0, device=dev)
            self.ansatz.eval()

    def sync(self):
        if self.dev.type == "cuda":
            torch.cuda.synchronize(self.dev)

    def now(self) -> float:
        self.sync()
        return time.perf_counter()

    def one(self, total_sources: int) -> dict:
        a, comm, P, r = self.args, self.comm, self.comm.size, self.comm.rank
        src = source_set(self.mol, total_sources, a.max_rank, a.seed)
        cuts = np.linspace(0, len(src), P + 1).astype(np.int64)
        mine = src[cuts[r] : cuts[r + 1]]
        comm.barrier()
        t = {}

        t0 = self.now()
        if self.dev.type == "cuda":
            src_t = self.ops.to_device(mine, self.dev)
            _, keys, _ = self.ops.coupled(self.dh, src_t)
        else:
            cfg = self.H.coupled(mine).configs
            keys = torch.from_numpy(np.ascontiguousarray(cfg).view(np.int64))
        t["coupled"] = self.now() - t0

        t0 = self.now()
        res = global_dedup_tensors(keys, comm, samples_per_rank=a.samples_per_rank,
                                   end_bit=2 * self.norb)
        t["dedup"] = self.now() - t0
        n_coupled, n_local_unique = len(keys), int(res.request_counts.sum())
        del keys

        u = res.unique
        n_eval = 0
        psi = torch.zeros(len(u), dtype=torch.complex64, device=self.dev)
        t0 = self.now()
        if self.ansatz is not None:
            lim = len(u) if a.infer_limit == 0 else min(len(u), a.infer_limit)
            with torch.no_grad():
                for lo in range(0, lim, a.infer_batch):
                    hi = min(lim, lo + a.infer_batch)
                    psi[lo:hi] = self.ansatz.log_psi(u[lo:hi]).to(psi.dtype)
            n_eval = lim
        t["infer"] = self.now() - t0

        t0 = self.now()
        back = res.fetch(psi, comm)
        t["route"] = self.now() - t0
        assert len(back) == n_coupled

        per_rank = np.array([n_coupled, n_local_unique, len(u), n_eval, *(t[s] for s in STAGES)],
                            dtype=np.float64)
        table = np.stack(comm.allgather(per_rank))
        m = res.metrics
        row = m.as_dict()
        sec = {s: float(table[:, 4 + k].max()) for k, s in enumerate(STAGES)}
        sec["total"] = float((table[:, 4:4 + len(STAGES)].sum(axis=1)).max())
        evaluated = table[:, 3].astype(np.int64)
        return {
            "ranks": P,
            "sources": int(len(src)),
            "sources_per_rank": [int(x) for x in np.diff(cuts)],
            "coupled_total": int(table[:, 0].sum()),
            "coupled_per_rank": table[:, 0].astype(np.int64).tolist(),
            "local_unique_total": int(table[:, 1].sum()),
            "global_unique": int(m.unique),
            "owned_per_rank": m.counts.tolist(),
            "received_per_rank": m.received.tolist(),
            "merged_per_rank": m.merged.tolist(),
            **{k: row[k] for k in ("max_min", "cv", "received_max_min", "received_cv",
                                   "merged_max_min", "merged_cv")},
            "seconds": sec,
            "dedup_phases": m.seconds,
            "coupled_per_s": float(table[:, 0].sum() / sec["coupled"]) if sec["coupled"] else 0,
            "dedup_items_per_s": row["items_per_s"],
            "inferred_per_rank": evaluated.tolist(),
            "inferred_total": int(evaluated.sum()),
            "infer_per_s": float(evaluated.sum() / sec["infer"]) if sec["infer"] > 0 else 0.0,
        }


def _eff(mode: str, P: int, t1: float | None, tp: float) -> str:
    if t1 is None or tp <= 0:
        return "-"
    return f"{(t1 / (P * tp) if mode == 'strong' else t1 / tp):.2f}"


def _stage1(run: dict) -> float:
    return run["seconds"]["coupled"] + run["seconds"]["dedup"]


def _complete(run: dict) -> bool:
    """Inference covered every unique key (or was skipped): the total is the whole stage."""
    return run["inferred_total"] in (0, run["global_unique"])


def rows_for(runs: list[dict], mode: str) -> list[list]:
    """Table rows; efficiencies against the P = 1 run of the same size (strong: t1 / (P tP),
    weak: t1 / tP), for stage 1 (coupled + dedup) and for the total (only when inference ran
    over every unique key or not at all: a capped inference does not scale with the work)."""
    base = {}
    for run in runs:
        if run["mode"] == mode and run["ranks"] == 1:
            base[(run["size_key"], run["device"])] = run
    out = []
    for run in runs:
        if run["mode"] != mode:
            continue
        s, P = run["seconds"], run["ranks"]
        b = base.get((run["size_key"], run["device"]))
        eff1 = _eff(mode, P, b and _stage1(b), _stage1(run))
        ok = b is not None and _complete(b) and _complete(run)
        eff = _eff(mode, P, b["seconds"]["total"] if ok else None, s["total"])
        out.append([
            run["device"], P, f"{run['sources']:,}", f"{run['coupled_total']:,}",
            f"{run['global_unique']:,}", f"{s['coupled']:.3f}",
            f"{s['dedup']:.3f} ({run['dedup_phases']['local']:.3f})",
            f"{s['infer']:.3f} ({run['inferred_total']:,})", f"{s['route']:.3f}",
            f"{s['total']:.3f}", eff1, eff,
            f"{run['received_max_min']:.3f}/{run['received_cv']:.3f}",
            f"{run['merged_max_min']:.3f}/{run['merged_cv']:.3f}",
            f"{run['max_min']:.3f}/{run['cv']:.4f}", f"{run['dedup_items_per_s']:.3e}",
        ])
    return out


HEADER = ["device", "P", "sources", "coupled", "global unique", "coupled s", "dedup s (local)",
          "infer s (n)", "route s", "total s", "eff stage1", "eff total", "recv max/min/CV",
          "merged max/min/CV", "owned max/min/CV", "dedup items/s"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", choices=("strong", "weak", "both"), default="both")
    p.add_argument("--sources", type=int, default=256_000, help="strong scaling: total sources")
    p.add_argument("--sources-per-rank", type=int, default=64_000, help="weak scaling")
    p.add_argument("--molecule", default="N2/cc-pVDZ")
    p.add_argument("--max-rank", type=int, default=4, help="max same-spin moves per source")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--samples-per-rank", type=int, default=1024)
    p.add_argument("--infer-limit", type=int, default=0,
                   help="keys per rank to evaluate (0: the whole slice; -1: skip inference)")
    p.add_argument("--infer-batch", type=int, default=65536)
    p.add_argument("--warmup-sources", type=int, default=256,
                   help="sources per rank of an untimed warm-up run (0: none)")
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    p.add_argument("--out", default="multi_gpu_scaling.json")
    args = p.parse_args()

    if "WORLD_SIZE" not in os.environ:  # plain python: one rank
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(_free_port()))
    use_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    comm = TorchComm(backend="nccl" if use_cuda else "gloo")
    dev = comm.device if use_cuda else torch.device("cpu")
    P = comm.size
    runner = Runner(args, comm, dev)
    if args.warmup_sources > 0:
        runner.one(args.warmup_sources * P)

    results = []
    modes = ["strong", "weak"] if args.mode == "both" else [args.mode]
    for mode in modes:
        total = args.sources if mode == "strong" else args.sources_per_rank * P
        run = runner.one(total)
        run["mode"] = mode
        run["size_key"] = args.sources if mode == "strong" else args.sources_per_rank
        run["device"] = f"{dev.type}/{comm.backend}"
        results.append(run)

    if comm.rank == 0:
        out = Path(args.out)
        old = json.loads(out.read_text())["runs"] if out.exists() else []
        meta = {"machine": machine(), "molecule": args.molecule, "torch": torch.__version__,
                "args": vars(args), "nccl_nvls_enable": os.environ.get("NCCL_NVLS_ENABLE")}
        for r in results:
            r["meta"] = meta
        runs = [r for r in old if not any(
            (r["mode"], r["ranks"], r["size_key"], r["device"])
            == (n["mode"], n["ranks"], n["size_key"], n["device"]) for n in results)] + results
        runs.sort(key=lambda r: (r["mode"], r["device"], r["size_key"], r["ranks"]))
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"runs": runs}, indent=1))
        print(f"\n{machine()}; {args.molecule}; this launch: P = {P} on {dev}")
        for mode in modes:
            what = (f"{args.sources:,} sources in total" if mode == "strong"
                    else f"{args.sources_per_rank:,} sources per rank")
            print_table(f"{mode} scaling ({what}; seconds: slowest rank; eff vs P = 1 in {out})",
                        HEADER, rows_for([r for r in runs if r["size_key"] == (
                            args.sources if mode == "strong" else args.sources_per_rank)], mode))
    comm.close()


if __name__ == "__main__":
    main()
