"""Batches for one rank: index batches from `sharding`, fetched in-process or by worker processes."""

from __future__ import annotations

from typing import Iterator, List, Tuple

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from .arrays import ImageArrays


class _IndexBatches(Dataset):
    """Item i is the whole batch i: workers fetch batches, not samples, so nothing is done per sample."""

    def __init__(self, arrays: ImageArrays, batches: List[np.ndarray]) -> None:
        self.arrays, self.batches = arrays, batches

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, i: int) -> Tuple[torch.Tensor, torch.Tensor]:
        return self.arrays.fetch(self.batches[i])


def iterate_batches(arrays: ImageArrays, batches: List[np.ndarray], num_workers: int = 0,
                    pin_memory: bool = False, prefetch_factor: int = 4) -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
    """Yield (uint8 images, labels) for `batches` in order; workers prefetch ahead when num_workers > 0."""
    if num_workers == 0:
        for indices in batches:
            images, labels = arrays.fetch(indices)
            yield (images.pin_memory(), labels.pin_memory()) if pin_memory else (images, labels)
        return
    loader = DataLoader(_IndexBatches(arrays, batches), batch_size=None, shuffle=False, num_workers=num_workers,
                        pin_memory=pin_memory, prefetch_factor=prefetch_factor, persistent_workers=False)
    yield from loader
