"""What a run will do, fixed before it starts (`plan_run`): its data, batches, steps per epoch, the LR at
every step, the model's factory and its checkpoint layout; the loop (harness.training.loop) follows it."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from ..backends.precision import Precision
from ..config import TrainConfig
from ..data import DataOptions, ImageArrays, load_split
from ..data.sharding import steps_per_epoch
from ..data.transforms import TrainTransform, train_transform
from ..errors import UsageError
from .checkpoint import RunLayout
from .lr import learning_rate, scaled_lr
from .models import build_model
from .placement import Placement

HISTORY_POINTS = 1000  # the default --log-every keeps at most this many loss points per run


@dataclass
class RunPlan:
    """The facts of one run, fixed before it trains."""

    config: TrainConfig
    placement: Placement
    precision: Precision
    train_set: ImageArrays
    test_set: ImageArrays
    local_batch: int  # samples per rank per optimizer step (all micro-batches)
    epoch_steps: int
    total_steps: int
    base_batch: int
    peak_lr: float
    warmup_steps: int
    log_every: int
    transform: TrainTransform  # augmentation (optional) and normalisation of a batch on the device

    @property
    def global_batch(self) -> int:
        return self.local_batch * self.placement.cluster.world_size

    @property
    def micro_batch(self) -> int:
        return self.local_batch // self.config.grad_accum

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
        )

    def make_model(self) -> nn.Module:
        """A fresh model of the run's architecture, in its memory format, on its device: the run's
        initial weights (from --seed) every time, and the run's random state untouched, so that
        building one for evaluation in the middle of training changes no later dropout mask."""
        channels, size, _ = self.train_set.shape
        model = build_model(
            self.config.model, channels, size, self.train_set.num_classes, self.config.dropout, seed=self.config.seed
        )
        model = model.to(self.placement.device)
        return model.to(memory_format=torch.channels_last) if self.channels_last_weights else model

    def timing_warmup(self, start_step: int) -> int:
        """Steps of the segment from `start_step` left out of the timed window: --timing-warmup-steps,
        at most half the segment, and under --compile at least the first step, which compiles."""
        warmup = min(self.config.timing_warmup_steps, (self.total_steps - start_step) // 2)
        return max(warmup, 1) if self.config.compile else warmup

    @property
    def channels_last_weights(self) -> bool:
        """--channels-last also reorders the weights (else only the images): see Backend.channels_last_weights."""
        return self.config.channels_last and self.placement.backend.channels_last_weights


def plan_run(config: TrainConfig, placement: Placement) -> RunPlan:
    """Load the data (preparing it once per filesystem, before any process group exists) and fix
    batches, steps and the LR rule."""
    world_size = placement.cluster.world_size
    local_batch = config.local_batch(world_size)
    options = DataOptions(config.data_dir, config.model, config.image_size, config.timeout)
    train_set, test_set = load_split(config.dataset, "train", options), load_split(config.dataset, "test", options)
    epoch_steps = steps_per_epoch(len(train_set), world_size, local_batch)
    if epoch_steps == 0:
        raise UsageError(
            f"the training set has {len(train_set)} samples, fewer than one global batch of "
            f"{local_batch * world_size}; lower --batch-size or use fewer workers"
        )
    total_steps = epoch_steps * config.epochs
    if config.max_steps is not None:
        total_steps = min(total_steps, config.max_steps)
    # LR scaling: the ranks average their gradients over the global batch, so N ranks take one step
    # where one process with the base batch (what --lr was tuned for) takes N; --lr-scaling raises
    # the LR by that ratio (linear) or its root, reached after --warmup-epochs (harness.training.lr).
    base_batch = config.base_batch or (config.global_batch or config.batch_size * config.grad_accum)
    cluster = placement.cluster
    transform = train_transform(
        train_set,
        placement.device,
        config.augment,
        config.seed,
        cluster.rank,
        world_size,
        local_batch,
        config.channels_last,
    )
    return RunPlan(
        config,
        placement,
        Precision.of(config.precision),
        train_set,
        test_set,
        local_batch,
        epoch_steps,
        total_steps,
        base_batch,
        peak_lr=scaled_lr(config.lr, local_batch * world_size, base_batch, config.lr_scaling),
        warmup_steps=round(config.warmup_epochs * epoch_steps),
        log_every=config.log_every or max(1, math.ceil(total_steps / HISTORY_POINTS)),
        transform=transform,
    )
