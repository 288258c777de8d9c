"""The training loop: one loop for every backend, which it only knows through `Backend`."""

from __future__ import annotations

import math
import sys
import time
import uuid
from typing import Any, Dict, List, Optional

import torch
import torch.nn.functional as F
from torch import nn

from .backends import Backend, get_backend
from .cluster import ClusterEnv, default_threads, detect_cluster, select_device
from .config import TrainConfig
from .data import ImageArrays, load_split
from .data.loader import iterate_batches
from .data.sharding import eval_range, steps_per_epoch, train_batches
from .errors import UsageError
from .fileio import atomic_write
from .lr import learning_rate, scaled_lr
from .models import build_model
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


def _progress(total: int, enabled: bool):
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, unit="step", leave=False, dynamic_ncols=True)


def train(config: TrainConfig) -> Dict[str, Any]:
    """Train under whatever launcher started this process; return the run's results record.

    Every rank returns the same record (metrics are reduced over ranks); rank 0 also appends it to
    `config.results` and writes `config.save_model`. Bad input raises UsageError before any
    process group starts.
    """
    started = time.time()
    config.validate()
    backend = get_backend(config.backend)
    backend.check_available()
    cluster = detect_cluster()
    backend.check_launch(config, cluster)
    local_batch = config.local_batch(cluster.world_size)
    global_batch = local_batch * cluster.world_size
    device = select_device(config.device, cluster)
    threads = config.threads or default_threads(cluster)
    if device.type == "cpu":
        torch.set_num_threads(threads)

    train_set = load_split(config.dataset, "train", config.data_dir, config.model)
    test_set = load_split(config.dataset, "test", config.data_dir, config.model)
    epoch_steps = steps_per_epoch(len(train_set), cluster.world_size, local_batch)
    if epoch_steps == 0:
        raise UsageError(f"the training set has {len(train_set)} samples, fewer than one global batch of "
                         f"{global_batch}; lower --batch-size or use fewer workers")
    total_steps = epoch_steps * config.epochs
    if config.max_steps is not None:
        total_steps = min(total_steps, config.max_steps)
    num_epochs = math.ceil(total_steps / epoch_steps)

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
        model, optimizer = backend.wrap(model, make_optimizer_factory(config), config, local_batch)
        record = _run_epochs(config, backend, cluster, device, model, optimizer, train_set, test_set, make_model,
                             local_batch, epoch_steps, total_steps, num_epochs, lr_at)
        record.update({
            "run_id": uuid.uuid4().hex[:12], "started": started, "wall_time": time.time() - started,
            "backend": config.backend, "launcher": cluster.launcher, "world_size": cluster.world_size,
            "local_world_size": cluster.local_world_size, "local_batch": local_batch, "global_batch": global_batch,
            "model": config.model, "dataset": config.dataset, "train_set_size": len(train_set),
            "device": device.type, "threads_per_rank": threads if device.type == "cpu" else None,
            "lr_base": config.lr, "base_batch": base_batch, "lr_effective": peak_lr, "warmup_steps": warmup_steps,
            "math": backend.math_settings(config), "versions": {**library_versions(), **backend.versions()},
            "host": host_info(), "config": config.to_dict(),
        })
        if config.save_model:
            state = backend.full_state_dict()  # a collective where weights are sharded (ZeRO-3)
            if cluster.is_main:
                atomic_write(config.save_model, lambda tmp: torch.save(state, tmp))
        if cluster.is_main and config.results:
            append_record(config.results, record)
        return record
    finally:
        backend.shutdown()


def _run_epochs(config: TrainConfig, backend: Backend, cluster: ClusterEnv, device: torch.device,
                model: nn.Module, optimizer: torch.optim.Optimizer, train_set: ImageArrays, test_set: ImageArrays,
                make_model, local_batch: int, epoch_steps: int, total_steps: int, num_epochs: int,
                lr_at) -> Dict[str, Any]:
    normalise = train_set.normaliser(device)
    timing_warmup = min(config.timing_warmup_steps, total_steps // 2)
    global_batch = local_batch * cluster.world_size
    progress = _progress(total_steps, cluster.is_main and sys.stderr.isatty())
    epoch_times: List[float] = []
    epoch_throughputs: List[float] = []
    train_losses: List[float] = []
    evaluation: Dict[str, Any] = {}
    timed = {"seconds": 0.0, "steps": 0, "data_wait": 0.0}
    step = 0
    for epoch in range(num_epochs):
        # The order depends on (seed, epoch) only: every rank reshuffles identically each epoch.
        batches = train_batches(len(train_set), cluster.world_size, cluster.rank, local_batch, config.seed, epoch)
        batches = batches[:total_steps - step]
        loss_sum = torch.zeros(2, dtype=torch.float64, device=device)  # summed loss, samples
        # Timed windows open and close at barriers, so they span the slowest rank's work.
        backend.barrier()
        epoch_start = window_start = time.perf_counter()
        window_steps, data_wait = 0, 0.0
        wait_start = time.perf_counter()
        for images, labels in iterate_batches(train_set, batches, config.num_workers, device.type == "cuda"):
            images = normalise(images.to(device, non_blocking=True))
            labels = labels.to(device, non_blocking=True)
            data_wait += time.perf_counter() - wait_start
            lr = lr_at(step)
            for group in optimizer.param_groups:
                group["lr"] = lr
            loss = F.cross_entropy(model(images), labels)
            backend.backward(loss)
            backend.step()
            loss_sum[0] += loss.detach().double() * labels.numel()
            loss_sum[1] += labels.numel()
            step += 1
            window_steps += 1
            if progress is not None:
                progress.update(1)
            if step == timing_warmup:  # leave start-up (allocations, first collectives) out of the window
                backend.barrier()
                window_start, window_steps, data_wait = time.perf_counter(), 0, 0.0
            wait_start = time.perf_counter()
        backend.barrier()
        window_end = time.perf_counter()
        epoch_times.append(window_end - epoch_start)
        if window_steps:
            timed["seconds"] += window_end - window_start
            timed["steps"] += window_steps
            timed["data_wait"] += data_wait
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
    if progress is not None:
        progress.close()

    # Accelerator utilisation (DLIO): compute / (compute + data wait), from sums over ranks.
    waits = backend.all_reduce_sum(torch.tensor([timed["data_wait"], timed["seconds"]], dtype=torch.float64,
                                                device=device)).tolist()
    throughput = timed["steps"] * global_batch / timed["seconds"] if timed["seconds"] else None
    spread = mean_and_ci95(epoch_throughputs)
    return {
        "steps": step, "epochs": num_epochs, "steps_per_epoch": epoch_steps,
        "samples_seen": step * global_batch,
        "timed_steps": timed["steps"], "timed_seconds": timed["seconds"], "timing_warmup_steps": timing_warmup,
        "throughput": throughput,
        "throughput_ci95": spread["ci95"],
        "throughput_per_worker": throughput / cluster.world_size if throughput else None,
        "epoch_times": epoch_times, "epoch_throughputs": epoch_throughputs,
        "au": 1.0 - waits[0] / waits[1] if waits[1] else None,
        "train_loss": train_losses[-1], "train_losses": train_losses,
        "lr_final": lr_at(step - 1),
        **evaluation,
    }
