"""Before a rank trains: its config checked, and the rank placed (backend, job, device, threads).

Everything here runs before any process group exists, so bad input fails as a UsageError before
any rank waits for another.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..backends import Backend, backend_class, get_backend
from ..config import TrainConfig
from ..data import DATASETS
from ..errors import unknown_choice
from ..process.discovery import ClusterEnv, default_threads, detect_cluster, select_device
from ..process.state import use_cpu
from .checkpoint import check_checkpoint_flags
from .models import MODELS


def check_config(config: TrainConfig) -> None:
    """Raise UsageError for anything wrong with `config` that can be told before a process starts:
    each field, the backend, model and dataset names, the backend's own options, checkpoint flags."""
    config.validate()
    backend = backend_class(config.backend)
    for kind, value, known in (("model", config.model, MODELS), ("dataset", config.dataset, DATASETS)):
        if value not in known:
            raise unknown_choice(kind, value, known)
    backend.parse_options(config.backend_options)
    check_checkpoint_flags(config)


class Placement(NamedTuple):
    """Where and how this rank runs, decided before any process group starts."""

    backend: Backend
    cluster: ClusterEnv
    device: torch.device
    threads: int
    cpu_malloc: str  # the CPU memory mode in effect (harness.process.allocator)


def place_process(config: TrainConfig) -> Placement:
    """Check the config, backend and launch (no process group yet); pick this rank's device, threads
    and CPU memory reuse. Sets the thread count: call it inside
    `harness.process.state.preserved_process_state`."""
    check_config(config)
    backend = get_backend(config.backend, config.backend_options)
    backend.check_available()
    cluster = detect_cluster()
    device = select_device(config.device, cluster, config.procs_per_gpu)
    backend.check_launch(config, cluster, device)
    threads = config.threads or default_threads(cluster)
    return Placement(backend, cluster, device, threads, use_cpu(device, threads, config.cpu_malloc))
