"""`--profile-trace` and `harness trace merge`: per-rank profiler traces become one trace with a row
per rank on one clock (hand-made traces), and a real 2-rank DDP run's merged trace holds both
ranks' gradient allreduce."""

from __future__ import annotations

import json
import os

import harness
from tests.conftest import harness as run_harness
from tests.conftest import launch


def test_merge_cli_refuses_bad_input_in_one_line(tmp_path):
    result = run_harness("trace", "merge", str(tmp_path))
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "--profile-trace" in result.stderr
    (tmp_path / "rank-0.json").write_text("{not json")
    result = run_harness("trace", "merge", str(tmp_path))
    assert result.returncode == 2 and "not a readable JSON trace" in result.stderr
    assert not (tmp_path / "trace.json").exists()  # nothing half-written


def test_profile_trace_into_an_unwritable_place_is_refused_before_training(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = run_harness("train", "--profile-trace", str(blocker / "trace"), "--max-steps", "1")
    assert result.returncode == 2
    assert "choose a writable directory" in result.stderr and result.stderr.strip().count("\n") == 0


def test_a_two_rank_ddp_run_gives_one_trace_with_both_ranks_allreduce(tmp_path):
    directory = str(tmp_path / "trace")
    launch(
        2,
        "ddp",
        [
            "--max-steps",
            "8",
            "--timing-warmup-steps",
            "2",
            "--batch-size",
            "16",
            "--threads",
            "1",
            "--eval-every",
            "0",
            "--profile-trace",
            directory,
        ],
    )
    assert sorted(os.listdir(directory)) == [
        "rank-0.json",
        "rank-0.steps.json",
        "rank-1.json",
        "rank-1.steps.json",
        "trace.json",
    ]
    events = json.load(open(os.path.join(directory, "trace.json")))["traceEvents"]
    for pid in (0, 100):
        names = {e["name"] for e in events if e["pid"] == pid and e["ph"] == "X"}
        assert {"harness: forward", "harness: backward", "harness: optimizer", "forward_backward"} <= names
        assert any("all_reduce" in name or "allreduce" in name for name in names), sorted(names)[:20]
    summary = harness.trace_summary(os.path.join(directory, "trace.json"))
    assert set(summary) == {0, 1} and all(one["allreduce"] > 0 and one["backward"] > 0 for one in summary.values())
