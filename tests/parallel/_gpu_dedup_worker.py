"""One rank of the tensor de-dup tests (`global_dedup` on tensors), started by torchrun or mpiexec.

    python _gpu_dedup_worker.py OUT cpu    # CPU tensors; communicator from get_comm() (gloo/MPI)
    python _gpu_dedup_worker.py OUT cuda   # CUDA tensors on cuda:LOCAL_RANK, NCCL

Each rank writes OUT/rank<r>.json (status) and OUT/<case>-<words>-<variant>-r<r>.npz for the
test process to compare with the single-process numpy de-dup of the union.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _cases import CASES, case_keys, key_values  # noqa: E402
from _exit import exit_now  # noqa: E402

WORDS = {case: (1, 2, 4) for case in CASES} | {"coupled": (1,)}


def variants(device: str) -> list[tuple[str, str, bool]]:
    """(name, impl, rebalance)."""
    if device == "cuda":
        return [
            ("kernel", "auto", True),
            ("kernel-norebalance", "auto", False),
            ("torch", "torch", True),
        ]
    return [("numpy", "auto", True), ("numpy-norebalance", "auto", False), ("torch", "torch", True)]


def run(out: Path, device: str) -> dict:
    import torch

    from cuscikit.parallel import get_comm, global_dedup

    if device == "cuda":
        os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
        comm = get_comm("nccl")
        dev = comm.device
    else:
        comm = get_comm()
        dev = torch.device("cpu")
    report = {"rank": comm.rank, "size": comm.size, "backend": comm.backend}
    for case in CASES:
        for words in WORDS[case]:
            keys = case_keys(case, words, comm.rank, comm.size)
            t = torch.from_numpy(np.ascontiguousarray(keys).view(np.int64)).to(dev)
            for name, impl, rebalance in variants(device):
                res = global_dedup(t, comm, samples_per_rank=64, rebalance=rebalance, impl=impl)
                assert res.unique.device == t.device and res.index.device == t.device
                u = np.ascontiguousarray(res.unique.cpu().numpy()).view(np.uint64)
                vals = torch.from_numpy(key_values(u)).to(dev)
                fetched = res.fetch(vals, comm)
                m = res.metrics
                np.savez(
                    out / f"{case}-{words}-{name}-r{comm.rank}.npz",
                    unique=u,
                    offsets=res.offsets,
                    owner=res.owner.cpu().numpy(),
                    index=res.index.cpu().numpy(),
                    fetched=fetched.cpu().numpy(),
                    counts=m.counts,
                    merged=m.merged,
                    items=m.items,
                    unique_total=m.unique,
                )
    comm.close()
    return report


def main() -> int:
    out, device = Path(sys.argv[1]), sys.argv[2]
    out.mkdir(parents=True, exist_ok=True)
    rank = int(os.environ.get("RANK", os.environ.get("PMI_RANK", 0)))
    report = {"rank": rank}
    try:
        report.update(run(out, device))
        report["status"] = "ok"
    except Exception:
        report["status"] = "failed"
        report["traceback"] = traceback.format_exc()
    (out / f"rank{report['rank']}.json").write_text(json.dumps(report))
    return 0 if report["status"] == "ok" else 1


if __name__ == "__main__":
    exit_now(main())
