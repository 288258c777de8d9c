"""Tasks that are wrong in the ways a researcher's first task is, each reached as
`--task tests/helpers/bad_tasks.py:FUNCTION`: the kit must end each in one line that names the task
and the fix (exit status 2, nothing appended to --results), before any rank waits for another.

Each is tests/helpers/tasks.py's `regression` (or `auxiliary`) with one part broken. The ones that
only ranks can see (a part that differs between ranks) are the last three; the others fail alike in
one process (tests/unit/test_tasks.py) and on every rank.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from harness import BatchContext, Task
from tests.helpers.tasks import FEATURES, Points, auxiliary, regression

FACTORY_ERROR = "no table named 'points' in the data directory"


def raises() -> Task:
    """A factory that fails: the data it looks for is not there."""
    raise FileNotFoundError(FACTORY_ERROR)


def not_a_task() -> dict[str, Any]:
    """A factory that returns the parts, not a Task."""
    task = regression()
    return {"build_model": task.build_model, "train_data": task.train_data, "loss": task.loss}


def empty_data() -> Task:
    """Training data of length 0."""
    return dataclasses.replace(regression(), train_data=Points(0, seed=0))


def tiny_data() -> Task:
    """Ten training samples: fewer than one global batch of the tests' runs."""
    return dataclasses.replace(regression(), train_data=Points(10, seed=0))


def per_sample_loss() -> Task:
    """A loss left unreduced: one value per sample, not a scalar."""

    def loss(model: nn.Module, batch: Any) -> torch.Tensor:
        inputs, targets = batch
        return F.mse_loss(model(inputs), targets, reduction="none")

    return dataclasses.replace(regression(), loss=loss)


class MissingTargets(Points):
    """Points whose targets were not measured: NaN in every row, as a table with a missing column."""

    def __init__(self, count: int, seed: int) -> None:
        super().__init__(count, seed)
        self.targets = torch.full_like(self.targets, math.nan)


def nan_loss() -> Task:
    """NaN targets: the loss is NaN at the first step."""
    return dataclasses.replace(regression(), train_data=MissingTargets(512, seed=0))


def no_parameters() -> Task:
    """A model that is only a function: nothing for a backend to train."""
    return dataclasses.replace(regression(), build_model=lambda: nn.Sequential(nn.Flatten(), nn.ReLU()))


class Detached(nn.Module):
    """A linear model whose output is detached from it (e.g. to log it, then left detached)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(FEATURES, 1)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.linear(inputs).detach()


def detached_loss() -> Task:
    """A loss that does not depend on the model's parameters (its output detached)."""
    return dataclasses.replace(regression(), build_model=Detached)


def parameter_outside_the_model() -> Task:
    """A learnable scale kept in the task, not in the model, and the model's output detached: the
    loss needs a gradient, but reaches none of the model's parameters."""
    scale = torch.ones((), requires_grad=True)

    def loss(model: nn.Module, batch: Any) -> torch.Tensor:
        inputs, targets = batch
        return F.mse_loss(scale * model(inputs), targets)

    return dataclasses.replace(regression(), build_model=Detached, loss=loss)


def mean_metric() -> Task:
    """A metric that returns the batch's mean (a float), which cannot be reduced over ranks exactly."""

    def metrics(model: nn.Module, batch: Any) -> dict[str, Any]:
        inputs, targets = batch
        return {"mae": (model(inputs) - targets).abs().mean().item()}

    return dataclasses.replace(regression(), metrics=metrics)


def wrong_width() -> Task:
    """A model built for more features than the data has."""
    return dataclasses.replace(
        regression(), build_model=lambda: nn.Sequential(nn.Linear(FEATURES + 2, 16), nn.ReLU(), nn.Linear(16, 1))
    )


class Ragged:
    """Points whose fetch returns every target, whatever the indices: rows that do not match."""

    def __init__(self) -> None:
        self.points = Points(512, seed=0)

    def __len__(self) -> int:
        return len(self.points)

    def fetch(self, indices: Any) -> tuple[torch.Tensor, torch.Tensor]:
        return self.points.inputs[torch.as_tensor(indices)], self.points.targets


def ragged_batch() -> Task:
    """Data whose batch holds tensors of different numbers of rows."""
    return dataclasses.replace(regression(), train_data=Ragged())


# The cases only ranks can see: a part that differs between ranks.


def _poison_rank_1(batch: Any, context: BatchContext) -> Any:
    inputs, targets = batch
    return (inputs * math.nan, targets) if context.training and context.rank == 1 else batch


def nan_on_rank_1() -> Task:
    """Rank 1's training batches hold NaN inputs (a bad shard, say): rank 1's loss is NaN."""
    return dataclasses.replace(regression(), prepare_batch=_poison_rank_1)


def _auxiliary_on_rank_0(batch: dict[str, Any], context: BatchContext) -> dict[str, Any]:
    return {**batch, "use_auxiliary": context.rank == 0}


def auxiliary_on_rank_0() -> Task:
    """The auxiliary head used on rank 0 only: the ranks' first batches leave different parameters
    unused, which backends that gather or reduce per parameter present cannot train."""
    return dataclasses.replace(auxiliary(), prepare_batch=_auxiliary_on_rank_0)
