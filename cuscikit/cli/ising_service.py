"""`cuscikit ising serve` and `cuscikit ising load`: the dSB request service and its load
generator (see `cuscikit.ising.service` for the wire format)."""

from __future__ import annotations

import argparse
import json
import signal
import time
from pathlib import Path

from cuscikit.cli.common import (
    UsageError,
    add_json,
    emit,
    finite_float,
    positive_int,
    require_cuda,
)

SUBCOMMANDS = ("serve", "load")


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 0..65535, got {value}")
    return value


def _random_spec(text: str) -> tuple[int, str]:
    """N or N:KIND (binary, ternary, int8)."""
    n_text, _, kind = text.partition(":")
    kind = kind or "binary"
    try:
        n = int(n_text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected N or N:KIND, got {text!r}") from None
    if not 2 <= n <= 4096:
        raise argparse.ArgumentTypeError(f"N must be 2..4096, got {n}")
    if kind not in ("binary", "ternary", "int8"):
        raise argparse.ArgumentTypeError(f"KIND must be binary, ternary or int8, got {kind!r}")
    return n, kind


def random_model(n: int, kind: str = "binary", seed: int = 0):
    """A random symmetric model of the given coupling kind (zero field), for load tests."""
    import numpy as np

    from cuscikit.ising import IsingModel

    rng = np.random.default_rng(seed)
    values = {"binary": [-1, 1], "ternary": [-1, 0, 1], "int8": np.arange(-127, 128)}[kind]
    J = np.triu(rng.choice(values, (n, n)), 1)
    if kind == "int8":
        J[0, 1] = 127  # keep it int8 even if every draw happens to be in {-1, 0, 1}
    return IsingModel(J + J.T)


def register(sub) -> None:
    s = sub.add_parser(
        "ising serve",
        prog="cuscikit ising serve",
        help="serve dSB solve requests over UDP and TCP",
        description="Serve dSB solve requests against resident models over UDP and TCP on "
        "loopback (wire format: cuscikit.ising.service). Models: G-set files (ids 1, 2, ... in "
        "the order given) and --random models (ids after them). Runs until --duration passes "
        "or Ctrl-C, then prints the server's counters.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    s.add_argument("models", nargs="*", help="G-set / rudy graph files to serve (ids 1, 2, ...)")
    s.add_argument(
        "--random",
        type=_random_spec,
        action="append",
        default=[],
        metavar="N[:KIND]",
        help="also serve a random model of N spins (KIND binary, ternary or int8); repeatable",
    )
    s.add_argument("--host", default="127.0.0.1", help="IPv4 address to bind")
    s.add_argument("--port", type=_port, default=47600, help="UDP port (TCP: the same number)")
    s.add_argument(
        "--device", choices=("cpu", "cuda"), default="cpu", help="where the requests are solved"
    )
    s.add_argument(
        "--mode",
        choices=("resident", "launch", "echo"),
        default="resident",
        help="GPU backend: a persistent kernel, or one kernel launch per request (baseline); "
        "echo (CPU): answer without solving, to measure the front end and load generator alone",
    )
    s.add_argument("--workers", type=positive_int, default=None, help="solver threads (CPU)")
    s.add_argument(
        "--blocks", type=int, default=0, help="persistent blocks (resident; 0: all that fit)"
    )
    s.add_argument("--streams", type=positive_int, default=4, help="launch threads (launch)")
    s.add_argument(
        "--receivers", type=positive_int, default=1, help="UDP receiver threads (SO_REUSEPORT)"
    )
    s.add_argument("--collectors", type=positive_int, default=4, help="reply threads (resident)")
    s.add_argument(
        "--spin-us", type=finite_float, default=0.0,
        help="receivers and workers spin this long for work before blocking (0: block at once)",
    )  # fmt: skip
    s.add_argument(
        "--offload", action="store_true",
        help="UDP segmentation offload: replies to one client leave as one UDP_SEGMENT send, "
        "runs of requests are read in one piece (UDP_GRO)",
    )  # fmt: skip
    s.add_argument("--pin", action="store_true", help="pin receivers and workers to one CPU each")
    s.add_argument(
        "--trace", action="store_true",
        help="record each request's stage times and break down the slow ones in the counters",
    )  # fmt: skip
    s.add_argument("--slow-us", type=finite_float, default=200.0, help="slow for --trace (us)")
    s.add_argument(
        "--share", nargs="?", const="all", default="", metavar="PARTS",
        help="work sharing: threads take over the work of a peer that stalled for 50 us; "
        "PARTS: all (default) or some of read,collect,feed",
    )  # fmt: skip
    s.add_argument(
        "--isolate", action="store_true",
        help="with --pin: the process's other threads onto the CPUs no pinned thread uses",
    )  # fmt: skip
    s.add_argument(
        "--rx-batch", type=positive_int, default=64,
        help="most datagrams (runs, with --offload) one receiver read takes (1-1024)",
    )  # fmt: skip
    s.add_argument("--depth", type=positive_int, default=4096, help="queue depth (then BUSY)")
    s.add_argument("--duration", type=finite_float, default=None, help="seconds to serve")
    add_json(s)
    s.set_defaults(func=run_serve)

    g = sub.add_parser(
        "ising load",
        prog="cuscikit ising load",
        help="load a dSB server; report completed requests/s and latencies",
        description="Send solve requests to a dSB server (a C++ sender and receiver): open loop "
        "at each --rate (Poisson arrivals), or closed loop with --in-flight requests "
        "outstanding; report completed requests/s, BUSY and error replies, losses, and p50 / "
        "p99 / p99.9 of the round trip and of the server residence.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    g.add_argument("--host", default="127.0.0.1", help="the server's address")
    g.add_argument("--port", type=_port, default=47600, help="the server's UDP port")
    g.add_argument("--model-id", type=int, default=1, help="the model to solve")
    g.add_argument("--n", type=positive_int, required=True, help="the model's number of spins")
    g.add_argument("--steps", type=positive_int, default=100, help="dSB steps per request")
    g.add_argument("--replicas", type=positive_int, default=1, help="replicas per request")
    g.add_argument("--dt", type=finite_float, default=0.5, help="time step")
    g.add_argument("--seed", type=int, default=0, help="request i uses seed + i")
    g.add_argument(
        "--rate", type=finite_float, nargs="+", default=None, help="offered requests/s (open loop)"
    )
    g.add_argument("--in-flight", type=positive_int, default=None, help="closed loop depth")
    g.add_argument("--count", type=positive_int, default=100000, help="requests per rate")
    g.add_argument(
        "--duration",
        type=finite_float,
        default=None,
        help="seconds per rate (open loop: count = rate x duration; overrides --count)",
    )
    g.add_argument("--drain", type=finite_float, default=1.0, help="seconds of silence = lost")
    g.add_argument("--senders", type=positive_int, default=1, help="sending sockets and threads")
    g.add_argument(
        "--spin", action="store_true",
        help="the threads spin instead of sleeping (a core each; no wake-up latency)",
    )  # fmt: skip
    g.add_argument(
        "--offload", action="store_true",
        help="requests due together leave as one UDP_SEGMENT send; replies read with UDP_GRO",
    )  # fmt: skip
    g.add_argument("--pin", action="store_true", help="pin each sending thread to one CPU")
    add_json(g)
    g.set_defaults(func=run_load)


def run_serve(args) -> int:
    from cuscikit.ising import IsingModel
    from cuscikit.ising.service import IsingServer, share_parts

    if args.duration is not None and args.duration <= 0:
        raise UsageError(f"--duration must be positive, got {args.duration}")
    if not args.models and not args.random:
        raise UsageError("nothing to serve: give graph files or --random N")
    paths = [Path(p) for p in args.models]
    for p in paths:
        if not p.is_file():
            raise UsageError(f"{p}: no such file")
    if args.blocks < 0:
        raise UsageError(f"--blocks must be >= 0, got {args.blocks}")
    if not 0 <= args.spin_us <= 1e6:
        raise UsageError(f"--spin-us must be in [0, 1e6], got {args.spin_us}")
    if not 1 <= args.rx_batch <= 1024:
        raise UsageError(f"--rx-batch must be in [1, 1024], got {args.rx_batch}")
    if not 0 < args.slow_us <= 1e7:
        raise UsageError(f"--slow-us must be in (0, 1e7], got {args.slow_us}")
    if args.mode == "echo" and args.device != "cpu":
        raise UsageError("--mode echo runs on --device cpu")
    try:
        share_parts(args.share)
    except ValueError as exc:
        raise UsageError(f"--{exc}") from None
    if args.device == "cuda":
        require_cuda(args.device)
    models = [IsingModel.from_gset(p) for p in paths]
    models += [random_model(n, kind, seed=i) for i, (n, kind) in enumerate(args.random)]
    server = IsingServer(
        args.host, args.port, workers=args.workers, depth=args.depth, device=args.device,
        mode=args.mode if args.mode == "echo" or args.device != "cpu" else None,
        blocks=args.blocks, streams=args.streams, receivers=args.receivers,
        collectors=args.collectors, spin_us=args.spin_us, offload=args.offload, pin=args.pin,
        trace=args.trace, slow_us=args.slow_us, share=args.share, isolate=args.isolate,
        rx_batch=args.rx_batch,
    )  # fmt: skip
    port, tcp_port = server.port, server.tcp_port
    asked = []  # SIGUSR1: print the counters so far as one JSON line
    if hasattr(signal, "SIGUSR1"):
        signal.signal(signal.SIGUSR1, lambda *_: asked.append(1))
    try:
        for i, m in enumerate(models, start=1):
            server.load_model(i, m)
        server.start()
        table = ", ".join(f"{i}: n={m.n} {m.kind}" for i, m in enumerate(models, start=1))
        print(f"serving on {args.host} UDP {port} TCP {tcp_port}; models {table}", flush=True)
        print(f"{server.info}; queue depth {args.depth}", flush=True)
        t0 = time.perf_counter()
        try:
            while args.duration is None or time.perf_counter() - t0 < args.duration:
                time.sleep(0.01)
                while asked:
                    asked.pop()
                    print("stats " + json.dumps(server.stats()), flush=True)
        except KeyboardInterrupt:
            pass
        wall = time.perf_counter() - t0
    finally:
        server.close()
    stats = server.stats()
    report = {
        "host": args.host,
        "port": port,
        "tcp_port": tcp_port,
        "models": [{"id": i, "n": m.n, "kind": m.kind} for i, m in enumerate(models, start=1)],
        "backend": server.info,
        "depth": args.depth,
        "served_s": wall,
        "stats": stats,
    }
    lines = [f"served {wall:.1f} s: " + ", ".join(f"{k} {v}" for k, v in stats.items() if v)]
    emit(args, report, lines)
    return 0


def run_load(args) -> int:
    from cuscikit.ising.service import load_test

    if (args.rate is None) == (args.in_flight is None):
        raise UsageError("give --rate R [R ...] (open loop) or --in-flight N (closed loop)")
    for r in args.rate or []:
        if r <= 0:
            raise UsageError(f"--rate must be positive, got {r}")
    if args.duration is not None and args.duration <= 0:
        raise UsageError(f"--duration must be positive, got {args.duration}")
    rows = []
    loads = [(r, None) for r in args.rate] if args.rate else [(None, args.in_flight)]
    for rate, in_flight in loads:
        count = args.count
        if args.duration is not None and rate is not None:
            count = max(1, int(rate * args.duration))
        rep = load_test(
            args.model_id, args.n, args.steps, args.replicas, args.dt, args.seed,
            count=count, rate=rate, in_flight=in_flight, host=args.host, port=args.port,
            drain_s=args.drain, senders=args.senders, spin=args.spin, offload=args.offload,
            pin=args.pin,
        )  # fmt: skip
        rows.append(rep.row())
    head = (
        f"{'offered/s':>10} {'in-flight':>9} {'sent':>8} {'done/s':>10} {'busy':>7} "
        f"{'lost':>7} {'rtt p50':>9} {'p99':>9} {'p99.9':>9} {'res p50':>9} {'p99':>9}"
    )
    lines = [head]
    for r in rows:

        def f(v):
            return "-" if v is None else f"{v:.0f}"

        lines.append(
            f"{f(r['offered_per_s']):>10} {f(r['in_flight']):>9} {r['sent']:>8} "
            f"{r['completed_per_s']:>10.0f} {r['busy']:>7} {r['lost']:>7} "
            f"{f(r['rtt_p50_us']):>9} {f(r['rtt_p99_us']):>9} {f(r['rtt_p999_us']):>9} "
            f"{f(r['residence_p50_us']):>9} {f(r['residence_p99_us']):>9}"
        )
    lines.append("(times in microseconds)")
    report = {
        "n": args.n,
        "steps": args.steps,
        "replicas": args.replicas,
        "model_id": args.model_id,
        "rows": rows,
    }
    emit(args, report, lines)
    return 0
