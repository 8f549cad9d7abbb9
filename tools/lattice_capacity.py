"""How close can the ansatz come to the best state of a fixed space? A probe for large lattices.

The space S is the `--n` determinants of largest exact |c| (from FCI), and its CI vector c (the
lowest eigenvector of H within S) is the target. Each variant trains a fresh ansatz on S alone,
full batch, with AdamW at the Runner's settings, on the energy within S plus the teacher's pull
towards c (`cuscikit.nnqs.teacher`, the loss of the teacher's hold) or on the pull alone, and
prints the network's variational energy within S above the CI energy of S at a few steps. A
variant that stays far above it after thousands of full-batch steps cannot hold that state,
whatever S the method would pick; one that closes the gap says the limit lies elsewhere (the
number of optimiser steps a run gives the network, or the space).

usage: python tools/lattice_capacity.py [--system Hubbard-10-chain-U4] [--n 30000]
           [--steps 2000] [--variant NAME:OBJECTIVE:ANSATZ_JSON ...] [--json-out F]
  OBJECTIVE: "energy+teacher" (weight --teacher) or "teacher", optionally with "/sign" (the
  phase replaced by the signs of c: the network learns |psi| only) or "/amplitude" (ln|psi|
  replaced by ln|c|: it learns the phase only), and optionally "@M": each step's gradient from
  M configurations drawn from S (below) instead of all of S; ANSATZ_JSON replaces Ansatz
  defaults, e.g. 'd64:energy+teacher:{"d_model":64}'. Several variants run one after another.

A mini-batch step ("@M") still evaluates psi on all of S without a gradient (so the loss's
coefficients T_x, which depend on psi everywhere on S, are exact), then draws M configurations
x with probability pi_x = |T_x| / sum |T| (with replacement) and differentiates
2 Re sum_draws conj(ln psi_x) T_x / (M pi_x) over the distinct draws: an unbiased estimate of
the full-batch gradient whose backward pass covers at most M configurations.

OBJECTIVE "runner" runs the Runner itself (its defaults, `--lr`, float32) with S as its starting
space and no growth (``growth="weight"`` with an unreachable threshold), so every iteration is
the Runner's optimiser stage on this S; a "step" is then one of its optimiser steps (the
iteration's and its inner steps), and the rows come every 25 iterations. Its ANSATZ_JSON may
hold "runner": {...}, options of the Runner (e.g. {"graphs": false}).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from accuracy_small import build_system  # noqa: E402

from cuscikit import Ansatz  # noqa: E402
from cuscikit.nnqs.teacher import fidelity_loss, teacher_coefficients  # noqa: E402
from cuscikit.sci.space import SCISpace  # noqa: E402


def run_variant(mol, configs, h, c, e_s, name, objective, kw, args, device, oracle="", batch=None):
    ansatz = Ansatz.for_molecule(mol, seed=args.seed, device=device, **kw)
    # an oracle replaces one part of ln psi by the target's: the signs of c (the network learns
    # only |psi|) or ln|c| (it learns only the phase)
    dt = ansatz.dtype
    exact_phase = torch.as_tensor(np.where(c < 0, np.pi, 0.0), dtype=dt, device=device)
    with np.errstate(divide="ignore"):
        exact_amp = torch.as_tensor(np.log(np.abs(c)), dtype=dt, device=device)
    opt = torch.optim.AdamW(
        ansatz.parameters(), lr=args.lr, betas=(0.9, 0.99), weight_decay=0.0, eps=1e-9
    )
    x = torch.from_numpy(configs.view(np.int64)).to(device)
    c_t = torch.as_tensor(c, dtype=torch.float64, device=device)
    rows, t0 = [], time.perf_counter()
    marks = {0, 50, 100, 200, 500} | {1000 * 2**k for k in range(8)}
    marks = {s for s in marks if s <= args.steps}
    gen = torch.Generator(device=device).manual_seed(args.seed)
    marks.add(args.steps)
    for step in range(args.steps + 1):
        with torch.set_grad_enabled(batch is None):
            lp = ansatz.log_psi(x)
        if oracle == "sign":
            lp = torch.complex(lp.real, exact_phase)
        elif oracle == "amplitude":
            lp = torch.complex(exact_amp, lp.imag)
        lpd = lp.detach().to(torch.complex128)
        psi = torch.exp(lpd - lpd.real.max())
        hpsi = h @ psi
        norm = float((psi.abs() ** 2).sum())
        e = float((psi.conj() * hpsi).real.sum()) / norm
        if step in marks:
            rows.append(
                {
                    "variant": name,
                    "step": step,
                    "above_ci_mha": 1e3 * (e - e_s),
                    "teacher_loss": fidelity_loss(psi, c_t),
                    "s": time.perf_counter() - t0,
                }
            )
            print(
                f"{name:>22} step {step:5d}  E - E_CI(S) {1e3 * (e - e_s):10.3f} mHa  "
                f"L_T {rows[-1]['teacher_loss']:.3e}  {rows[-1]['s']:7.1f} s",
                flush=True,
            )
        if step == args.steps:
            break
        if objective == "energy+teacher":
            w = psi.abs() ** 2 / norm
            local = torch.where(psi != 0, hpsi / psi, 0.0)  # psi = 0 only where c = 0 is given
            coef = w * (local - e) + args.teacher * teacher_coefficients(psi, c_t)
        else:
            coef = teacher_coefficients(psi, c_t)
        opt.zero_grad(set_to_none=True)
        if batch is not None:  # an unbiased draw of `batch` terms, pi_x = |T_x| / sum |T|
            weight = coef.abs()
            draws = torch.multinomial(weight, batch, replacement=True, generator=gen)
            rows_b, counts = torch.unique(draws, return_counts=True)
            coef = coef[rows_b] * (counts * weight.sum() / (batch * weight[rows_b]))
            lp = ansatz.log_psi(x[rows_b])
            if oracle == "sign":
                lp = torch.complex(lp.real, exact_phase[rows_b])
            elif oracle == "amplitude":
                lp = torch.complex(exact_amp[rows_b], lp.imag)
        loss = 2.0 * (lp.to(torch.complex128).conj() * coef).real.sum()
        loss.backward()
        opt.step()
    return rows


def run_runner(mol, configs, e_s, name, kw, args, device):
    """The Runner's own iterations on the fixed space `configs` (see the module doc)."""
    from cuscikit.nnqs import Callback, Runner

    kw = dict(kw)
    options = kw.pop("runner", {})
    ansatz = Ansatz.for_molecule(mol, seed=args.seed, device=device, **kw)
    runner = Runner(
        mol,
        ansatz,
        space=SCISpace(mol, configs),
        growth="weight",
        add_weight=0.99,  # no new configuration carries that first-order weight: S stays
        lr=args.lr,
        seed=args.seed,
        device=device,
        verbose=0,
        **options,
    )
    rows, t0 = [], time.perf_counter()

    class Marks(Callback):
        steps = 0

        def on_step_end(self, driver, row):
            self.steps += 1 + int(row.get("inner_steps", driver.inner_steps))
            if row["iteration"] % 25 == 0 or self.steps >= args.steps:
                rows.append(
                    {
                        "variant": name,
                        "step": self.steps,
                        "iteration": int(row["iteration"]),
                        "above_ci_mha": 1e3 * (row["e_variational"] - e_s),
                        "teacher_loss": float(row.get("teacher_loss", np.nan)),
                        "n_space": int(row["n_space"]),
                        "s": time.perf_counter() - t0,
                    }
                )
                r = rows[-1]
                print(
                    f"{name:>22} step {r['step']:5d} (iteration {r['iteration']})  E - E_CI(S) "
                    f"{r['above_ci_mha']:10.3f} mHa  L_T {r['teacher_loss']:.3e}  "
                    f"|S| {r['n_space']}  {r['s']:7.1f} s",
                    flush=True,
                )
            return self.steps >= args.steps

    runner.kernel(args.steps, callbacks=[Marks()], progress=False)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--system", default="Hubbard-10-chain-U4")
    ap.add_argument("--cache", default=None)
    ap.add_argument("--n", type=int, default=30000)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--teacher", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--variant", nargs="+", default=["default:energy+teacher:{}"])
    ap.add_argument("--json-out", default=None)
    args = ap.parse_args()
    variants = []
    for v in args.variant:
        name, objective, kw = v.split(":", 2)
        objective, _, batch = objective.partition("@")
        objective, _, oracle = objective.partition("/")
        if objective not in ("energy+teacher", "teacher", "runner") or oracle not in (
            "",
            "sign",
            "amplitude",
        ):
            ap.error(f"unknown objective {objective!r} or oracle {oracle!r} in {v!r}")
        if objective == "runner" and (oracle or batch):
            ap.error(f"the runner objective takes neither an oracle nor a mini-batch: {v!r}")
        if batch and (not batch.isdigit() or int(batch) <= 0):
            ap.error(f"the mini-batch of {v!r} must be a positive integer")
        variants.append((name, objective, json.loads(kw or "{}"), oracle, int(batch or 0) or None))
    mol, e_fci, _ = build_system(args.system, args.cache)
    t = time.perf_counter()
    full = SCISpace.full(mol)
    e0, vec = full.exact_energy(return_vectors=True)
    order = np.argsort(-np.abs(vec[:, 0]), kind="stable")[: args.n]
    space = SCISpace(mol, full.configs[order])
    e_s, cs = space.exact_energy(return_vectors=True)
    c = cs[:, 0] * np.sign(cs[np.argmax(np.abs(cs[:, 0])), 0])
    h = space.hamiltonian.restricted(space.configs).tocsr().tocoo()
    dev = torch.device(args.device)
    warnings.filterwarnings("ignore", message="Sparse")  # torch's beta notices
    ht = torch.sparse_coo_tensor(
        np.vstack([h.row, h.col]), h.data.astype(np.complex128), h.shape, device=dev
    ).to_sparse_csr()
    print(
        f"{args.system}: FCI {e0:.10f} ({len(full)} determinants; reference {e_fci:.10f}); "
        f"S = the {len(space)} largest |c|, its CI energy {1e3 * (e_s - e0):.3f} mHa above FCI; "
        f"{time.perf_counter() - t:.1f} s",
        flush=True,
    )
    rows = []
    for name, objective, kw, oracle, batch in variants:
        if objective == "runner":
            rows += run_runner(mol, space.configs, e_s, name, kw, args, dev)
            continue
        rows += run_variant(
            mol, space.configs, ht, c, e_s, name, objective, kw, args, dev, oracle, batch
        )
    print("\n| variant | step | above the CI energy of S (mHa) | teacher loss | s |")
    print("| --- | --- | --- | --- | --- |")
    for r in rows:
        print(
            f"| {r['variant']} | {r['step']} | {r['above_ci_mha']:.3f} | "
            f"{r['teacher_loss']:.3e} | {r['s']:.1f} |"
        )
    if args.json_out:
        Path(args.json_out).write_text(
            json.dumps(
                {
                    "system": args.system,
                    "n_space": len(space),
                    "ci_above_fci_mha": 1e3 * (e_s - e0),
                    "args": {k: v for k, v in vars(args).items() if k != "json_out"},
                    "rows": rows,
                },
                indent=1,
            )
            + "\n"
        )


if __name__ == "__main__":
    main()
