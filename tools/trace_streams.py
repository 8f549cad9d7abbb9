"""Where a recorded stage's GPU time goes, stream by stream, from a Chrome trace of
`benchmarks/small_iteration.py --profile --trace-out DIR` (torch.profiler's export).

    python tools/trace_streams.py DIR/N2_graph_stage_5_passes.json.gz [--bin 250] [--gap 20]
        [--marks _attn_fwd_kernel _attn_bwd_kernel] [--top 15]

Prints the device events per stream (count, summed time, span), the time no kernel ran
between the first and the last event and the longest such gaps with the kernels on either
side, the busy share of every stream per time bin (which streams overlap, where one stream
runs alone), when the kernels named by --marks started (per pass: the attention kernels
mark each block's forward and backward work), and with --top N each stream's N costliest
kernels by summed time. A replayed CUDA graph runs its branches on streams of the driver's
choosing, not the recording's (docs/performance.md, "#row-lanes"). The docs' account of the
recorded stage (docs/performance.md, "The parameter gradients on four streams") was read off
such tables.
"""

from __future__ import annotations

import argparse
import gzip
import json
from collections import defaultdict

DEVICE = ("kernel", "gpu_memcpy", "gpu_memset")


def device_events(path: str) -> list[dict]:
    """The trace's device events (kernels, copies, sets), sorted by start (microseconds)."""
    with gzip.open(path) if path.endswith(".gz") else open(path, "rb") as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    return sorted(
        (e for e in events if e.get("ph") == "X" and e.get("cat") in DEVICE),
        key=lambda e: e["ts"],
    )


def idle_gaps(events: list[dict]) -> list[tuple[float, float, dict, dict]]:
    """(gap, start of the gap, the event that ended last before it, the next event), in
    order: the times no device event ran."""
    gaps = []
    end, last = events[0]["ts"] + events[0]["dur"], events[0]
    for e in events[1:]:
        if e["ts"] > end:
            gaps.append((e["ts"] - end, end, last, e))
        if e["ts"] + e["dur"] > end:
            end, last = e["ts"] + e["dur"], e
    return gaps


def occupancy(events: list[dict], width: float) -> tuple[list, dict]:
    """(streams, {stream: busy fraction per bin of `width` microseconds})."""
    t0 = events[0]["ts"]
    t1 = max(e["ts"] + e["dur"] for e in events)
    bins = int((t1 - t0) // width) + 1
    streams = sorted({e["tid"] for e in events}, key=str)
    busy = {s: [0.0] * bins for s in streams}
    for e in events:
        a, b = e["ts"] - t0, e["ts"] - t0 + e["dur"]
        i = int(a // width)
        while a < b and i < bins:
            c = min(b, (i + 1) * width)
            busy[e["tid"]][i] += (c - a) / width
            a, i = c, i + 1
    return streams, busy


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--bin", type=float, default=250.0, help="microseconds per time bin")
    ap.add_argument("--gap", type=float, default=20.0, help="list idle gaps above this (us)")
    ap.add_argument("--marks", nargs="*", default=["_attn_fwd_kernel", "_attn_bwd_kernel"])
    ap.add_argument("--top", type=int, default=0, help="each stream's N costliest kernels")
    args = ap.parse_args()
    events = device_events(args.trace)
    if not events:
        raise SystemExit(f"{args.trace}: no device events")
    t0 = events[0]["ts"]
    span = max(e["ts"] + e["dur"] for e in events) - t0
    by = defaultdict(list)
    for e in events:
        by[e["tid"]].append(e)
    print(f"{args.trace}: {len(events)} device events over {span:.0f} us")
    print("stream      events   busy us   span us")
    for s, es in sorted(by.items(), key=lambda kv: -len(kv[1])):
        first, last = es[0]["ts"], max(e["ts"] + e["dur"] for e in es)
        busy = sum(e["dur"] for e in es)
        print(f"{s!s:>10} {len(es):8d} {busy:9.0f} {last - first:9.0f}")
    if args.top:
        for s, es in sorted(by.items(), key=lambda kv: -sum(e["dur"] for e in kv[1])):
            cost, count = defaultdict(float), defaultdict(int)
            for e in es:
                cost[e["name"]] += e["dur"]
                count[e["name"]] += 1
            print(f"stream {s}: costliest kernels (summed us, count, mean us, name)")
            for name, us in sorted(cost.items(), key=lambda kv: -kv[1])[: args.top]:
                n = count[name]
                print(f"  {us:9.0f} {n:6d} {us / n:7.1f}  {name[:90]}")
    gaps = idle_gaps(events)
    print(f"no kernel running: {sum(g for g, *_ in gaps):.0f} us in {len(gaps)} gaps")
    for g, at, a, b in gaps:
        if g > args.gap:
            print(f"  at {at - t0:8.0f} us: {g:6.1f} us after {a['name'][:45]} -> {b['name'][:45]}")
    streams, busy = occupancy(events, args.bin)
    print(f"busy % per {args.bin:g} us")
    print("   from us " + " ".join(f"{s!s:>7}" for s in streams))
    for i in range(len(busy[streams[0]])):
        cells = " ".join(f"{100 * busy[s][i]:7.0f}" for s in streams)
        print(f"{i * args.bin:10.0f} {cells}")
    if args.marks:
        print("marks (start us, stream, kernel)")
        for e in events:
            if e["name"] in args.marks:
                print(f"{e['ts'] - t0:10.0f} {e['tid']!s:>7} {e['name']}")


if __name__ == "__main__":
    main()
