"""95% intervals of throughput, speedup and efficiency over a study's repeats, and which
configurations they can tell apart.

A sweep runs its repeats in interleaved rounds (harness.study.scaling.sweep): in each round every run of
the study once, in a seeded random order. Run-to-run noise on a machine is multiplicative (a
loaded round is some percent slower, whatever the configuration), so every interval is a Student's
t interval on logarithms: a mean of throughputs is the t interval of the mean of their logs (the
geometric mean), and a ratio of two configurations is the t interval of the mean of the log ratios
of their runs paired by round (a run's neighbours in its round saw the same load, which cancels).
Under log-normal noise these intervals cover the true value 95% of the time at any number of
rounds; the percentile bootstrap this module used before covered it 46-74% of the time at 2-3
rounds, where its "95% interval" is little more than the range of the values
(tests/unit/test_interval_coverage.py simulates the coverage; docs/concepts/measurement.md says why).

Below MIN_ROUNDS values (or shared rounds) there is no interval: the functions return None, which
callers print as `missing()` ("n/a (needs 3 rounds)"), and nothing is resolved. Two
configurations whose intervals overlap are "not resolved at N repeats": the report and the figures
say so instead of ranking them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Optional

from ...training.record import mean_and_ci95

# Two rounds give one degree of freedom: t's 97.5th percentile is 12.7, so the interval is the
# mean +- 6.4 times the difference of the two values, and whether the noise is log-normal cannot
# be seen at all. Three give two (t = 4.3), the fewest at which an interval can resolve anything.
MIN_ROUNDS = 3

Interval = tuple[float, float]
Rounds = Mapping[str, float]  # interleave round (the record's `repeat` tag) -> the run's throughput


def missing() -> str:
    """How a missing interval is printed: 'n/a (needs 3 rounds)'."""
    return f"n/a (needs {MIN_ROUNDS} rounds)"


def _t_interval(values: Sequence[float]) -> Optional[Interval]:
    """The 95% Student's t interval of the mean of `values` (None below MIN_ROUNDS values)."""
    if len(values) < MIN_ROUNDS:
        return None
    spread = mean_and_ci95(list(values))
    return spread["mean"] - spread["ci95"], spread["mean"] + spread["ci95"]


def _logs(values: Sequence[float]) -> list[float]:
    if any(not value > 0 for value in values):
        raise ValueError(f"an interval on logarithms needs positive values, got {list(values)}")
    return [math.log(value) for value in values]


def geometric_mean(values: Sequence[float]) -> float:
    """exp(mean(log values)): the centre, on the log scale, of `mean_interval`'s interval."""
    logs = _logs(values)
    return math.exp(sum(logs) / len(logs))


def _exp_interval(logs: Sequence[float], scale: float = 1.0) -> Optional[Interval]:
    """scale x exp of the t interval of the mean of `logs` (None below MIN_ROUNDS)."""
    interval = _t_interval(logs)
    return None if interval is None else (scale * math.exp(interval[0]), scale * math.exp(interval[1]))


def mean_interval(values: Sequence[float]) -> Optional[Interval]:
    """The 95% interval of the (geometric) mean of positive `values`, such as throughputs: Student's t
    on their logarithms; None with fewer than MIN_ROUNDS values."""
    return _exp_interval(_logs(values))


def ratio_interval(numerator: Rounds, denominator: Rounds, scale: float = 1.0) -> Optional[Interval]:
    """The 95% interval of scale x numerator / denominator, paired by the rounds both have: Student's t
    on the log ratios of the rounds; None with fewer than MIN_ROUNDS shared rounds. With one run per
    round on each side it is the interval of a speedup (scale 1) or of an efficiency (scale baseline
    workers / workers)."""
    shared = sorted(set(numerator) & set(denominator))
    tops, bottoms = _logs([numerator[key] for key in shared]), _logs([denominator[key] for key in shared])
    return _exp_interval([top - bottom for top, bottom in zip(tops, bottoms)], scale)


def difference_interval(differences: Sequence[float]) -> Optional[Interval]:
    """The 95% Student's t interval of the mean of paired differences (of either sign, so not on
    logarithms), e.g. seconds one way minus seconds the other, round by round; None below MIN_ROUNDS."""
    return _t_interval(differences)


def overlap(first: Optional[Interval], second: Optional[Interval]) -> bool:
    """Whether two intervals share a value; a missing interval overlaps everything (nothing is resolved)."""
    if first is None or second is None:
        return True
    return first[0] <= second[1] and second[0] <= first[1]


def unresolved_groups(intervals: Mapping[str, Optional[Interval]]) -> list[list[str]]:
    """The labels whose intervals chain into overlapping groups of two or more, each group in the
    order given: within a group no ranking holds at this number of repeats."""
    labels = list(intervals)
    parent = {label: label for label in labels}

    def root(label: str) -> str:
        while parent[label] != label:
            label = parent[label]
        return label

    for index, first in enumerate(labels):
        for second in labels[index + 1 :]:
            if overlap(intervals[first], intervals[second]):
                parent[root(second)] = root(first)
    groups: dict[str, list[str]] = {}
    for label in labels:
        groups.setdefault(root(label), []).append(label)
    return [group for group in groups.values() if len(group) > 1]


def error_bars(values: Sequence[Optional[float]], bounds: Sequence[Optional[Interval]]) -> list[list[float]]:
    """matplotlib's asymmetric yerr ([below], [above]) from 95% intervals; 0 where there is none."""
    below = [v - b[0] if b is not None and v is not None else 0.0 for v, b in zip(values, bounds)]
    above = [b[1] - v if b is not None and v is not None else 0.0 for v, b in zip(values, bounds)]
    return [[max(x, 0.0) for x in below], [max(x, 0.0) for x in above]]
