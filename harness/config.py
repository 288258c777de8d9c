"""The training configuration: one dataclass that the CLI, notebooks and job templates share.

Each field's metadata holds its help text; `harness train`'s flags are generated from it, so the
CLI and the Python API cannot drift apart.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Dict, Optional

from .allocator import CPU_MALLOC_MODES
from .errors import UsageError
from .lr import SCALING_RULES, SCHEDULES

OPTIMIZERS = ("sgd", "adam")
DEVICES = ("auto", "cpu", "cuda")


def _opt(default: Any, help: str, **extra: Any) -> Any:
    return field(default=default, metadata={"help": help, **extra})


@dataclass
class TrainConfig:
    """Everything one training run needs. `harness.train(TrainConfig(...))` runs it."""

    backend: str = _opt("none", "none (single process), ddp, horovod or deepspeed")
    model: str = _opt("cnn", "cnn (workshop CNN), resnet18 or resnet50")
    dataset: str = _opt("digits", "digits (embedded, offline), synthetic, mnist, fashion-mnist, cifar10, imagefolder")
    data_dir: str = _opt("data", "directory holding on-disk datasets (see `harness data`)")
    image_size: int = _opt(64, "imagefolder: side in pixels images are resized and centre-cropped to when prepared")
    augment: bool = _opt(False, "random crop (4-pixel padding) and horizontal flip of training batches, "
                                "the CIFAR recipe; drawn from (seed, epoch, step)")
    dropout: Optional[float] = _opt(None, "set both CNN dropout rates (0 turns dropout off; default 0.25 and 0.5)",
                                    type=float)
    batch_size: int = _opt(64, "samples per worker per step")
    global_batch: Optional[int] = _opt(None, "samples per step over all workers (strong scaling); "
                                              "overrides --batch-size, must divide evenly", type=int)
    epochs: int = _opt(1, "passes over the training set")
    max_steps: Optional[int] = _opt(None, "stop after this many optimizer steps in total", type=int)
    optimizer: str = _opt("sgd", "sgd or adam")
    momentum: float = _opt(0.9, "SGD momentum")
    weight_decay: float = _opt(0.0, "L2 weight decay")
    lr: float = _opt(0.01, "learning rate for --base-batch samples per step")
    lr_scaling: str = _opt("linear", "how the global batch scales --lr: none, linear or sqrt")
    base_batch: Optional[int] = _opt(None, "global batch that --lr was tuned for (default: --batch-size, "
                                            "so one worker trains at exactly --lr)", type=int)
    warmup_epochs: float = _opt(0.0, "epochs of per-step linear warmup from --lr to the scaled LR")
    schedule: str = _opt("constant", "LR after warmup: constant, step (x0.1 at 50%% and 75%%) or cosine")
    grad_clip: float = _opt(0.0, "clip the global gradient norm to this value (0 = no clipping, for every backend)")
    seed: int = _opt(0, "seed for weights, data order and dropout")
    device: str = _opt("auto", "auto (GPU local_rank %% gpus_per_node if CUDA is available), cpu or cuda")
    threads: Optional[int] = _opt(None, "CPU threads per rank (default: cores / local ranks)", type=int)
    num_workers: int = _opt(0, "data-loader worker processes per rank (0 = load in the training process)")
    prefetch: int = _opt(4, "batches each data-loader worker keeps ready ahead of training (with --num-workers > 0)")
    eval_every: int = _opt(1, "evaluate every N epochs (the last epoch is always evaluated; 0 = only the last)")
    timing_warmup_steps: int = _opt(5, "steps left out of the timed window (start-up, first allocations)")
    calibration_steps: int = _opt(10, "forward+backward steps timed after training on a plain copy of the model, "
                                     "to split step time into compute and communication (0 = no split)")
    profile: bool = _opt(False, "on GPUs, synchronise the device around each step phase so the per-step time "
                                "breakdown is exact (costs some overlap; CPU timings are exact without it)")
    tags: Dict[str, str] = field(default_factory=dict, metadata={
        "help": "label the run's record: KEY=VALUE, repeatable (sweeps record scaling mode, repeat, sweep id)",
        "flag": "--tag"})
    results: Optional[str] = _opt(None, "append one JSON record for this run to this JSONL file")
    save_model: Optional[str] = _opt(None, "rank 0 writes the final model state_dict here")
    timeout: float = _opt(120.0, "seconds a collective may wait for a peer before the job fails")
    checkpoint_dir: Optional[str] = _opt(None, "write checkpoints here: at every epoch end, every --checkpoint-every "
                                               "steps and on SIGTERM/SIGUSR1 (see harness/checkpoint.py)")
    checkpoint_every: int = _opt(0, "also checkpoint every N optimizer steps (0 = at epoch ends only)")
    keep_checkpoints: int = _opt(3, "how many of the newest checkpoints --checkpoint-dir keeps")
    resume: Optional[str] = _opt(None, "auto: continue from the newest valid checkpoint in --checkpoint-dir (start "
                                       "fresh if there is none); or a checkpoint directory DIR/step-N")
    # Framework knobs. None of them changes the math except fp16 compression (off by default).
    ddp_bucket_cap_mb: float = _opt(25.0, "DDP gradient bucket size in MB")
    hvd_fusion_threshold_mb: Optional[float] = _opt(None, "Horovod tensor-fusion buffer in MB "
                                                           "(default: Horovod's, 128)", type=float)
    hvd_fp16_compression: bool = _opt(False, "Horovod: send gradients as fp16 (changes the math)")
    hvd_cycle_time_ms: Optional[float] = _opt(None, "Horovod background-thread cycle in ms (default: "
                                                    "$HOROVOD_CYCLE_TIME, else 5 on CPU, Horovod's 1 on GPU)",
                                              type=float)
    zero_stage: int = _opt(0, "DeepSpeed ZeRO stage 0-3")
    cpu_malloc: str = _opt("reuse", "CPU runs: reuse (keep freed memory for the next step instead of returning "
                                    "it to the kernel; see harness/allocator.py) or system (glibc's defaults)")

    def validate(self) -> None:
        """Raise UsageError for values no backend could run. Checks that need the world size run later."""
        from .backends import BACKENDS
        from .data import DATASETS
        from .models import MODELS

        for name, value, known in (("backend", self.backend, BACKENDS), ("model", self.model, MODELS),
                                   ("dataset", self.dataset, DATASETS), ("optimizer", self.optimizer, OPTIMIZERS),
                                   ("lr-scaling", self.lr_scaling, SCALING_RULES), ("schedule", self.schedule, SCHEDULES),
                                   ("device", self.device, DEVICES), ("cpu-malloc", self.cpu_malloc, CPU_MALLOC_MODES)):
            if value not in known:
                raise UsageError(f"unknown {name} {value!r}; choose one of {', '.join(known)}")
        for name in ("batch_size", "global_batch", "epochs", "max_steps", "base_batch", "threads", "image_size",
                     "prefetch"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise UsageError(f"--{name.replace('_', '-')} must be a positive integer, got {value}")
        for name in ("lr", "timeout", "ddp_bucket_cap_mb", "hvd_fusion_threshold_mb", "hvd_cycle_time_ms"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise UsageError(f"--{name.replace('_', '-')} must be positive, got {value}")
        for name in ("momentum", "weight_decay", "warmup_epochs", "grad_clip", "num_workers", "eval_every",
                     "timing_warmup_steps", "calibration_steps"):
            if getattr(self, name) < 0:
                raise UsageError(f"--{name.replace('_', '-')} must not be negative, got {getattr(self, name)}")
        if self.dropout is not None and not 0 <= self.dropout < 1:
            raise UsageError(f"--dropout must be in [0, 1), got {self.dropout}")
        if self.zero_stage not in (0, 1, 2, 3):
            raise UsageError(f"--zero-stage must be 0, 1, 2 or 3, got {self.zero_stage}")
        from .checkpoint import check_checkpoint_flags

        check_checkpoint_flags(self)

    def local_batch(self, world_size: int) -> int:
        """Samples per worker per step; a global batch must split evenly over the workers."""
        if self.global_batch is None:
            return self.batch_size
        if self.global_batch % world_size:
            raise UsageError(f"--global-batch {self.global_batch} does not split evenly over {world_size} workers; "
                             f"use a multiple of {world_size} or set --batch-size per worker")
        return self.global_batch // world_size

    def to_dict(self) -> Dict[str, Any]:
        """Plain dict of every field, for the results record and checkpoints."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: Dict[str, Any]) -> "TrainConfig":
        """Inverse of to_dict; unknown keys are an error that names them."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown:
            raise UsageError(f"unknown config keys {unknown}; known keys are the fields of TrainConfig")
        return cls(**values)
