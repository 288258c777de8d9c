"""The committed benchmarks run end to end on a fresh clone and print their tables (a few steps
each: this checks that they work, not the figures, which only a quiet machine gives)."""

from __future__ import annotations

import os
import sys

import pytest

from .conftest import REPO, run

BENCHMARKS = os.path.join(REPO, "benchmarks")


@pytest.mark.slow
def test_the_overhead_benchmark_compares_every_variant():
    result = run([sys.executable, os.path.join(BENCHMARKS, "throughput.py"), "--repeats", "1", "--steps", "3"],
                 timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for row in ("| bare loop, as written |", "| bare loop, reuse |", "| harness none |", "| bare DDP, reuse |",
                "| bare Horovod, as written |", "| harness ddp |", "| harness horovod |", "| harness deepspeed |"):
        assert row in result.stdout, result.stdout


@pytest.mark.slow
def test_the_scaling_benchmark_reports_efficiency_for_every_backend():
    result = run([sys.executable, os.path.join(BENCHMARKS, "scaling.py"), "--repeats", "1", "--steps", "3",
                  "--bare-repeats", "1"], timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for row in ("| ddp |", "| horovod |", "| deepspeed |", "| bare loops with reuse (reference, medians) |"):
        assert row in result.stdout, result.stdout
