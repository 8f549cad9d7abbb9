"""Execute a notebook outside Jupyter (nbclient, the python3 kernel) and keep what it showed:
the executed notebook, its figures as PNG files and its text outputs, for machines with no
Jupyter server (a GPU machine reached by a batch command).

    python tools/execute_notebook.py notebooks/06_multi_gpu_notebook.ipynb out/06.ipynb \\
        --png-dir out --timeout 300

The notebook runs in its own folder; the exit status is non-zero when a cell fails (the
notebook is written all the same, with the error in it).
"""

from __future__ import annotations

import argparse
import base64
import sys
import time
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("notebook", type=Path)
    ap.add_argument("out", type=Path, help="the executed notebook")
    ap.add_argument("--png-dir", type=Path, help="write each figure here as <stem>-<cell>.png")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per cell")
    args = ap.parse_args()
    import nbclient
    import nbformat

    nb = nbformat.read(args.notebook, as_version=4)
    client = nbclient.NotebookClient(
        nb,
        timeout=args.timeout,
        kernel_name="python3",
        resources={"metadata": {"path": str(args.notebook.resolve().parent)}},
    )
    t0, failed = time.perf_counter(), None
    try:
        client.execute()
    except nbclient.exceptions.CellExecutionError as exc:
        failed = exc
    args.out.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, args.out)
    for k, cell in enumerate(nb.cells):
        for j, out in enumerate(cell.get("outputs", [])):
            data = out.get("data", {})
            if args.png_dir and "image/png" in data:
                png = args.png_dir / f"{args.notebook.stem}-{k}-{j}.png"
                png.write_bytes(base64.b64decode(data["image/png"]))
            text = out.get("text") or data.get("text/plain")
            if text:
                print(f"[{k}] {text}".rstrip())
    print(f"{args.notebook.name}: executed in {time.perf_counter() - t0:.0f} s")
    if failed is not None:
        print(failed, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
