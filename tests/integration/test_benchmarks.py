"""The committed benchmarks run end to end on a fresh clone and print their tables (a few steps
each and one harness backend, DDP: this checks that they work, not the figures, which only a quiet
machine gives; every backend's own runs are tested elsewhere)."""

from __future__ import annotations

import os
import re
import sys

import pytest

from tests.conftest import REPO, run

BENCHMARKS = os.path.join(REPO, "benchmarks")


@pytest.mark.slow
def test_the_overhead_benchmark_compares_a_backend_with_its_own_bare_loop():
    result = run(
        [
            sys.executable,
            os.path.join(BENCHMARKS, "throughput.py"),
            "--rounds",
            "1",
            "--steps",
            "3",
            "--backends",
            "ddp",
        ],
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "round 1: bare ddp " in result.stdout and "round 1: harness ddp " in result.stdout, result.stdout
    # One round gives a ratio but no interval, and so no verdict on the goal.
    assert re.search(
        r"\| harness ddp \| \d+ \| bare ddp \| \d+ \| [\d.]+ \| n/a \| >= 0.97 \(not shown\) \|", result.stdout
    ), result.stdout


@pytest.mark.slow
def test_the_scaling_benchmark_reports_the_efficiency_of_a_backend_and_of_the_bare_loops():
    result = run(
        [
            sys.executable,
            os.path.join(BENCHMARKS, "scaling.py"),
            "--repeats",
            "1",
            "--steps",
            "3",
            "--bare-repeats",
            "1",
            "--backends",
            "none,ddp",
        ],
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for row in ("| none |", "| ddp |", "| bare loops with reuse (reference, medians) |"):
        assert row in result.stdout, result.stdout


@pytest.mark.slow
def test_the_heartbeat_benchmark_reports_the_ratio_on_over_off():
    result = run(
        [sys.executable, os.path.join(BENCHMARKS, "heartbeat.py"), "--pairs", "1", "--steps", "8"], timeout=600
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for row in ("| on |", "| off |", "ratio on/off: median ", "added per step: "):
        assert row in result.stdout, result.stdout


@pytest.mark.slow
def test_the_breakdown_cost_benchmark_bounds_the_ratio_from_what_a_step_adds():
    command = [sys.executable, os.path.join(BENCHMARKS, "breakdown_cost.py"), "--repeats", "1", "--steps", "5"]
    command += ["--hook-rounds", "2", "--hook-steps", "5"]
    result = run([*command, "--backends", "ddp"], timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "added in this process: " in result.stdout and "| ddp | " in result.stdout, result.stdout
    row = next(line for line in result.stdout.splitlines() if line.startswith("| ddp | "))
    calls, added_us, bound = (float(row.split("|")[column]) for column in (6, 7, 8))
    assert calls >= 2 and bound < 1.0  # DDP's buckets and the preemption vote, each metered
    assert "DDP on two ranks (a core each), 2 rounds in a random order (seed 0)" in result.stdout, result.stdout
    hook_us = float(result.stdout.split("added to the rows whose buckets took it: ")[1].split(" us")[0])
    assert hook_us >= 0 and added_us >= hook_us - 0.5, (added_us, hook_us)  # DDP's buckets took the metered hook
