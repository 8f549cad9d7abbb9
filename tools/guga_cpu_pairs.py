"""benchmarks/guga_cpu.py's rows with each solver pinned to CPUs of its own, side by side.

For a machine with many idle cores and little time: every (space, solver) job runs
benchmarks/guga_cpu.py's `measure` (the same solve, conv_tol 1e-10, the same timings) in a
process pinned by ``taskset`` to `--threads` logical CPUs of distinct physical cores, one
CPU set per job; jobs start in the order of `--rows` (anchor and GUGA of a row together)
while CPU sets are free, the rest when one frees. The anchor and GUGA of a row then run at
the same time on the same kind of core (not the same cores one after the other, as the
benchmark does): both share the memory bandwidth of the jobs around them. Each job's
result is written to OUT/<solver>-<ncas>-<2S>.json ('+' as '_') as it finishes, and the table of the
finished rows is printed at the end or at `--deadline` seconds (unfinished jobs are then
stopped and left out).

    python tools/guga_cpu_pairs.py --rows 14:2 14:0 12:2 12:0 10:2 10:0 --threads 2 \
        --out DIR [--deadline 150] [--repeat 1]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))


def physical_cpus() -> list[int]:
    """One logical CPU per physical core (Linux sysfs; all CPUs where it is not readable)."""
    seen, cpus = set(), []
    for cpu in sorted(os.sched_getaffinity(0)):
        base = pathlib.Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            key = ((base / "physical_package_id").read_text(), (base / "core_id").read_text())
        except OSError:
            key = ("", str(cpu))
        if key not in seen:
            seen.add(key)
            cpus.append(cpu)
    return cpus


def job(method: str, ncas: int, twos: int, threads: int, repeat: int, path: str) -> None:
    from guga_cpu import measure

    out = measure(method, ncas, twos, threads, repeat, True, None)
    pathlib.Path(path).write_text(json.dumps(out))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", nargs="+", default=["14:2", "14:0"], help="NCAS:2S")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=1, help="sigma calls after the solve")
    ap.add_argument("--out", required=True)
    ap.add_argument("--deadline", type=float, default=1e9, help="seconds")
    ap.add_argument("--job", nargs=5, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.job:
        m, n, s, rep, path = args.job
        job(m, int(n), int(s), args.threads, int(rep), path)
        return
    from _common import machine, print_table
    from guga_cpu import ANCHOR

    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cpus = physical_cpus()
    sets = [
        cpus[i : i + args.threads] for i in range(0, len(cpus) - args.threads + 1, args.threads)
    ]
    print(f"machine: {machine()}; {len(cpus)} physical cores; CPU sets {sets}", flush=True)
    rows = [tuple(int(x) for x in r.split(":")) for r in args.rows]
    todo = [(m, n, s) for n, s in rows for m in (ANCHOR, "guga")]
    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = str(args.threads)
    running, free, t0 = {}, list(sets), time.perf_counter()
    while todo or running:
        while todo and free:
            m, n, s = todo.pop(0)
            cs = free.pop(0)
            path = out / f"{m.replace('+', '_')}-{n}-{s}.json"
            cmd = ["taskset", "-c", ",".join(map(str, cs)), sys.executable, __file__]
            cmd += ["--threads", str(args.threads), "--out", str(out)]
            cmd += ["--job", m, str(n), str(s), str(args.repeat), str(path)]
            running[subprocess.Popen(cmd, env=env)] = (cs, m, n, s)
            print(
                f"{time.perf_counter() - t0:7.1f} s: start {m} ({n},{n}) 2S={s} on {cs}", flush=True
            )
        time.sleep(0.5)
        for p in [p for p in running if p.poll() is not None]:
            cs, m, n, s = running.pop(p)
            free.append(cs)
            print(
                f"{time.perf_counter() - t0:7.1f} s: done {m} ({n},{n}) 2S={s} rc={p.returncode}",
                flush=True,
            )
        if time.perf_counter() - t0 > args.deadline:
            for p, (_, m, n, s) in running.items():
                p.kill()
                print(f"deadline: stopped {m} ({n},{n}) 2S={s}", flush=True)
            break
    table = []
    for n, s in rows:
        res = {}
        for m in (ANCHOR, "guga"):
            f = out / f"{m.replace('+', '_')}-{n}-{s}.json"
            if f.exists():
                res[m] = json.loads(f.read_text())
        for m, r in res.items():
            a = res.get(ANCHOR)
            table.append(
                [
                    f"({n},{n}) 2S={s}",
                    m,
                    f"{r.get('size', 0):,}",
                    f"{r['sigma_s']:.3f}",
                    f"{r['solve_s']:.2f}",
                    f"{a['solve_s'] / r['solve_s']:.2f}x" if a else "-",
                    f"{r['solve_cpu_s']:.2f}",
                    f"{a['solve_cpu_s'] / r['solve_cpu_s']:.2f}x" if a else "-",
                    f"{r['e']:.10f}",
                    f"{r['e'] - a['e']:+.1e}" if a else "-",
                    f"{r.get('own_mib', float('nan')):.0f}",
                ]
            )
    print_table(
        f"GUGA CI vs PySCF, side by side ({args.threads} CPUs per job, anchor {ANCHOR})",
        [
            "space",
            "solver",
            "dim",
            "sigma s",
            "solve s",
            "vs anchor",
            "CPU s",
            "vs anchor",
            "E",
            "dE",
            "solve MiB",
        ],
        table,
    )


if __name__ == "__main__":
    main()
