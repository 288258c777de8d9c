"""harness launch --dry-run as a command: the launch line it prints, and its flags checked first.

A task of one's own reaches every rank as its spec and arguments, passed on as given: each rank
imports it itself (harness.tasks.loading), so nothing is pickled between processes."""

from __future__ import annotations

import shlex

import pytest

from harness.tasks.registry import builtin_tasks
from tests.conftest import harness
from tests.helpers import tasks

TASK = tasks.flags("regression", width=8)

EXPECTED = {
    # launcher: tokens that must appear, in this order
    "torchrun": ["-m", "torch.distributed.run", "--nproc-per-node", "3", "-m", "harness", "train"],
    "mpirun": ["mpirun", "-np", "3", "--oversubscribe", "--bind-to", "none", "-m", "harness", "train"],
    "horovodrun": ["horovodrun", "--gloo", "-np", "3", "-H", "localhost:3", "-m", "harness", "train"],
    "deepspeed": ["deepspeed", "--num_gpus", "3", "--no_local_rank", "--module", "harness", "train"],
}


def _in_order(tokens, expected):
    position = 0
    for token in tokens:
        if position < len(expected) and (token == expected[position] or token.endswith("/" + expected[position])):
            position += 1
    return position == len(expected)


@pytest.mark.parametrize("launcher", sorted(EXPECTED))
def test_dry_run_prints_the_real_launch_command(launcher):
    result = harness(
        "launch",
        "-n",
        "3",
        "--backend",
        "ddp",
        "--launcher",
        launcher,
        "--dry-run",
        "--",
        *TASK,
        "--batch-size",
        "16",
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    tokens = shlex.split(result.stdout.strip())
    assert _in_order(tokens, EXPECTED[launcher]), tokens
    assert tokens[-8:] == ["--backend", "ddp", *TASK, "--batch-size", "16"]


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--batch-size", "-3"], "--batch-size must be a positive integer"),
        (
            ["--task", "digits-cnn"],
            f"unknown task 'digits-cnn'; choose a built-in task ({', '.join(builtin_tasks())}) or give MODULE:FUNCTION",
        ),
        ([*TASK, "--model", "resnet18"], "--model is an argument of task images; drop it or use --task images"),
    ],
    ids=["batch", "task", "argument of another task"],
)
def test_dry_run_validates_flags_before_printing(flags, message):
    result = harness("launch", "-n", "2", "--dry-run", "--", *flags, timeout=60)
    (line,) = result.stderr.strip().splitlines()
    assert result.returncode == 2 and line.startswith("harness launch: error: ") and message in line, result.stderr
    assert result.stdout == ""
