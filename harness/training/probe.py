"""A task tried on one batch on every rank before any process group starts.

A task the kit has never seen can fail in ways no check of its parts finds: a batch the model
cannot take, a loss that is not a scalar or is NaN, a loss that reaches no parameter, a metric that
cannot be summed. Found in the first training step, such a failure on one rank would leave its
peers waiting in a collective until --timeout. So each rank first runs its own first micro-batch
forward and backward, and its evaluation on a few test samples, and a failure is a UsageError
(exit status 2) that names the task, the rank and the fix, before any rank waits for another.

The probe leaves no trace in the run: random state forked (dropout draws nothing from the run's
generators), the model's buffers (batch-norm statistics) put back, its gradients cleared.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any, Callable

import torch
from torch import nn

from ..data.batches import Batch, check_batch, describe_batch
from ..errors import UsageError, first_line
from ..tasks.loading import LoadedTask
from ..tasks.task import batch_scores, loss_and_count

PROBED_TEST_SAMPLES = 4


def probe_training(
    loaded: LoadedTask,
    model: nn.Module,
    batch: Batch,
    samples: int,
    prepare: Callable[[Batch], Batch],
    autocast: Callable[[], Any],
    where: str,
) -> list[str]:
    """Forward and backward of one micro-batch (`batch`, fetched for `samples` indices, on the CPU);
    the names of the parameters that got no gradient. Raises UsageError naming `where` (the rank)."""
    label = f"{loaded.label}{where}"
    check_parameters(model, label)
    _checked(lambda: check_batch(batch, samples), label, "train_data.fetch")
    with _untouched(model):
        prepared = _checked(lambda: prepare(batch), label, "prepare_batch")
        with autocast():
            loss, _ = _checked(
                lambda: loss_and_count(loaded.task, model, prepared, label), label, "the model or loss", prepared
            )
        if not math.isfinite(loss.item()):
            raise UsageError(
                f"{label}: the loss is {loss.item()} on the first training batch; fix the model's initialisation, "
                "the loss, or the data (the batch holds " + describe_batch(prepared) + ")"
            )
        if not loss.requires_grad:
            raise UsageError(
                f"{label}: the loss does not depend on the model's parameters; compute it from model(batch)"
            )
        _checked(loss.backward, label, "backward of the loss")
        unused = [
            name for name, parameter in model.named_parameters() if parameter.requires_grad and parameter.grad is None
        ]
    if len(unused) == sum(1 for parameter in model.parameters() if parameter.requires_grad):
        raise UsageError(f"{label}: the loss reaches none of the model's parameters; compute it from model(batch)")
    return unused


def probe_evaluation(
    loaded: LoadedTask,
    model: nn.Module,
    batch: Batch,
    prepare: Callable[[Batch], Batch],
    autocast: Callable[[], Any],
    where: str,
) -> list[str]:
    """One evaluation batch of a few test samples: the names of the sums the evaluation reduces."""
    label = f"{loaded.label}{where}"
    with _untouched(model), torch.no_grad():
        model.eval()
        prepared = _checked(lambda: prepare(batch), label, "prepare_batch")
        with autocast():
            scores = _checked(
                lambda: batch_scores(loaded.task, model, prepared, label),
                label,
                "the model, loss or metrics",
                prepared,
            )
    return sorted(scores)


def check_parameters(model: Any, label: str) -> None:
    """Raise UsageError unless `model` is a module with parameters to train."""
    if not isinstance(model, nn.Module):
        raise UsageError(f"{label}: build_model returned a {type(model).__name__}, not a torch.nn.Module")
    parameters = list(model.parameters())
    if not parameters:
        raise UsageError(
            f"{label}: build_model returned a {type(model).__name__} without parameters; a backend has nothing to train"
        )
    if not any(parameter.requires_grad for parameter in parameters):
        raise UsageError(f"{label}: none of the model's parameters requires a gradient; nothing would train")


def _checked(call: Callable[[], Any], label: str, what: str, batch: Batch = None) -> Any:
    """`call()`, an exception from the task's code turned into one line naming `what` failed."""
    try:
        return call()
    except UsageError as exc:
        # A check of the kit's own (check_batch) names what is wrong, not whose task it is.
        if str(exc).startswith(label):
            raise
        raise UsageError(f"{label}: {exc}") from None
    except Exception as exc:
        held = f"; the batch holds {describe_batch(batch)}" if batch is not None else ""
        raise UsageError(
            f"{label}: {what} failed on the first batch ({type(exc).__name__}: {first_line(exc)}){held}"
        ) from None


@contextlib.contextmanager
def _untouched(model: nn.Module) -> Iterator[None]:
    """The probe's effects undone: random state, buffers, gradients and the training mode."""
    devices = sorted({buffer.device.index or 0 for buffer in model.parameters() if buffer.device.type == "cuda"})
    buffers = {name: buffer.detach().clone() for name, buffer in model.named_buffers()}
    training = model.training
    try:
        with torch.random.fork_rng(devices=devices):
            yield
    finally:
        with torch.no_grad():
            for name, buffer in model.named_buffers():
                if name in buffers:
                    buffer.copy_(buffers[name])
        for parameter in model.parameters():
            parameter.grad = None
        model.train(training)


def check_unused_alike(backend: Any, model: nn.Module, unused: list[str], world_size: int, label: str) -> None:
    """Under a backend whose ranks must reach the same parameters (Backend.reaches_same_parameters),
    raise UsageError on every rank if the ranks' first batches left different parameters unused:
    one allreduce of a flag per parameter, right after the process group forms."""
    if not backend.reaches_same_parameters:
        return
    names = [name for name, parameter in model.named_parameters() if parameter.requires_grad]
    flags = torch.tensor([float(name in unused) for name in names], dtype=torch.float64)
    counts = backend.all_reduce_sum(flags.to(next(model.parameters()).device)).tolist()
    uneven = [name for name, count in zip(names, counts) if 0 < count < world_size]
    if uneven:
        raise UsageError(
            f"{label}: parameters {', '.join(uneven[:5])}{' ...' if len(uneven) > 5 else ''} got no gradient on "
            f"some ranks' first batch and one on others'; backend {backend.name!r} needs every rank to reach the "
            "same parameters in every step (use ddp with --ddp-find-unused-parameters, horovod, or deepspeed "
            "--zero-stage 0)"
        )
