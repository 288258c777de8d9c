"""The exit status of a whole job, as the launcher reports it, on one node: the documented status
for a failed run under every backend and launcher pair the backends declare (`local_launchers`).

A finished run under mpirun once exited 1: MPI was initialised (by mpi4py, which Horovod's backend
imports under mpirun and discovery uses across nodes), the CLI leaves through os._exit, which skips
mpi4py's MPI_Finalize, and OpenMPI's mpirun reports a rank that exits 0 without finalising as an
abnormal termination (harness.cli.finalize_mpi). That a finished run exits 0 under every pair is
shown by tests/integration/test_equivalence.py, whose runs take the pairs in turn. The failed run is a
preempted one: rank 0 gets SIGTERM after step 2 (HARNESS_TEST_SIGNAL), every rank stops at the same
step and exits with 3 (without a --checkpoint-dir there is nothing to write), each after MPI was
initialised where it is, so the status must come through the launcher unchanged where the launcher
passes it on. Under each backend's own launcher tests/integration/test_preemption.py asserts the same status;
here the other launchers. tests/multinode/ runs the same across nodes.
"""

from __future__ import annotations

import pytest

from harness.backends import BACKENDS
from harness.errors import EXIT_USAGE
from harness.process.launchers import launcher_command
from harness.training.launch import launch_command
from tests.conftest import run
from tests.helpers.backend_cases import PREEMPTED_STATUS, launcher_pairs
from tests.helpers.checkpoint_helpers import output

ARGS = [
    "--model",
    "cnn",
    "--dataset",
    "digits",
    "--batch-size",
    "16",
    "--threads",
    "1",
    "--eval-every",
    "0",
    "--calibration-steps",
    "0",
    "--timing-warmup-steps",
    "0",
    "--timeout",
    "30",
]
LIMIT_S = 240
# The pair where the bug was, fast enough for every test run; the others are slow.
QUICK = {("horovod", "mpirun")}
OTHER_LAUNCHERS = [
    (backend, launcher) for backend, launcher in launcher_pairs() if launcher != BACKENDS[backend].local_launcher
]


def _ranks(backend: str) -> int:
    return BACKENDS[backend].max_world_size or 2


@pytest.mark.parametrize(
    "backend, launcher",
    [
        pytest.param(
            backend,
            launcher,
            id=f"{backend}-{launcher}",
            marks=() if (backend, launcher) in QUICK else pytest.mark.slow,
        )
        for backend, launcher in OTHER_LAUNCHERS
    ],
)
def test_a_preempted_run_exits_with_the_documented_status(backend, launcher):
    result = run(
        launch_command(_ranks(backend), backend, [*ARGS, "--max-steps", "200"], launcher),
        timeout=LIMIT_S,
        env={"HARNESS_TEST_SIGNAL": "TERM@2:0"},
    )
    assert "stopped by SIGTERM after step" in result.stdout + result.stderr, output(result)
    assert result.returncode == PREEMPTED_STATUS[launcher], f"{backend} via {launcher}\n{output(result)}"


# The harness CLI in a process where MPI was initialised before it ran, as mpi4py does on import;
# {} is run first (a bad MASTER_PORT makes `harness env` fail with status 2 without loading torch).
CLI_AFTER_MPI = (
    "import os, sys; from mpi4py import MPI; from harness.cli import run_and_exit; {}"
    "sys.argv[0] = 'harness'; run_and_exit()"
)


@pytest.mark.parametrize(
    "setup, status", [("", 0), ("os.environ['MASTER_PORT'] = 'x'; ", EXIT_USAGE)], ids=["finished", "failed"]
)
def test_mpirun_reports_the_clis_status_when_mpi_was_initialised(setup, status):
    """Seconds, no training: the exit path alone. A finished command finalises MPI (else mpirun turns
    its 0 into 1); a failed one leaves without waiting in MPI_Finalize, and its status comes through."""
    pytest.importorskip("mpi4py", reason="mpi4py is not installed (run `make setup`)")
    result = run(launcher_command("mpirun", 2, ["-c", CLI_AFTER_MPI.format(setup), "env"]), timeout=120)
    assert result.returncode == status, output(result)
    assert 'exited without calling "finalize"' not in result.stderr
