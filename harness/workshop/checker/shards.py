"""Property 4 of harness check: every epoch the ranks train on disjoint samples that leave out fewer
than one global batch, in a new order each epoch; every evaluation scores each test image once."""

from __future__ import annotations

import collections

from .. import exercise
from .control import CHECK_BATCH
from .observe import Observation
from .todos import Failure


def check_training_data(observations: list[Observation], ranks: int) -> list[Failure]:
    """Property 4, training: disjoint shards covering all but the tail, same steps, a new order every epoch."""
    failures = []
    first = observations[0]
    steps = {observation.rank: len(observation.steps) for observation in observations}
    if len(set(steps.values())) > 1:
        counts = ", ".join(f"rank {rank} {count}" for rank, count in steps.items())
        failures.append(
            Failure(
                "shards",
                f"the ranks took different numbers of optimizer steps ({counts}): "
                "every rank must take the same number",
                ("shard",),
            )
        )
    epochs = [observation.passes("train") for observation in observations]
    if not epochs[0]:
        return failures + [
            Failure("shards", "no rank fetched a training sample from exercise.digits('train', ...)", ("shard",))
        ]
    if len({len(passes) for passes in epochs}) > 1:
        counts = ", ".join(f"rank {rank} {len(passes)}" for rank, passes in enumerate(epochs))
        return failures + [
            Failure(
                "shards", f"the ranks made different numbers of passes over the training data ({counts})", ("shard",)
            )
        ]
    samples = first.args.get("train_samples") if first.args else None
    samples = samples or len(exercise.digits("train"))
    global_batch = ranks * (first.args.get("batch_size", CHECK_BATCH) if first.args else CHECK_BATCH)
    failures += _shard_failures(epochs, samples, global_batch)
    if len(epochs[0]) > 1 and not failures:
        failures += _reshuffle_failures(epochs, ranks)
    return failures


def _shard_failures(epochs: list[list[list[int]]], samples: int, global_batch: int) -> list[Failure]:
    """The first epoch whose shards overlap, or leave out a global batch or more of the samples."""
    for epoch, shards in enumerate(zip(*epochs), 1):
        counts = collections.Counter(index for shard in shards for index in shard)
        repeated = [index for index, count in counts.items() if count > 1]
        if repeated:
            owners = [rank for rank, shard in enumerate(shards) if repeated[0] in shard]
            same = all(shard == shards[0] for shard in shards)
            how = (
                "every rank trained on the same samples"
                if same
                else f"{len(repeated)} training samples were trained on more than once (sample {repeated[0]} by "
                f"rank{'s' if len(owners) > 1 else ''} {', '.join(map(str, owners))})"
            )
            return [
                Failure(
                    "shards",
                    f"in epoch {epoch} {how}: each rank must train on its own part of the epoch's samples",
                    ("shard",),
                )
            ]
        unseen = samples - len(counts)
        if unseen >= global_batch:
            return [
                Failure(
                    "shards",
                    f"in epoch {epoch} {unseen} of the {samples} training samples were "
                    f"trained on by no rank; only the fewer than {global_batch} after the "
                    "last full global batch may be left out",
                    ("shard",),
                )
            ]
    return []


def _reshuffle_failures(epochs: list[list[list[int]]], ranks: int) -> list[Failure]:
    """Epoch 2 in exactly epoch 1's order, on any rank."""
    repeating = [rank for rank, passes in enumerate(epochs) if passes[1] == passes[0]]
    if not repeating:
        return []
    who = "every rank" if len(repeating) == ranks else f"rank {', '.join(map(str, repeating))}"
    return [
        Failure(
            "reshuffle",
            f"{who} trained epoch 2 in exactly the order of epoch 1: the data must be reshuffled every epoch",
            ("reshuffle",),
        )
    ]


def check_evaluation(observations: list[Observation]) -> list[Failure]:
    """Property 4, evaluation: every test image scored exactly once per evaluation."""
    evaluations = [observation.passes("test") for observation in observations]
    size = len(exercise.digits("test"))
    if not any(evaluations):
        return [Failure("evaluation", "no rank scored a test image from exercise.digits('test')", ("eval-shard",))]
    for number in range(max(len(passes) for passes in evaluations)):
        counts = collections.Counter(
            index for passes in evaluations if number < len(passes) for index in passes[number]
        )
        scored = sum(counts.values())
        repeated = [index for index, count in counts.items() if count > 1]
        missing = size - len(counts)
        if not repeated and not missing:
            continue
        if repeated and all(count == counts[repeated[0]] for count in counts.values()) and not missing:
            how = f"scored each of the {size} test images {counts[repeated[0]]} times"
        elif repeated:
            how = (
                f"scored {scored} images for {size}: {len(repeated)} of them more than once (image {repeated[0]} "
                f"{counts[repeated[0]]} times; DistributedSampler pads with repeated images)"
            )
        else:
            how = f"scored {len(counts)} of the {size} test images; {missing} were scored by no rank"
        return [
            Failure(
                "evaluation",
                f"evaluation {number + 1} {how}: every test image must be scored exactly once",
                ("eval-shard",),
            )
        ]
    return []
