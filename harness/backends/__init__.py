"""Backend registry: name -> class. Adding a backend is one module and one line here."""

from __future__ import annotations

from typing import Dict, Type

from ..errors import UsageError
from .base import Backend
from .ddp import DDPBackend
from .deepspeed import DeepSpeedBackend
from .horovod import HorovodBackend

BACKENDS: Dict[str, Type[Backend]] = {cls.name: cls for cls in (Backend, DDPBackend, HorovodBackend, DeepSpeedBackend)}


def get_backend(name: str) -> Backend:
    """A new backend instance; an unknown name lists the known ones."""
    if name not in BACKENDS:
        raise UsageError(f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}")
    return BACKENDS[name]()


__all__ = ["BACKENDS", "Backend", "get_backend"]
