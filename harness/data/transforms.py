"""Augmentation of a training batch of images on the device (the `images` task applies it before
normalising, harness.tasks.images).

It acts on the whole batch at once (a few tensor ops), never per sample. Augmentation is the
standard CIFAR recipe, a random 32x32 crop of the image padded by 4 zero pixels and a horizontal
flip with probability 1/2, the same as torchvision's RandomCrop(padding=4) + RandomHorizontalFlip.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

CROP_PADDING = 4


class RandomCropFlip:
    """Random crop (zero padding) and horizontal flip of a uint8 batch, on the batch's device.

    The random draws of a step are made for the whole global batch from (seed, epoch, step) and
    each rank takes its own slice, just as it takes its slice of the samples (see `sharding`). So
    a sample's augmentation does not depend on the world size or the backend, and a resumed run
    that replays (seed, epoch, step) replays the same augmentation.
    """

    def __init__(self, seed: int, rank: int, world_size: int, local_batch: int, padding: int = CROP_PADDING) -> None:
        self.seed, self.rank, self.world_size, self.local_batch = seed, rank, world_size, local_batch
        self.padding = padding

    def draws(self, epoch: int, step: int) -> np.ndarray:
        """This rank's [local_batch, 3] draws: vertical offset, horizontal offset, flip (0 or 1)."""
        rng = np.random.default_rng([self.seed, epoch, step])
        global_draws = rng.integers(
            0, [2 * self.padding + 1, 2 * self.padding + 1, 2], size=(self.world_size * self.local_batch, 3)
        )
        return global_draws[self.rank * self.local_batch : (self.rank + 1) * self.local_batch]

    def __call__(self, images: torch.Tensor, epoch: int, step: int) -> torch.Tensor:
        batch, channels, height, width = images.shape
        draws = torch.from_numpy(self.draws(epoch, step)[:batch])
        if images.is_cuda:  # from pinned memory the copy does not wait for the GPU's queue
            draws = draws.pin_memory()
        draws = draws.to(images.device, non_blocking=True)
        top, left, flip = draws[:, 0:1], draws[:, 1:2], draws[:, 2:3].bool()
        padded = F.pad(images, (self.padding,) * 4)
        rows = top + torch.arange(height, device=images.device)  # [batch, height] rows of the padded image
        columns = torch.arange(width, device=images.device).expand(batch, width)
        columns = left + torch.where(flip, width - 1 - columns, columns)  # a flip reads the crop right to left
        # One gather does crop and flip for the whole batch: out[b, c, i, j] = padded[b, c, rows[b, i], cols[b, j]].
        return padded[
            torch.arange(batch, device=images.device)[:, None, None, None],
            torch.arange(channels, device=images.device)[None, :, None, None],
            rows[:, None, :, None],
            columns[:, None, None, :],
        ]
