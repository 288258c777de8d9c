"""The collective meter's bookkeeping (harness.backends.collectives) from handmade intervals on a
clock the test sets, and the bytes it counts per kind through the torch.distributed stand-ins."""

from __future__ import annotations

import pytest
import torch

from harness.backends.collectives import CollectiveMeter, per_step_section, torch_distributed_wrappers, window_totals


class Clock:
    """A clock that reads what the test set."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def test_an_async_collective_is_exposed_only_while_the_host_waits(clock):
    meter = CollectiveMeter(clock=clock)
    one = meter.issued("all_reduce", 400)  # t=0
    clock.now = 0.8  # the rank computes meanwhile
    with meter.waiting(one):
        clock.now = 1.0
    kind = meter.totals["all_reduce"]
    assert kind == [1, 400, pytest.approx(1.0), pytest.approx(0.2)]
    assert meter.exposed == pytest.approx(0.2)
    section = per_step_section(window_totals(CollectiveMeter().snapshot(), meter.snapshot()), steps=1)
    assert section["communication_overlapped"] == pytest.approx(0.8)


def test_a_collective_done_before_its_wait_keeps_its_completion_and_exposes_nothing_more(clock):
    meter = CollectiveMeter(clock=clock)
    one = meter.issued("reduce_scatter", 64)
    meter.completed(one, at=0.5)  # its future's callback, on the communication thread
    clock.now = 2.0
    with meter.waiting(one):
        pass
    assert meter.totals["reduce_scatter"][2] == pytest.approx(0.5)  # in flight 0 -> 0.5, not to 2.0
    assert meter.exposed == 0.0


def test_a_blocking_collective_is_exposed_whole(clock):
    meter = CollectiveMeter(clock=clock)

    def call() -> str:
        clock.now += 0.3
        return "result"

    assert meter.blocking("broadcast", 8, call) == "result"
    assert meter.totals["broadcast"] == [1, 8, pytest.approx(0.3), pytest.approx(0.3)]


def test_a_wait_out_of_sight_is_exposed_from_the_last_issue_to_the_blocks_end(clock):
    """DDP: buckets issued during backward, waited for by the reducer in C++ before backward returns."""
    meter = CollectiveMeter(clock=clock)
    with meter.waited_inside():
        first = meter.issued("all_reduce", 100)
        clock.now = 0.5
        meter.issued("all_reduce", 300)  # the last bucket: every gradient is computed
        meter.completed(first, at=0.7)
        clock.now = 1.2
    assert meter.exposed == pytest.approx(0.7)
    assert meter.totals["all_reduce"][:2] == [2, 400]
    with meter.waited_inside():  # a block that issues nothing (one rank) exposes nothing
        clock.now = 5.0
    assert meter.exposed == pytest.approx(0.7)


def test_per_step_section_divides_by_steps_and_leaves_out_kinds_never_issued(clock):
    meter = CollectiveMeter(clock=clock)
    before = meter.snapshot()
    for _ in range(4):
        one = meter.issued("all_gather", 1000)
        clock.now += 1.0
        with meter.waiting(one):
            clock.now += 0.25
    section = per_step_section(window_totals(before, meter.snapshot()), steps=2)
    assert set(section["collectives"]) == {"all_gather"}
    assert section["collectives"]["all_gather"] == {
        "count": 2,
        "bytes": 2000,
        "seconds": pytest.approx(2.5),
        "exposed_seconds": pytest.approx(0.5),
    }
    assert section["communication_overlapped"] == pytest.approx(2.0)


class FakeWork:
    """A torch.distributed Work whose future the test completes; its wait takes `WAIT_S` of `clock`."""

    WAIT_S = 0.2
    clock: Clock

    def __init__(self) -> None:
        self.future: torch.futures.Future = torch.futures.Future()

    def get_future(self) -> torch.futures.Future:
        return self.future

    def wait(self) -> bool:
        if not self.future.done():
            self.clock.now += self.WAIT_S
        return True


def _fake_dist() -> type:
    def collective(*args, async_op=False, **kwargs):
        return FakeWork() if async_op else None

    names = (
        "all_reduce all_reduce_coalesced broadcast all_gather all_gather_into_tensor all_gather_single "
        "_all_gather_base reduce_scatter reduce_scatter_tensor reduce_scatter_single _reduce_scatter_base"
    ).split()
    return type("FakeDist", (), {"Work": FakeWork, **{name: staticmethod(collective) for name in names}})


def test_bytes_per_kind_are_the_whole_buffer_for_every_wrapped_function(clock):
    """all_gather counts its (whole) output, reduce_scatter its (whole) input, as the record's schema says."""
    meter = CollectiveMeter(clock=clock)
    wrappers, _ = torch_distributed_wrappers(meter, _fake_dist())
    whole, shard = torch.zeros(8), torch.zeros(4)  # float32: 32 and 16 bytes; 2 ranks
    wrappers["all_reduce"](whole)
    wrappers["all_reduce_coalesced"]([whole, shard])
    wrappers["broadcast"](torch.zeros(3, dtype=torch.float64), src=0)
    wrappers["all_gather"]([shard, shard], shard)
    wrappers["all_gather_into_tensor"](whole, shard)
    wrappers["all_gather_single"](output_tensor=whole, input_tensor=shard)
    wrappers["_all_gather_base"](whole, shard)
    wrappers["reduce_scatter"](shard, [shard, shard])
    wrappers["reduce_scatter_tensor"](shard, whole)
    wrappers["reduce_scatter_single"](output=shard, input=whole)
    wrappers["_reduce_scatter_base"](shard, whole)
    counted = {kind: row[:2] for kind, row in meter.totals.items()}
    assert counted == {
        "all_reduce": [2, 32 + 48],
        "broadcast": [1, 24],
        "all_gather": [4, 4 * 32],
        "reduce_scatter": [4, 4 * 32],
    }


def test_async_works_are_in_flight_to_their_future_and_exposed_in_their_wait(clock):
    meter = CollectiveMeter(clock=clock)
    FakeWork.clock = clock
    wrappers, wait = torch_distributed_wrappers(meter, _fake_dist())
    done_early = wrappers["all_reduce"](torch.zeros(4), async_op=True)
    waited_for = wrappers["reduce_scatter_tensor"](torch.zeros(2), torch.zeros(4), async_op=True)
    clock.now = 0.5
    done_early.future.set_result(None)  # completes while the rank computes
    clock.now = 1.0
    wait(done_early)  # nothing left to wait for: no exposure
    clock.now = 1.5
    wait(waited_for)  # the host blocks 1.5 -> 1.7, when the work completes
    assert meter.totals["all_reduce"][2:] == [pytest.approx(0.5), 0.0]
    assert meter.totals["reduce_scatter"][2:] == [pytest.approx(1.7), pytest.approx(0.2)]
    assert meter.exposed == pytest.approx(0.2)
    wait(FakeWork())  # a work the meter did not issue passes straight through
    assert meter.totals["reduce_scatter"][0] == 1
