"""Backends layer: how each framework wraps the model, communicates gradients and steps.

`base.Backend` is the interface the training loop talks to; each framework is one module here
(`single`, `ddp`, `horovod`, `deepspeed`, with `torch_distributed` for the process-group plumbing
they share) and one entry in the registry below. `precision` holds the numeric semantics every
backend must keep alike. Nothing outside this package imports a framework.
"""

from __future__ import annotations

from typing import Dict, Type

from ..errors import unknown_choice
from .base import Backend
from .ddp import DDPBackend
from .deepspeed import DeepSpeedBackend
from .horovod import HorovodBackend
from .single import SingleProcessBackend
from .torch_distributed import process_group_backend

BACKENDS: Dict[str, Type[Backend]] = {
    cls.name: cls for cls in (SingleProcessBackend, DDPBackend, HorovodBackend, DeepSpeedBackend)}


def backend_class(name: str) -> Type[Backend]:
    """The class registered as `name`; an unknown name lists the known ones."""
    if name not in BACKENDS:
        raise unknown_choice("backend", name, BACKENDS)
    return BACKENDS[name]


def get_backend(name: str) -> Backend:
    """A new backend instance; an unknown name lists the known ones."""
    return backend_class(name)()


__all__ = ["BACKENDS", "Backend", "backend_class", "get_backend", "process_group_backend"]
