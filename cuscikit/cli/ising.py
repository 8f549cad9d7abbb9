"""`cuscikit ising`: MAX-CUT of a G-set / rudy graph file with the dSB Ising solver."""

from __future__ import annotations

import argparse
from pathlib import Path

from cuscikit.cli.common import (
    UsageError,
    add_json,
    emit,
    finite_float,
    positive_int,
    require_cuda,
)


def _seed(text: str) -> int:
    try:
        value = int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if not 0 <= value < 2**64:
        raise argparse.ArgumentTypeError(f"must be in [0, 2^64), got {value}")
    return value


def register(sub) -> None:
    s = sub.add_parser(
        "ising",
        help="MAX-CUT of a graph file with discrete simulated bifurcation (dSB)",
        description="MAX-CUT of a G-set / rudy graph file (first line 'n m', then m lines "
        "'i j w', 1-based, integer weights; .gz read compressed) with the dSB Ising solver. "
        "Integer weights give the same result on the CPU and the GPU, bit for bit.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    s.add_argument(
        "file",
        help="graph file (G-set / rudy format); `cuscikit ising serve|load --help` for the "
        "request service and its load generator",
    )
    s.add_argument("--agents", type=positive_int, default=128, help="replicas run side by side")
    s.add_argument("--steps", type=positive_int, default=2000, help="steps of the pump schedule")
    s.add_argument("--dt", type=finite_float, default=0.5, help="time step")
    s.add_argument("--seed", type=_seed, default=0, help="64-bit seed of the initial state")
    s.add_argument(
        "--device",
        choices=("cpu", "cuda", "auto"),
        default="cpu",
        help="where the replicas run (the same bytes on both; auto: cuda when available)",
    )
    s.add_argument(
        "--time-limit",
        type=finite_float,
        default=None,
        help="run restarts with fresh draws until the next would end past this many seconds",
    )
    s.add_argument("--restarts", type=positive_int, default=None, help="a fixed number of runs")
    s.add_argument("--polish", action="store_true", help="finish with a greedy single-flip descent")
    s.add_argument(
        "--reduce",
        choices=("auto", "on", "off"),
        default="auto",
        help="run on the exact kernel with spins of degree <= 2 eliminated (auto: when it keeps "
        "at most half of the spins)",
    )
    s.add_argument("--spins-out", default=None, help="write the best spins (+1/-1, one a line)")
    add_json(s)
    s.set_defaults(func=run)
    from cuscikit.cli import ising_service

    ising_service.register(sub)


def run(args) -> int:
    from cuscikit.ising import IsingModel, solve

    if args.dt <= 0:
        raise UsageError(f"--dt must be positive, got {args.dt}")
    if args.time_limit is not None and args.time_limit <= 0:
        raise UsageError(f"--time-limit must be positive, got {args.time_limit}")
    path = Path(args.file)
    if not path.is_file():
        raise UsageError(f"{args.file}: no such file")
    if args.device == "cuda":
        require_cuda(args.device)
    spins_out = None
    if args.spins_out:
        try:
            spins_out = open(args.spins_out, "w")  # noqa: SIM115 - checked before any work
        except OSError as exc:
            raise UsageError(f"cannot write {args.spins_out}: {exc.strerror or exc}") from None
    try:
        model = IsingModel.from_gset(path)
        r = solve(
            model,
            agents=args.agents,
            steps=args.steps,
            dt=args.dt,
            seed=args.seed,
            device=args.device,
            time_limit=args.time_limit,
            restarts=args.restarts,
            polish=args.polish,
            reduce={"auto": "auto", "on": True, "off": False}[args.reduce],
        )
        if spins_out is not None:
            spins_out.write("".join(f"{int(v)}\n" for v in r.spins))
    finally:
        if spins_out is not None:
            spins_out.close()
    report = {
        "file": str(path),
        "n": model.n,
        "edges": model.J.nnz // 2,
        "kind": model.kind,
        "energy": r.energy,
        "cut": r.cut,
        "steps": args.steps,
        "agents": args.agents,
        "restarts": r.restarts,
        "dt": args.dt,
        "seed": args.seed,
        "device": r.device,
        "checksum": int(r.history["checksum"][-1]),
        "kernel_n": r.kernel_n,
        "wall_s": r.wall_s,
    }
    lines = [
        f"{path.name}: n={model.n}, {report['edges']} edges, couplings {model.kind}",
        f"  cut {r.cut}  (Ising energy {r.energy}), {args.agents} agents x {args.steps} steps"
        f" x {r.restarts} run(s) on {r.device}, {r.wall_s:.2f} s",
    ]
    emit(args, report, lines)
    return 0
