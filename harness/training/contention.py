"""How much of the CPU a rank actually had in its timed window: the evidence behind a record's
`contention` section (harness.training.metrics defines when a run is flagged).

Four measures, each over the timed windows only:
- CPU share: the rank's process CPU time during its compute phases (forward + backward and
  optimizer, all its threads) / (threads x the wall time of those phases). A rank that computes
  on `threads` threads and gets them all is near 1; one that shares its cores with other work is
  not. (The loop adds the compute phases: `add_compute`.)
- run-queue wait: from Linux's per-thread scheduler statistics (/proc/self/task/*/schedstat), the
  time the rank's threads were ready to run but waited for a CPU, as a share of the time they
  were ready (running or waiting). This is the direct evidence: nothing but another task holding
  the core makes a ready thread wait.
- load average: the highest 1-minute load average seen at the windows' edges (os.getloadavg),
  compared with the node's cores. It counts every task on the machine, this run's included.
- steal: the share of all CPUs' time the hypervisor gave to other guests (/proc/stat), where the
  kernel reports it.
Whatever the machine does not offer (no /proc: not Linux) is None, never a guess.
"""

from __future__ import annotations

import os
import time
from typing import Optional

TASKS_DIR = "/proc/self/task"
PROC_STAT = "/proc/stat"


def _thread_schedstats() -> Optional[dict[str, tuple[int, int]]]:
    """Per thread of this process: (ns on a CPU, ns ready but waiting for one); None without schedstat."""
    try:
        tids = os.listdir(TASKS_DIR)
    except OSError:
        return None
    stats = {}
    for tid in tids:
        try:
            with open(os.path.join(TASKS_DIR, tid, "schedstat")) as handle:
                running, waiting = handle.read().split()[:2]
            stats[tid] = (int(running), int(waiting))
        except (OSError, ValueError):
            continue  # the thread ended meanwhile, or the kernel has no schedstat
    return stats or None


def _cpu_times() -> Optional[tuple[int, int]]:
    """(steal, total) jiffies of all CPUs since boot; None where /proc/stat does not say."""
    try:
        with open(PROC_STAT) as handle:
            fields = handle.readline().split()
    except OSError:
        return None
    if len(fields) < 9 or fields[0] != "cpu":
        return None
    values = [int(value) for value in fields[1:9]]  # user nice system idle iowait irq softirq steal
    return values[7], sum(values)


def _load() -> Optional[float]:
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


class CpuMeter:
    """One rank's CPU measures over its timed windows (open/close them with the windows)."""

    def __init__(self, threads: Optional[int]) -> None:
        self.threads = threads  # None: not a CPU run, so no CPU share
        self.compute_cpu = 0.0  # process CPU seconds during compute phases
        self.compute_wall = 0.0  # wall seconds of the same phases
        self.running_ns = self.waiting_ns = 0
        self.steal = self.total = 0
        self.load_max: Optional[float] = None
        self.has_schedstat = self.has_steal = False
        self._tasks: Optional[dict[str, tuple[int, int]]] = None
        self._cpu_times: Optional[tuple[int, int]] = None
        self._compute_start = 0.0

    def _see_load(self) -> None:
        load = _load()
        if load is not None:
            self.load_max = load if self.load_max is None else max(self.load_max, load)

    def open(self) -> None:
        self._tasks, self._cpu_times = _thread_schedstats(), _cpu_times()
        self._see_load()

    def close(self) -> None:
        tasks, cpu_times = _thread_schedstats(), _cpu_times()
        if tasks is not None and self._tasks is not None:
            self.has_schedstat = True
            for tid, (running, waiting) in tasks.items():  # a thread that ended meanwhile is left out
                before = self._tasks.get(tid, (0, 0))
                self.running_ns += running - before[0]
                self.waiting_ns += waiting - before[1]
        if cpu_times is not None and self._cpu_times is not None:
            self.has_steal = True
            self.steal += cpu_times[0] - self._cpu_times[0]
            self.total += cpu_times[1] - self._cpu_times[1]
        self._see_load()

    def compute_starts(self) -> None:
        self._compute_start = time.process_time()

    def add_compute(self, wall: float) -> None:
        """A compute phase that started at `compute_starts` has ended; it took `wall` seconds of
        the wall clock outside communication."""
        self.compute_cpu += time.process_time() - self._compute_start
        self.compute_wall += wall

    def cpu_share(self) -> Optional[float]:
        if not self.threads or self.compute_wall <= 0:
            return None
        return self.compute_cpu / (self.threads * self.compute_wall)

    def runqueue_wait_share(self) -> Optional[float]:
        ready = self.running_ns + self.waiting_ns
        return self.waiting_ns / ready if self.has_schedstat and ready > 0 else None

    def steal_share(self) -> Optional[float]:
        return self.steal / self.total if self.has_steal and self.total > 0 else None

    def values(self) -> tuple[float, float, float, float]:
        """This rank's measures as numbers for one collective (-1: not measured)."""
        return tuple(
            -1.0 if value is None else float(value)
            for value in (  # type: ignore[return-value]
                self.cpu_share(),
                self.runqueue_wait_share(),
                self.load_max,
                self.steal_share(),
            )
        )


def node_cores() -> int:
    """Cores of the whole machine, which the load average counts over (not just this process's)."""
    return os.cpu_count() or 1
