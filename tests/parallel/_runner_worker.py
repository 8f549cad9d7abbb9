"""One rank of the multi-rank Runner tests (started by torchrun or mpiexec).

    python _runner_worker.py OUT check [CASE,...]  # cases of CASES and/or "resumed" (default: all)
    python _runner_worker.py OUT dead              # rank 1 is killed in iteration 2; rank 0 raises
    python _runner_worker.py OUT gpu [CASE,...]    # one rank per GPU, gpu pipeline, NCCL

The communicator comes from `get_comm()`. Each rank writes OUT/rank<r>.json: per case the
energy history, counts and loads, and digests of its model replica and of S (which must agree
over ranks); the test process compares the energies with a single-rank run of `make_runner`.
"""

from __future__ import annotations

import faulthandler
import hashlib
import json
import os
import signal
import sys
import time
import traceback
from pathlib import Path

import numpy as np
import torch

from cuscikit import Molecule
from cuscikit.nnqs import Ansatz, Runner
from cuscikit.nnqs.runner import Callback
from cuscikit.parallel import CommError, get_comm

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the helper beside this script
from _exit import exit_now  # noqa: E402

CASES = {
    # S = {HF} at first: with P ranks, P - 1 of them have no sources in iteration 1
    "LiH": dict(system="LiH", iters=12, topk=16, max_space=None, inner_steps=0),
    # the max_space cap drops configurations from iteration 4 on; several inference batches
    # (of S too, in the inner steps, whose H_SS rows are spread over the ranks)
    "LiH-capped": dict(system="LiH", iters=10, topk=16, max_space=60, batch_size=32, inner_steps=2),
    "H2O": dict(system="H2O", iters=10, topk=32, estimator="variational", inner_steps=1),
    # the selected-CI teacher: held on over the whole run, solved from H_SS gathered from the
    # ranks, pulling every rank's rows in the step and in its 2 inner steps
    "H2O-teacher": dict(
        system="H2O",
        iters=8,
        topk=32,
        inner_steps=1,
        teacher=1.0,
        teacher_until=4,
        teacher_inner_steps=2,
    ),
}
RESUME = dict(system="LiH", iters=6, topk=8, max_space=40, inner_steps=1)
RESUME_SPLIT = 3
STACKS_AFTER_S = 150  # a passing check takes 8-13 s on 2 cores; the launch timeout is 240 s
COLUMNS = (
    "e_tot",
    "e_coupled",
    "e_variational",
    "e_pt2",
    "loss",
    "n_space",
    "n_coupled",
    "n_unique",
)
LOADS = ("sources_max", "sources_min", "unique_max", "unique_min", "dedup_max_min")
TEACHER = ("teacher_weight", "e_teacher", "teacher_loss", "inner_steps")


def make_runner(case: dict, comm=None, device: str = "cpu") -> Runner:
    """The Runner of a case (float64 ansatz, seed 0), on one rank when comm is None; on a
    CUDA device with the gpu pipeline."""
    kw = {k: v for k, v in case.items() if k not in ("system", "iters")}
    kw.setdefault("teacher", 0)  # the plain method unless the case names the teacher
    if device != "cpu":
        kw["pipeline"] = "gpu"
    mol = Molecule.load(case["system"])
    ansatz = Ansatz.for_molecule(mol, seed=0, dtype=torch.float64, device=device)
    return Runner(mol, ansatz, seed=0, comm=comm, **kw)


def digest(*arrays) -> str:
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def summary(runner: Runner) -> dict:
    h = runner.history
    out = {c: h[c].tolist() for c in COLUMNS}
    out.update({c: h[c].tolist() for c in LOADS if c in h})
    # NaN (no CI energy at hand) as None: replicas compare equal after the JSON round trip
    out.update({c: [None if v != v else v for v in h[c].tolist()] for c in TEACHER if c in h})
    params = [p.detach().cpu().numpy() for p in runner.ansatz.parameters()]
    out["params"] = digest(*params)
    out["space"] = digest(runner.space.configs)
    return out


def run_check(comm, out: Path, names: list[str], device: str = "cpu") -> dict:
    report: dict = {"cases": {}, "seconds": {}}
    for name, case in CASES.items():
        if name not in names:
            continue
        t0 = time.perf_counter()
        runner = make_runner(case, comm, device)
        runner.run(case["iters"], progress=False)
        report["seconds"][name] = time.perf_counter() - t0
        report["cases"][name] = summary(runner)
    if "resumed" not in names:
        return report
    # checkpoint written by rank 0 after RESUME_SPLIT iterations, resumed by every rank
    t0 = time.perf_counter()
    ck = out / "resume.h5"
    first = make_runner(RESUME, comm)
    first.run(RESUME_SPLIT, progress=False, checkpoint=str(ck), checkpoint_every=2)
    second = make_runner(RESUME, comm).load(ck)
    second.run(RESUME["iters"] - second.iteration, progress=False)
    report["cases"]["resumed"] = summary(second)
    report["seconds"]["resumed"] = time.perf_counter() - t0
    return report


class _DieAt(Callback):
    def __init__(self, comm, iteration: int, out: Path):
        self.comm, self.iteration, self.out = comm, iteration, out

    def on_step_end(self, runner, row) -> bool:
        if runner.iteration == self.iteration:
            (self.out / f"started-r{self.comm.rank}").touch()
            if self.comm.rank == 1:
                os.kill(os.getpid(), signal.SIGKILL)  # as the OOM killer would
        return False


def main() -> int:
    out, mode = Path(sys.argv[1]), sys.argv[2]
    out.mkdir(parents=True, exist_ok=True)
    # a rank that is still running long after a passing run would have ended prints where it
    # waits (stderr, all threads), so a hang shows up in the test's failure message
    faulthandler.dump_traceback_later(STACKS_AFTER_S, exit=False)
    torch.set_num_threads(1)
    comm = get_comm()
    report = {"rank": comm.rank, "size": comm.size, "backend": comm.backend, "mode": mode}
    try:
        if mode == "check":
            names = sys.argv[3].split(",") if len(sys.argv) > 3 else [*CASES, "resumed"]
            report.update(run_check(comm, out, names))
            report["status"] = "ok"
        elif mode == "gpu":
            from cuscikit.parallel.comm import local_rank

            device = f"cuda:{local_rank() % torch.cuda.device_count()}"
            torch.cuda.set_device(torch.device(device))
            names = sys.argv[3].split(",") if len(sys.argv) > 3 else list(CASES)
            report.update(run_check(comm, out, names, device))
            report["device"] = device
            report["status"] = "ok"
        elif mode == "dead":
            runner = make_runner(CASES["LiH"], comm)
            t0 = time.perf_counter()
            try:
                runner.run(10, [_DieAt(comm, 2, out)], progress=False)
                report["status"] = "no error"
            except CommError as e:
                report["status"] = "CommError"
                report["message"] = str(e)
                report["iteration"] = runner.iteration
            report["seconds"] = time.perf_counter() - t0
        else:
            raise ValueError(mode)
    except Exception:
        report["status"] = "failed"
        report["traceback"] = traceback.format_exc()
    (out / f"rank{comm.rank}.json").write_text(json.dumps(report))
    if mode == "dead":
        os._exit(0)  # skip destroying a group whose peer is gone
    comm.close()
    return 0 if report["status"] == "ok" else 1


if __name__ == "__main__":
    exit_now(main())
