"""The unit tier's guard (tests/unit/conftest.py): every way to start a process fails the test, naming
the tier the test belongs in."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys

import pytest


@pytest.mark.parametrize(
    "start",
    [
        lambda: subprocess.run([sys.executable, "-c", "pass"], check=True),
        lambda: os.popen("true").read(),
        lambda: os.system("true"),
        lambda: os.fork(),
        lambda: os.posix_spawn("/bin/true", ["true"], {}),
        lambda: multiprocessing.get_context("spawn").Process(target=print).start(),
        lambda: multiprocessing.get_context("fork").Process(target=print).start(),
    ],
    ids=["subprocess", "os.popen", "os.system", "os.fork", "os.posix_spawn", "spawn", "fork"],
)
def test_starting_a_process_fails_the_test_and_names_the_integration_tier(start):
    with pytest.raises(pytest.fail.Exception, match=r"belongs in tests/integration/"):
        start()
