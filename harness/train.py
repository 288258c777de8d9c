"""The training loop: one loop for every backend, which it only knows through `Backend`."""

from __future__ import annotations

import itertools
import math
import sys
import time
import uuid
from typing import Any, Callable, Dict, List, NamedTuple, Optional

import torch
import torch.nn.functional as F
from torch import nn

from .allocator import reuse_freed_memory
from .backends import Backend, get_backend
from .checkpoint import Checkpointer, Progress, ResumeState, RunLayout, find_resume_checkpoint, restore
from .cluster import ClusterEnv, default_threads, detect_cluster, select_device
from .config import TrainConfig
from .data import DataOptions, ImageArrays, load_split
from .data.loader import iterate_batches
from .data.sharding import RankSchedule, eval_range, steps_per_epoch, train_batches
from .data.transforms import train_transform
from .errors import EXIT_PREEMPTED, Preempted, UsageError
from .fileio import atomic_write
from .lr import learning_rate, scaled_lr
from .models import build_model
from .pop import accelerator_utilisation, pop_metrics, rank_breakdown
from .preemption import PreemptionWatcher, TestSignal, peer_failure
from .results import append_record, host_info, library_versions, mean_and_ci95

EVAL_BATCH = 512


def make_optimizer_factory(config: TrainConfig):
    """The optimizer the config names, for the backend to build over the parameters it owns."""
    def make(parameters):
        if config.optimizer == "adam":
            return torch.optim.Adam(parameters, lr=config.lr, weight_decay=config.weight_decay)
        return torch.optim.SGD(parameters, lr=config.lr, momentum=config.momentum, weight_decay=config.weight_decay)
    return make


@torch.no_grad()
def evaluate(model: nn.Module, data: ImageArrays, backend: Backend, cluster: ClusterEnv,
             device: torch.device) -> Dict[str, float]:
    """Loss and accuracy over the whole set, each sample scored exactly once across ranks.

    Ranks score disjoint contiguous blocks (no padding) and the global sums and counts are reduced
    in one allreduce; averaging per-rank means would weight small blocks wrongly.
    """
    was_training = model.training
    model.eval()
    normalise = data.normaliser(device)
    block = eval_range(len(data), cluster.world_size, cluster.rank)
    batches = [torch.arange(start, min(start + EVAL_BATCH, block.stop)).numpy()
               for start in range(block.start, block.stop, EVAL_BATCH)]
    totals = torch.zeros(3, dtype=torch.float64, device=device)  # loss sum, correct, count
    for images, labels in iterate_batches(data, batches):
        images, labels = normalise(images.to(device)), labels.to(device)
        logits = model(images)
        totals[0] += F.cross_entropy(logits, labels, reduction="sum").double()
        totals[1] += (logits.argmax(dim=1) == labels).sum()
        totals[2] += labels.numel()
    loss_sum, correct, count = backend.all_reduce_sum(totals).tolist()
    model.train(was_training)
    return {"eval_loss": loss_sum / count, "eval_accuracy": correct / count, "eval_samples": int(count)}


def device_waiter(device: torch.device) -> Callable[[], None]:
    """A function that waits until the device has finished its queued work (nothing to wait for on CPU)."""
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


def calibrated_compute_per_step(make_model: Callable[[], nn.Module], data: ImageArrays, batches: List,
                                device: torch.device, steps: int) -> Optional[float]:
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
    chosen = batches[-(steps + 1):] if steps else []
    if len(chosen) < 2:
        return None
    model = make_model().to(device).train()
    normalise = data.normaliser(device)
    wait_for_device = device_waiter(device)
    seconds: List[float] = []
    for indices in chosen:
        images, labels = data.fetch(indices)
        images, labels = normalise(images.to(device)), labels.to(device)
        wait_for_device()
        start = time.perf_counter()
        F.cross_entropy(model(images), labels).backward()
        wait_for_device()
        seconds.append(time.perf_counter() - start)
        model.zero_grad(set_to_none=True)  # as the training step does, so backward allocates alike
    timed = sorted(seconds[1:])  # the first step allocates; leave it out
    return timed[len(timed) // 2]


def _step_breakdown(backend: Backend, cluster: ClusterEnv, device: torch.device, timed: Dict[str, float],
                    compute_per_step: Optional[float], calibration_steps: int, exact: bool) -> Dict[str, Any]:
    """Every rank's phase totals gathered in one collective, the AU and the POP metrics of the run."""
    my_compute = compute_per_step * timed["steps"] if compute_per_step is not None else -1.0  # -1: not measured
    mine = [timed["seconds"], timed["data_wait"], timed["gradients"], timed["optimizer"], my_compute]
    # One allreduce of a [quantity x rank] table with only this rank's column filled gathers all ranks.
    table = torch.zeros(len(mine), cluster.world_size, dtype=torch.float64, device=device)
    table[:, cluster.rank] = torch.tensor(mine, dtype=torch.float64)
    runtime, data_wait, gradients, optimizer, compute = backend.all_reduce_sum(table).tolist()
    ranks = [rank_breakdown(runtime[r], data_wait[r], gradients[r], optimizer[r],
                            compute[r] if compute[r] >= 0 else None) for r in range(cluster.world_size)]
    per_rank = {key: [rank[key] for rank in ranks] for key in ranks[0]}
    steps = timed["steps"]
    per_step = {key: (sum(values) / len(values) / steps if steps and None not in values else None)
                for key, values in per_rank.items()}
    calibrated = None not in per_rank["useful"] and steps > 0
    return {
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


def _progress(total: int, enabled: bool):
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, unit="step", leave=False, dynamic_ncols=True)


class Placement(NamedTuple):
    """Where and how this rank runs, decided before any process group starts."""

    backend: Backend
    cluster: ClusterEnv
    device: torch.device
    threads: int
    cpu_malloc: str  # the CPU memory mode in effect (harness.allocator)


def place_process(config: TrainConfig) -> Placement:
    """Check the config, backend and launch (no process group yet); pick this rank's device, threads
    and CPU memory reuse."""
    config.validate()
    backend = get_backend(config.backend)
    backend.check_available()
    cluster = detect_cluster()
    backend.check_launch(config, cluster)
    device = select_device(config.device, cluster)
    threads = config.threads or default_threads(cluster)
    cpu_malloc = "not applied (GPU run)"
    if device.type == "cpu":
        torch.set_num_threads(threads)
        cpu_malloc = reuse_freed_memory(config.cpu_malloc)
    return Placement(backend, cluster, device, threads, cpu_malloc)


def train(config: TrainConfig) -> Dict[str, Any]:
    """Train under whatever launcher started this process; return the run's results record.

    Every rank returns the same record (metrics are reduced over ranks); rank 0 also appends it to
    `config.results` and writes `config.save_model`. Bad input raises UsageError before any
    process group starts.
    """
    started = time.time()
    backend, cluster, device, threads, cpu_malloc = place_process(config)
    local_batch = config.local_batch(cluster.world_size)
    global_batch = local_batch * cluster.world_size

    # Before any process group exists: an on-disk dataset is prepared here by one process per
    # filesystem while the others wait on its lock (see harness.data.prepare).
    data_options = DataOptions(config.data_dir, config.model, config.image_size, config.timeout)
    train_set = load_split(config.dataset, "train", data_options)
    test_set = load_split(config.dataset, "test", data_options)
    epoch_steps = steps_per_epoch(len(train_set), cluster.world_size, local_batch)
    if epoch_steps == 0:
        raise UsageError(f"the training set has {len(train_set)} samples, fewer than one global batch of "
                         f"{global_batch}; lower --batch-size or use fewer workers")
    total_steps = epoch_steps * config.epochs
    if config.max_steps is not None:
        total_steps = min(total_steps, config.max_steps)
    num_epochs = math.ceil(total_steps / epoch_steps)
    # Chosen and checked before any process group starts: an unusable checkpoint is bad input.
    layout = RunLayout(cluster.world_size, global_batch, len(train_set), epoch_steps, total_steps)
    resume_from = find_resume_checkpoint(config, layout, backend.checkpoint_format, warn=cluster.is_main)
    preemption = PreemptionWatcher(TestSignal.from_environ())

    # Batch and LR scaling: --lr is tuned for the base batch; a larger global batch scales it.
    base_batch = config.base_batch or (config.global_batch or config.batch_size)
    peak_lr = scaled_lr(config.lr, global_batch, base_batch, config.lr_scaling)
    warmup_steps = round(config.warmup_epochs * epoch_steps)

    def lr_at(step: int) -> float:
        return learning_rate(step, base_lr=config.lr, peak_lr=peak_lr, warmup_steps=warmup_steps,
                             total_steps=total_steps, schedule=config.schedule)

    # Same seed on every rank, so every rank builds identical initial weights (backends also
    # broadcast rank 0's); then a per-rank seed so dropout masks differ between ranks.
    torch.manual_seed(config.seed)
    channels, size, _ = train_set.shape
    def make_model() -> nn.Module:
        return build_model(config.model, channels, size, train_set.num_classes, config.dropout)
    model = make_model().to(device)
    torch.manual_seed(config.seed * 1000 + cluster.rank + 1)

    backend.init(cluster, device, config)
    try:
        preemption.install()
        model, optimizer = backend.wrap(model, make_optimizer_factory(config), config, local_batch)
        # After wrap (DeepSpeed loads into its engine); the RNG states are restored last.
        resumed = restore(resume_from, backend, cluster, device) if resume_from else None
        checkpointer = Checkpointer(config, cluster, backend, layout) if config.checkpoint_dir else None
        record = _run_epochs(config, backend, cluster, device, model, optimizer, train_set, test_set, make_model,
                             local_batch, epoch_steps, total_steps, num_epochs, lr_at, checkpointer, resumed,
                             preemption)
        record.update({
            "run_id": uuid.uuid4().hex[:12], "started": started, "wall_time": time.time() - started,
            "backend": config.backend, "launcher": cluster.launcher, "world_size": cluster.world_size,
            "local_world_size": cluster.local_world_size, "local_batch": local_batch, "global_batch": global_batch,
            "model": config.model, "dataset": config.dataset, "train_set_size": len(train_set),
            "device": device.type, "threads_per_rank": threads if device.type == "cpu" else None,
            "lr_base": config.lr, "base_batch": base_batch, "lr_effective": peak_lr, "warmup_steps": warmup_steps,
            "math": backend.math_settings(config), "tuning": {**backend.tuning(), "cpu_malloc": cpu_malloc},
            "versions": {**library_versions(), **backend.versions()},
            "host": host_info(), "config": config.to_dict(), "tags": dict(config.tags),
        })
        if config.save_model:
            state = backend.full_state_dict()  # a collective where weights are sharded (ZeRO-3)
            if cluster.is_main:
                atomic_write(config.save_model, lambda tmp: torch.save(state, tmp))
        if cluster.is_main and config.results:
            append_record(config.results, record)
        # Leave together: a rank destroying its process group while a peer still has collectives in
        # flight (ZeRO-3 prefetches) is the kind of teardown race that aborts a finished run.
        backend.barrier()
        return record
    except Exception as exc:
        if backend.is_peer_failure(exc):
            raise peer_failure(exc, cluster.rank, config.timeout) from exc
        raise
    finally:
        preemption.uninstall()
        backend.shutdown()


def _preempted(checkpointer: Optional[Checkpointer], preemption: PreemptionWatcher, step: int, total_steps: int,
               is_main: bool) -> Preempted:
    """The exception that ends a preempted run, once its checkpoint (if any) is written."""
    saved = (f"checkpoint {checkpointer.last_path} is written; resubmit with --resume auto to continue"
             if checkpointer is not None else "nothing was saved (no --checkpoint-dir)")
    return Preempted(f"stopped by {preemption.signal_name()} after step {step} of {total_steps}; {saved} "
                     f"(exit status {EXIT_PREEMPTED})", is_main)


def _run_epochs(config: TrainConfig, backend: Backend, cluster: ClusterEnv, device: torch.device,
                model: nn.Module, optimizer: torch.optim.Optimizer, train_set: ImageArrays, test_set: ImageArrays,
                make_model, local_batch: int, epoch_steps: int, total_steps: int, num_epochs: int,
                lr_at, checkpointer: Optional[Checkpointer], resumed: Optional[ResumeState],
                preemption: PreemptionWatcher) -> Dict[str, Any]:
    start = resumed.step if resumed else 0  # a resumed run continues at its checkpoint's global step
    run_progress = resumed.progress if resumed else Progress()
    transform = train_transform(train_set, device, config.augment, config.seed, cluster.rank, cluster.world_size,
                                local_batch)
    # One loader for the whole run, so worker processes start once and prefetch across epochs.
    stream = iterate_batches(train_set, RankSchedule(len(train_set), cluster.world_size, cluster.rank, local_batch,
                                                     config.seed, total_steps, first_step=start),
                             config.num_workers, device.type == "cuda", config.prefetch)
    timing_warmup = min(config.timing_warmup_steps, (total_steps - start) // 2)
    global_batch = local_batch * cluster.world_size
    progress = _progress(total_steps - start, cluster.is_main and sys.stderr.isatty())
    epoch_times: List[float] = []
    epoch_throughputs: List[float] = []
    train_losses: List[float] = run_progress.train_losses  # of the whole run, earlier segments included
    evaluation: Dict[str, Any] = run_progress.evaluation
    timed = {"seconds": 0.0, "steps": 0, "data_wait": 0.0, "gradients": 0.0, "optimizer": 0.0}
    # Windows close on finished device work; phases do only when --profile asks (it costs overlap).
    wait_for_device = device_waiter(device)
    phase_end = wait_for_device if config.profile else (lambda: None)
    step, preempted = start, False
    for epoch in range(start // epoch_steps, num_epochs):
        # The order depends on (seed, epoch) only: every rank reshuffles identically each epoch.
        batches = train_batches(len(train_set), cluster.world_size, cluster.rank, local_batch, config.seed, epoch)
        batches = batches[step - epoch * epoch_steps:total_steps - epoch * epoch_steps]
        epoch_last_step = step + len(batches)
        loss_sum = torch.zeros(2, dtype=torch.float64, device=device)  # summed loss, samples
        if resumed is not None and epoch == start // epoch_steps:
            loss_sum += resumed.epoch_loss_sums  # this epoch's steps before the checkpoint
        # Timed windows open and close at barriers, so they span the slowest rank's work.
        wait_for_device()
        backend.barrier()
        epoch_start = window_start = time.perf_counter()
        window_steps, data_wait, gradient_time, optimizer_time = 0, 0.0, 0.0, 0.0
        wait_start = time.perf_counter()
        for images, labels in itertools.islice(stream, len(batches)):
            images = transform(images.to(device, non_blocking=True), epoch, step)
            labels = labels.to(device, non_blocking=True)
            phase_end()
            data_ready = time.perf_counter()
            data_wait += data_ready - wait_start
            lr = lr_at(step)
            for group in optimizer.param_groups:
                group["lr"] = lr
            loss = F.cross_entropy(model(images), labels)
            backend.backward(loss)
            backend.finish_gradient_sync()
            phase_end()
            gradients_ready = time.perf_counter()
            backend.step()
            phase_end()
            stepped = time.perf_counter()
            gradient_time += gradients_ready - data_ready
            optimizer_time += stepped - gradients_ready
            loss_sum[0] += loss.detach().double() * labels.numel()
            loss_sum[1] += labels.numel()
            step += 1
            window_steps += 1
            if progress is not None:
                progress.update(1)
            if step - start == timing_warmup:  # leave start-up (allocations, first collectives) out of the window
                wait_for_device()
                backend.barrier()
                window_steps, data_wait, gradient_time, optimizer_time = 0, 0.0, 0.0, 0.0
                window_start = time.perf_counter()
            preempted = preemption.stop_agreed(step, cluster.rank, backend, device)  # a collective
            if preempted:
                break
            if checkpointer is not None and checkpointer.due(step) and step < epoch_last_step:
                pause = checkpointer.save(step, run_progress, loss_sum, "every --checkpoint-every steps")
                epoch_start, window_start = epoch_start + pause, window_start + pause  # not training time
            wait_start = time.perf_counter()
        if preempted and step < epoch_last_step:  # stopped mid-epoch: checkpoint where every rank stopped
            if checkpointer is not None:
                checkpointer.save(step, run_progress, loss_sum, "preempted")
            raise _preempted(checkpointer, preemption, step, total_steps, cluster.is_main)
        wait_for_device()
        backend.barrier()
        window_end = time.perf_counter()
        epoch_times.append(window_end - epoch_start)
        if window_steps:
            timed["seconds"] += window_end - window_start
            timed["steps"] += window_steps
            timed["data_wait"] += data_wait
            timed["gradients"] += gradient_time
            timed["optimizer"] += optimizer_time
            epoch_throughputs.append(window_steps * global_batch / (window_end - window_start))
        summed_loss, samples = backend.all_reduce_sum(loss_sum).tolist()
        train_losses.append(summed_loss / samples)
        last = epoch == num_epochs - 1
        if last or (config.eval_every and (epoch + 1) % config.eval_every == 0):
            evaluation = evaluate(backend.evaluation_model(make_model), test_set, backend, cluster, device)
        if cluster.is_main:
            line = (f"epoch {epoch + 1}/{num_epochs} | train loss {train_losses[-1]:.4f} | lr {lr:.4g} | "
                    f"{epoch_throughputs[-1] if epoch_throughputs else float('nan'):,.0f} samples/s | "
                    f"{epoch_times[-1]:.1f} s")
            if evaluation and (last or (config.eval_every and (epoch + 1) % config.eval_every == 0)):
                line += f" | eval loss {evaluation['eval_loss']:.4f} acc {100 * evaluation['eval_accuracy']:.2f}%"
            (progress.write if progress is not None else print)(line, **({} if progress else {"flush": True}))
        run_progress.evaluation = evaluation
        if checkpointer is not None:
            checkpointer.save(step, run_progress, torch.zeros_like(loss_sum), "epoch end")
        if preempted and not last:
            raise _preempted(checkpointer, preemption, step, total_steps, cluster.is_main)
    preemption.settle()
    stream.close()
    if progress is not None:
        progress.close()

    # Outside every timed window: calibrate compute on the last epoch's batches, then gather.
    compute_per_step = calibrated_compute_per_step(make_model, train_set, batches, device, config.calibration_steps)
    breakdown = _step_breakdown(backend, cluster, device, timed, compute_per_step, config.calibration_steps,
                                exact=device.type != "cuda" or config.profile)
    throughput = timed["steps"] * global_batch / timed["seconds"] if timed["seconds"] else None
    spread = mean_and_ci95(epoch_throughputs)
    return {
        # Counts cover the whole run, each step once, however many segments (resumes) it took;
        # timings (timed_*, throughput, epoch_*, wall_time) cover this segment only.
        "steps": step, "epochs": num_epochs, "steps_per_epoch": epoch_steps,
        "samples_seen": step * global_batch,
        "resumed_from_step": start, "segments": run_progress.segments,
        "checkpoint_seconds": checkpointer.seconds if checkpointer is not None else 0.0,
        "timed_steps": timed["steps"], "timed_seconds": timed["seconds"], "timing_warmup_steps": timing_warmup,
        "throughput": throughput,
        "throughput_ci95": spread["ci95"],
        "throughput_per_worker": throughput / cluster.world_size if throughput else None,
        "epoch_times": epoch_times, "epoch_throughputs": epoch_throughputs,
        **breakdown,
        "train_loss": train_losses[-1], "train_losses": train_losses,
        "lr_final": lr_at(step - 1),
        **evaluation,
    }
