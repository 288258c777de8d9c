"""A rank killed mid-training (SIGKILL) ends the whole job quickly, with a message, for every backend.

The kill is real: HARNESS_TEST_SIGNAL=KILL@5:1 makes rank 1 send itself SIGKILL right after step 5
(see harness.preemption), as the OOM killer or a failing node would end it. The surviving rank
must say which problem ended it, and the job must exit non-zero within --timeout + 30 s, leaving
no process behind and nothing in --results. benchmarks/checkpoint.py reports the times.
"""

from __future__ import annotations

import time

import pytest

from harness.launch import launch_command

from .checkpoint_helpers import COMMON, RANKS, processes_mentioning, time_job_after_marker

TIMEOUT_S = 20
SLACK_S = 30
KILL = {"HARNESS_TEST_SIGNAL": "KILL@5:1"}
KILLED = "sending SIGKILL to itself"


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["ddp", "horovod", "deepspeed"])
def test_killing_one_rank_ends_the_job_within_the_timeout(tmp_path, backend):
    results = tmp_path / "results.jsonl"
    # Long enough that the survivor is still training when its peer dies.
    command = launch_command(RANKS, backend, [*COMMON, "--epochs", "20", "--timeout", str(TIMEOUT_S),
                                              "--results", str(results)])
    job = time_job_after_marker(command, KILL, KILLED, limit=240 + TIMEOUT_S + SLACK_S)
    tail = job.output[-5000:]
    assert job.returncode is not None, f"{backend}: the job was still running long after rank 1 was killed\n{tail}"
    assert job.seconds_after_marker is not None, f"{backend}: rank 1 never reached step 5\n{tail}"
    print(f"\n{backend}: job exited {job.seconds_after_marker:.1f} s after rank 1 was killed "
          f"(status {job.returncode})")
    assert job.returncode != 0, tail
    assert job.seconds_after_marker <= TIMEOUT_S + SLACK_S, tail
    assert (f"rank 0 lost contact with a peer" in job.output
            and f"(collectives wait at most --timeout {TIMEOUT_S} s), so the job stops here" in job.output), tail
    assert not results.exists()
    time.sleep(1)
    assert processes_mentioning(str(results)) == [], f"{backend}: ranks were left running"
