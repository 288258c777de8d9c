"""The step timer's arithmetic (harness.training.timing): exposed communication taken out of the phase
it happened in, on the host clock and through (stand-in) device events resolved at the window's close."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
import torch

from harness.backends.collectives import CollectiveMeter
from harness.training.timing import COLLECTIVE_COLUMNS, StepTimer, device_events

COMPUTE_S, IN_BACKWARD_S, IN_STEP_S, BETWEEN_S = 0.02, 0.03, 0.015, 0.01
STEPS = 3


class HostEvent:
    """A stand-in for torch.cuda.Event on a machine without a GPU: the host clock when recorded."""

    def __init__(self, enable_timing: bool = False) -> None:
        self.at = None

    def record(self) -> None:
        self.at = time.perf_counter()

    def elapsed_time(self, end: HostEvent) -> float:
        return 1000.0 * (end.at - self.at)


def _collective(meter: CollectiveMeter, seconds: float) -> None:
    meter.blocking("all_reduce", 1024, lambda: time.sleep(seconds))


@pytest.mark.parametrize("device_type", ["cpu", "cuda"])
def test_exposed_communication_leaves_the_phase_it_happened_in(monkeypatch, device_type):
    """A collective inside backward (ZeRO-2/3, FSDP), one in the optimizer step (ZeRO's all-gather),
    one between the steps (the preemption vote): all communication, the phases still add up."""
    monkeypatch.setattr(torch.cuda, "Event", HostEvent)
    timer = StepTimer(trace_steps=1, events=device_events(SimpleNamespace(type=device_type)))
    timer.collectives = meter = CollectiveMeter()
    timer.open_window()
    for _ in range(STEPS):
        timer.waiting_for_data()
        timer.data_ready()
        time.sleep(COMPUTE_S)
        _collective(meter, IN_BACKWARD_S)
        timer.gradients_ready()
        _collective(meter, IN_STEP_S)
        timer.stepped()
        exposed_in_steps = meter.exposed  # the vote after the last step is outside its phases
        _collective(meter, BETWEEN_S)
    timer.close_window()
    # the last step's vote falls after its end: it belongs to the next step, outside this window
    assert STEPS * (IN_BACKWARD_S + IN_STEP_S) + (STEPS - 1) * BETWEEN_S <= timer.communication
    assert timer.communication == pytest.approx(exposed_in_steps)
    assert STEPS * COMPUTE_S <= timer.forward_backward < STEPS * (COMPUTE_S + IN_BACKWARD_S)
    assert timer.optimizer < 0.02  # the step did nothing but its collective
    phases = timer.data_wait + timer.forward_backward + timer.communication + timer.optimizer
    assert phases <= timer.seconds
    totals = dict(zip(COLLECTIVE_COLUMNS, timer.collective_totals))
    # the window's collectives: those issued between its opening and its close, the last vote too
    assert totals["all_reduce_count"] == 3 * STEPS and totals["all_reduce_bytes"] == 3 * STEPS * 1024
    assert totals["all_reduce_exposed_seconds"] == pytest.approx(meter.exposed)
    wait_start, data_ready, communication_starts, ready, stepped = timer.trace[0]
    assert wait_start <= data_ready <= communication_starts <= ready <= stepped
    assert ready - communication_starts >= IN_BACKWARD_S


def test_a_window_without_collectives_is_all_compute():
    timer = StepTimer(trace_steps=0)
    timer.collectives = CollectiveMeter()
    timer.open_window()
    timer.waiting_for_data()
    timer.data_ready()
    time.sleep(COMPUTE_S)
    timer.gradients_ready()
    timer.stepped()
    timer.close_window()
    assert timer.communication == 0.0 and timer.forward_backward >= COMPUTE_S
    assert not any(timer.collective_totals)


def test_switched_off_it_counts_steps_and_times_no_phase():
    timer = StepTimer(trace_steps=2, enabled=False)
    timer.collectives = meter = CollectiveMeter()
    timer.open_window()
    for _ in range(2):
        timer.waiting_for_data()
        timer.data_ready()
        _collective(meter, 0.001)
        timer.gradients_ready()
        timer.stepped()
    timer.close_window()
    assert timer.steps == 2 and timer.trace == []
    assert timer.forward_backward == timer.communication == 0.0 and not any(timer.collective_totals)
