#!/usr/bin/env python3
"""How much the transfers of a gradient all-reduce slow the GEMMs they overlap, with PyTorch.

Per GPU, one stream runs mlp4096's backward GEMMs in TF32 (three times dW = dYᵀ·X and dX = dY·W,
4096 wide, batch 512) while another moves the traffic of its bf16 gradient's all-reduce
(36.8 M elements, 74 MB):

  copies  one process, every GPU: peer copies of a reduce-scatter and an all-gather (slice j to GPU
          j, twice), which the copy engines run ("one copy stream" and "one stream per peer");
  nccl    under torch.distributed.run, one process a GPU: NCCL's all-reduce of the gradient.

Each mode times the GEMMs alone, the transfers alone and both together (CUDA events, mean of 50
repetitions, the slowest GPU), twice.

  python3 scripts/gpu/overlap_probe.py copies
  python3 -m torch.distributed.run --nproc_per_node=N scripts/gpu/overlap_probe.py nccl
"""
import sys

import torch

GRAD = 36_800_000  # bfloat16 elements of mlp4096's gradient
REPS = 50


def gemms(a, w, g, stream):
    with torch.cuda.stream(stream):
        for _ in range(3):
            torch.mm(g.t(), a)
            torch.mm(g, w)


def operands(device):
    return (torch.randn(512, 4096, device=device), torch.randn(4096, 4096, device=device),
            torch.randn(512, 4096, device=device))


def copies_mode():
    n = torch.cuda.device_count()
    devs = list(range(n))
    piece = GRAD // n
    for a in devs:
        for b in devs:
            if a != b and not torch.cuda.can_device_access_peer(a, b):
                print(f"GPU {a} cannot access GPU {b}: peer copies would go through the host")
    ops = {d: operands(d) for d in devs}
    src = {d: torch.zeros(GRAD, dtype=torch.bfloat16, device=d) for d in devs}
    inbox = {d: torch.zeros(n, piece, dtype=torch.bfloat16, device=d) for d in devs}
    compute = {d: torch.cuda.Stream(device=d) for d in devs}
    copy = {d: torch.cuda.Stream(device=d) for d in devs}
    lanes = {d: {j: torch.cuda.Stream(device=d) for j in devs} for d in devs}

    def transfers(d, per_peer):
        for _ in range(2):  # the reduce-scatter's slices, then the all-gather's
            fork = torch.cuda.Event()
            fork.record(copy[d])
            for j in devs:
                if j == d:
                    continue
                lane = lanes[d][j] if per_peer else copy[d]
                lane.wait_event(fork)
                with torch.cuda.stream(lane):
                    inbox[j][d].copy_(src[d][j * piece:(j + 1) * piece], non_blocking=True)
                if per_peer:
                    join = torch.cuda.Event()
                    join.record(lane)
                    copy[d].wait_event(join)

    def timed(label, with_gemms, with_copies, per_peer, reps=REPS):
        for d in devs:
            torch.cuda.synchronize(d)
        events = {}
        for d in devs:
            with torch.cuda.device(d):
                ev = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
                ev[0].record(compute[d])
                ev[2].record(copy[d])
                for _ in range(reps):
                    if with_gemms:
                        gemms(*ops[d], compute[d])
                    if with_copies:
                        transfers(d, per_peer)
                ev[1].record(compute[d])
                ev[3].record(copy[d])
                events[d] = ev
        for d in devs:
            torch.cuda.synchronize(d)
        g = max(events[d][0].elapsed_time(events[d][1]) / reps for d in devs)
        c = max(events[d][2].elapsed_time(events[d][3]) / reps for d in devs)
        out = 2 * (n - 1) * piece * 2
        rate = f", {out / c / 1e6:.0f} GB/s out per GPU" if with_copies else ""
        print(f"copies, {label}: GEMM stream {g:.3f} ms, copy stream {c:.3f} ms{rate}")

    for per_peer in (False, True):
        print("one stream per peer" if per_peer else "one copy stream")
        for _ in range(2):
            timed("warm-up", True, True, per_peer, 10)
            timed("GEMMs alone", True, False, per_peer)
            timed("copies alone", False, True, per_peer)
            timed("both", True, True, per_peer)


def nccl_mode():
    import torch.distributed as dist
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    torch.cuda.set_device(rank)
    grad = torch.zeros(GRAD, dtype=torch.bfloat16, device=rank)
    a, w, g = operands(rank)
    compute, comm = torch.cuda.Stream(), torch.cuda.Stream()

    def timed(label, with_gemms, with_reduce, reps=REPS):
        torch.cuda.synchronize()
        dist.barrier()
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
        ev[0].record(compute)
        ev[2].record(comm)
        for _ in range(reps):
            if with_gemms:
                gemms(a, w, g, compute)
            if with_reduce:
                with torch.cuda.stream(comm):
                    dist.all_reduce(grad)
        ev[1].record(compute)
        ev[3].record(comm)
        torch.cuda.synchronize()
        t = torch.tensor([ev[0].elapsed_time(ev[1]) / reps, ev[2].elapsed_time(ev[3]) / reps],
                         device=rank)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        if rank == 0:
            print(f"nccl, {label}: GEMM stream {t[0]:.3f} ms, all-reduce stream {t[1]:.3f} ms")

    for _ in range(2):
        timed("warm-up", True, True, 10)
        timed("GEMMs alone", True, False)
        timed("all-reduce alone", False, True)
        timed("both", True, True)
    dist.destroy_process_group()


if __name__ == "__main__":
    torch.backends.cuda.matmul.allow_tf32 = True
    mode = sys.argv[1] if len(sys.argv) > 1 else ""
    if mode not in ("copies", "nccl"):
        sys.exit(__doc__)
    copies_mode() if mode == "copies" else nccl_mode()
