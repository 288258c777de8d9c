"""How much of its cores a rank had in its timed window, and who else used them: the evidence
behind a record's `contention` section (harness.training.metrics defines when a run is flagged).

Outside load, measured over the timed windows only, on the cores the rank may use (its CPU
affinity, os.sched_getaffinity; never os.cpu_count()):
- busy time of those cores: user + nice + system time of each of them from /proc/stat's per-CPU
  lines (interrupt time and steal are no process's, so they are left out);
- the job's own CPU time: this process's (all its threads: compute, the backend's helper threads)
  and its child processes' (data-loader workers) from /proc; the ranks' own times are summed per
  node when the record is made, so busy - the job's own = the CPU time other processes took on
  the job's cores;
- steal: the share of those cores' time the hypervisor gave to other guests (/proc/stat);
- CPU throttling of the job's cgroup (cgroup v2 cpu.stat throttled_usec, v1 throttled_time), as a
  share of the window;
- CPU pressure (/proc/pressure/cpu, PSI "some"): the share of the window in which some task
  waited for a CPU. It counts the job's own tasks too, so it is evidence, never the verdict.

The job's own oversubscription: its threads (ranks on the node x (compute threads + the
backend's declared helper threads + loader workers)) against the cores it may use, the affinity's
cores capped by the cgroup's CPU quota. Also recorded, as evidence of the job's own waiting:
the per-rank CPU share during compute, the run-queue wait of the rank's threads
(/proc/self/task/*/schedstat) and the load average.

Whatever the machine does not offer (no /proc: not Linux; no PSI; no cgroup) is None, never a guess.
"""

from __future__ import annotations

import os
import socket
import time
import zlib
from collections.abc import Sequence
from typing import Optional

TASKS_DIR = "/proc/self/task"
PROC = "/proc"
PROC_STAT = "/proc/stat"
PRESSURE_CPU = "/proc/pressure/cpu"
CGROUP_ROOT = "/sys/fs/cgroup"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _read(path: str) -> Optional[str]:
    try:
        with open(path) as handle:
            return handle.read()
    except OSError:
        return None


def usable_cpus() -> list[int]:
    """The CPUs this process may run on (its affinity)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return list(range(os.cpu_count() or 1))


def _cgroup_dirs() -> list[str]:
    """This process's cgroup directories holding CPU controls (v2 unified, v1 `cpu`), innermost first."""
    found = []
    for line in (_read("/proc/self/cgroup") or "").splitlines():
        number, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if number == "0" and not controllers:
            found.append(os.path.join(CGROUP_ROOT, path.lstrip("/")))
        elif "cpu" in controllers.split(","):
            found.append(os.path.join(CGROUP_ROOT, "cpu", path.lstrip("/")))
    return [path for path in found if os.path.isdir(path)]


def cgroup_quota_cores() -> Optional[float]:
    """The cgroup's CPU quota in cores (cpu.max, or cfs_quota_us / cfs_period_us), None without one."""
    for directory in _cgroup_dirs():
        limit = (_read(os.path.join(directory, "cpu.max")) or "").split()
        if len(limit) == 2 and limit[0] != "max":
            return int(limit[0]) / int(limit[1])
        quota = (_read(os.path.join(directory, "cpu.cfs_quota_us")) or "").strip()
        period = (_read(os.path.join(directory, "cpu.cfs_period_us")) or "").strip()
        if quota and period and int(quota) > 0:
            return int(quota) / int(period)
    return None


def usable_cores() -> float:
    """The cores the job may use: the affinity's CPUs, capped by the cgroup's quota."""
    quota = cgroup_quota_cores()
    cpus = len(usable_cpus())
    return min(cpus, quota) if quota else float(cpus)


def _throttled_seconds() -> Optional[float]:
    for directory in _cgroup_dirs():
        stats = dict(
            line.split()[:2] for line in (_read(os.path.join(directory, "cpu.stat")) or "").splitlines() if " " in line
        )
        if "throttled_usec" in stats:
            return int(stats["throttled_usec"]) / 1e6
        if "throttled_time" in stats:
            return int(stats["throttled_time"]) / 1e9
    return None


def _pressure_seconds() -> Optional[float]:
    """PSI's cumulative 'some' CPU stall time."""
    for line in (_read(PRESSURE_CPU) or "").splitlines():
        if line.startswith("some"):
            total = dict(field.split("=") for field in line.split()[1:])["total"]
            return int(total) / 1e6
    return None


def cpu_times(cpus: Sequence[int]) -> Optional[tuple[float, float, float]]:
    """(busy, steal, total) seconds of `cpus` since boot, from /proc/stat's per-CPU lines."""
    text = _read(PROC_STAT)
    if text is None:
        return None
    wanted = {f"cpu{cpu}" for cpu in cpus}
    busy = steal = total = 0.0
    seen = False
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 9 or fields[0] not in wanted:
            continue
        values = [int(value) for value in fields[1:9]]  # user nice system idle iowait irq softirq steal
        busy, steal, total = busy + sum(values[:3]), steal + values[7], total + sum(values)
        seen = True
    return (busy / CLOCK_TICKS, steal / CLOCK_TICKS, total / CLOCK_TICKS) if seen else None


def _children_seconds(pid: int) -> float:
    """CPU seconds of the live child processes of `pid` (loader workers), from /proc/PID/stat."""
    seconds = 0.0
    try:
        entries = [entry for entry in os.listdir(PROC) if entry.isdigit()]
    except OSError:
        return 0.0
    for entry in entries:
        text = _read(os.path.join(PROC, entry, "stat"))
        if not text:
            continue
        fields = text.rsplit(")", 1)[-1].split()  # after the command name, which may hold spaces
        if len(fields) > 12 and int(fields[1]) == pid:
            seconds += (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime
    return seconds


def own_seconds() -> float:
    """CPU seconds of this process (every thread) and its children, finished and live."""
    finished = os.times()
    return time.process_time() + finished.children_user + finished.children_system + _children_seconds(os.getpid())


def _thread_schedstats() -> Optional[dict[str, tuple[int, int]]]:
    """Per thread of this process: (ns on a CPU, ns ready but waiting for one); None without schedstat."""
    try:
        tids = os.listdir(TASKS_DIR)
    except OSError:
        return None
    stats = {}
    for tid in tids:
        text = _read(os.path.join(TASKS_DIR, tid, "schedstat"))
        try:
            running, waiting = (text or "").split()[:2]
            stats[tid] = (int(running), int(waiting))
        except ValueError:
            continue  # the thread ended meanwhile, or the kernel has no schedstat
    return stats or None


def _load() -> Optional[float]:
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def own_demand(threads: Optional[int], helper_threads: Sequence[str], loader_workers: int) -> tuple[int, str]:
    """The threads one rank keeps busy, and what they are in words: its compute threads (one host
    thread on a GPU), the backend's declared helper threads and its loader worker processes."""
    compute = threads or 1
    parts = [f"{compute} compute thread(s)" + ("" if threads else " driving the device")]
    parts += list(helper_threads)
    if loader_workers:
        parts.append(f"{loader_workers} loader worker(s)")
    return compute + len(helper_threads) + loader_workers, " + ".join(parts)


def key_of(text: str) -> float:
    """A number that names `text` (a host, a CPU set) and survives a float64 collective exactly."""
    return float(zlib.crc32(text.encode()))


class _Counter:
    """A cumulative reading taken at each window's edges; the sum of its increases over the windows."""

    def __init__(self, read) -> None:
        self.read = read
        self.total: Optional[float] = None
        self._start: Optional[float] = None

    def open(self) -> None:
        self._start = self.read()

    def close(self) -> None:
        end = self.read()
        if end is not None and self._start is not None:
            self.total = (self.total or 0.0) + end - self._start


class CpuMeter:
    """One rank's CPU measures over its timed windows (open/close them with the windows)."""

    # The order of `values()`, as the record's gather reads them.
    FIELDS = (
        "cpu_share",
        "runqueue_wait_share",
        "load_average",
        "busy_seconds",
        "steal_seconds",
        "cpu_seconds",
        "own_seconds",
        "window_seconds",
        "pressure_seconds",
        "throttled_seconds",
        "cpus",
        "usable_cores",
        "cpus_key",
        "node_key",
        "demand_per_rank",
    )

    def __init__(self, threads: Optional[int], demand: tuple[Optional[int], str] = (None, "")) -> None:
        self.threads = threads  # None: not a CPU run, so no CPU share
        # threads this rank keeps busy (compute, the backend's helpers, loader workers), and in words
        self.demand_per_rank, self.demand_words = demand
        self.cpus = usable_cpus()
        self.compute_cpu = 0.0  # process CPU seconds during compute phases
        self.compute_wall = 0.0  # wall seconds of the same phases
        self.running_ns = self.waiting_ns = 0
        self.load_max: Optional[float] = None
        self.has_schedstat = False
        self._tasks: Optional[dict[str, tuple[int, int]]] = None
        self._compute_start = 0.0
        times = lambda index: lambda: (cpu_times(self.cpus) or (None, None, None))[index]  # noqa: E731
        self.counters = {
            "busy_seconds": _Counter(times(0)),
            "steal_seconds": _Counter(times(1)),
            "cpu_seconds": _Counter(times(2)),
            "own_seconds": _Counter(own_seconds),
            "window_seconds": _Counter(time.perf_counter),
            "pressure_seconds": _Counter(_pressure_seconds),
            "throttled_seconds": _Counter(_throttled_seconds),
        }

    def _see_load(self) -> None:
        load = _load()
        if load is not None:
            self.load_max = load if self.load_max is None else max(self.load_max, load)

    def open(self) -> None:
        self._tasks = _thread_schedstats()
        for counter in self.counters.values():
            counter.open()
        self._see_load()

    def close(self) -> None:
        for counter in self.counters.values():
            counter.close()
        tasks = _thread_schedstats()
        if tasks is not None and self._tasks is not None:
            self.has_schedstat = True
            for tid, (running, waiting) in tasks.items():  # a thread that ended meanwhile is left out
                before = self._tasks.get(tid, (0, 0))
                self.running_ns += running - before[0]
                self.waiting_ns += waiting - before[1]
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
        steal, total = self.counters["steal_seconds"].total, self.counters["cpu_seconds"].total
        return steal / total if steal is not None and total else None

    def values(self) -> list[float]:
        """This rank's measures (FIELDS) as numbers for one collective (-1: not measured)."""
        measured = {
            "cpu_share": self.cpu_share(),
            "runqueue_wait_share": self.runqueue_wait_share(),
            "load_average": self.load_max,
            **{name: counter.total for name, counter in self.counters.items()},
            "cpus": len(self.cpus),
            "usable_cores": usable_cores(),
            "cpus_key": key_of(",".join(map(str, self.cpus))),
            "node_key": key_of(socket.gethostname()),
            "demand_per_rank": self.demand_per_rank,
        }
        return [-1.0 if measured[name] is None else float(measured[name]) for name in self.FIELDS]
