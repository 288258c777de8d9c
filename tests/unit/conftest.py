"""The unit tier runs in-process: a test here that starts a process fails and names where it belongs.

Every way to start a process goes through one of the functions patched below (subprocess, os.popen
and asyncio go through subprocess.Popen; multiprocessing and concurrent.futures' process pools through
multiprocessing's Process.start or os.fork). The guard is module-scoped so that module-scoped fixtures
are guarded too.
"""

from __future__ import annotations

import multiprocessing.process
import os
import platform
import posix
import subprocess
from collections.abc import Iterator

import pytest

_MOVE_IT = "a test that starts a process belongs in tests/integration/ (tests/unit/ runs in-process)"


# The standard library asks `uname -p` once per process for platform.platform(), which the run record
# names; asking here, before the guard, keeps that one cached answer from counting as the test's.
platform.platform()

# matplotlib lists the system's fonts with `fc-list` the first time it is imported on a machine
# (then caches them): a fresh clone on a fresh machine would fail every figure test here on it.
try:
    import matplotlib.font_manager  # noqa: F401
except ImportError:  # the figure tests say what to install
    pass


def _refuse(owner: object, name: str, shown_as: str):
    original = getattr(owner, name)

    def refused(*args, **kwargs):
        command = args[1] if len(args) > 1 and name == "_execute_child" else args[:1]
        pytest.fail(f"{shown_as}({command!r:.200}) was called: {_MOVE_IT}")

    # Under the original's name, so that pickling a reference to it (a test's malicious pickle
    # names os.system) still finds the same object.
    refused.__module__, refused.__qualname__ = original.__module__, original.__qualname__
    return refused


@pytest.fixture(scope="module", autouse=True)
def _no_processes() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(
            subprocess.Popen, "_execute_child", _refuse(subprocess.Popen, "_execute_child", "subprocess.Popen")
        )
        process = multiprocessing.process.BaseProcess
        patch.setattr(process, "start", _refuse(process, "start", "multiprocessing Process.start"))
        for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system", "spawnv", "spawnve"):
            if hasattr(os, name):
                refused = _refuse(os, name, f"os.{name}")
                patch.setattr(os, name, refused)
                if hasattr(posix, name):
                    patch.setattr(posix, name, refused)
        yield
