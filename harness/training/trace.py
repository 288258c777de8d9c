"""One trace for all ranks: the files of `harness train --profile-trace DIR` and their merge.

Every rank writes DIR/rank-N.json (torch.profiler's Chrome trace) and DIR/rank-N.steps.json (the
harness's step phases; harness.training.profiling). When the run ends, rank 0 merges them
(`merge_traces(DIR)`, also `harness trace merge DIR`) into DIR/trace.json, one file that
https://ui.perfetto.dev and chrome://tracing open:

- one process row per rank, "rank N (host)", with its threads (the training thread, the
  communicator's threads) and, first, a thread "harness steps" holding the phases of the first
  traced steps (data wait, forward+backward, communication, optimizer) as complete events; a rank
  that used a GPU has a second row, "rank N (GPU k)", with its kernels;
- `process_name`, `process_sort_index` and `thread_name` metadata events naming them, in rank order;
- one clock. Kineto writes each event's `ts` in microseconds from the file's `baseTimeNanoseconds`
  (Unix time in ns), and the step files hold Unix ns: every event is moved to microseconds from
  the earliest event of any rank, and the merged file's `baseTimeNanoseconds` is that instant.
  Ranks on one node share its clock. Across nodes the rows line up as well as the nodes' wall
  clocks agree: NTP keeps them within about a millisecond on a cluster network (PTP: microseconds),
  so compare events across nodes only where they are further apart than that.

No torch here, so that `harness trace merge` starts quickly; harness.study.scaling.trace reads merged traces back.
"""

from __future__ import annotations

import glob
import json
import os
import re
from typing import Any, Optional

from ..errors import UsageError
from ..fileio import atomic_write

MERGED_NAME = "trace.json"
STEPS_THREAD = 0  # tid of the "harness steps" thread in each rank's host row (sorted first)
_RANK_FILE = re.compile(r"rank-(\d+)\.json$")
PID_STRIDE = 100  # rank r's rows are pids r*100 (host) and r*100 + 1 + k (its k-th device)


def rank_trace_path(directory: str, rank: int) -> str:
    """Where rank `rank` writes its profiler trace."""
    return os.path.join(directory, f"rank-{rank}.json")


def rank_steps_path(directory: str, rank: int) -> str:
    """Where rank `rank` writes its step timeline."""
    return os.path.join(directory, f"rank-{rank}.steps.json")


def merge_traces(directory: str, output: Optional[str] = None) -> str:
    """Merge DIR/rank-N.json (and DIR/rank-N.steps.json where present) into one Chrome trace,
    DIR/trace.json unless `output` says otherwise; its path. Raises UsageError if there is nothing
    to merge or a file is not a trace."""
    ranks = _rank_files(directory)
    traces = {rank: load_trace(path) for rank, path in ranks.items()}
    steps = {rank: load_trace(path) for rank in ranks if os.path.exists(path := rank_steps_path(directory, rank))}
    firsts = [first for rank in ranks if (first := _first_ns(traces[rank], steps.get(rank))) is not None]
    zero_ns = min(firsts, default=0)  # the common zero: the earliest event of any rank
    events: list[dict[str, Any]] = []
    for rank in sorted(ranks):
        events += _rank_events(rank, traces[rank], zero_ns)
        if rank in steps:
            events += _step_events(rank, steps[rank], zero_ns)
    merged = {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "baseTimeNanoseconds": zero_ns,
        "otherData": {
            "ranks": sorted(ranks),
            "clock": "microseconds from baseTimeNanoseconds (Unix ns): "
            "each node's wall clock (see harness.training.trace)",
        },
    }
    path = output or os.path.join(directory, MERGED_NAME)

    def write(tmp: str) -> None:
        with open(tmp, "w") as handle:
            json.dump(merged, handle)

    try:
        atomic_write(path, write)
    except OSError as exc:
        raise UsageError(f"cannot write the merged trace {path} ({exc.strerror}); give a writable output") from None
    return path


def _rank_files(directory: str) -> dict[int, str]:
    if not os.path.isdir(directory):
        raise UsageError(f"{directory} is not a directory; give the --profile-trace directory of a run")
    found = {
        int(m.group(1)): path
        for path in glob.glob(os.path.join(directory, "rank-*.json"))
        if (m := _RANK_FILE.search(os.path.basename(path)))
    }
    if not found:
        raise UsageError(f"{directory} holds no rank-N.json trace; train with --profile-trace {directory} first")
    return found


def load_trace(path: str) -> dict[str, Any]:
    """The JSON object of a trace file; UsageError if it cannot be read or is not one."""
    try:
        with open(path) as handle:
            value = json.load(handle)
    except (OSError, ValueError) as exc:
        raise UsageError(f"{path} is not a readable JSON trace ({exc}); rerun the profiled training") from None
    if not isinstance(value, dict):
        raise UsageError(f"{path} holds no JSON object; rerun the profiled training")
    return value


def _first_ns(trace: dict[str, Any], steps: Optional[dict[str, Any]]) -> Optional[int]:
    """The earliest instant (Unix ns) of a rank's timed events."""
    base = int(trace.get("baseTimeNanoseconds", 0))
    starts = [base + round(event["ts"] * 1000) for event in _timed(trace)]
    starts += [instants[0] for instants in (steps or {}).get("steps", [])]
    return min(starts) if starts else None


def _timed(trace: dict[str, Any]) -> list[dict[str, Any]]:
    """The events worth keeping: those of a real process (Kineto's own rows, "Spans" and "Traces",
    have string pids) that carry a time."""
    return [
        event
        for event in trace.get("traceEvents", [])
        if isinstance(event.get("pid"), int) and "ts" in event and event.get("ph") != "M"
    ]


def _host_pid(trace: dict[str, Any]) -> Optional[int]:
    """The rank's process id in Kineto's trace: the pid of its CPU operators (GPU rows use the device index)."""
    counts: dict[int, int] = {}
    for event in _timed(trace):
        if event.get("cat") in ("cpu_op", "user_annotation", "python_function"):
            counts[event["pid"]] = counts.get(event["pid"], 0) + 1
    return max(counts, key=counts.get) if counts else None  # type: ignore[arg-type]


def _rank_events(rank: int, trace: dict[str, Any], zero_ns: int) -> list[dict[str, Any]]:
    """A rank's events on the common clock, in its own rows, with the rows' metadata."""
    shift_us = (int(trace.get("baseTimeNanoseconds", 0)) - zero_ns) / 1000.0
    host = _host_pid(trace)
    rows = {host if host is not None else -1: rank * PID_STRIDE}  # a rank without CPU events keeps its host row
    events = []
    for event in _timed(trace):
        if event["pid"] not in rows:
            rows[event["pid"]] = rank * PID_STRIDE + len(rows)
        events.append({**event, "pid": rows[event["pid"]], "ts": event["ts"] + shift_us})
    for old, pid in rows.items():
        label = f"rank {rank} (host)" if pid == rank * PID_STRIDE else f"rank {rank} (GPU {old})"
        events += _process_metadata(pid, label)
    for event in trace.get("traceEvents", []):  # thread names (the communicator's threads) on the new pids
        if event.get("ph") == "M" and event.get("name") == "thread_name" and event.get("pid") in rows:
            events.append({**event, "pid": rows[event["pid"]], "ts": 0})
    return events


def _process_metadata(pid: int, label: str) -> list[dict[str, Any]]:
    return [
        {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "ts": 0, "args": {"name": label}},
        {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "ts": 0, "args": {"sort_index": pid}},
    ]


def _step_events(rank: int, steps: dict[str, Any], zero_ns: int) -> list[dict[str, Any]]:
    """The harness's step phases of a rank as complete events in a thread of its host row."""
    pid, phases = rank * PID_STRIDE, steps.get("phases", [])
    events: list[dict[str, Any]] = [
        {
            "ph": "M",
            "name": "thread_name",
            "pid": pid,
            "tid": STEPS_THREAD,
            "ts": 0,
            "args": {"name": "harness steps"},
        },
        {"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": STEPS_THREAD, "ts": 0, "args": {"sort_index": -1}},
    ]
    for number, instants in enumerate(steps.get("steps", [])):
        for phase, start, end in zip(phases, instants, instants[1:]):
            events.append(
                {
                    "ph": "X",
                    "cat": "harness_step",
                    "name": phase,
                    "pid": pid,
                    "tid": STEPS_THREAD,
                    "ts": (start - zero_ns) / 1000.0,
                    "dur": max(end - start, 0) / 1000.0,
                    "args": {"step": number, "rank": rank},
                }
            )
    return events
