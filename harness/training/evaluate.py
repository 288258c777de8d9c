"""Exact evaluation over the ranks: each test sample scored once, the task's sums reduced once.

The testing phase was the scaling bottleneck of the workshop case study (one process scored the
whole set). Here every rank scores its own contiguous block of the test set (no padding, no
sample twice) and the task's sums and counts are reduced in one allreduce, then divided once, so
the loss, every metric and `eval_samples` are the same at any world size. Where the model's forward
gathers sharded weights (ZeRO-3, FSDP: Backend.forward_gathers), each rank evaluates its own shards
and the ranks stay in step: a rank with a batch fewer runs one more forward, uncounted, so that no
rank holds the whole model to evaluate it. An `Evaluation` is what
the training loop calls after an epoch, and what `harness evaluate` (harness.training.score) calls
on a saved model.

Every rank evaluates rank 0's model: weights are the same on every rank, but buffers such as
batch-norm statistics are each rank's own during training (no backend synchronises them), so they
are lent from rank 0 for the evaluation and put back after it. The saved model is rank 0's too.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np
import torch
from torch import nn

from ..backends import Backend
from ..backends.precision import Precision
from ..data.batches import Batch, batch_samples, batch_to
from ..data.indexed import IndexedData
from ..data.loader import iterate_batches
from ..data.sharding import eval_range
from ..errors import UsageError
from ..process.discovery import ClusterEnv
from ..tasks.loading import LoadedTask
from ..tasks.task import LOSS_KEY, batch_scores
from .probe import PROBED_TEST_SAMPLES, probe_evaluation


@dataclass
class Evaluation:
    """How a run evaluates: the task, its test data, how a batch is prepared on the device, the
    batch size, and the names of the sums the task reports (every rank reduces the same ones)."""

    loaded: LoadedTask
    data: IndexedData
    prepare: Callable[[Batch], Batch]
    batch_size: int
    names: list[str]
    precision: Precision = Precision.of("fp32")

    @torch.no_grad()
    def __call__(
        self, model: nn.Module, backend: Backend, cluster: ClusterEnv, device: torch.device
    ) -> dict[str, Any]:
        """`eval_loss`, `eval_<metric>` for every metric and `eval_samples` over the whole test set,
        each sample scored exactly once across ranks."""
        was_training = model.training
        model.eval()
        size, ranks = len(self.data), cluster.world_size
        batches = self._batches(eval_range(size, ranks, cluster.rank))
        # A forward that gathers weights is a collective: a rank with fewer batches than rank 0 (whose
        # block is the largest) runs as many more forwards, on samples it does not count.
        unscored = len(self._batches(eval_range(size, ranks, 0))) - len(batches) if backend.forward_gathers else 0
        # Per name: (sum, count); then the samples. float64 on the device, one allreduce.
        totals = torch.zeros(2 * len(self.names) + 1, dtype=torch.float64, device=device)
        with rank0_buffers(model, backend, cluster.rank):
            for batch in iterate_batches(self.data, batches):
                prepared = self.prepare(batch_to(batch, device))
                scores = self._scores(model, prepared, device)
                for position, name in enumerate(self.names):
                    total, count = scores[name]
                    totals[2 * position] += torch.as_tensor(total, dtype=torch.float64, device=device).reshape(())
                    totals[2 * position + 1] += float(count)
                totals[-1] += batch_samples(prepared)
            for batch in iterate_batches(self.data, [np.arange(min(size, self.batch_size))] * unscored):
                self._scores(model, self.prepare(batch_to(batch, device)), device)
            backend.after_evaluation()
            reduced = backend.all_reduce_sum(totals).tolist()
        model.train(was_training)
        means = {
            name: reduced[2 * position] / reduced[2 * position + 1] if reduced[2 * position + 1] else None
            for position, name in enumerate(self.names)
        }
        derived = self.derived(means)
        return {
            **{f"eval_{name}": value for name, value in {**means, **derived}.items()},
            "eval_samples": int(reduced[-1]),
        }

    def _batches(self, block: range) -> list[np.ndarray]:
        """`block`'s samples in batches of batch_size, the last one shorter."""
        return [np.arange(start, min(start + self.batch_size, block.stop)) for start in block[:: self.batch_size]]

    def _scores(self, model: nn.Module, prepared: Batch, device: torch.device) -> dict[str, Any]:
        """The task's (sum, count) per name on one prepared batch."""
        with self.precision.autocast(device):
            scores = batch_scores(self.loaded.task, model, prepared, self.loaded.label)
        if sorted(scores) != self.names:
            raise UsageError(
                f"{self.loaded.label}: metrics returned {', '.join(sorted(scores))} on one batch and "
                f"{', '.join(self.names)} on another; return the same names for every batch"
            )
        return scores

    def derived(self, means: dict[str, Optional[float]]) -> dict[str, float]:
        """The task's derived metrics of the reduced means (none where a mean is missing)."""
        derive = self.loaded.task.derived_metrics
        if derive is None or None in means.values():
            return {}
        derived = {str(name): float(value) for name, value in derive(means).items()}
        clash = sorted(set(derived) & set(means))
        if clash:
            raise UsageError(
                f"{self.loaded.label}: derived_metrics returned {clash[0]!r}, which metrics gives already; rename one"
            )
        return derived


@contextlib.contextmanager
def rank0_buffers(model: nn.Module, backend: Backend, rank: int) -> Iterator[None]:
    """`model`'s buffers replaced by rank 0's (one allreduce of them all), then put back. A model
    without buffers costs nothing; on one rank the sum is the rank's own."""
    buffers = [buffer for buffer in model.buffers() if buffer.numel()]
    if not buffers:
        yield
        return
    own = [buffer.detach().clone() for buffer in buffers]
    flat = torch.cat([buffer.detach().double().reshape(-1) for buffer in buffers])
    if rank != 0:
        flat.zero_()  # the sum over ranks is rank 0's values, exactly (float64 holds float32 and counts)
    flat = backend.all_reduce_sum(flat)
    try:
        with torch.no_grad():
            for buffer, values in zip(buffers, flat.split([buffer.numel() for buffer in buffers])):
                buffer.copy_(values.reshape(buffer.shape))
        yield
    finally:
        with torch.no_grad():
            for buffer, saved in zip(buffers, own):
                buffer.copy_(saved)


def make_evaluation(
    loaded: LoadedTask,
    data: Optional[IndexedData],
    model: nn.Module,
    prepare: Callable[[Batch], Batch],
    batch_size: int,
    precision: Precision,
    where: str,
) -> Optional[Evaluation]:
    """The run's evaluation (None without test data), its names probed on a few test samples."""
    if data is None:
        return None
    device = next(model.parameters()).device
    probe = batch_to(data.fetch(np.arange(min(PROBED_TEST_SAMPLES, len(data)))), device)
    names = probe_evaluation(loaded, model, probe, prepare, lambda: precision.autocast(device), where)
    if LOSS_KEY not in names:  # batch_scores always gives one; a sum of its own would be a task's bug
        raise UsageError(f"{loaded.label}: the evaluation has no loss")
    return Evaluation(loaded, data, prepare, batch_size, names, precision)


def evaluation_line(evaluation: dict[str, Any]) -> str:
    """ "eval loss 0.3141 accuracy 91.25%": the loss, then each metric (a fraction as a percentage)."""
    parts = [f"eval loss {evaluation['eval_loss']:.4f}"]
    for key, value in evaluation.items():
        if key.startswith("eval_") and key not in ("eval_loss", "eval_samples") and value is not None:
            name = key[len("eval_") :]
            parts.append(f"{name} {100 * value:.2f}%" if name == "accuracy" else f"{name} {value:.4g}")
    return " ".join(parts)
