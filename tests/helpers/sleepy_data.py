"""Slow storage with an outside clock: a dataset whose every fetch sleeps a known time and logs when.

Tests register it in-process; under a launcher this file is the program each rank runs:
    torchrun --nproc-per-node 2 tests/helpers/sleepy_data.py OUT_DIR SLEEP_MS_RANK0,SLEEP_MS_RANK1 [train flags]
Each rank trains with `harness.train` on dataset "sleepy" and writes OUT_DIR/rank<R>.json holding
its record and fetch timestamps.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import os
import sys
import time
from typing import Callable

import numpy as np
import torch

from harness.data import DATASETS, DataOptions, ImageArrays
from harness.data.builtin import load_synthetic


class SleepyArrays(ImageArrays):
    """Synthetic data whose fetches sleep `delay` seconds and append (split, time.time()) to `stamps`."""

    split: str
    delay: float
    stamps: list[tuple[str, float]]

    def fetch(self, indices: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        self.stamps.append((self.split, time.time()))
        time.sleep(self.delay)
        return super().fetch(indices)


def sleepy_loader(train_delay: float, stamps: list[tuple[str, float]]) -> Callable[[str, DataOptions], SleepyArrays]:
    """A DATASETS entry: synthetic data, `train_delay` s per training batch, test batches undelayed."""

    def load(split: str, options: DataOptions) -> SleepyArrays:
        base = load_synthetic(split, options.model)
        arrays = SleepyArrays(**{f.name: getattr(base, f.name) for f in dataclasses.fields(base)})
        arrays.split, arrays.delay, arrays.stamps = split, train_delay if split == "train" else 0.0, stamps
        return arrays

    return load


def outside_window_seconds(stamps: list[tuple[str, float]], warmup_steps: int) -> float:
    """Wall time of the timed steps by the dataset's clock: first timed batch fetch to first eval fetch.

    The first timed fetch happens just after the window opens; the first fetch of the evaluation
    that follows training happens just after it closes (batches are fetched in-process, in order).
    """
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
    DATASETS["sleepy"] = sleepy_loader(delays[rank], stamps)
    parser = OneLineParser(prog="sleepy_data")
    add_train_flags(parser)
    gc.disable()  # a GC pause between a window boundary and the dataset's clock would be the test's error
    record = train(config_from_args(parser.parse_args(["--dataset", "sleepy", *train_args])))
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as handle:
        json.dump({"record": record, "stamps": stamps, "delay": delays[rank]}, handle)


if __name__ == "__main__":
    main(sys.argv[1:])
