#!/usr/bin/env python3
"""Draws one training iteration of a `p2ptrain train --timeline` trace as an SVG: for every rank,
one lane per thread of the trace (the replica's step phases, the device's layer spans, the
gradient buckets' all-reduces), each rank on its own clock from the start of that iteration's
forward pass, so the overlap of the backward pass and the all-reduces can be seen at a glance.

    python3 scripts/timeline_svg.py TRACE.json OUT.svg [--iter 8] [--width 1400]

Colours: forward spans blue, backward spans orange, communication (all-reduce, buckets) green,
data wait grey, update purple. Needs only the Python standard library.
"""

import argparse
import html
import json
import sys

COLOURS = {"forward": "#4e79a7", "backward": "#f28e2b", "comm": "#59a14f",
           "data wait": "#bab0ac", "update": "#b07aa1", "other": "#76b7b2"}


def colour(event: dict) -> str:
    name, cat = event["name"], event.get("cat", "")
    if cat == "comm" or "all-reduce" in name or "bucket" in name:
        return COLOURS["comm"]
    for key in ("forward", "backward", "data wait", "update"):
        if name.startswith(key):
            return COLOURS[key]
    return COLOURS["other"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace")
    ap.add_argument("out")
    ap.add_argument("--iter", type=int, default=8, help="the iteration to draw")
    ap.add_argument("--width", type=int, default=1400)
    args = ap.parse_args()
    doc = json.load(open(args.trace))
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    names = {(e["pid"], e.get("tid")): e["args"]["name"] for e in events
             if e.get("ph") == "M" and e["name"] == "thread_name"}
    spans = [e for e in events if e.get("ph") == "X"]
    # Each rank's window: from its forward of iteration N to its next forward (or the trace's end).
    windows = {}
    for pid in sorted({e["pid"] for e in spans}):
        forwards = sorted(e["ts"] for e in spans if e["pid"] == pid and e["name"] == "forward"
                          and e.get("args", {}).get("iter") in (args.iter, args.iter + 1))
        if not forwards:
            print(f"timeline_svg.py: rank {pid} has no forward of iteration {args.iter}", file=sys.stderr)
            return 1
        end = forwards[1] if len(forwards) > 1 else max(e["ts"] + e["dur"] for e in spans if e["pid"] == pid)
        windows[pid] = (forwards[0], end)
    longest = max(b - a for a, b in windows.values())
    lanes = sorted({(e["pid"], e.get("tid", 0)) for e in spans
                    if windows[e["pid"]][0] <= e["ts"] < windows[e["pid"]][1]})
    left, lane_h, top = 190, 22, 40
    scale = (args.width - left - 20) / longest
    height = top + lane_h * len(lanes) + 40
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{args.width}" height="{height}" '
           'font-family="sans-serif" font-size="11">',
           f'<text x="10" y="20" font-size="13">iteration {args.iter}: {len(windows)} rank(s), '
           f'{longest / 1000:.1f} ms (longest rank window); each rank from its own forward start</text>']
    for row, (pid, tid) in enumerate(lanes):
        y = top + row * lane_h
        label = html.escape(f"rank {pid}: {names.get((pid, tid), f'thread {tid}')}")
        out.append(f'<text x="10" y="{y + 15}">{label}</text>')
        start, end = windows[pid]
        for e in spans:
            if e["pid"] != pid or e.get("tid", 0) != tid or not start <= e["ts"] < end:
                continue
            x = left + (e["ts"] - start) * scale
            w = max(e["dur"] * scale, 0.5)
            title = html.escape(f'{e["name"]}: {e["dur"] / 1000:.3f} ms')
            out.append(f'<rect x="{x:.1f}" y="{y + 3}" width="{w:.1f}" height="{lane_h - 6}" '
                       f'fill="{colour(e)}"><title>{title}</title></rect>')
    for ms in range(0, int(longest / 1000) + 1, 5):
        x = left + ms * 1000 * scale
        out.append(f'<line x1="{x:.1f}" y1="{top - 4}" x2="{x:.1f}" y2="{height - 30}" stroke="#ddd"/>'
                   f'<text x="{x:.1f}" y="{height - 15}" text-anchor="middle">{ms} ms</text>')
    out.append("</svg>")
    open(args.out, "w").write("\n".join(out) + "\n")
    print(f"wrote {args.out}: {len(lanes)} lanes, {longest / 1000:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
