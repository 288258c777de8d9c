"""The `harness` command run in this process (harness.cli.main), as the unit tier runs it."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from harness.cli import main


def run_cli(capsys: pytest.CaptureFixture, argv: Sequence[str]) -> tuple[int, list[str]]:
    """`harness ARGV` in-process: its exit status and the lines it wrote to stderr."""
    capsys.readouterr()
    try:
        status = main(list(argv))
    except SystemExit as exit:  # argparse errors exit from inside the parser
        status = exit.code
    return status, capsys.readouterr().err.strip().splitlines()
