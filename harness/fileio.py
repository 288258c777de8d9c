"""Atomic file writes: a reader (or a resumed job) sees the old file or the new one, never half of one."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from typing import Any, Callable, Optional

from .errors import UsageError, first_line


@contextlib.contextmanager
def atomic_path(path: str) -> Iterator[str]:
    """Yield a temporary path beside `path`; on success it is fsynced and renamed onto `path`."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
    os.close(fd)
    try:
        yield tmp
        with open(tmp, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, path)
        fsync_directory(directory)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def atomic_write(path: str, write: Callable[[str], None]) -> None:
    """Call write(tmp_path), then move the finished file onto `path`."""
    with atomic_path(path) as tmp:
        write(tmp)


def atomic_write_json(path: str, document: Any, **options: Any) -> None:
    """`document` as indented JSON at `path`, atomically; NaN and infinity refused (they are not
    JSON), `options` passed to json.dump."""
    import json

    def write(tmp: str) -> None:
        with open(tmp, "w") as handle:
            json.dump(document, handle, indent=1, allow_nan=False, **options)

    atomic_write(path, write)


def fsync_directory(directory: str) -> None:
    """Make a rename or removal inside `directory` durable (best effort: some filesystems refuse)."""
    fd: Optional[int] = None
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        os.fsync(fd)
    if fd is not None:
        os.close(fd)


def load_tensors(path: str, device: Optional[Any] = None) -> Any:
    """torch.load with weights_only=True; a file that is not plain tensors and containers is refused."""
    import pickle

    import torch

    try:
        return torch.load(path, map_location=device, weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError, ValueError) as exc:
        raise UsageError(
            f"checkpoint file {path} cannot be loaded as plain tensors ({first_line(exc)}); "
            "resume from another checkpoint, or start a new run with another --checkpoint-dir"
        ) from None
