"""benchmarks/accuracy_small.py: the reference cache and runs side by side (--jobs)."""

import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import pytest

from cuscikit import FCI, Molecule

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def accuracy_small(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import accuracy_small

    return accuracy_small


def test_cache_keeps_the_fci_reference(accuracy_small, tmp_path, monkeypatch):
    mol, ref, slug = accuracy_small.build_system("Hubbard-6-ring-U4", str(tmp_path))
    assert slug == "hubbard_6_ring_u4"
    stored = json.loads((tmp_path / "references.json").read_text())
    assert stored == {"Hubbard-6-ring-U4": ref}
    exact = FCI(Molecule.hubbard(6, U=4.0, pbc=True), nroots=1).run().e_tot
    assert abs(ref - exact) < 1e-9
    # a second build reads the cache instead of solving again
    monkeypatch.setattr(accuracy_small, "FCI", None)
    assert accuracy_small.build_system("Hubbard-6-ring-U4", str(tmp_path))[1] == ref


def test_unknown_system_fails_before_any_run(accuracy_small, tmp_path, monkeypatch):
    argv = ["accuracy_small.py", "LiH", "NoSuchMolecule", "--out", str(tmp_path / "h")]
    monkeypatch.setattr(sys, "argv", argv)
    monkeypatch.setattr(accuracy_small, "run_task", None)  # a run would fail differently
    with pytest.raises(Exception, match="NoSuchMolecule"):
        accuracy_small.main()


@pytest.mark.slow
def test_jobs_give_the_rows_of_one_after_another(tmp_path):
    """Two processes side by side give the same final errors as one process running both."""
    rows = {}
    for jobs in (1, 2):
        out = tmp_path / f"jobs{jobs}.json"
        cmd = [sys.executable, str(BENCH / "accuracy_small.py"), "LiH", "--seeds", "0,1"]
        cmd += ["--iters", "3", "--device", "cpu", "--threads", "1", "--jobs", str(jobs)]
        cmd += ["--out", str(tmp_path / f"h{jobs}"), "--json-out", str(out)]
        subprocess.run(cmd, check=True, capture_output=True, cwd=tmp_path, timeout=600)
        doc = json.loads(out.read_text())
        rows[jobs] = [(r["seed"], r["iterations"], r["errors"]) for r in doc["rows"]]
    assert [r[0] for r in rows[1]] == [0, 1]
    assert rows[1] == rows[2]


def test_result_json_holds_no_machine_folders(accuracy_small, tmp_path, monkeypatch):
    import argparse

    import _common

    monkeypatch.chdir(tmp_path)
    inside, outside = tmp_path / "out" / "cache", "/somewhere/else/runs/c10"
    args = argparse.Namespace(cache=str(inside), out=outside, seeds="0,1", iters=8, json_out="x")
    _common.write_json(tmp_path / "r.json", "accuracy_small.py", "anchor", args, [])
    kept = json.loads((tmp_path / "r.json").read_text())["args"]
    assert kept == {"cache": "out/cache", "out": "c10", "seeds": "0,1", "iters": 8}


def _worker(kind: str) -> str:
    """A run in a worker process: one that dies abruptly, one that ignores SIGTERM (as a
    Runner does while an iteration is in progress) and does not return, or one that works."""
    if kind == "die":
        os._exit(3)
    if kind == "stuck":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        time.sleep(600)
    return kind


def test_side_by_side_survives_a_dead_and_a_stuck_worker(accuracy_small):
    """One worker dies (as after a device fault), another hangs and ignores SIGTERM: the runs
    are reported failed within seconds instead of the script waiting for the stuck one."""
    t0 = time.perf_counter()
    out = accuracy_small.run_side_by_side(_worker, [("stuck",), ("die",)], 2)
    assert time.perf_counter() - t0 < 120
    assert [ok for ok, _ in out] == [False, False]
    assert all(isinstance(exc, BrokenProcessPool) for _, exc in out)


def test_side_by_side_keeps_results_and_order(accuracy_small):
    out = accuracy_small.run_side_by_side(_worker, [("a",), ("b",), ("c",)], 2)
    assert out == [(True, "a"), (True, "b"), (True, "c")]
