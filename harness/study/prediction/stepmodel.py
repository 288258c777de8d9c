"""One rank's optimizer step laid out in time: its compute in pieces, each backend's collectives
(harness.backends.traffic) on one communication channel, and what of them the step waits for.

The forward is cut into as many pieces as it has weight gathers, the backward into as many as it
has gathers or gradient reductions; a gather must end before its piece starts (an overlapped one
is issued one piece ahead, as FSDP2 and ZeRO-3 prefetch), a reduction starts when its piece ends
(an overlapped one runs while the next pieces compute, a blocking one holds the compute). The
calls share one channel, one after another (they share the node's links). Then the step waits
for the backward's reductions, runs the after-backward calls, the optimizer, the after-step calls.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Callable

from ...backends.traffic import Collective

BACKWARD_SHARE = 2 / 3  # backward costs twice the forward


@dataclass(frozen=True)
class Timing:
    """Seconds of one step's collectives: in flight in all, and not hidden behind compute."""

    total_s: float
    exposed_s: float


def _expand(calls: Sequence[Collective], phase: str, price: Callable[[Collective], float]) -> list[float]:
    return [price(call) for call in calls if call.phase == phase for _ in range(call.count)]


def _blocking(calls: Sequence[Collective], phase: str) -> bool:
    return not all(call.overlapped for call in calls if call.phase == phase)


def _pieces(
    start: float, free: float, compute: float, before: list[float], after: list[float], blocking: tuple[bool, bool]
) -> tuple[float, float]:
    """(when the compute ends, when the channel is free) for a phase of `compute` seconds cut into
    pieces, with gathers `before` and reductions `after` them."""
    count = max(len(before), len(after), 1)
    piece = compute / count
    gathers_at: dict[int, list[float]] = defaultdict(list)
    for index, seconds in enumerate(before):
        gathers_at[index * count // len(before)].append(seconds)
    reduces_at: dict[int, list[float]] = defaultdict(list)
    for index, seconds in enumerate(after):
        reduces_at[math.ceil((index + 1) * count / len(after)) - 1].append(seconds)
    ready: dict[int, float] = {}

    def gather(index: int, at: float) -> None:
        nonlocal free
        for seconds in gathers_at.get(index, []):
            free = max(free, at) + seconds
        ready[index] = free if gathers_at.get(index) else at

    now = start
    gather(0, now)
    for index in range(count):
        if blocking[0] and index:
            gather(index, now)
        now = max(now, ready.get(index, now))
        if not blocking[0] and index + 1 < count:
            gather(index + 1, now)  # prefetched while this piece computes
        now += piece
        for seconds in reduces_at.get(index, []):
            free = max(free, now) + seconds
            if blocking[1]:
                now = free
    return now, free


def step_communication(
    calls: Sequence[Collective],
    price: Callable[[Collective], float],
    forward_s: float,
    backward_s: float,
    optimizer_s: float,
) -> Timing:
    """The collectives' seconds per step (all, and exposed) for one rank's compute phases."""
    priced = {phase: _expand(calls, phase, price) for phase in {call.phase for call in calls}}
    end, free = _pieces(
        0.0, 0.0, forward_s, priced.get("forward_gather", []), [], (_blocking(calls, "forward_gather"), True)
    )
    end, free = _pieces(
        end,
        free,
        backward_s,
        priced.get("backward_gather", []),
        priced.get("backward_reduce", []),
        (_blocking(calls, "backward_gather"), _blocking(calls, "backward_reduce")),
    )
    end = max(end, free) + sum(priced.get("after_backward", [])) + optimizer_s + sum(priced.get("after_step", []))
    total = sum(sum(values) for values in priced.values())
    return Timing(total, max(end - forward_s - backward_s - optimizer_s, 0.0) if total else 0.0)
