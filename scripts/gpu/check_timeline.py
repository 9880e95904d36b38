#!/usr/bin/env python3
"""Checks a GPU run's `--timeline` file: every replica's compute stream holds each layer's forward
and backward, its communication stream every gradient bucket's all-reduce with its bytes, and
the first bucket of each iteration starts before that iteration's backward has ended (the
all-reduce overlaps backward). Exit 0 when it holds, 1 otherwise (with what is missing).

    check_timeline.py TIMELINE.json --replicas 2 --iters 5 --layers ip1,ip2,ip3 \
        --buckets 3 --bytes-per-float 2
"""
import argparse
import json
import sys
from collections import defaultdict

DEVICE_TID = 1_000_000  # chrome_trace::DEVICE_TID
COMM_TID = 2_000_000  # chrome_trace::COMM_TID


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("timeline")
    ap.add_argument("--replicas", type=int, required=True)
    ap.add_argument("--iters", type=int, required=True, help="the run's --timeline-iters")
    ap.add_argument("--layers", required=True, help="layers with parameters, comma-separated")
    ap.add_argument("--buckets", type=int, required=True, help="buckets per iteration")
    ap.add_argument("--bytes-per-float", type=int, choices=[2, 4], required=True)
    args = ap.parse_args()
    events = json.load(open(args.timeline))["traceEvents"]
    spans = defaultdict(list)  # tid -> [event]
    for e in events:
        if e.get("ph") == "X":
            spans[e["tid"]].append(e)
    problems = []
    for u in range(args.replicas):
        device, comm = spans[DEVICE_TID + u], spans[COMM_TID + u]
        names = defaultdict(int)
        for e in device:
            names[e["name"]] += 1
        for layer in args.layers.split(","):
            for pass_ in ("forward", "backward"):
                if names[f"{pass_} {layer}"] < args.iters:
                    problems.append(f"replica {u}: {names[f'{pass_} {layer}']} '{pass_} {layer}' "
                                    f"spans on the compute stream, want {args.iters}")
        per_bucket = defaultdict(list)
        for e in comm:
            if e["cat"] != "comm" or "bucket" not in e.get("args", {}):
                problems.append(f"replica {u}: unexpected span on the communication stream: {e}")
                continue
            per_bucket[e["args"]["bucket"]].append(e)
        if sorted(per_bucket) != list(range(args.buckets)):
            problems.append(f"replica {u}: buckets {sorted(per_bucket)}, want 0..{args.buckets}")
            continue
        for b, es in per_bucket.items():
            if len(es) != args.iters:
                problems.append(f"replica {u}: bucket {b} all-reduced {len(es)} times, want {args.iters}")
            sizes = {e["args"]["bytes"] for e in es}
            if len(sizes) != 1 or min(sizes) <= 0 or min(sizes) % args.bytes_per_float:
                problems.append(f"replica {u}: bucket {b} bytes {sorted(sizes)}")
        backward = sorted((e for e in device if e["name"] == "backward"), key=lambda e: e["ts"])
        first = sorted(per_bucket[0], key=lambda e: e["ts"])
        for i, (bw, bk) in enumerate(zip(backward, first)):
            if not bk["ts"] < bw["ts"] + bw["dur"]:
                problems.append(f"replica {u}, iteration {i}: bucket 0 starts at {bk['ts']} us, after "
                                f"the backward that ends at {bw['ts'] + bw['dur']} us (no overlap)")
        total = sum(es[0]["args"]["bytes"] for es in per_bucket.values())
        print(f"replica {u}: {len(device)} compute-stream spans, {len(comm)} bucket spans, "
              f"{total} bytes on the wire per iteration")
    for p in problems:
        print(f"FAIL {p}")
    print("OK   GPU timeline: layer and bucket spans" if not problems else "FAIL GPU timeline")
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
