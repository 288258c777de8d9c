"""Every collective a backend issues, timed where the rank meets it (harness.training.timing says why).

A `CollectiveMeter` per backend counts, per kind, the collectives issued, the bytes of the whole
(unsharded) buffer each works on, their seconds in flight (issued to completed) and the part of
those the rank's host thread spent blocked on them (exposed). The backends feed it:

- torch.distributed (DDP, FSDP2, DeepSpeed, the harness's own collectives): `torch_distributed_wrappers`
  gives stand-ins for torch.distributed's collective functions and for `Work.wait`, set for the
  run with Backend._set_attributes and put back at shutdown. A blocking call is exposed whole; an
  async one is in flight from the call to its future's completion, exposed while the host sits in
  its `wait()`. DeepSpeed and FSDP2 call these functions through the torch.distributed module
  (deepspeed.comm's TorchBackend; torch.distributed.fsdp._fully_shard._fsdp_collectives).
- DDP's buckets go through the default allreduce comm hook (a Python function calling
  dist.all_reduce), and the reducer waits for their futures inside backward, in C++ where no stand-in
  reaches: `waited_inside` counts as exposed the time from the last bucket's issue (the backward
  has nothing left to compute) to backward's return.
- Horovod: its backend registers each handle with `issued` and waits with `waiting`. Python learns
  that a handle completed only when it polls it (at the step's gradient sync), so a Horovod
  collective's time in flight, and with it the overlapped time, is an upper bound.

Kinds and bytes follow the record's schema: all_reduce, all_gather, reduce_scatter, broadcast;
bytes the whole buffer, so that a ring moves 2(n-1)/n x bytes per rank for all_reduce and
(n-1)/n x bytes for all_gather and reduce_scatter.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")
FIELDS = ("count", "bytes", "seconds", "exposed_seconds")


@dataclass
class InFlight:
    """One collective: its kind, and when it was issued and completed (host clock, seconds)."""

    kind: str
    issued: float
    completed: Optional[float] = None


@dataclass
class CollectiveMeter:
    """One rank's collectives, cumulative since it was made: `totals[kind]` holds count, bytes,
    seconds in flight and exposed seconds; `exposed` is the sum of exposed seconds over kinds, which
    the step timer reads at each phase boundary. Completions may be reported from a communication
    thread (a future's callback), hence the lock."""

    clock: Callable[[], float] = time.perf_counter
    totals: dict[str, list[float]] = field(default_factory=lambda: {kind: [0.0] * len(FIELDS) for kind in KINDS})
    exposed: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _region: Optional[list[InFlight]] = None  # the collectives issued inside `waited_inside`
    # Told the kind when the host starts waiting for a collective, None when it stops (the heartbeat:
    # a rank hung in a collective names it to its peers). Called on the waiting thread only.
    listener: Optional[Callable[[Optional[str]], None]] = None

    def issued(self, kind: str, nbytes: int, at: Optional[float] = None) -> InFlight:
        """A collective of `kind` on a buffer of `nbytes` has been issued (now, or `at`)."""
        one = InFlight(kind, self.clock() if at is None else at)
        row = self.totals[kind]
        with self._lock:
            row[0] += 1
            row[1] += nbytes
        if self._region is not None:
            self._region.append(one)
        return one

    def completed(self, one: InFlight, at: Optional[float] = None) -> None:
        """`one` has completed (now, or `at`); only its first report counts."""
        instant = self.clock() if at is None else at
        with self._lock:
            if one.completed is None:
                one.completed = instant
                self.totals[one.kind][2] += max(instant - one.issued, 0.0)

    def add_exposed(self, kind: str, seconds: float) -> None:
        """The host waited `seconds` for a collective of `kind`."""
        with self._lock:
            self.totals[kind][3] += seconds
            self.exposed += seconds

    @contextlib.contextmanager
    def waiting(self, one: InFlight) -> Iterator[None]:
        """The host blocks inside this block until `one` completes: exposed time, and its completion."""
        start = self.clock()
        if self.listener is not None:
            self.listener(one.kind)
        try:
            yield
        finally:
            end = self.clock()
            if self.listener is not None:
                self.listener(None)
            self.add_exposed(one.kind, end - start)
            self.completed(one, end)

    def blocking(self, kind: str, nbytes: int, call: Callable[[], Any]) -> Any:
        """Run a blocking collective `call`: in flight and exposed for its whole duration."""
        one = self.issued(kind, nbytes)
        with self.waiting(one):
            return call()

    @contextlib.contextmanager
    def waited_inside(self) -> Iterator[None]:
        """A block whose framework code waits, out of sight, for every collective issued in it before
        it returns (DDP's backward, whose reducer issues its last bucket once every gradient is
        computed and then waits for all of them): exposed from the last issue to the block's end."""
        self._region = region = []
        try:
            yield
        finally:
            self._region = None
            if region:
                self.add_exposed(region[-1].kind, max(self.clock() - region[-1].issued, 0.0))

    def snapshot(self) -> dict[str, list[float]]:
        """A copy of the totals, to subtract from a later one."""
        with self._lock:
            return {kind: list(row) for kind, row in self.totals.items()}


def window_totals(before: dict[str, list[float]], after: dict[str, list[float]]) -> list[float]:
    """The totals between two snapshots, flattened kind by kind in KINDS and FIELDS order."""
    return [after[kind][i] - before[kind][i] for kind in KINDS for i in range(len(FIELDS))]


def per_step_section(flat: Sequence[float], steps: int) -> dict[str, Any]:
    """The record's `collectives` (per kind, per step) and `communication_overlapped` (seconds per
    step) from window totals flattened as window_totals returns them, summed over ranks and divided
    by ranks x steps by the caller's choice of `steps`; kinds never issued are left out."""
    section: dict[str, dict[str, float]] = {}
    overlapped = 0.0
    for k, kind in enumerate(KINDS):
        row = dict(zip(FIELDS, flat[k * len(FIELDS) : (k + 1) * len(FIELDS)]))
        if row["count"] > 0:
            section[kind] = {name: value / steps for name, value in row.items()}
            overlapped += max(row["seconds"] - row["exposed_seconds"], 0.0) / steps
    return {"collectives": section, "communication_overlapped": overlapped}


# torch.distributed's collective functions: (kind, index of the argument whose size is the whole
# buffer, its keyword name, index of async_op). all_gather's whole buffer is its output; a
# reduce-scatter's its input. Their signatures: torch.distributed.distributed_c10d.
TORCH_COLLECTIVES: dict[str, tuple[str, int, str, int]] = {
    "all_reduce": ("all_reduce", 0, "tensor", 3),
    "all_reduce_coalesced": ("all_reduce", 0, "tensors", 3),
    "broadcast": ("broadcast", 0, "tensor", 3),
    "all_gather": ("all_gather", 0, "tensor_list", 3),
    "all_gather_into_tensor": ("all_gather", 0, "output_tensor", 3),
    "all_gather_single": ("all_gather", 0, "output_tensor", 3),
    "_all_gather_base": ("all_gather", 0, "output_tensor", 3),
    "reduce_scatter": ("reduce_scatter", 1, "input_list", 4),
    "reduce_scatter_tensor": ("reduce_scatter", 1, "input", 4),
    "reduce_scatter_single": ("reduce_scatter", 1, "input", 4),
    "_reduce_scatter_base": ("reduce_scatter", 1, "input", 4),
}


def nbytes(value: Any) -> int:
    """Bytes of a tensor, or of a list of tensors."""
    if isinstance(value, (list, tuple)):
        return sum(nbytes(one) for one in value)
    return value.numel() * value.element_size()


def _argument(args: tuple, kwargs: dict, index: int, name: str, default: Any = None) -> Any:
    return args[index] if len(args) > index else kwargs.get(name, default)


def _future_of(work: Any) -> Optional[Any]:
    """The work's future, or None where the process group has none for it (gloo's reduce_scatter:
    "Work::getFuture not implemented"); such a work completes when it is waited for."""
    try:
        return work.get_future()
    except RuntimeError:
        return None


def torch_distributed_wrappers(meter: CollectiveMeter, dist: Any) -> tuple[dict[str, Any], Callable]:
    """Stand-ins for torch.distributed's collective functions (by name, those `dist` has) that
    report to `meter`, and one for `dist.Work.wait` that times the waits on the works they return."""
    # id(work) -> (its collective, the work, kept alive so that its id stays its own, whether it
    # has a future), until it completes or is waited for
    pending: dict[int, tuple[InFlight, Any, bool]] = {}
    original_wait = dist.Work.wait

    def finished(key: int, one: InFlight) -> None:
        pending.pop(key, None)
        meter.completed(one)

    def wrap(function: Callable, kind: str, index: int, name: str, async_index: int) -> Callable:
        def collective(*args: Any, **kwargs: Any) -> Any:
            size = nbytes(_argument(args, kwargs, index, name))
            if not _argument(args, kwargs, async_index, "async_op", False):
                return meter.blocking(kind, size, lambda: function(*args, **kwargs))
            issued = meter.clock()
            work = function(*args, **kwargs)
            one = meter.issued(kind, size, at=issued)
            if isinstance(work, dist.Work):
                key = id(work)
                future = _future_of(work)
                pending[key] = (one, work, future is not None)
                if future is not None:
                    future.add_done_callback(lambda _: finished(key, one))
            elif work is not None:  # a Future (all_reduce_coalesced)
                work.add_done_callback(lambda _: meter.completed(one))
            return work

        collective.__wrapped__ = function
        return collective

    def wait(work: Any, *args: Any, **kwargs: Any) -> Any:
        entry = pending.pop(id(work), None)
        if entry is None:  # not one of ours, or completed already
            return original_wait(work, *args, **kwargs)
        with meter.waiting(entry[0]):
            result = original_wait(work, *args, **kwargs)
        if not entry[2]:  # no future to say when it completed: it has, now that the wait returned
            meter.completed(entry[0])
        return result

    wrappers = {
        name: wrap(getattr(dist, name), *spec) for name, spec in TORCH_COLLECTIVES.items() if hasattr(dist, name)
    }
    return wrappers, wait
