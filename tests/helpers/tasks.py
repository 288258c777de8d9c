"""Tasks the kit does not ship, defined here for the tests: each is a `harness.Task` factory that the
CLI reaches as `--task tests/helpers/tasks.py:FUNCTION` on every rank under any launcher.

- `regression`: an MLP with batch norm (buffers that stay per rank) on tabular points served by a
  plain map-style `torch.utils.data.Dataset` (adapted by the kit), mean-squared error, and a metric;
- `auxiliary`: a head used only in two steps of every three (chosen from the step in
  `prepare_batch`, the same on every rank): parameters the loss does not reach in some steps;
- `tokens`: token ids in, a next-token loss over a sequence out (an embedding and a GRU), its
  count the tokens, with dropout.

Each is small enough that a 2-rank run of a few steps takes about a second. `flags(NAME, KEY=VALUE...)`
gives the `harness train` flags that select one (by this file's absolute path, so that a run finds
it from any working directory).
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

from harness import BatchContext, Task

FEATURES = 8
TASK_FILE = os.path.abspath(__file__)


def flags(name: str, **args: Any) -> list[str]:
    """`--task` and `--task-arg` flags that select task function `name` of this file with `args`."""
    task_args = [part for key, value in args.items() for part in ("--task-arg", f"{key}={json.dumps(value)}")]
    return ["--task", f"{TASK_FILE}:{name}", *task_args]


class Points(Dataset):
    """`count` points of FEATURES features; the target is the sum of the first four plus noise."""

    def __init__(self, count: int, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.inputs = torch.randn(count, FEATURES, generator=generator)
        self.targets = self.inputs[:, :4].sum(dim=1, keepdim=True) + 0.1 * torch.randn(count, 1, generator=generator)

    def __len__(self) -> int:
        return len(self.inputs)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.inputs[index], self.targets[index]


def _squared_error(model: nn.Module, batch: Any) -> torch.Tensor:
    inputs, targets = batch
    return F.mse_loss(model(inputs), targets)


def _regression_scores(model: nn.Module, batch: Any) -> dict[str, tuple[torch.Tensor, int]]:
    inputs, targets = batch
    error = model(inputs) - targets
    return {"loss": (error.pow(2).sum(), len(inputs)), "mae": (error.abs().sum(), len(inputs))}


def regression(width: int = 32, train_samples: int = 512, test_samples: int = 101) -> Task:
    """An MLP with batch norm, fitting Points; metrics: the loss and the mean absolute error. The layer
    before the batch norm has no bias, as usual: the norm subtracts it, so its gradient is zero and
    its "update" only rounding, which no comparison relative to the update could measure."""

    def build() -> nn.Module:
        hidden = nn.Linear(FEATURES, width, bias=False)
        return nn.Sequential(hidden, nn.BatchNorm1d(width), nn.ReLU(), nn.Linear(width, 1))

    return Task(
        build_model=build,
        train_data=Points(train_samples, seed=0),
        test_data=Points(test_samples, seed=1),
        loss=_squared_error,
        metrics=_regression_scores,
        name="regression",
        description={"model": f"mlp-bn-{width}", "data": "points"},
    )


class Table:
    """Points as IndexedData: a length and a fetch of a whole batch by indices, as a dict."""

    def __init__(self, count: int, seed: int) -> None:
        self.points = Points(count, seed)

    def __len__(self) -> int:
        return len(self.points)

    def fetch(self, indices: np.ndarray) -> dict[str, torch.Tensor]:
        rows = torch.as_tensor(indices)
        return {"inputs": self.points.inputs[rows], "targets": self.points.targets[rows]}


class WithAuxiliaryHead(nn.Module):
    """A body, a head, and an auxiliary head added in the steps whose batch says so."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(FEATURES, 16), nn.ReLU())
        self.head = nn.Linear(16, 1)
        self.auxiliary = nn.Linear(16, 1)

    def forward(self, inputs: torch.Tensor, use_auxiliary: bool) -> torch.Tensor:
        hidden = self.body(inputs)
        out = self.head(hidden)
        return out + 0.5 * self.auxiliary(hidden) if use_auxiliary else out


def _every_third_step_without_auxiliary(batch: dict[str, Any], context: BatchContext) -> dict[str, Any]:
    return {**batch, "use_auxiliary": context.step % 3 != 0}


def auxiliary(train_samples: int = 512) -> Task:
    """WithAuxiliaryHead on Table: the auxiliary head's parameters get no gradient in every third step."""
    return Task(
        build_model=WithAuxiliaryHead,
        train_data=Table(train_samples, seed=0),
        test_data=Table(64, seed=1),
        loss=lambda model, batch: F.mse_loss(model(batch["inputs"], batch["use_auxiliary"]), batch["targets"]),
        prepare_batch=_every_third_step_without_auxiliary,
        name="auxiliary",
    )


VOCABULARY = 32
SEQUENCE = 12


class Sequences:
    """Token sequences with a learnable rule: each token is the previous plus its position's step."""

    def __init__(self, count: int, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        starts = torch.randint(0, VOCABULARY, (count, 1), generator=generator)
        steps = torch.randint(1, 4, (count, 1), generator=generator)
        self.tokens = (starts + steps * torch.arange(SEQUENCE + 1)) % VOCABULARY

    def __len__(self) -> int:
        return len(self.tokens)

    def fetch(self, indices: np.ndarray) -> torch.Tensor:
        return self.tokens[torch.as_tensor(indices)]


class NextToken(nn.Module):
    """Embedding, dropout, one GRU layer, logits over the vocabulary at every position."""

    def __init__(self, width: int, dropout: float) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCABULARY, width)
        self.dropout = nn.Dropout(dropout)
        self.recurrent = nn.GRU(width, width, batch_first=True)
        self.out = nn.Linear(width, VOCABULARY)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden, _ = self.recurrent(self.dropout(self.embed(tokens)))
        return self.out(hidden)


def _next_token_loss(model: nn.Module, batch: torch.Tensor) -> tuple[torch.Tensor, int]:
    logits = model(batch[:, :-1])
    return F.cross_entropy(logits.reshape(-1, VOCABULARY), batch[:, 1:].reshape(-1)), batch[:, 1:].numel()


def _token_scores(model: nn.Module, batch: torch.Tensor) -> dict[str, tuple[torch.Tensor, int]]:
    logits, targets = model(batch[:, :-1]), batch[:, 1:]
    loss = F.cross_entropy(logits.reshape(-1, VOCABULARY).float(), targets.reshape(-1), reduction="sum")
    return {"loss": (loss, targets.numel()), "accuracy": ((logits.argmax(-1) == targets).sum(), targets.numel())}


def tokens(width: int = 24, dropout: float = 0.1, train_samples: int = 512) -> Task:
    """NextToken on Sequences: a sequence loss whose count is the tokens, with dropout."""
    return Task(
        build_model=lambda: NextToken(width, dropout),
        train_data=Sequences(train_samples, seed=0),
        # 33: blocks of 17 and 16 at 2 ranks, so that at micro-batch 16 one rank evaluates two batches and
        # the other one; a backend whose forward gathers keeps them in step (harness.training.evaluate).
        test_data=Sequences(33, seed=1),
        loss=_next_token_loss,
        metrics=_token_scores,
        name="tokens",
        description={"model": f"gru-{width}", "data": "sequences"},
    )
