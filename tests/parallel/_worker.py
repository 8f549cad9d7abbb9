"""One rank of the multi-process tests (started by torchrun, mpiexec or the tests directly).

    python _worker.py OUT check   # communicator primitives + every de-dup case, results to OUT
    python _worker.py OUT dead    # rank 1 is killed after start-up; rank 0 must raise CommError
    python _worker.py OUT hang    # rank 1 stays alive but silent; rank 0 must time out

The communicator comes from `get_comm()` (the launcher's environment). Each rank writes
OUT/rank<r>.json (status, timings) and, in "check" mode, OUT/<case>-<words>-<method>-r<r>.npz
for the test process to verify against the single-process de-dup.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import traceback
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _cases import CASES, case_keys, key_values  # noqa: E402
from _exit import exit_now  # noqa: E402

from cuscikit.parallel import CommError, centralised_dedup, get_comm, global_dedup  # noqa: E402


def check_primitives(comm) -> None:
    r, P = comm.rank, comm.size
    assert comm.allreduce(r + 1) == P * (P + 1) // 2
    a = comm.allreduce(np.array([r, -r, 2.5]), op="max")
    assert a.tolist() == [P - 1, 0, 2.5], a
    assert comm.allreduce(np.array([r], np.int64), op="min").tolist() == [0]
    big = comm.allreduce(np.array([2**63 + r], dtype=np.uint64))  # uint64 sums wrap mod 2**64
    assert big.dtype == np.uint64 and int(big[0]) == (P * 2**63 + P * (P - 1) // 2) % 2**64
    root = P - 1
    src = np.arange(12, dtype=np.uint64).reshape(4, 3) + np.uint64(2**64 - 20)
    got = comm.bcast(src if r == root else None, root=root)
    assert got.dtype == np.uint64 and np.array_equal(got, src)
    mine = np.full((r, 3), r, dtype=np.uint64)  # rank r has r rows: rank 0 has none
    allg = comm.allgather(mine)
    assert [len(x) for x in allg] == list(range(P)) and all(
        (x == i).all() for i, x in enumerate(allg)
    )
    gat = comm.gather(mine.astype(np.float64) + 0.5, root=root)
    if r == root:
        assert [x.tolist() for x in gat] == [[[i + 0.5] * 3] * i for i in range(P)]
    else:
        assert gat is None
    # alltoallv: rank r sends (r + d) % 3 rows of value 100 r + d to rank d
    counts = np.array([(r + d) % 3 for d in range(P)])
    rows = np.concatenate([np.full(c, 100 * r + d, np.uint64) for d, c in enumerate(counts)])
    recv, rc = comm.alltoallv(np.stack([rows, ~rows], axis=1), counts)
    assert rc.tolist() == [(s + r) % 3 for s in range(P)]
    expect = np.concatenate([np.full((s + r) % 3, 100 * s + r, np.uint64) for s in range(P)])
    assert np.array_equal(recv[:, 0], expect) and np.array_equal(recv[:, 1], ~expect)
    z = (rows.astype(np.float64) + 1j * r).astype(np.complex128)  # 16-byte rows
    zr, _ = comm.alltoallv(z, counts)
    assert zr.dtype == np.complex128 and np.array_equal(zr.real, expect.astype(np.float64))
    ir, _ = comm.alltoallv(-rows.astype(np.int64), counts)  # 1-D int64
    assert ir.dtype == np.int64 and np.array_equal(ir, -expect.astype(np.int64))
    comm.barrier()


def run_check(comm, out: Path) -> dict:
    check_primitives(comm)
    timings = {}
    for case in CASES:
        for words in (1, 2, 3, 4) if case != "coupled" else (1, 2):
            keys = case_keys(case, words, comm.rank, comm.size)
            for method in ("sampling", "sampling-norebalance", "centralised"):
                t0 = time.perf_counter()
                if method == "centralised":
                    res = centralised_dedup(keys, comm)
                else:
                    res = global_dedup(
                        keys, comm, samples_per_rank=64, rebalance=method == "sampling"
                    )
                fetched = res.fetch(key_values(res.unique), comm)
                timings[f"{case}-{words}-{method}"] = time.perf_counter() - t0
                m = res.metrics
                np.savez(
                    out / f"{case}-{words}-{method}-r{comm.rank}.npz",
                    unique=res.unique,
                    offsets=res.offsets,
                    owner=res.owner,
                    index=res.index,
                    fetched=fetched,
                    counts=m.counts,
                    merged=m.merged,
                    received=m.received,
                    items=m.items,
                    unique_total=m.unique,
                )
    return {"timings": timings}


def main() -> int:
    out, mode = Path(sys.argv[1]), sys.argv[2]
    out.mkdir(parents=True, exist_ok=True)
    comm = get_comm()
    report = {"rank": comm.rank, "size": comm.size, "backend": comm.backend, "mode": mode}
    try:
        if mode == "check":
            report.update(run_check(comm, out))
            report["status"] = "ok"
        elif mode in ("dead", "hang"):
            comm.barrier()
            (out / f"started-r{comm.rank}").touch()
            if comm.rank == 1:
                if mode == "dead":
                    os.kill(os.getpid(), signal.SIGKILL)  # as the OOM killer would
                time.sleep(600)  # alive but silent; the test kills it
            t0 = time.perf_counter()
            try:
                global_dedup(case_keys("uneven", 2, comm.rank, comm.size), comm)
                report["status"] = "no error"
            except CommError as e:
                report["status"] = "CommError"
                report["message"] = str(e)
            report["seconds"] = time.perf_counter() - t0
        else:
            raise ValueError(mode)
    except Exception:
        report["status"] = "failed"
        report["traceback"] = traceback.format_exc()
    (out / f"rank{comm.rank}.json").write_text(json.dumps(report))
    if mode in ("dead", "hang"):
        os._exit(0)  # skip destroying a group whose peer is gone
    comm.close()
    return 0 if report["status"] == "ok" else 1


if __name__ == "__main__":
    exit_now(main())
