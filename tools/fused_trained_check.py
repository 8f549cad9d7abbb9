"""Accuracy of the fused ln|psi| on trained N2/STO-3G weights, with what explains it.

Trains N2/STO-3G for a few iterations per seed (float32 with the fused path, as the GPU test
does, and float64 without it, whose weights rounded to float32 are reproducible), then over
the whole (7, 7) sector prints, per run: the largest |d ln|psi|| against the float64 module
(weights promoted exactly) of the fused path in each precision (and of another version of
fast_infer.py given with --fast), of the module's own float32 pass, and of the float32 phase;
the same over the relevant configurations (ln|psi| within 20 of the largest); the worst
configuration's ln|psi| and the module's error there; the largest logit, residual activation
and smallest picked log-probability. --save writes each run's weights (state_dict) to a folder;
--k-chunks adds the tf32x3 path with other k_chunk values (0: each product summed whole on the
tensor cores).

    python tools/fused_trained_check.py --seeds 0 1 2 --iterations 30 [--dtypes float32 float64]
        [--fast other/fast_infer.py] [--k-chunks 0 32] [--save DIR]
    TRITON_INTERPRET=1 python tools/fused_trained_check.py --device cpu --load DIR/*.pt
"""

from __future__ import annotations

import argparse
import copy
import functools
import importlib.util
import pathlib
import time

import torch

from cuscikit import Ansatz, Molecule, Runner
from cuscikit.nnqs.fast_infer import FusedInference
from cuscikit.sci.configs import all_determinants


def _stats(a64, tokens):
    """Largest |logit|, largest |residual activation|, smallest picked log p (float64)."""
    n = tokens.shape[0]
    start = torch.full((n, 1), 4, dtype=torch.long, device=tokens.device)
    inp = torch.cat((start, tokens[:, :-1]), 1)
    h = a64.token_embedding(inp) + a64.position_embedding(torch.arange(inp.shape[1]).to(inp))
    hmax = float(h.abs().max())
    for block in a64.blocks:
        h = block(h)
        hmax = max(hmax, float(h.abs().max()))
    logits = a64.head(a64.ln_f(h)) + a64.logit_bias[: inp.shape[1]]
    lp = a64.log_conditionals(tokens).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    return float(logits.abs().max()), hmax, float(lp.min())


def _check(label, a, x, fast_classes):
    a = a.float()
    a64 = copy.deepcopy(a).double()
    with torch.no_grad():
        t32, t64 = a.tokens(x), a64.tokens(x)
        m64 = a64.log_amplitude(t64)
        m32 = a.log_amplitude(t32).double()
        ph64, ph32 = a64.phase(t64), a.phase(t32).double()
        keys = a.config_words(x)
        rel = m64 > m64.max() - 20
        own = (m32 - m64).abs()
        rows = []
        for name, cls, prec in fast_classes:
            amp = cls(a, precision=prec).amplitude(keys).double()
            e = (amp - m64).abs()
            i = int(e.argmax())
            rows.append(
                f"  {name:<22} {float(e.max()):.2e}  relevant {float(e[rel].max()):.2e}  "
                f"worst at ln|psi| {float(m64[i]):8.3f} (module there {float(own[i]):.1e})"
            )
        lmax, hmax, lpmin = _stats(a64, t64)
    print(
        f"{label}: {len(x)} configurations, ln|psi| {float(m64.min()):.2f}..{float(m64.max()):.3f}"
        f" ({int(rel.sum())} within 20 of the largest); |logit| <= {lmax:.1f}, |h| <= {hmax:.1f},"
        f" picked log p >= {lpmin:.1f}"
    )
    j = int(own.argmax())
    ph_err = float((ph32 - ph64).abs().max())
    print(
        f"  module float32         {float(own.max()):.2e}  relevant {float(own[rel].max()):.2e}"
        f"  worst at ln|psi| {float(m64[j]):8.3f}; phase float32 {ph_err:.2e}"
        f" (|phase| <= {float(ph64.abs().max()):.1f})"
    )
    print("\n".join(rows), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--iterations", type=int, default=30)
    ap.add_argument("--dtypes", nargs="+", default=["float32"], choices=["float32", "float64"])
    ap.add_argument("--fast", default=None, help="another fast_infer.py to check beside")
    ap.add_argument("--k-chunks", type=int, nargs="*", default=[], help="more tf32x3 k_chunks")
    ap.add_argument("--save", default=None, help="folder for the trained weights")
    ap.add_argument("--load", nargs="*", default=[], help="check saved weights instead")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--configs", type=int, default=0, help="every k-th configuration only")
    args = ap.parse_args()
    mol = Molecule.load("N2")
    x = all_determinants(mol.norb, mol.nelec)
    if args.configs:
        x = x[:: args.configs]
    fast = [
        ("fused fp64", FusedInference, "fp64"),
        ("fused tf32x3", FusedInference, "tf32x3"),
        ("fused ieee", FusedInference, "ieee"),
    ]
    for kc in args.k_chunks:
        fast.append(
            (f"fused tf32x3 k_chunk {kc}", functools.partial(FusedInference, k_chunk=kc), "tf32x3")
        )
    if args.fast:
        spec = importlib.util.spec_from_file_location("other_fast_infer", args.fast)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        fast.append((f"{pathlib.Path(args.fast).name} tf32x3", mod.FusedInference, "tf32x3"))
    save = pathlib.Path(args.save) if args.save else None
    if save:
        save.mkdir(parents=True, exist_ok=True)
    for path in args.load:
        a = Ansatz.for_molecule(mol, seed=0, device=args.device)
        a.load_state_dict(torch.load(path, map_location=args.device))
        _check(path, a, x, fast)
    for seed in [] if args.load else args.seeds:
        for dtype in [getattr(torch, name) for name in args.dtypes]:
            t0 = time.perf_counter()
            a = Ansatz.for_molecule(mol, seed=seed, dtype=dtype, device=args.device)
            r = Runner(
                mol,
                a,
                topk=64,
                seed=seed,
                fused_inference=dtype == torch.float32 and args.device == "cuda",
                teacher=0,  # the plain method: the trajectories measured in the docs
            )
            e = r.run(args.iterations, progress=False).history["e_coupled"].to_numpy()
            done, e = len(e), e[-1]  # fewer than asked when a signal stopped the run
            name = f"seed {seed} {str(dtype)[6:]} training"
            print(f"{name}: {done} iterations, E {e:.10f}, {time.perf_counter() - t0:.1f} s")
            if save:
                torch.save(a.state_dict(), save / f"n2_seed{seed}_{str(dtype)[6:]}.pt")
            _check(name, a, x, fast)


if __name__ == "__main__":
    main()
