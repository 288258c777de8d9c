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

from typing import List

import numpy as np


def epoch_permutation(num_samples: int, seed: int, epoch: int) -> np.ndarray:
    """The training order of `epoch`, identical on every rank."""
    return np.random.default_rng([seed, epoch]).permutation(num_samples)


def steps_per_epoch(num_samples: int, world_size: int, local_batch: int) -> int:
    """Full global batches in one epoch (the drop-last policy above)."""
    return num_samples // (world_size * local_batch)


def train_batches(num_samples: int, world_size: int, rank: int, local_batch: int, seed: int,
                  epoch: int) -> List[np.ndarray]:
    """This rank's index batches for `epoch`, in step order."""
    order = epoch_permutation(num_samples, seed, epoch)
    global_batch = world_size * local_batch
    return [order[step * global_batch + rank * local_batch: step * global_batch + (rank + 1) * local_batch]
            for step in range(steps_per_epoch(num_samples, world_size, local_batch))]


def dropped_tail(num_samples: int, world_size: int, local_batch: int, seed: int, epoch: int) -> np.ndarray:
    """Samples no rank sees in `epoch` (fewer than one global batch)."""
    used = steps_per_epoch(num_samples, world_size, local_batch) * world_size * local_batch
    return epoch_permutation(num_samples, seed, epoch)[used:]


def eval_range(num_samples: int, world_size: int, rank: int) -> range:
    """This rank's contiguous block of the evaluation set; blocks differ in size by at most one."""
    base, extra = divmod(num_samples, world_size)
    start = rank * base + min(rank, extra)
    return range(start, start + base + (1 if rank < extra else 0))
