"""`Task`: what a run trains, in one object: a model factory, train and test data, a loss, and
optionally metrics, an optimizer factory and what to do to a batch on the device.

The kit keeps *how* to train (backends, sharding, precision, accumulation, the LR rule, checkpoints,
measurement); a task says *what*. The same loop runs a built-in task (harness.tasks.images) and a
researcher's own, so every guarantee of the kit holds for both.

Exactness: the loop averages the loss's gradient over the ranks and micro-batches, as every
data-parallel framework does; that is one process's gradient on the global batch whenever each
micro-batch's loss is a mean over the same number of items (fixed-length sequences, one label per
sample). Losses and metrics the kit reports are sums and counts reduced over ranks and divided
once, never means of per-rank means.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch
from torch import nn

from ..data.batches import Batch, batch_samples
from ..errors import UsageError
from ..options import BaseOptions

TaskFactory = Callable[..., "Task"]
LOSS_KEY = "loss"  # a metrics entry of this name is the evaluation's loss (one forward pass for both)


@dataclass(frozen=True)
class BatchContext:
    """Where a batch is used, for a task's `prepare_batch`: augmentation draws from (seed, epoch,
    step) and takes this rank's slice of the global batch's draws, so a sample's augmentation does
    not depend on the world size (harness.data.transforms)."""

    device: torch.device
    training: bool
    epoch: int = 0
    step: int = 0
    rank: int = 0
    world_size: int = 1
    local_batch: int = 0
    seed: int = 0


@dataclass
class Task:
    """What a run trains. Only the first three are required.

    - `build_model()`: a fresh `nn.Module`, called on every rank (and again for evaluation copies)
      with torch seeded from --seed, so that every rank starts from the same weights;
    - `train_data`, `test_data`: `len()` and `fetch(indices) -> batch`, or a map-style
      `torch.utils.data.Dataset`; a batch is a tensor or a tuple, list or dict of tensors whose
      first dimension is the sample. Without `test_data` the run is not evaluated;
    - `loss(model, batch)`: the batch's mean loss, a scalar tensor; or `(mean, count)` where the
      items averaged over are not the samples (tokens), so that reported losses weight by them;
    - `metrics(model, batch)`: `{name: (sum, count)}` over the batch (numbers or one-element
      tensors); the kit adds sums and counts over the ranks and reports `eval_<name>` = sum / count.
      An entry named "loss" is the evaluation's loss, from the same forward pass;
    - `build_optimizer(parameters)`: an optimizer over the parameters the backend hands it (default:
      SGD or Adam from --optimizer); the kit's LR rule sets every group's `lr` at every step;
    - `prepare_batch(batch, context)`: what to do to a batch once it is on the device, before the
      model sees it (normalisation, augmentation); `context` is a BatchContext;
    - `derived_metrics(means)`: metrics that are not a sum over samples, from the reduced ones:
      `means` is `{name: sum / count}` over the whole test set (the loss included), and each
      returned `{name: value}` is reported as `eval_<name>` (a perplexity: exp of the mean loss);
    - `name`, `description`: how the record names the task and what it says of it (e.g. "model",
      "data"; the kit adds the parameter count).
    """

    build_model: Callable[[], nn.Module]
    train_data: Any
    loss: Callable[[nn.Module, Batch], Any]
    test_data: Any = None
    metrics: Optional[Callable[[nn.Module, Batch], Mapping[str, Any]]] = None
    build_optimizer: Optional[Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]] = None
    prepare_batch: Optional[Callable[[Batch, BatchContext], Batch]] = None
    derived_metrics: Optional[Callable[[Mapping[str, float]], Mapping[str, float]]] = None
    name: str = ""
    description: dict[str, Any] = field(default_factory=dict)

    def check(self, label: str) -> None:
        """Raise UsageError naming `label` and the field when a part is not what it must be."""
        for part in ("build_model", "loss"):
            if not callable(getattr(self, part)):
                raise UsageError(f"{label}: {part} is a {type(getattr(self, part)).__name__}, not a function")
        for part in ("metrics", "build_optimizer", "prepare_batch", "derived_metrics"):
            value = getattr(self, part)
            if value is not None and not callable(value):
                raise UsageError(f"{label}: {part} is a {type(value).__name__}, not a function (or None)")
        if not isinstance(self.description, dict):
            raise UsageError(f"{label}: description is a {type(self.description).__name__}, not a dict")


def loss_and_count(task: Task, model: nn.Module, batch: Batch, label: str) -> tuple[torch.Tensor, Any]:
    """The task's loss of `batch` as (scalar mean, items it averages); the count defaults to the
    batch's samples. Raises UsageError when the loss is not a one-element tensor."""
    value = task.loss(model, batch)
    count: Any = None
    if isinstance(value, tuple) and len(value) == 2:
        value, count = value
    if not isinstance(value, torch.Tensor) or value.numel() != 1:
        shape = f"a tensor of shape {list(value.shape)}" if isinstance(value, torch.Tensor) else type(value).__name__
        raise UsageError(
            f"{label}: loss returned {shape}, not a scalar tensor; return the batch's mean loss (or (mean, count))"
        )
    return value.reshape(()), batch_samples(batch) if count is None else count


def batch_scores(task: Task, model: nn.Module, batch: Batch, label: str) -> dict[str, tuple[Any, Any]]:
    """`{name: (sum, count)}` of one evaluation batch: the loss (from `metrics` if it gives one,
    else from `loss`) and every metric."""
    scores: dict[str, tuple[Any, Any]] = {}
    if task.metrics is not None:
        returned = task.metrics(model, batch)
        if not isinstance(returned, Mapping):
            raise UsageError(
                f"{label}: metrics returned a {type(returned).__name__}, not a dict of name: (sum, count)"
            )
        scores = {str(name): _pair(label, str(name), value) for name, value in returned.items()}
    if LOSS_KEY not in scores:
        mean, count = loss_and_count(task, model, batch, label)
        scores[LOSS_KEY] = (mean.detach().double() * count, count)
    return scores


def _pair(label: str, name: str, value: Any) -> tuple[Any, Any]:
    """A metric's (sum, count), checked: two numbers or one-element tensors."""
    if isinstance(value, tuple) and len(value) == 2 and all(_is_number(part) for part in value):
        return value
    raise UsageError(
        f"{label}: metric {name!r} returned {value!r:.80}, not a (sum, count) pair of numbers; return sums, "
        "which the kit adds over ranks and divides once (an accuracy: (correct, samples))"
    )


def _is_number(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return value.numel() == 1 and not value.is_complex()
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


@dataclass(frozen=True)
class BuiltinTask:
    """A task the kit ships: its name, its factory (keyword arguments, as a researcher's), and the
    Options dataclass that declares those arguments as `harness train` flags."""

    name: str
    make: TaskFactory
    Options: type[BaseOptions]
    summary: str
