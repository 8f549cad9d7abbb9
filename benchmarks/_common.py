"""Helpers shared by the benchmark scripts: machine description, timing, table printing."""

from __future__ import annotations

import os
import platform
import time

import numpy as np


def machine() -> str:
    cpu = platform.processor() or "cpu"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    gpu = ""
    try:
        import torch

        if torch.cuda.is_available():
            gpu = ", " + torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return f"{cpu} x{os.cpu_count()} cores{gpu}"


def _portable(value):
    """An absolute path relative to the working folder (its last name when outside it)."""
    if not (isinstance(value, str) and os.path.isabs(value)):
        return value
    rel = os.path.relpath(value)
    return os.path.basename(value.rstrip("/")) if rel.startswith("..") else rel


def write_json(path, script: str, anchor: str, args, rows: list[dict], note: str = "") -> None:
    """Write a benchmark's rows as benchmarks/results keeps them: machine, date (UTC), script,
    anchor, the arguments and one dict per table row (`note`: how the machine was loaded).
    Absolute paths among the arguments are kept relative to the working folder, or as their last
    name when outside it, so that no machine's folders end up in the results."""
    import json
    from datetime import datetime, timezone

    doc = {
        "machine": machine() + (f"; {note}" if note else ""),
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
        "script": f"benchmarks/{script}",
        "anchor": anchor,
        "args": {k: _portable(v) for k, v in vars(args).items() if k not in ("json_out", "note")},
        "rows": rows,
    }
    with open(path, "w") as f:
        json.dump(doc, f, indent=1, default=lambda o: o.item() if hasattr(o, "item") else str(o))
        f.write("\n")


def best_time(fn, repeat: int = 3) -> tuple[float, object]:
    """Best wall time of `repeat` calls and the last result."""
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def random_excitations(hf: np.ndarray, norb: int, n: int, max_rank: int, seed: int) -> np.ndarray:
    """n distinct-ish sources: HF with up to `max_rank` random same-spin electron moves each."""
    from cuscikit.sci.configs import from_bits, to_bits

    rng = np.random.default_rng(seed)
    base = to_bits(hf, norb)[0]
    out = np.repeat(base[None], n, axis=0)
    for row in out:
        for _ in range(rng.integers(0, max_rank + 1)):
            spin = rng.integers(2)
            occ = np.flatnonzero(row[spin::2])
            vir = np.flatnonzero(row[spin::2] == 0)
            if len(occ) == 0 or len(vir) == 0:
                continue
            row[2 * rng.choice(occ) + spin] = 0
            row[2 * rng.choice(vir) + spin] = 1
    return from_bits(out)


def print_table(title: str, header: list[str], rows: list[list]) -> None:
    cells = [[str(c) for c in r] for r in rows]
    widths = [max([len(h)] + [len(r[k]) for r in cells]) for k, h in enumerate(header)]
    print(f"\n{title}")
    print("  ".join(h.rjust(w) for h, w in zip(header, widths, strict=True)))
    for r in cells:
        print("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)))


def experiment_parser(doc: str):
    """The arguments of a one-system NNQS settings experiment: SYSTEM ITERS [--ansatz JSON]."""
    import argparse

    ap = argparse.ArgumentParser(
        description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("system")
    ap.add_argument("iters", type=int)
    ap.add_argument("--ansatz", default="{}", help="JSON keyword arguments of the Ansatz")
    return ap


def network_vector(ansatz, configs: np.ndarray, exact: np.ndarray) -> np.ndarray:
    """The network's normalised psi over `configs`, with the global phase that makes it agree
    in sign with the exact vector `exact` on that vector's largest component."""
    import torch

    with torch.no_grad():
        lp = ansatz.log_psi(configs).to(torch.complex128).cpu().numpy()
    psi = np.exp(lp - lp.real.max())
    psi /= np.linalg.norm(psi)
    k = int(np.argmax(np.abs(exact)))
    return psi * np.exp(-1j * np.angle(psi[k])) * np.sign(exact[k])
