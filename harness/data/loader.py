"""Batches for one rank: index batches from `sharding`, fetched in-process or by worker processes."""

from __future__ import annotations

from typing import Iterator, Sequence, Tuple

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from ..preemption import ignore_preemption_signals
from .arrays import ImageArrays


class _IndexBatches(Dataset):
    """Item i is the whole batch i: workers fetch batches, not samples, so nothing is done per sample."""

    def __init__(self, arrays: ImageArrays, batches: Sequence[np.ndarray]) -> None:
        self.arrays, self.batches = arrays, batches

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, i: int) -> Tuple[torch.Tensor, torch.Tensor]:
        return self.arrays.fetch(self.batches[i])


def iterate_batches(arrays: ImageArrays, batches: Sequence[np.ndarray], num_workers: int = 0,
                    pin_memory: bool = False, prefetch_factor: int = 4) -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
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
    loader = DataLoader(_IndexBatches(arrays, batches), batch_size=None, shuffle=False, num_workers=num_workers,
                        pin_memory=pin_memory, prefetch_factor=prefetch_factor, generator=torch.Generator(),
                        worker_init_fn=ignore_preemption_signals)
    yield from loader
