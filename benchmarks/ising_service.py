"""The dSB request service under open-loop load over loopback: completed requests/s, BUSY
replies, losses and round-trip / residence percentiles against the offered rate, for each
backend (GPU resident kernel, GPU one-launch-per-request baseline, CPU workers) and model size.
The backend "echo" answers without solving: the same sockets, threads and load generator with
no work behind them, so its table is the ceiling of everything but the solver.

The server runs in a child process pinned to --server-cores, the C++ load generator in this
process pinned to --client-cores. The offered load is one Poisson process at the rate (request i
due at its i-th arrival, sent on socket i % --senders); "sent/s" is the number sent over the
time from the schedule's start to the last send (the rate offered in fact), "done/s" the OK
replies over the time from the schedule's start to the last OK reply. Every --check-th
completed request's energy is compared with the library's CPU reference for the same request
(a mismatch fails the run; not for echo). For the resident kernel the column "dev" is the mean
time a request's solver spent on the GPU, "wait" the mean time from receipt to its submission
to the kernel's ring, "rest" the mean of the residence less both.
Server threads (3 receivers, the feeder, 3 collectors: with 2 receivers the tail at 1-1.5 M
req/s grew in the receive sockets, see docs/ising_service.md) and the generator's threads (one per
socket, sending and receiving) spin for work instead of sleeping (--spin-us; 1000000 keeps the
server's threads from falling asleep between rows, as tools/device_ising_service.sh runs it)
and are pinned to one core each (--no-pin: not; --isolate, default on, moves the server's
other threads to its spare cores); keep the spinning threads of each side below its cores. With
--offload (default; --no-offload: off) both sides use UDP segmentation offload: requests due at
once and the replies of a batch to one socket leave as one UDP_SEGMENT send, read in one piece
(UDP_GRO).

Where the time of the slow requests goes (--trace, default on): the server stamps every
request at each stage (the kernel's receive time stamp of its datagram included) and, for those
whose time since that arrival passes --slow-us, sums each stage and counts which stage was the
longest: socket (waiting in the receive socket from the kernel's stamp to the start of the read
that took it), recv (the recvmmsg call), read (recvmmsg to parsing, the rest of the read batch
first), admit (parsing to the queue), queue (in the queue), feed (popped to submitted to the GPU
ring; CPU workers: popped to answered), kernel (submitted to a collector finding it done, less
the solve), reply (found done to the reply written). Each server thread also counts its stalls
(passes of its loop more than 50 us apart) and slow sends; per row the benchmark prints the
slow requests' breakdown, the threads that stalled (how much of the stalled time the thread's
own CPU clock ran, its run-queue wait, involuntary switches and page faults from /proc), the
load generator's own stalls, the hypervisor's steal on the server and the generator cores, and
the machine's counters that a stall could come from (page faults, NUMA hinting faults, huge page
allocations, compaction and reclaim from /proc/vmstat; network backlog drops and budget squeezes
on the server cores). --share [PARTS] turns on the server's work sharing (all, or some of
read,collect,feed), --isolate moves its other
threads off the pinned cores; --repeat runs every rate several times; --generic-solver runs
the resident kernel's one-replica requests on its solver for any replica count (the same bytes,
slower) instead of the one specialised for them, for comparison. Per row it also compares the
share of round trips above --slow-us with the share of requests whose time from the kernel's
receive stamp to the reply passed it (the rest of a round trip is the sending side's and the
reply's way back). --rx-batch: the most datagrams (runs) one receiver read takes.

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
    cmd += ["--trace", "--slow-us", str(args.slow_us)] if args.trace else []
    cmd += ["--share", args.share] if args.share else []
    cmd += ["--isolate"] if args.isolate else []
    cmd += ["--rx-batch", str(args.rx_batch)]
    for n in sizes:
        cmd += ["--random", f"{n}:{kind}"]
    if backend == "cpu":
        cmd += ["--device", "cpu", "--workers", str(max(1, len(server_cores) - 1))]
    elif backend == "echo":  # as many reply threads as the resident kernel's collectors
        cmd += ["--device", "cpu", "--mode", "echo", "--workers", str(args.collectors)]
    else:
        cmd += ["--device", "cuda", "--mode", backend]
    env = None
    if args.generic_solver:  # the resident kernel's warp solver for any replica count
        env = os.environ | {"CUSCIKIT_DSB_GENERIC_SOLVER": "1"}
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
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


def steal_ms(cpus=None) -> float:
    """CPU time the hypervisor took from this machine's CPUs so far (all CPUs, or those in
    `cpus`; ms, in clock ticks of 10 ms on most kernels; 0 if the kernel does not say)."""
    try:
        with open("/proc/stat") as fh:
            lines = fh.read().splitlines()
        tick = 1000.0 / os.sysconf("SC_CLK_TCK")
        if cpus is None:
            return int(lines[0].split()[8]) * tick
        total = 0
        for line in lines[1:]:
            f = line.split()
            if f[0].startswith("cpu") and f[0][3:].isdigit() and int(f[0][3:]) in cpus:
                total += int(f[8])
        return total * tick
    except (OSError, IndexError, ValueError):
        return 0.0


def cpu_irqs() -> dict:
    """Per CPU so far: {cpu: {kind: count}} of the softirqs (/proc/softirqs: NET_RX, TIMER, ...)
    and the hardware interrupts summed (/proc/interrupts, as "IRQ"); {} where unreadable."""
    out: dict = {}
    for path, total in (("/proc/softirqs", False), ("/proc/interrupts", True)):
        try:
            with open(path) as fh:
                lines = fh.read().splitlines()
            cpus = [int(c[3:]) for c in lines[0].split()]
            for line in lines[1:]:
                f = line.split()
                kind = "IRQ" if total else f[0].rstrip(":")
                for c, v in zip(cpus, f[1 : 1 + len(cpus)], strict=False):
                    if v.isdigit():
                        d = out.setdefault(c, {})
                        d[kind] = d.get(kind, 0) + int(v)
        except (OSError, IndexError, ValueError):
            continue
    return out


def irq_line(after: dict, before: dict, cpus) -> tuple:
    """The interrupts each server core took during a row, as a line and a dict."""
    per = {}
    for c in sorted(cpus):
        a, b = after.get(c, {}), before.get(c, {})
        per[c] = {k: a[k] - b.get(k, 0) for k in a if a[k] - b.get(k, 0) > 0}
    text = "; ".join(
        f"{c}: " + " ".join(f"{k} {v}" for k, v in sorted(d.items(), key=lambda x: -x[1])[:3])
        for c, d in per.items()
        if d
    )
    return f"    interrupts on server cores (top 3 kinds): {text or 'none'}", per


def thread_sched(pid: int) -> dict:
    """Per thread of a process (by name): ns waiting on a run queue, involuntary switches,
    minor and major page faults."""
    out = {}
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for task in tasks:
        base = f"/proc/{pid}/task/{task}"
        try:
            with open(f"{base}/comm") as fh:
                name = fh.read().strip()
            with open(f"{base}/schedstat") as fh:
                wait_ns = int(fh.read().split()[1])
            with open(f"{base}/status") as fh:
                inv = next(int(x.split()[1]) for x in fh if x.startswith("nonvoluntary"))
            with open(f"{base}/stat") as fh:  # fields after "(comm)": minflt 8th, majflt 10th
                stat = fh.read().rsplit(")", 1)[1].split()
            minflt, majflt = int(stat[7]), int(stat[9])
        except (OSError, StopIteration, IndexError, ValueError):
            continue
        w, i, mn, mj = out.get(name, (0, 0, 0, 0))
        out[name] = (w + wait_ns, i + inv, mn + minflt, mj + majflt)
    return out


VMSTAT_KEYS = (
    "pgfault",
    "pgmajfault",
    "numa_hint_faults",
    "numa_pte_updates",
    "numa_pages_migrated",
    "pgmigrate_success",
    "thp_fault_alloc",
    "thp_collapse_alloc",
    "compact_stall",
    "pgscan_direct",
    "allocstall_normal",
)


def system_counters(cpus) -> dict:
    """Machine-wide counters that a stall of ~ms inside a thread might come from: page faults,
    NUMA balancing's hinting faults and migrations, transparent huge page allocations,
    compaction and direct reclaim (/proc/vmstat), and per server core the network backlog's
    drops and budget squeezes (/proc/net/softnet_stat)."""
    out = {}
    try:
        with open("/proc/vmstat") as fh:
            for line in fh:
                k, v = line.split()
                if k in VMSTAT_KEYS:
                    out[k] = int(v)
    except (OSError, ValueError):
        pass
    try:
        with open("/proc/net/softnet_stat") as fh:
            for cpu, line in enumerate(fh):
                f = line.split()
                if cpu in cpus and len(f) >= 3:
                    out["softnet_dropped"] = out.get("softnet_dropped", 0) + int(f[1], 16)
                    out["softnet_squeezed"] = out.get("softnet_squeezed", 0) + int(f[2], 16)
    except (OSError, ValueError):
        pass
    return out


def diff(after: dict, before: dict, key: str) -> int:
    return after.get(key, 0) - before.get(key, 0)


def trace_lines(after: dict, before: dict, sched1: dict, sched0: dict, gen) -> tuple:
    """The slow requests' breakdown, the stalled server threads and the generator's stalls
    of one row, as printable lines and a dict for the JSON."""
    info, lines = {}, []
    answered = diff(after, before, "trace_answered")
    slow = diff(after, before, "trace_slow")
    stages = ["socket", "recv", "read", "admit", "queue", "feed", "kernel", "device", "reply"]
    if answered > 0:
        hist = [diff(after, before, f"trace_hist{b}") for b in range(8)]
        dom = {g: diff(after, before, f"trace_dominant_{g}") for g in stages}
        mean = {g: diff(after, before, f"trace_slow_{g}_ns") / max(slow, 1) / 1e3 for g in stages}
        info.update(answered=answered, slow=slow, residence_hist=hist, slow_dominant=dom,
                    slow_mean_us=mean)  # fmt: skip
        top = ", ".join(f"{g} {dom[g]}" for g in stages if dom[g])
        means = " ".join(f"{g} {mean[g]:.0f}" for g in stages if mean[g] >= 0.5)
        lines.append(
            f"    slow (> {after.get('trace_slow_us', 0)} us): {slow} of {answered} "
            f"({100 * slow / answered:.2f} %); longest stage: {top or '-'}; "
            f"their mean us: {means or '-'}; residence histogram <50/100/150/200/300/500/1000/"
            f"more us: {'/'.join(map(str, hist))}"
        )
        stamped = diff(after, before, "trace_stamped")
        if stamped:
            arr = [diff(after, before, f"trace_arrival_hist{b}") for b in range(8)]
            info.update(stamped=stamped, arrival_hist=arr,
                        socket_max_us_so_far=after.get("trace_socket_max_ns", 0) / 1e3)  # fmt: skip
            lines.append(
                f"    since the kernel's arrival stamp ({stamped} stamped): histogram "
                f"<50/100/150/200/300/500/1000/more us: {'/'.join(map(str, arr))}; > 200 us: "
                f"{100 * sum(arr[4:]) / stamped:.2f} %; longest socket wait so far "
                f"{info['socket_max_us_so_far']:.0f} us"
            )
    names = sorted({k.split("_")[1] for k in after if k.startswith("thread_")})
    threads = {}
    parts = []
    for name in names:
        k = f"thread_{name}_"
        st = diff(after, before, k + "stalls")
        w0, i0, mn0, mj0 = sched0.get(name, (0, 0, 0, 0))
        w1, i1, mn1, mj1 = sched1.get(name, (0, 0, 0, 0))
        t = {"stalls": st, "stall_us": diff(after, before, k + "stall_ns") / 1e3,
             "stall_cpu_us": diff(after, before, k + "stall_cpu_ns") / 1e3,
             "stall_max_us": after.get(k + "stall_max_ns", 0) / 1e3,
             "stall_max_cpu_us": after.get(k + "stall_max_cpu_ns", 0) / 1e3,
             "minor_faults": mn1 - mn0, "major_faults": mj1 - mj0,
             "slow_flushes": diff(after, before, k + "slow_flushes"),
             "flush_max_us": after.get(k + "flush_max_ns", 0) / 1e3,
             "slow": diff(after, before, k + "slow"),
             "episodes": diff(after, before, k + "episodes"),
             "runqueue_wait_us": (w1 - w0) / 1e3, "preempted": i1 - i0}  # fmt: skip
        threads[name] = t
        if st or t["slow_flushes"] or t["preempted"] or t["runqueue_wait_us"] >= 10:
            parts.append(
                f"{name} {st}x{t['stall_us']:.0f}us (on cpu {t['stall_cpu_us']:.0f}; max so far "
                f"{t['stall_max_us']:.0f}, on cpu {t['stall_max_cpu_us']:.0f}) "
                f"rq {t['runqueue_wait_us']:.0f}us/{t['preempted']}p flt {t['minor_faults']}/"
                f"{t['major_faults']} "
                f"sends>50us {t['slow_flushes']} slow {t['slow']}/{t['episodes']}ep"
            )
    info["threads"] = threads
    lines.append("    server stalls: " + ("; ".join(parts) if parts else "none"))
    if gen is not None and len(gen):
        info["generator_stalls"] = gen.tolist()
        lines.append(
            f"    generator stalls: {int(gen[:, 0].sum())} ({gen[:, 1].sum():.0f} us in all, "
            f"longest {gen[:, 2].max():.0f} us)"
        )
    for k in ("helped_reads", "helped_collects", "helped_feeds", "isolated_threads"):
        if k in after:
            info[k] = after[k] - (before.get(k, 0) if k != "isolated_threads" else 0)
    return lines, info


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


def when_slow(rep, slow_us: float) -> tuple:
    """When the slow round trips (above slow_us) were sent: how many in the first 10 and 50 ms
    of the row (from its first send), and the p99 of the requests sent after the first 50 ms,
    as a line and a dict."""
    ok = rep.rtt_ns >= 0
    slow = ok & (rep.rtt_ns > slow_us * 1e3)
    sent_ms = (rep.sent_ns - rep.sent_ns[rep.sent_ns >= 0].min()) / 1e6  # since the first send
    n = int(slow.sum())
    first10 = int((slow & (sent_ms < 10)).sum())
    first50 = int((slow & (sent_ms < 50)).sum())
    later = ok & (sent_ms >= 50)
    p99_later = float(np.percentile(rep.rtt_ns[later], 99) / 1e3) if later.any() else None
    q = np.percentile(sent_ms[slow], [0, 50, 100]) if n else [0, 0, 0]
    info = {"slow_rtt": n, "sent_first_10ms": first10, "sent_first_50ms": first50,
            "sent_ms_min_median_max": [round(float(v), 1) for v in q],
            "rtt_p99_after_50ms_us": p99_later}  # fmt: skip
    info["slow_rtt_percent"] = 100 * n / max(int(ok.sum()), 1)
    line = (
        f"    round trips > {slow_us:.0f} us: {n} ({info['slow_rtt_percent']:.2f} %), sent in the "
        f"first 10 ms {first10}, first 50 ms "
        f"{first50}, send times min/median/max {q[0]:.1f}/{q[1]:.1f}/{q[2]:.1f} ms; "
        f"p99 of those sent after 50 ms: {p99_later if p99_later is None else round(p99_later)}"
    )
    return line, info


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
    p.add_argument("--receivers", type=int, default=3, help="server UDP receiver threads")
    p.add_argument("--senders", type=int, default=6, help="load generator sockets (threads)")
    p.add_argument("--collectors", type=int, default=3, help="resident: reply threads")
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
    p.add_argument("--trace", action=argparse.BooleanOptionalAction, default=True,
                   help="the server traces request stages and thread stalls")  # fmt: skip
    p.add_argument("--slow-us", type=float, default=200.0, help="slow residence for --trace")
    p.add_argument("--share", nargs="?", const="all", default="", metavar="PARTS",
                   help="server work sharing (a stalled thread's work taken over): all, or "
                   "some of read,collect,feed")  # fmt: skip
    p.add_argument("--isolate", action=argparse.BooleanOptionalAction, default=True,
                   help="server: other threads off the pinned cores")  # fmt: skip
    p.add_argument("--repeat", type=int, default=1, help="run every rate this many times")
    p.add_argument("--rx-batch", type=int, default=64,
                   help="server: most datagrams (runs) one receiver read takes")  # fmt: skip
    p.add_argument("--generic-solver", action="store_true",
                   help="resident: one-replica requests on the warp solver for any replica "
                   "count (the same bytes; for comparison with the specialised one)")  # fmt: skip
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
        f"{'backend':>9} {'n':>5} {'offered/s':>10} {'sent/s':>10} {'done/s':>10} {'busy':>7} "
        f"{'lost':>7} "
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
                for rate in [r for r in args.rates for _ in range(max(1, args.repeat))]:
                    count = max(1, int(rate * args.duration))
                    before = server_stats(proc)
                    sched0 = thread_sched(proc.pid)
                    steal0, nvcsw0 = steal_ms(), preempted(proc.pid)
                    steal_s0, steal_c0 = steal_ms(server_cores), steal_ms(client_cores)
                    irq0, sys0 = cpu_irqs(), system_counters(server_cores)
                    rep = load_test(model_id, n, args.steps, args.replicas, 0.5, seed,
                                    count=count, rate=rate, port=port,
                                    senders=args.senders, spin=True, offload=args.offload,
                                    pin=args.pin)  # fmt: skip
                    irq1, sys1 = cpu_irqs(), system_counters(server_cores)
                    after = server_stats(proc)
                    sched1 = thread_sched(proc.pid)
                    steal_s = steal_ms(server_cores) - steal_s0
                    steal_c = steal_ms(client_cores) - steal_c0
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
                           "steal_server_cores_ms": steal_s, "steal_client_cores_ms": steal_c,
                           "received_by_receiver": [
                               after[k] - before[k] for k in sorted(after)
                               if k.startswith("received_udp")]}  # fmt: skip
                    rows.append(row)

                    def f(v):
                        return "-" if v is None else f"{v:.0f}"

                    print(
                        f"{backend:>9} {n:>5} {rate:>10.0f} {rep.sent_per_s:>10.0f} "
                        f"{rep.completed_per_s:>10.0f} "
                        f"{rep.busy:>7} {rep.lost:>7} {f(rep.rtt_us['p50']):>8} "
                        f"{f(rep.rtt_us['p99']):>8} {f(rep.rtt_us['p999']):>8} "
                        f"{f(rep.residence_us['p50']):>8} {f(rep.residence_us['p99']):>8} "
                        f"{f(dev_us):>6} {f(wait_us):>5} {f(rest_us):>5} {steal:>5.0f} "
                        f"{nvcsw:>7} {checked:>7}",
                        flush=True,
                    )
                    extra, info_t = trace_lines(after, before, sched1, sched0,
                                                rep.generator_stalls)  # fmt: skip
                    line, info_w = when_slow(rep, args.slow_us)
                    extra.append(line)
                    info_t["when_slow"] = info_w
                    line, info_t["server_core_interrupts"] = irq_line(irq1, irq0, server_cores)
                    extra.append(line)
                    sysd = {k: sys1[k] - sys0.get(k, 0) for k in sys1 if sys1[k] != sys0.get(k, 0)}
                    info_t["system_counters"] = sysd
                    extra.append("    machine counters during the row: " + (
                        ", ".join(f"{k} {v}" for k, v in sysd.items()) or "none"))  # fmt: skip
                    batches = diff(after, before, "feed_batches")
                    if batches:
                        fed_ns = diff(after, before, "feed_busy_ns")
                        per = fed_ns / max(diff(after, before, "fed"), 1)
                        extra.append(f"    feeder: {fed_ns / 1e6:.1f} ms submitting in "
                                     f"{batches} batches, {per:.0f} ns a request")  # fmt: skip
                        info_t["feed_busy_ms"] = fed_ns / 1e6
                        info_t["feed_ns_per_request"] = per
                    row["trace"] = info_t
                    print(f"    steal ms: server cores {steal_s:.0f}, generator cores "
                          f"{steal_c:.0f}")  # fmt: skip
                    print("\n".join(extra), flush=True)
                    time.sleep(0.2)  # let the queue drain between rates
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    print(
        "(sent/s = requests sent / time from the schedule's start to the last send, the rate "
        "offered in fact; done/s = OK replies / time from the schedule's start to the last OK "
        "reply)"
    )
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
