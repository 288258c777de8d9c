"""`harness evaluate`: a saved model scored on its task's test data, spread over however many ranks
launched it, exactly as a training run evaluates (harness.training.evaluate). The backend is used
only to join the job and to reduce; no model wrapper, no optimizer."""

from __future__ import annotations

import os
import pickle
import time
from typing import Any

import torch
from torch import nn

from ..config import TrainConfig
from ..errors import UsageError, first_line
from ..process.state import preserved_process_state
from .evaluate import make_evaluation
from .outputs import save_record
from .placement import place_process
from .plan import plan_run
from .record import library_versions


def load_model_file(path: str, model: nn.Module, label: str) -> nn.Module:
    """`model` with the weights `harness train --save-model` wrote to `path`."""
    if not os.path.isfile(path):
        raise UsageError(f"model file {path} does not exist; write one with `harness train --save-model {path}`")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, pickle.UnpicklingError, EOFError, ValueError) as exc:
        raise UsageError(
            f"model file {path} is not a saved state_dict ({type(exc).__name__}); "
            "write one with `harness train --save-model`"
        ) from exc
    try:
        model.load_state_dict(state)
    except (RuntimeError, TypeError, AttributeError) as exc:
        raise UsageError(
            f"model file {path} does not fit the model of {label} ({first_line(exc, 120)}); pass the --task and "
            "task arguments it was trained with (its record's task)"
        ) from exc
    return model


def evaluate_model_file(config: TrainConfig, model_file: str, task: Any = None) -> dict[str, Any]:
    """Evaluate `model_file` on the test data of the config's task (or `task`) under the launching
    job's ranks. Every rank returns the same record; rank 0 also appends it to `config.results`."""
    started = time.time()
    with preserved_process_state():
        placement = place_process(config)
        plan = plan_run(config, placement, task)
        backend, cluster, device = placement.backend, placement.cluster, placement.device
        if plan.test_set is None:
            raise UsageError(f"{plan.loaded.label} has no test_data to evaluate on; give the task test data")
        model = load_model_file(model_file, plan.make_model(), plan.loaded.label)
        where = f" (rank {cluster.rank})" if cluster.world_size > 1 else ""
        evaluation = make_evaluation(
            plan.loaded,
            plan.test_set,
            model,
            lambda batch: plan.prepare(batch, training=False),
            plan.eval_batch,
            plan.precision,
            where,
        )
        try:
            backend.init(cluster, device)
            record = {
                **evaluation(model, backend, cluster, device),
                "kind": "evaluation",
                "model_file": os.path.abspath(model_file),
                "task": plan.loaded.origin(),
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
        save_record(config.results, {**record, "rank": 0}, model_file, "harness evaluate")
    return record
