"""PyTorch DistributedDataParallel."""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any, ContextManager, Dict, Tuple

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ..errors import UsageError
from .base import OptimizerFactory
from .torch_distributed import TorchDistributedBackend

if TYPE_CHECKING:
    from ..config import TrainConfig

_DDP_PARAMETERS = inspect.signature(DistributedDataParallel.__init__).parameters


class DDPBackend(TorchDistributedBackend):
    """Gradients are averaged by DDP's bucketed allreduce, overlapped with the backward pass."""

    name = "ddp"
    options = ("ddp_bucket_cap_mb",)

    @classmethod
    def check_options(cls, config: "TrainConfig") -> None:
        if not config.ddp_bucket_cap_mb > 0:
            raise UsageError(f"--ddp-bucket-cap-mb must be positive, got {config.ddp_bucket_cap_mb}")

    def wrap(self, model: nn.Module, make_optimizer: OptimizerFactory, config: "TrainConfig",
             local_batch: int) -> Tuple[nn.Module, torch.optim.Optimizer]:
        self.bucket_cap_mb = config.ddp_bucket_cap_mb
        device = next(model.parameters()).device
        # Horovod and DeepSpeed do not broadcast buffers every step; neither does this. (torch >= 2.14
        # renamed the switch; the initial broadcast it keeps is harmless, every rank starts equal.)
        no_buffer_sync = ({"forward_sync_buffers": False} if "forward_sync_buffers" in _DDP_PARAMETERS
                          else {"broadcast_buffers": False})
        # Gradients as views into DDP's allreduce buckets: the same values, without a copy of every
        # gradient into its bucket and back after each allreduce (two small kernels per parameter
        # per step, 322 for ResNet-50), and one gradient-sized buffer less.
        self.model = DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None,
            bucket_cap_mb=self.bucket_cap_mb, gradient_as_bucket_view=True, **no_buffer_sync)
        self.optimizer = make_optimizer(self.model.parameters())
        self._local_setup(config)
        return self.model, self.optimizer

    def no_sync(self, sync: bool) -> ContextManager:
        # DDP decides in forward whether backward will reduce, so the context spans both.
        return super().no_sync(sync) if sync else self.model.no_sync()

    def tuning(self) -> Dict[str, Any]:
        return {"bucket_cap_mb": self.bucket_cap_mb, "gradient_as_bucket_view": True, "process_group": self.group_backend}

    def module(self) -> nn.Module:
        return self.model.module
