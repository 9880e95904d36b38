#!/usr/bin/env python3
"""Checks a GPU run's `--timeline` file: every replica's compute stream holds each layer's forward
and backward, its communication stream every gradient bucket's all-reduce with its bytes, and
the first bucket of each iteration starts before that iteration's backward has ended (the
all-reduce overlaps backward). With --update-parts N (a replica that reduces nothing), its update
stream holds each of the N buckets' updates once an iteration, the first of them starting before
the iteration's backward has ended (the update overlaps backward). Exit 0 when it holds, 1
otherwise (with what is missing).

    check_timeline.py TIMELINE.json --replicas 2 --iters 5 --layers ip1,ip2,ip3 \
        --buckets 3 --bytes-per-float 2
    check_timeline.py TIMELINE.json --replicas 1 --iters 5 --layers ip1,ip2,ip3 \
        --buckets 0 --bytes-per-float 4 --update-parts 3
"""
import argparse
import json
import sys
from collections import defaultdict

DEVICE_TID = 1_000_000  # chrome_trace::DEVICE_TID
COMM_TID = 2_000_000  # chrome_trace::COMM_TID
UPDATE_TID = 3_000_000  # chrome_trace::UPDATE_TID


def overlaps(backward, firsts, what):
    """Problems where the i-th of `firsts` does not start before the i-th backward ends."""
    out = []
    for i, (bw, first) in enumerate(zip(backward, firsts)):
        if not first["ts"] < bw["ts"] + bw["dur"]:
            out.append(f"iteration {i}: {what} starts at {first['ts']} us, after the backward that "
                       f"ends at {bw['ts'] + bw['dur']} us (no overlap)")
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("timeline")
    ap.add_argument("--replicas", type=int, required=True)
    ap.add_argument("--iters", type=int, required=True, help="the run's --timeline-iters")
    ap.add_argument("--layers", required=True, help="layers with parameters, comma-separated")
    ap.add_argument("--buckets", type=int, required=True, help="buckets per iteration")
    ap.add_argument("--bytes-per-float", type=int, choices=[2, 4], required=True)
    ap.add_argument("--update-parts", type=int, default=0,
                    help="buckets updated behind the backward per iteration (a replica alone)")
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
        first = sorted(per_bucket.get(0, []), key=lambda e: e["ts"])
        problems += [f"replica {u}, {p}" for p in overlaps(backward, first, "bucket 0")]
        total = sum(es[0]["args"]["bytes"] for es in per_bucket.values())
        print(f"replica {u}: {len(device)} compute-stream spans, {len(comm)} bucket spans, "
              f"{total} bytes on the wire per iteration")
        updates = defaultdict(list)
        for e in spans[UPDATE_TID + u]:
            updates[e.get("args", {}).get("bucket")].append(e)
        if sorted(updates, key=str) != list(range(args.update_parts)):
            problems.append(f"replica {u}: updates of buckets {sorted(updates, key=str)} on the update "
                            f"stream, want 0..{args.update_parts}")
            continue
        for b, es in updates.items():
            if len(es) != args.iters or any(e["name"] != f"update bucket {b}" for e in es):
                problems.append(f"replica {u}: bucket {b} updated {len(es)} times, want {args.iters}")
        if args.update_parts:
            first = sorted(updates[0], key=lambda e: e["ts"])
            problems += [f"replica {u}, {p}" for p in overlaps(backward, first, "the update of bucket 0")]
            print(f"replica {u}: {sum(map(len, updates.values()))} update spans behind the backward")
    for p in problems:
        print(f"FAIL {p}")
    print("OK   GPU timeline: layer, bucket and update spans" if not problems else "FAIL GPU timeline")
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
