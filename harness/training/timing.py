"""Where a step's time goes: the timed window, per-phase totals, a per-rank timeline, and the
split of the gradient phase into compute and communication (definitions: harness.training.metrics).

The loop marks the instants of each step on every rank: it starts waiting for data, the data is
on the device, the averaged gradients are ready (Backend.finish_gradient_sync returned), the
optimizer has stepped. A hook on every parameter of the real model (`GradientClock`) marks a fifth:
the step's last parameter gradient. `StepTimer` sums the phases over the timed window (which
opens and closes at barriers, so it spans the slowest rank's work) and keeps the instants of the
first `trace_steps` timed steps for a timeline. After training, `gather_breakdown` collects every
rank's numbers in one collective and derives AU, the POP metrics and the contention verdict.

Why communication is measured this way: DDP waits for its bucketed allreduce at the end of
backward, DeepSpeed reduces after backward inside engine.backward, Horovod waits in
finish_gradient_sync; in all three, what the rank loses to communication is the time from its
last gradient to the averaged gradients. That interval is measured on every step, inside the
timed window, on the model that trains, so it cannot drift from the compute it is split from (the
earlier method, compute calibrated after training on a copy, turned any drift into
"communication", 40% of a step at one rank on a busy machine). A rank alone waits for nothing: its
communication is the backend's bookkeeping after the last gradient, about zero. Not counted as
communication: a reduction that blocks inside backward before the last gradient (ZeRO-2/3 reduce
from gradient hooks; on GPUs, compute queued behind it), and ZeRO >= 1's parameter all-gather in
the optimizer step.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any, Callable, Optional

import torch
from torch import nn

from .contention import CpuMeter
from .memory import MODEL_STATE, WindowPeak, memory_section
from .metrics import POP_KEYS, accelerator_utilisation, contention_summary, pop_metrics, rank_breakdown

TRACE_PHASES = ("data_wait", "forward_backward", "communication", "optimizer")


def device_waiter(device: torch.device) -> Callable[[], None]:
    """A function that waits until the device has finished its queued work (nothing to wait for on CPU)."""
    if device.type != "cpu":  # any accelerator: torch.accelerator waits for CUDA, ROCm and XPU alike
        return lambda: torch.accelerator.synchronize(device)
    return lambda: None


class GradientClock:
    """When the step's last parameter gradient was computed, from a hook on every parameter.

    On the CPU the hook reads the clock (backward runs on the calling thread); on a GPU it records
    a CUDA event on the stream that computed the gradient, so the instant is when the GPU finished
    it, not when the host queued it.
    """

    def __init__(self, parameters: Iterable[nn.Parameter], device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.instant: Optional[float] = None
        self.event: Optional[Any] = None
        self._handles = [p.register_post_accumulate_grad_hook(self._hook) for p in parameters if p.requires_grad]

    def _hook(self, parameter: torch.Tensor) -> None:
        if self.cuda:
            if self.event is None:
                self.event = torch.cuda.Event(enable_timing=True)
            self.event.record()
        else:
            self.instant = time.perf_counter()

    def take(self) -> tuple[Optional[float], Optional[Any]]:
        """This step's last-gradient instant (CPU) or event (GPU), and forget it for the next step."""
        taken = (self.instant, self.event)
        self.instant = self.event = None
        return taken

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()


class StepTimer:
    """One rank's phase totals over the timed window, and the instants of its first traced steps.

    `phase_sync` runs before each instant is taken: waiting for the GPU (`--profile`) makes the
    phases exact at the cost of overlap; on the CPU, and without --profile, it does nothing.
    """

    def __init__(
        self,
        trace_steps: int,
        phase_sync: Callable[[], None] = lambda: None,
        threads: Optional[int] = None,
        demand: tuple[Optional[int], str] = (None, ""),
    ) -> None:
        self.trace_steps = trace_steps
        self.phase_sync = phase_sync
        self.clock: Optional[GradientClock] = None  # set by watch(); without it the whole phase is compute
        self.profiler: Optional[Any] = None  # --profile-trace: a RankProfiler started with the window
        self.memory: Optional[WindowPeak] = None  # the peak memory of the windows, reset as each opens
        self.cpu = CpuMeter(threads, demand)  # demand: contention.own_demand
        # per traced step: wait start, data ready, last gradient, gradients ready, stepped
        self.trace: list[list[float]] = []
        self.origin: Optional[float] = None  # when the first timed window opened (the trace's zero)
        self.seconds = self.data_wait = self.forward_backward = self.communication = self.optimizer = 0.0
        self.steps = 0
        self._window_open = False
        self._window_steps = 0
        self._stepped_before = False  # an optimizer step has run: the optimizer's state exists
        self._window_start = self._wait_start = self._data_ready = self._gradients_ready = 0.0
        self._last_gradient: tuple[Optional[float], Optional[Any]] = (None, None)
        self._pending: list[tuple[Any, Any, float, Optional[list[float]]]] = []  # GPU: resolved at close

    def watch(self, parameters: Iterable[nn.Parameter], device: torch.device) -> None:
        """Mark each step's last parameter gradient of these (the real model's) parameters."""
        self.clock = GradientClock(parameters, device)

    def open_window(self) -> None:
        """Start timing (after a barrier); the steps before are left out."""
        self.cpu.open()  # first: its /proc readings (a scan for loader workers) cost the window nothing
        self._window_open = True
        self._window_steps = 0
        self._window_start = time.perf_counter()
        if self.origin is None:
            self.origin = self._window_start
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
        self._resolve_gpu_steps()
        return elapsed, self._window_steps

    def pause(self, seconds: float) -> None:
        """Leave `seconds` (a checkpoint written mid-window) out of the window."""
        self._window_start += seconds

    def waiting_for_data(self) -> None:
        self._wait_start = time.perf_counter()

    def data_ready(self) -> None:
        self.phase_sync()
        self._data_ready = time.perf_counter()
        if self.clock is not None:
            self.clock.take()  # a gradient before this step's backward is not this step's
        self.cpu.compute_starts()

    def gradients_ready(self) -> None:
        self.phase_sync()
        self._gradients_ready = time.perf_counter()
        instant, event = self.clock.take() if self.clock is not None else (None, None)
        ready = None
        if event is not None:  # GPU: when the device has the averaged gradients, to compare with `event`
            ready = torch.cuda.Event(enable_timing=True)
            ready.record()
        self._last_gradient = (instant, (event, ready) if event is not None else None)
        if self.memory is not None and self._stepped_before and not self._window_open:
            self.memory.see_model_state()  # a warm-up step: not timed, so the count costs the window nothing

    def stepped(self) -> None:
        """The step is done: add its phases to the window's totals (if a window is open)."""
        self.phase_sync()
        stepped = time.perf_counter()
        self._stepped_before = True
        if not self._window_open:
            return
        self.steps += 1
        self._window_steps += 1
        gradient_phase = self._gradients_ready - self._data_ready
        instant, event = self._last_gradient
        waited = min(max(self._gradients_ready - instant, 0.0), gradient_phase) if instant is not None else 0.0
        self.data_wait += self._data_ready - self._wait_start
        self.forward_backward += gradient_phase - waited
        self.communication += waited
        self.optimizer += stepped - self._gradients_ready
        self.cpu.add_compute(stepped - self._data_ready - waited)
        traced = None
        if len(self.trace) < self.trace_steps:
            instants = (
                self._wait_start,
                self._data_ready,
                self._gradients_ready - waited,
                self._gradients_ready,
                stepped,
            )
            traced = [value - self.origin for value in instants]
            self.trace.append(traced)
        if event is not None:  # GPU: the gap between the events is known once the device has run them
            self._pending.append((*event, gradient_phase, traced))
        if self.profiler is not None:
            self.profiler.step()

    def _resolve_gpu_steps(self) -> None:
        """Move each GPU step's wait (last-gradient event to gradients-ready event) from compute to
        communication, now that the device has finished the window's work."""
        for last, ready, gradient_phase, traced in self._pending:
            waited = min(max(last.elapsed_time(ready) / 1000.0, 0.0), gradient_phase)
            self.forward_backward -= waited
            self.communication += waited
            if traced is not None:
                traced[2] = traced[3] - waited
        self._pending.clear()

    def stop(self) -> None:
        """Remove the hooks from the model (the run is over)."""
        if self.clock is not None:
            self.clock.remove()


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
    ]
    trace = [value for instants in timer.trace for value in instants]
    trace += [-1.0] * (5 * timer.trace_steps - len(trace))  # -1: this rank traced fewer steps
    table = _gather(all_reduce_sum, rank, world_size, device, scalars + trace)
    columns = dict(zip(SCALARS, table[: len(scalars)].tolist()))
    ranks = [rank_breakdown(*(columns[key][r] for key in SCALARS[:5])) for r in range(world_size)]
    per_rank = {key: [one[key] for one in ranks] for key in ranks[0]}
    per_step = {key: (sum(values) / len(values) / steps if steps else None) for key, values in per_rank.items()}
    breakdown: dict[str, Any] = {
        "au": _accelerator_utilisation(per_rank),
        **(
            pop_metrics(per_rank["useful"], max(columns["runtime"]), per_rank["communication"])
            if steps
            else dict.fromkeys(POP_KEYS)
        ),
        "step_breakdown": {
            "seconds_per_step": per_step,
            "per_rank_seconds": per_rank,
            "timed_steps": steps,
            "communication_method": "last parameter gradient to gradients averaged, in the timed window",
            "calibration_steps": calibration_steps,
            "compute_per_step_calibrated": [c if c >= 0 else None for c in columns["calibrated"]],
            "exact": exact,
        },
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


def _timeline(instants: torch.Tensor, trace_steps: int, world_size: int) -> dict[str, Any]:
    table = instants.view(trace_steps, 5, world_size)
    return {
        "phases": list(TRACE_PHASES),
        "doc": "per rank, per traced step: [start, end] seconds of each phase from the first timed "
        "window's opening (a barrier, so the ranks' clocks share that zero)",
        "per_rank": [
            [
                [[table[s, p, r].item(), table[s, p + 1, r].item()] for p in range(len(TRACE_PHASES))]
                for s in range(trace_steps)
                if table[s, 0, r].item() >= 0
            ]
            for r in range(world_size)
        ],
    }
