"""A stuck rank is named: for every distributed backend, rank 0 (whose host holds the heartbeat
store) freezes with SIGSTOP after step 5, and the survivor's one error line names it, its host, its
step, its phase and how long ago it was last seen, and the job ends in bounded time.

Rank 0 is the hard case (tests/test_failures.py freezes rank 1): a store inside rank 0 would freeze
with it, so this shows the store is a process of its own (harness.process.heartbeat). The jobs run
side by side: each mostly waits, for --timeout and then for its launcher's grace period. They train
a task the kit does not ship (tests/helpers/tasks.py's `tokens`): the heartbeat knows the loop, not the task.
"""

from __future__ import annotations

import re
import socket
import threading
import time

import pytest

from harness.process import heartbeat
from harness.process.processes import command_line, parent, processes_with_command
from harness.training.launch import launch_command
from tests.helpers.backend_cases import DISTRIBUTED
from tests.helpers.checkpoint_helpers import RANKS, RUN, TEST_TASKS, TimedJob, time_job

TIMEOUT_S = 10
SLACK_S = 30  # a loaded machine, for the age the survivor reads
STOPPED = "sending SIGSTOP to itself after step 5"
NAMED = "stopped answering: rank 0 (host "
STORE = "heartbeat_store.py"
LINE = re.compile(
    r"rank 1 lost contact with a peer \(.*\); stopped answering: rank 0 \(host (?P<host>[^,]+), step (?P<step>\d+), "
    r"(?P<phase>.+?), last seen (?P<age>[\d.]+) s ago\)"
)


@pytest.fixture(scope="module")
def stuck_jobs(tmp_path_factory) -> dict[str, TimedJob]:
    """Every distributed backend's job with rank 0 frozen after step 5, run side by side."""
    jobs: dict[str, TimedJob] = {}

    def run(backend: str) -> None:
        results = tmp_path_factory.mktemp(f"stuck-{backend}") / "results.jsonl"
        args = [*TEST_TASKS["tokens"], *RUN, "--epochs", "20", "--timeout", str(TIMEOUT_S), "--results", str(results)]
        jobs[backend] = time_job(
            launch_command(RANKS, backend, args),
            {"HARNESS_TEST_SIGNAL": "STOP@5:0"},
            [STOPPED, NAMED],
            limit=240 + TIMEOUT_S + 30 + SLACK_S,
        )

    threads = [threading.Thread(target=run, args=(backend,)) for backend in DISTRIBUTED]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert _orphaned_stores() == [], "a heartbeat store outlived its rank"
    return jobs


def _orphaned_stores(grace_s: float = 5.0) -> list[int]:
    """Heartbeat stores whose rank 0 is gone (other jobs' live stores aside), once `grace_s` passed."""
    deadline = time.monotonic() + grace_s
    while True:
        orphans = []
        for pid in processes_with_command(STORE):
            owner = parent(pid)
            command = command_line(owner) if owner is not None else None
            if command is not None and "harness" not in command:  # None: the store, or its parent, just ended
                orphans.append(pid)
        if not orphans or time.monotonic() > deadline:
            return orphans
        time.sleep(0.2)


@pytest.mark.slow
@pytest.mark.parametrize("backend", DISTRIBUTED)
def test_the_survivor_names_the_stopped_rank_its_host_step_and_phase(stuck_jobs, backend):
    job = stuck_jobs[backend]
    tail = job.output[-5000:]
    assert STOPPED in job.seen, f"{backend}: rank 0 never reached step 5\n{tail}"
    match = LINE.search(job.output)
    assert match, f"{backend}: no line names rank 0\n{tail}"
    print(f"\n{backend}: {match.group(0)}")
    assert match.group("host") == socket.gethostname(), tail
    assert int(match.group("step")) == 5, tail
    assert match.group("phase").split(heartbeat.WAITING_IN)[0] in heartbeat.LABELS, tail  # and the collective
    assert TIMEOUT_S - 1 <= float(match.group("age")) <= TIMEOUT_S + SLACK_S, tail


@pytest.mark.slow
@pytest.mark.parametrize("backend", DISTRIBUTED)
def test_a_job_with_a_stopped_rank_ends_in_bounded_time(stuck_jobs, backend):
    """The survivor's line comes, and the job ends, within --timeout + 30 s of the stop: the survivor
    ends the frozen rank beside it, so no launcher waits out its grace period (torchrun's and the
    DeepSpeed launcher's 30 s between SIGTERM and SIGKILL)."""
    job = stuck_jobs[backend]
    tail = job.output[-5000:]
    assert job.returncode not in (None, 0), f"{backend}: exit {job.returncode}\n{tail}"
    named_after = job.seconds(STOPPED, NAMED)
    print(f"\n{backend}: named {named_after} s after the stop; job ended {job.seconds(STOPPED)} s after it")
    assert named_after is not None and named_after <= TIMEOUT_S + 30, tail
    assert "harness: ended rank 0 (pid " in job.output, tail
    assert job.seconds(STOPPED) <= TIMEOUT_S + 30, tail
