"""What a merged trace shows: `trace_summary(path)` reads the DIR/trace.json of `harness train
--profile-trace DIR` (merged by harness.training.trace at the end of the run, or by `harness trace
merge DIR`) back: per rank, the seconds of the profiled steps in forward, backward, optimizer,
allreduce (on any thread) and idle.
"""

from __future__ import annotations

from ..training.trace import PID_STRIDE, load_trace


def _union_seconds(intervals: list[tuple[float, float]]) -> float:
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total / 1e6


SYNC_ANNOTATION = "harness: gradient sync"


def _is_allreduce(name: str) -> bool:
    """An allreduce's own event (gloo:all_reduce, nccl:all_reduce, c10d::allreduce_, DeepSpeed's), or the
    harness's wait for the averaged gradients (Horovod's allreduce runs where the profiler cannot see)."""
    lowered = name.lower()
    return "all_reduce" in lowered or "allreduce" in lowered or name == SYNC_ANNOTATION


def trace_summary(path: str) -> dict[int, dict[str, float]]:
    """Per rank of a merged trace: seconds of its profiled steps (`window`) in forward, backward and
    optimizer (the harness's annotations), allreduce (its events on any thread, and the training
    thread's wait for the averaged gradients, overlaps counted once) and idle (the training thread in
    none of forward, backward, gradient sync, optimizer: data loading and bookkeeping)."""
    events = load_trace(path).get("traceEvents", [])
    summary: dict[int, dict[str, float]] = {}
    spans: dict[tuple[int, str], list[tuple[float, float]]] = {}
    for event in events:
        if event.get("ph") != "X" or not isinstance(event.get("pid"), int):
            continue
        rank, name = event["pid"] // PID_STRIDE, str(event.get("name", ""))
        key = next(
            (
                kind
                for kind, match in (
                    ("window", name.startswith("ProfilerStep#")),
                    ("forward", name == "harness: forward"),
                    ("backward", name == "harness: backward"),
                    ("optimizer", name == "harness: optimizer"),
                    ("allreduce", _is_allreduce(name)),
                )
                if match
            ),
            None,
        )
        interval = (event["ts"], event["ts"] + event.get("dur", 0.0))
        if key is not None:
            spans.setdefault((rank, key), []).append(interval)
        if name == SYNC_ANNOTATION:  # also training-thread time that is not idle
            spans.setdefault((rank, "sync"), []).append(interval)
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
