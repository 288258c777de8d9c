"""The reference the harness is measured against: each framework's own training loop, as its
documentation writes it, with nothing of the harness but the model.

Same CNN, synthetic uint8 batches normalised the same way, SGD with momentum, batch 64 per process;
timed between barriers after the same number of warmup steps as the harness. Prints one JSON line:
{"throughput": samples/s over all processes}. The loops (--framework):

- `torch`: one process, no framework (run without a launcher);
- `ddp`: DistributedDataParallel, under torchrun;
- `horovod`: the textbook loop, hvd.DistributedOptimizer, under horovodrun or mpirun;
- `deepspeed`: a bare engine (deepspeed.initialize on the model and the optimizer, ZeRO stage
  --zero-stage, clipping off as the harness sets it), under torchrun;
- `fsdp`: FSDP2, fully_shard on each child with parameters and on the root, under torchrun.

--cpu-malloc reuse applies the harness's CPU memory setting (harness/process/allocator.py), so the
loops can be compared with the harness's with the allocator held equal.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from harness.process.allocator import CPU_MALLOC_MODES, reuse_freed_memory
from harness.tasks.models import WorkshopCNN

FRAMEWORKS = ("torch", "ddp", "horovod", "deepspeed", "fsdp")
LR, MOMENTUM = 0.01, 0.9


def _sgd(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)


def prepare(framework: str, model: nn.Module, batch: int, zero_stage: int) -> tuple[Callable, Callable, int, int]:
    """(step(x, y), barrier, world size, rank) of `framework`'s loop around `model`."""
    if framework == "horovod":
        import horovod.torch as hvd

        hvd.init()
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        optimizer = hvd.DistributedOptimizer(_sgd(model), named_parameters=model.named_parameters())
        return _plain_step(model, optimizer), hvd.barrier, hvd.size(), hvd.rank()
    if framework == "torch":
        return _plain_step(model, _sgd(model)), lambda: None, 1, 0
    dist.init_process_group("gloo")
    if framework == "ddp":
        wrapped = nn.parallel.DistributedDataParallel(model)
        step = _plain_step(wrapped, _sgd(wrapped))
    elif framework == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for child in model.children():
            if any(True for _ in child.parameters()):
                fully_shard(child)
        fully_shard(model)
        step = _plain_step(model, _sgd(model))
    else:
        import deepspeed

        config = {
            "train_micro_batch_size_per_gpu": batch,
            "gradient_accumulation_steps": 1,
            "gradient_clipping": 0.0,
            "zero_optimization": {"stage": zero_stage},
        }
        engine, _, _, _ = deepspeed.initialize(model=model, optimizer=_sgd(model), config=config)

        def step(x: torch.Tensor, y: torch.Tensor) -> None:
            loss = F.cross_entropy(engine(x), y)
            engine.backward(loss)
            engine.step()

    return step, dist.barrier, dist.get_world_size(), dist.get_rank()


def _plain_step(model: nn.Module, optimizer: torch.optim.Optimizer) -> Callable[[torch.Tensor, torch.Tensor], None]:
    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()  # sets gradients to None (torch >= 2.0 default)

    return step


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--framework", choices=FRAMEWORKS, default="torch")
    parser.add_argument("--zero-stage", type=int, default=0, help="deepspeed only")
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--cpu-malloc", choices=CPU_MALLOC_MODES, default="system")
    args = parser.parse_args()
    reuse_freed_memory(args.cpu_malloc)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    step, barrier, world, rank = prepare(args.framework, WorkshopCNN(), args.batch, args.zero_stage)
    images = torch.randint(0, 256, (8, args.batch, 1, 28, 28), dtype=torch.uint8)
    labels = torch.randint(0, 10, (8, args.batch))
    start = time.perf_counter()
    for index in range(args.warmup + args.steps):
        if index == args.warmup:
            barrier()
            start = time.perf_counter()
        step((images[index % 8].float() / 255 - 0.5) / 0.29, labels[index % 8])
    barrier()
    elapsed = time.perf_counter() - start
    if rank == 0:
        print(json.dumps({"throughput": args.steps * args.batch * world / elapsed}), flush=True)
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
