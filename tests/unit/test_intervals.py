"""Intervals over repeats: Student's t on logarithms paired by interleave round, and no ranking where they
overlap (their coverage: tests/unit/test_interval_coverage.py)."""

from __future__ import annotations

import pytest

from harness.study.scaling import intervals
from harness.study.scaling.plot import efficiency_figure
from harness.study.scaling.report import scaling_report, scaling_rows
from tests.helpers.handmade_records import record


def test_pairing_by_round_cancels_the_load_that_every_run_of_a_round_saw():
    # Round 1 ran on a loaded machine: both configurations ~40% slower, their ratio unchanged.
    baseline = {"0": 1000.0, "1": 600.0, "2": 1010.0}
    scaled = {"0": 1800.0, "1": 1085.0, "2": 1815.0}
    paired = intervals.ratio_interval(scaled, baseline)
    assert paired is not None and paired[0] > 1.78 and paired[1] < 1.82
    # Unpaired (each side's interval alone) the same numbers say far less.
    alone_low, alone_high = (
        intervals.mean_interval(list(scaled.values())),
        intervals.mean_interval(list(baseline.values())),
    )
    assert alone_low[0] / alone_high[1] < 1.5 < 2.0 < alone_low[1] / alone_high[0]
    assert intervals.ratio_interval({"0": 1.0}, {"0": 2.0}) is None  # one round: no interval
    assert intervals.ratio_interval(scaled, baseline) == paired  # no resampling: the same every time


def test_overlapping_intervals_chain_into_groups_that_are_not_ranked():
    groups = intervals.unresolved_groups({"a": (0.7, 0.8), "b": (0.78, 0.85), "c": (0.84, 0.9), "d": (0.95, 0.99)})
    assert groups == [["a", "b", "c"]]
    assert intervals.unresolved_groups({"a": (0.7, 0.8), "b": None}) == [["a", "b"]]  # no interval: unresolved
    assert intervals.unresolved_groups({"a": (0.5, 0.6), "b": (0.7, 0.8)}) == []


def _study(horovod_at_two: list[float]):
    runs = []
    for repeat, (one, ddp_two, horovod_two) in enumerate(
        zip([1000.0, 700.0, 990.0], [1800.0, 1270.0, 1790.0], horovod_at_two)
    ):
        runs += [
            record("ddp", 1, one, repeat=repeat),
            record("ddp", 2, ddp_two, repeat=repeat),
            record("horovod", 1, one - 20, repeat=repeat),
            record("horovod", 2, horovod_two, repeat=repeat),
        ]
    return runs


def test_the_report_ranks_only_what_its_intervals_resolve_and_says_so():
    close = _study([1790.0, 1275.0, 1800.0])
    text = scaling_report(close)
    assert "x2: ddp, horovod: not resolved at 3 repeats" in text
    assert "vs common baseline: efficiency against ddp x1 at 896.7 samples/s" in text
    assert "Student's t interval on logarithms" in scaling_report(close, explain=True)
    rows = {(row.backend, row.workers): row for row in scaling_rows(close)}
    low, high = rows["ddp", 2].efficiency_interval
    assert low <= rows["ddp", 2].efficiency <= high and high - low < 0.02  # paired: the slow round cancels
    apart = scaling_report(_study([1500.0, 1060.0, 1490.0]))
    assert "x2: ddp, horovod: not resolved" not in apart


def test_the_efficiency_figure_draws_its_intervals_and_says_what_is_not_resolved():
    close = _study([1790.0, 1275.0, 1800.0])
    rows = scaling_rows(close)
    metadata = efficiency_figure(rows, rows[0].study).harness_metadata
    assert metadata["not_resolved"] == ["x2: ddp, horovod: not resolved at 3 repeats"]
    ddp = next(series for series in metadata["series"] if series["backend"] == "ddp")
    assert ddp["interval"][0] is None and ddp["interval"][1] == pytest.approx(rows[1].efficiency_interval)
