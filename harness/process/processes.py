"""Other processes of this machine, read through psutil (their environments from /proc): found by
their environment, command line, parent or session, asked whether they still run, and ended
(SIGTERM, then SIGKILL).

The one way the harness and its tests find and end processes that are not their own children:
ipyparallel engines, a job's ranks, the daemons of a test Slurm, a heartbeat store left behind
(tests/test_architecture.py checks that nothing else opens /proc/<pid>/). What a rank measures of
itself and its loader workers in the timed window reads /proc directly (harness.training.contention
and memory), where a scan must cost next to nothing.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterable
from typing import Any, Optional

from ..errors import require

STOP_POLL_S = 0.1  # how often end_processes looks again for what is left
STOP_GRACE_S = 10.0  # how long processes found by their environment get to exit before SIGKILL


def _psutil() -> Any:
    return require("psutil", "finding other processes", "pip install psutil (make setup installs it)")


def _others(fields: list[str]) -> Iterable[Any]:
    """psutil's processes other than this one, with `fields` read into their `info`."""
    own = os.getpid()
    return (process for process in _psutil().process_iter(fields) if process.pid != own)


def processes_with_environment(name: str, value: str) -> list[int]:
    """Pids of this user's processes whose environment has `name`=`value` (not this process)."""
    # Read raw, not through psutil's environ(): that stops at the first empty entry, which a process
    # that rewrote its title over its arguments (slurmstepd: "[1.batch]") leaves before its variables.
    wanted, found = os.fsencode(f"{name}={value}"), []
    for process in _others(["pid"]):
        try:
            with open(f"/proc/{process.pid}/environ", "rb") as handle:
                if wanted in handle.read().split(b"\0"):
                    found.append(process.pid)
        except OSError:  # gone meanwhile, another user's, or a kernel thread
            continue
    return found


def processes_with_command(marker: str) -> list[int]:
    """Pids of the processes whose command line contains `marker` (not this process)."""
    return [process.pid for process in _others(["cmdline"]) if marker in " ".join(process.info["cmdline"] or ())]


def processes_in_sessions(sessions: Iterable[int]) -> list[int]:
    """Pids of the processes whose session is one of `sessions` (a job that started its own)."""
    wanted, found = set(sessions), []
    for process in _others(["pid"]):
        try:
            if os.getsid(process.pid) in wanted:
                found.append(process.pid)
        except OSError:
            continue
    return found


def _ask(pid: int, read: Callable[[Any], Any], gone: Any) -> Any:
    """`read(psutil.Process(pid))`, or `gone` once the process has ended (or cannot be read)."""
    psutil = _psutil()
    try:
        return read(psutil.Process(pid))
    except psutil.Error:
        return gone


def command_line(pid: int) -> Optional[str]:
    """The command line of `pid`, its arguments joined by spaces; None once it has ended."""
    return _ask(pid, lambda process: " ".join(process.cmdline()), None)


def name(pid: int) -> Optional[str]:
    """The name the kernel keeps for `pid` (its executable's, as `ps -o comm` shows it, even where
    the process rewrote its arguments); None once it has ended."""
    return _ask(pid, lambda process: process.name(), None)


def parent(pid: int) -> Optional[int]:
    """The pid of `pid`'s parent; None once it has ended."""
    return _ask(pid, lambda process: process.ppid(), None)


def children(pid: int, recursive: bool = False) -> list[int]:
    """Pids of `pid`'s children (with `recursive`, of all its descendants); none once it has ended."""
    return _ask(pid, lambda process: [child.pid for child in process.children(recursive=recursive)], [])


def running(pid: int) -> bool:
    """Whether `pid` still runs: it exists and is not a zombie (stopped, only not yet reaped)."""
    return _ask(pid, lambda process: process.status() != _psutil().STATUS_ZOMBIE, False)


def start_time(pid: int) -> Optional[float]:
    """When `pid` started (seconds since the epoch): tells a reused pid from its first owner; None
    once it has ended."""
    return _ask(pid, lambda process: process.create_time(), None)


def _signal_all(pids: Iterable[int], signum: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, signum)
        except (ProcessLookupError, PermissionError):
            pass


def end_processes(find: Callable[[], list[int]], grace: float, timeout: float = 10.0) -> list[int]:
    """End what `find()` lists: SIGTERM, and once `grace` seconds have passed (at once with `grace`
    0, without SIGTERM) SIGKILL to whatever it still lists, again until it lists nothing or `timeout`
    more seconds have passed. `find` is asked anew each time, so processes started meanwhile (a
    launcher's late ranks) are ended too. Returns the pids first found."""
    pids = left = find()
    if grace > 0 and left:
        _signal_all(left, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while left and time.monotonic() < deadline:
            time.sleep(STOP_POLL_S)
            left = find()
    deadline = time.monotonic() + timeout
    while left and time.monotonic() < deadline:
        _signal_all(left, signal.SIGKILL)
        time.sleep(STOP_POLL_S)
        left = find()
    return pids


def kill_processes_with_environment(name: str, value: str, grace: float = STOP_GRACE_S) -> list[int]:
    """End the processes carrying `name`=`value` in their environment (end_processes). Only processes
    started with that marker (an ipyparallel cluster's id, a test's own variable) are touched."""
    return end_processes(lambda: processes_with_environment(name, value), grace)
