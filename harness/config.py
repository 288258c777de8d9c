"""The training configuration, in sections: what to train, the run, the data, the optimizer, the
backend, the measurement.

Each section is a dataclass that documents its fields once (each field's metadata holds its help
text, its `harness train` flag and the check its value must pass); `TrainConfig` is all of them in
one object, so a run is still built from flat keywords (`TrainConfig(backend="ddp", lr=0.1)`) and
stored as one flat dict, while a part of the kit types what it takes as the one section it reads
(the optimizer factory an `OptimizerSection`, the data loader a `DataSection`). `harness train`'s
flags are generated from the sections (harness.training.flags, with one flag per option of every
registered backend and built-in task), so the CLI and the Python API cannot drift apart.

This is a leaf module: it checks fields one by one (`validate`); what needs the registries (the
backend and task, their options, checkpoints) is checked by `harness.training.check_config`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from .errors import EXIT_USAGE, UsageError, unknown_choice
from .process.allocator import CPU_MALLOC_MODES
from .training.lr import SCALING_RULES, SCHEDULES

OPTIMIZERS = ("sgd", "adam")
DEVICES = ("auto", "cpu", "cuda", "xpu")  # torch's device types; AMD GPUs are "cuda" under ROCm
# fp32: plain float32. bf16 / fp16: torch.autocast around forward and loss with float32 weights and
# optimizer state; fp16 adds dynamic loss scaling (harness.backends.precision).
PRECISIONS = ("fp32", "bf16", "fp16")
DEFAULT_TASK = "images"
# Fields of configs written before tasks existed: the built-in images task's arguments now.
IMAGE_TASK_FIELDS = ("model", "dataset", "data_dir", "image_size", "augment", "dropout")
# Where on-disk image datasets lie, and imagefolder's side in pixels: the defaults of the images
# task's --data-dir and --image-size and of `harness data` (here, so that the CLI needs no torch).
DATA_DIR = "data"
IMAGE_SIZE = 64


def _opt(default: Any, help: str, check: Any = None, **extra: Any) -> Any:
    """A config field: its default, help text, and the check its value must pass ("positive",
    "non_negative", or a tuple of the values it may take)."""
    return field(default=default, metadata={"help": help, "check": check, **extra})


def _dict(help: str, flag: str) -> Any:
    return field(default_factory=dict, metadata={"help": help, "flag": flag, "check": None})


@dataclass
class TaskSection:
    """What to train: a task (harness.tasks) and its arguments."""

    task: str = _opt(
        DEFAULT_TASK,
        "what to train: a built-in task (images), MODULE:FUNCTION or path/to/file.py:FUNCTION returning a "
        "harness.Task (see docs/tutorials/your-model.md)",
    )
    task_args: dict[str, Any] = _dict(
        "an argument of the task's function: KEY=VALUE, repeatable (VALUE read as JSON when it is, else a string)",
        "--task-arg",
    )


@dataclass
class RunSection:
    """How long to train, where, and what the run keeps: results, model, checkpoints."""

    epochs: int = _opt(1, "passes over the training set", "positive")
    max_steps: Optional[int] = _opt(None, "stop after this many optimizer steps in total", "positive", type=int)
    seed: int = _opt(0, "seed for weights, data order and dropout")
    device: str = _opt(
        "auto",
        "auto (GPU local_rank // --procs-per-gpu if this node has one), cpu, cuda (NVIDIA, "
        "or AMD under ROCm) or xpu (Intel)",
        DEVICES,
    )
    threads: Optional[int] = _opt(None, "CPU threads per rank (default: cores / local ranks)", "positive", type=int)
    pin_cores: bool = _opt(
        False,
        "CPU runs: pin each rank to cores of its own, --threads of them (local rank r takes the r-th "
        "block of the cores the launcher gave it), so that the ranks never trade cores",
    )
    cpu_malloc: str = _opt(
        "reuse",
        "CPU runs: reuse (keep freed memory for the next step instead of returning "
        "it to the kernel; see harness/process/allocator.py), system (glibc's defaults) or release "
        "(blocks of 1 MiB or more handed back when freed; what --memory-cap uses)",
        CPU_MALLOC_MODES,
    )
    memory_cap: Optional[float] = _opt(
        None,
        "cap each rank's memory at this many GiB, set by the kit in the rank's process (CPU: the kernel's "
        "data-segment limit, with --cpu-malloc release; CUDA: the allocator's): a rank predicted to need more "
        "is refused before the run, one that runs past it stops naming its rank (see harness/process/memory_cap.py)",
        "positive",
        type=float,
    )
    eval_every: int = _opt(
        1, "evaluate every N epochs (the last epoch is always evaluated; 0 = only the last)", "non_negative"
    )
    eval_batch_size: int = _opt(
        0,
        "samples per rank in each evaluation forward (0 = the training micro-batch); the result is the same at "
        "any size, but fewer forwards are faster, and under ZeRO-3 and FSDP each forward gathers the weights. "
        "The memory prediction covers it: activations at the larger of the two batches",
        "non_negative",
    )
    tags: dict[str, str] = field(
        default_factory=dict,
        metadata={
            "help": "label the run's record: KEY=VALUE, repeatable (sweeps record scaling mode, repeat, sweep id)",
            "flag": "--tag",
            "check": None,
        },
    )
    results: Optional[str] = _opt(None, "append one JSON record for this run to this JSONL file")
    save_model: Optional[str] = _opt(None, "rank 0 writes the final model state_dict here")
    checkpoint_dir: Optional[str] = _opt(
        None,
        "write checkpoints here: at every epoch end, every --checkpoint-every "
        "steps and on SIGTERM/SIGUSR1 (see harness/training/checkpoint.py)",
    )
    checkpoint_every: int = _opt(0, "also checkpoint every N optimizer steps (0 = at epoch ends only)", "non_negative")
    keep_checkpoints: int = _opt(3, "how many of the newest checkpoints --checkpoint-dir keeps", "positive")
    resume: Optional[str] = _opt(
        None,
        "auto: continue from the newest valid checkpoint in --checkpoint-dir (start "
        "fresh if there is none); or a checkpoint directory DIR/step-N",
    )


@dataclass
class DataSection:
    """How samples reach each rank: batch sizes, accumulation, loader workers."""

    batch_size: int = _opt(64, "samples per worker per micro-batch (per step without --grad-accum)", "positive")
    global_batch: Optional[int] = _opt(
        None,
        "samples per optimizer step over all workers (strong scaling); overrides --batch-size, must divide evenly",
        "positive",
        type=int,
    )
    grad_accum: int = _opt(
        1,
        "micro-batches per optimizer step; gradients are communicated on the last one "
        "only. The effective batch (batch x accumulation x workers) is what LR scaling, "
        "sharding and throughput count",
        "positive",
    )
    num_workers: int = _opt(
        0, "data-loader worker processes per rank (0 = load in the training process)", "non_negative"
    )
    prefetch: int = _opt(
        4, "batches each data-loader worker keeps ready ahead of training (with --num-workers > 0)", "positive"
    )

    def local_batch(self, world_size: int) -> int:
        """Samples per worker per optimizer step (all micro-batches); a global batch must split evenly."""
        if self.global_batch is None:
            return self.batch_size * self.grad_accum
        parts = world_size * self.grad_accum
        if self.global_batch % parts:
            split = f"{world_size} workers" + (f" x {self.grad_accum} micro-batches" if self.grad_accum > 1 else "")
            raise UsageError(
                f"--global-batch {self.global_batch} does not split evenly over {split}; use a multiple "
                f"of {parts} or set --batch-size per worker"
            )
        return self.global_batch // world_size


@dataclass
class OptimizerSection:
    """The optimizer and the learning-rate rule, the same for every backend."""

    optimizer: str = _opt("sgd", "sgd or adam (a task's build_optimizer replaces it)", OPTIMIZERS)
    momentum: float = _opt(0.9, "SGD momentum", "non_negative")
    weight_decay: float = _opt(0.0, "L2 weight decay", "non_negative")
    lr: float = _opt(0.01, "learning rate for --base-batch samples per step", "positive")
    lr_scaling: str = _opt("linear", "how the global batch scales --lr: none, linear or sqrt", SCALING_RULES)
    base_batch: Optional[int] = _opt(
        None,
        "global batch that --lr was tuned for (default: the batch of one "
        "worker, so one worker trains at exactly --lr)",
        "positive",
        type=int,
    )
    warmup_epochs: float = _opt(0.0, "epochs of per-step linear warmup from --lr to the scaled LR", "non_negative")
    schedule: str = _opt("constant", "LR after warmup: constant, step (x0.1 at 50%% and 75%%) or cosine", SCHEDULES)
    grad_clip: float = _opt(
        0.0, "clip the global gradient norm to this value (0 = no clipping, for every backend)", "non_negative"
    )


@dataclass
class BackendSection:
    """Which framework trains, with its own options, and the numerics every backend keeps alike."""

    backend: str = _opt("none", "none (single process), ddp, horovod, deepspeed or fsdp")
    backend_options: dict[str, Any] = field(
        default_factory=dict,
        metadata={
            "help": "the chosen backend's own options, by the field names of its Options dataclass (on the command "
            "line each option is a flag of its own)",
            "backend_flags": True,
            "check": None,
        },
    )
    precision: str = _opt(
        "fp32",
        "fp32, or bf16 / fp16: torch.autocast around forward and loss with float32 "
        "weights and optimizer state (fp16 with dynamic loss scaling), for every backend",
        PRECISIONS,
    )
    compile: bool = _opt(
        False,
        "torch.compile the model (under backends that allow it); compilation runs in the "
        "first step, one of the --timing-warmup-steps left out of the timed window",
    )
    channels_last: bool = _opt(
        False,
        "keep 4-D inputs and convolution weights in channels-last memory order (faster convolutions on recent GPUs)",
    )
    procs_per_gpu: int = _opt(
        1,
        "GPU runs: ranks sharing one GPU (AccDP; needs a communicator that allows it, see docs/how-to/gpu-check.md)",
        "positive",
    )
    timeout: float = _opt(120.0, "seconds a collective may wait for a peer before the job fails", "positive")


@dataclass
class MeasurementSection:
    """What the run measures beside training: the timed window, the step breakdown, traces."""

    timing_warmup_steps: int = _opt(
        5, "steps left out of the timed window (start-up, first allocations)", "non_negative"
    )
    calibration_steps: int = _opt(
        0,
        "forward+backward steps timed after training on a fresh copy of the model: "
        "a cross-check recorded beside the window's own forward+backward (0 = none)",
        "non_negative",
    )
    trace_steps: int = _opt(
        0,
        "record each rank's phase timestamps (data wait, forward+backward, communication, "
        "optimizer) for this many steps of the timed window, for a per-rank timeline",
        "non_negative",
    )
    no_step_breakdown: bool = _opt(
        False,
        "time no phases and meter no collectives (the record's step breakdown is then left out): "
        "what the breakdown costs is throughput with it against without it (benchmarks/breakdown_cost.py)",
    )
    profile: bool = _opt(
        False,
        "on GPUs, synchronise the device around each step phase so the per-step time "
        "breakdown is exact (costs some overlap; CPU timings are exact without it)",
    )
    profile_trace: Optional[str] = _opt(
        None,
        "torch.profiler on every rank for a few timed steps: each rank writes "
        "DIR/rank-N.json (and its step phases, DIR/rank-N.steps.json), merged "
        "into DIR/trace.json for https://ui.perfetto.dev (harness trace merge)",
    )
    no_heartbeat: bool = _opt(
        False,
        "do not publish each rank's step and phase to rank 0's heartbeat store (default: publish, so that "
        "a collective that times out names the rank that stopped; see harness/process/heartbeat.py)",
    )
    log_every: Optional[int] = _opt(
        None,
        "the record's loss and LR history keeps one point per N steps, each the "
        "exact mean over its steps and all ranks (default: every step for runs "
        "up to 1,000 steps, else 1,000 points)",
        "positive",
        type=int,
    )


SECTIONS = (TaskSection, RunSection, DataSection, OptimizerSection, BackendSection, MeasurementSection)


@dataclass
class TrainConfig(MeasurementSection, BackendSection, OptimizerSection, DataSection, RunSection, TaskSection):
    """Everything one training run needs, every section in one object. `harness.train(TrainConfig(...))`
    runs it.

    Every field is also a `harness train` flag (field `batch_size` is `--batch-size`). Records and
    checkpoints store `to_dict()`; `from_dict`/`from_json` read it back.
    """

    def validate(self) -> None:
        """Raise UsageError for a field whose value is malformed on its own (ranges, fixed choices)."""
        for spec in dataclasses.fields(self):
            check, value = spec.metadata["check"], getattr(self, spec.name)
            if isinstance(check, tuple) and value not in check:
                raise unknown_choice(flag_name(spec.name).lstrip("-"), value, check)
            if value is None or check is None or isinstance(check, tuple):
                continue
            if check == "positive" and not value > 0:
                kind = "a positive integer" if isinstance(value, int) else "positive"
                raise UsageError(f"{flag_name(spec.name)} must be {kind}, got {value}")
            if check == "non_negative" and value < 0:
                raise UsageError(f"{flag_name(spec.name)} must not be negative, got {value}")
        if self.compile and self.timing_warmup_steps == 0:
            raise UsageError(
                "--compile compiles during the first step; keep it out of the timed window with "
                "--timing-warmup-steps 1 or more"
            )
        for name in ("backend_options", "task_args"):
            if not isinstance(getattr(self, name), dict):
                raise UsageError(f"{name} must be a dict of name to value, got {getattr(self, name)!r}")

    def to_dict(self) -> dict[str, Any]:
        """Plain dict of every field, for the results record and checkpoints."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TrainConfig:
        """Inverse of to_dict; unknown keys are an error that names them. A config written before
        tasks existed (with model, dataset, ... fields) trains the built-in images task with them."""
        values = dict(values)
        legacy = {name: values.pop(name) for name in IMAGE_TASK_FIELDS if name in values}
        if legacy and values.get("task", DEFAULT_TASK) == DEFAULT_TASK:
            values["task_args"] = {**legacy, **values.get("task_args", {})}
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown:
            raise UsageError(
                f"unknown config keys {unknown}; known keys are the fields of TrainConfig (see `harness train --help`)"
            )
        return cls(**values)

    def to_json(self, path: str) -> None:
        """Write this config as a JSON file that `harness train --config PATH` and from_json read."""
        from .fileio import atomic_write

        def write(tmp: str) -> None:
            with open(tmp, "w") as handle:
                json.dump(self.to_dict(), handle, indent=1, sort_keys=True)
                handle.write("\n")

        atomic_write(path, write)

    @classmethod
    def from_json(cls, path: str) -> TrainConfig:
        """The config stored in a JSON file (as to_json writes it, or a record's `config`)."""
        try:
            with open(path) as handle:
                values = json.load(handle)
        except OSError as exc:
            raise UsageError(
                f"config file {path} cannot be read ({exc.strerror}); write one with TrainConfig.to_json"
            ) from None
        except ValueError as exc:
            raise UsageError(f"config file {path} is not JSON ({exc}); write one with TrainConfig.to_json") from None
        if not isinstance(values, dict):
            raise UsageError(f"config file {path} holds no JSON object; write one with TrainConfig.to_json")
        return cls.from_dict(values)


def section_of(name: str) -> type:
    """The section that declares field `name`."""
    return next(section for section in SECTIONS if name in section.__dataclass_fields__)


def _field_docs() -> str:
    lines = [""]
    for section in SECTIONS:
        lines.append(f"{section.__name__} ({section.__doc__.splitlines()[0]}):")
        for spec in dataclasses.fields(section):
            default = spec.default if spec.default is not dataclasses.MISSING else "{}"
            flag = "a flag per option" if spec.metadata.get("backend_flags") else flag_name(spec.name)
            lines.append(f"    {spec.name} ({flag}, default {default!r}): {spec.metadata['help'].replace('%%', '%')}")
    return "\n".join(lines)


def flag_name(name: str) -> str:
    """The CLI flag of TrainConfig field `name`, e.g. `--batch-size`."""
    spec = {f.name: f for f in dataclasses.fields(TrainConfig)}.get(name)
    return (spec.metadata.get("flag") if spec is not None else None) or "--" + name.replace("_", "-")


TrainConfig.__doc__ = (TrainConfig.__doc__ or "") + _field_docs()


# -- the command line's parser ------------------------------------------------------------------


class OneLineParser(argparse.ArgumentParser):
    """argparse whose errors are one line naming the fix, with exit status 2.

    `declare_later` defers declaring arguments until the parser is first used (to parse, or for
    its usage or help): `harness train`'s flags include every backend's options, and reading those
    imports the backends, hence torch, which `harness --help` and most commands never need.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._undeclared: list[Callable[[argparse.ArgumentParser], None]] = []

    def declare_later(self, declare: Callable[[argparse.ArgumentParser], None]) -> None:
        """Call `declare(self)` to add arguments when this parser is first used, not now."""
        self._undeclared.append(declare)

    def _declare_now(self) -> None:
        if not self._undeclared:
            return
        for declare in self._undeclared:
            declare(self)
        self._undeclared.clear()
        self.set_defaults(**self._defaults)  # defaults set before the arguments existed apply to them too

    def parse_known_args(
        self,
        args: Optional[Sequence[str]] = None,  # type: ignore[override]
        namespace: Optional[argparse.Namespace] = None,
    ) -> tuple[argparse.Namespace, list[str]]:
        self._declare_now()
        return super().parse_known_args(args, namespace)

    def format_usage(self) -> str:
        self._declare_now()
        return super().format_usage()

    def format_help(self) -> str:
        self._declare_now()
        return super().format_help()

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")
