#!/usr/bin/env python3
"""A small PyTorch DistributedDataParallel job to profile with gradscope (README.md).

A convolutional network (three conv blocks with batch norm, then two linear layers: 0.6 M parameters)
learns to classify synthetic 32x32 RGB images into 10 classes. The labels come from a fixed random
"teacher" network, so the task is learnable and the loss goes down. Every rank draws its own batches
from its own seed; DDP averages the gradients over the ranks with one all-reduce per gradient bucket
(`--bucket-cap-mb`), which is what gradscope records: ncclAllReduce on GPUs (backend nccl). With the
gloo backend (CPU) the reductions go through gloo, which gradscope's agent does not intercept.

Launch with torchrun (one process per GPU), with an MPI launcher (mpirun -np N: the rank, world size
and local rank come from Open MPI's or PMI's variables, MASTER_ADDR/MASTER_PORT default to
127.0.0.1:29500 on one node), or as a single process (world size 1).

    torchrun --nproc_per_node=8 samples/pytorch_ddp/train.py --steps 200
    mpirun -np 8 python3 samples/pytorch_ddp/train.py --steps 200

Rank 0 prints the loss (averaged over the ranks) every --print-every steps and a final line.
"""

import argparse
import os
import sys
import time


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=200, help="training steps (default 200)")
    p.add_argument("--batch", type=int, default=64, help="samples per rank and step (default 64)")
    p.add_argument("--lr", type=float, default=0.05, help="SGD learning rate (default 0.05)")
    p.add_argument("--width", type=int, default=1,
                   help="multiplies every layer's channels, for bigger gradients (default 1)")
    p.add_argument("--bucket-cap-mb", type=float, default=25.0,
                   help="DDP gradient bucket size in MiB (DDP's own default: 25)")
    p.add_argument("--compress", choices=["none", "fp16", "bf16"], default="none",
                   help="DDP communication hook that sends the gradients in fp16 or bf16 "
                        "(default_hooks.fp16_compress_hook / bf16_compress_hook); default none")
    p.add_argument("--backend", choices=["auto", "nccl", "gloo"], default="auto",
                   help="process group backend; auto: nccl when CUDA is available, else gloo")
    p.add_argument("--seed", type=int, default=1, help="seed of the model, the teacher and the data")
    p.add_argument("--print-every", type=int, default=20, help="print every K steps; 0: only the end")
    p.add_argument("--nvtx", default="train_step",
                   help="name of the NVTX range pushed around every step on GPUs, for "
                        "GRADSCOPE_STEP_NVTX (empty: none)")
    args = p.parse_args(argv)
    if args.steps < 1 or args.batch < 1 or args.width < 1 or args.bucket_cap_mb <= 0 or args.print_every < 0:
        p.error("--steps, --batch, --width and --bucket-cap-mb must be positive, --print-every 0 or more")
    return args


def launcher_environment():
    """Rank, world size and local rank from torchrun, Open MPI or PMI; sets what init_process_group reads."""
    env = os.environ
    if "RANK" in env and "WORLD_SIZE" in env:  # torchrun, or set by hand
        rank, world, local = int(env["RANK"]), int(env["WORLD_SIZE"]), int(env.get("LOCAL_RANK", "0"))
    elif "OMPI_COMM_WORLD_RANK" in env:  # Open MPI's mpirun
        rank, world = int(env["OMPI_COMM_WORLD_RANK"]), int(env["OMPI_COMM_WORLD_SIZE"])
        local = int(env.get("OMPI_COMM_WORLD_LOCAL_RANK", "0"))
    elif "PMI_RANK" in env:  # MPICH / Intel MPI (Hydra)
        rank, world = int(env["PMI_RANK"]), int(env["PMI_SIZE"])
        local = int(env.get("MPI_LOCALRANKID", "0"))
    else:  # a single process
        rank, world, local = 0, 1, 0
    env.setdefault("MASTER_ADDR", "127.0.0.1")
    env.setdefault("MASTER_PORT", "29500")
    env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"] = str(rank), str(world), str(local)
    return rank, world, local


def main(argv=None):
    args = parse_args(argv)
    rank, world, local = launcher_environment()
    try:
        import torch
        import torch.distributed as dist
        import torch.nn as nn
        import torch.nn.functional as F
    except ImportError as error:
        print(f"train.py: rank {rank}: PyTorch is not installed ({error}); pip install torch", file=sys.stderr)
        return 3

    use_cuda = torch.cuda.is_available()
    backend = args.backend if args.backend != "auto" else ("nccl" if use_cuda else "gloo")
    if backend == "nccl" and not use_cuda:
        print(f"train.py: rank {rank}: --backend nccl needs a CUDA GPU and none is available; "
              "use --backend gloo", file=sys.stderr)
        return 3
    if use_cuda and backend == "nccl":
        if local >= torch.cuda.device_count():
            print(f"train.py: rank {rank}: local rank {local} but only {torch.cuda.device_count()} GPUs; "
                  "start one process per GPU", file=sys.stderr)
            return 3
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(1)  # one core per rank: ranks share the machine
    dist.init_process_group(backend=backend, rank=rank, world_size=world)

    w = args.width

    def block(cin, cout):
        return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout),
                             nn.ReLU(inplace=True), nn.MaxPool2d(2))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.features = nn.Sequential(block(3, 32 * w), block(32 * w, 64 * w), block(64 * w, 128 * w))
            self.fc1 = nn.Linear(128 * w * 4 * 4, 256 * w)
            self.fc2 = nn.Linear(256 * w, 10)

        def forward(self, x):
            x = self.features(x).flatten(1)
            return self.fc2(F.relu(self.fc1(x)))

    torch.manual_seed(args.seed)  # the same initial weights on every rank (DDP also broadcasts rank 0's)
    model = Net().to(device)
    teacher = torch.nn.Linear(3 * 32 * 32, 10).to(device)  # fixed: labels = argmax(teacher(x))
    for p in teacher.parameters():
        p.requires_grad_(False)
    parameters = sum(p.numel() for p in model.parameters())

    ddp = nn.parallel.DistributedDataParallel(
        model, device_ids=[local] if device.type == "cuda" else None, bucket_cap_mb=args.bucket_cap_mb)
    if args.compress != "none":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        hook = default_hooks.fp16_compress_hook if args.compress == "fp16" else default_hooks.bf16_compress_hook
        ddp.register_comm_hook(state=None, hook=hook)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)

    data = torch.Generator(device=device)
    data.manual_seed(args.seed * 1000003 + rank)  # every rank its own batches
    nvtx = args.nvtx if (args.nvtx and device.type == "cuda") else ""
    if rank == 0:
        print(f"convnet width {w}, {parameters} parameters, {world} ranks x {args.batch} samples per step, "
              f"{args.steps} steps, backend {backend}, bucket_cap_mb {args.bucket_cap_mb:g}, "
              f"compression {args.compress}", flush=True)

    start = time.perf_counter()
    loss_sum = torch.zeros(1, device=device)
    for step in range(1, args.steps + 1):
        if nvtx:
            torch.cuda.nvtx.range_push(nvtx)
        x = torch.randn(args.batch, 3, 32, 32, generator=data, device=device)
        with torch.no_grad():
            y = teacher(x.flatten(1)).argmax(dim=1)
        loss = F.cross_entropy(ddp(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # DDP all-reduces the gradient buckets here, overlapped with the backward pass
        optimizer.step()
        if nvtx:
            torch.cuda.nvtx.range_pop()
        if args.print_every and step % args.print_every == 0 or step == args.steps:
            loss_sum.copy_(loss.detach().reshape(1))
            dist.all_reduce(loss_sum)  # one small extra all-reduce for the printed mean loss
            if rank == 0 and args.print_every and step % args.print_every == 0:
                print(f"step {step} loss {loss_sum.item() / world:.6f}", flush=True)
    if device.type == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    if rank == 0:
        print(f"final loss {loss_sum.item() / world:.6f} steps {args.steps} ranks {world} "
              f"time {elapsed:.2f} s ({1000 * elapsed / args.steps:.1f} ms per step)", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
