"""A failing rank ends the whole job with a message, within --timeout + 30 s, for every backend.

The failures are real signals: HARNESS_TEST_SIGNAL=KILL@5:1 makes rank 1 send itself SIGKILL right
after step 5 (see harness.process.preemption), as the OOM killer or a crashing node would end it; STOP
freezes it instead, like a hung process or a lost node, whose sockets stay open, so only --timeout
can end the wait. The surviving rank must say which problem ended it; the job must exit non-zero,
leaving no process behind, nothing in --results and nothing in /dev/shm. benchmarks/checkpoint.py reports the times.
The hung jobs of all backends run side by side (they mostly wait), the others one after another.
The killed rank trains a task the kit does not ship (tests/helpers/tasks.py's `regression`), the
others the built-in CNN.
"""

from __future__ import annotations

import re
import socket
import threading
import time
from pathlib import Path
from typing import Callable, NamedTuple

import pytest

from harness.process.processes import processes_with_command
from harness.training.launch import launch_command
from tests.helpers.backend_cases import DISTRIBUTED
from tests.helpers.checkpoint_helpers import (
    CNN_TASK,
    COMMON,
    RANKS,
    RUN,
    TEST_TASKS,
    TimedJob,
    launch_may_fail,
    output,
    shared_memory_segments,
    time_job,
)

TIMEOUT_S = 20
HUNG_TIMEOUT_S = 10
SLACK_S = 30
LOST = "rank 0 lost contact with a peer"
# torchrun ends the other ranks itself (SIGTERM) as soon as one dies, often before the survivor's
# collective has failed: then torchrun's own report is the message, naming the killed rank.
TORCHRUN_REPORT = re.compile(r"rank\s*:\s*1 \(local_rank: 1\)\s*exitcode\s*:\s*-9")
# horovodrun, too, ends the other ranks when one dies (SIGTERM, then SIGKILL 5 s later). On a loaded
# machine Horovod's survivor can still be inside the collective its dead peer left when the SIGKILL
# comes (1 run in 13 beside four CPU burners): then horovodrun's report names the killed rank.
HOROVODRUN_REPORT = re.compile(r"The first process to do so was:\s*Process name: 1\s*Exit code: 137")


class Failed(NamedTuple):
    """A job whose rank 1 was made to fail: how it ran, its command, its marker line, its --results."""

    job: TimedJob
    command: list[str]
    signalled: str
    results: Path


def _failure_is_named(command: list[str], output: str, timeout_s: int) -> bool:
    """The survivor says why it stopped, or (torchrun and horovodrun only) the launcher names the killed rank."""
    if f"(collectives wait at most --timeout {timeout_s} s), so the job stops here" in output:
        return True
    if "torch.distributed.run" in command:
        return TORCHRUN_REPORT.search(output) is not None
    return Path(command[0]).name == "horovodrun" and HOROVODRUN_REPORT.search(output) is not None


def _start_failure(
    directory: Path, backend: str, signal_name: str, timeout_s: int, task: list[str] = CNN_TASK
) -> Callable[[], Failed]:
    """Start a job of `task` whose rank 1 gets SIG`signal_name` after step 5, in a thread; a call
    returns it once it has ended (or been killed at its limit)."""
    results = directory / "results.jsonl"
    # Long enough that the survivor is still training when its peer fails.
    command = launch_command(
        RANKS, backend, [*task, *RUN, "--epochs", "20", "--timeout", str(timeout_s), "--results", str(results)]
    )
    signalled = f"sending SIG{signal_name} to itself"
    jobs: list[TimedJob] = []
    thread = threading.Thread(
        target=lambda: jobs.append(
            time_job(
                command,
                {"HARNESS_TEST_SIGNAL": f"{signal_name}@5:1"},
                [signalled, LOST],
                limit=240 + timeout_s + SLACK_S,
            )
        )
    )
    thread.start()

    def ended() -> Failed:
        thread.join()
        return Failed(jobs[0], command, signalled, results)

    return ended


def _assert_failed_cleanly(backend: str, failed: Failed, timeout_s: int) -> str:
    """The job ended non-zero, said why, and left no rank and no --results behind; its output's tail."""
    job, tail = failed.job, failed.job.output[-5000:]
    assert job.returncode is not None, f"{backend}: the job was still running long after rank 1 failed\n{tail}"
    assert failed.signalled in job.seen, f"{backend}: rank 1 never reached step 5\n{tail}"
    assert job.returncode != 0, tail
    assert _failure_is_named(failed.command, job.output, timeout_s), tail
    assert not failed.results.exists()
    assert processes_with_command(str(failed.results)) == [], f"{backend}: ranks were left running"
    return tail


def _fail_rank_1(tmp_path, backend: str, signal_name: str, timeout_s: int, task: list[str]):
    shared_memory_before = shared_memory_segments()
    failed = _start_failure(tmp_path, backend, signal_name, timeout_s, task)()
    time.sleep(1)
    tail = _assert_failed_cleanly(backend, failed, timeout_s)
    assert shared_memory_segments() - shared_memory_before == set(), f"{backend}: left shared memory behind"
    return failed.job, failed.signalled, tail


@pytest.mark.parametrize("backend", DISTRIBUTED)
def test_a_finished_job_leaves_no_shared_memory(tmp_path, backend):
    """DeepSpeed's CPU allreduce creates 66 MB of /dev/shm per rank and never frees it: left alone,
    a day of jobs filled the machine's RAM. Under its own launcher (which sets LOCAL_SIZE) it does."""
    before = shared_memory_segments()
    result = launch_may_fail(backend, [*COMMON, "--epochs", "1", "--max-steps", "3"])
    assert result.returncode == 0, output(result)
    assert shared_memory_segments() - before == set()


@pytest.mark.slow
@pytest.mark.parametrize("backend", DISTRIBUTED)
def test_killing_one_rank_ends_the_job_within_the_timeout(tmp_path, backend):
    job, killed, tail = _fail_rank_1(tmp_path, backend, "KILL", TIMEOUT_S, TEST_TASKS["regression"])
    print(f"\n{backend}: job exited {job.seconds(killed):.1f} s after rank 1 was killed (status {job.returncode})")
    assert job.seconds(killed) <= TIMEOUT_S + SLACK_S, tail


@pytest.fixture(scope="module")
def hung_jobs(tmp_path_factory) -> dict[str, Failed]:
    """Every backend's job with rank 1 stopped after step 5, run side by side: each mostly waits
    (for --timeout), so together they take about as long as
    the slowest. /dev/shm is compared once all have ended."""
    shared_memory_before = shared_memory_segments()
    started = {
        backend: _start_failure(tmp_path_factory.mktemp(f"hung-{backend}"), backend, "STOP", HUNG_TIMEOUT_S)
        for backend in DISTRIBUTED
    }
    jobs = {backend: ended() for backend, ended in started.items()}
    time.sleep(1)
    assert shared_memory_segments() - shared_memory_before == set(), "the hung jobs left shared memory behind"
    return jobs


@pytest.mark.slow
@pytest.mark.parametrize("backend", DISTRIBUTED)
def test_a_hung_rank_fails_its_peer_after_the_timeout(hung_jobs, backend):
    """A stopped rank keeps its sockets open: the survivor gives up after --timeout (not the 30 min
    of DeepSpeed's own process groups, nor horovodrun's gloo timeout) and ends the stopped rank beside
    it, so the job ends within --timeout + 30 s under every launcher (benchmarks/checkpoint.py --hung
    times them)."""
    failed = hung_jobs[backend]
    tail = _assert_failed_cleanly(backend, failed, HUNG_TIMEOUT_S)
    job, stopped = failed.job, failed.signalled
    print(
        f"\n{backend}: survivor gave up {job.seconds(stopped, LOST):.1f} s after rank 1 hung; job exited after "
        f"{job.seconds(stopped):.1f} s"
    )
    assert HUNG_TIMEOUT_S - 1 <= job.seconds(stopped, LOST) <= HUNG_TIMEOUT_S + SLACK_S, tail
    # The heartbeats name the frozen rank (harness.process.heartbeat; tests/integration/test_stuck_rank.py).
    assert f"stopped answering: rank 1 (host {socket.gethostname()}, step 5, " in job.output, tail
    assert job.seconds(stopped) <= HUNG_TIMEOUT_S + 30, tail
