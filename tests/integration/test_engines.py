"""ipyparallel engines and MPI: real processes started, hung and stopped."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid

import pytest

from harness.process.processes import kill_processes_with_environment, processes_with_environment
from harness.workshop.engines import CLUSTER_VARIABLE, EnginesError, mpi_flavour, start_engines


def test_this_machines_mpi_is_recognised() -> None:
    assert mpi_flavour("mpiexec") == "openmpi"
    assert mpi_flavour("/nonexistent/mpiexec") == "unknown"


def _sleeper(env_extra: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], env={**os.environ, **env_extra})


def test_kill_touches_only_processes_with_the_marker() -> None:
    marker = uuid.uuid4().hex
    marked = [_sleeper({"TEST_ENGINES_MARKER": marker}) for _ in range(2)]
    # One that ignores SIGTERM, as a wedged engine may: it must get SIGKILL after the grace period.
    stubborn = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(flush=True); time.sleep(120)",
        ],
        env={**os.environ, "TEST_ENGINES_MARKER": marker},
        stdout=subprocess.PIPE,
    )
    stubborn.stdout.readline()  # its handler is installed
    other = _sleeper({"TEST_ENGINES_MARKER": "someone else"})
    try:
        time.sleep(0.2)
        started = time.monotonic()
        killed = kill_processes_with_environment("TEST_ENGINES_MARKER", marker, grace=2.0)
        assert sorted(killed) == sorted(p.pid for p in [*marked, stubborn])
        assert time.monotonic() - started < 10
        for process in [*marked, stubborn]:
            assert process.wait(timeout=10) is not None
        assert other.poll() is None
        assert processes_with_environment("TEST_ENGINES_MARKER", marker) == []
    finally:
        other.kill()
        other.wait(timeout=10)


@pytest.mark.slow
def test_engines_answer_a_hang_in_bounded_time_and_stop_without_leftovers() -> None:
    engines = start_engines(2, activate=False)
    try:
        assert engines.ranks == 2 and engines.device == "cpu"
        ranks = engines.run(lambda: int(__import__("os").environ["OMPI_COMM_WORLD_RANK"]), timeout=60)
        assert ranks == [0, 1]
        started = time.monotonic()
        with pytest.raises(EnginesError, match="one of them hangs"):
            engines.run(time.sleep, 60, timeout=3)
        assert time.monotonic() - started < 15
    finally:
        engines.stop()
    assert processes_with_environment(CLUSTER_VARIABLE, engines.cluster.cluster_id) == []
    assert engines.stop() == []  # a second stop is harmless
