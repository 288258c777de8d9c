"""Memory per rank, predicted before a run: what each backend keeps on a rank's device for a model of
a given shape (harness.backends.traffic.ModelShape), as named parts in bytes, with every assumption
written out beside them. A pure function of its inputs (no tensor is made): `harness predict` prints
it per backend for a site's GPUs, and every run records it beside the measured peak (the record's
`memory.predicted`, made at run start by harness.training.memory).

It predicts what the kit configures, not a textbook ZeRO or FSDP:
- every precision keeps float32 weights, gradients and optimizer state: bf16 and fp16 are torch.autocast
  around forward and loss (harness.backends.precision); DeepSpeed's own fp16/bf16 modes are off, FSDP's
  param_dtype is float32. Precision changes the activations only (and autocast's half-precision copy
  of the weights each forward uses, which the measured activations hold);
- DDP: gradient_as_bucket_view=True, so its buckets are the gradients (no second copy);
- Horovod: one fusion buffer of its threshold (HOROVOD_FUSION_THRESHOLD, 128 MiB unless set) once
  ranks have peers;
- DeepSpeed: reduce_bucket_size and allgather_bucket_size 5e8 elements unless --zero-bucket-mb, a
  reduce bucket ZeRO-1/2 allocate whole (contiguous_gradients) for each backward and ZeRO-3 keeps;
  ZeRO-1..3 keep a float32 copy of this rank's slice and its gradients, ZeRO-1/2 also a copy of the
  gradient of a parameter the slice's boundary cuts (as the record's model state counts them at 2
  ranks of the workshop CNN and of ResNet-18); ZeRO-3 keeps parameters of at most 1e5 elements whole on every rank
  (stage3_param_persistence_threshold) and, below stage3_max_live_parameters (1e9 elements), the
  gathered weights from forward to backward;
- FSDP2: one unit per top-level child and the root; gathered units float32 (param_dtype), resharded
  after forward unless --fsdp-keep-gathered (the root's own parameters, which FSDP2 keeps gathered,
  are left out: ModelShape does not tell them apart);
- the optimizer step's own temporaries, made after forward and backward have freed theirs: the
  peak (MemoryPrediction.total) is what is kept plus the larger of the two phases. torch's Adam makes
  two copies of each tensor it steps on the CPU, one of all of them at once on GPUs; ZeRO steps one
  flat slice (ZeRO-3: a sub-group of it at a time), first copying its gradients into one tensor.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable, Union

from ..errors import UsageError
from ..options import BaseOptions
from . import backend_class
from .deepspeed import (
    FLOAT32_BYTES,
    zero_bucket_elements,
    zero_gathered_elements,
    zero_gathered_modules,
    zero_sub_group_elements,
)
from .horovod import HOROVOD_DEFAULT_FUSION_MB
from .traffic import ModelShape

KINDS = ("state", "activations", "buffers")  # a part's kind: params+grads+optimizer, activations, framework
MIB = 2**20
GIB = 2**30
STEP_COUNT_BYTES = 4  # Adam's `step`: one float32 scalar per tensor it steps
PHASES = ("forward and backward", "optimizer step")  # when a part not kept between steps exists
FOREACH_DEVICES = ("cuda", "xpu")  # where torch's optimizers default to their foreach path


@dataclass(frozen=True)
class Activations:
    """What autograd keeps from a forward for its backward: `fixed` bytes (autocast's copies of the
    weights) plus `per_sample` bytes per sample of the micro-batch."""

    per_sample: float
    fixed: float = 0.0
    source: str = "not measured"

    def at(self, samples: int) -> int:
        return max(0, round(self.fixed + self.per_sample * samples))


@dataclass(frozen=True)
class Training:
    """What the run trains with, besides the model and the backend."""

    precision: str = "fp32"
    optimizer: str = "sgd"  # sgd or adam (a task's own optimizer: assumed as this one)
    momentum: float = 0.9
    micro_batch: int = 1  # samples per forward (the local batch over --grad-accum)
    eval_batch: int = 0  # samples per evaluation forward (0: the micro-batch)
    world_size: int = 1
    parameter_tensors: int = 0  # the model's trainable tensors (Adam keeps a step count for each)
    buffer_bytes: int = 0  # the model's buffers and frozen parameters (batch-norm statistics), never sharded
    device: str = "cpu"  # where the optimizer steps: torch's default steps all tensors at once on GPUs

    def steps_all_at_once(self) -> bool:
        """Whether torch's optimizer takes its foreach path (its default on cuda and xpu tensors),
        else its loop over one tensor at a time (on the CPU)."""
        return self.device in FOREACH_DEVICES


@dataclass(frozen=True)
class Part:
    """One named part of a rank's memory, of one of KINDS."""

    name: str
    bytes: int
    kind: str
    held: bool = True  # kept between steps (what the record's model_state_bytes counts), else made per step
    phase: str = PHASES[0]  # for a part made per step: when it exists


@dataclass(frozen=True)
class MemoryPrediction:
    """A rank's predicted memory: its parts and the assumptions behind them."""

    backend: str  # the backend and its options, e.g. "deepspeed zero_stage=3"
    parts: tuple[Part, ...]
    assumptions: tuple[str, ...] = ()

    def total(self, kind: str = "") -> int:
        """The peak: the parts kept between steps, plus those of the phase (PHASES) that makes the most
        (the activations and buffers of forward and backward are freed before the optimizer step
        makes its own); or, given `kind`, the bytes of every part of that kind."""
        if kind:
            return sum(part.bytes for part in self.parts if part.kind == kind)
        made = [sum(part.bytes for part in self.parts if not part.held and part.phase == phase) for phase in PHASES]
        return sum(part.bytes for part in self.parts if part.held) + max(made)

    def model_state(self) -> int:
        """The parts kept between steps other than activations: what the record's
        memory.model_state_bytes_per_rank counts of the live tensors."""
        return sum(part.bytes for part in self.parts if part.held and part.kind != "activations")

    def as_dict(self) -> dict[str, Any]:
        """As the record and `harness predict --json` hold it."""
        return {
            "backend": self.backend,
            "parts": {part.name: part.bytes for part in self.parts},
            "kinds": {part.name: part.kind for part in self.parts},
            "phases": {part.name: part.phase for part in self.parts if not part.held},
            **{f"{kind}_bytes": self.total(kind) for kind in KINDS},
            "total_bytes": self.total(),
            "model_state_bytes": self.model_state(),
            "assumptions": list(self.assumptions),
        }


@dataclass
class _Parts:
    """The parts one backend's rule adds, and the lines saying why."""

    parts: list[Part] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)

    def add(self, name: str, size: float, kind: str = "state", held: bool = True, phase: str = PHASES[0]) -> None:
        self.parts.append(Part(name, int(math.ceil(size)), kind, held, phase))

    def step_temporaries(self, training: Training, stepped: float, largest: float, flattened: float = 0.0) -> None:
        """What the optimizer step makes and frees: torch's Adam divides the square root of its second
        moment, a new tensor the size of those it steps (on the CPU, one tensor at a time, two
        tensors of the `largest` at once; on GPUs all `stepped` bytes at once); SGD steps in place.
        ZeRO first copies the gradients of the slice it steps into one `flattened` tensor."""
        adam = 0.0
        if training.optimizer == "adam":
            adam = stepped if training.steps_all_at_once() else 2 * largest
        if adam + flattened:
            self.add("optimizer step temporaries", adam + flattened, "buffers", held=False, phase=PHASES[1])


def optimizer_copies(training: Training) -> int:
    """float32 values the optimizer keeps per weight: Adam's two moments, SGD's momentum (none without)."""
    if training.optimizer == "adam":
        return 2
    return 1 if training.momentum > 0 else 0


def _replicated(shape: ModelShape, training: Training, into: _Parts) -> None:
    """Weights, gradients and optimizer state whole on every rank (DDP, Horovod, ZeRO-0, one process)."""
    weights = shape.parameter_bytes
    into.add("weights", weights + training.buffer_bytes)
    into.add("gradients", weights)
    into.add("optimizer", _optimizer_bytes(weights, training, training.parameter_tensors))
    into.step_temporaries(training, weights, max(shape.modules()))


def _optimizer_bytes(weights: float, training: Training, stepped_tensors: int) -> float:
    steps = stepped_tensors * STEP_COUNT_BYTES if training.optimizer == "adam" else 0
    return optimizer_copies(training) * weights + steps


def _single(shape: ModelShape, options: BaseOptions, training: Training, into: _Parts) -> None:
    _replicated(shape, training, into)


def _ddp(shape: ModelShape, options: BaseOptions, training: Training, into: _Parts) -> None:
    _replicated(shape, training, into)
    into.lines.append(
        f"ddp: gradient_as_bucket_view=True (the kit sets it): the {options.bucket_cap_mb:g} MiB buckets "
        "(bucket_cap_mb) hold the gradients themselves, no copy"
    )


def _horovod(shape: ModelShape, options: BaseOptions, training: Training, into: _Parts) -> None:
    _replicated(shape, training, into)
    fusion_mb = options.fusion_threshold_mb or HOROVOD_DEFAULT_FUSION_MB
    if training.world_size > 1:
        # Horovod's own allocation, out of Python's reach: not in the record's model_state_bytes
        into.add("fusion buffer", fusion_mb * MIB, "buffers", held=False)
    into.lines.append(
        f"horovod: one fusion buffer of {fusion_mb:g} MiB (--hvd-fusion-threshold-mb, else "
        "$HOROVOD_FUSION_THRESHOLD, else Horovod's 128) once ranks have peers; fp16 compression's "
        "half-size copies of gradients are left out"
    )


def _deepspeed(shape: ModelShape, options: BaseOptions, training: Training, into: _Parts) -> None:
    stage, ranks, weights = options.zero_stage, training.world_size, shape.parameter_bytes
    bucket = zero_bucket_elements(options) * FLOAT32_BYTES
    slice_bytes = _padded(weights, ranks) / ranks
    into.lines.append(
        f"deepspeed: reduce and all-gather buckets of {bucket / MIB:,.0f} MiB (--zero-bucket-mb, else "
        "DeepSpeed's 5e8 elements); torch_autocast for bf16/fp16, so every part stays float32"
    )
    if stage == 0:
        _replicated(shape, training, into)
        if ranks > 1:  # buffered_allreduce_fallback flattens the gradients into buckets for the allreduce
            into.add("flattened gradients", min(weights, bucket), "buffers", held=False)
        return
    if stage in (1, 2):
        into.add("weights", _padded(weights, ranks) + training.buffer_bytes)
        into.add("float32 slice", slice_bytes)
        cuts = min(ranks - 1, 2)  # slice boundaries a rank's slice has: a parameter cut there is copied
        into.add("gradient slices", slice_bytes + cuts * min(slice_bytes, max(shape.modules())))
        into.add("optimizer", _optimizer_bytes(slice_bytes, training, 1))
        into.add("reduce bucket", bucket, "buffers", held=False)  # contiguous_gradients: torch.empty, each backward
        into.step_temporaries(training, slice_bytes, slice_bytes, flattened=slice_bytes)
        into.lines.append(
            f"zero-{stage}: whole weights, a float32 copy of this rank's slice, the slice's gradients and a "
            "copy of the gradient of each parameter a slice boundary cuts (told as the largest module), "
            "the optimizer's state over the slice; its step copies the slice's gradients into one tensor"
        )
        return
    persistent = sum(shape.modules()) - sum(zero_gathered_modules(shape))
    into.add("weights", slice_bytes + persistent + training.buffer_bytes)
    into.add("float32 slice", slice_bytes)
    into.add("gradient slice", slice_bytes)
    into.add("optimizer", _optimizer_bytes(slice_bytes, training, 1))
    into.add("reduce bucket", bucket, "buffers")
    gathered = zero_gathered_modules(shape)
    limit = zero_gathered_elements(options) * FLOAT32_BYTES
    # Every gathered weight stays from its forward to its backward up to the limit; beyond it, the
    # limit's worth stays (kept, or prefetched) besides the module at work, gathered whole whatever its size.
    kept = min(sum(gathered), limit + max(gathered, default=0))
    into.add("gathered weights", kept, "buffers", held=False)
    group = min(slice_bytes, zero_sub_group_elements(options) * FLOAT32_BYTES)
    into.step_temporaries(training, group, group, flattened=group)
    into.lines.append(
        "zero-3: this rank's slice of every weight, and whole the modules of at most 1e5 elements "
        "(stage3_param_persistence_threshold, told per module); gathered weights kept from forward to "
        f"backward up to {limit / MIB:,.0f} MiB, besides the module at work (--zero-gathered-mb, else "
        "stage3_max_live_parameters' 1e9 elements); the step goes over the slice in "
        f"sub-groups of {group / MIB:,.0f} MiB (--zero-sub-group-mb, else DeepSpeed's 1e9 elements), "
        "copying each one's gradients into one tensor"
    )


def _fsdp(shape: ModelShape, options: BaseOptions, training: Training, into: _Parts) -> None:
    ranks, weights = training.world_size, shape.parameter_bytes
    shard = _padded(weights, ranks) / ranks
    into.add("weights", shard + training.buffer_bytes)
    into.add("gradients", shard)
    into.add("optimizer", _optimizer_bytes(shard, training, training.parameter_tensors))
    largest = max(shape.units())
    if options.reshard_after_forward:
        gathered = min(weights, 2 * largest)  # the unit at work and the next one, prefetched
        how = "the largest unit twice (the one at work, the next prefetched)"
    else:
        gathered, how = weights, "every unit from its forward to its backward (--fsdp-keep-gathered)"
    if ranks > 1:
        into.add("gathered units", gathered, "buffers", held=False)
        into.add("unsharded gradients", largest, "buffers", held=False)
    into.step_temporaries(training, shard, _padded(max(shape.modules()), ranks) / ranks)
    into.lines.append(
        f"fsdp: float32 shards of weights, gradients and optimizer state; gathered: {how}; "
        "one unit's unsharded gradients for its reduce-scatter"
    )


def _padded(size: int, ranks: int) -> int:
    """`size` bytes of float32 padded to split evenly over `ranks` (FSDP and ZeRO pad each flat shard)."""
    elements = size // FLOAT32_BYTES
    return math.ceil(elements / ranks) * ranks * FLOAT32_BYTES


RULES: dict[str, Callable[[ModelShape, BaseOptions, Training, _Parts], None]] = {
    "none": _single,
    "ddp": _ddp,
    "horovod": _horovod,
    "deepspeed": _deepspeed,
    "fsdp": _fsdp,
}


def backend_label(name: str, options: BaseOptions) -> str:
    """e.g. 'deepspeed zero_stage=3' or 'fsdp keep_gathered=True': the options other than the defaults."""
    defaults = type(options)()
    changed = [
        f"{key}={getattr(options, key)}"
        for key in options.__dataclass_fields__
        if getattr(options, key) != getattr(defaults, key)
    ]
    return " ".join([name, *changed])


def has_memory_rule(backend: str) -> bool:
    """Whether `predict_memory` knows what `backend` keeps (every backend the kit ships)."""
    return backend in RULES


def predict_memory(
    shape: ModelShape,
    backend: str,
    options: Union[BaseOptions, Mapping[str, Any], None],
    training: Training,
    activations: Activations,
) -> MemoryPrediction:
    """One rank's memory under backend `backend` with `options` (its Options or their values by field
    name) on a model of `shape`, training as `training` says, with `activations` per micro-batch."""
    if not has_memory_rule(backend):
        raise UsageError(f"no memory rule for backend {backend!r}; add one to harness.backends.memory.RULES")
    cls = backend_class(backend)
    parsed = options if isinstance(options, BaseOptions) else cls.parse_options(options or {})
    found = _Parts()
    RULES[backend](shape, parsed, training, found)
    # An evaluation forward keeps no tensors for a backward, so training's activations at the larger
    # batch bound it too.
    batch = max(training.micro_batch, training.eval_batch)
    found.add("activations", activations.at(batch), "activations", held=False)
    evaluated = f" (evaluation batch {training.eval_batch})" if training.eval_batch > training.micro_batch else ""
    lines = [
        f"{training.world_size} rank(s), micro-batch {training.micro_batch}{evaluated}, {training.optimizer} "
        f"({optimizer_copies(training)} float32 value(s) per weight), {training.precision}: weights, "
        "gradients and optimizer state float32 (autocast casts inside forward)",
        f"activations: {activations.source}",
        *found.lines,
        f"optimizer step: torch's {'foreach' if training.steps_all_at_once() else 'one tensor at a time'} "
        f"path on {training.device}",
        "left out: the gradients of activations during backward, the next batch prefetched to the device, "
        "weight decay's copy of the gradients in the step, "
        "the allocator's fragmentation, the CUDA/ROCm/XPU context; on a CPU, the process itself (torch's "
        "libraries, about 750 MiB of the resident set)",
    ]
    return MemoryPrediction(backend_label(backend, parsed), tuple(found.parts), tuple(lines))
