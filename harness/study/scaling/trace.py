"""What a merged trace shows: the DIR/trace.json of `harness train --profile-trace DIR` (merged by
harness.training.trace at the end of the run, or by `harness trace merge DIR`) read back.

- `trace_summary(path)`: per rank, the seconds of the profiled steps in forward, backward,
  optimizer, allreduce (on any thread) and idle;
- `trace_spans(path)`: per rank, the same events as spans on the common clock, in two lanes (the
  training thread, and the allreduces on the communicator's threads), for a timeline
  (harness.study.scaling.run_plots.trace_figure).
"""

from __future__ import annotations

from typing import Any, Optional

from ...process.phases import GRADIENT_SYNC, REGION_PREFIX, REGIONS
from ...training.trace import PID_STRIDE, load_trace

SYNC_ANNOTATION = REGION_PREFIX + GRADIENT_SYNC.region
TRAINING_LANE = "training thread"
COMMUNICATION_LANE = "allreduces"
# The harness's regions on the training thread (harness.training.phases), by the kind they mark.
ANNOTATIONS = REGIONS
Span = tuple[str, float, float]  # (kind, start, end), seconds from the first profiled step of any rank


def _union_seconds(intervals: list[tuple[float, float]]) -> float:
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total / 1e6


def _is_allreduce(name: str) -> bool:
    """An allreduce's own event (gloo:all_reduce, nccl:all_reduce, c10d::allreduce_, DeepSpeed's), or the
    harness's wait for the averaged gradients (Horovod's allreduce runs where the profiler cannot see)."""
    lowered = name.lower()
    return "all_reduce" in lowered or "allreduce" in lowered or name == SYNC_ANNOTATION


def _kind(name: str) -> Optional[str]:
    """What an event marks: window (a profiled step), forward, backward, optimizer, allreduce, or None."""
    if name.startswith("ProfilerStep#"):
        return "window"
    annotated = ANNOTATIONS.get(name)
    if annotated is not None and annotated != "gradient sync":
        return annotated
    return "allreduce" if _is_allreduce(name) else None


def _complete_events(path: str) -> list[dict[str, Any]]:
    return [
        event
        for event in load_trace(path).get("traceEvents", [])
        if event.get("ph") == "X" and isinstance(event.get("pid"), int)
    ]


def trace_summary(path: str) -> dict[int, dict[str, float]]:
    """Per rank of a merged trace: seconds of its profiled steps (`window`) in forward, backward and
    optimizer (the harness's annotations), allreduce (its events on any thread, and the training
    thread's wait for the averaged gradients, overlaps counted once) and idle (the training thread in
    none of forward, backward, gradient sync, optimizer: data loading and bookkeeping)."""
    spans: dict[tuple[int, str], list[tuple[float, float]]] = {}
    for event in _complete_events(path):
        rank, name = event["pid"] // PID_STRIDE, str(event.get("name", ""))
        interval = (event["ts"], event["ts"] + event.get("dur", 0.0))
        key = _kind(name)
        if key is not None:
            spans.setdefault((rank, key), []).append(interval)
        if name == SYNC_ANNOTATION:  # also training-thread time that is not idle
            spans.setdefault((rank, "sync"), []).append(interval)
    summary: dict[int, dict[str, float]] = {}
    for rank in sorted({rank for rank, _ in spans}):
        seconds = {
            key: _union_seconds(spans.get((rank, key), []))
            for key in ("window", "forward", "backward", "optimizer", "allreduce")
        }
        sync = _union_seconds(spans.get((rank, "sync"), []))
        busy = seconds["forward"] + seconds["backward"] + sync + seconds["optimizer"]
        seconds["idle"] = max(seconds["window"] - busy, 0.0)
        summary[rank] = seconds
    return summary


def trace_spans(path: str) -> dict[int, dict[str, list[Span]]]:
    """Per rank of a merged trace, its profiled steps as (kind, start, end) spans in seconds from the
    first profiled step of any rank (one clock: harness.training.trace), sorted by start, in two lanes:
    TRAINING_LANE, the harness's forward, backward, gradient sync and optimizer on the thread that
    ran the steps; COMMUNICATION_LANE, the allreduces' own events on the other threads and device
    rows (DDP's buckets, which run while backward goes on). Only events that start inside the rank's
    own profiled steps count. Raises UsageError if the file is not a trace."""
    events = _complete_events(path)
    steps = [event for event in events if _kind(str(event.get("name", ""))) == "window"]
    windows: dict[int, tuple[float, float]] = {}
    training: dict[int, tuple[int, Any]] = {}  # rank -> (pid, tid) of the thread that ran the steps
    for event in steps:
        rank, end = event["pid"] // PID_STRIDE, event["ts"] + event.get("dur", 0.0)
        low, high = windows.get(rank, (event["ts"], end))
        windows[rank] = (min(low, event["ts"]), max(high, end))
        training[rank] = (event["pid"], event.get("tid"))
    zero = min((low for low, _ in windows.values()), default=0.0)
    lanes = {rank: {TRAINING_LANE: [], COMMUNICATION_LANE: []} for rank in sorted(windows)}
    for event in events:
        rank, name = event["pid"] // PID_STRIDE, str(event.get("name", ""))
        if rank not in windows or not windows[rank][0] <= event["ts"] <= windows[rank][1]:
            continue
        on_training_thread = (event["pid"], event.get("tid")) == training[rank]
        if on_training_thread and name in ANNOTATIONS:
            lane, kind = TRAINING_LANE, ANNOTATIONS[name]
        elif not on_training_thread and _kind(name) == "allreduce":
            lane, kind = COMMUNICATION_LANE, "allreduce"
        else:
            continue
        start = (event["ts"] - zero) / 1e6
        lanes[rank][lane].append((kind, start, start + event.get("dur", 0.0) / 1e6))
    for rank_lanes in lanes.values():
        for spans in rank_lanes.values():
            spans.sort(key=lambda span: span[1])
    return lanes
