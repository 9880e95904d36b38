#!/usr/bin/env python3
"""PyTorch DDP yardstick for p2ptrain's GPU benchmarks, on the same machine in the same call.

Workload `mlp4096`: MLP 784-4096-4096-4096-10 with ReLU, softmax cross-entropy, SGD momentum 0.9,
synthetic data already on the GPU (PyTorch's best case: no data loading at all), `--batch` per GPU.
One process per GPU through DDP (default bucket size); with a single process it runs the plain
model, without the DDP wrapper, to be fair to PyTorch.

    python3 scripts/pytorch_ddp.py --batch 512 --math fp32                       # 1 GPU
    python3 -m torch.distributed.run --nproc_per_node=2 scripts/pytorch_ddp.py --batch 512 --math tf32

Prints one JSON line on rank 0: {"framework", "workload", "gpus", "batch_per_gpu", "math",
"samples_per_sec", "step_ms"}, timed with CUDA synchronisation after `--warmup` untimed steps.
"""
import argparse
import json
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", default="mlp4096", choices=["mlp4096"])
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--math", default="fp32", choices=["fp32", "tf32"])
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--iters", type=int, default=100)
    args = ap.parse_args()

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    if world > 1:
        dist.init_process_group("nccl")
    tf32 = args.math == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32

    torch.manual_seed(1)
    model = nn.Sequential(
        nn.Linear(784, 4096), nn.ReLU(),
        nn.Linear(4096, 4096), nn.ReLU(),
        nn.Linear(4096, 4096), nn.ReLU(),
        nn.Linear(4096, 10),
    ).cuda()
    if world > 1:
        model = nn.parallel.DistributedDataParallel(model, device_ids=[local])
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    x = torch.rand(args.batch, 784, device="cuda")
    y = torch.randint(0, 10, (args.batch,), device="cuda")

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        opt.step()

    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    if world > 1:
        dist.barrier()
    t = time.perf_counter()
    for _ in range(args.iters):
        step()
    torch.cuda.synchronize()
    seconds = time.perf_counter() - t
    if rank == 0:
        print(json.dumps({
            "framework": f"pytorch {torch.__version__} " + ("DDP" if world > 1 else "single GPU"),
            "workload": args.workload, "gpus": world, "batch_per_gpu": args.batch, "math": args.math,
            "samples_per_sec": round(args.iters * args.batch * world / seconds, 1),
            "step_ms": round(1e3 * seconds / args.iters, 3),
        }), flush=True)
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
