"""The timed window and the step breakdown, checked against delays injected where they are known.

- Throughput: a dataset that sleeps in every fetch logs fetch times on its own clock; the
  harness's samples/s must equal samples / the wall time of the same steps by that clock (2%).
- Communication: a gradient sync that takes a known time (waited for after backward, or inside it
  as DDP does), and on two DDP ranks a rank that is slow to get its data (the other rank then
  waits in the allreduce), must show up as communication, not as compute; a slow backward must
  not. One rank under each registered backend's launcher communicates nothing.
"""

from __future__ import annotations

import gc
import time

import pytest
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

from harness import TrainConfig, train
from harness.backends import BACKENDS
from harness.backends.ddp import DDPBackend
from harness.backends.single import SingleProcessBackend
from harness.process.launchers import free_port
from tests.helpers.sleepy_data import outside_window_seconds, sleepy_task

FETCH_SLEEP_S = 0.02
SYNC_SLEEP_S = 0.08
SHORT_RUN = dict(batch_size=8, max_steps=25, timing_warmup_steps=5, threads=1, eval_every=0)


@pytest.fixture
def no_gc_pauses():
    """Python's cyclic GC can pause a big process for ~100 ms; in the sub-millisecond gap between a
    window boundary and the dataset's clock that would be an error of the test, not of the harness."""
    gc.disable()
    yield
    gc.enable()


def test_throughput_agrees_with_samples_over_outside_wall_time(no_gc_pauses):
    stamps: list = []
    record = train(TrainConfig(**{**SHORT_RUN, "max_steps": 45}), task=sleepy_task(FETCH_SLEEP_S, stamps))
    outside = outside_window_seconds(stamps, record["timing_warmup_steps"])
    assert record["timed_steps"] == 40
    assert record["throughput"] == pytest.approx(record["timed_steps"] * record["global_batch"] / outside, rel=0.02)
    # Sleeping in the fetch is waiting for data: at least the sleep per step, and little more.
    data_wait = record["step_breakdown"]["seconds_per_step"]["data_wait"]
    assert FETCH_SLEEP_S <= data_wait < FETCH_SLEEP_S + 0.01
    assert record["au"] < 0.9


class SlowSyncBackend(SingleProcessBackend):
    """The single-process backend with a gradient sync that takes a known time: a blocking allreduce
    it reports to its collective meter, as the real backends do."""

    name = "slow-sync"

    def finish_gradient_sync(self) -> None:
        self.collectives.blocking("all_reduce", 4, lambda: time.sleep(SYNC_SLEEP_S))


class SlowBackwardBackend(SingleProcessBackend):
    """The single-process backend whose backward computes for a known extra time before its gradients."""

    name = "slow-backward"

    def backward(self, loss, sync: bool) -> None:
        time.sleep(SYNC_SLEEP_S)
        super().backward(loss, sync)


class SlowAllreduceDDP(DDPBackend):
    """DDP at one rank made to reduce anyway, through an allreduce whose completion is delayed: DDP
    waits for it at the end of backward, inside `backward`, not in finish_gradient_sync."""

    name = "slow-allreduce-ddp"

    def wrap(self, model, make_optimizer, local_batch):
        wrapped = super().wrap(model, make_optimizer, local_batch)
        self.reduces = True

        def delayed(state, bucket):
            def arrive(future):
                time.sleep(SYNC_SLEEP_S)  # on the communication thread: the allreduce ends this much later
                return future.value()[0]

            return allreduce_hook(state, bucket).then(arrive)

        self.model.register_comm_hook(None, delayed)
        return wrapped


def _per_step(monkeypatch, backend) -> dict:
    monkeypatch.setitem(BACKENDS, backend.name, backend)
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    record = train(TrainConfig(backend=backend.name, task_args={"dataset": "synthetic"}, **SHORT_RUN))
    per_step = record["step_breakdown"]["seconds_per_step"]
    parts = sum(per_step[k] for k in ("data_wait", "forward_backward", "communication", "optimizer", "other"))
    assert parts == pytest.approx(per_step["runtime"])
    return {**per_step, "record": record}


@pytest.mark.parametrize("backend", [SlowSyncBackend, SlowAllreduceDDP])
def test_a_slow_gradient_sync_is_communication_wherever_the_backend_waits(monkeypatch, backend):
    per_step = _per_step(monkeypatch, backend)
    # The sleep is all communication; a machine this busy may stretch it, never shrink it.
    assert SYNC_SLEEP_S <= per_step["communication"] <= 1.5 * SYNC_SLEEP_S + 0.01
    assert per_step["forward_backward"] < per_step["runtime"] - SYNC_SLEEP_S
    record = per_step["record"]
    # One rank: perfectly balanced; the sync's share of the run is lost to communication.
    assert record["load_balance"] == pytest.approx(1.0)
    assert record["communication_efficiency"] < 1 - 0.9 * SYNC_SLEEP_S / per_step["runtime"]
    assert record["parallel_efficiency"] == pytest.approx(record["communication_efficiency"])


def test_slow_compute_before_the_last_gradient_is_not_communication(monkeypatch):
    per_step = _per_step(monkeypatch, SlowBackwardBackend)
    assert per_step["forward_backward"] >= SYNC_SLEEP_S
    assert per_step["communication"] < 0.05 * per_step["runtime"]
    assert per_step["record"]["communication_efficiency"] >= 0.95


def test_the_calibrated_compute_is_a_cross_check_beside_the_window():
    record = train(TrainConfig(task_args={"dataset": "synthetic"}, calibration_steps=3, **SHORT_RUN))
    breakdown = record["step_breakdown"]
    assert breakdown["calibration_steps"] == 3 and breakdown["compute_per_step_calibrated"][0] > 0
    plain = train(TrainConfig(task_args={"dataset": "synthetic"}, **SHORT_RUN))["step_breakdown"]
    assert plain["compute_per_step_calibrated"] == [None]
    assert plain["seconds_per_step"]["communication"] is not None
