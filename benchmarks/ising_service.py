"""The dSB request service under open-loop load over loopback: completed requests/s, BUSY
replies, losses and round-trip / residence percentiles against the offered rate, for each
backend (GPU resident kernel, GPU one-launch-per-request baseline, CPU workers) and model size.
The backend "echo" answers without solving: the same sockets, threads and load generator with
no work behind them, so its table is the ceiling of everything but the solver.

The server runs in a child process pinned to --server-cores, the C++ load generator in this
process pinned to --client-cores. Every --check-th completed request's energy is compared with
the library's CPU reference for the same request (a mismatch fails the run; not for echo). For
the resident kernel the column "dev" is the mean time a request's solver spent on the GPU,
"wait" the mean time from receipt to its submission to the kernel's ring, "rest" the mean of
the residence less both.
Server threads (2 receivers, the feeder, 4 collectors) and the generator's threads (one per
socket, sending and receiving) spin for work instead of sleeping (--spin-us) and are pinned to
one core each (--no-pin: not); keep the spinning threads of each side below its cores. With
--offload (default; --no-offload: off) both sides use UDP segmentation offload: requests due at
once and the replies of a batch to one socket leave as one UDP_SEGMENT send, read in one piece
(UDP_GRO).

Usage:
    python benchmarks/ising_service.py --backends resident launch cpu --n 64 256 1024 \\
        --rates 100000 200000 400000 800000 1000000 --duration 1

Anchor (the published GPU-initiated service, one server GPU behind a 400 GbE NIC): 618-628 kreq/s
completed at 800 kreq/s offered, p50 189 us, p99 218 us round trip; one kernel launch per request
saturates near 24 kreq/s.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np

from cuscikit.cli.ising_service import random_model
from cuscikit.ising.service import load_test, reference

ANCHOR = (
    "anchor (published GPU-initiated service, 400 GbE NIC): 618-628 kreq/s completed at 800k "
    "offered, p50 189 us, p99 218 us; one launch per request ~24 kreq/s"
)


def cores(text: str) -> set[int]:
    out = set()
    for part in text.split(","):
        a, _, b = part.partition("-")
        out.update(range(int(a), int(b or a) + 1))
    return out


def start_server(backend: str, sizes, kind: str, server_cores, args):
    cmd = [sys.executable, "-m", "cuscikit", "ising", "serve", "--port", "0", "--depth",
           str(args.depth), "--receivers", str(args.receivers), "--spin-us", str(args.spin_us),
           "--collectors", str(args.collectors), "--blocks", str(args.blocks)]  # fmt: skip
    cmd += ["--offload"] if args.offload else []
    cmd += ["--pin"] if args.pin else []
    for n in sizes:
        cmd += ["--random", f"{n}:{kind}"]
    if backend == "cpu":
        cmd += ["--device", "cpu", "--workers", str(max(1, len(server_cores) - 1))]
    elif backend == "echo":  # as many reply threads as the resident kernel's collectors
        cmd += ["--device", "cpu", "--mode", "echo", "--workers", str(args.collectors)]
    else:
        cmd += ["--device", "cuda", "--mode", backend]
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: os.sched_setaffinity(0, server_cores),
    )
    first = proc.stdout.readline()
    if "UDP " not in first:
        proc.kill()
        raise RuntimeError(f"the {backend} server did not start: {first!r}")
    info = proc.stdout.readline().strip()
    return proc, int(first.split("UDP ")[1].split()[0]), info


def server_stats(proc) -> dict:
    """The server's counters so far (it prints them as one line on SIGUSR1)."""
    proc.send_signal(signal.SIGUSR1)
    line = proc.stdout.readline()
    if not line.startswith("stats "):
        raise RuntimeError(f"the server did not report its counters: {line!r}")
    return json.loads(line[len("stats ") :])


def steal_ms() -> float:
    """CPU time the hypervisor took from this machine's CPUs so far (all CPUs, ms; 0 if the
    kernel does not say)."""
    try:
        with open("/proc/stat") as fh:
            fields = fh.readline().split()
        return int(fields[8]) * 1000.0 / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def preempted(pid: int) -> int:
    """Involuntary context switches of a process's threads so far."""
    total = 0
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/status") as fh:
                for line in fh:
                    if line.startswith("nonvoluntary_ctxt_switches"):
                        total += int(line.split()[1])
    except OSError:
        pass
    return total


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backends", nargs="+", default=["resident", "launch", "cpu"],
                   choices=["resident", "launch", "cpu", "echo"])  # fmt: skip
    p.add_argument("--n", type=int, nargs="+", default=[64, 256, 1024])
    p.add_argument("--kind", default="binary", choices=["binary", "ternary", "int8"])
    p.add_argument("--rates", type=float, nargs="+",
                   default=[1e5, 2e5, 4e5, 6e5, 8e5, 1e6])  # fmt: skip
    p.add_argument("--duration", type=float, default=1.0, help="seconds per rate")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--replicas", type=int, default=1)
    p.add_argument("--depth", type=int, default=4096)
    p.add_argument("--receivers", type=int, default=2, help="server UDP receiver threads")
    p.add_argument("--senders", type=int, default=6, help="load generator sockets (threads)")
    p.add_argument("--collectors", type=int, default=4, help="resident: reply threads")
    p.add_argument("--blocks", type=int, default=0, help="resident: persistent blocks (0: all)")
    p.add_argument("--spin-us", type=float, default=50.0,
                   help="server receivers and workers spin this long before blocking")  # fmt: skip
    p.add_argument(
        "--offload",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="UDP segmentation offload on both sides (UDP_SEGMENT / UDP_GRO)",
    )
    p.add_argument(
        "--pin",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="pin server and generator threads to one core each",
    )
    p.add_argument("--label", default="", help="a name for this configuration in the output")
    p.add_argument("--check", type=int, default=997, help="check every k-th reply's energy")
    n_cpu = os.cpu_count() or 2
    half = max(1, n_cpu // 2)
    p.add_argument("--server-cores", default=f"0-{half - 1}")
    p.add_argument("--client-cores", default=f"{half}-{n_cpu - 1}" if n_cpu > 1 else "0")
    p.add_argument("--json-out", default=None)
    args = p.parse_args(argv)
    server_cores, client_cores = cores(args.server_cores), cores(args.client_cores)
    os.sched_setaffinity(0, client_cores)
    models = {n: random_model(n, args.kind, seed=i) for i, n in enumerate(args.n)}
    print(ANCHOR)
    print(
        f"server cores {sorted(server_cores)}, load generator cores {sorted(client_cores)}; "
        f"{args.kind} models, {args.steps} steps, {args.replicas} replica(s) per request"
    )
    head = (
        f"{'backend':>9} {'n':>5} {'offered/s':>10} {'done/s':>10} {'busy':>7} {'lost':>7} "
        f"{'rtt p50':>8} {'p99':>8} {'p99.9':>8} {'res p50':>8} {'p99':>8} {'dev':>6} "
        f"{'wait':>5} {'rest':>5} {'steal':>5} {'preempt':>7} {'checked':>7}"
    )
    print(head)
    rows = []
    bad = 0
    for backend in args.backends:
        proc, port, info = start_server(backend, args.n, args.kind, server_cores, args)
        print(f"# {args.label} {backend}: {info}", flush=True)
        try:
            for model_id, n in enumerate(args.n, start=1):
                seed = 1000 * model_id
                for rate in args.rates:
                    count = max(1, int(rate * args.duration))
                    before = server_stats(proc)
                    steal0, nvcsw0 = steal_ms(), preempted(proc.pid)
                    rep = load_test(model_id, n, args.steps, args.replicas, 0.5, seed,
                                    count=count, rate=rate, port=port,
                                    senders=args.senders, spin=True, offload=args.offload,
                                    pin=args.pin)  # fmt: skip
                    after = server_stats(proc)
                    steal = steal_ms() - steal0
                    nvcsw = preempted(proc.pid) - nvcsw0
                    solved = after.get("device_solved", 0) - before.get("device_solved", 0)
                    dev_us = wait_us = rest_us = None
                    if solved > 0:
                        dev_ns = after["device_solve_ns"] - before["device_solve_ns"]
                        dev_us = dev_ns / solved / 1e3
                        fed = after["fed"] - before["fed"]
                        wait_ns = after["feed_wait_ns"] - before["feed_wait_ns"]
                        wait_us = wait_ns / fed / 1e3 if fed else None
                        reply_ns = after["reply_ns"] - before["reply_ns"]
                        if wait_us is not None:  # pickup by the kernel + finding it done
                            rest_us = (reply_ns - dev_ns) / solved / 1e3 - wait_us
                    ok = np.flatnonzero(rep.energies != np.iinfo(np.int64).max)
                    checked = 0
                    for i in ok[:: args.check][:50] if backend != "echo" else []:
                        e, _ = reference(models[n], args.steps, args.replicas, 0.5,
                                         seed + int(i))  # fmt: skip
                        checked += 1
                        if e != rep.energies[i]:
                            bad += 1
                    row = {"backend": backend, "label": args.label, "info": info, "n": n,
                           **rep.row(), "device_solve_mean_us": dev_us, "checked": checked,
                           "feed_wait_mean_us": wait_us, "pickup_collect_mean_us": rest_us,
                           "runs_in": after["runs_in"] - before["runs_in"],
                           "runs_out": after["runs_out"] - before["runs_out"],
                           "steal_ms": steal, "server_preempted": nvcsw,
                           "received_by_receiver": [
                               after[k] - before[k] for k in sorted(after)
                               if k.startswith("received_udp")]}  # fmt: skip
                    rows.append(row)

                    def f(v):
                        return "-" if v is None else f"{v:.0f}"

                    print(
                        f"{backend:>9} {n:>5} {rate:>10.0f} {rep.completed_per_s:>10.0f} "
                        f"{rep.busy:>7} {rep.lost:>7} {f(rep.rtt_us['p50']):>8} "
                        f"{f(rep.rtt_us['p99']):>8} {f(rep.rtt_us['p999']):>8} "
                        f"{f(rep.residence_us['p50']):>8} {f(rep.residence_us['p99']):>8} "
                        f"{f(dev_us):>6} {f(wait_us):>5} {f(rest_us):>5} {steal:>5.0f} "
                        f"{nvcsw:>7} {checked:>7}",
                        flush=True,
                    )
                    time.sleep(0.2)  # let the queue drain between rates
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    print("(times in microseconds; busy = BUSY replies, lost = no reply; resident: dev = mean "
          "device solve, wait = mean receipt to submit, rest = mean residence less both: the "
          "kernel picking the request up and a collector finding it done; steal = ms of CPU "
          "time the hypervisor took during the row, all CPUs; preempt = involuntary context "
          "switches of the server's threads)")  # fmt: skip
    if args.json_out:
        setup = vars(args) | {"server_cores": sorted(server_cores)}
        setup["client_cores"] = sorted(client_cores)
        with open(args.json_out, "w") as fh:
            json.dump({"anchor": ANCHOR, "args": setup, "rows": rows}, fh, indent=1)
    if bad:
        print(f"ERROR: {bad} replies differ from the CPU reference")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
