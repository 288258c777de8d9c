"""Results as data: one JSON object per run, appended to a JSONL file that plots and reports read.

`run_record` writes the record a training returns; `append_record` appends it, under a lock;
`read_results` reads records back. torch is imported only where a record is made, so reading
results does not import it.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import platform
import socket
import sys
import time
import uuid
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:
    import torch

    from ..config import TrainConfig
    from .loop import RunState
    from .plan import RunPlan

# Two-sided 95% Student-t quantiles for 1..30 degrees of freedom; the normal 1.96 beyond.
_T95 = (
    12.706,
    4.303,
    3.182,
    2.776,
    2.571,
    2.447,
    2.365,
    2.306,
    2.262,
    2.228,
    2.201,
    2.179,
    2.160,
    2.145,
    2.131,
    2.120,
    2.110,
    2.101,
    2.093,
    2.086,
    2.080,
    2.074,
    2.069,
    2.064,
    2.060,
    2.056,
    2.052,
    2.048,
    2.045,
    2.042,
)


def mean_and_ci95(values: Sequence[float]) -> dict[str, Any]:
    """Mean and half-width of its 95% confidence interval (None with fewer than two values)."""
    n = len(values)
    if n == 0:
        return {"mean": None, "ci95": None, "n": 0}
    mean = sum(values) / n
    if n < 2:
        return {"mean": mean, "ci95": None, "n": 1}
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    quantile = _T95[n - 2] if n - 1 <= len(_T95) else 1.96
    return {"mean": mean, "ci95": quantile * std / math.sqrt(n), "n": n}


def library_versions() -> dict[str, str]:
    """Versions of Python and the libraries every run uses."""
    import numpy
    import torch

    from ..version import __version__

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "harness": __version__,
        "cuda": torch.version.cuda or "none",
    }


def host_info() -> dict[str, Any]:
    """Where the run happened."""
    return {"hostname": socket.gethostname(), "platform": platform.platform(), "argv": sys.argv}


def run_record(plan: RunPlan, state: RunState, started: float, breakdown: dict[str, Any]) -> dict[str, Any]:
    """The results record of a run that has trained (`breakdown`: its gathered step breakdown,
    harness.training.timing.gather_breakdown): counts over the whole run, timings of this segment."""
    config, (backend, cluster, device, threads, *_) = plan.config, plan.placement
    timer, progress = state.timer, state.progress
    throughput = timer.steps * plan.global_batch / timer.seconds if timer.seconds else None
    return {
        "run_id": uuid.uuid4().hex[:12],
        "started": started,
        "wall_time": time.time() - started,
        "backend": config.backend,
        "launcher": cluster.launcher,
        "world_size": cluster.world_size,
        "local_world_size": cluster.local_world_size,
        "local_batch": plan.local_batch,
        "micro_batch": plan.local_batch // config.grad_accum,
        "grad_accum": config.grad_accum,
        "global_batch": plan.global_batch,
        **_task_facts(plan, state),
        "train_set_size": len(plan.train_set),
        "device": device.type,
        "threads_per_rank": threads if device.type == "cpu" else None,
        "gradient_bytes": state.gradient_bytes,
        "lr_base": config.lr,
        "base_batch": plan.base_batch,
        "lr_effective": plan.peak_lr,
        "warmup_steps": plan.warmup_steps,
        # Counts cover the whole run, each step once, however many segments (resumes) it took;
        # timings (timed_*, throughput, epoch_*, wall_time) cover this segment only.
        "steps": state.step,
        "epochs": plan.num_epochs,
        "steps_per_epoch": plan.epoch_steps,
        "samples_seen": state.step * plan.global_batch,
        "resumed_from_step": state.start_step,
        "segments": progress.segments,
        "checkpoint_seconds": state.checkpointer.seconds if state.checkpointer is not None else 0.0,
        "timed_steps": timer.steps,
        "timed_seconds": timer.seconds,
        "timing_warmup_steps": plan.timing_warmup(state.start_step),
        "throughput": throughput,
        "throughput_ci95": mean_and_ci95(state.epoch_throughputs)["ci95"],
        "throughput_per_worker": throughput / cluster.world_size if throughput else None,
        "epoch_times": state.epoch_times,
        "epoch_throughputs": state.epoch_throughputs,
        **breakdown,
        "memory": _memory(breakdown["memory"], state),
        "train_loss": progress.train_losses[-1],
        "train_losses": progress.train_losses,
        "history": {"log_every": plan.log_every, **{key: progress.history[key] for key in ("step", "loss", "lr")}},
        "lr_final": plan.lr_at(state.step - 1),
        "skipped_steps": backend.skipped_steps,
        **progress.evaluation,
        "math": backend.math_settings(),
        "tuning": _tuning(plan, state),
        "versions": {**library_versions(), **backend.versions()},
        "host": host_info(),
        **({"gpu": _gpu_facts(device, config)} if device.type == "cuda" else {}),
        "config": config.to_dict(),
        "tags": dict(config.tags),
    }


def _task_facts(plan: RunPlan, state: RunState) -> dict[str, Any]:
    """What trained: the task (spec, arguments, source and its sha256, so that a study can be rerun
    and compared), its description, the model's parameters and their shape (what `harness predict`
    prices), and `model` and `dataset`, the short names reports show."""
    from ..data.indexed import data_name

    task, shape = plan.loaded.task, state.model_shape
    description = {key: value for key, value in task.description.items() if isinstance(value, (str, int, float, bool))}
    return {
        "task": {**plan.loaded.origin(), "description": description, **shape},
        "model": str(description.get("model", shape.get("model_class"))),
        "dataset": str(description.get("data", data_name(task.train_data))),
    }


def _memory(measured: dict[str, Any], state: RunState) -> dict[str, Any]:
    """The measured memory section with the prediction made at the run's start beside it
    (harness.training.memory.predicted_section), where one was made."""
    from .memory import predicted_section

    predicted = state.timer.memory.predicted if state.timer.memory is not None else None
    return {**measured, "predicted": predicted_section(predicted, measured) if predicted is not None else None}


def _tuning(plan: RunPlan, state: RunState) -> dict[str, Any]:
    """What the backend and the harness chose that changes speed, not the math."""
    backend, cpu_malloc = plan.placement.backend, plan.placement.cpu_malloc
    return {
        **backend.tuning(),
        "cpu_malloc": cpu_malloc,
        "pinned_cores": plan.placement.cores,  # rank 0's (--pin-cores); each rank has a block of its own
        "channels_last_weights": plan.channels_last_weights,
        "compile": backend.compiled,
        "heartbeat": state.heartbeat.running,  # --no-heartbeat turns it off; one rank has none
    }


def _gpu_facts(device: torch.device, config: TrainConfig) -> dict[str, Any]:
    """What a GPU run's record states about the hardware and its software."""
    import torch

    nccl = torch.cuda.nccl.version() if hasattr(torch.cuda, "nccl") else None
    return {
        "name": torch.cuda.get_device_name(device),
        "cuda": torch.version.cuda,
        "nccl": ".".join(map(str, nccl)) if isinstance(nccl, tuple) else nccl,
        "ranks_per_gpu": config.procs_per_gpu,
        "profile_synchronised": config.profile,
        "channels_last": config.channels_last,
    }


def append_record(path: str, record: dict[str, Any]) -> None:
    """Append one record as one line: a single write under an exclusive lock, then fsync.

    A reader never sees half a record, and concurrent jobs appending to one file do not interleave.
    A last line a killed job left cut short is ended first, so that the new record is a line of its
    own (a continued study appends to the file its killed job cut).
    """
    line = (json.dumps(record, sort_keys=True, allow_nan=False) + "\n").encode()
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            line = b"\n" + line
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)


JOB_RESULTS = "results.jsonl"  # what the job templates in submissions/ write at the top of a job's directory


def read_results(paths: Iterable[str]) -> list[dict[str, Any]]:
    """The records of results files, for `harness report`, `plot`, `predict` and notebooks.

    A directory stands for the results.jsonl of a job directory that the job templates write (its
    other JSONL files, such as discovery-<job>.jsonl, are not run records). A line that is not a
    whole record (a job killed mid-write leaves at most its last line cut short) is skipped with
    a one-line warning naming file and line. Raises UsageError, one line naming the fix, when a
    file is missing or the files hold no record at all: every command answers an empty or missing
    results file the same way."""
    from ..errors import UsageError

    paths = [os.path.join(path, JOB_RESULTS) if os.path.isdir(path) else path for path in paths]
    missing = [path for path in paths if not os.path.isfile(path)]
    if missing:
        raise UsageError(f"results file {missing[0]} does not exist; run `harness sweep --results FILE` first")
    records = read_records(paths)
    if not records:
        raise UsageError(
            f"results file {', '.join(paths)} holds no records; run `harness sweep --results FILE` "
            "(or let the study's job finish a run) first"
        )
    return records


def read_records(paths: Iterable[str]) -> list[dict[str, Any]]:
    """All records of the given JSONL files, in file order.

    A line that is a record cut short (a job stopped while appending it: the last line, or a line
    before records a continued job appended after it) is left out with a warning on stderr naming the
    file and line, as is any bad last line; another bad line raises UsageError naming it."""
    records = []
    for path in paths:
        with open(path, errors="replace") as handle:
            lines = [(number, line) for number, line in enumerate(handle, 1) if line.strip()]
        for index, (number, line) in enumerate(lines):
            try:
                record, error = json.loads(line), None
            except ValueError as exc:
                record, error = None, exc
            if isinstance(record, dict):
                records.append(record)
            else:
                _bad_line(path, number, skip=index == len(lines) - 1 or _cut_short(line, error))
    return records


def _cut_short(line: str, error: Optional[ValueError]) -> bool:
    """Whether a line that failed to parse is the start of a JSON object that ends too soon."""
    if not (isinstance(error, json.JSONDecodeError) and line.lstrip().startswith("{")):
        return False
    return error.msg.startswith("Unterminated string") or error.pos >= len(line.rstrip())


def _bad_line(path: str, number: int, skip: bool) -> None:
    from ..errors import UsageError

    if not skip:
        raise UsageError(
            f"results file {path} line {number} is not a JSON record; remove that line (or use another results file)"
        )
    print(
        f"warning: results file {path} line {number} is cut off (a run stopped while writing it); "
        "read the records before it; remove the line to silence this",
        file=sys.stderr,
    )
