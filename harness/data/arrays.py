"""A dataset split held as one uint8 image array (in memory or memory-mapped) plus labels.

Images are decoded once, when a dataset is read or prepared; at train time a batch is one fancy
index into the array and one vectorised normalisation on the device, never a per-sample transform.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch


@dataclass
class ImageArrays:
    """images: uint8 [N, C, H, W]; labels: int64 [N]; per-channel mean and std of images / 255."""

    images: np.ndarray
    labels: np.ndarray
    num_classes: int
    mean: Sequence[float]
    std: Sequence[float]
    length: int = -1  # logical size; larger than len(images) for synthetic data that reuses a pool

    def __post_init__(self) -> None:
        if self.length < 0:
            self.length = len(self.images)

    def __len__(self) -> int:
        return self.length

    @property
    def shape(self) -> tuple[int, int, int]:
        """(channels, height, width) of one image."""
        return tuple(self.images.shape[1:])  # type: ignore[return-value]

    def fetch(self, indices: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """uint8 images and int64 labels of `indices`, as CPU tensors (a worker process may call this)."""
        rows = np.sort(indices) if isinstance(self.images, np.memmap) else indices
        if self.length != len(self.images):
            rows = rows % len(self.images)
        return torch.from_numpy(np.ascontiguousarray(self.images[rows])), torch.from_numpy(self.labels[rows])

    def __getstate__(self) -> dict[str, Any]:
        # Loader workers started by spawn or forkserver (the default from Python 3.14) get the dataset
        # pickled: a memory-mapped array travels as its file and reopens there, not as a full copy.
        state = dict(self.__dict__)
        if isinstance(self.images, np.memmap) and self.images.filename:
            state["images"] = _MappedFile(
                str(self.images.filename), self.images.offset, self.images.dtype.str, tuple(self.images.shape)
            )
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        if isinstance(state["images"], _MappedFile):
            state["images"] = state["images"].open()
        self.__dict__.update(state)

    def normaliser(self, device: torch.device) -> Normaliser:
        """The uint8 -> float transform of this dataset, placed on `device`."""
        return Normaliser(self.mean, self.std, device)


@dataclass(frozen=True)
class _MappedFile:
    path: str
    offset: int
    dtype: str
    shape: tuple[int, ...]

    def open(self) -> np.memmap:
        return np.memmap(self.path, dtype=self.dtype, mode="r", offset=self.offset, shape=self.shape)


class Normaliser:
    """(x / 255 - mean) / std per channel, as one fused multiply-add on the device."""

    def __init__(self, mean: Sequence[float], std: Sequence[float], device: torch.device) -> None:
        std_t = torch.tensor(std, dtype=torch.float32, device=device).view(1, -1, 1, 1)
        mean_t = torch.tensor(mean, dtype=torch.float32, device=device).view(1, -1, 1, 1)
        self.scale = 1.0 / (255.0 * std_t)
        self.shift = -mean_t / std_t

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        return torch.addcmul(self.shift, images.float(), self.scale)
