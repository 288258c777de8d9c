"""Batches for one rank: index batches from `sharding`, fetched in-process or by worker processes.

The data is anything with a length and `fetch(indices)` (harness.data.indexed.IndexedData); a batch
is what fetch returns, a tensor or a tuple, list or dict of tensors, moved and pinned as a whole.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from ..process.preemption import ignore_preemption_signals
from .batches import Batch, map_tensors


class _IndexBatches(Dataset):
    """Item i is the whole batch i: workers fetch batches, not samples, so nothing is done per sample."""

    def __init__(self, data: Any, batches: Sequence[np.ndarray]) -> None:
        self.data, self.batches = data, batches

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, i: int) -> Batch:
        return self.data.fetch(self.batches[i])


def iterate_batches(
    data: Any,
    batches: Sequence[np.ndarray],
    num_workers: int = 0,
    pin_memory: bool = False,
    prefetch_factor: int = 4,
) -> Iterator[Batch]:
    """Yield `data.fetch(indices)` for each of `batches`, in order.

    With num_workers > 0, worker processes fetch batches in turn and keep `prefetch_factor` batches
    each ready ahead of the training loop; pin_memory puts them in page-locked memory for fast
    asynchronous copies to a GPU. `batches` may be a lazy sequence (sharding.RankSchedule) spanning
    the whole run, so the workers start once. Close the iterator to stop them early.
    """
    if num_workers == 0:
        for indices in batches:
            batch = data.fetch(indices)
            yield map_tensors(batch, torch.Tensor.pin_memory) if pin_memory else batch
        return
    # The loader seeds its workers from its own generator: drawing from torch's global one would
    # shift the dropout masks, and the run would depend on --num-workers.
    # Workers ignore preemption signals: Slurm and PBS signal every process of the job, and the
    # training process must outlive its workers' deaths to finish the step and checkpoint.
    loader = DataLoader(
        _IndexBatches(data, batches),
        batch_size=None,
        shuffle=False,
        num_workers=num_workers,
        pin_memory=pin_memory,
        prefetch_factor=prefetch_factor,
        generator=torch.Generator(),
        worker_init_fn=ignore_preemption_signals,
    )
    yield from loader


def to_device_ahead(batches: Iterable[Batch], device: torch.device) -> Iterator[Batch]:
    """Yield `batches` on `device`. On a GPU the next batch is copied on a side stream while the
    current one computes, so the host-to-device copy (38 MB of uint8 per ResNet-50 batch of 256)
    overlaps the step instead of delaying it; the compute stream waits for its batch's copy only.
    The batches must be in pinned memory (iterate_batches pins them on GPU runs)."""
    iterator = iter(batches)
    try:
        if device.type != "cuda":
            for batch in iterator:
                yield map_tensors(batch, lambda tensor: tensor.to(device))
            return
        copies = torch.cuda.Stream(device)
        compute = torch.cuda.current_stream(device)

        def start(batch: Batch) -> Batch:
            with torch.cuda.stream(copies):
                return map_tensors(batch, lambda tensor: tensor.to(device, non_blocking=True))

        pending = None
        for batch in iterator:
            ready, pending = pending, start(batch)
            if ready is not None:
                yield _handed_over(ready, copies, compute)
        if pending is not None:
            yield _handed_over(pending, copies, compute)
    finally:
        close = getattr(iterator, "close", None)
        if close is not None:  # stops data-loader workers when the run ends early
            close()


def _handed_over(batch: Batch, copies: torch.cuda.Stream, compute: torch.cuda.Stream) -> Batch:
    compute.wait_stream(copies)  # the compute stream waits for this batch's copy, the host does not

    def kept(tensor: torch.Tensor) -> torch.Tensor:
        tensor.record_stream(compute)  # its memory is not reused before the compute stream is done with it
        return tensor

    return map_tensors(batch, kept)
