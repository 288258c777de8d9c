"""Slow storage with an outside clock: data whose every fetch sleeps a known time and logs when.

Tests pass `sleepy_task(...)` to harness.train in-process; under a launcher this file is the program
each rank runs:
    torchrun --nproc-per-node 2 tests/helpers/sleepy_data.py OUT_DIR SLEEP_MS_RANK0,SLEEP_MS_RANK1 [train flags]
Each rank trains with `harness.train` on the sleepy task and writes OUT_DIR/rank<R>.json holding
its record and fetch timestamps.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import os
import sys
import time
from typing import Any

import numpy as np

from harness import Task
from harness.tasks.images import image_task


class SleepyData:
    """Data whose fetches sleep `delay` seconds and append (split, time.time()) to `stamps`."""

    def __init__(self, data: Any, delay: float, split: str, stamps: list[tuple[str, float]]) -> None:
        self.data, self.delay, self.split, self.stamps = data, delay, split, stamps

    def __len__(self) -> int:
        return len(self.data)

    def fetch(self, indices: np.ndarray) -> Any:
        self.stamps.append((self.split, time.time()))
        time.sleep(self.delay)
        return self.data.fetch(indices)


def sleepy_task(train_delay: float, stamps: list[tuple[str, float]]) -> Task:
    """The CNN on synthetic images, `train_delay` s per training batch, test batches undelayed."""
    task = image_task(model="cnn", dataset="synthetic")
    return dataclasses.replace(
        task,
        train_data=SleepyData(task.train_data, train_delay, "train", stamps),
        test_data=SleepyData(task.test_data, 0.0, "test", stamps),
    )


def outside_window_seconds(stamps: list[tuple[str, float]], warmup_steps: int) -> float:
    """Wall time of the timed steps by the dataset's clock: first timed batch fetch to first eval fetch.

    Before the run each rank tries its task on one training and one test batch (harness.training.probe):
    those two fetches are left out. The first timed fetch happens just after the window opens; the
    first fetch of the evaluation that follows training happens just after it closes (batches are
    fetched in-process, in order)."""
    stamps = stamps[2:]
    train_times = [t for split, t in stamps if split == "train"]
    end = next(t for split, t in stamps if split == "test")
    return end - train_times[warmup_steps]


def main(argv: list[str]) -> None:
    from harness.config import OneLineParser
    from harness.process.discovery import detect_cluster
    from harness.training.flags import add_train_flags, config_from_args
    from harness.training.loop import train

    out_dir, delays, train_args = argv[0], [float(ms) / 1000 for ms in argv[1].split(",")], argv[2:]
    rank = detect_cluster().rank
    stamps: list[tuple[str, float]] = []
    parser = OneLineParser(prog="sleepy_data")
    add_train_flags(parser)
    gc.disable()  # a GC pause between a window boundary and the dataset's clock would be the test's error
    record = train(config_from_args(parser.parse_args(train_args)), task=sleepy_task(delays[rank], stamps))
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as handle:
        json.dump({"record": record, "stamps": stamps, "delay": delays[rank]}, handle)


if __name__ == "__main__":
    main(sys.argv[1:])
