"""Memory per rank before a study runs: `harness predict` prints, per backend and option set, what a
rank holds (harness.backends.memory) and whether it fits the site's device memory at each node count.

The activations come from the task itself, measured once and cheaply: its model built as a run
builds it, one forward and loss of 2 and of 4 training samples under the run's
precision (autocast on the CPU), counting the tensors autograd saves for backward
(harness.training.memory.SavedActivations); the bytes per sample are the difference, the rest
(autocast's copies of the weights) is fixed, and a micro-batch of B samples holds fixed + B x per
sample. CPU autocast casts the same kinds of ops to bf16/fp16 as CUDA's, but not every one alike: a
GPU run's own record (memory.predicted) holds the activations measured on its device. The probe
runs under FakeTensorMode (tensors with shapes, devices and dtypes but no memory and no arithmetic,
as torch.compile traces): the same kernels are chosen as on the CPU (its flash attention, autocast's
casts), so the same tensors are saved, byte for byte (but for BatchNorm's two saved statistics under
autocast: float32 on the CPU, half in the shape rule, 4 bytes a channel less), while a 1.2B-parameter model takes seconds
instead of minutes and tens of GiB. A task whose forward or loss reads a value (.item()) or uses an
op without a shape rule is probed on the CPU for real instead, and the source says which.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, Optional

from ...backends.memory import GIB, Activations, MemoryPrediction, Training, predict_memory
from ...backends.traffic import ModelShape
from ...config import TrainConfig
from ...errors import UsageError

PROBE_SAMPLES = (2, 4)  # two small batches: the slope is per sample, the intercept fixed


def task_activations(task: str, args: Mapping[str, Any], precision: str) -> Activations:
    """The activations of task `task` with `args` under `precision`, measured at PROBE_SAMPLES."""
    return _measured(task, json.dumps(dict(args), sort_keys=True), precision)


@functools.lru_cache(maxsize=16)
def _measured(task: str, args: str, precision: str) -> Activations:
    from ...data.indexed import as_indexed
    from ...tasks.loading import load_task

    loaded = load_task(task, json.loads(args))
    data = as_indexed(loaded.task.train_data, f"{loaded.label} train_data")
    if len(data) < PROBE_SAMPLES[-1]:
        raise UsageError(f"{loaded.label}: fewer than {PROBE_SAMPLES[-1]} training samples to measure activations on")
    try:
        (few, many), where = _probe(loaded, data, precision, shapes_only=True), "with shapes only (FakeTensor)"
    except Exception:  # an op without a shape rule, a loss that reads a value (.item()): the real forward
        (few, many), where = _probe(loaded, data, precision, shapes_only=False), "on the CPU"
    (small, large) = PROBE_SAMPLES
    per_sample = max(0.0, (many - few) / (large - small))
    return Activations(
        per_sample,
        max(0.0, few - per_sample * small),
        f"measured {where}: one forward of {small} and of {large} samples under {precision}, "
        f"{per_sample / 2**20:.2f} MiB per sample",
    )


def _probe(loaded: Any, data: Any, precision: str, shapes_only: bool) -> list[int]:
    """The bytes autograd saves over one forward and loss of the first PROBE_SAMPLES training samples
    (as the loop's sharding fetches them), on the CPU: its model built as a run builds it, or, with
    `shapes_only`, under FakeTensorMode, where every tensor has a shape and no memory."""
    import contextlib

    import numpy
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from ...backends.precision import Precision
    from ...data.batches import map_tensors
    from ...tasks.task import BatchContext, loss_and_count
    from ...training.memory import SavedActivations
    from ...training.plan import seeded_model

    cpu, saved = torch.device("cpu"), []
    mode = FakeTensorMode(allow_non_fake_inputs=True) if shapes_only else contextlib.nullcontext()
    with torch.random.fork_rng(), mode:
        # Under FakeTensorMode the weights' values do not matter, and moving them (.to) cannot swap fakes.
        model = loaded.task.build_model() if shapes_only else seeded_model(loaded, TrainConfig().seed)
        for samples in PROBE_SAMPLES:
            batch = data.fetch(numpy.arange(samples))
            if shapes_only:
                batch = map_tensors(batch, mode.from_tensor)
            if loaded.task.prepare_batch is not None:
                batch = loaded.task.prepare_batch(batch, BatchContext(cpu, True, local_batch=samples))
            with SavedActivations(model) as counter, Precision.of(precision).autocast(cpu):
                loss_and_count(loaded.task, model, batch, loaded.label)
            saved.append(counter.bytes)
    return saved


def config_memory(config: TrainConfig, world_size: int) -> MemoryPrediction:
    """One rank's memory when `config` trains at `world_size` ranks, predicted before any run: its
    task's model shape and activations (probed as `harness predict` probes them), its backend and
    options, precision, optimizer and micro-batch. UsageError for a backend without a memory rule."""
    from ...process.accelerator import detect_accelerator
    from .shapes import task_shape

    training = Training(
        precision=config.precision,
        optimizer=config.optimizer,
        momentum=config.momentum,
        micro_batch=config.batch_size,
        eval_batch=config.eval_batch_size,
        world_size=world_size,
        device=detect_accelerator().device_type if config.device == "auto" else config.device,
    )
    activations = task_activations(config.task, config.task_args, config.precision)
    return predict_memory(
        task_shape(config.task, config.task_args), config.backend, config.backend_options, training, activations
    )


def backend_cases(backend: Optional[str], options: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """(backend, options) to print: the one named with its options, else every distributed
    backend's option sets that change what a rank holds (Options.examples: ZeRO's stages, FSDP
    kept gathered or not)."""
    from ...backends import BACKENDS, backend_class

    if backend:
        cls = backend_class(backend)
        return [(backend, cls.parse_options(options))]
    return [
        (name, example)
        for name, cls in BACKENDS.items()
        if cls.max_world_size != 1
        for example in cls.Options.examples()
    ]


def device_memory(profile: Any) -> list[tuple[str, int]]:
    """(label, bytes per rank's device) of a site profile's `device_memory`: its nodes' device, and
    each variant of it (Perlmutter's 80 GB nodes)."""
    facts: Mapping[str, Any] = getattr(profile, "device_memory", None) or {}
    if not facts:
        return []
    found = [(f"{facts['gib']:g} GiB {facts.get('device', 'device')}", int(facts["gib"] * GIB))]
    return found + [(label, int(gib * GIB)) for label, gib in facts.get("variants", {}).items()]


def memory_rows(
    shape: ModelShape,
    cases: Sequence[tuple[str, Any]],
    training: Training,
    activations: Activations,
    world_sizes: Sequence[int],
) -> list[tuple[MemoryPrediction, list[MemoryPrediction]]]:
    """Per case: its prediction at the first world size, and one per world size."""
    rows = []
    for name, options in cases:
        per_size = [predict_memory(shape, name, options, _at(training, size), activations) for size in world_sizes]
        rows.append((per_size[0], per_size))
    return rows


def _at(training: Training, world_size: int) -> Training:
    return replace(training, world_size=world_size)


def memory_table(
    rows: Sequence[tuple[MemoryPrediction, list[MemoryPrediction]]],
    nodes: Sequence[int],
    devices: Sequence[tuple[str, int]],
) -> str:
    """Markdown: per backend its parts at the fewest nodes, and at which node counts it fits each device."""
    from ..scaling.report import markdown_table

    columns = [
        ("backend", lambda r: r[0].backend),
        ("params+grads+optimizer GiB", lambda r: r[0].total("state") / GIB),
        ("activations GiB", lambda r: r[0].total("activations") / GIB),
        ("buffers GiB", lambda r: r[0].total("buffers") / GIB),
        (f"total per rank GiB ({nodes[0]} node{'s' if nodes[0] > 1 else ''})", lambda r: r[0].total() / GIB),
    ]
    for label, capacity in devices:
        columns.append((f"fits {label}", lambda r, capacity=capacity: fitting(r[1], nodes, capacity)))
    return markdown_table(list(rows), columns)


def fitting(per_size: Sequence[MemoryPrediction], nodes: Sequence[int], capacity: int) -> str:
    """Where a rank's total fits `capacity`: 'fits' at every node count, 'does not fit' at none,
    else the node counts where it fits."""
    fits = [count for prediction, count in zip(per_size, nodes) if prediction.total() <= capacity]
    if len(fits) == len(nodes):
        return "fits"
    if not fits:
        return "does not fit"
    if fits == list(nodes[len(nodes) - len(fits) :]):
        return f"fits from {fits[0]} nodes"
    return "fits at " + ",".join(map(str, fits)) + " nodes"


def memory_report(
    task: str,
    task_args: Mapping[str, Any],
    training: Training,
    backend: Optional[str],
    options: Mapping[str, Any],
    nodes: Sequence[int],
    ranks_per_node: int,
    site: Optional[str],
) -> tuple[list[str], list[dict[str, Any]]]:
    """`harness predict`'s memory section: its lines (a heading, the assumptions, and the table per
    backend at `nodes` x `ranks_per_node` ranks against the device memory of `site`'s profile) and
    its rows for --json (one per backend and node count: the parts, and whether each device fits)."""
    from ..sites import load_site
    from .shapes import task_shape

    shape = task_shape(task, task_args)
    activations = task_activations(task, task_args, training.precision)
    rows = memory_rows(
        shape, backend_cases(backend, options), training, activations, [n * ranks_per_node for n in nodes]
    )
    devices = device_memory(load_site(site)) if site else []
    source = load_site(site).device_memory.get("source", "") if devices else ""
    lines = [row for prediction, _ in rows for row in prediction.assumptions[2:-1]]  # each backend's own rule
    heading = f"memory per rank ({nodes[0]} to {nodes[-1]} nodes of {ranks_per_node} ranks):"
    document = [
        {
            **prediction.as_dict(),
            "nodes": count,
            "ranks": count * ranks_per_node,
            "fits": {label: prediction.total() <= capacity for label, capacity in devices},
        }
        for _, per_size in rows
        for prediction, count in zip(per_size, nodes)
    ]
    return [
        heading,
        *(f"  - {line}" for line in [*rows[0][0].assumptions[:2], *dict.fromkeys(lines), rows[0][0].assumptions[-1]]),
        f"  - device memory: {source}" if source else "  - device memory unknown: give --site for the fits columns",
        "",
        memory_table(rows, nodes, devices),
    ], document
