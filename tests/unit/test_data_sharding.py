"""Sharding: disjoint, complete shards for any world size; exact evaluation blocks; drop-last policy."""

from __future__ import annotations

import numpy as np
import pytest

from harness.data.sharding import (
    RankSchedule,
    dropped_tail,
    epoch_permutation,
    eval_range,
    steps_per_epoch,
    train_batches,
)

# Sizes that 2, 3, 4 and 5 do not divide (97 and 1009 are prime; 301 = 7 x 43).
WORLD_SIZES = [1, 2, 3, 4, 5]
SIZES = [97, 301, 1009]


@pytest.mark.parametrize("num_samples", SIZES)
@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_training_shards_are_disjoint_and_with_the_dropped_tail_cover_the_set(world_size, num_samples):
    local_batch = 4
    for epoch in range(3):
        shards = [
            np.concatenate(train_batches(num_samples, world_size, rank, local_batch, seed=7, epoch=epoch))
            for rank in range(world_size)
        ]
        tail = dropped_tail(num_samples, world_size, local_batch, seed=7, epoch=epoch)
        everything = np.concatenate(shards + [tail])
        assert len(everything) == num_samples and len(np.unique(everything)) == num_samples  # disjoint, complete
        # Drop-last: every rank takes the same number of full steps; fewer than one global batch is skipped.
        assert {len(shard) for shard in shards} == {
            steps_per_epoch(num_samples, world_size, local_batch) * local_batch
        }
        assert len(tail) < world_size * local_batch


@pytest.mark.parametrize("num_samples", SIZES)
@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_evaluation_blocks_score_every_sample_exactly_once(world_size, num_samples):
    blocks = [eval_range(num_samples, world_size, rank) for rank in range(world_size)]
    assert sorted(i for block in blocks for i in block) == list(range(num_samples))
    assert max(len(b) for b in blocks) - min(len(b) for b in blocks) <= 1  # no padding, at most one apart


def test_order_reshuffles_every_epoch_and_depends_only_on_seed_and_epoch():
    assert np.array_equal(epoch_permutation(301, 3, 1), epoch_permutation(301, 3, 1))
    assert not np.array_equal(epoch_permutation(301, 3, 1), epoch_permutation(301, 3, 2))
    assert not np.array_equal(epoch_permutation(301, 3, 1), epoch_permutation(301, 4, 1))
    # A different tail is skipped each epoch, so no sample is left out for good.
    tails = [set(dropped_tail(301, 3, 8, seed=0, epoch=e).tolist()) for e in range(5)]
    assert len(set.union(*tails)) > len(tails[0])


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_a_global_batch_holds_the_same_samples_at_any_world_size(world_size):
    global_batch = 12
    single = train_batches(1009, 1, 0, global_batch, seed=1, epoch=2)
    ranks = [
        train_batches(1009, world_size, r, global_batch // world_size, seed=1, epoch=2) for r in range(world_size)
    ]
    for step, batch in enumerate(single):
        assert np.array_equal(np.concatenate([rank[step] for rank in ranks]), batch)


def test_rank_schedule_spans_epochs_like_train_batches():
    schedule = RankSchedule(301, world_size=3, rank=1, local_batch=8, seed=5, total_steps=30)
    per_epoch = steps_per_epoch(301, 3, 8)  # 12: the run of 30 steps ends inside the third epoch
    expected = [batch for epoch in range(3) for batch in train_batches(301, 3, 1, 8, 5, epoch)][:30]
    assert len(schedule) == 30 and per_epoch == 12
    assert all(np.array_equal(schedule[step], batch) for step, batch in enumerate(expected))
    assert np.array_equal(schedule[3], expected[3])  # random access after the cache moved on
    with pytest.raises(IndexError):
        schedule[30]
