#!/usr/bin/env python3
"""PyTorch DDP yardstick for p2ptrain's GPU figures: the same workload, trained the idiomatic PyTorch
way, timed the same way, so that `p2ptrain bench` numbers have a reference beside them.

Workloads, each the same net as the p2ptrain config of the same name, with softmax cross-entropy,
SGD with momentum 0.9 (lr 0.01), `--batch` samples per GPU of synthetic data of the config's input
shape generated once on the GPU (so that no input pipeline is measured), FP32 weights and
gradients; `--math tf32` lets matrix products and convolutions use TF32 tensor cores:

- `mlp4096` (config/mlp4096.toml): an MLP 784-4096-4096-4096-10 with ReLU.
- `lenet` (config/lenet.toml): Caffe's LeNet on 1x28x28 input.
- `cifar10_quick` (config/cifar10_quick.toml): Caffe's cifar10_quick on 3x32x32 input.
- `resnet50` (config/resnet50.toml): ResNet-50 v1 (bottleneck, stride on the 1x1 of each stage's
  first block as in Caffe's ResNet-50) on 3x224x224 input, 1000 classes. BatchNorm with its affine
  part stands for p2ptrain's BatchNorm + Scale pair.

How to run (one process per GPU; nothing beyond PyTorch is needed, no network):

    python3 scripts/pytorch_ddp.py --batch 512 --math fp32                  # 1 GPU, no DDP wrapper
    torchrun --nproc_per_node=2 scripts/pytorch_ddp.py --batch 512 --math tf32
    python3 -m torch.distributed.run --nproc_per_node=2 scripts/pytorch_ddp.py --batch 512

What it measures: `--warmup` untimed steps, then `--iters` timed steps between two
`torch.cuda.synchronize()` calls (all ranks start together after a barrier); a step is forward,
loss, zero_grad, backward (with DDP's bucketed gradient all-reduce, default 25 MiB buckets,
overlapped with backward) and the optimizer update. The time is the slowest rank's. cuDNN picks
its convolution algorithms by its heuristics (PyTorch's default) unless `--cudnn-benchmark` has
them timed per shape in the warm-up steps. `--amp` runs the forward pass and the loss under
`torch.autocast` in bfloat16 (weights, gradients and the update stay FP32), PyTorch's usual mixed
precision on Hopper; with `--channels-last` it is the fastest idiomatic PyTorch. With one process the model is not wrapped in DDP at
all, so the 1-GPU figure is plain PyTorch, not DDP's overhead.

Output: one JSON line on rank 0, e.g.
    {"framework": "pytorch 2.11.0+cu130 DDP", "workload": "mlp4096", "gpus": 2, "batch_per_gpu": 512,
     "global_batch": 1024, "math": "fp32", "samples_per_sec": 305962.0, "step_ms": 3.347, ...}
where samples_per_sec = iters x global batch / seconds (global, over every GPU) and step_ms =
seconds / iters.

NCCL_NVLS_ENABLE defaults to 0 here (NVLink multicast can take shared GPUs out of service); set it
in the environment to override.
"""

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

# Workloads: name -> (input shape per sample, classes).
WORKLOADS = {
    "mlp4096": ((784,), 10),
    "lenet": ((1, 28, 28), 10),
    "cifar10_quick": ((3, 32, 32), 10),
    "resnet50": ((3, 224, 224), 1000),
}

# Distinct synthetic batches cycled through during the run (all resident on the GPU).
DATA_POOL = 4


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description="PyTorch DDP training throughput (samples/s) for comparison with p2ptrain",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    ap.add_argument("--workload", choices=sorted(WORKLOADS), default="mlp4096")
    ap.add_argument("--batch", type=int, default=512, help="samples per GPU per step")
    ap.add_argument("--math", choices=["fp32", "tf32"], default="fp32",
                    help="fp32: IEEE FP32 matrix products; tf32: TF32 tensor cores")
    ap.add_argument("--warmup", type=int, default=20, help="untimed steps")
    ap.add_argument("--iters", type=int, default=100, help="timed steps")
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--channels-last", action="store_true",
                    help="model and images in torch.channels_last (NHWC) memory format")
    ap.add_argument("--amp", action="store_true",
                    help="automatic mixed precision: forward and loss under torch.autocast in bfloat16 "
                         "(FP32 weights, gradients and optimizer, as PyTorch users train on Hopper)")
    ap.add_argument("--cudnn-benchmark", action="store_true",
                    help="torch.backends.cudnn.benchmark = True: cuDNN's algorithms timed per shape "
                         "in the first steps instead of chosen by its heuristics")
    ap.add_argument("--compile", action="store_true",
                    help="torch.compile the model (default mode; the compilation runs in the "
                         "untimed warm-up steps, so give it a few)")
    args = ap.parse_args()
    if args.batch < 1 or args.iters < 1 or args.warmup < 0:
        ap.error("--batch and --iters must be positive, --warmup not negative")
    return args


def set_math(math: str) -> None:
    """FP32 or TF32 for matrix products (and cuDNN convolutions), through whichever API this
    PyTorch has: `fp32_precision` (2.9+) or the older `allow_tf32` flags."""
    tf32 = math == "tf32"
    matmul = torch.backends.cuda.matmul
    if hasattr(matmul, "fp32_precision"):
        matmul.fp32_precision = "tf32" if tf32 else "ieee"
        conv = getattr(torch.backends.cudnn, "conv", None)
        if conv is not None and hasattr(conv, "fp32_precision"):
            conv.fp32_precision = "tf32" if tf32 else "ieee"
    else:
        matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32


def nccl_version() -> str:
    """PyTorch's NCCL version as `2.28.3` (older PyTorch returns one integer such as 22803)."""
    v = torch.cuda.nccl.version()
    if isinstance(v, int):
        return f"{v // 10000}.{v // 100 % 100}.{v % 100}"
    return ".".join(map(str, v))


def mlp(inputs: int, hidden: list, classes: int) -> nn.Module:
    layers = []
    width = inputs
    for h in hidden:
        layers += [nn.Linear(width, h), nn.ReLU(inplace=True)]
        width = h
    layers.append(nn.Linear(width, classes))
    return nn.Sequential(*layers)


def lenet() -> nn.Module:
    """Caffe's examples/mnist/lenet_train_test.prototxt."""
    return nn.Sequential(
        nn.Conv2d(1, 20, 5), nn.MaxPool2d(2, 2, ceil_mode=True),
        nn.Conv2d(20, 50, 5), nn.MaxPool2d(2, 2, ceil_mode=True),
        nn.Flatten(), nn.Linear(800, 500), nn.ReLU(inplace=True), nn.Linear(500, 10))


def cifar10_quick() -> nn.Module:
    """Caffe's examples/cifar10/cifar10_quick_train_test.prototxt."""
    return nn.Sequential(
        nn.Conv2d(3, 32, 5, padding=2), nn.MaxPool2d(3, 2, ceil_mode=True), nn.ReLU(inplace=True),
        nn.Conv2d(32, 32, 5, padding=2), nn.ReLU(inplace=True), nn.AvgPool2d(3, 2, ceil_mode=True),
        nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(inplace=True), nn.AvgPool2d(3, 2, ceil_mode=True),
        nn.Flatten(), nn.Linear(64 * 4 * 4, 64), nn.Linear(64, 10))


class Bottleneck(nn.Module):
    def __init__(self, cin: int, mid: int, stride: int):
        super().__init__()
        cout = mid * 4
        self.body = nn.Sequential(
            nn.Conv2d(cin, mid, 1, stride=stride, bias=False), nn.BatchNorm2d(mid), nn.ReLU(inplace=True),
            nn.Conv2d(mid, mid, 3, padding=1, bias=False), nn.BatchNorm2d(mid), nn.ReLU(inplace=True),
            nn.Conv2d(mid, cout, 1, bias=False), nn.BatchNorm2d(cout))
        self.shortcut = None
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False),
                                          nn.BatchNorm2d(cout))

    def forward(self, x):
        s = x if self.shortcut is None else self.shortcut(x)
        return F.relu(self.body(x) + s, inplace=True)


def resnet50(classes: int = 1000) -> nn.Module:
    layers = [nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False), nn.BatchNorm2d(64),
              nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, ceil_mode=True)]
    cin = 64
    for mid, blocks, stride in [(64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)]:
        for b in range(blocks):
            layers.append(Bottleneck(cin, mid, stride if b == 0 else 1))
            cin = mid * 4
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes)]
    return nn.Sequential(*layers)


def build_model(workload: str) -> nn.Module:
    if workload == "mlp4096":
        return mlp(784, [4096, 4096, 4096], 10)
    if workload == "lenet":
        return lenet()
    if workload == "cifar10_quick":
        return cifar10_quick()
    return resnet50(WORKLOADS[workload][1])


def main() -> int:
    args = parse_args()
    if not torch.cuda.is_available():
        print("pytorch_ddp.py: no CUDA device", file=sys.stderr)
        return 1
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

    # Set by torchrun / torch.distributed.run; absent for a plain `python3` run.
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank)
    torch.cuda.set_device(device)
    if world > 1:
        dist.init_process_group("nccl", device_id=device)
    set_math(args.math)
    torch.backends.cudnn.benchmark = args.cudnn_benchmark

    # Same initial weights on every rank (DDP broadcasts rank 0's anyway); different data per rank.
    torch.manual_seed(args.seed)
    model = build_model(args.workload).to(device)
    memory_format = torch.channels_last if args.channels_last else torch.contiguous_format
    if args.channels_last:
        model = model.to(memory_format=memory_format)
    if world > 1:
        model = nn.parallel.DistributedDataParallel(model, device_ids=[local_rank])
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    if args.compile:
        model = torch.compile(model)

    shape, classes = WORKLOADS[args.workload]
    gen = torch.Generator(device=device)
    gen.manual_seed(args.seed * 1000 + rank)
    data = [torch.randn(args.batch, *shape, device=device, generator=gen) for _ in range(DATA_POOL)]
    if args.channels_last and len(shape) == 3:
        data = [x.contiguous(memory_format=memory_format) for x in data]
    labels = [torch.randint(0, classes, (args.batch,), device=device, generator=gen)
              for _ in range(DATA_POOL)]

    def step(i: int) -> torch.Tensor:
        x, y = data[i % DATA_POOL], labels[i % DATA_POOL]
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=args.amp):
            loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    for i in range(args.warmup):
        step(i)
    torch.cuda.synchronize(device)
    if world > 1:
        dist.barrier(device_ids=[local_rank])

    start = time.perf_counter()
    for i in range(args.iters):
        loss = step(i)
    torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start

    # The slowest rank's time and the mean final loss over the ranks.
    stats = torch.tensor([seconds, loss.item()], dtype=torch.float64, device=device)
    if world > 1:
        slowest = stats[:1].clone()
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        dist.all_reduce(stats, op=dist.ReduceOp.SUM)
        seconds, mean_loss = slowest.item(), stats[1].item() / world
    else:
        mean_loss = stats[1].item()

    if rank == 0:
        global_batch = args.batch * world
        rate = args.iters * global_batch / seconds
        print(json.dumps({
            "framework": f"pytorch {torch.__version__} " + ("DDP" if world > 1 else "single GPU"),
            "workload": args.workload,
            "gpus": world,
            "ddp": world > 1,
            "batch_per_gpu": args.batch,
            "global_batch": global_batch,
            "math": args.math,
            "amp": "bf16" if args.amp else None,
            "memory_format": "channels_last" if args.channels_last else "contiguous",
            "cudnn_benchmark": args.cudnn_benchmark,
            "compiled": args.compile,
            "warmup": args.warmup,
            "iters": args.iters,
            "seconds": round(seconds, 6),
            "samples_per_sec": round(rate, 1),
            "samples_per_sec_per_gpu": round(rate / world, 1),
            "step_ms": round(1e3 * seconds / args.iters, 3),
            "final_loss": round(mean_loss, 6),
            "device": torch.cuda.get_device_name(device),
            "cuda": torch.version.cuda,
            "nccl": nccl_version() if world > 1 else None,
        }), flush=True)

    if world > 1:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
