"""Where a step's time goes: the timed window, per-phase totals, every collective, a per-rank
timeline (definitions: harness.training.metrics).

Four instants of each step are marked on every rank, from the phases the loop enters
(harness.training.phases): it starts waiting for data, the data is
on the device, the averaged gradients are ready (Backend.finish_gradient_sync returned), the
optimizer has stepped. `StepTimer` sums the phases over the timed window (which opens and closes
at barriers, so it spans the slowest rank's work) and keeps the instants of the first
`trace_steps` timed steps for a timeline. After training, `gather_breakdown` collects every
rank's numbers in one collective and derives AU, the POP metrics and the contention verdict.

Communication is the time the rank's host was blocked on a collective (EXPOSED), wherever in the
step it happened, taken out of the phase it happened in, so the phases still add up to the step.
Each backend's `collectives` meter (harness.backends.collectives) sees every collective it issues:
torch.distributed's functions and Work.wait wrapped for the run (FSDP2's all-gathers and
reduce-scatters, ZeRO's reduce-scatters, all-gathers and broadcasts, the harness's own
allreduces), DDP's buckets through the default allreduce comm hook, Horovod's handles. Each
collective's time in flight (issued to completed) beyond its exposed part was hidden behind compute
(`communication_overlapped`). Why this method:
- The earlier one, last parameter gradient to averaged gradients, missed every collective inside
  backward or the optimizer step: FSDP2's hooks fire only after its reduce-scatter and its
  all-gathers ran inside forward and backward; ZeRO-2/3 reduce from gradient hooks and ZeRO >= 1
  all-gathers the weights in the optimizer step. All of that counted as compute.
- torch.profiler sees the collectives too, but it records every operator: it costs a share of each
  step and changes what it measures (it holds the GIL in its callbacks, and on a GPU it
  synchronises), and it does not see Horovod's operations.
- NCCL's own timing (its profiler plugin, NCCL_DEBUG timings) exists on GPUs only and knows
  nothing of gloo, MPI or Horovod's CPU operations.
Wrapping the calls costs two clock reads and a dict entry per collective (benchmarks/
breakdown_cost.py measures the whole breakdown's cost), and is the same for every backend.

On a GPU every phase boundary is also a device event on the current stream, resolved when the
window closes (after the barrier that waits for the device), so the phases are device time whatever
the precision and no phase synchronises; the exposed time is still the host's (with NCCL a
Work.wait makes the stream wait rather than the host, so it reads near zero there). On the CPU the
host clock is the device clock. `--profile` additionally waits for the device at every boundary.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Callable, Optional

import torch
from torch import nn

from ..backends.collectives import FIELDS, KINDS, CollectiveMeter, per_step_section, window_totals
from ..process import phases
from ..process.phases import TRACE_COLUMNS, Phase
from .contention import CpuMeter
from .memory import MODEL_STATE, WindowPeak, memory_section
from .metrics import POP_KEYS, accelerator_utilisation, contention_summary, pop_metrics, rank_breakdown

COLLECTIVE_COLUMNS = tuple(f"{kind}_{name}" for kind in KINDS for name in FIELDS)
WAIT, DATA, GRADIENTS, STEPPED = range(4)  # the step's marks
COMMUNICATION_METHOD = (
    "host blocked on a collective (exposed), each collective timed where the backend issues and waits "
    "for it, in the timed window; taken out of the phase it happened in"
)


def device_waiter(device: torch.device) -> Callable[[], None]:
    """A function that waits until the device has finished its queued work (nothing to wait for on CPU)."""
    if device.type != "cpu":  # any accelerator: torch.accelerator waits for CUDA, ROCm and XPU alike
        return lambda: torch.accelerator.synchronize(device)
    return lambda: None


def device_events(device: torch.device) -> Optional[Callable[[], Any]]:
    """A function that records a timing event on the device's current stream and returns it
    (torch.cuda.Event for CUDA and ROCm, torch.xpu.Event); None on the CPU, whose clock is the host's."""
    if device.type == "cpu":
        return None
    event_type = getattr(torch, device.type).Event

    def record() -> Any:
        event = event_type(enable_timing=True)
        event.record()
        return event

    return record


class StepTimer:
    """One rank's phase totals over the timed window, its collectives, and the instants of its first
    traced steps.

    `collectives` is the backend's meter (None: no collective is counted, the whole step is compute).
    `events` (device_events) makes the phases device time. `phase_sync` runs before each instant
    is taken (`--profile`). `enabled` False (--no-step-breakdown) marks nothing but the steps.
    """

    def __init__(
        self,
        trace_steps: int,
        phase_sync: Callable[[], None] = lambda: None,
        threads: Optional[int] = None,
        demand: tuple[Optional[int], str] = (None, ""),
        events: Optional[Callable[[], Any]] = None,
        enabled: bool = True,
    ) -> None:
        self.trace_steps = trace_steps
        self.phase_sync = phase_sync
        self.events = events
        self.enabled = enabled
        self.collectives: Optional[CollectiveMeter] = None
        self.profiler: Optional[Any] = None  # --profile-trace: a RankProfiler started with the window
        self.memory: Optional[WindowPeak] = None  # the peak memory of the windows, reset as each opens
        self.cpu = CpuMeter(threads, demand)  # demand: contention.own_demand
        # per traced step: wait start, data ready, exposed communication starts, gradients ready, stepped
        self.trace: list[list[float]] = []
        self.origin: Optional[float] = None  # when the first timed window opened (the trace's zero)
        self.seconds = self.data_wait = self.forward_backward = self.communication = self.optimizer = 0.0
        self.collective_totals = [0.0] * len(COLLECTIVE_COLUMNS)  # the windows' collectives, KINDS x FIELDS
        self.steps = 0
        self._window_open = False
        self._window_steps = 0
        self._stepped_before = False  # an optimizer step has run: the optimizer's state exists
        self._in_step = False  # between a step's first FORWARD and its BOOKKEEPING
        self._window_start = 0.0
        self._instants = [0.0] * 4
        self._exposed = [0.0] * 4  # the meter's exposed seconds at each mark
        self._exposed_before = 0.0  # ... at the previous step's end (or the window's opening)
        self._events: list[Any] = [None] * 4
        self._opened: Optional[dict[str, list[float]]] = None
        self._pending: list[tuple[list[Any], list[float], float, Optional[int]]] = []  # device: resolved at close

    def _exposed_now(self) -> float:
        return self.collectives.exposed if self.collectives is not None else 0.0

    def _mark(self, index: int) -> None:
        self.phase_sync()
        self._instants[index] = time.perf_counter()
        self._exposed[index] = self._exposed_now()
        if self.events is not None:
            self._events[index] = self.events()

    def open_window(self) -> None:
        """Start timing (after a barrier); the steps before are left out."""
        self.cpu.open()  # first: its /proc readings (a scan for loader workers) cost the window nothing
        self._window_open = True
        self._window_steps = 0
        self._window_start = time.perf_counter()
        if self.origin is None:
            self.origin = self._window_start
        self._exposed_before = self._exposed_now()
        if self.collectives is not None and self.enabled:
            self._opened = self.collectives.snapshot()
        if self.memory is not None:
            self.memory.open()
        if self.profiler is not None:
            self.profiler.start()

    def close_window(self) -> Optional[tuple[float, int]]:
        """Stop timing (after a barrier, with the device's work done): the window's (seconds, steps),
        or None if none was open."""
        if not self._window_open:
            return None
        self._window_open = False
        elapsed = time.perf_counter() - self._window_start
        self.seconds += elapsed
        self.cpu.close()
        if self.memory is not None:
            self.memory.close()
        self._resolve_device_steps()
        if self._opened is not None:
            window = window_totals(self._opened, self.collectives.snapshot())
            self.collective_totals = [total + more for total, more in zip(self.collective_totals, window)]
            self._opened = None
        return elapsed, self._window_steps

    def pause(self, seconds: float) -> None:
        """Leave `seconds` (a checkpoint written mid-window) out of the window."""
        self._window_start += seconds

    def enter(self, phase: Phase) -> None:
        """Mark the step's instants from the phases the loop enters (harness.training.phases)."""
        if phase is phases.DATA:
            self.waiting_for_data()
        elif phase is phases.FORWARD and not self._in_step:  # the step's first micro-batch
            self._in_step = True
            self.data_ready()
        elif phase is phases.OPTIMIZER:
            self.gradients_ready()
        elif phase is phases.BOOKKEEPING and self._in_step:
            self._in_step = False
            self.stepped()

    def waiting_for_data(self) -> None:
        if self.enabled:
            self._mark(WAIT)

    def data_ready(self) -> None:
        if self.enabled:
            self._mark(DATA)
            self.cpu.compute_starts()

    def gradients_ready(self) -> None:
        if not self.enabled:
            return
        self._mark(GRADIENTS)
        if self.memory is not None and self._stepped_before and not self._window_open:
            self.memory.see_model_state()  # a warm-up step: not timed, so the count costs the window nothing

    def stepped(self) -> None:
        """The step is done: add its phases to the window's totals (if a window is open)."""
        if self.enabled:
            self._mark(STEPPED)
        self._stepped_before = True
        if not self._window_open:
            return
        self.steps += 1
        self._window_steps += 1
        if not self.enabled:
            return
        exposed = self._exposed
        # Exposed communication by phase: data wait, forward + backward, optimizer, and between the
        # steps (the preemption vote's wait: in the window's `other`).
        phases = [
            exposed[DATA] - exposed[WAIT],
            exposed[GRADIENTS] - exposed[DATA],
            exposed[STEPPED] - exposed[GRADIENTS],
        ]
        self.communication += exposed[STEPPED] - self._exposed_before
        self._exposed_before = exposed[STEPPED]
        traced = None
        if len(self.trace) < self.trace_steps:
            traced = len(self.trace)
            self.trace.append([0.0] * 5)
        if self.events is not None:  # device time: known once the device has run the window's work
            self._pending.append((list(self._events), phases, self._instants[WAIT], traced))
        else:
            self._add_phases(self._instants, phases, traced)
        self.cpu.add_compute(self._instants[STEPPED] - self._instants[DATA] - phases[1] - phases[2])
        if self.profiler is not None:
            self.profiler.step()

    def _add_phases(self, instants: Sequence[float], exposed: Sequence[float], traced: Optional[int]) -> None:
        """Add one step's phases (from its four instants) less the communication exposed in each."""
        durations = [max(instants[i + 1] - instants[i], 0.0) for i in range(3)]
        waited = [min(e, d) for e, d in zip(exposed, durations)]
        self.data_wait += durations[0] - waited[0]
        self.forward_backward += durations[1] - waited[1]
        self.optimizer += durations[2] - waited[2]
        if traced is not None:
            marks = (
                instants[WAIT],
                instants[DATA],
                instants[GRADIENTS] - waited[1],
                instants[GRADIENTS],
                instants[STEPPED],
            )
            self.trace[traced] = [value - self.origin for value in marks]

    def _resolve_device_steps(self) -> None:
        """Each device step's phases from its events, now that the device has run them."""
        for events, exposed, host_start, traced in self._pending:
            instants = [host_start + events[0].elapsed_time(event) / 1000.0 for event in events]
            self._add_phases(instants, exposed, traced)
        self._pending.clear()


def calibrated_compute_per_step(
    model: nn.Module,
    compute_loss: Callable[[nn.Module, Any], torch.Tensor],
    batches: Sequence[Any],
    device: torch.device,
) -> Optional[float]:
    """Median seconds of one forward + backward on this rank on a fresh, hook-free copy of the model,
    after training (--calibration-steps): a cross-check of the window's forward + backward only.

    It is not used to split the step: measured after the window, on a shared machine it moves with
    the machine's load; the record keeps it beside the in-window compute so a reader can compare.
    """
    if len(batches) < 2:
        return None
    model.train()
    wait_for_device = device_waiter(device)
    seconds: list[float] = []
    for batch in batches:
        wait_for_device()
        start = time.perf_counter()
        compute_loss(model, batch).backward()
        wait_for_device()
        seconds.append(time.perf_counter() - start)
        model.zero_grad(set_to_none=True)  # as the training step does, so backward allocates alike
    timed = sorted(seconds[1:])  # the first step allocates; leave it out
    return timed[len(timed) // 2]


# The model state's parts are columns of their own: "optimizer" is also a phase.
STATE_COLUMNS = tuple(f"model_state_{part}" for part in MODEL_STATE)
SCALARS = (
    "runtime",
    "data_wait",
    "forward_backward",
    "communication",
    "optimizer",
    "calibrated",
    "memory",
    *STATE_COLUMNS,
    *CpuMeter.FIELDS,
    *COLLECTIVE_COLUMNS,
)


def _gather(
    all_reduce_sum: Callable[[torch.Tensor], torch.Tensor],
    rank: int,
    world_size: int,
    device: torch.device,
    values: list[float],
) -> torch.Tensor:
    """A [quantity x rank] table of every rank's `values`: one allreduce, each rank filling its column."""
    mine = torch.tensor(values, dtype=torch.float64)
    table = torch.zeros(len(mine), world_size, dtype=torch.float64, device=device)
    table[:, rank] = mine.to(device)
    return all_reduce_sum(table).cpu()


def gather_breakdown(
    all_reduce_sum: Callable[[torch.Tensor], torch.Tensor],
    rank: int,
    world_size: int,
    device: torch.device,
    timer: StepTimer,
    compute_per_step: Optional[float],
    calibration_steps: int,
    exact: bool,
    peak_memory: tuple[float, str, bool],
) -> dict[str, Any]:
    """Every rank's phase totals, CPU measures, trace and peak memory ((bytes, source, whole process):
    harness.training.memory) gathered in one collective; AU, the POP metrics and the contention verdict."""
    steps = timer.steps
    scalars = [
        timer.seconds,
        timer.data_wait,
        timer.forward_backward,
        timer.communication,
        timer.optimizer,
        compute_per_step if compute_per_step is not None else -1.0,  # -1: not measured
        peak_memory[0],
        *_model_state(timer),
        *timer.cpu.values(),
        *timer.collective_totals,
    ]
    trace = [value for instants in timer.trace for value in instants]
    trace += [-1.0] * (5 * timer.trace_steps - len(trace))  # -1: this rank traced fewer steps
    table = _gather(all_reduce_sum, rank, world_size, device, scalars + trace)
    columns = dict(zip(SCALARS, table[: len(scalars)].tolist()))
    ranks = [rank_breakdown(*(columns[key][r] for key in SCALARS[:5])) for r in range(world_size)]
    per_rank = {key: [one[key] for one in ranks] for key in ranks[0]}
    breakdown: dict[str, Any] = {
        "au": _accelerator_utilisation(per_rank),
        **(
            pop_metrics(per_rank["useful"], max(columns["runtime"]), per_rank["communication"])
            if steps and timer.enabled
            else dict.fromkeys(POP_KEYS)
        ),
        "step_breakdown": _step_section(timer, columns, per_rank, world_size, calibration_steps, exact),
        "contention": _contention(columns, timer.cpu),
        "memory": memory_section(
            columns["memory"],
            peak_memory[1],
            peak_memory[2],
            {part: columns[column] for part, column in zip(MODEL_STATE, STATE_COLUMNS)},
        ),
    }
    if timer.trace_steps:
        breakdown["timeline"] = _timeline(table[len(scalars) :], timer.trace_steps, world_size)
    return breakdown


def _step_section(
    timer: StepTimer,
    columns: dict[str, list[float]],
    per_rank: dict[str, list[float]],
    world_size: int,
    calibration_steps: int,
    exact: bool,
) -> dict[str, Any]:
    """The record's step_breakdown: phases per step and per rank, every collective per step."""
    steps = timer.steps
    per_step = {key: (sum(values) / len(values) / steps if steps else None) for key, values in per_rank.items()}
    return {
        # None under --no-step-breakdown: no phase was timed
        "seconds_per_step": per_step if timer.enabled else None,
        "per_rank_seconds": per_rank if timer.enabled else None,
        "timed_steps": steps,
        "communication_method": COMMUNICATION_METHOD,
        **per_step_section([sum(columns[column]) for column in COLLECTIVE_COLUMNS], max(steps, 1) * world_size),
        "clock": "device events" if timer.events is not None else "host",
        "calibration_steps": calibration_steps,
        "compute_per_step_calibrated": [c if c >= 0 else None for c in columns["calibrated"]],
        "exact": exact,
    }


def _accelerator_utilisation(per_rank: dict[str, list[float]]) -> Optional[float]:
    """AU over every rank (harness.training.metrics): compute is the step's work on its batch."""
    compute = sum(per_rank["forward_backward"]) + sum(per_rank["communication"]) + sum(per_rank["optimizer"])
    return accelerator_utilisation(compute, sum(per_rank["runtime"]))


def _model_state(timer: StepTimer) -> list[float]:
    """This rank's model state by part (harness.training.memory), -1 each where it was not counted."""
    counted = timer.memory.model_state if timer.memory is not None else None
    return [float(counted[part]) if counted else -1.0 for part in MODEL_STATE]


def _measured(values: Sequence[float]) -> list[Optional[float]]:
    return [value if value >= 0 else None for value in values]


def _contention(columns: dict[str, list[float]], meter: CpuMeter) -> dict[str, Any]:
    return contention_summary({name: _measured(columns[name]) for name in CpuMeter.FIELDS}, meter.demand_words)


def process_contention(meter: CpuMeter) -> dict[str, Any]:
    """The `contention` section of a measurement made in this one process (a workshop lesson's
    timed loop): the same verdict a record carries, from this process's windows alone."""
    return _contention({name: [value] for name, value in zip(CpuMeter.FIELDS, meter.values())}, meter)


def _timeline(instants: torch.Tensor, trace_steps: int, world_size: int) -> dict[str, Any]:
    table = instants.view(trace_steps, 5, world_size)
    return {
        "phases": list(TRACE_COLUMNS),
        "doc": "per rank, per traced step: [start, end] seconds of each phase from the first timed "
        "window's opening (a barrier, so the ranks' clocks share that zero)",
        "per_rank": [
            [
                [[table[s, p, r].item(), table[s, p + 1, r].item()] for p in range(len(TRACE_COLUMNS))]
                for s in range(trace_steps)
                if table[s, 0, r].item() >= 0
            ]
            for r in range(world_size)
        ],
    }
