"""harness launch --dry-run as a command: the launch line it prints, and its flags checked first."""

from __future__ import annotations

import shlex

import pytest

from tests.conftest import harness

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
        "--epochs",
        "2",
        "--batch-size",
        "16",
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    tokens = shlex.split(result.stdout.strip())
    assert _in_order(tokens, EXPECTED[launcher]), tokens
    assert tokens[-6:] == ["--backend", "ddp", "--epochs", "2", "--batch-size", "16"]


def test_dry_run_validates_flags_before_printing():
    result = harness("launch", "-n", "2", "--dry-run", "--", "--batch-size", "-3", timeout=60)
    assert result.returncode == 2 and "--batch-size must be a positive integer" in result.stderr
    assert result.stdout == ""
