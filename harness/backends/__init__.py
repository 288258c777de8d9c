"""Backends layer: how each framework wraps the model, communicates gradients and steps.

`base.Backend` is the interface the training loop talks to; each framework is one module here
(`single`, `ddp`, `horovod`, `deepspeed`, `fsdp`, with `torch_distributed` for the process-group
plumbing they share) and one entry in the registry below; each declares its own options there, as a frozen
dataclass whose fields are `harness train` flags (harness.options.BaseOptions). `precision` holds the
numeric semantics every backend must keep alike, and `compat` every workaround for a particular
version of a framework. Nothing outside this package imports a framework.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional

from ..errors import unknown_choice
from .base import Backend, BackendSettings
from .ddp import DDPBackend
from .deepspeed import DeepSpeedBackend
from .fsdp import FSDPBackend
from .horovod import HorovodBackend
from .single import SingleProcessBackend
from .torch_distributed import process_group_backend

BACKENDS: dict[str, type[Backend]] = {
    cls.name: cls for cls in (SingleProcessBackend, DDPBackend, HorovodBackend, DeepSpeedBackend, FSDPBackend)
}


def backend_class(name: str) -> type[Backend]:
    """The class registered as `name`; an unknown name lists the known ones."""
    if name not in BACKENDS:
        raise unknown_choice("backend", name, BACKENDS)
    return BACKENDS[name]


def get_backend(
    name: str, options: Optional[Mapping[str, Any]] = None, settings: Optional[BackendSettings] = None
) -> Backend:
    """A new backend instance with these options by name (TrainConfig.backend_options; default: the
    backend's defaults) and settings; an unknown backend lists the known ones, a bad option raises
    UsageError."""
    cls = backend_class(name)
    return cls(cls.parse_options(options or {}), settings)


__all__ = ["BACKENDS", "Backend", "BackendSettings", "backend_class", "get_backend", "process_group_backend"]
