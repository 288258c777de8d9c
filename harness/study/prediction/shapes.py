"""The model whose traffic a prediction prices (harness.backends.traffic.ModelShape), from the task:

- `record_shape`: a record's own, as its run measured it (record["task"]: parameter_bytes,
  unit_bytes, module_bytes); for a record made before tasks existed, the built-in images task's
  model `record["model"]` on `record["dataset"]`, where it is built to the record's gradient bytes;
- `task_shape`: a task's model built as a run starts it (harness.training.plan.initial_model) from
  its spec and arguments: what `harness predict --task` and a study's prediction before its runs
  price. Built once per spec and arguments in a process (a ResNet-50 takes seconds);
- `model_gradient_bytes`: the images task's model on an ImageNet-shaped (synthetic) input, by name.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from typing import Any, Optional

from ...backends.traffic import ModelShape
from ...config import DEFAULT_TASK, TrainConfig
from ...errors import UsageError


def record_shape(record: Mapping[str, Any]) -> Optional[ModelShape]:
    """The shape of the model `record` trained; None where it cannot be told (the caller prices one
    unit of the gradient bytes)."""
    task = record.get("task") or {}
    if task.get("parameter_bytes"):
        return ModelShape(
            int(task["parameter_bytes"]), tuple(task.get("unit_bytes") or ()), tuple(task.get("module_bytes") or ())
        )
    if task or not record.get("model"):
        return None
    try:  # a record made before tasks: the images task's model, if its data is on this machine
        shape = task_shape(DEFAULT_TASK, {"model": record["model"], "dataset": record.get("dataset", "synthetic")})
    except UsageError:
        return None
    gradient = record.get("gradient_bytes")
    return shape if gradient is None or shape.parameter_bytes == gradient else None


def task_shape(task: str, args: Mapping[str, Any]) -> ModelShape:
    """The shape of task `task`'s model with arguments `args` (a spec; UsageError where it cannot load)."""
    return _built_shape(task, json.dumps(dict(args), sort_keys=True))


@functools.lru_cache(maxsize=16)
def _built_shape(task: str, args: str) -> ModelShape:
    from ...training.plan import initial_model, model_shape

    return model_shape(initial_model(TrainConfig(task=task, task_args=json.loads(args))))


def model_gradient_bytes(model: str, dataset: str = "synthetic") -> int:
    """Bytes of the trainable parameters of the images task's `model` on `dataset` (synthetic: the
    ResNets ImageNet-shaped, the CNN MNIST-shaped)."""
    return task_shape(DEFAULT_TASK, {"model": model, "dataset": dataset}).parameter_bytes
