"""`--profile-trace DIR`: torch.profiler on every rank for a few steps of the timed window.

Each rank writes two files into DIR: `rank-N.json`, the Chrome trace torch.profiler (Kineto)
exports for its profiled steps, and `rank-N.steps.json`, the harness's own phases of its first
traced steps (the record's `timeline`: data wait, forward+backward, communication, optimizer) on
the same clock, the wall clock in Unix nanoseconds. When the run ends (every rank past its last
barrier, so every rank's files are written), rank 0 merges them into one DIR/trace.json with a
process row per rank (`merge`; harness.training.trace).

The profiler starts when the timed window first opens (start-up stays out of it, as it stays out
of the timings) and follows the schedule below: WAIT steps skipped, WARMUP steps profiled and
thrown away (the profiler's own start-up), ACTIVE steps recorded. Profiling slows the steps it
records; the window's numbers of a profiled run are not those of an unprofiled one.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Optional

import torch

from ..errors import UsageError
from ..fileio import atomic_write
from ..process.phases import TRACE_COLUMNS
from .timing import StepTimer
from .trace import merge_traces, rank_steps_path, rank_trace_path

WAIT, WARMUP, ACTIVE = 1, 1, 3
PROFILED_STEPS = WAIT + WARMUP + ACTIVE  # the step timeline covers at least these steps of the window


def check_trace_directory(directory: str) -> None:
    """Create `directory` and make sure this process can write into it, before training starts:
    a run must not train for an hour and then fail to write its trace."""
    try:
        os.makedirs(directory, exist_ok=True)
        probe = os.path.join(directory, f".write-test-{os.getpid()}")
        with open(probe, "w"):
            pass
        os.unlink(probe)
    except OSError as exc:
        raise UsageError(
            f"--profile-trace {directory} cannot be written ({exc.strerror}); choose a writable directory"
        ) from None


class RankProfiler:
    """One rank's profiler: started with the timed window, stepped after each timed step."""

    def __init__(self, directory: str, rank: int, device: torch.device) -> None:
        self.directory = directory
        self.rank = rank
        activities = [torch.profiler.ProfilerActivity.CPU]
        if device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self._profiler = torch.profiler.profile(
            activities=activities,
            schedule=torch.profiler.schedule(wait=WAIT, warmup=WARMUP, active=ACTIVE),
            on_trace_ready=self._export,
        )
        self._running = False
        self.exported = False

    def _export(self, profiler: Any) -> None:
        if self.exported:  # the schedule repeats; the first ACTIVE steps are the trace
            return
        atomic_write(rank_trace_path(self.directory, self.rank), profiler.export_chrome_trace)
        self.exported = True

    def start(self) -> None:
        """The timed window opened: start (once; later windows continue the same schedule)."""
        if not self._running and not self.exported:
            self._profiler.start()
            self._running = True

    def step(self) -> None:
        """One timed step is done."""
        if self._running:
            self._profiler.step()
            if self.exported:
                self._stop()

    def _stop(self) -> None:
        if self._running:
            self._running = False
            self._profiler.stop()  # exports a trace still recording (a run shorter than the schedule)

    def finish(self, timer: StepTimer) -> None:
        """Stop profiling and write this rank's step timeline beside its trace."""
        self._stop()
        if not self.exported:  # too few timed steps to record any: an empty trace keeps the rank's row
            atomic_write(
                rank_trace_path(self.directory, self.rank),
                lambda tmp: _write_json(tmp, {"traceEvents": [], "baseTimeNanoseconds": time.time_ns()}),
            )
        # perf_counter has an arbitrary zero; the offset to the wall clock puts the phases on the
        # profiler's clock (Kineto's timestamps are wall-clock microseconds from baseTimeNanoseconds).
        wall_offset = time.time_ns() - time.perf_counter_ns()
        origin = timer.origin or 0.0
        steps = [[round(wall_offset + (origin + instant) * 1e9) for instant in instants] for instants in timer.trace]
        atomic_write(
            rank_steps_path(self.directory, self.rank),
            lambda tmp: _write_json(
                tmp,
                {
                    "rank": self.rank,
                    "phases": list(TRACE_COLUMNS),
                    "clock": "unix_ns",
                    "doc": "per traced step: the instants wait start, data ready, last gradient, gradients averaged, "
                    "stepped (Unix nanoseconds); phase k runs from instant k to k+1",
                    "steps": steps,
                },
            ),
        )

    def merge(self) -> Optional[str]:
        """On rank 0, once every rank has finished (after the run's last barrier): merge the ranks'
        files into DIR/trace.json; its path there, None on the other ranks."""
        return merge_traces(self.directory) if self.rank == 0 else None


def _write_json(path: str, value: Any) -> None:
    with open(path, "w") as handle:
        json.dump(value, handle)


def make_profiler(directory: Optional[str], rank: int, device: torch.device) -> Optional[RankProfiler]:
    """The rank's profiler for --profile-trace DIR, or None without it."""
    return RankProfiler(directory, rank, device) if directory else None
