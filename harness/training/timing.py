"""Where a step's time goes: the timed window, per-phase totals, a per-rank timeline, and the split
of the gradient phase into compute and communication.

The loop marks four instants per step on every rank: the step starts waiting for data, the data
is on the device, the gradients are averaged over ranks (forward + backward + sync), the optimizer
has stepped. `StepTimer` sums the phases over the timed window (which opens and closes at
barriers, so it spans the slowest rank's work) and keeps the instants of the first `trace_steps`
timed steps for a timeline. After training, `gather_breakdown` collects every rank's numbers in one
collective and derives AU and the POP metrics (harness.training.metrics).
"""

from __future__ import annotations

import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn

from .metrics import accelerator_utilisation, pop_metrics, rank_breakdown

TRACE_PHASES = ("data_wait", "forward_backward_sync", "optimizer")


def device_waiter(device: torch.device) -> Callable[[], None]:
    """A function that waits until the device has finished its queued work (nothing to wait for on CPU)."""
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


class StepTimer:
    """One rank's phase totals over the timed window, and the instants of its first traced steps.

    `phase_sync` runs before each instant is taken: waiting for the GPU (`--profile`) makes the
    phases exact at the cost of overlap; on the CPU, and without --profile, it does nothing.
    """

    def __init__(self, trace_steps: int, phase_sync: Callable[[], None] = lambda: None) -> None:
        self.trace_steps = trace_steps
        self.phase_sync = phase_sync
        self.trace: List[List[float]] = []  # per traced step: wait start, data ready, gradients ready, stepped
        self.origin: Optional[float] = None  # when the first timed window opened (the trace's zero)
        self.seconds = self.data_wait = self.gradients = self.optimizer = 0.0
        self.steps = 0
        self._window_open = False
        self._window_steps = 0
        self._window_start = self._wait_start = self._data_ready = self._gradients_ready = 0.0

    def open_window(self) -> None:
        """Start timing (after a barrier); the steps before are left out."""
        self._window_open = True
        self._window_steps = 0
        self._window_start = time.perf_counter()
        if self.origin is None:
            self.origin = self._window_start

    def close_window(self) -> Optional[Tuple[float, int]]:
        """Stop timing (after a barrier): the window's (seconds, steps), or None if none was open."""
        if not self._window_open:
            return None
        self._window_open = False
        elapsed = time.perf_counter() - self._window_start
        self.seconds += elapsed
        return elapsed, self._window_steps

    def pause(self, seconds: float) -> None:
        """Leave `seconds` (a checkpoint written mid-window) out of the window."""
        self._window_start += seconds

    def waiting_for_data(self) -> None:
        self._wait_start = time.perf_counter()

    def data_ready(self) -> None:
        self.phase_sync()
        self._data_ready = time.perf_counter()

    def gradients_ready(self) -> None:
        self.phase_sync()
        self._gradients_ready = time.perf_counter()

    def stepped(self) -> None:
        """The step is done: add its phases to the window's totals (if a window is open)."""
        self.phase_sync()
        stepped = time.perf_counter()
        if not self._window_open:
            return
        self.steps += 1
        self._window_steps += 1
        self.data_wait += self._data_ready - self._wait_start
        self.gradients += self._gradients_ready - self._data_ready
        self.optimizer += stepped - self._gradients_ready
        if len(self.trace) < self.trace_steps:
            self.trace.append([instant - self.origin for instant in
                               (self._wait_start, self._data_ready, self._gradients_ready, stepped)])


def calibrated_compute_per_step(model: nn.Module, compute_loss: Callable[[nn.Module, Any], torch.Tensor],
                                batches: Sequence[Any], device: torch.device) -> Optional[float]:
    """Median seconds of one forward + backward on this rank when no communication can happen.

    Why this method: communication must be measured the same way for every backend, but DDP
    overlaps its allreduce with backward, DeepSpeed reduces inside engine.backward and Horovod
    finishes in optimizer.synchronize(), so no timer fits around "the allreduce" of all three. The
    loop instead times forward + backward + gradient sync as one phase on every backend, and this
    function times forward + backward alone on a fresh instance of the same architecture (no DDP
    or Horovod hooks, no ZeRO partitioning: no collective can run) on the rank's own batches, after
    the timed window, with every rank calibrating at once as they trained at once. The loop then
    takes communication = phase - steps x this estimate. It includes the time compute lost to
    communication running beside it, a real cost of communicating. Weight values do not change
    the cost of dense layers, so the fresh weights time like the trained ones. Not counted as
    communication: DeepSpeed ZeRO >= 1 all-gathers updated parameters inside engine.step, which
    shows as optimizer time. The estimate is taken after the window, not during it, so on a machine
    shared with other jobs the split moves with their load (the phase total does not).
    """
    if len(batches) < 2:
        return None
    model.train()
    wait_for_device = device_waiter(device)
    seconds: List[float] = []
    for batch in batches:
        wait_for_device()
        start = time.perf_counter()
        compute_loss(model, batch).backward()
        wait_for_device()
        seconds.append(time.perf_counter() - start)
        model.zero_grad(set_to_none=True)  # as the training step does, so backward allocates alike
    timed = sorted(seconds[1:])  # the first step allocates; leave it out
    return timed[len(timed) // 2]


def gather_breakdown(all_reduce_sum: Callable[[torch.Tensor], torch.Tensor], rank: int, world_size: int,
                     device: torch.device, timer: StepTimer, compute_per_step: Optional[float],
                     calibration_steps: int, exact: bool, peak_memory: Optional[float]) -> Dict[str, Any]:
    """Every rank's phase totals, trace and peak memory gathered in one collective; AU and POP metrics.

    One allreduce of a [quantity x rank] table in which each rank fills only its own column
    gathers all ranks' values at once.
    """
    steps = timer.steps
    my_compute = compute_per_step * steps if compute_per_step is not None else -1.0  # -1: not measured
    scalars = [timer.seconds, timer.data_wait, timer.gradients, timer.optimizer, my_compute,
               peak_memory if peak_memory is not None else -1.0]
    trace = [value for instants in timer.trace for value in instants]
    trace += [-1.0] * (4 * timer.trace_steps - len(trace))  # -1: this rank traced fewer steps
    mine = torch.tensor(scalars + trace, dtype=torch.float64)
    table = torch.zeros(len(mine), world_size, dtype=torch.float64, device=device)
    table[:, rank] = mine.to(device)
    table = all_reduce_sum(table).cpu()
    runtime, data_wait, gradients, optimizer, compute, memory = table[:len(scalars)].tolist()
    ranks = [rank_breakdown(runtime[r], data_wait[r], gradients[r], optimizer[r],
                            compute[r] if compute[r] >= 0 else None) for r in range(world_size)]
    per_rank = {key: [one[key] for one in ranks] for key in ranks[0]}
    per_step = {key: (sum(values) / len(values) / steps if steps and None not in values else None)
                for key, values in per_rank.items()}
    calibrated = None not in per_rank["useful"] and steps > 0
    breakdown: Dict[str, Any] = {
        "au": accelerator_utilisation(sum(runtime) - sum(data_wait), sum(data_wait)),
        **(pop_metrics(per_rank["useful"], max(runtime)) if calibrated else
           {"load_balance": None, "communication_efficiency": None, "parallel_efficiency": None}),
        "step_breakdown": {
            "seconds_per_step": per_step, "per_rank_seconds": per_rank, "timed_steps": steps,
            "calibration_steps": calibration_steps,
            "compute_per_step_calibrated": [c / steps if c >= 0 and steps else None for c in compute],
            "exact": exact,
        },
    }
    if timer.trace_steps:
        instants = table[len(scalars):].view(timer.trace_steps, 4, world_size)
        breakdown["timeline"] = {
            "phases": list(TRACE_PHASES),
            "doc": "per rank, per traced step: [start, end] seconds of each phase from the first timed "
                   "window's opening (a barrier, so the ranks' clocks share that zero)",
            "per_rank": [[[[instants[s, p, r].item(), instants[s, p + 1, r].item()] for p in range(3)]
                          for s in range(timer.trace_steps) if instants[s, 0, r].item() >= 0]
                         for r in range(world_size)],
        }
    if peak_memory is not None:
        breakdown["peak_memory_bytes_per_rank"] = [int(value) for value in memory]
    return breakdown
