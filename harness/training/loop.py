"""The training loop: one loop for every task and every backend, which it knows only through
`Task` (harness.tasks) and `Backend` (harness.backends).

`train(config)` runs one training of the config's task on the rank of whatever launcher started
this process and returns its results record. It can be called again and again in one process (a notebook's
engines do): whatever a run changes in the process (environment variables, library defaults,
thread count, random state, signal handlers, the process group it created) is put back when it
ends, normally or by an exception, so every run starts as the first did.

Read it top down: `plan_run` loads the task and fixes batches, steps and the LR; `train` places the
rank, builds the model and tries the task on one batch (harness.training.probe), wraps and resumes; `_train_epochs` runs the timed window, the preemption vote and checkpoints
around `_train_step`, which is one optimizer step over micro-batches; `_end_epoch` reduces,
evaluates and logs; `_finish` measures what the window could not and returns the record. Each
point where ranks must agree or talk says why in a comment.
"""

from __future__ import annotations

import itertools
import logging
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
from torch import nn

from ..backends.memory import backend_label
from ..config import TrainConfig
from ..data.batches import batch_to, slice_batch
from ..data.loader import iterate_batches, to_device_ahead
from ..data.sharding import RankSchedule, train_batches
from ..errors import EXIT_PREEMPTED, Preempted, require
from ..process import phases as phase
from ..process.heartbeat import Heartbeat
from ..process.memory_cap import FULLY_SHARDED, MemoryCap, capped
from ..process.preemption import PreemptionWatcher, TestSignal, peer_failure
from ..process.state import preserved_process_state
from ..tasks.task import loss_and_count
from .callbacks import Callback, CallbackList, EpochEnd, StepEnd
from .checkpoint import Checkpointer, Progress, ResumeState, restore
from .contention import own_demand
from .evaluate import Evaluation, evaluation_line
from .memory import SavedActivations, WindowPeak, model_state_bytes, run_prediction
from .outputs import save_model, save_record
from .phases import PhaseLog
from .placement import Placement, place_process
from .plan import RunPlan, model_shape, optimizer_factory, plan_run, shape_record
from .probe import check_unused_alike
from .profiling import PROFILED_STEPS, make_profiler
from .record import run_record
from .resume import find_resume_checkpoint
from .timing import StepTimer, calibrated_compute_per_step, device_events, device_waiter, gather_breakdown

log = logging.getLogger("harness")


def train(config: TrainConfig, callbacks: Sequence[Callback] = (), task: Any = None) -> dict[str, Any]:
    """Train under whatever launcher started this process; return the run's results record.

    What trains is `config.task` with `config.task_args`, or `task` where given: a harness.Task, a
    function that returns one (called with `config.task_args`), or a spec string. Every rank
    returns the same record (metrics are reduced over ranks); rank 0 also appends it to
    `config.results` and writes `config.save_model`. `callbacks` (harness.Callback instances) watch
    the run on every rank (see harness.training.callbacks). Bad input, a bad task included, raises
    UsageError before any process group starts (a rank predicted to need more than --memory-cap
    included); a preempted run raises Preempted, a lost peer PeerFailure, a rank that ran out of its
    --memory-cap OverBudget. A process group or Horovod that the caller initialised is used and left as it was.
    """
    started = time.time()
    with preserved_process_state():
        placement = place_process(config)
        with capped(config.memory_cap, placement.device) as cap:
            try:
                return _train(config, placement, CallbackList(callbacks), task, cap, started)
            except Exception as exc:  # an allocation the cap refused: one line naming the rank
                label = backend_label(config.backend, placement.backend.options)
                over = cap.over_budget(exc, label, placement.cluster.rank) if cap else None
                if over is None:
                    raise
                raise over from None


def _train(
    config: TrainConfig,
    placement: Placement,
    watchers: CallbackList,
    task: Any,
    cap: Optional[MemoryCap],
    started: float,
) -> dict[str, Any]:
    """train()'s run in its placed process, under its memory cap (None: none)."""
    plan = plan_run(config, placement, task)
    backend, cluster, device = placement.backend, placement.cluster, placement.device
    # Chosen and checked before any process group starts: an unusable checkpoint is bad input.
    resume_from = find_resume_checkpoint(config, plan.layout(), type(backend), warn=cluster.is_main)
    preemption = PreemptionWatcher(TestSignal.from_environ())
    # Every rank builds identical initial weights from --seed (make_model; backends also
    # broadcast rank 0's), tries the task on its first batch, then takes a per-rank seed so
    # that dropout masks differ between ranks.
    model = plan.make_model()
    with SavedActivations(model) as saved:  # what the probe's forward keeps for backward
        unused, evaluation = plan.tried(model, resume_from.step if resume_from else 0)  # bad tasks fail here
    shape, predicted = shape_record(model), run_prediction(plan, model, model_shape(model), saved.bytes)
    if cap is not None and predicted is not None:  # refused before any process group starts
        sharded = run_prediction(plan, model, model_shape(model), saved.bytes, FULLY_SHARDED)
        cap.check(predicted.total(), predicted.backend, cluster.rank, sharded.total() if sharded else None)
    torch.manual_seed(config.seed * 1000 + cluster.rank + 1)
    pulse = Heartbeat.start(cluster, not config.no_heartbeat)  # rank 0 starts the store before init
    try:
        backend.init(cluster, device)
        check_unused_alike(backend, model, unused, cluster.world_size, plan.loaded.label)
        preemption.install()
        model, optimizer = backend.wrap(
            model, optimizer_factory(config, plan.loaded.task.build_optimizer), plan.local_batch
        )
        if config.compile:  # the wrapped model: compiled in its first step, inside the timing warmup
            model = backend.compile(model)
        # After wrap (DeepSpeed loads into its engine); the RNG states are restored last.
        resumed = restore(resume_from, backend, cluster, device) if resume_from else None
        checkpointer = Checkpointer(config, cluster, backend, plan.layout()) if config.checkpoint_dir else None
        state = RunState.start(plan, resumed, checkpointer, pulse, evaluation)
        # Every collective the backend issues, timed (harness.training.timing says why so).
        state.timer.collectives = backend.collectives
        state.model_shape, state.gradient_bytes = shape, shape["parameter_bytes"]
        state.timer.memory.predicted = predicted  # the record's memory.predicted, beside the measured peak
        _train_epochs(plan, state, model, optimizer, preemption, watchers)
        return _keep(plan, state, started, watchers)
    except Exception as exc:
        usage = backend.usage_error(exc)
        if usage is not None:
            raise usage from None
        if backend.is_peer_failure(exc):
            raise peer_failure(exc, cluster.rank, config.timeout, pulse.who_stopped(config.timeout)) from exc
        raise
    finally:
        pulse.stop()
        preemption.uninstall()
        backend.shutdown()


def _keep(plan: RunPlan, state: RunState, started: float, watchers: Callback) -> dict[str, Any]:
    """The end of a run that trained: its record made, the model and the record written (rank 0),
    every rank leaving together."""
    config, backend, cluster = plan.config, plan.placement.backend, plan.placement.cluster
    record = _finish(plan, state, started)
    watchers.on_train_end(record)
    if config.save_model:
        weights = backend.full_state_dict()  # a collective where weights are sharded (ZeRO-3)
        if cluster.is_main:  # a write that fails at the end goes elsewhere, saying where (outputs)
            save_model(config.save_model, weights, config.results)
    if cluster.is_main and config.results:
        save_record(config.results, record, config.save_model)
    # Leave together: a rank destroying its process group while a peer still has collectives
    # in flight (ZeRO-3 prefetches) is the kind of teardown race that aborts a finished run.
    backend.barrier()
    if state.timer.profiler is not None:  # past the barrier: every rank's trace files are written
        state.timer.profiler.merge()
    return record


@dataclass
class RunState:
    """What changes while a run trains: position, losses, timings, evaluation, checkpoints."""

    step: int  # optimizer steps done so far in the whole run
    start_step: int  # where this segment (process) began: 0, or a resumed checkpoint's step
    progress: Progress  # train loss per epoch, latest evaluation, history: kept in checkpoints
    epoch_step_losses: torch.Tensor  # [epoch_steps, 2] this rank's (loss x samples, samples) per step
    checkpointer: Optional[Checkpointer]
    timer: StepTimer
    evaluation: Optional[Evaluation]  # None: the task has no test data
    gradient_bytes: int = 0  # what the ranks average per step: the model's trainable parameters' bytes
    model_shape: dict[str, Any] = field(default_factory=dict)  # plan.shape_record of the unwrapped model
    epoch_times: list[float] = field(default_factory=list)
    epoch_throughputs: list[float] = field(default_factory=list)
    preempted: bool = False
    heartbeat: Heartbeat = field(default_factory=Heartbeat)  # where this rank is, for peers after a hang
    phases: Optional[PhaseLog] = None  # the loop's one call per phase: timer, heartbeat, profiler follow

    def enter(self, entered: phase.Phase, step: int) -> None:
        """This rank now works on phase `entered` of optimizer step `step` (harness.training.phases)."""
        assert self.phases is not None
        self.phases.enter(entered, step)

    @classmethod
    def start(
        cls,
        plan: RunPlan,
        resumed: Optional[ResumeState],
        checkpointer: Optional[Checkpointer],
        heartbeat: Heartbeat,
        evaluation: Optional[Evaluation],
    ) -> RunState:
        """The state before the first step; `heartbeat` starts sending here (one sum over ranks)."""
        step_losses = torch.zeros(plan.epoch_steps, 2, dtype=torch.float64, device=plan.placement.device)
        if resumed is not None:  # the steps of the unfinished epoch before the checkpoint
            step_losses += resumed.epoch_step_losses.to(step_losses.device)
        device = plan.placement.device
        # Phases end on finished device work only when --profile asks (it costs overlap).
        config = plan.config  # --profile-trace: the step timeline covers the profiled steps too
        trace_steps = max(config.trace_steps, PROFILED_STEPS) if config.profile_trace else config.trace_steps
        threads = plan.placement.threads if device.type == "cpu" else None
        backend = plan.placement.backend
        timer = StepTimer(
            trace_steps,
            device_waiter(device) if config.profile else lambda: None,
            threads=threads,
            demand=own_demand(threads, backend.helper_threads, config.num_workers),
            events=device_events(device),
            enabled=not config.no_step_breakdown,
        )
        timer.profiler = make_profiler(config.profile_trace, plan.placement.cluster.rank, device)
        timer.memory = WindowPeak(device, lambda: model_state_bytes(backend.model, backend))
        heartbeat.connect(backend.all_reduce_sum, device)
        backend.collectives.listener = heartbeat.in_collective  # a rank hung in a collective names it
        return cls(
            heartbeat=heartbeat,
            phases=PhaseLog(timer, heartbeat),
            step=resumed.step if resumed else 0,
            start_step=resumed.step if resumed else 0,
            progress=resumed.progress if resumed else Progress(),
            epoch_step_losses=step_losses,
            checkpointer=checkpointer,
            timer=timer,
            evaluation=evaluation,
        )

    def record_loss(self, plan: RunPlan, epoch: int, loss_sum: torch.Tensor, count: Any) -> None:
        """Count one finished step: its loss (summed over the items it averages) joins the epoch's
        per-step sums (on the device, reduced once per epoch, so no step waits for a collective)."""
        row = self.epoch_step_losses[self.step - epoch * plan.epoch_steps]
        row[0] += loss_sum
        row[1] += count
        self.step += 1

    def add_history(self, plan: RunPlan, epoch: int, reduced: torch.Tensor) -> None:
        """Fold one epoch's reduced per-step (loss sum, samples) into the history's blocks of
        --log-every steps; a block may span epochs, so its running sums are kept in the progress."""
        history = self.progress.history
        first = epoch * plan.epoch_steps
        for offset, (loss_sum, samples) in enumerate(reduced.tolist()):
            if samples == 0:
                continue  # a step this run does not take (a --max-steps run's last epoch)
            step = first + offset + 1
            history["pending"] = [history["pending"][0] + loss_sum, history["pending"][1] + samples]
            if step % plan.log_every == 0 or step == plan.total_steps:
                history["step"].append(step)
                history["loss"].append(history["pending"][0] / history["pending"][1])
                history["lr"].append(plan.lr_at(step - 1))
                history["pending"] = [0.0, 0.0]


def _batch_stream(plan: RunPlan, first_step: int) -> Any:
    """This rank's batches from `first_step` to the run's end, moved to the device ahead of use.

    The sampler's epoch: every rank draws the same permutation from (seed, epoch) and takes its own
    slice of each global batch, so the ranks' samples are disjoint and a global batch holds the
    same samples at any world size (harness.data.sharding). One loader for the whole run, so worker
    processes start once and prefetch across epochs; a resumed run starts at its checkpoint's step."""
    config, cluster, device = plan.config, plan.placement.cluster, plan.placement.device
    schedule = RankSchedule(
        len(plan.train_set),
        cluster.world_size,
        cluster.rank,
        plan.local_batch,
        config.seed,
        plan.total_steps,
        first_step=first_step,
    )
    batches = iterate_batches(plan.train_set, schedule, config.num_workers, device.type == "cuda", config.prefetch)
    return to_device_ahead(batches, device)


def _train_epochs(
    plan: RunPlan,
    state: RunState,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    preemption: PreemptionWatcher,
    watchers: Callback,
) -> None:
    backend, cluster, device = plan.placement.backend, plan.placement.cluster, plan.placement.device
    stream = _batch_stream(plan, state.step)
    timing_warmup = plan.timing_warmup(state.start_step)
    progress_bar = _progress_bar(plan.total_steps - state.start_step, cluster.is_main and sys.stderr.isatty())
    for epoch in range(state.step // plan.epoch_steps, plan.num_epochs):
        epoch_last_step = min((epoch + 1) * plan.epoch_steps, plan.total_steps)
        epoch_start = _synchronised(plan)  # windows open and close at barriers: they span the slowest rank
        if state.step - state.start_step >= timing_warmup:
            state.timer.open_window()
        state.enter(phase.DATA, state.step + 1)
        for batch in itertools.islice(stream, epoch_last_step - state.step):
            loss, lr = _train_step(plan, state, model, optimizer, batch, epoch)
            watchers.on_step_end(StepEnd(state.step, epoch, loss, lr, plan.local_batch, cluster.rank))
            if progress_bar is not None:
                progress_bar.update(1)
            if state.step - state.start_step == timing_warmup:  # start-up (allocations, first collectives) left out
                _synchronised(plan)
                state.timer.open_window()
            # The preemption vote, a collective: a signal reaches one rank (or the ranks at different
            # steps), and a rank that stopped alone would leave its peers waiting in the next allreduce.
            state.enter(phase.VOTE, state.step)
            state.preempted = preemption.stop_agreed(state.step, cluster.rank, backend, device)
            if state.preempted:
                break
            if state.checkpointer is not None and state.checkpointer.due(state.step) and state.step < epoch_last_step:
                pause = _checkpoint(plan, state, "every --checkpoint-every steps")
                epoch_start += pause  # not training time
                state.timer.pause(pause)
            state.enter(phase.DATA, state.step + 1)
        if state.preempted and state.step < epoch_last_step:  # stopped mid-epoch: checkpoint where every rank stopped
            if state.checkpointer is not None:
                _checkpoint(plan, state, "preempted")
            raise _preempted(state, preemption, plan.total_steps, cluster.is_main)
        _end_epoch(plan, state, epoch, epoch_start, progress_bar, watchers)
        if state.preempted and epoch < plan.num_epochs - 1:
            raise _preempted(state, preemption, plan.total_steps, cluster.is_main)
    preemption.settle()
    stream.close()
    if progress_bar is not None:
        progress_bar.close()


def _train_step(
    plan: RunPlan,
    state: RunState,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: Any,
    epoch: int,
) -> tuple[torch.Tensor, float]:
    """One optimizer step on this rank's batch, its phases timed; (this rank's loss, the step's LR)."""
    backend, device, step = plan.placement.backend, plan.placement.device, state.step + 1
    lr = plan.lr_at(state.step)  # a pure function of the step, written into the optimizer for every backend
    for group in optimizer.param_groups:
        group["lr"] = lr
    batch = plan.prepare(batch, epoch, state.step)  # on the device already (to_device_ahead)
    # Gradient accumulation: each micro-batch adds its share of the step's mean loss; only the last
    # one communicates (DDP no_sync, Horovod's count of backward passes, DeepSpeed's boundary).
    loss_sum, count = torch.zeros((), dtype=torch.float64, device=device), 0
    for first in range(0, plan.local_batch, plan.micro_batch):
        sync = first + plan.micro_batch >= plan.local_batch
        micro_batch = slice_batch(batch, first, first + plan.micro_batch)
        with backend.no_sync(sync):
            state.enter(phase.FORWARD, step)  # the step's first: its data is ready
            with plan.precision.autocast(device):
                mean, items = loss_and_count(plan.loaded.task, model, micro_batch, plan.loaded.label)
            state.enter(phase.BACKWARD, step)
            backend.backward(mean / plan.config.grad_accum, sync)
        loss_sum += mean.detach().double() * items
        count += items
    state.enter(phase.GRADIENT_SYNC, step)  # where Horovod waits for its allreduces, which no profiler sees
    backend.finish_gradient_sync()
    state.enter(phase.OPTIMIZER, step)
    backend.step()
    state.enter(phase.BOOKKEEPING, step)
    state.record_loss(plan, epoch, loss_sum, count)
    return loss_sum / count, lr


def _synchronised(plan: RunPlan) -> float:
    """Wait for the device's queued work and for every rank; the time then."""
    device_waiter(plan.placement.device)()
    plan.placement.backend.barrier()
    return time.perf_counter()


def _end_epoch(
    plan: RunPlan, state: RunState, epoch: int, epoch_start: float, progress_bar: Any, watchers: Callback
) -> None:
    """Close the timed window, reduce the epoch's losses (one collective), evaluate, log, checkpoint."""
    config, (backend, cluster, device, *_) = plan.config, plan.placement
    state.enter(phase.EPOCH_END, state.step)
    epoch_end = _synchronised(plan)
    window = state.timer.close_window()
    state.epoch_times.append(epoch_end - epoch_start)
    throughput = None
    if window is not None and window[1]:
        throughput = window[1] * plan.global_batch / window[0]
        state.epoch_throughputs.append(throughput)
    reduced = backend.all_reduce_sum(state.epoch_step_losses.clone())
    loss_sum, samples = reduced.sum(dim=0).tolist()
    state.progress.train_losses.append(loss_sum / samples)
    state.add_history(plan, epoch, reduced)
    state.epoch_step_losses.zero_()
    last = epoch == plan.num_epochs - 1
    evaluated = state.evaluation is not None and (
        last or bool(config.eval_every and (epoch + 1) % config.eval_every == 0)
    )
    if evaluated:
        state.enter(phase.EVALUATION, state.step)
        state.progress.evaluation = state.evaluation(backend.module(), backend, cluster, device)
    lr = plan.lr_at(state.step - 1)
    if cluster.is_main:
        line = (
            f"epoch {epoch + 1}/{plan.num_epochs} | train loss {state.progress.train_losses[-1]:.4f} | "
            f"lr {lr:.4g} | {throughput or float('nan'):,.0f} samples/s | {state.epoch_times[-1]:.1f} s"
        )
        if evaluated:
            line += " | " + evaluation_line(state.progress.evaluation)
        (progress_bar.write if progress_bar is not None else log.info)(line)
    watchers.on_epoch_end(
        EpochEnd(
            epoch,
            state.step,
            state.progress.train_losses[-1],
            lr,
            dict(state.progress.evaluation) if evaluated else None,
            throughput,
            cluster.rank,
            cluster.world_size,
        )
    )
    if state.checkpointer is not None:
        _checkpoint(plan, state, "epoch end")


def _checkpoint(plan: RunPlan, state: RunState, reason: str) -> float:
    """Write a checkpoint after `state.step` (a collective); the seconds it took."""
    assert state.checkpointer is not None
    state.enter(phase.CHECKPOINT, state.step)
    return state.checkpointer.save(state.step, state.progress, state.epoch_step_losses, reason)


def _preempted(state: RunState, preemption: PreemptionWatcher, total_steps: int, is_main: bool) -> Preempted:
    """The exception that ends a preempted run, once its checkpoint (if any) is written."""
    checkpointer = state.checkpointer
    saved = (
        f"checkpoint {checkpointer.last_path} is written; resubmit with --resume auto to continue"
        if checkpointer is not None
        else "nothing was saved (no --checkpoint-dir)"
    )
    return Preempted(
        f"stopped by {preemption.signal_name()} after step {state.step} of {total_steps}; {saved} "
        f"(exit status {EXIT_PREEMPTED})",
        is_main,
    )


def _progress_bar(total: int, enabled: bool) -> Any:
    if not enabled:
        return None
    tqdm = require("tqdm", "the progress bar", "pip install tqdm (make setup installs it)").tqdm
    return tqdm(total=total, unit="step", leave=False, dynamic_ncols=True)


def _calibration_batches(plan: RunPlan) -> list[Any]:
    """The rank's last --calibration-steps + 1 micro-batches of the run, on the device, for calibration."""
    config, cluster, device = plan.config, plan.placement.cluster, plan.placement.device
    steps = config.calibration_steps
    if not steps:
        return []
    last_epoch = (plan.total_steps - 1) // plan.epoch_steps
    batches = train_batches(
        len(plan.train_set), cluster.world_size, cluster.rank, plan.local_batch, config.seed, last_epoch
    )[: plan.total_steps - last_epoch * plan.epoch_steps]
    chosen = []
    for indices in batches[-(steps + 1) :]:
        chosen.append(plan.prepare(batch_to(plan.train_set.fetch(indices[: plan.micro_batch]), device), last_epoch))
    return chosen


def _finish(plan: RunPlan, state: RunState, started: float) -> dict[str, Any]:
    """Measure what the timed window could not (compute per step, every rank's breakdown); the run's record."""
    config, (backend, cluster, device, *_) = plan.config, plan.placement
    state.enter(phase.FINISH, state.step)
    if state.timer.profiler is not None:
        state.timer.profiler.finish(state.timer)
    # Outside every timed window: the optional cross-check of compute on a fresh copy (timing.py
    # says why it is not what splits the step), then every rank's numbers in one collective.
    calibration = _calibration_batches(plan)

    def compute_loss(model: nn.Module, batch: Any) -> torch.Tensor:
        with plan.precision.autocast(device):
            mean, _ = loss_and_count(plan.loaded.task, model, batch, plan.loaded.label)
            return mean * config.grad_accum  # a whole step's compute

    compute_per_step = (
        calibrated_compute_per_step(plan.make_model(), compute_loss, calibration, device) if calibration else None
    )
    if compute_per_step is not None:
        compute_per_step *= config.grad_accum  # calibrated on one micro-batch; a step runs grad_accum of them
    breakdown = gather_breakdown(
        backend.all_reduce_sum,
        cluster.rank,
        cluster.world_size,
        device,
        state.timer,
        compute_per_step,
        config.calibration_steps,
        exact=device.type == "cpu" or config.profile,
        peak_memory=state.timer.memory.result(),
    )
    return run_record(plan, state, started, breakdown)
