"""What a backend sends per optimizer step, as data a cost model can price (no torch, no framework).

Each backend declares its own pattern (`Backend.traffic`), so that nothing outside this package
knows how a framework communicates; harness.study.prediction.predict composes the patterns with a network.

A `Collective` is one call repeated `count` times in a step, of `bytes` = the whole (unsharded)
buffer it works on (the record schema's `step_breakdown.collectives`): a ring moves 2(n-1)/n x
bytes per rank for all_reduce and (n-1)/n x bytes for all_gather and reduce_scatter. Where in the
step it runs (`phase`) and whether compute goes on meanwhile (`overlapped`) decide how much of it
the step waits for:
- forward_gather: before each of `count` forward pieces (ZeRO-3, FSDP: the weights of one unit);
- backward_gather: before each of `count` backward pieces (the same weights again, when freed);
- backward_reduce: after each of `count` backward pieces (a bucket of gradients is ready);
- after_backward: once the whole backward is done, before the optimizer;
- after_step: after the optimizer (ZeRO-1/2: every rank's updated slice to all).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")
PHASES = ("forward_gather", "backward_gather", "backward_reduce", "after_backward", "after_step")


@dataclass(frozen=True)
class ModelShape:
    """What a traffic pattern needs to know of the model: its float32 parameter bytes, those of
    each top-level child (FSDP's units: fully_shard per child and on the root), and of each module
    that holds parameters itself (ZeRO-3 gathers per such module)."""

    parameter_bytes: int
    unit_bytes: tuple[int, ...] = ()
    module_bytes: tuple[int, ...] = ()

    def units(self) -> tuple[int, ...]:
        return self.unit_bytes or (self.parameter_bytes,)

    def modules(self) -> tuple[int, ...]:
        return self.module_bytes or self.units()


@dataclass(frozen=True)
class Collective:
    """One kind of call in a step: `count` calls of `bytes` each (whole buffer), in `phase`."""

    kind: str
    bytes: int
    count: int
    phase: str
    overlapped: bool

    def __post_init__(self) -> None:
        assert self.kind in KINDS and self.phase in PHASES, (self.kind, self.phase)


def in_buckets(kind: str, sizes: Sequence[int], bucket: int, phase: str, overlapped: bool) -> list[Collective]:
    """Buffers of `sizes` (in the order they become ready) packed into buckets of at most `bucket`
    bytes, as DDP's reducer and Horovod's fusion fill them; one Collective per bucket."""
    calls, filling = [], 0
    for size in sizes:
        if filling and filling + size > bucket:
            calls.append(filling)
            filling = 0
        filling += size
    if filling:
        calls.append(filling)
    return [Collective(kind, size, 1, phase, overlapped) for size in calls]


def evenly(kind: str, total: int, bucket: int, phase: str, overlapped: bool) -> list[Collective]:
    """`total` bytes in calls of `bucket` bytes (the last one the rest)."""
    count = max(1, math.ceil(total / bucket))
    full = min(bucket, total)
    rest = total - full * (count - 1)
    calls = [Collective(kind, full, count - 1, phase, overlapped)] if count > 1 else []
    return calls + [Collective(kind, rest, 1, phase, overlapped)]


def per_step(collectives: Sequence[Collective]) -> dict[str, dict[str, int]]:
    """{kind: {"count": calls, "bytes": bytes summed over calls}}, the record schema's shape."""
    totals: dict[str, dict[str, int]] = {}
    for call in collectives:
        entry = totals.setdefault(call.kind, {"count": 0, "bytes": 0})
        entry["count"] += call.count
        entry["bytes"] += call.count * call.bytes
    return totals
