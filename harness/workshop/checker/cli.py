"""The checker's command lines: `harness check FILE` (check_command, which harness.cli runs) and
`python -m harness.workshop.checker [--simulate-nodes N] [--memory-budget-mib M] RUN_DIR TIMEOUT BACKEND SCRIPT ARGS...`,
one rank of a check, which the script's launcher starts on every rank (control.rank_program
writes its arguments)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import NoReturn

from .check import check_script
from .control import RANK_MODULE
from .observe import run_rank


def check_command(path: str, ranks: int = 2, timeout: float = 300.0, simulate_nodes: int = 1) -> int:
    """`harness check`: print the verdict lines and return the exit status (0 PASS, 1 FAIL; bad
    input raises UsageError, which the CLI prints as one line with status 2)."""
    result = check_script(path, ranks=ranks, timeout=timeout, simulate_nodes=simulate_nodes)
    for line in result.lines:
        print(line, flush=True)
    return result.status


def rank_main(argv: Sequence[str]) -> NoReturn:
    """One rank of `harness check`, as its launcher starts it; never returns (run_rank exits)."""
    parser = argparse.ArgumentParser(
        prog=f"python -m {RANK_MODULE}", description="one rank of `harness check` (started by its launcher)"
    )
    parser.add_argument("--simulate-nodes", type=int, default=1, help="nodes the ranks are dealt out to")
    parser.add_argument(
        "--memory-budget-mib", type=float, default=None, help="memory the script may hold beyond the rank's own"
    )
    parser.add_argument("run_dir")
    parser.add_argument("collective_timeout", type=float)
    parser.add_argument("backend", help="the registry name of the script's framework")
    parser.add_argument("script")
    parser.add_argument("script_args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    run_rank(
        args.run_dir,
        args.collective_timeout,
        args.backend,
        args.script,
        args.script_args,
        args.simulate_nodes,
        args.memory_budget_mib,
    )
