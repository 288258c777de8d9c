"""A task of one's own at a known pace, for studies that must be signalled in the middle of a run:
tests/helpers/tasks.py's `regression` with each training batch fetched `delay` seconds late (slow
storage). Unpaced, the MLP's few steps end before a signal sent once its run has checkpointed can
arrive; the pause changes no number the run computes."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from harness import Task
from harness.data.indexed import as_indexed
from tests.helpers.tasks import regression


class Paced:
    """Data whose every fetch waits `delay` seconds first."""

    def __init__(self, data: Any, delay: float) -> None:
        self.data, self.delay = as_indexed(data, "paced train_data"), delay

    def __len__(self) -> int:
        return len(self.data)

    def fetch(self, indices: Any) -> Any:
        time.sleep(self.delay)
        return self.data.fetch(indices)


def paced_regression(delay: float = 0.1, width: int = 32) -> Task:
    """`regression(width)` whose training batches each take `delay` seconds to fetch."""
    task = regression(width=width)
    return dataclasses.replace(task, train_data=Paced(task.train_data, delay))
