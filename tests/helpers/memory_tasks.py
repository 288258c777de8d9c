"""A task whose memory matters and whose compute does not, for the memory-cap tests: `wide` is a stack
of `layers` square linear layers of `width` (16 x 2048: 67M parameters, 256 MiB of float32 weights),
each a top-level child so that FSDP shards it as a unit of its own, on a few random rows. Under
Adam a DDP rank holds four copies of the weights (1 GiB), a ZeRO-3 or FSDP rank of two about half.

`leak_mib` > 0 makes rank `leak_rank` keep `leak_mib` MiB more at every training forward, memory
that no prediction can see, so that this rank alone runs past its cap while training.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import nn

from harness import Task
from harness.process.discovery import detect_cluster

TASK_FILE = os.path.abspath(__file__)
MIB = 2**20


class Rows:
    """`count` random rows of `width` features with a scalar target, fetched by indices."""

    def __init__(self, count: int, width: int, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.inputs = torch.randn(count, width, generator=generator)
        self.targets = self.inputs[:, :4].sum(dim=1, keepdim=True)

    def __len__(self) -> int:
        return len(self.inputs)

    def fetch(self, indices) -> tuple[torch.Tensor, torch.Tensor]:
        rows = torch.as_tensor(indices)
        return self.inputs[rows], self.targets[rows]


class Leak(nn.Module):
    """Passes its input through; on rank `rank`, keeps `mib` MiB more at every training forward."""

    def __init__(self, mib: int, rank: int) -> None:
        super().__init__()
        self.mib, self.rank = mib, rank
        self.kept: list[torch.Tensor] = []

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        # The launcher's rank: Horovod's ranks start no torch.distributed process group.
        if self.mib and self.training and detect_cluster().rank == self.rank:
            self.kept.append(torch.ones(self.mib * MIB // 4))  # written, so resident as well
        return inputs


def _squared_error(model: nn.Module, batch) -> torch.Tensor:
    inputs, targets = batch
    return F.mse_loss(model(inputs)[:, :1], targets)


def wide(layers: int = 16, width: int = 2048, leak_mib: int = 0, leak_rank: int = 1) -> Task:
    """`layers` linear layers of `width` with ReLUs, 64 training and 16 test rows; see the module."""

    def build() -> nn.Module:
        blocks: list[nn.Module] = [Leak(leak_mib, leak_rank)]
        for _ in range(layers):
            blocks += [nn.Linear(width, width), nn.ReLU()]
        return nn.Sequential(*blocks)

    return Task(
        build_model=build,
        train_data=Rows(64, width, seed=0),
        test_data=Rows(16, width, seed=1),
        loss=_squared_error,
        name="wide",
        description={"model": f"linear-{layers}x{width}", "data": "random rows"},
    )
