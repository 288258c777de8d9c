"""Before a rank trains: its config checked, and the rank placed (backend, job, device, threads).

Everything here runs before any process group exists, so bad input fails as a UsageError before
any rank waits for another.
"""

from __future__ import annotations

import os
from typing import Callable, NamedTuple, Optional

import torch

from ..backends import BACKENDS, Backend, BackendSettings, backend_class, get_backend
from ..config import TrainConfig
from ..errors import UsageError
from ..process.accelerator import kind_of, select_device
from ..process.discovery import ClusterEnv, default_threads, detect_cluster
from ..process.state import pin_to_cores, use_cpu
from ..tasks.loading import check_spec
from .profiling import check_trace_directory
from .resume import check_checkpoint_flags


def check_config(config: TrainConfig) -> None:
    """Raise UsageError for anything wrong with `config` that can be told before a process starts:
    each field, the backend and its own options, the task's spec (a built-in task's arguments too),
    checkpoint flags, and that the files the run writes at its end can be written."""
    config.validate()
    backend = backend_class(config.backend)
    check_spec(config.task, config.task_args)
    backend.parse_options(config.backend_options)
    if config.compile:
        _refuse_unless(backend, lambda cls: cls.compiles, "--compile")
    check_checkpoint_flags(config)
    if config.profile_trace:
        check_trace_directory(config.profile_trace)
    # the model replaces its file (a rename in its directory); the record is appended to its file
    for flag, path, replaced in (("--save-model", config.save_model, True), ("--results", config.results, False)):
        if path:
            check_output_file(flag, path, replaced)


def check_output_file(flag: str, path: str, replaced: bool) -> None:
    """Raise UsageError (one line) unless the file `path` can be written when the run ends (`replaced`:
    by a new file renamed onto it, which needs its directory; else appended to): a run must not
    train for an hour and then lose its model to a directory that is a file. Creates nothing."""
    if os.path.isdir(path):
        raise UsageError(f"{flag} {path} is a directory; give a file path")
    existing = os.path.dirname(os.path.abspath(path))
    while not os.path.lexists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise UsageError(
            f"{flag} {path} cannot be written: {existing} is a file, not a directory; choose another path"
        )
    exists = os.path.exists(path)
    writable = (not exists or os.access(path, os.W_OK)) and (
        (exists and not replaced) or os.access(existing, os.W_OK | os.X_OK)
    )
    if not writable:
        denies = path if exists and not os.access(path, os.W_OK) else existing
        raise UsageError(f"{flag} {path} is not writable ({denies} denies it); choose a path you can write to")


def check_device(backend: type[Backend], device: torch.device) -> None:
    """Raise UsageError if `backend` does not run on this device's kind (Backend.devices)."""
    kind = kind_of(device)
    _refuse_unless(backend, lambda cls: kind in cls.devices, f"{kind} devices", ", or --device cpu")


def _refuse_unless(
    backend: type[Backend], supports: Callable[[type[Backend]], bool], what: str, alternative: str = ""
) -> None:
    """One line naming the backends that support `what` when `backend` does not."""
    if not supports(backend):
        others = " or ".join(name for name, cls in BACKENDS.items() if supports(cls))
        raise UsageError(f"backend {backend.name!r} does not support {what}; use --backend {others}{alternative}")


class Placement(NamedTuple):
    """Where and how this rank runs, decided before any process group starts."""

    backend: Backend
    cluster: ClusterEnv
    device: torch.device
    threads: int
    cpu_malloc: str  # the CPU memory mode in effect (harness.process.allocator)
    cores: Optional[list[int]]  # the cores this rank is pinned to (--pin-cores on a CPU), else None


def backend_settings(config: TrainConfig) -> BackendSettings:
    """What a backend uses of `config`."""
    return BackendSettings(
        precision=config.precision,
        grad_clip=config.grad_clip,
        grad_accum=config.grad_accum,
        timeout=config.timeout,
        procs_per_gpu=config.procs_per_gpu,
        metered=not config.no_step_breakdown,
    )


def place_process(config: TrainConfig) -> Placement:
    """Check the config, backend and launch (no process group yet); pick this rank's device, threads,
    CPU memory reuse and (--pin-cores) cores. Sets the thread count and the cores: call it inside
    `harness.process.state.preserved_process_state`."""
    check_config(config)
    backend = get_backend(config.backend, config.backend_options, backend_settings(config))
    backend.check_available()
    cluster = detect_cluster()
    device = select_device(config.device, cluster, config.procs_per_gpu)
    check_device(type(backend), device)
    backend.check_launch(cluster, device)
    threads = config.threads or default_threads(cluster)
    cores = pin_to_cores(cluster.local_rank, threads) if config.pin_cores and device.type == "cpu" else None
    # Under a memory cap, freed blocks go back to the kernel: kept ones would count against the cap.
    malloc = "release" if config.memory_cap is not None else config.cpu_malloc
    return Placement(backend, cluster, device, threads, use_cpu(device, threads, malloc), cores)
