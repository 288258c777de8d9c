"""`harness evaluate`: score a saved model on a test set, spread over however many ranks launched it.

The testing phase was the scaling bottleneck of the workshop case study (one process scored the
whole set). Here every rank scores its own block of the test set and the sums are reduced, with
`evaluate` below, the same function the training loop evaluates with after each epoch, so the
accuracy and `eval_samples` are the same at any world size. The backend is used only to join the
job and to reduce; no model wrapper, no optimizer.
"""

from __future__ import annotations

import os
import pickle
import time
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..backends import Backend
from ..backends.precision import Precision
from ..config import TrainConfig
from ..data import DataOptions, ImageArrays, load_split
from ..data.loader import iterate_batches
from ..data.sharding import eval_range
from ..errors import UsageError
from ..process.discovery import ClusterEnv
from ..process.state import preserved_process_state
from .models import build_model
from .placement import place_process
from .record import append_record, library_versions

EVAL_BATCH = 512


@torch.no_grad()
def evaluate(
    model: nn.Module,
    data: ImageArrays,
    backend: Backend,
    cluster: ClusterEnv,
    device: torch.device,
    precision: Precision = Precision.of("fp32"),
) -> dict[str, float]:
    """Loss and accuracy over the whole set, each sample scored exactly once across ranks.

    Ranks score disjoint contiguous blocks (no padding) and the global sums and counts are reduced
    in one allreduce; averaging per-rank means would weight small blocks wrongly.
    """
    was_training = model.training
    model.eval()
    normalise = data.normaliser(device)
    block = eval_range(len(data), cluster.world_size, cluster.rank)
    batches = [
        torch.arange(start, min(start + EVAL_BATCH, block.stop)).numpy()
        for start in range(block.start, block.stop, EVAL_BATCH)
    ]
    totals = torch.zeros(3, dtype=torch.float64, device=device)  # loss sum, correct, count
    for images, labels in iterate_batches(data, batches):
        images, labels = normalise(images.to(device)), labels.to(device)
        with precision.autocast(device):
            logits = model(images)
        totals[0] += F.cross_entropy(logits.float(), labels, reduction="sum").double()
        totals[1] += (logits.argmax(dim=1) == labels).sum()
        totals[2] += labels.numel()
    loss_sum, correct, count = backend.all_reduce_sum(totals).tolist()
    model.train(was_training)
    return {"eval_loss": loss_sum / count, "eval_accuracy": correct / count, "eval_samples": int(count)}


def load_model_file(path: str, config: TrainConfig, channels: int, size: int, num_classes: int) -> torch.nn.Module:
    """The model `config.model` for these inputs, with the weights `harness train --save-model` wrote."""
    if not os.path.isfile(path):
        raise UsageError(f"model file {path} does not exist; write one with `harness train --save-model {path}`")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, pickle.UnpicklingError, EOFError, ValueError) as exc:
        raise UsageError(
            f"model file {path} is not a saved state_dict ({type(exc).__name__}); "
            "write one with `harness train --save-model`"
        ) from exc
    model = build_model(config.model, channels, size, num_classes)
    try:
        model.load_state_dict(state)
    except (RuntimeError, TypeError, AttributeError) as exc:
        raise UsageError(
            f"model file {path} does not fit --model {config.model} on --dataset {config.dataset} "
            f"({channels}x{size}x{size}, {num_classes} classes); pass the flags it was trained "
            "with"
        ) from exc
    return model


def evaluate_model_file(config: TrainConfig, model_file: str) -> dict[str, Any]:
    """Evaluate `model_file` on the test split of `config.dataset` under the launching job's ranks.

    Every rank returns the same record; rank 0 also appends it to `config.results` (as train does).
    """
    started = time.time()
    with preserved_process_state():
        backend, cluster, device, *_ = place_process(config)
        test_set = load_split(
            config.dataset, "test", DataOptions(config.data_dir, config.model, config.image_size, config.timeout)
        )
        channels, size, _ = test_set.shape
        model = load_model_file(model_file, config, channels, size, test_set.num_classes).to(device)
        try:
            backend.init(cluster, device, config)
            record = {
                **evaluate(model, test_set, backend, cluster, device),
                "kind": "evaluation",
                "model_file": os.path.abspath(model_file),
                "model": config.model,
                "dataset": config.dataset,
                "backend": config.backend,
                "launcher": cluster.launcher,
                "world_size": cluster.world_size,
                "rank": cluster.rank,
                "device": device.type,
                "wall_time": time.time() - started,
                "versions": library_versions(),
                "tags": dict(config.tags),
            }
        finally:
            backend.shutdown()
    if cluster.is_main and config.results:
        append_record(config.results, {**record, "rank": 0})
    return record
