"""Training on each on-disk dataset in-process: loader workers, augmentation, the record's data fields."""

from __future__ import annotations

import pytest

from harness import TrainConfig, train
from tests.helpers.data_files import write_cifar10, write_image_tree


def test_cifar10_with_augmentation(tmp_path):
    write_cifar10(str(tmp_path), per_batch=16)  # 80 training images, 16 test images
    data = {"dataset": "cifar10", "data_dir": str(tmp_path)}
    base = dict(batch_size=8, epochs=2, threads=1, timing_warmup_steps=1)
    plain = train(TrainConfig(task_args=data, **base))
    augmented = train(TrainConfig(task_args={**data, "augment": True}, **base))
    repeat = train(TrainConfig(task_args={**data, "augment": True}, **base))
    assert augmented["steps"] == 20 and augmented["eval_samples"] == 16
    assert augmented["train_losses"] != plain["train_losses"]  # the batches really were augmented
    assert augmented["train_losses"] == repeat["train_losses"]  # and reproducibly so


def test_imagefolder_trains_at_the_prepared_size(tmp_path):
    write_image_tree(str(tmp_path / "train"), ["a", "b", "c"], per_class=6)
    write_image_tree(str(tmp_path / "val"), ["a", "b", "c"], per_class=2)
    record = train(
        TrainConfig(
            task_args={"dataset": "imagefolder", "data_dir": str(tmp_path), "image_size": 16},
            batch_size=6,
            epochs=1,
            threads=1,
            timing_warmup_steps=0,
        )
    )
    assert record["train_set_size"] == 18 and record["eval_samples"] == 6 and record["steps"] == 3
    assert record["config"]["task_args"]["image_size"] == 16 and record["task"]["args"]["image_size"] == 16


@pytest.mark.parametrize(
    "flag, settings", [("--image-size", {"task_args": {"image_size": 0}}), ("--prefetch", {"prefetch": 0})]
)
def test_data_flags_are_validated(flag, settings):
    from harness import UsageError

    with pytest.raises(UsageError, match=f"{flag} must be a positive integer"):
        train(TrainConfig(**settings))
