"""A batch is whatever a task's data fetches: a tensor, or tuples, lists and dicts of tensors (other
values ride along untouched). The loop needs four things of any such batch, done here: how many
samples it holds, a slice of its samples (a micro-batch), a copy on a device, and pinned memory.

Every tensor of a batch with at least one dimension holds one row per sample (dimension 0), so a
slice of the samples is the same slice of each of them; `check_batch` says so in one line when a
task's batch breaks that rule.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Callable

import torch

from ..errors import UsageError

Batch = Any


def map_tensors(batch: Batch, function: Callable[[torch.Tensor], torch.Tensor]) -> Batch:
    """`batch` with `function` applied to each of its tensors, its structure kept (a named tuple too)."""
    if isinstance(batch, torch.Tensor):
        return function(batch)
    if isinstance(batch, Mapping):
        return type(batch)({key: map_tensors(value, function) for key, value in batch.items()})  # type: ignore[call-arg]
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a named tuple takes its fields as arguments
        return type(batch)(*(map_tensors(value, function) for value in batch))
    if isinstance(batch, (tuple, list)):
        return type(batch)(map_tensors(value, function) for value in batch)
    return batch


def tensors_of(batch: Batch) -> list[torch.Tensor]:
    """Every tensor of `batch`, in the order map_tensors visits them."""
    found: list[torch.Tensor] = []

    def collect(tensor: torch.Tensor) -> torch.Tensor:
        found.append(tensor)
        return tensor

    map_tensors(batch, collect)
    return found


def batch_samples(batch: Batch) -> int:
    """The number of samples in `batch`: the rows of its first tensor that has dimensions."""
    for tensor in tensors_of(batch):
        if tensor.dim() > 0:
            return tensor.shape[0]
    raise UsageError("a batch holds no tensor with a sample dimension; fetch returns tensors of [samples, ...]")


def slice_batch(batch: Batch, start: int, stop: int) -> Batch:
    """Samples start..stop-1 of `batch` (views, no copy); a tensor without dimensions stays whole."""
    return map_tensors(batch, lambda tensor: tensor[start:stop] if tensor.dim() > 0 else tensor)


def batch_to(batch: Batch, device: torch.device, non_blocking: bool = False) -> Batch:
    """`batch` with every tensor on `device`."""
    return map_tensors(batch, lambda tensor: tensor.to(device, non_blocking=non_blocking))


def pin_batch(batch: Batch) -> Batch:
    """`batch` with every tensor in page-locked memory (for asynchronous copies to a GPU)."""
    return map_tensors(batch, lambda tensor: tensor.pin_memory())


def check_batch(batch: Batch, expected: int) -> None:
    """Raise UsageError unless every tensor with dimensions in `batch` holds `expected` samples."""
    shapes = [tuple(tensor.shape) for tensor in tensors_of(batch)]
    rows = {shape[0] for shape in shapes if shape}
    if not shapes:
        raise UsageError(f"a batch of {expected} indices holds no tensor; fetch must return tensors")
    if rows != {expected}:
        raise UsageError(
            f"a batch of {expected} indices holds tensors of shapes {', '.join(map(str, shapes))}; every "
            f"tensor must have one row per sample ({expected} on dimension 0)"
        )


def describe_batch(batch: Batch) -> str:
    """The shapes and dtypes of a batch's tensors, e.g. "[16, 1, 28, 28] float32, [16] int64"."""
    return (
        ", ".join(f"{list(t.shape)} {str(t.dtype).replace('torch.', '')}" for t in tensors_of(batch)) or "no tensors"
    )
