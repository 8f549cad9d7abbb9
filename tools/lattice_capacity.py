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
  replaced by ln|c|: it learns the phase only); ANSATZ_JSON replaces Ansatz defaults, e.g.
  'd64:energy+teacher:{"d_model":64}'. Several variants run one after another.
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


def run_variant(mol, configs, h, c, e_s, name, objective, kw, args, device, oracle=""):
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
    marks = {s for s in (0, 50, 100, 200, 500, 1000, 2000, 4000, 8000) if s <= args.steps}
    marks.add(args.steps)
    for step in range(args.steps + 1):
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
        loss = 2.0 * (lp.to(torch.complex128).conj() * coef).real.sum()
        loss.backward()
        opt.step()
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
        objective, _, oracle = objective.partition("/")
        if objective not in ("energy+teacher", "teacher") or oracle not in (
            "",
            "sign",
            "amplitude",
        ):
            ap.error(f"unknown objective {objective!r} or oracle {oracle!r} in {v!r}")
        variants.append((name, objective, json.loads(kw or "{}"), oracle))
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
    for name, objective, kw, oracle in variants:
        rows += run_variant(mol, space.configs, ht, c, e_s, name, objective, kw, args, dev, oracle)
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
