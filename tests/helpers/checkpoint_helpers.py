"""Helpers shared by the checkpoint, preemption and failure tests: real launches that may fail."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from typing import NamedTuple, Optional

from harness.process.launchers import launch_environment
from harness.process.processes import children, command_line
from harness.training.launch import launch_command
from harness.training.record import read_records
from tests.conftest import REPO, run
from tests.helpers import tasks

RANKS = 2
# 2 ranks x 64 on 1,500 samples: 11 steps per epoch, 33 in three epochs.
RUN = [
    "--batch-size",
    "64",
    "--epochs",
    "3",
    "--lr",
    "0.02",
    "--seed",
    "7",
    "--threads",
    "1",
    "--eval-every",
    "0",
    "--calibration-steps",
    "0",
    "--timing-warmup-steps",
    "2",
]
# The built-in task's CNN on the 1,500 digits. Dropout stays on, so a resumed run must also restore
# every rank's RNG to match.
CNN_TASK = ["--model", "cnn", "--dataset", "digits", "--dropout", "0.25"]
COMMON = [*CNN_TASK, *RUN]
# Tasks the kit does not ship (tests/helpers/tasks.py), with as many training samples: the same
# steps. `regression` has batch norm (each rank's statistics, rank 0's saved and evaluated),
# `tokens` dropout (every rank's RNG restored on resume).
TEST_TASKS = {name: tasks.flags(name, train_samples=1500) for name in ("regression", "tokens")}
STEPS_PER_EPOCH = 11
TOTAL_STEPS = 33


def launch_may_fail(
    backend: str,
    args: list[str],
    env: Optional[dict[str, str]] = None,
    launcher: Optional[str] = None,
    ranks: int = RANKS,
    timeout: float = 300,
) -> subprocess.CompletedProcess:
    """`harness train` on `ranks` local ranks through a real launcher; the caller checks the status."""
    return run(launch_command(ranks, backend, args, launcher), timeout=timeout, env=env)


def records(path) -> list[dict]:
    """The run records of a results file, none where a run appended nothing (the file is absent)."""
    return read_records([str(path)]) if os.path.exists(path) else []


def checkpoint_steps(directory) -> list[int]:
    return sorted(int(name.split("-")[1]) for name in os.listdir(directory) if name.startswith("step-"))


def output(result: subprocess.CompletedProcess) -> str:
    return f"exit {result.returncode}\n--- stdout\n{result.stdout[-4000:]}\n--- stderr\n{result.stderr[-6000:]}"


def rank_processes(launcher_pid: int) -> list[int]:
    """PIDs of the training ranks under a launcher: its descendants that run `harness train` and
    have no children of their own (launchers and their helpers have the ranks as children), rank 0's
    heartbeat store (harness.process.heartbeat) aside."""
    # A descendant's children are descendants too: one command-line read each.
    commands = {pid: command_line(pid) or "" for pid in children(launcher_pid, recursive=True)}
    found = []
    for pid, command in commands.items():
        own = [child for child in children(pid) if "heartbeat_store" not in commands.get(child, "")]
        if not own and "harness train" in command:
            found.append(pid)
    return sorted(found)


def signal_all(pids: list[int], signum: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass


class TimedJob(NamedTuple):
    returncode: Optional[int]  # None: still running at the limit (then killed)
    output: str  # stdout and stderr together
    seen: dict[str, float]  # seconds from the start to the first line containing each marker seen
    ended: Optional[float]  # seconds from the start to the job's exit

    def seconds(self, first: str, then: Optional[str] = None) -> Optional[float]:
        """Seconds from the line with marker `first` to the line with `then` (default: the exit)."""
        end = self.ended if then is None else self.seen.get(then)
        return None if first not in self.seen or end is None else end - self.seen[first]


def time_job(command: list[str], env: dict[str, str], markers: list[str], limit: float) -> TimedJob:
    """Run a launcher command to its end (killing it at `limit` s); time its marker lines and exit."""
    started = time.monotonic()
    job = subprocess.Popen(
        command, cwd=REPO, env=launch_environment(env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines: list[str] = []
    seen: dict[str, float] = {}

    def read() -> None:
        for line in job.stdout:
            lines.append(line)
            for marker in markers:
                if marker in line and marker not in seen:
                    seen[marker] = time.monotonic() - started

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        job.wait(timeout=limit)
        ended: Optional[float] = time.monotonic() - started
    except subprocess.TimeoutExpired:
        job.kill()
        job.wait()
        ended = None
    reader.join(timeout=10)
    return TimedJob(job.returncode if ended is not None else None, "".join(lines), seen, ended)


def shared_memory_segments() -> set:
    """Names in /dev/shm (POSIX shared memory, which is RAM): a job must leave none behind.

    OpenMPI's own segments (vader_segment.*) and Python multiprocessing's semaphores (sem.mp-*) are
    left out: they belong to mpirun jobs and data-loader workers of other jobs, which may create or
    remove one meanwhile on a shared machine; the leak these tests guard against is DeepSpeed's."""
    names = os.listdir("/dev/shm") if os.path.isdir("/dev/shm") else []
    return {name for name in names if not name.startswith(("vader_segment", "sem.mp-"))}
