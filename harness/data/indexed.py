"""What any data must be for the kit to shard it: a length and a fetch of a batch by indices.

The sampler (harness.data.sharding) deals indices to the ranks; the loader (harness.data.loader)
asks the data for a whole batch at once, `fetch(indices)`, in the training process or in worker
processes. Arrays answer that with one fancy index (harness.data.arrays.ImageArrays does). A plain
map-style `torch.utils.data.Dataset` is accepted as it is: `as_indexed` wraps it, fetching its
samples one by one (or through its `__getitems__`, where it has one) and collating them with
torch's `default_collate`, as a DataLoader would.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import numpy as np
from torch.utils.data import IterableDataset, default_collate

from ..errors import UsageError


@runtime_checkable
class IndexedData(Protocol):
    """Data the kit can shard: `len(data)` samples, and `data.fetch(indices)` returns the batch of
    those samples (a tensor, or a tuple, list or dict of tensors with one row per sample)."""

    def __len__(self) -> int: ...

    def fetch(self, indices: np.ndarray) -> Any: ...


class DatasetAdapter:
    """A map-style dataset (`__len__` and `__getitem__`) as IndexedData."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def fetch(self, indices: np.ndarray) -> Any:
        rows = [int(index) for index in indices]
        batched = getattr(self.dataset, "__getitems__", None)
        samples = batched(rows) if batched is not None else [self.dataset[row] for row in rows]
        return default_collate(samples)

    def __repr__(self) -> str:
        return f"{type(self.dataset).__name__} ({len(self)} samples)"


def as_indexed(data: Any, what: str) -> IndexedData:
    """`data` as IndexedData: itself if it fetches by indices, a DatasetAdapter for a map-style
    dataset; anything else raises UsageError naming `what` (e.g. "task 'my.py:make' train_data")."""
    if isinstance(data, IterableDataset):
        raise UsageError(
            f"{what} is an IterableDataset, which has no indices to shard exactly; give a map-style dataset "
            "(__len__ and __getitem__) or an object with __len__ and fetch(indices)"
        )
    if hasattr(data, "fetch") and hasattr(data, "__len__"):
        return data
    if hasattr(data, "__getitem__") and hasattr(data, "__len__"):
        return DatasetAdapter(data)
    raise UsageError(
        f"{what} is a {type(data).__name__}, which has no length and fetch by index; give a map-style "
        "dataset (__len__ and __getitem__) or an object with __len__ and fetch(indices)"
    )


def data_name(data: Any) -> str:
    """A short name of a dataset for the record: its class, or the class it adapts."""
    return type(data.dataset if isinstance(data, DatasetAdapter) else data).__name__
