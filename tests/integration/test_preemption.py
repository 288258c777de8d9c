"""Preemption and exact resume, for every backend and option set.

Each backend's default options run under its own launcher, whose exit status is the documented one,
on a task the kit does not ship (tests/helpers/tasks.py, taken in turn: `regression`, whose batch-norm
statistics are each rank's own, and `tokens`, whose dropout draws from every rank's RNG); its other
option sets (DeepSpeed's ZeRO stages, FSDP's keep-gathered) change what is written and read, not how
the ranks start, and run on the built-in CNN under torchrun where the backend allows it (DeepSpeed's
launcher adds about 5 s of start-up and shutdown polling to each of the case's three runs).

A SIGTERM reaches one rank mid-epoch (HARNESS_TEST_SIGNAL: a real os.kill at an exact step, see
harness.process.preemption). The ranks finish their step and the next (they vote on the signal
during it), a checkpoint is written, the ranks exit with status 3 and nothing is appended to
--results. `--resume auto` then finishes the run: its weights equal an uninterrupted run's to 1e-6 and its record counts every sample once.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import time

import pytest

from harness.backends import BACKENDS
from harness.process.launchers import launch_environment
from harness.training.launch import launch_command
from tests.conftest import REPO, launch, run
from tests.helpers.backend_cases import PREEMPTED_STATUS, with_options
from tests.helpers.checkpoint_helpers import (
    CNN_TASK,
    COMMON,
    RANKS,
    RUN,
    STEPS_PER_EPOCH,
    TEST_TASKS,
    TOTAL_STEPS,
    checkpoint_steps,
    launch_may_fail,
    output,
    rank_processes,
    records,
    signal_all,
)
from tests.helpers.weights import load_weights, max_abs_difference

SIGNAL_AFTER = 15
STOP_AFTER = 16  # the ranks vote during the next step: epoch 1, step 5 of 11, after the epoch-0 checkpoint


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """Weights and record of the uninterrupted run, per (backend, flags), computed once."""
    cache = {}

    def get(task, backend, flags, launcher=None):
        key = (*task, backend, *flags)
        if key not in cache:
            out = tmp_path_factory.mktemp("reference")
            launch(
                RANKS,
                backend,
                [*task, *RUN, *flags, "--save-model", str(out / "model.pt"), "--results", str(out / "results.jsonl")],
                launcher,
            )
            cache[key] = load_weights(out / "model.pt"), records(out / "results.jsonl")[0]
        return cache[key]

    return get


def _preemption_cases() -> list:
    """(task, backend, flags, launcher): the default options on a test task (in turn) under the
    backend's own launcher, the others on the CNN under torchrun where the backend runs there."""
    cases, test_tasks = [], itertools.cycle(TEST_TASKS)
    for case in with_options():
        backend, flags = case.values
        cls = BACKENDS[backend]
        own = not flags or "torchrun" not in cls.local_launchers
        launcher = cls.local_launcher if own else "torchrun"
        name = next(test_tasks) if not flags else "cnn"
        task = TEST_TASKS[name] if not flags else CNN_TASK
        cases.append(pytest.param(task, backend, flags, launcher, id=f"{name}-{case.id}-{launcher}"))
    return cases


# ddp's default case, which the preemption from outside shares its uninterrupted run with.
DDP_TASK = next(case.values[0] for case in _preemption_cases() if case.values[1:3] == ("ddp", []))


def _assert_resumes_exactly(
    tmp_path, task, backend, flags, checkpoints, results, reference, stopped_after, launcher=None
):
    model = tmp_path / "resumed.pt"
    launch(
        RANKS,
        backend,
        [
            *task,
            *RUN,
            *flags,
            "--checkpoint-dir",
            str(checkpoints),
            "--checkpoint-every",
            "4",
            "--resume",
            "auto",
            "--save-model",
            str(model),
            "--results",
            str(results),
        ],
        launcher,
    )
    reference_weights, reference_record = reference
    difference = max_abs_difference(load_weights(model), reference_weights)
    assert difference <= 1e-6, f"{backend}: resumed weights differ by {difference:.3g} from the uninterrupted run"
    (record,) = records(results)  # the preempted segment appended nothing
    assert record["steps"] == TOTAL_STEPS and record["samples_seen"] == TOTAL_STEPS * 128
    assert record["resumed_from_step"] == stopped_after and record["segments"] == 2
    assert record["train_losses"] == pytest.approx(reference_record["train_losses"], rel=1e-6)
    scores = {key: value for key, value in reference_record.items() if key.startswith("eval_")}
    assert {key: record[key] for key in scores} == pytest.approx(scores, rel=1e-6)


@pytest.mark.slow
# Under every option set a backend's Options.examples name (DeepSpeed's ZeRO stages write other files:
# from ZeRO-2 on, the optimizer state partitioned, one file per rank).
@pytest.mark.parametrize("task, backend, flags, launcher", _preemption_cases())
def test_sigterm_on_one_rank_checkpoints_and_the_run_resumes_exactly(
    tmp_path, uninterrupted, task, backend, flags, launcher
):
    checkpoints, results = tmp_path / "checkpoints", tmp_path / "results.jsonl"
    stopped = launch_may_fail(
        backend,
        [
            *task,
            *RUN,
            *flags,
            "--checkpoint-dir",
            str(checkpoints),
            "--checkpoint-every",
            "4",
            "--results",
            str(results),
        ],
        env={"HARNESS_TEST_SIGNAL": f"TERM@{SIGNAL_AFTER}:1"},
        launcher=launcher,
    )
    # The documented status through this launcher (tests/integration/test_exit_status.py: every launcher's).
    assert stopped.returncode == PREEMPTED_STATUS[launcher], output(stopped)
    message = (
        f"stopped by a signal another rank received after step {STOP_AFTER} of {TOTAL_STEPS}; checkpoint "
        f"{checkpoints}/step-{STOP_AFTER:08d} is written; resubmit with --resume auto"
    )
    assert message in stopped.stderr + stopped.stdout, output(stopped)
    # Every 4 steps and at the epoch end (11), the newest 3 kept; the last one where the ranks stopped.
    assert checkpoint_steps(checkpoints) == [STEPS_PER_EPOCH, 12, STOP_AFTER]
    assert records(results) == []
    reference = uninterrupted(task, backend, flags, launcher)
    _assert_resumes_exactly(tmp_path, task, backend, flags, checkpoints, results, reference, STOP_AFTER, launcher)


@pytest.mark.slow
def test_sigterm_from_outside_to_every_rank_under_mpirun(tmp_path, uninterrupted):
    """As Slurm or PBS do it: every rank gets SIGTERM at some moment; mpirun passes status 3 on."""
    checkpoints, results = tmp_path / "checkpoints", tmp_path / "results.jsonl"
    command = launch_command(
        RANKS,
        "ddp",
        [*DDP_TASK, *RUN, "--checkpoint-dir", str(checkpoints), "--checkpoint-every", "4", "--results", str(results)],
        launcher="mpirun",
    )
    job = subprocess.Popen(
        command, cwd=REPO, env=launch_environment(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 240
        while not (checkpoints.is_dir() and checkpoint_steps(checkpoints)):  # training is under way
            assert job.poll() is None and time.monotonic() < deadline, "the job ended before its first checkpoint"
            time.sleep(0.05)
        signal_all(rank_processes(job.pid), signal.SIGTERM)
        stdout, stderr = job.communicate(timeout=120)
    finally:
        job.kill()
    result = subprocess.CompletedProcess(command, job.returncode, stdout, stderr)
    assert job.returncode == 3, output(result)
    stopped_after = checkpoint_steps(checkpoints)[-1]
    assert 4 <= stopped_after < TOTAL_STEPS and f"after step {stopped_after} of {TOTAL_STEPS}" in stderr
    assert records(results) == []
    reference = uninterrupted(DDP_TASK, "ddp", [])
    _assert_resumes_exactly(tmp_path, DDP_TASK, "ddp", [], checkpoints, results, reference, stopped_after)


@pytest.mark.slow
def test_sigterm_to_every_process_of_the_job_with_data_loader_workers(tmp_path):
    """As PBS does at the walltime: the training process and its data-loader workers all get SIGTERM."""
    checkpoints, model = tmp_path / "checkpoints", tmp_path / "model.pt"
    args = [
        sys.executable,
        "-m",
        "harness",
        "train",
        *COMMON,
        "--batch-size",
        "128",
        "--checkpoint-dir",
        str(checkpoints),
        "--checkpoint-every",
        "3",
        "--num-workers",
        "2",
    ]
    job = subprocess.Popen(
        args,
        cwd=REPO,
        env=launch_environment(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 240
        while not (checkpoints.is_dir() and checkpoint_steps(checkpoints)):
            assert job.poll() is None and time.monotonic() < deadline, "the job ended before its first checkpoint"
            time.sleep(0.05)
        os.killpg(job.pid, signal.SIGTERM)
        stdout, stderr = job.communicate(timeout=120)
    finally:
        job.kill()
    assert job.returncode == 3, stderr[-3000:]
    stopped_after = checkpoint_steps(checkpoints)[-1]
    (line,) = [line for line in stderr.splitlines() if "stopped by" in line]
    assert line.startswith(f"harness train: stopped by SIGTERM after step {stopped_after} of {TOTAL_STEPS}")
    resumed = run([*args, "--resume", "auto", "--save-model", str(model)], timeout=240)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    reference = tmp_path / "reference.pt"  # uninterrupted, loading in the training process
    finished = run([*args[: args.index("--checkpoint-dir")], "--save-model", str(reference)], timeout=240)
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert max_abs_difference(load_weights(model), load_weights(reference)) <= 1e-6
