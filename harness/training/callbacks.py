"""Watching a run while it trains: `harness.train(config, callbacks=[...])`.

Callbacks are passed as a keyword of `train`, not as a config field, so flags, records and
checkpoints stay plain data. Subclass `Callback` and override the events you need. Every rank calls
every event, in the same order:

- `on_step_end(StepEnd)`: right after each optimizer step, *inside the timed window* (its time is
  counted as "other" in the step breakdown). It must not start collectives: a preemption vote may
  be in flight then. `event.loss` is this rank's loss on the device; reading it (`.item()`) waits
  for the device, which costs overlap on a GPU.
- `on_epoch_end(EpochEnd)`: after the epoch's metrics are reduced over ranks and the evaluation
  (if any) is done, outside the timed window, at the same point on every rank: it may run
  collectives of its own (torch.distributed, Horovod) as long as every rank runs the same ones.
- `on_train_end(record)`: with the finished record, before it is written; every rank gets the same
  record. It may run collectives, as on_epoch_end.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class StepEnd:
    """One optimizer step has finished on this rank."""

    step: int  # optimizer steps done so far in the run (1 after the first)
    epoch: int  # 0-based epoch the step belongs to
    loss: torch.Tensor  # this rank's mean training loss of the step, on the device (not reduced)
    lr: float  # the LR the step used
    samples: int  # samples this rank trained on in the step (all micro-batches)
    rank: int


@dataclass(frozen=True)
class EpochEnd:
    """An epoch has finished; its metrics are global (reduced over ranks)."""

    epoch: int  # 0-based
    step: int  # optimizer steps done so far in the run
    train_loss: float  # mean over every sample of the epoch on every rank
    lr: float  # the LR of the epoch's last step
    evaluation: Optional[dict[str, Any]]  # eval_loss, eval_accuracy, eval_samples if evaluated now
    throughput: Optional[float]  # samples/s over all ranks in the epoch's timed window
    rank: int
    world_size: int


class Callback:
    """Base class: every event does nothing until overridden."""

    def on_step_end(self, event: StepEnd) -> None:
        """After every optimizer step (inside the timed window; no collectives)."""

    def on_epoch_end(self, event: EpochEnd) -> None:
        """After every epoch (outside the timed window; collectives allowed, the same on every rank)."""

    def on_train_end(self, record: dict[str, Any]) -> None:
        """With the finished record, before rank 0 writes it."""


class CallbackList(Callback):
    """Several callbacks called in order, as one."""

    def __init__(self, callbacks: Sequence[Callback]) -> None:
        for callback in callbacks:
            if not isinstance(callback, Callback):
                raise TypeError(f"callbacks must be harness.Callback instances, got {type(callback).__name__}")
        self.callbacks = list(callbacks)

    def on_step_end(self, event: StepEnd) -> None:
        for callback in self.callbacks:
            callback.on_step_end(event)

    def on_epoch_end(self, event: EpochEnd) -> None:
        for callback in self.callbacks:
            callback.on_epoch_end(event)

    def on_train_end(self, record: dict[str, Any]) -> None:
        for callback in self.callbacks:
            callback.on_train_end(record)
