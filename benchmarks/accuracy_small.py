"""NNQS-SCI accuracy on the small benchmark set with the default settings.

Runs the Runner with its defaults (no per-molecule tuning; the rate's tail decay of the command
line) for a fixed number of iterations on each system and seed, and prints: system, qubits,
E_FCI, seed, the errors of both estimators and of the PT2-corrected energy at the last
iteration, the first iteration from which both estimators stay within chemical accuracy
(1.6 mHa), iterations, |S|, wall time and machine; then, per system, the largest error over the
seeds. Histories go to --out (CSV per system and seed).

    python benchmarks/accuracy_small.py [--iters 2000] [--seeds 0,1,2] [--device cpu|cuda]
        [--jobs N] [--cache DIR] [--json-out FILE] [systems...]

Systems: the bundled molecules by name; lattices by the names `Molecule.load` takes
(``Hubbard-<L>-<chain|ring>-U<U>`` or ``Hubbard-<Lx>x<Ly>-<open|pbc>-U<U>`` at half filling, in
the default mean-field working basis, with ``-aufbau`` appended to start from the aufbau
determinant where the lattice names another start: a partly filled shell, as on rings of 4n
sites); and ``H6-stretched`` (a linear H6 chain with 2.0 Angstrom bonds in STO-3G, needs PySCF). The
reference of a system without a bundled one is its FCI energy (`cuscikit.FCI`). ``--set
lattice`` runs the molecule-and-lattice set (molecules, stretched bonds, Hubbard chains and rings
at U = 2, 4 and 8, up to 12 sites), ``--set quick`` its smallest cases (a CPU run).

``--jobs N`` runs N (system, seed) pairs at once in separate processes (one thread each unless
--threads says otherwise): on a GPU, many small runs side by side keep it busier than one after
another (start the CUDA MPS daemon first, ``nvidia-cuda-mps-control -d``, so that their kernels
overlap). ``--cache DIR`` keeps each system's reference energy, and the integrals of a system
that needs PySCF as an FCIDUMP, so a machine without PySCF, or one where the FCI of a 12-site
lattice would cost minutes, reuses them. ``--deadline S`` stops every run S seconds after the
script started, so a time-limited call returns all rows; ``--json-out`` writes the rows and the
per-system summary.

With --checkpoint-dir a run longer than one call (e.g. one 10-minute device call) continues
where the last call stopped: each system and seed keeps DIR/<slug>_seed<N>.h5 and resumes from
it; --iters is then the total, and "run s" sums the iteration times of all calls.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from multiprocessing import get_context
from pathlib import Path

import numpy as np
import torch
from _common import machine, print_table, write_json

from cuscikit import FCI, Molecule
from cuscikit.chem.lattice import lattice_from_name
from cuscikit.nnqs import Ansatz, Callback, LearningRateDecay, Runner
from cuscikit.nnqs.defaults import DEFAULT_ITERATIONS, DEFAULT_LR_DECAY_FROM, DEFAULT_LR_FINAL

SMALL_SET = ["LiH", "H2O", "N2", "C2", "LiF", "LiCl", "Li2O"]
HARD_SET = ["N2-stretched", "H8-chain", "O2-triplet"]
LATTICE_SET = [
    "LiH",
    "H2O",
    "N2-stretched",
    "H8-chain",
    "H6-stretched",
    "Hubbard-6-ring-U2",
    "Hubbard-6-ring-U4",
    "Hubbard-6-ring-U8",
    "Hubbard-8-chain-U4",
    "Hubbard-8-chain-U8",
    "Hubbard-10-chain-U4",
    "Hubbard-12-ring-U4",
]
QUICK_SET = [
    "LiH",
    "H2O",
    "H6-stretched",
    "Hubbard-6-ring-U2",
    "Hubbard-6-ring-U4",
    "Hubbard-6-ring-U8",
    "Hubbard-6-chain-U4",
]
SETS = {"small": SMALL_SET + HARD_SET, "lattice": LATTICE_SET, "quick": QUICK_SET}
CHEMICAL_ACCURACY = 1.6e-3
PT2_GOAL = 0.5e-3


def build_system(name: str, cache: str | None = None):
    """(molecule, reference energy, slug) of a benchmark system name (see the module doc).

    With `cache`, the reference (and the integrals of a system PySCF builds) are read from that
    folder when there and written to it when not."""
    mol = Molecule.load(name) if lattice_from_name(name) is not None else None
    slug = re.sub(r"[^0-9a-z]+", "_", name.lower()).strip("_")
    name = name.removesuffix("-aufbau")  # the same Hamiltonian: the same reference
    refs_path = Path(cache) / "references.json" if cache else None
    refs = json.loads(refs_path.read_text()) if refs_path and refs_path.exists() else {}
    if mol is None and name == "H6-stretched":
        dump = Path(cache) / f"{slug}.fcidump" if cache else None
        if dump is not None and dump.exists():
            mol = Molecule.from_fcidump(dump, name=name)
        else:
            from pyscf import gto

            atoms = [("H", (0.0, 0.0, 2.0 * i)) for i in range(6)]
            mol = Molecule.from_pyscf(gto.M(atom=atoms, basis="sto-3g", verbose=0), name=name)
            if dump is not None:
                dump.parent.mkdir(parents=True, exist_ok=True)
                mol.to_fcidump(dump)
    elif mol is None:
        mol = Molecule.load(name)
        return mol, mol.metadata["reference"]["energy"], mol.metadata["slug"]
    if name in refs:
        return mol, float(refs[name]), slug
    ref = FCI(mol, nroots=1, max_cycle=2000).run().e_tot
    if refs_path is not None:
        refs_path.parent.mkdir(parents=True, exist_ok=True)
        refs = json.loads(refs_path.read_text()) if refs_path.exists() else {}
        refs[name] = ref
        refs_path.write_text(json.dumps(refs, indent=1) + "\n")
    return mol, ref, slug


class TimeLimit(Callback):
    """Stop a run after `seconds` of wall time, or at the wall-clock time `stop_at` (epoch s)."""

    def __init__(self, seconds: float | None, stop_at: float | None = None):
        self.seconds = seconds
        self.stop_at = stop_at
        self.t0 = time.perf_counter()

    def on_run_start(self, runner) -> None:
        self.t0 = time.perf_counter()

    def on_step_end(self, runner, row) -> bool:
        late = self.stop_at is not None and time.time() > self.stop_at
        return late or (self.seconds is not None and time.perf_counter() - self.t0 > self.seconds)


def first_stable_hit(err_c: np.ndarray, err_v: np.ndarray) -> int | None:
    """First iteration (1-based) from which both |errors| stay below chemical accuracy."""
    ok = (np.abs(err_c) < CHEMICAL_ACCURACY) & (np.abs(err_v) < CHEMICAL_ACCURACY)
    bad = np.flatnonzero(~ok)
    if ok.all():
        return 1
    return None if bad[-1] == len(ok) - 1 else int(bad[-1]) + 2


def main() -> None:
    t_start = time.time()
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("systems", nargs="*")
    ap.add_argument("--set", choices=sorted(SETS), default="small", help="systems if none given")
    ap.add_argument("--iters", type=int, default=DEFAULT_ITERATIONS)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--seeds", default="0", help="comma-separated seeds, one run each")
    ap.add_argument("--out", default="out/accuracy")
    ap.add_argument(
        "--max-seconds",
        type=float,
        default=None,
        help="stop each run after this long (the table says how far it got)",
    )
    ap.add_argument(
        "--deadline",
        type=float,
        default=None,
        help="stop every run this many seconds after the script started",
    )
    ap.add_argument("--jobs", type=int, default=1, help="runs at once, one process each")
    ap.add_argument(
        "--threads", type=int, default=None, help="torch threads per run (default: 1 with --jobs)"
    )
    ap.add_argument("--cache", default=None, help="folder of reference energies and integrals")
    ap.add_argument("--json-out", default=None, help="also write the rows to this JSON file")
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
    systems = args.systems or SETS[args.set]
    seeds = [int(v) for v in args.seeds.split(",")]
    if args.jobs < 1:
        ap.error("--jobs must be at least 1")
    for name in systems:
        # an unknown or malformed name fails here, before any run (a lattice's name is only
        # parsed: its model is built once, by the run)
        if name != "H6-stretched" and lattice_from_name(name) is None:
            Molecule.load(name)
    json.loads(args.ansatz), json.loads(args.runner)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stop_at = None if args.deadline is None else t_start + args.deadline
    refs = {}
    for name in systems:  # references once per system, before the runs
        refs[name] = build_system(name, args.cache)[1]
    tasks = [(vars(args), name, refs[name], seed, stop_at) for name in systems for seed in seeds]
    if args.jobs == 1:
        results = [run_task(*t) for t in tasks]
    else:
        outcomes = run_side_by_side(run_task, tasks, args.jobs)
        results = []
        for t, (ok, value) in zip(tasks, outcomes, strict=True):
            if ok:
                results.append(value)
            else:  # one failed run must not hide the others
                print(f"{t[1]} seed {t[3]}: FAILED: {value!r}", flush=True)
    failed = len(tasks) - len(results)
    rows = [r["row"] for r in results]
    summary: dict[str, list] = {}
    for r in results:
        summary.setdefault(r["system"], []).append(r)
    ansatz_kw, runner_kw = json.loads(args.ansatz), json.loads(args.runner)
    extra = (
        f"{' but ' + args.ansatz if ansatz_kw else ''}{' but ' + args.runner if runner_kw else ''}"
        f"{' but lr decay ' + args.lr_decay if args.lr_decay != default_decay else ''}"
    )
    title = (
        f"NNQS-SCI accuracy, default settings{extra}, {args.iters} iterations, "
        f"on {machine()} ({args.device}, {args.jobs} run(s) at once)"
    )
    print_table(
        title,
        [
            "system",
            "qubits",
            "E_FCI",
            "seed",
            "err coupled mHa",
            "err variational mHa",
            "err PT2 mHa",
            "within 1.6 mHa from it",
            "iters",
            "|S|",
            "run s",
        ],
        rows,
    )
    table = []
    for name, runs in summary.items():
        worst = np.max(np.abs(np.array([r["errors"] for r in runs])), axis=0) * 1e3
        table.append(
            [
                name,
                ",".join(str(r["seed"]) for r in runs),
                min(r["iterations"] for r in runs),
                f"{worst[0]:.3f}",
                f"{worst[1]:.3f}",
                f"{worst[2]:.3f}",
                "yes" if worst[1] < CHEMICAL_ACCURACY * 1e3 else "no",
                "yes" if worst[2] < PT2_GOAL * 1e3 else "no",
            ]
        )
    anchor = f"variational < {CHEMICAL_ACCURACY * 1e3} mHa, PT2-corrected < {PT2_GOAL * 1e3} mHa"
    print_table(
        f"Largest |error| over the seeds (goals: {anchor}){extra}",
        [
            "system",
            "seeds",
            "fewest iters",
            "coupled",
            "variational",
            "PT2",
            "var goal",
            "PT2 goal",
        ],
        table,
    )
    if args.json_out:
        write_json(
            args.json_out,
            "accuracy_small.py",
            f"every system and seed: {anchor} against FCI at <= {DEFAULT_ITERATIONS} iterations",
            args,
            [{k: v for k, v in r.items() if k != "row"} for r in results],
            note=f"{args.device}, {args.jobs} run(s) at once",
        )
    if failed:
        sys.exit(f"{failed} of {len(tasks)} runs failed")


def _workers(pool: ProcessPoolExecutor) -> list:
    """The pool's worker processes (a private attribute of the executor; none once it is gone)."""
    return list((getattr(pool, "_processes", None) or {}).values())


def run_side_by_side(fn, tasks: list[tuple], jobs: int) -> list[tuple[bool, object]]:
    """``fn(*task)`` for every task, `jobs` worker processes at once (spawned); per task
    ``(True, result)`` or ``(False, exception)``, in the tasks' order.

    A worker that dies (a device fault, say) fails the runs that had not finished
    (``BrokenProcessPool``). The pool then sends its other workers SIGTERM, which a Runner
    takes as "stop after this iteration": a worker stuck in a call that does not return after
    the fault would never exit, and waiting for it would keep the table and the JSON of the
    runs that did finish from being written. So after any failure the workers still alive are
    killed (SIGKILL) instead of waited for. The pool itself did not always notice such a death
    (seen under load: the runs then waited for the stuck worker instead), so the workers are
    watched here as well: once one has ended while runs are pending, those runs fail.
    """
    pool = ProcessPoolExecutor(jobs, mp_context=get_context("spawn"))
    outcomes: list[tuple[bool, object]] = []
    try:
        futures = [pool.submit(fn, *t) for t in tasks]
        pending, lost = set(futures), None
        while pending:
            _, pending = wait(pending, timeout=1.0, return_when=FIRST_COMPLETED)
            # the pool does not always notice a dead worker: watch them here too
            if pending and any(w.exitcode is not None for w in _workers(pool)):
                _, pending = wait(pending, timeout=5.0)  # the pool's own verdict, if it comes
                lost = BrokenProcessPool("a worker process ended while runs were pending")
                break
        for f in futures:
            if not f.done():
                outcomes.append((False, lost))
            elif f.exception() is None:
                outcomes.append((True, f.result()))
            else:  # reported per run by the caller
                outcomes.append((False, f.exception()))
    finally:
        if len(outcomes) == len(tasks) and all(ok for ok, _ in outcomes):
            pool.shutdown()
        else:
            workers = _workers(pool)
            pool.shutdown(wait=False, cancel_futures=True)
            for w in workers:
                if w.is_alive():
                    w.kill()
            for w in workers:
                w.join(timeout=30)
    return outcomes


def run_task(opts: dict, name: str, ref: float, seed: int, stop_at: float | None) -> dict:
    """One run of one system and seed (in this process or a worker); its result."""
    args = argparse.Namespace(**opts)
    threads = args.threads or (1 if args.jobs > 1 else None)
    if threads:
        torch.set_num_threads(threads)
        os.environ["OMP_NUM_THREADS"] = str(threads)
    mol, _, slug = build_system(name, args.cache)
    out = Path(args.out)
    ansatz_kw, runner_kw = json.loads(args.ansatz), json.loads(args.runner)
    return run_one(
        args, name, mol, ref, f"{slug}_seed{seed}", seed, ansatz_kw, runner_kw, out, stop_at
    )


def run_one(args, name, mol, ref, tag, seed, ansatz_kw, runner_kw, out, stop_at=None):
    """One run of one system and seed; its result (``row``: the table row)."""
    t_wall = time.perf_counter()
    ansatz = Ansatz.for_molecule(mol, seed=seed, device=args.device, **ansatz_kw)
    runner = Runner(
        mol,
        ansatz,
        seed=seed,
        device=args.device,
        reference=ref,
        compile_inference=args.compile,
        **runner_kw,
    )
    ckpt = None
    if args.checkpoint_dir:
        ckpt = Path(args.checkpoint_dir) / f"{tag}.h5"
        ckpt.parent.mkdir(parents=True, exist_ok=True)
        if ckpt.exists():
            runner.load(str(ckpt))
            print(f"{name}: resumed from {ckpt} at iteration {runner.iteration}", flush=True)
    callbacks = []
    if args.max_seconds or stop_at:
        callbacks.append(TimeLimit(args.max_seconds, stop_at))
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
    h.to_csv(out / f"{tag}.csv", index=False)
    last = h.iloc[-1]
    hit = first_stable_hit(h["error"].to_numpy(), h["error_variational"].to_numpy())
    errs = (float(last["error"]), float(last["error_variational"]), float(last["error_pt2"]))
    n_space = int(last["n_space_next"])
    print(
        f"{name} seed {seed}: coupled {errs[0] * 1e3:+.3f} mHa, variational "
        f"{errs[1] * 1e3:+.3f}, PT2-corrected {errs[2] * 1e3:+.3f} after {len(h)} iterations, "
        f"|S| {n_space}, {wall:.0f} s",
        flush=True,
    )
    row = [
        name,
        2 * mol.norb,
        f"{ref:.8f}",
        seed,
        f"{errs[0] * 1e3:+.3f}",
        f"{errs[1] * 1e3:+.3f}",
        f"{errs[2] * 1e3:+.3f}",
        hit if hit else "-",
        len(h),
        n_space,
        f"{wall:.0f}",
    ]
    return {
        "system": name,
        "seed": seed,
        "qubits": 2 * mol.norb,
        "e_fci": ref,
        "errors": errs,
        "error_coupled": errs[0],
        "error_variational": errs[1],
        "error_pt2": errs[2],
        "within_from": hit,
        "iterations": len(h),
        "n_space": n_space,
        "n_space_max": int(h["n_space_next"].max()),
        "run_s": wall,
        "wall_s": time.perf_counter() - t_wall,
        "row": row,
    }


if __name__ == "__main__":
    main()
