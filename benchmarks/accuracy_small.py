"""NNQS-SCI accuracy on the small benchmark set with the default settings.

Runs the Runner with its defaults (no per-molecule tuning; the rate's tail decay of the command
line) for a fixed number of iterations on each system and prints: system, qubits, E_FCI, the
final energies of both estimators and their errors, the first iteration from which both stay
within chemical accuracy (1.6 mHa), wall time and machine. Histories go to --out (CSV per system).

    python benchmarks/accuracy_small.py [--iters 2000] [--device cpu|cuda] [systems...]

With --checkpoint-dir a run longer than one call (e.g. one 10-minute device call) continues
where the last call stopped: each system keeps DIR/<slug>.h5 and resumes from it; --iters is
then the total, and "run s" sums the iteration times of all calls.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
from _common import machine, print_table

from cuscikit import Molecule
from cuscikit.nnqs import Ansatz, Callback, LearningRateDecay, Runner
from cuscikit.nnqs.defaults import DEFAULT_ITERATIONS, DEFAULT_LR_DECAY_FROM, DEFAULT_LR_FINAL

SMALL_SET = ["LiH", "H2O", "N2", "C2", "LiF", "LiCl", "Li2O"]
HARD_SET = ["N2-stretched", "H8-chain", "O2-triplet"]
CHEMICAL_ACCURACY = 1.6e-3


class TimeLimit(Callback):
    """Stop a run after `seconds` of wall time."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.t0 = time.perf_counter()

    def on_run_start(self, runner) -> None:
        self.t0 = time.perf_counter()

    def on_step_end(self, runner, row) -> bool:
        return time.perf_counter() - self.t0 > self.seconds


def first_stable_hit(err_c: np.ndarray, err_v: np.ndarray) -> int | None:
    """First iteration (1-based) from which both |errors| stay below chemical accuracy."""
    ok = (np.abs(err_c) < CHEMICAL_ACCURACY) & (np.abs(err_v) < CHEMICAL_ACCURACY)
    bad = np.flatnonzero(~ok)
    if ok.all():
        return 1
    return None if bad[-1] == len(ok) - 1 else int(bad[-1]) + 2


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("systems", nargs="*", default=SMALL_SET + HARD_SET)
    ap.add_argument("--iters", type=int, default=DEFAULT_ITERATIONS)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="out/accuracy")
    ap.add_argument(
        "--max-seconds",
        type=float,
        default=None,
        help="stop a system's run after this long (the table says how far it got)",
    )
    ap.add_argument(
        "--compile", action="store_true", help="torch.compile the inference over the unique set"
    )
    ap.add_argument(
        "--checkpoint-dir",
        default=None,
        help="keep a checkpoint per system there and resume from it",
    )
    ap.add_argument(
        "--ansatz",
        default="{}",
        metavar="JSON",
        help="Ansatz keyword arguments that replace defaults, for checking a "
        "candidate default on the whole set (the table's title shows them)",
    )
    ap.add_argument(
        "--runner",
        default="{}",
        metavar="JSON",
        help="Runner keyword arguments that replace defaults (e.g. '{\"inner_steps\": 4}')",
    )
    default_decay = f"{DEFAULT_LR_DECAY_FROM},{DEFAULT_LR_FINAL:g}"
    ap.add_argument(
        "--lr-decay",
        default=default_decay,
        metavar="FROM,LR",
        help="the rate falls geometrically from iteration FROM * iters to LR at the "
        f"last (default {default_decay}); 'none': constant",
    )
    args = ap.parse_args()
    ansatz_kw, runner_kw = json.loads(args.ansatz), json.loads(args.runner)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in args.systems:
        mol = Molecule.load(name)
        ref = mol.metadata["reference"]["energy"]
        ansatz = Ansatz.for_molecule(mol, seed=args.seed, device=args.device, **ansatz_kw)
        runner = Runner(
            mol,
            ansatz,
            seed=args.seed,
            device=args.device,
            compile_inference=args.compile,
            **runner_kw,
        )
        ckpt = None
        if args.checkpoint_dir:
            ckpt = Path(args.checkpoint_dir) / f"{mol.metadata['slug']}.h5"
            ckpt.parent.mkdir(parents=True, exist_ok=True)
            if ckpt.exists():
                runner.load(str(ckpt))
                print(f"{name}: resumed from {ckpt} at iteration {runner.iteration}", flush=True)
        callbacks = [TimeLimit(args.max_seconds)] if args.max_seconds else []
        if args.lr_decay != "none":
            frac, lr_final = (float(v) for v in args.lr_decay.split(","))
            callbacks.append(LearningRateDecay.over_tail(args.iters, frac, lr_final))
        runner.run(
            max(0, args.iters - runner.iteration),
            callbacks=callbacks,
            progress=False,
            checkpoint=None if ckpt is None else str(ckpt),
            checkpoint_every=50,
        )
        h = runner.history
        wall = float(h["t_total"].sum())
        h.to_csv(out / f"{mol.metadata['slug']}.csv", index=False)
        last = h.iloc[-1]
        hit = first_stable_hit(h["error"].to_numpy(), h["error_variational"].to_numpy())
        rows.append(
            [
                name,
                2 * mol.norb,
                f"{ref:.8f}",
                f"{last['e_coupled']:.8f}",
                f"{last['error'] * 1e3:+.3f}",
                f"{last['e_variational']:.8f}",
                f"{last['error_variational'] * 1e3:+.3f}",
                hit if hit else "-",
                len(h),
                int(last["n_space"]),
                f"{wall:.0f}",
            ]
        )
        print(
            f"{name}: coupled {last['error'] * 1e3:+.3f} mHa, variational "
            f"{last['error_variational'] * 1e3:+.3f} mHa after {len(h)} iterations, "
            f"{wall:.0f} s",
            flush=True,
        )
    print_table(
        f"NNQS-SCI accuracy, default settings{' but ' + args.ansatz if ansatz_kw else ''}"
        f"{' but ' + args.runner if runner_kw else ''}"
        f"{' but lr decay ' + args.lr_decay if args.lr_decay != default_decay else ''}, "
        f"seed {args.seed}, on {machine()} ({args.device})",
        [
            "system",
            "qubits",
            "E_FCI",
            "E coupled",
            "err mHa",
            "E variational",
            "err mHa",
            "within 1.6 mHa from it",
            "iters",
            "|S|",
            "run s",
        ],
        rows,
    )


if __name__ == "__main__":
    main()
