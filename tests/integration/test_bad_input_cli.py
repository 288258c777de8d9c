"""Bad input through the `harness` command in a process of its own: exit status 2 and one stderr line.

The checks of each message run in-process (tests/unit/test_errors.py, test_bad_input_resilience.py,
test_data_errors.py); here one case of each way out of the command shows that `python -m harness`
passes the status and the single line on: a setting refused by train, a value argparse refuses, a
launch refused before it starts, and a Horovod that fails at import (which needs a fresh process).
"""

from __future__ import annotations

import pytest

from tests.conftest import harness
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
