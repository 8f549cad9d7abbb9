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

ANSATZ_JSON may also hold "sr": {...}: natural-gradient steps (stochastic reconfiguration on
the exact weights over S) instead of AdamW for the blocks in "blocks" (["amp"]: the transformer,
which sets ln|psi|; ["phase"]: the phase network; the two share no parameter, so the metric is
block-diagonal), from step "after" on (AdamW for everything before it and for the other block):
theta -= tau (G + shift)^-1 F with G the metric of ln psi weighted by "metric" ("p": the
network's |psi|^2 on S, "q": the target's c^2, "mix": their mean), F half the loss's gradient,
the per-configuration gradients from `torch.func.vmap`, at most "cg" conjugate-gradient
iterations, "shift" times G's mean diagonal added to it, and tau shortened so that the predicted
change of ln psi in the metric's norm stays within "max_change". `--every N` adds a row every N
steps.

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
from torch.func import functional_call, grad, vmap

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from accuracy_small import build_system  # noqa: E402

from cuscikit import Ansatz  # noqa: E402
from cuscikit.nnqs.teacher import fidelity_loss, teacher_coefficients  # noqa: E402
from cuscikit.sci.space import SCISpace  # noqa: E402


class _Part(torch.nn.Module):
    """ln|psi| or the phase of an ansatz as a module of its own (for `torch.func`)."""

    def __init__(self, ansatz, which):
        super().__init__()
        self.a, self.which = ansatz, which

    def forward(self, tokens):
        return self.a.log_amplitude(tokens) if self.which == "amp" else self.a.phase(tokens)


def jacobian(ansatz, tokens, which, chunk=512):
    """Per-configuration gradients (n, P) of ln|psi| ("amp": the transformer's parameters) or
    of the phase ("phase": the phase network's), which depend on disjoint parameters."""
    wrap = _Part(ansatz, which)
    names = [
        n for n, _ in ansatz.named_parameters() if n.startswith("phase_net") == (which == "phase")
    ]
    params = {f"a.{n}": p.detach() for n, p in ansatz.named_parameters() if n in names}
    size = sum(p.numel() for p in params.values())
    out = torch.empty(len(tokens), size, dtype=ansatz.dtype, device=tokens.device)

    def one(pr, t):
        return functional_call(wrap, pr, (t[None],))[0]

    for i in range(0, len(tokens), chunk):
        part = vmap(grad(one), in_dims=(None, 0))(params, tokens[i : i + chunk])
        out[i : i + chunk] = torch.cat([part[k].reshape(len(part[k]), -1) for k in params], 1)
    return [p for n, p in ansatz.named_parameters() if n in names], out


def natural_step(ansatz, tokens, w, r, which, sr):
    """theta -= tau (G + shift)^-1 F for one block (stochastic reconfiguration on the exact
    weights w over S): G = sum_x w_x (O_x - O_bar)(O_x - O_bar)^T, F = sum_x (O_x - O_bar) r_x
    (r: the loss's coefficients, Re T for ln|psi|, Im T for the phase), by conjugate
    gradients."""
    params, jac = jacobian(ansatz, tokens, which)
    jac = jac.to(torch.float64)
    jac -= (w[:, None] * jac).sum(0, keepdim=True)
    f = jac.T @ r
    diag = (w[:, None] * jac * jac).sum(0)
    shift = sr.get("shift", 1e-3) * float(diag.mean()) + sr.get("shift_abs", 0.0)

    def gmul(v):
        return jac.T @ (w * (jac @ v)) + shift * v

    x = torch.zeros_like(f)
    res, d = f.clone(), f.clone()
    rr, f2 = float(res @ res), float(f @ f)
    taken = 0
    for taken in range(1, sr.get("cg", 100) + 1):  # noqa: B007 - printed below
        gd = gmul(d)
        dgd = float(d @ gd)
        if not dgd > 0.0:  # a zero gradient, or a state gone non-finite
            break
        alpha = rr / dgd
        x += alpha * d
        res -= alpha * gd
        rr_new = float(res @ res)
        if rr_new <= sr.get("tol", 1e-10) * f2:
            rr = rr_new
            break
        d = res + (rr_new / rr) * d
        rr = rr_new
    tau = sr.get("tau", 0.05)
    change = tau * float(x @ (gmul(x) - shift * x)) ** 0.5  # |delta ln psi| in the w-norm
    if change > sr.get("max_change", 0.1):  # a trust region on the predicted change of psi
        tau *= sr.get("max_change", 0.1) / change
    if sr.get("verbose"):
        print(f"    {which}: CG {taken}, |F| {f2**0.5:.3e}, change {change:.3e}, tau {tau:.3e}")
    with torch.no_grad():
        at = 0
        for p in params:
            k = p.numel()
            p -= tau * x[at : at + k].view_as(p).to(p.dtype)
            at += k


def run_variant(mol, configs, h, c, e_s, name, objective, kw, args, device, oracle="", batch=None):
    kw = dict(kw)
    sr = kw.pop("sr", None)
    ansatz = Ansatz.for_molecule(mol, seed=args.seed, device=device, **kw)
    # an oracle replaces one part of ln psi by the target's: the signs of c (the network learns
    # only |psi|) or ln|c| (it learns only the phase)
    dt = ansatz.dtype
    exact_phase = torch.as_tensor(np.where(c < 0, np.pi, 0.0), dtype=dt, device=device)
    with np.errstate(divide="ignore"):
        exact_amp = torch.as_tensor(np.log(np.abs(c)), dtype=dt, device=device)
    adam_params = ansatz.parameters()
    sr_params = []
    if sr is not None:  # natural gradient for sr["blocks"] from step sr["after"], else AdamW
        blocks = sr.get("blocks", ["amp", "phase"])
        sr_params = [
            p
            for n, p in ansatz.named_parameters()
            if ("phase" if n.startswith("phase_net") else "amp") in blocks
        ]
        if not sr.get("after", 0):
            adam_params = [p for p in ansatz.parameters() if all(p is not q for q in sr_params)]
    adam_params = list(adam_params)
    opt = None
    if adam_params:
        opt = torch.optim.AdamW(
            adam_params, lr=args.lr, betas=(0.9, 0.99), weight_decay=0.0, eps=1e-9
        )
    x = torch.from_numpy(configs.view(np.int64)).to(device)
    tokens = ansatz.tokens(x)
    c_t = torch.as_tensor(c, dtype=torch.float64, device=device)
    rows, t0 = [], time.perf_counter()
    marks = {0, 50, 100, 200, 500} | {1000 * 2**k for k in range(8)}
    marks |= set(range(0, args.steps + 1, args.every or args.steps + 1))
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
        w = psi.abs() ** 2 / norm  # the network's weights on S
        if objective == "energy+teacher":
            local = torch.where(psi != 0, hpsi / psi, 0.0)  # psi = 0 only where c = 0 is given
            coef = w * (local - e) + args.teacher * teacher_coefficients(psi, c_t)
        else:
            coef = teacher_coefficients(psi, c_t)
        if opt is not None:
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
        if opt is not None and loss.requires_grad:
            loss.backward()
        if sr is not None and step >= sr.get("after", 0):
            # the gradient is 2 Re sum conj(O_x) T_x: Re T for ln|psi|, Im T
            # for the phase; natural_step takes F = half of it
            for p in sr_params:
                p.grad = None  # AdamW skips them
            for which in blocks:
                if oracle == {"amp": "amplitude", "phase": "sign"}[which]:
                    continue
                r = (coef.real if which == "amp" else coef.imag).to(torch.float64)
                metric = {"p": w, "q": c_t**2, "mix": 0.5 * (w + c_t**2)}[sr.get("metric", "p")]
                natural_step(ansatz, tokens, metric, r, which, sr)
        if opt is not None:
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
    ap.add_argument("--every", type=int, default=0, help="also a row every this many steps")
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
