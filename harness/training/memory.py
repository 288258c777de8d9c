"""A rank's peak memory over its timed window, measured the same way under every backend (the
record's `memory`).

On a GPU (or any accelerator): torch.accelerator.max_memory_allocated, what torch's caching
allocator handed out at most (not what it reserved from the driver), its peak reset when the window
opens. On the CPU: the process's resident-set peak (VmHWM in /proc/self/status), reset when the
window opens by writing 5 to /proc/self/clear_refs (Linux >= 4.0), so that neither start-up, nor
model construction before sharding, nor evaluation with its larger batches is in the figure; where
the kernel refuses the reset (or without /proc: getrusage's ru_maxrss), the peak is the whole
process's, and the record's `scope` says so.

Beside the peak, what sharding is meant to shrink: the bytes of the model's state this rank holds
(`model_state_bytes`), counted from the live tensors once, when the gradients of a warm-up step are
averaged (the optimizer has stepped before, so its state exists): the weights (parameters and
buffers, or this rank's shard of them), the parameters' gradients, the optimizer's state, and every
other tensor the backend reaches (the framework's copies of the weights, flat buffers, gradient
partitions, communication buckets), each storage once. On the CPU the resident set also holds torch
itself (about 750 MiB), which hides what ZeRO or FSDP saves on a small model; this count does not.
A buffer made with torch.empty counts at its full size: an accelerator's allocator hands it out
whole, while on the CPU its pages become resident only when written.

Beside both, what harness.backends.memory predicted at the run's start (`run_prediction`, the
record's memory.predicted with its error per rank): from the plain model, the backend's options, and
the activations its first micro-batch saved for backward in the task's probe (`SavedActivations`).
"""

from __future__ import annotations

import resource
import sys
import types
from collections.abc import Iterable, Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Callable, Optional

import torch
from torch import nn
from torch._subclasses.fake_tensor import is_fake

from ..backends.memory import Activations, MemoryPrediction, Training, has_memory_rule, predict_memory
from ..backends.traffic import ModelShape

if TYPE_CHECKING:
    from .plan import RunPlan

CUDA_ALLOCATOR = "cuda_allocator"  # on another accelerator "<device type>_allocator", e.g. xpu_allocator
RSS_PEAK = "rss_peak"
MODEL_STATE = ("weights", "gradients", "optimizer", "framework")  # model_state_bytes' parts, in order
# Objects whose attributes hold no training state; walking into them (a module's globals, a class's
# methods) would reach every tensor of the process.
_OPAQUE = (
    str,
    bytes,
    int,
    float,
    complex,
    bool,
    type(None),
    type,
    types.ModuleType,
    types.FunctionType,
    types.BuiltinFunctionType,
    types.MethodType,
    types.CodeType,
    types.FrameType,
)
_MOST_OBJECTS = 2_000_000  # a bound on the walk; a backend's graph is tens of thousands


class WindowPeak:
    """The highest peak memory of the timed windows: reset as a window opens, read as it closes."""

    def __init__(self, device: torch.device, count_model_state: Optional[Callable[[], dict[str, int]]] = None) -> None:
        self.device = device
        self.bytes = 0.0
        self.source = CUDA_ALLOCATOR
        self.whole_process = False  # a reset was refused: the figure starts with the process
        self._count_model_state = count_model_state
        self.model_state: Optional[dict[str, int]] = None  # model_state_bytes, once counted
        self.predicted: Optional[MemoryPrediction] = None  # what run_prediction said at the run's start

    def see_model_state(self) -> None:
        """Count the model's state (outside the timed window: the walk takes tens of milliseconds), once."""
        if self.model_state is None and self._count_model_state is not None:
            self.model_state = self._count_model_state()

    def open(self) -> None:
        if self.device.type != "cpu":
            torch.accelerator.reset_peak_memory_stats(self.device)
            return
        try:
            with open("/proc/self/clear_refs", "w") as clear_refs:
                clear_refs.write("5")  # resets VmHWM to the current resident set
        except OSError:
            self.whole_process = True

    def close(self) -> None:
        peak, self.source = peak_memory(self.device)
        self.bytes = max(self.bytes, peak)

    def result(self) -> tuple[float, str, bool]:
        """(peak bytes, source, whether it is the whole process's): a run whose window never
        opened (fewer steps than the timing warm-up) reports the process's peak so far."""
        if self.bytes == 0.0:
            peak, source = peak_memory(self.device)
            return peak, source, True
        return self.bytes, self.source, self.whole_process


def peak_memory(device: torch.device) -> tuple[float, str]:
    """(this rank's peak memory in bytes, its source: CUDA_ALLOCATOR or RSS_PEAK)."""
    if device.type == "cpu":
        return float(_resident_peak()), RSS_PEAK
    return float(torch.accelerator.max_memory_allocated(device)), f"{device.type}_allocator"


def _resident_peak() -> int:
    """The process's resident-set peak in bytes."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024  # the kernel writes kB
    except OSError:
        pass  # not Linux: getrusage below
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, kB elsewhere


def model_state_bytes(model: nn.Module, framework: Any) -> dict[str, int]:
    """The bytes of the model's state this rank holds now, by MODEL_STATE part: the weights (the
    model's parameters and buffers, their local shards, and tensors a parameter carries, such as
    ZeRO-3's partition), their gradients (the parameters' `.grad`), the optimizer's state (the
    `state` of every torch optimizer reachable from `framework`: Adam's moments and step counts) and
    every other tensor reachable from `framework`, the backend object (the framework's own copies
    of weights, flat buffers, gradient partitions and communication buckets). Views of one storage
    count once, in the first part that holds them (DDP's gradients are views of its buckets)."""
    parameters = list(model.parameters())
    reachable, optimizers = _reachable(framework)
    parts = [
        _storages(_carried(tensor) for tensor in [*parameters, *model.buffers()]),
        _storages(_carried(p.grad) for p in parameters if p.grad is not None),
        # the state's values: its keys are the parameters the optimizer steps (ZeRO's float32 partitions)
        _storages(
            _carried(tensor) for optimizer in optimizers for tensor in _reachable(list(optimizer.state.values()))[0]
        ),
        _storages(_carried(tensor) for tensor in reachable),
    ]
    counted: set = set()
    sizes = []
    for part in parts:
        sizes.append(sum(size for key, size in part.items() if key not in counted))
        counted.update(part)
    return dict(zip(MODEL_STATE, sizes))


def _carried(tensor: torch.Tensor) -> Iterator[torch.Tensor]:
    """The tensor and the tensors stored as its attributes (ZeRO-3's `ds_tensor` partition)."""
    yield tensor
    yield from (value for value in vars(tensor).values() if isinstance(value, torch.Tensor))


def _storages(groups: Iterable[Iterable[torch.Tensor]]) -> dict[tuple[str, int], int]:
    """{(device, address): bytes} of the storages behind the tensors; a wrapper subclass such as
    FSDP's DTensor by the local tensors it wraps."""
    found: dict[tuple[str, int], int] = {}
    pending = [tensor for group in groups for tensor in group]
    while pending:
        tensor = pending.pop()
        if type(tensor) is not torch.Tensor and hasattr(tensor, "__tensor_flatten__"):  # a wrapper (DTensor)
            names, _ = tensor.__tensor_flatten__()
            inner = (getattr(tensor, name) for name in names)
            pending.extend(value for value in inner if isinstance(value, torch.Tensor))
            continue
        try:
            storage = tensor.untyped_storage()
        except (RuntimeError, NotImplementedError):  # a tensor without storage (meta, sparse)
            continue
        if storage.data_ptr():
            found[(str(tensor.device), storage.data_ptr())] = storage.nbytes()
    return found


def _reachable(root: Any) -> tuple[list[torch.Tensor], list[torch.optim.Optimizer]]:
    """Every tensor reachable from `root` through containers and object attributes (not through
    modules, classes or functions), and the torch optimizers met on the way."""
    tensors: list[torch.Tensor] = []
    optimizers: list[torch.optim.Optimizer] = []
    seen, pending = set(), [root]
    while pending and len(seen) < _MOST_OBJECTS:
        obj = pending.pop()
        if isinstance(obj, _OPAQUE) or id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            tensors.append(obj)
            continue
        if isinstance(obj, torch.optim.Optimizer):
            optimizers.append(obj)
        if isinstance(obj, dict):
            pending.extend(obj.keys())
            pending.extend(obj.values())
        elif isinstance(obj, (list, tuple, set, frozenset)):
            pending.extend(obj)
        if hasattr(obj, "__dict__"):
            pending.extend(vars(obj).values())
    return tensors, optimizers


def memory_section(
    peak_bytes_per_rank: list[float],
    source: str,
    whole_process: bool,
    model_state_per_rank: Optional[dict[str, list[float]]] = None,
) -> dict[str, Any]:
    """The record's `memory` section from every rank's peak and model state (gathered by
    harness.training.timing; a model state below 0 was not counted on that rank)."""
    measured = "resident-set peak" if source == RSS_PEAK else "allocator's peak"
    scope = (
        f"the process's {measured} since it started (the kernel refused to reset it)"
        if whole_process
        else f"the {measured} over the timed window (reset as it opened)"
    )
    section: dict[str, Any] = {
        "peak_bytes_per_rank": [int(value) for value in peak_bytes_per_rank],
        "source": source,
        "scope": scope,
        "model_state_bytes_per_rank": None,
    }
    if model_state_per_rank and all(value >= 0 for values in model_state_per_rank.values() for value in values):
        parts = {part: [int(value) for value in values] for part, values in model_state_per_rank.items()}
        section["model_state_bytes_per_rank"] = {**parts, "total": [sum(column) for column in zip(*parts.values())]}
        section["model_state_scope"] = (
            "live tensors when a warm-up step's gradients were averaged: weights "
            "(or this rank's shard), the parameters' gradients, the optimizer's state, "
            "and the framework's other tensors (copies, flat buffers, gradient "
            "partitions, buckets), each storage once"
        )
    return section


class SavedActivations:
    """Counts the bytes autograd saves for backward while open (torch.autograd.graph.saved_tensors_hooks):
    the activations a forward keeps, each storage once, the model's own parameters and buffers left
    out (they are its weights). Under autocast its half-precision copies of the weights are in."""

    def __init__(self, model: nn.Module) -> None:
        self._own = {_storage_key(tensor) for tensor in [*model.parameters(), *model.buffers()]}
        self._seen: set = set()
        self.bytes = 0
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda tensor: tensor)

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        key = _storage_key(tensor)
        if key is not None and key not in self._own and key not in self._seen:
            self._seen.add(key)
            self.bytes += tensor.untyped_storage().nbytes()
        return tensor

    def __enter__(self) -> SavedActivations:
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._hooks.__exit__(*exc)


def _storage_key(tensor: torch.Tensor) -> Optional[tuple[str, int]]:
    try:
        storage = tensor.untyped_storage()
    except (RuntimeError, NotImplementedError):  # no storage (a wrapper subclass)
        return None
    # A shapes-only tensor's storage (meta, or a FakeTensor: harness.study.prediction.memory's probe) has no
    # address; its storage object's own (_cdata) tells storages apart, and none is freed while
    # autograd holds what it saved.
    shapes_only = tensor.is_meta or is_fake(tensor)
    pointer = storage._cdata if shapes_only else storage.data_ptr()
    return (str(tensor.device), pointer) if pointer else None


def run_prediction(
    plan: RunPlan,
    model: nn.Module,
    shape: ModelShape,
    activation_bytes: int,
    backend: Optional[tuple[str, dict[str, Any]]] = None,
) -> Optional[MemoryPrediction]:
    """This run's memory per rank as harness.backends.memory predicts it, from what is known at its
    start: the plain model (before any backend wraps it) and its `shape`, the backend and its
    options, precision, optimizer, micro-batch and world size, and `activation_bytes`
    (SavedActivations over the probe's forward of this rank's first micro-batch); or, given
    `backend` (a name and options), of the same run under that backend. None for a backend
    harness.backends.memory has no rule for (one registered outside the kit)."""
    config = plan.config
    name, options = backend or (config.backend, config.backend_options)
    if not has_memory_rule(name):
        return None
    trainable = [p for p in model.parameters() if p.requires_grad]
    frozen = sum(p.nbytes for p in model.parameters() if not p.requires_grad)
    training = Training(
        precision=config.precision,
        optimizer=config.optimizer,
        momentum=config.momentum,
        micro_batch=plan.micro_batch,
        eval_batch=plan.eval_batch,
        world_size=plan.placement.cluster.world_size,
        parameter_tensors=len(trainable),
        buffer_bytes=frozen + sum(buffer.nbytes for buffer in model.buffers()),
        device=plan.placement.device.type,
    )
    measured = Activations(
        0.0,
        activation_bytes,
        f"tensors saved for backward by one forward of {plan.micro_batch} samples, measured at start",
    )
    prediction = predict_memory(shape, name, options, training, measured)
    if plan.loaded.task.build_optimizer is not None:
        own = f"the task builds its own optimizer: its state assumed as --optimizer {config.optimizer}'s"
        prediction = replace(prediction, assumptions=(*prediction.assumptions, own))
    return prediction


def predicted_section(prediction: MemoryPrediction, measured: dict[str, Any]) -> dict[str, Any]:
    """The record's memory.predicted: the prediction's parts and totals, and per rank its error
    (predicted / measured - 1) on the peak and, where counted, on the model state."""
    states = (measured.get("model_state_bytes_per_rank") or {}).get("total")
    return {
        **prediction.as_dict(),
        "peak_error_per_rank": [_error(prediction.total(), peak) for peak in measured["peak_bytes_per_rank"]],
        "model_state_error_per_rank": [_error(prediction.model_state(), state) for state in states]
        if states
        else None,
    }


def _error(predicted: float, measured: float) -> Optional[float]:
    return predicted / measured - 1 if measured > 0 else None
