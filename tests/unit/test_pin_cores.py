"""--pin-cores: each local rank gets a block of cores of its own, every thread of the process is
held to it (threads started before and after), the next run in the same process starts from the
cores it had, and a placement that outruns the cores is refused in one line."""

from __future__ import annotations

import os
import threading

import pytest

from harness.errors import UsageError
from harness.process.state import TASKS_DIR, pin_to_cores, preserved_process_state

pytestmark = pytest.mark.timeout(60)


def _every_thread_affinity() -> set[frozenset[int]]:
    return {frozenset(os.sched_getaffinity(int(task))) for task in os.listdir(TASKS_DIR)}


def test_local_rank_one_takes_the_second_block_and_every_thread_follows():
    usable = sorted(os.sched_getaffinity(0))
    assert len(usable) >= 2, "this test needs a machine with 2 cores or more"
    release = threading.Event()
    earlier = threading.Thread(target=release.wait)  # a thread pool started before the pinning
    earlier.start()
    try:
        with preserved_process_state():
            assert pin_to_cores(local_rank=1, threads=1) == [usable[1]]
            assert _every_thread_affinity() == {frozenset([usable[1]])}
            later = threading.Thread(target=lambda: None)
            later.start()
            later.join()
        # The run is over: the process, and the thread started before it, may use every core again.
        assert _every_thread_affinity() == {frozenset(usable)}
    finally:
        release.set()
        earlier.join()


def test_a_block_beyond_the_usable_cores_is_refused_and_nothing_is_pinned():
    usable = os.sched_getaffinity(0)
    with pytest.raises(UsageError, match="--pin-cores: local rank 1 with .* needs cores"):
        pin_to_cores(local_rank=1, threads=len(usable))
    assert os.sched_getaffinity(0) == usable
