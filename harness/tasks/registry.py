"""The built-in tasks by name: tasks the kit ships, each a factory of keyword arguments (as a
researcher's task is) with an Options dataclass that declares those arguments as flags."""

from __future__ import annotations

from .images import IMAGES
from .task import BuiltinTask
from .transformer import TRANSFORMER


def builtin_tasks() -> dict[str, BuiltinTask]:
    """The built-in tasks by name."""
    return {task.name: task for task in (IMAGES, TRANSFORMER)}
