"""The exit status of a whole job, as the launcher reports it, on one node: 0 for a finished run and
the documented status for a failed one, under every backend and launcher pair the README lists.

A finished run under mpirun once exited 1: MPI was initialised (by mpi4py, which Horovod's backend
imports under mpirun and discovery uses across nodes), the CLI leaves through os._exit, which skips
mpi4py's MPI_Finalize, and OpenMPI's mpirun reports a rank that exits 0 without finalising as an
abnormal termination (harness.cli.finalize_mpi). The failed run is a preempted one: rank 0 gets
SIGTERM after step 2 (HARNESS_TEST_SIGNAL), every rank stops at the same step and exits with 3
(without a --checkpoint-dir there is nothing to write), each after MPI was initialised where it
is, so the status must come through the launcher unchanged where the launcher passes it on.
tests/multinode/ runs the same across nodes.
"""

from __future__ import annotations

from typing import List, Tuple

import pytest

from harness.errors import EXIT_PREEMPTED, EXIT_USAGE
from harness.process.launchers import launcher_command
from harness.training.launch import launch_command

from .checkpoint_helpers import output
from .conftest import run

ARGS = ["--model", "cnn", "--dataset", "digits", "--batch-size", "16", "--threads", "1", "--eval-every", "0",
        "--calibration-steps", "0", "--timing-warmup-steps", "0", "--timeout", "30"]
FINISHED_STEPS = 3
LIMIT_S = 240
# (backend, launcher) as the README's backends-and-launchers table lists them: each backend under
# its own launcher and mpirun, and every backend but horovod under every launcher.
PAIRS: List[Tuple[str, str]] = [
    ("none", "python"),
    ("ddp", "torchrun"), ("ddp", "mpirun"), ("ddp", "horovodrun"), ("ddp", "deepspeed"),
    ("horovod", "horovodrun"), ("horovod", "mpirun"),
    ("deepspeed", "deepspeed"), ("deepspeed", "mpirun"), ("deepspeed", "torchrun"), ("deepspeed", "horovodrun"),
]
# The pair where the bug was, fast enough for every test run; the others are slow.
QUICK = {("horovod", "mpirun")}
# What each launcher reports when its ranks exit with 3 (measured): mpirun and the deepspeed launcher
# pass the ranks' status on; torchrun and horovodrun report any failed worker as 1.
FAILED_STATUS = {"python": EXIT_PREEMPTED, "mpirun": EXIT_PREEMPTED, "deepspeed": EXIT_PREEMPTED, "torchrun": 1,
                 "horovodrun": 1}


def _params(pairs: List[Tuple[str, str]]):
    return [pytest.param(backend, launcher, id=f"{backend}-{launcher}",
                         marks=() if (backend, launcher) in QUICK else pytest.mark.slow) for backend, launcher in pairs]


def _ranks(backend: str) -> int:
    return 1 if backend == "none" else 2


@pytest.mark.parametrize("backend, launcher", _params(PAIRS))
def test_a_finished_run_exits_0(backend, launcher):
    result = run(launch_command(_ranks(backend), backend, [*ARGS, "--max-steps", str(FINISHED_STEPS)], launcher),
                 timeout=LIMIT_S)
    assert result.returncode == 0, f"{backend} via {launcher}: a finished run\n{output(result)}"


@pytest.mark.parametrize("backend, launcher", _params(PAIRS))
def test_a_preempted_run_exits_with_the_documented_status(backend, launcher):
    result = run(launch_command(_ranks(backend), backend, [*ARGS, "--max-steps", "200"], launcher), timeout=LIMIT_S,
                 env={"HARNESS_TEST_SIGNAL": "TERM@2:0"})
    assert "stopped by SIGTERM after step" in result.stdout + result.stderr, output(result)
    assert result.returncode == FAILED_STATUS[launcher], f"{backend} via {launcher}\n{output(result)}"


# The harness CLI in a process where MPI was initialised before it ran, as mpi4py does on import;
# {} is run first (a bad MASTER_PORT makes `harness env` fail with status 2 without loading torch).
CLI_AFTER_MPI = ("import os, sys; from mpi4py import MPI; from harness.cli import run_and_exit; {}"
                 "sys.argv[0] = 'harness'; run_and_exit()")


@pytest.mark.parametrize("setup, status", [("", 0), ("os.environ['MASTER_PORT'] = 'x'; ", EXIT_USAGE)],
                         ids=["finished", "failed"])
def test_mpirun_reports_the_clis_status_when_mpi_was_initialised(setup, status):
    """Seconds, no training: the exit path alone. A finished command finalises MPI (else mpirun turns
    its 0 into 1); a failed one leaves without waiting in MPI_Finalize, and its status comes through."""
    pytest.importorskip("mpi4py", reason="mpi4py is not installed (run `make setup`)")
    result = run(launcher_command("mpirun", 2, ["-c", CLI_AFTER_MPI.format(setup), "env"]), timeout=120)
    assert result.returncode == status, output(result)
    assert "exited without calling \"finalize\"" not in result.stderr
