"""Bad input through the `harness` command in a process of its own: exit status 2 and one stderr line.

The checks of each message run in-process (tests/unit/test_errors.py, test_bad_input_resilience.py,
test_data_errors.py); here one case of each way out of the command shows that `python -m harness`
passes the status and the single line on: a setting refused by train, a value argparse refuses, a
launch refused before it starts, and a Horovod that fails at import (which needs a fresh process).
Then the bad tasks that only ranks can see (tests/helpers/bad_tasks.py; the others are checked in
one process, tests/unit/test_tasks.py), under a real launcher.
"""

from __future__ import annotations

import os

import pytest

from harness.backends import BACKENDS
from harness.errors import EXIT_PREEMPTED, EXIT_USAGE
from harness.training.launch import launch_command
from tests.conftest import harness, run
from tests.helpers import bad_tasks
from tests.helpers.backend_cases import PREEMPTED_STATUS
from tests.helpers.checkpoint_helpers import output
from tests.unit.test_errors import CASES

WIRING = [
    ["train", "--batch-size", "0"],
    ["train", "--batch-size", "many"],
    ["launch", "-n", "2", "--backend", "ddp", "--launcher", "srun"],
]
WIRED = [case for case in CASES if case[0] in WIRING]


@pytest.mark.parametrize("args, message", WIRED, ids=[" ".join(args) for args, _ in WIRED])
def test_the_command_exits_2_with_one_line(args, message, tmp_path):
    results = tmp_path / "results.jsonl"
    is_train = args[0] == "train"
    result = harness(*args, *(["--results", str(results)] if is_train else []), timeout=120)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr
    assert lines[0].startswith(f"harness {args[0]}: error: "), lines[0]
    assert not results.exists()


def test_broken_horovod_build_is_reported_before_launch(tmp_path):
    # A Horovod built for another torch fails at import; simulate that import failure.
    fake = tmp_path / "site" / "horovod" / "torch"
    fake.mkdir(parents=True)
    (fake.parent / "__init__.py").write_text("")
    (fake / "__init__.py").write_text("raise ImportError('Extension horovod.torch has not been built')\n")
    result = harness(
        "launch",
        "-n",
        "2",
        "--backend",
        "horovod",
        "--",
        "--max-steps",
        "1",
        env={"PYTHONPATH": str(tmp_path / "site")},
        timeout=120,
    )
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert "horovod.torch cannot be loaded (Extension horovod.torch has not been built)" in line
    assert "make setup" in line


BAD_TASKS = os.path.abspath(bad_tasks.__file__)
PEER_TIMEOUT_S = 120
UNEVEN = (
    "parameters auxiliary.weight, auxiliary.bias got no gradient on some ranks' first batch and one on others'; "
    "backend {backend!r} needs every rank to reach the same parameters in every step (use ddp with "
    "--ddp-find-unused-parameters, horovod, or deepspeed --zero-stage 0)"
)
RANK_CASES = [
    # Rank 1's batches hold NaN: rank 1 alone sees it, and its line names it.
    pytest.param(
        "ddp", [], "nan_on_rank_1", " (rank 1): the loss is nan on the first training batch; fix", id="nan-on-rank-1"
    ),
    # The auxiliary head used on rank 0 only: every rank refuses, with the same line, once they can compare.
    pytest.param(
        "deepspeed",
        ["--zero-stage", "2"],
        "auxiliary_on_rank_0",
        ": " + UNEVEN.format(backend="deepspeed"),
        id="zero2-uneven-parameters",
    ),
    pytest.param("fsdp", [], "auxiliary_on_rank_0", ": " + UNEVEN.format(backend="fsdp"), id="fsdp-uneven-parameters"),
]


def _passing_status_on(backend: str) -> str:
    """A launcher of `backend` that exits with its ranks' status (mpirun, the deepspeed launcher)."""
    return next(name for name in BACKENDS[backend].local_launchers if PREEMPTED_STATUS[name] == EXIT_PREEMPTED)


@pytest.mark.parametrize("backend, flags, function, message", RANK_CASES)
def test_a_task_wrong_on_some_ranks_is_one_line_naming_it(tmp_path, backend, flags, function, message):
    """Every rank that prints says the same one line, naming the task, the fix and (where one rank
    alone sees it) the rank; the job exits 2 within seconds (no rank waits for --timeout) and appends
    nothing to --results."""
    spec, results = f"{BAD_TASKS}:{function}", tmp_path / "results.jsonl"
    args = ["--task", spec, *flags, "--batch-size", "16", "--max-steps", "3", "--threads", "1"]
    args += ["--calibration-steps", "0", "--timeout", str(PEER_TIMEOUT_S), "--results", str(results)]
    # Killed before a rank that waited for its peer would give up.
    result = run(launch_command(2, backend, args, _passing_status_on(backend)), timeout=PEER_TIMEOUT_S - 20)
    said = {line for line in (result.stdout + result.stderr).splitlines() if line.startswith("harness")}
    assert len(said) == 1, output(result)
    assert said.pop().startswith(f"harness train: error: task {spec!r}{message}"), output(result)
    assert result.returncode == EXIT_USAGE, output(result)
    assert not results.exists()
