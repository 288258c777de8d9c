"""Which samples each rank sees: pure functions of (dataset size, world, rank, seed, epoch).

Training: every epoch draws one permutation of the whole training set from (seed, epoch), the same
on every rank, whatever the backend or launcher. Global step s takes the G = world x local_batch
samples perm[s*G:(s+1)*G]; rank r gets the r-th slice of b = local_batch of them. So the global
batch of a step holds the same samples at any world size, and one process with batch G computes
the same gradient as G/b ranks with batch b.

Drop-last policy: the N mod G samples left over after the last full global batch are skipped for
that epoch (every rank must take the same number of steps, and a short batch would change the
gradient's weighting). The permutation changes every epoch, so a different tail is skipped each
time; within an epoch the shards are disjoint and, with the skipped tail, cover the set exactly.

Evaluation: the set is split into `world` contiguous blocks whose sizes differ by at most one,
with no padding, so every sample is scored exactly once.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def epoch_permutation(num_samples: int, seed: int, epoch: int) -> np.ndarray:
    """The training order of `epoch`, identical on every rank."""
    return np.random.default_rng([seed, epoch]).permutation(num_samples)


def steps_per_epoch(num_samples: int, world_size: int, local_batch: int) -> int:
    """Full global batches in one epoch (the drop-last policy above)."""
    return num_samples // (world_size * local_batch)


def rank_slice(order: np.ndarray, step: int, world_size: int, rank: int, local_batch: int) -> np.ndarray:
    """This rank's part of global batch `step` (counted within the epoch) of the epoch order `order`."""
    start = (step * world_size + rank) * local_batch
    return order[start : start + local_batch]


def train_batches(
    num_samples: int, world_size: int, rank: int, local_batch: int, seed: int, epoch: int
) -> list[np.ndarray]:
    """This rank's index batches for `epoch`, in step order."""
    order = epoch_permutation(num_samples, seed, epoch)
    return [
        rank_slice(order, step, world_size, rank, local_batch)
        for step in range(steps_per_epoch(num_samples, world_size, local_batch))
    ]


class RankSchedule(Sequence[np.ndarray]):
    """This rank's index batches for global steps first_step..total_steps-1, across epochs, built on demand.

    Item i is the batch of global step s = first_step + i: train_batches(..., epoch)[s mod
    steps_per_epoch] for epoch s // steps_per_epoch. A loader iterates it once for the whole run,
    so its worker processes start once, not per epoch; a resumed run starts at its checkpoint's step.
    """

    def __init__(
        self,
        num_samples: int,
        world_size: int,
        rank: int,
        local_batch: int,
        seed: int,
        total_steps: int,
        first_step: int = 0,
    ) -> None:
        self.num_samples, self.world_size, self.rank = num_samples, world_size, rank
        self.local_batch, self.seed, self.total_steps = local_batch, seed, total_steps
        self.first_step = first_step
        self.epoch_steps = steps_per_epoch(num_samples, world_size, local_batch)
        self._order: tuple[int, np.ndarray] = (-1, np.empty(0, dtype=np.int64))  # (epoch, permutation) cache

    def __len__(self) -> int:
        return self.total_steps - self.first_step

    def __getitem__(self, index):  # type: ignore[override]
        if not 0 <= index < len(self):
            raise IndexError(index)
        step = self.first_step + index
        epoch, within = divmod(step, self.epoch_steps)
        if self._order[0] != epoch:
            self._order = (epoch, epoch_permutation(self.num_samples, self.seed, epoch))
        return rank_slice(self._order[1], within, self.world_size, self.rank, self.local_batch)


def dropped_tail(num_samples: int, world_size: int, local_batch: int, seed: int, epoch: int) -> np.ndarray:
    """Samples no rank sees in `epoch` (fewer than one global batch)."""
    used = steps_per_epoch(num_samples, world_size, local_batch) * world_size * local_batch
    return epoch_permutation(num_samples, seed, epoch)[used:]


def eval_range(num_samples: int, world_size: int, rank: int) -> range:
    """This rank's contiguous block of the evaluation set; blocks differ in size by at most one."""
    base, extra = divmod(num_samples, world_size)
    start = rank * base + min(rank, extra)
    return range(start, start + base + (1 if rank < extra else 0))
