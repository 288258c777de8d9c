"""The reference the harness is measured against: a bare PyTorch (or bare DDP) training loop.

Same CNN, synthetic uint8 batches normalised the same way, SGD, batch 64 per process; timed
between barriers after the same number of warmup steps as the harness. Prints one JSON line:
{"throughput": samples/s over all processes}. Run under torchrun for the DDP variant, and with
--horovod under horovodrun or mpirun for the textbook Horovod loop (DistributedOptimizer).
--cpu-malloc reuse applies the harness's CPU memory setting (harness/process/allocator.py), so the loops
themselves can be compared with the allocator held equal.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

from harness.process.allocator import CPU_MALLOC_MODES, reuse_freed_memory
from harness.tasks.models import WorkshopCNN


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--horovod", action="store_true", help="Horovod instead of DDP")
    parser.add_argument("--cpu-malloc", choices=CPU_MALLOC_MODES, default="system")
    args = parser.parse_args()
    reuse_freed_memory(args.cpu_malloc)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = WorkshopCNN()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    if args.horovod:
        import horovod.torch as hvd

        hvd.init()
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
        barrier, world, rank = hvd.barrier, hvd.size(), hvd.rank()
    elif "RANK" in os.environ:
        dist.init_process_group("gloo")
        model = torch.nn.parallel.DistributedDataParallel(model)
        barrier, world, rank = dist.barrier, dist.get_world_size(), dist.get_rank()
    else:
        barrier, world, rank = (lambda: None), 1, 0
    images = torch.randint(0, 256, (8, args.batch, 1, 28, 28), dtype=torch.uint8)
    labels = torch.randint(0, 10, (8, args.batch))
    start = time.perf_counter()
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            barrier()
            start = time.perf_counter()
        x = (images[step % 8].float() / 255 - 0.5) / 0.29
        loss = F.cross_entropy(model(x), labels[step % 8])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()  # sets gradients to None (torch >= 2.0 default)
    barrier()
    elapsed = time.perf_counter() - start
    if rank == 0:
        print(json.dumps({"throughput": args.steps * args.batch * world / elapsed}), flush=True)
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
