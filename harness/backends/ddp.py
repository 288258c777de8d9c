"""PyTorch DistributedDataParallel."""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel

from ..errors import UsageError
from ..options import BaseOptions, option
from . import compat
from .base import OptimizerFactory
from .torch_distributed import TorchDistributedBackend, TorchDistributedScriptHooks
from .traffic import Collective, ModelShape

FIRST_BUCKET_BYTES = 2**20  # torch.distributed's _DEFAULT_FIRST_BUCKET_BYTES, which DDP uses unless told


def unused_parameters_message(names: list[str]) -> str:
    """The one line for a model whose loss does not reach every parameter, under DDP without the option."""
    which = f"parameters {', '.join(names[:5])}{' ...' if len(names) > 5 else ''} got" if names else "a parameter got"
    return (
        f"{which} no gradient from a step's loss; DDP needs --ddp-find-unused-parameters for such a model "
        "(or use every parameter in every step)"
    )


class DDPScriptHooks(TorchDistributedScriptHooks):
    """A script's DDP models tell each gradient bucket they allreduce."""

    @classmethod
    def watch_gradient_syncs(cls, record: Callable[[], None]) -> None:
        # Every DDP model built from now on allreduces its buckets through a comm hook that tells
        # `record`, then does what the default allreduce hook does (as wrap's metered one). A
        # backward inside no_sync reduces nothing, so no bucket of it reaches the hook.
        built = DistributedDataParallel.__init__

        # Unannotated: DDP compares a hook's annotations with its classes, and under postponed
        # evaluation (this module's __future__ import) they are strings.
        def told(state, bucket):  # type: ignore[no-untyped-def]
            record()
            return allreduce_hook(state, bucket)

        def watched(self: DistributedDataParallel, *args: Any, **kwargs: Any) -> None:
            built(self, *args, **kwargs)
            self.register_comm_hook(None, told)

        DistributedDataParallel.__init__ = watched  # type: ignore[method-assign]


class DDPBackend(TorchDistributedBackend):
    """Gradients are averaged by DDP's bucketed allreduce, overlapped with the backward pass."""

    name = "ddp"
    # Through the process group of harness.process.accelerator.communicator: NCCL (RCCL on ROCm),
    # XCCL or oneCCL on Intel GPUs, gloo on the CPU.
    devices = ("cuda", "rocm", "xpu", "cpu")
    script_hooks = DDPScriptHooks

    @dataclass(frozen=True)
    class Options(BaseOptions):
        """DDP's knobs: the size of the buckets its allreduce sends, and whether it looks for
        parameters a step's loss does not reach (speed only, not the math: every backend steps
        such a parameter with a zero gradient)."""

        bucket_cap_mb: float = option(25.0, "--ddp-bucket-cap-mb", "ddp: gradient bucket size in MB")
        find_unused_parameters: bool = option(
            False,
            "--ddp-find-unused-parameters",
            "ddp: for a model whose loss does not reach every parameter in every step (DDP then walks the "
            "autograd graph after each forward; without it DDP stops at the next step)",
        )

        def validate(self) -> None:
            if not self.bucket_cap_mb > 0:
                raise UsageError(f"{self.flag('bucket_cap_mb')} must be positive, got {self.bucket_cap_mb}")

    options: Options

    def wrap(
        self, model: nn.Module, make_optimizer: OptimizerFactory, local_batch: int
    ) -> tuple[nn.Module, torch.optim.Optimizer]:
        device = next(model.parameters()).device
        # Gradients as views into DDP's allreduce buckets: the same values, without a copy of every
        # gradient into its bucket and back after each allreduce (two small kernels per parameter
        # per step, 322 for ResNet-50), and one gradient-sized buffer less.
        self.model = DistributedDataParallel(
            model,
            device_ids=[device.index] if device.type != "cpu" else None,
            bucket_cap_mb=self.options.bucket_cap_mb,
            gradient_as_bucket_view=True,
            find_unused_parameters=self.options.find_unused_parameters,
            **compat.ddp_without_buffer_sync(),
        )
        self.optimizer = make_optimizer(self.model.parameters())
        self._local_setup()
        # At world size 1 the mean over ranks is the identity: no step reduces (Horovod skips it
        # at size 1 too), so a one-rank baseline holds no communication (harness.training.timing).
        self.reduces = dist.get_world_size() > 1
        if self.reduces and self.collective_functions:
            # The reducer's built-in allreduce runs in C++, out of the meter's sight. The default
            # allreduce hook does the same in Python through dist.all_reduce, which the meter wraps:
            # the bucket divided by the world size, allreduced, as the built-in one (the math of
            # DDP's default; https://pytorch.org/docs/stable/ddp_comm_hooks.html).
            self.model.register_comm_hook(None, allreduce_hook)
        return self.model, self.optimizer

    def check_unused_parameters(self, names: list[str]) -> None:
        if names and not self.options.find_unused_parameters:
            raise UsageError(unused_parameters_message(names))

    def backward(self, loss: torch.Tensor, sync: bool) -> None:
        # The reducer waits for the buckets' futures at the end of backward, in C++.
        with self.collectives.waited_inside():
            super().backward(loss, sync)

    @classmethod
    def usage_error(cls, error: BaseException) -> Optional[UsageError]:
        # DDP finds a parameter the previous step's loss did not reach at the next forward.
        if isinstance(error, RuntimeError) and "Expected to have finished reduction" in str(error):
            return UsageError(unused_parameters_message([]))
        return None

    def no_sync(self, sync: bool) -> AbstractContextManager:
        # DDP decides in forward whether backward will reduce, so the context spans both.
        return super().no_sync(sync) if sync and self.reduces else self.model.no_sync()

    def traffic(self, shape: ModelShape, on_gpu: bool = True) -> list[Collective]:
        # The reducer fills buckets in the reverse order of the parameters (the order backward
        # produces gradients), closes one once it holds its limit and launches its allreduce then.
        # The first bucket's limit is torch's _DEFAULT_FIRST_BUCKET_BYTES (1 MiB), so that the
        # first allreduce starts early; the others' is bucket_cap_mb. On GPUs NCCL runs them beside
        # backward; on CPUs gloo barely does: 2-node runs of the workshop CNN, a core per rank, hid
        # 2 ms of 31 and of 85 ms in flight (benchmarks/results/prediction.json), so there they hold.
        bucket = int(self.options.bucket_cap_mb * 2**20)
        sizes, filling = [], 0
        for size in shape.modules()[::-1]:
            filling += size
            if filling >= (bucket if sizes else min(FIRST_BUCKET_BYTES, bucket)):
                sizes.append(filling)
                filling = 0
        sizes += [filling] if filling else []
        return [Collective("all_reduce", size, 1, "backward_reduce", on_gpu) for size in sizes]

    def tuning(self) -> dict[str, Any]:
        return {
            "bucket_cap_mb": self.options.bucket_cap_mb,
            "find_unused_parameters": self.options.find_unused_parameters,
            "gradient_as_bucket_view": True,
            "process_group": self.group_backend,
            "gradient_allreduce": self.reduces,
            "comm_hook": "default allreduce_hook (metered)" if self.reduces and self.collective_functions else None,
        }

    def module(self) -> nn.Module:
        return self.model.module
