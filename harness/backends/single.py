"""The single-process baseline (`--backend none`): no wrapper, no communication."""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from ..errors import UsageError
from ..process.discovery import ClusterEnv
from .base import Backend, OptimizerFactory
from .traffic import Collective, ModelShape


class SingleProcessBackend(Backend):
    """One process trains alone; every collective is the identity."""

    name = "none"
    local_launcher = "python"
    local_launchers = ("python",)
    max_world_size = 1
    devices = ("cuda", "rocm", "xpu", "cpu")  # no communication: wherever torch runs

    def check_launch(self, cluster: ClusterEnv, device: torch.device) -> None:
        if cluster.world_size != 1:
            raise UsageError(
                f"backend 'none' runs one process but the launcher started {cluster.world_size}; "
                "use --backend ddp, horovod, deepspeed or fsdp, or launch one process"
            )

    def init(self, cluster: ClusterEnv, device: torch.device) -> None:
        """Nothing to join."""

    def traffic(self, shape: ModelShape, on_gpu: bool = True) -> list[Collective]:
        return []

    def wrap(
        self, model: nn.Module, make_optimizer: OptimizerFactory, local_batch: int
    ) -> tuple[nn.Module, torch.optim.Optimizer]:
        self.model = model
        self.optimizer = make_optimizer(model.parameters())
        self._local_setup()
        return self.model, self.optimizer

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def start_all_reduce_sum(self, tensor: torch.Tensor, name: str) -> Callable[[], torch.Tensor]:
        return lambda: tensor

    def barrier(self) -> None:
        """One rank: nobody to wait for."""
