"""The Runner on several ranks: the same energies as one rank, per iteration, to 1e-8 Ha.

In-process tests run P ranks as threads (`cuscikit.parallel.run_ranks`: uneven shares, more
ranks than sources, bad input, a failing rank); the `mpi` tests start real ranks with torchrun
(gloo) and mpiexec (mpi4py), 2 and 4 of them, through `_runner_worker.py`, and the command
line under mpiexec. References are single-rank runs of the same cases in this process
(float64 ansatz, seed 0).
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from _launch import env, launch, mpiexec, torchrun
from _runner_worker import CASES, RESUME, RESUME_SPLIT, TEACHER, make_runner, summary

from cuscikit.cli import main
from cuscikit.nnqs.checkpoint import CheckpointError
from cuscikit.nnqs.runner import Callback
from cuscikit.parallel import CommError, SerialComm
from cuscikit.parallel.comm import ThreadComm, _ThreadShared, run_ranks

WORKER = Path(__file__).with_name("_runner_worker.py")
TOL = 1e-8  # Ha, per iteration
ENERGIES = ("e_tot", "e_coupled", "e_variational", "e_pt2")
COUNTS = ("n_space", "n_coupled", "n_unique")


@functools.cache
def reference(name: str) -> dict:
    """Single-rank summary of a case of `_runner_worker.CASES` (or the uninterrupted resume)."""
    case = RESUME if name == "resumed" else CASES[name]
    runner = make_runner(case)
    runner.run(case["iters"], progress=False)
    return summary(runner)


def max_energy_error(got: dict, ref: dict) -> float:
    assert len(got["e_tot"]) == len(ref["e_tot"])
    return max(float(np.max(np.abs(np.subtract(got[c], ref[c])))) for c in ENERGIES)


def check_against_reference(got: dict, ref: dict, what: str, P: int) -> float:
    err = max_energy_error(got, ref)
    assert err <= TOL, (what, err)
    for c in COUNTS:  # the same S, coupled sets and unique sets in every iteration
        assert got[c] == ref[c], (what, c)
    np.testing.assert_allclose(got["loss"], ref["loss"], rtol=1e-7, atol=1e-9, err_msg=what)
    for c in TEACHER:  # the teacher's weight, CI energy of S, loss and inner steps
        assert (c in got) == (c in ref), (what, c)
        if c in ref:
            a, b = (np.array(x[c], dtype=float) for x in (got, ref))  # None: NaN
            np.testing.assert_allclose(a, b, rtol=1e-7, atol=1e-9, err_msg=f"{what} {c}")
    if P > 1:  # S = {HF} in iteration 1: one rank has the source, the others none
        assert got["sources_max"][0] == 1 and got["sources_min"][0] == 0, what
        assert all(u >= 0 for u in got["unique_min"]), what
    return err


# --- in process: ranks as threads -----------------------------------------------------------------


def test_single_rank_comm_is_todays_runner():
    case = CASES["LiH-capped"]
    plain = make_runner(case)
    plain.run(6, progress=False)
    serial = make_runner(case, SerialComm())
    serial.run(6, progress=False)
    a, b = plain.history, serial.history
    assert list(a.columns) == list(b.columns)
    same = [c for c in a.columns if not c.startswith("t_") and c != "peak_memory_bytes"]
    assert a[same].equals(b[same])  # bit for bit
    assert np.array_equal(plain.space.configs, serial.space.configs)


@pytest.mark.parametrize("P", [3, 8])
def test_thread_ranks_match_single_rank(P):
    """Uneven shares (3 ranks), more ranks than sources for several iterations (8)."""
    case = dict(CASES["LiH-capped"], iters=8)
    ref = make_runner(case)
    ref.run(case["iters"], progress=False)

    def rank(comm):
        runner = make_runner(case, comm)
        runner.run(case["iters"], progress=False)
        return summary(runner), runner.history

    results = run_ranks(P, rank)
    first, history = results[0]
    for other, _ in results[1:]:  # identical replicas, histories and S on every rank
        assert other == first
    check_against_reference(first, summary(ref), f"threads P={P}", P)
    assert (history["n_ranks"] == P).all()
    assert (history["dedup_items"] >= history["n_unique"]).all()
    assert (history["unique_max"] - history["unique_min"] <= 1).all()  # exact equal shares
    for name, total in (("sources", "n_space"), ("coupled", "n_coupled"), ("unique", "n_unique")):
        per_rank = history[[f"{name}_r{k}" for k in range(P)]]  # each rank's own count
        assert (per_rank.sum(axis=1) == history[total]).all(), name
        assert (per_rank.max(axis=1) == history[f"{name}_max"]).all(), name
    received = history[[f"received_r{k}" for k in range(P)]].sum(axis=1)
    assert (received >= history["n_unique"]).all() and f"unique_r{P}" not in history


# 2 ranks with the dense solve; 3 (uneven shares) with Davidson's
@pytest.mark.parametrize(("P", "dense_limit"), [(2, None), (3, 10)])
def test_teacher_on_thread_ranks_matches_single_rank(P, dense_limit, monkeypatch):
    """The selected-CI teacher on P ranks: each solve gathers H_SS and psi from the ranks, every
    rank pulls its own rows; energies, loss and the teacher's columns equal one rank's, and the
    pull is really there (the same run without the teacher ends elsewhere)."""
    from cuscikit.nnqs import teacher as T

    if dense_limit is not None:
        monkeypatch.setattr(T, "DENSE_LIMIT", dense_limit)
    case = CASES["H2O-teacher"]
    ref = make_runner(case)
    ref.run(case["iters"], progress=False)
    h = ref.history
    assert (h["teacher_weight"] > 0).all() and np.isfinite(h["teacher_loss"]).all()
    assert (h["inner_steps"] == case["teacher_inner_steps"]).all()
    assert h["n_space"].iloc[-1] > (dense_limit or 0)  # the solver the parameter names

    def rank(comm):
        runner = make_runner(case, comm)
        runner.run(case["iters"], progress=False)
        return summary(runner)

    results = run_ranks(P, rank)
    for other in results[1:]:  # the same teacher vector, so identical replicas
        assert other == results[0]
    check_against_reference(results[0], summary(ref), f"teacher P={P}", P)
    plain = make_runner(dict(case, teacher=0))
    plain.run(case["iters"], progress=False)
    assert abs(plain.history["e_tot"].iloc[-1] - h["e_tot"].iloc[-1]) > 1e-6


def test_gpu_pipeline_on_several_ranks_needs_a_cuda_ansatz():
    """Several ranks run the gpu pipeline like one (tests/parallel/test_runner_multi_gpu.py);
    with a CPU ansatz it is refused before any collective, on every rank alike."""
    comm = ThreadComm(_ThreadShared(2, timeout=5), rank=0, size=2)
    with pytest.raises(ValueError, match="CUDA device"):
        make_runner(dict(CASES["LiH"], pipeline="gpu"), comm)


def test_ranks_built_with_other_settings_raise_on_every_rank():
    def rank(comm):
        with pytest.raises(ValueError, match="another settings than rank 0"):
            make_runner(dict(CASES["LiH"], topk=16 + comm.rank), comm)
        return True

    assert run_ranks(2, rank) == [True, True]


def test_a_failing_rank_stops_the_others_with_comm_error():
    class FailOnRank1(Callback):
        def on_step_end(self, runner, row):
            if runner.comm.rank == 1 and runner.iteration == 2:
                raise RuntimeError("rank 1 fails")
            return False

    seen = {}

    def rank(comm):
        runner = make_runner(CASES["LiH"], comm)
        try:
            runner.run(6, [FailOnRank1()], progress=False)
        except CommError as exc:
            seen[comm.rank] = (runner.iteration, str(exc))
            raise

    with pytest.raises(RuntimeError, match="rank 1 fails"):
        run_ranks(2, rank, timeout=20)
    iteration, message = seen[0]
    assert iteration == 2 and "another rank stopped" in message


def test_a_callback_that_stops_one_rank_stops_all():
    class StopOnLastRank(Callback):
        def on_step_end(self, runner, row):
            return runner.comm.rank == runner.comm.size - 1 and runner.iteration == 3

    def rank(comm):
        runner = make_runner(CASES["LiH"], comm)
        runner.run(10, [StopOnLastRank()], progress=False)
        return runner.iteration

    assert run_ranks(3, rank) == [3, 3, 3]


def test_checkpoints_on_ranks(tmp_path):
    """Rank 0 writes; 1 or 3 ranks resume from 2 ranks' file; a failure on one rank raises on
    every rank."""
    ck = tmp_path / "ck.h5"

    def write(comm):
        runner = make_runner(RESUME, comm)
        runner.run(2, progress=False, checkpoint=str(ck))
        assert ck.exists()  # written before `run` returned on any rank
        with pytest.raises(OSError):
            runner.save(tmp_path / "no-such-dir" / "ck.h5")
        bad = ck if comm.rank == 0 else tmp_path / "missing.h5"
        with pytest.raises(CheckpointError, match=r"no such checkpoint|ranks \[1\] could not"):
            make_runner(RESUME, comm).load(bad)
        return True

    assert run_ranks(2, write) == [True, True]
    ref = reference("resumed")["e_tot"][:4]
    for got in (resume_two_more(None, ck), run_ranks(3, lambda c: resume_two_more(c, ck))[0]):
        assert np.max(np.abs(np.subtract(got, ref))) <= TOL


def resume_two_more(comm, ck) -> list[float]:
    runner = make_runner(RESUME, comm).load(ck)
    runner.run(2, progress=False)
    return runner.history["e_tot"].tolist()


# --- real ranks: torchrun and mpiexec -----------------------------------------------------------

ALL = [*CASES, "resumed"]
# 4 ranks on 2 cores are the slowest launches (an MPI collective waits ~10 ms for a core):
# LiH and H2O on both engines, the resumed checkpoint on 2 ranks of each and 4 of gloo
ON_FOUR = {"gloo": ["LiH-capped", "H2O", "resumed"], "mpi": ["LiH-capped", "H2O"]}


def run_worker(cmd: list[str], out: Path, P: int, backend: str, names: list[str]) -> dict:
    launch(cmd + [str(WORKER), str(out), "check", ",".join(names)], out)
    reports = [json.loads((out / f"rank{r}.json").read_text()) for r in range(P)]
    errors = {}
    for r, rep in enumerate(reports):
        assert rep["status"] == "ok", rep.get("traceback")
        assert (rep["rank"], rep["size"], rep["backend"]) == (r, P, backend)
    for name in names:
        got = [rep["cases"][name] for rep in reports]
        for other in got[1:]:  # same energies, loads, model replica and S on every rank
            assert other == got[0], name
        errors[name] = check_against_reference(got[0], reference(name), f"{backend} {name}", P)
    if "resumed" in names:  # a checkpoint of P ranks, resumed on one
        one = make_runner(RESUME).load(out / "resume.h5")
        assert one.iteration == RESUME_SPLIT
        one.run(RESUME["iters"] - RESUME_SPLIT, progress=False)
        assert max_energy_error(summary(one), reference("resumed")) <= TOL
    return errors


@pytest.mark.mpi
@pytest.mark.parametrize("P", [2, 4])
def test_runner_torchrun_gloo(P, tmp_path):
    run_worker(torchrun(P), tmp_path, P, "gloo", ALL if P == 2 else ON_FOUR["gloo"])


@pytest.mark.mpi
@pytest.mark.parametrize("P", [2, 4])
def test_runner_mpiexec(P, tmp_path):
    cmd = mpiexec() + ["-n", str(P), sys.executable, "-m", "mpi4py"]
    run_worker(cmd, tmp_path, P, "mpi", ALL if P == 2 else ON_FOUR["mpi"])


@pytest.mark.mpi
def test_cli_under_mpiexec_matches_one_process(tmp_path, capsys):
    argv = ["nnqs", "LiH", "--iters", "10", "--topk", "16", "--max-space", "60"]
    argv += ["--dtype", "float64", "--teacher", "0", "--json", "--output-dir"]  # teacher: 1 rank
    assert main([*argv, str(tmp_path / "one")]) == 0
    one = capsys.readouterr().out.splitlines()
    cmd = mpiexec() + ["-n", "2", sys.executable, "-m", "cuscikit", *argv, str(tmp_path / "two")]
    two = subprocess.run(cmd, capture_output=True, text=True, env=env(), timeout=120)
    assert two.returncode == 0, two.stderr
    # rank 0 alone prints: the same report as one process, JSON last
    assert len(two.stdout.splitlines()) == len(one), two.stdout
    assert two.stdout.count("NNQS-SCI on LiH") == 1 and "x 2 ranks" in two.stdout
    a, b = json.loads(one[-1]), json.loads(two.stdout.splitlines()[-1])
    assert (a["ranks"], b["ranks"]) == (1, 2)
    assert abs(a["e_tot"] - b["e_tot"]) <= TOL
    assert abs(a["e_variational"] - b["e_variational"]) <= TOL
    assert a["n_space"] == b["n_space"] and b["iterations"] == 10
    assert (tmp_path / "two" / "nnqs_history.csv").exists()
