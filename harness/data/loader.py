"""Batches for one rank: index batches from `sharding`, fetched in-process or by worker processes."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from ..process.preemption import ignore_preemption_signals
from .arrays import ImageArrays


class _IndexBatches(Dataset):
    """Item i is the whole batch i: workers fetch batches, not samples, so nothing is done per sample."""

    def __init__(self, arrays: ImageArrays, batches: Sequence[np.ndarray]) -> None:
        self.arrays, self.batches = arrays, batches

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.arrays.fetch(self.batches[i])


def iterate_batches(
    arrays: ImageArrays,
    batches: Sequence[np.ndarray],
    num_workers: int = 0,
    pin_memory: bool = False,
    prefetch_factor: int = 4,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Yield (uint8 images, labels) for `batches` in order.

    With num_workers > 0, worker processes fetch batches in turn and keep `prefetch_factor` batches
    each ready ahead of the training loop; pin_memory puts them in page-locked memory for fast
    asynchronous copies to a GPU. `batches` may be a lazy sequence (sharding.RankSchedule) spanning
    the whole run, so the workers start once. Close the iterator to stop them early.
    """
    if num_workers == 0:
        for indices in batches:
            images, labels = arrays.fetch(indices)
            yield (images.pin_memory(), labels.pin_memory()) if pin_memory else (images, labels)
        return
    # The loader seeds its workers from its own generator: drawing from torch's global one would
    # shift the dropout masks, and the run would depend on --num-workers.
    # Workers ignore preemption signals: Slurm and PBS signal every process of the job, and the
    # training process must outlive its workers' deaths to finish the step and checkpoint.
    loader = DataLoader(
        _IndexBatches(arrays, batches),
        batch_size=None,
        shuffle=False,
        num_workers=num_workers,
        pin_memory=pin_memory,
        prefetch_factor=prefetch_factor,
        generator=torch.Generator(),
        worker_init_fn=ignore_preemption_signals,
    )
    yield from loader


def to_device_ahead(
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]], device: torch.device
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Yield `batches` on `device`. On a GPU the next batch is copied on a side stream while the
    current one computes, so the host-to-device copy (38 MB of uint8 per ResNet-50 batch of 256)
    overlaps the step instead of delaying it; the compute stream waits for its batch's copy only.
    The batches must be in pinned memory (iterate_batches pins them on GPU runs)."""
    iterator = iter(batches)
    try:
        if device.type != "cuda":
            for images, labels in iterator:
                yield images.to(device), labels.to(device)
            return
        copies = torch.cuda.Stream(device)
        compute = torch.cuda.current_stream(device)

        def start(batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
            with torch.cuda.stream(copies):
                return tuple(tensor.to(device, non_blocking=True) for tensor in batch)  # type: ignore

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


def _handed_over(
    batch: tuple[torch.Tensor, torch.Tensor], copies: torch.cuda.Stream, compute: torch.cuda.Stream
) -> tuple[torch.Tensor, torch.Tensor]:
    compute.wait_stream(copies)  # the compute stream waits for this batch's copy, the host does not
    for tensor in batch:
        tensor.record_stream(compute)  # its memory is not reused before the compute stream is done with it
    return batch
