"""95% intervals of throughput, speedup and efficiency over a study's repeats, and which
configurations they can tell apart.

A sweep runs its repeats in interleaved rounds (harness.study.sweep): in each round every run of
the study once, in a seeded random order. A run's neighbours in its round saw the same load on the
machine, so a ratio of two configurations is taken round by round (paired) and the rounds are
resampled together: the bootstrap draws `RESAMPLES` sets of rounds with replacement from a
generator seeded with `SEED`, and the interval is the 2.5th to 97.5th percentile of the ratio of
the means. Student's t is not used: over 2-3 runs it assumes a normal spread nobody has seen.

Two configurations whose intervals overlap are "not resolved at N repeats": the report and the
figures say so instead of ranking them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Optional

import numpy as np

RESAMPLES = 2000
SEED = 0
LEVEL = 0.95

Interval = tuple[float, float]
Rounds = Mapping[str, float]  # interleave round (the record's `repeat` tag) -> the run's throughput


def _percentiles(draws: np.ndarray) -> Interval:
    tail = 100 * (1 - LEVEL) / 2
    low, high = np.percentile(draws, [tail, 100 - tail])
    return float(low), float(high)


def mean_interval(values: Sequence[float]) -> Optional[Interval]:
    """The bootstrap interval of the mean of `values` (None with fewer than two)."""
    if len(values) < 2:
        return None
    data = np.asarray(values, dtype=float)
    picks = np.random.default_rng(SEED).integers(0, len(data), size=(RESAMPLES, len(data)))
    return _percentiles(data[picks].mean(axis=1))


def ratio_interval(numerator: Rounds, denominator: Rounds, scale: float = 1.0) -> Optional[Interval]:
    """The bootstrap interval of scale x mean(numerator) / mean(denominator), resampling the rounds
    both have (paired); None with fewer than two shared rounds. With one run per round on each side
    it is the interval of a speedup (scale 1) or of an efficiency (scale baseline workers / workers)."""
    shared = sorted(set(numerator) & set(denominator))
    if len(shared) < 2:
        return None
    top = np.asarray([numerator[key] for key in shared], dtype=float)
    bottom = np.asarray([denominator[key] for key in shared], dtype=float)
    picks = np.random.default_rng(SEED).integers(0, len(shared), size=(RESAMPLES, len(shared)))
    return _percentiles(scale * top[picks].mean(axis=1) / bottom[picks].mean(axis=1))


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
