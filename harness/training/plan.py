"""What a run will do, fixed before it starts (`plan_run`): its task and data, batches, steps per
epoch, the LR at every step, the model's factory and its checkpoint layout; the loop
(harness.training.loop) follows it."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import nn

from ..backends.precision import Precision
from ..backends.traffic import ModelShape
from ..config import OptimizerSection, TrainConfig
from ..data.batches import Batch, batch_to, map_tensors
from ..data.indexed import IndexedData, as_indexed
from ..data.sharding import steps_per_epoch, train_batches
from ..errors import UsageError
from ..tasks.loading import LoadedTask, TaskLike, load_task
from ..tasks.task import BatchContext
from .checkpoint import RunLayout
from .evaluate import Evaluation, make_evaluation
from .lr import learning_rate, scaled_lr
from .placement import Placement
from .probe import check_parameters, probe_training

HISTORY_POINTS = 1000  # the default --log-every keeps at most this many loss points per run


@dataclass
class RunPlan:
    """The facts of one run, fixed before it trains."""

    config: TrainConfig
    placement: Placement
    precision: Precision
    loaded: LoadedTask  # the task, and where it came from (the record's `task`)
    train_set: IndexedData
    test_set: Optional[IndexedData]  # None: the task has no test data, and the run is not evaluated
    local_batch: int  # samples per rank per optimizer step (all micro-batches)
    epoch_steps: int
    total_steps: int
    base_batch: int
    peak_lr: float
    warmup_steps: int
    log_every: int

    @property
    def global_batch(self) -> int:
        return self.local_batch * self.placement.cluster.world_size

    @property
    def micro_batch(self) -> int:
        return self.local_batch // self.config.grad_accum

    @property
    def eval_batch(self) -> int:
        """Samples per rank in each evaluation forward: --eval-batch-size, or the micro-batch."""
        return self.config.eval_batch_size or self.micro_batch

    @property
    def num_epochs(self) -> int:
        return math.ceil(self.total_steps / self.epoch_steps)

    def lr_at(self, step: int) -> float:
        """The LR of 0-based optimizer step `step` (a pure function of the step, for every backend)."""
        return learning_rate(
            step,
            base_lr=self.config.lr,
            peak_lr=self.peak_lr,
            warmup_steps=self.warmup_steps,
            total_steps=self.total_steps,
            schedule=self.config.schedule,
        )

    def layout(self) -> RunLayout:
        return RunLayout(
            self.placement.cluster.world_size,
            self.global_batch,
            len(self.train_set),
            self.epoch_steps,
            self.total_steps,
            {key: self.loaded.origin()[key] for key in ("spec", "args", "sha256")},
        )

    def make_model(self) -> nn.Module:
        """A fresh model of the task, in the run's memory format, on its device: the run's initial
        weights (from --seed) every time, and the run's random state untouched, so that building
        one in the middle of training (a calibration's) changes no later dropout mask."""
        model = seeded_model(self.loaded, self.config.seed, self.placement.device)
        return model.to(memory_format=torch.channels_last) if self.channels_last_weights else model

    def prepare(self, batch: Batch, epoch: int = 0, step: int = 0, training: bool = True) -> Batch:
        """A batch on the device as the model takes it: the task's prepare_batch (normalisation,
        augmentation), then 4-D floating inputs in channels-last order under --channels-last."""
        cluster = self.placement.cluster
        prepare_batch = self.loaded.task.prepare_batch
        if prepare_batch is not None:
            context = BatchContext(
                self.placement.device,
                training,
                epoch,
                step,
                cluster.rank,
                cluster.world_size,
                self.local_batch,
                self.config.seed,
            )
            batch = prepare_batch(batch, context)
        if self.config.channels_last:
            batch = map_tensors(batch, _channels_last)
        return batch

    def fetch(self, data: IndexedData, indices: Any) -> Batch:
        """`data`'s batch of `indices`, on the run's device (outside the loader: probes, calibration)."""
        return batch_to(data.fetch(indices), self.placement.device)

    def tried(self, model: nn.Module, first_step: int) -> tuple[list[str], Optional[Evaluation]]:
        """The task tried on this rank's first micro-batch from `first_step` and a few test samples
        (harness.training.probe), before any process group starts: the parameters the loss did not
        reach (a backend that cannot train such a model refuses here), and the run's evaluation."""
        cluster, device = self.placement.cluster, self.placement.device
        epoch, within = divmod(first_step, self.epoch_steps)
        indices = train_batches(
            len(self.train_set), cluster.world_size, cluster.rank, self.local_batch, self.config.seed, epoch
        )[within][: self.micro_batch]
        unused = probe_training(
            self.loaded,
            model,
            self.train_set.fetch(indices),
            len(indices),
            lambda batch: self.prepare(batch_to(batch, device), epoch, first_step),
            lambda: self.precision.autocast(device),
            self.where,
        )
        try:
            self.placement.backend.check_unused_parameters(unused)
        except UsageError as exc:
            raise UsageError(f"{self.loaded.label}{self.where}: {exc}") from None
        evaluation = make_evaluation(
            self.loaded,
            self.test_set,
            model,
            lambda batch: self.prepare(batch, training=False),
            self.eval_batch,
            self.precision,
            self.where,
        )
        return unused, evaluation

    @property
    def where(self) -> str:
        """ " (rank 3)" in a message that only one rank may see, "" for a one-process run."""
        cluster = self.placement.cluster
        return f" (rank {cluster.rank})" if cluster.world_size > 1 else ""

    def timing_warmup(self, start_step: int) -> int:
        """Steps of the segment from `start_step` left out of the timed window: --timing-warmup-steps,
        at most half the segment, and under --compile at least the first step, which compiles."""
        warmup = min(self.config.timing_warmup_steps, (self.total_steps - start_step) // 2)
        return max(warmup, 1) if self.config.compile else warmup

    @property
    def channels_last_weights(self) -> bool:
        """--channels-last also reorders the weights (else only the inputs): see Backend.channels_last_weights."""
        return self.config.channels_last and self.placement.backend.channels_last_weights


def seeded_model(loaded: LoadedTask, seed: int, device: torch.device = torch.device("cpu")) -> nn.Module:
    """The task's model as a run with `seed` builds it, on `device`; torch's random state (the
    device's too) left as it was."""
    with torch.random.fork_rng(devices=[device.index or 0] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        model = loaded.task.build_model()
    check_parameters(model, loaded.label)
    return model.to(device)


def initial_model(config: TrainConfig, task: Optional[TaskLike] = None) -> nn.Module:
    """The model `harness.train(config, task=task)` starts from, on the CPU: what its --seed and task
    decide, identical on every rank and backend."""
    return seeded_model(load_task(config.task if task is None else task, config.task_args), config.seed)


def model_shape(model: nn.Module) -> ModelShape:
    """What a traffic pattern needs of a model (harness.backends.traffic.ModelShape): the bytes of its
    trainable parameters in all, per top-level child (FSDP's units, the root's own parameters as one
    more) and per module that holds parameters itself (ZeRO-3 gathers per such module), in forward order."""

    def own(module: nn.Module, recurse: bool) -> int:
        return sum(p.numel() * p.element_size() for p in module.parameters(recurse=recurse) if p.requires_grad)

    units = [own(child, True) for child in model.children()] + [own(model, False)]
    modules = [own(module, False) for module in model.modules()]
    return ModelShape(own(model, True), tuple(b for b in units if b), tuple(b for b in modules if b))


def shape_record(model: nn.Module) -> dict[str, Any]:
    """A model's parameters and their shape as the record's `task` holds them."""
    shape = model_shape(model)
    return {
        "model_class": type(model).__name__,
        "parameters": sum(p.numel() for p in model.parameters() if p.requires_grad),
        "parameter_bytes": shape.parameter_bytes,
        "unit_bytes": list(shape.unit_bytes),
        "module_bytes": list(shape.module_bytes),
    }


def _channels_last(tensor: torch.Tensor) -> torch.Tensor:
    if tensor.dim() == 4 and tensor.is_floating_point():
        return tensor.contiguous(memory_format=torch.channels_last)
    return tensor


def plan_run(config: TrainConfig, placement: Placement, task: Optional[TaskLike] = None) -> RunPlan:
    """Load the task (its data prepared once per filesystem, before any process group exists) and
    fix batches, steps and the LR rule. `task` (a Task, a factory or a spec) replaces config.task."""
    loaded = load_task(config.task if task is None else task, config.task_args)
    label = loaded.label
    train_set = as_indexed(loaded.task.train_data, f"{label} train_data")
    test_set = None if loaded.task.test_data is None else as_indexed(loaded.task.test_data, f"{label} test_data")
    world_size = placement.cluster.world_size
    local_batch = config.local_batch(world_size)
    if test_set is not None and len(test_set) == 0:
        raise UsageError(f"{label}: test_data is empty; give it samples, or None to train without evaluation")
    epoch_steps = steps_per_epoch(len(train_set), world_size, local_batch)
    if epoch_steps == 0:
        raise UsageError(
            f"{label}: the training set has {len(train_set)} samples, fewer than one global batch of "
            f"{local_batch * world_size}; lower --batch-size or use fewer workers"
            + ("" if len(train_set) else " (train_data is empty: give it samples)")
        )
    total_steps = epoch_steps * config.epochs
    if config.max_steps is not None:
        total_steps = min(total_steps, config.max_steps)
    # LR scaling: the ranks average their gradients over the global batch, so N ranks take one step
    # where one process with the base batch (what --lr was tuned for) takes N; --lr-scaling raises
    # the LR by that ratio (linear) or its root, reached after --warmup-epochs (harness.training.lr).
    base_batch = config.base_batch or (config.global_batch or config.batch_size * config.grad_accum)
    return RunPlan(
        config,
        placement,
        Precision.of(config.precision),
        loaded,
        train_set,
        test_set,
        local_batch,
        epoch_steps,
        total_steps,
        base_batch,
        peak_lr=scaled_lr(config.lr, local_batch * world_size, base_batch, config.lr_scaling),
        warmup_steps=round(config.warmup_epochs * epoch_steps),
        log_every=config.log_every or max(1, math.ceil(total_steps / HISTORY_POINTS)),
    )


def optimizer_factory(settings: OptimizerSection, task_factory: Any = None) -> Any:
    """The task's optimizer factory, else the one `settings` names: for the backend to build over
    the parameters it owns (the LR rule sets every group's lr at every step either way)."""
    if task_factory is not None:
        return task_factory

    def make(parameters):
        if settings.optimizer == "adam":
            return torch.optim.Adam(parameters, lr=settings.lr, weight_decay=settings.weight_decay)
        return torch.optim.SGD(
            parameters, lr=settings.lr, momentum=settings.momentum, weight_decay=settings.weight_decay
        )

    return make
