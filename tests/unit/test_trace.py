"""Merging per-rank traces onto one clock, in-process."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

import harness

BASE_NS = 1_700_000_000_000_000_000


def _kineto(pid: int, base_ns: int, events: list[dict[str, Any]]) -> dict[str, Any]:
    """A trace shaped as Kineto writes it: microsecond `ts` from `baseTimeNanoseconds`, its own rows."""
    return {
        "schemaVersion": 1,
        "baseTimeNanoseconds": base_ns,
        "traceEvents": [
            {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "ts": 0, "args": {"name": "python"}},
            {"ph": "M", "name": "thread_name", "pid": pid, "tid": pid, "ts": 0, "args": {"name": "main"}},
            {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans", "tid": "x", "ts": 1, "dur": 1},
            *({"ph": "X", "cat": "cpu_op", "pid": pid, "tid": pid, **event} for event in events),
        ],
    }


def _write(directory: str, name: str, value: dict[str, Any]) -> None:
    with open(os.path.join(directory, name), "w") as handle:
        json.dump(value, handle)


def _handmade(directory: str) -> None:
    # Rank 1's profiler started 2 ms later on the wall clock, with another base time: the same
    # wall-clock instant must land on the same merged timestamp.
    _write(
        directory,
        "rank-0.json",
        _kineto(
            4242,
            BASE_NS,
            [
                {"name": "ProfilerStep#2", "ts": 1000.0, "dur": 100.0, "cat": "user_annotation"},
                {"name": "harness: forward", "ts": 1010.0, "dur": 30.0, "cat": "user_annotation"},
                {"name": "gloo:all_reduce", "ts": 1050.0, "dur": 20.0, "cat": "user_annotation"},
            ],
        ),
    )
    rank1 = _kineto(
        4343,
        BASE_NS + 5_000_000,
        [
            {"name": "ProfilerStep#2", "ts": -4000.0, "dur": 100.0, "cat": "user_annotation"},
            {"name": "gloo:all_reduce", "ts": -3950.0, "dur": 20.0, "cat": "user_annotation"},
        ],
    )
    # A GPU kernel: Kineto puts it in a row whose pid is the device index (here 0).
    rank1["traceEvents"].append(
        {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": -3990.0, "dur": 10.0}
    )
    _write(directory, "rank-1.json", rank1)
    start = BASE_NS + 1_000_000  # rank 0's ProfilerStep#2, in ns
    _write(
        directory,
        "rank-0.steps.json",
        {
            "rank": 0,
            "phases": ["data_wait", "forward_backward", "communication", "optimizer"],
            "steps": [[start, start + 5000, start + 40000, start + 70000, start + 100000]],
        },
    )


def test_merge_aligns_ranks_on_one_clock_with_a_row_each(tmp_path):
    _handmade(str(tmp_path))
    path = harness.merge_traces(str(tmp_path))
    assert path == str(tmp_path / "trace.json")
    merged = json.load(open(path))  # valid JSON
    events = merged["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {0: "rank 0 (host)", 100: "rank 1 (host)", 101: "rank 1 (GPU 0)"}
    assert {e["pid"]: e["args"]["sort_index"] for e in events if e["name"] == "process_sort_index"} == {
        0: 0,
        100: 100,
        101: 101,
    }
    assert [e["ts"] for e in events if e["name"] == "gemm"] == [10.0]  # on rank 1's clock shift too
    assert all(isinstance(e["pid"], int) for e in events)  # Kineto's own "Spans" row is gone
    step = {e["pid"]: e["ts"] for e in events if e["name"] == "ProfilerStep#2"}
    # Both steps began at the same wall-clock instant (base + 1 ms), the earliest event: ts 0 on both rows.
    assert step == {0: 0.0, 100: 0.0}
    assert merged["baseTimeNanoseconds"] == BASE_NS + 1_000_000
    phases = [e for e in events if e.get("cat") == "harness_step"]
    assert [(e["name"], e["ts"], e["dur"]) for e in phases] == [
        ("data_wait", 0.0, 5.0),
        ("forward_backward", 5.0, 35.0),
        ("communication", 40.0, 30.0),
        ("optimizer", 70.0, 30.0),
    ]
    assert all(e["pid"] == 0 for e in phases)
    summary = harness.trace_summary(path)
    assert summary[0]["forward"] == pytest.approx(30e-6) and summary[0]["window"] == pytest.approx(100e-6)
    assert summary[0]["allreduce"] == pytest.approx(20e-6) and summary[1]["allreduce"] == pytest.approx(20e-6)


def _merged(events: list[dict[str, Any]]) -> dict[str, Any]:
    """A merged trace (harness.training.trace's layout): rank r's host row is pid r * 100."""
    return {"traceEvents": [{"ph": "X", "cat": "user_annotation", **event} for event in events]}


def _rank_events(pid: int, shift: float) -> list[dict[str, Any]]:
    """One profiled step of 100 us on thread 1, an allreduce on the communicator's thread 2 that
    overlaps backward, the enqueueing op on thread 1, and an allreduce before the step."""
    return [
        {"pid": pid, "tid": 1, "name": "ProfilerStep#2", "ts": shift, "dur": 100.0},
        {"pid": pid, "tid": 1, "name": "harness: forward", "ts": shift + 5, "dur": 30.0},
        {"pid": pid, "tid": 1, "name": "harness: backward", "ts": shift + 35, "dur": 40.0},
        {"pid": pid, "tid": 1, "name": "c10d::allreduce_", "ts": shift + 50, "dur": 1.0},
        {"pid": pid, "tid": 2, "name": "gloo:all_reduce", "ts": shift + 50, "dur": 30.0},
        {"pid": pid, "tid": 1, "name": "harness: gradient sync", "ts": shift + 80, "dur": 2.0},
        {"pid": pid, "tid": 1, "name": "harness: optimizer", "ts": shift + 82, "dur": 10.0},
        {"pid": pid, "tid": 2, "name": "gloo:all_reduce", "ts": shift - 50, "dur": 5.0},  # before the step
    ]


def _microseconds(spans: list[tuple[str, float, float]]) -> list[tuple[str, float, float]]:
    return [(kind, round(start * 1e6, 6), round(end * 1e6, 6)) for kind, start, end in spans]


def test_trace_spans_put_each_ranks_phases_and_allreduces_on_one_clock(tmp_path):
    path = str(tmp_path / "trace.json")
    _write(str(tmp_path), "trace.json", _merged(_rank_events(0, 1000.0) + _rank_events(100, 1010.0)))
    spans = harness.trace_spans(path)
    assert sorted(spans) == [0, 1]
    assert _microseconds(spans[0]["training thread"]) == [
        ("forward", 5, 35),
        ("backward", 35, 75),
        ("gradient sync", 80, 82),
        ("optimizer", 82, 92),
    ]
    # the communicator's allreduce only: not the training thread's enqueueing op, nor one before the step
    assert _microseconds(spans[0]["allreduces"]) == [("allreduce", 50, 80)]
    assert _microseconds(spans[1]["allreduces"]) == [("allreduce", 60, 90)]  # rank 1 began 10 us later
    figure = harness.trace_figure(path, title="two ranks")
    labels = [label.get_text() for label in figure.axes[0].get_yticklabels()]
    assert labels == ["rank 0 training thread", "rank 0 allreduces", "rank 1 training thread", "rank 1 allreduces"]
    assert figure.axes[0].get_title() == "two ranks"


def test_trace_figure_of_a_trace_without_profiled_steps_names_the_fix(tmp_path):
    _write(str(tmp_path), "trace.json", _merged([{"pid": 0, "tid": 1, "name": "harness: forward", "ts": 0, "dur": 1}]))
    with pytest.raises(harness.UsageError, match="--profile-trace"):
        harness.trace_figure(str(tmp_path / "trace.json"))
