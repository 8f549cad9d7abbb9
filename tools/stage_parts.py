"""The recorded optimiser stage taken apart: how long its passes take with parts of the work
left out, each variant recorded as a CUDA graph of the same number of passes and replayed.

`tools/profile_training_pass.py` sums kernel times per part of a pass; this tool measures wall
time, which is what the recorded stage waits for: the pass's own chain of kernels plus
whatever of the side streams' work (parameter gradients, the phase MLP) it cannot hide. After
a default N2/STO-3G run of ``--iterations`` (the teacher's 16 inner steps still on, so a stage
is 17 passes over S), one more iteration keeps the stage's inputs, and each variant below
replays ``passes`` times over the stage's padded S:

- ``stage``: the stage as the Runner recorded it (local energies, the loss's gradient, AdamW);
- ``forward``: the forward passes alone (ln|psi| and the phase, gradient recorded);
- ``forward amplitude`` / ``forward phase``: one of the two parts;
- ``forward+backward``: every parameter's gradient (no local energies, no AdamW);
- ``... phase frozen``: no gradient of the phase MLP's parameters (its forward still runs);
- ``... chain only``: only the embeddings' gradients, the phase frozen: the backward's chain of
  input gradients without the weight gradients of the linear layers;
- ``... one stream``: every parameter's gradient with `cuscikit.nnqs.aside` off;
- ``local energies``: the stage's `local_energy.terms` calls alone;
- ``AdamW``: the stage's flat AdamW steps alone (the gradients' concatenation included).

The replays of ``stage`` and ``AdamW`` change the weights (after the run: nothing is reported
from them but their time).

    python tools/stage_parts.py [--iterations 40] [--float64] [--reps 20] [--json-out F]
        [--products default|tc|tc-apart|torch]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

from cuscikit import Ansatz, Molecule, Runner
from cuscikit.nnqs import aside, graphs, local_energy, products
from cuscikit.nnqs.ansatz import reuse_token_work
from cuscikit.nnqs.runner import LearningRateDecay

DEV = torch.device("cuda")


def wall_ms(graph, reps: int) -> float:
    """Median wall milliseconds of one replay over ``reps`` replays (after two warm ones)."""
    for _ in range(2):
        graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        graph.replay()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return float(np.median(times) * 1e3)


def kept_stage_inputs(runner):
    """One more iteration of ``runner`` with its recorded stage's arguments kept."""
    stage = runner._graph_stage
    seen = {}
    run_stage = stage.run

    def keep(*a, **kw):
        seen["a"], seen["kw"] = a, kw
        return run_stage(*a, **kw)

    stage.run = keep
    try:
        runner.step()
    finally:
        stage.run = run_stage
    if "a" not in seen:
        raise SystemExit("the iteration did not take the recorded stage")
    return stage, seen["a"], seen["kw"]


class Frozen:
    """Within: the parameters of ``ansatz`` for which ``keep(name)`` is False do not require
    a gradient (restored on exit)."""

    def __init__(self, ansatz, keep) -> None:
        self.params = [p for n, p in ansatz.named_parameters() if not keep(n)]

    def __enter__(self):
        for p in self.params:
            p.requires_grad_(False)

    def __exit__(self, *exc):
        for p in self.params:
            p.requires_grad_(True)  # all of them did: the recorded stage requires it


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--system", default="N2")
    ap.add_argument("--iterations", type=int, default=40)
    ap.add_argument("--float64", action="store_true")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--json-out", default=None)
    ap.add_argument(
        "--products",
        choices=["default", "tc", "tc-apart", "torch"],
        default="default",
        help="the linear layers' float32 products: the package's default, the tensor-core "
        "kernel (cuscikit.nnqs.products) for every layer (no MAX_WIDTH), the same with each "
        "MLP's GELUs apart, or cuBLAS's",
    )
    args = ap.parse_args()
    if args.products != "default":
        products.ENABLED = args.products.startswith("tc")
        products.FUSED_MLP = args.products == "tc"
        products.MAX_WIDTH = None
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU")
    dtype = torch.float64 if args.float64 else torch.float32
    mol = Molecule.load(args.system)
    ansatz = Ansatz.for_molecule(mol, seed=0, dtype=dtype, device="cuda")
    runner = Runner(mol, ansatz, seed=0, verbose=0)
    t0 = time.perf_counter()
    runner.run(args.iterations, [LearningRateDecay.over_tail(2000)], progress=False)
    torch.cuda.synchronize()
    print(f"# {args.iterations} iterations in {time.perf_counter() - t0:.1f} s", flush=True)
    stage, a, kw = kept_stage_inputs(runner)
    passes = 1 + int(a[5])
    b = stage._buf
    tok = b["tok"]
    n = tok.shape[0]
    gen = torch.Generator(device=DEV).manual_seed(1)
    g = 1e-3 * torch.randn((2, n), generator=gen, device=DEV, dtype=dtype)
    phase_names = {n for n, _ in ansatz.named_parameters() if n.startswith("phase_net.")}
    embed_names = {"token_embedding.weight", "position_embedding.weight"}

    def passes_of(part: str, backward: bool):
        def fn():
            with aside.gradients_aside(DEV), reuse_token_work():
                for _ in range(passes):
                    with torch.enable_grad():
                        if part == "both":
                            outs = ansatz._log_psi_parts(tok)
                        elif part == "amplitude":
                            outs = (ansatz.log_amplitude(tok),)
                        else:
                            outs = (ansatz.phase(tok),)
                        if backward:
                            wanted = [p for p in ansatz.parameters() if p.requires_grad]
                            used = [o for o in outs if o.requires_grad]
                            torch.autograd.grad(used, wanted, [g[i] for i in range(len(used))])
                    aside.join(DEV)

        return fn

    def le_only():
        with torch.no_grad():
            amp, ph = ansatz._log_psi_parts(tok)
        lp = (amp, ph)
        rowptr = b["rowptr"] if stage._key.csr else None
        pairs = (b["src"], b["dst"], b["val"])
        teach = (b["tw"], b["tc"]) if stage._key.teacher else None
        out = torch.empty((2, n), dtype=dtype, device=DEV)

        def fn():
            for _ in range(passes):
                local_energy.terms(lp, b["mask"], b["hd"], pairs, rowptr, teach, out)

        return fn

    def adamw_only():
        grads = [1e-3 * torch.ones_like(p) for p in stage.params]

        def fn():
            with torch.no_grad():
                sc = stage._scalars()
                for k in range(passes):
                    stage._adamw(grads, k, sc)

        return fn

    def rec(fn):
        return graphs.record(fn, DEV)[0]

    variants = []  # (label, make the graph)
    variants.append(("stage (as recorded: local energies, AdamW)", lambda: stage._graph))
    variants.append(("forward", lambda: rec(passes_of("both", False))))
    variants.append(("forward amplitude", lambda: rec(passes_of("amplitude", False))))
    variants.append(("forward phase", lambda: rec(passes_of("phase", False))))
    variants.append(("forward+backward", lambda: rec(passes_of("both", True))))

    def frozen(keep):
        def make():
            with Frozen(ansatz, keep):
                return rec(passes_of("both", True))

        return make

    variants.append(("forward+backward, phase frozen", frozen(lambda m: m not in phase_names)))
    variants.append(("forward+backward, chain only", frozen(lambda m: m in embed_names)))

    def one_stream():
        saved = aside.ENABLED, aside.PHASE
        aside.ENABLED = aside.PHASE = False
        try:
            return rec(passes_of("both", True))
        finally:
            aside.ENABLED, aside.PHASE = saved

    variants.append(("forward+backward, one stream", one_stream))
    variants.append(("local energies", lambda: rec(le_only())))
    variants.append(("AdamW (concatenation included)", lambda: rec(adamw_only())))

    rows = []
    print(
        f"# {args.system}, {dtype}, {n} padded rows, {passes} passes a replay, "
        f"tensor-core products {'on' if products.ENABLED else 'off'} "
        f"(layers up to {products.MAX_WIDTH or 'any'} wide)"
    )
    print("| variant | ms a replay | ms a pass |\n| --- | --- | --- |", flush=True)
    for label, make in variants:
        try:
            ms = wall_ms(make(), args.reps)
        except Exception as exc:  # noqa: BLE001 - a variant that cannot be recorded is a row
            print(f"| {label} | failed: {type(exc).__name__}: {exc} | |", flush=True)
            continue
        rows.append({"variant": label, "ms_replay": ms, "ms_pass": ms / passes})
        print(f"| {label} | {ms:.2f} | {ms / passes:.3f} |", flush=True)
    if args.json_out:
        meta = {
            "system": args.system,
            "dtype": str(dtype),
            "rows": n,
            "passes": passes,
            "gpu": torch.cuda.get_device_name(),
            "torch": torch.__version__,
            "products": products.ENABLED,
            "products_max_width": products.MAX_WIDTH,
        }
        with open(args.json_out, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
