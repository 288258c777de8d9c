"""`harness launch`: start N local ranks of `harness train` for a backend with a real launcher."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import tempfile
from collections.abc import Sequence
from typing import Optional

from ..backends import backend_class
from ..errors import UsageError
from ..process.launchers import launch_environment, local_launcher


def launch_command(
    num_processes: int,
    backend: str,
    train_args: Sequence[str],
    launcher: Optional[str] = None,
    port: Optional[int] = None,
    subcommand: str = "train",
) -> list[str]:
    """The exact command that starts `num_processes` ranks of `harness train` (or `subcommand`) on this machine."""
    chosen = local_launcher(launcher or backend_class(backend).local_launcher)
    if num_processes < 1:
        raise UsageError(f"-n must be a positive number of processes, got {num_processes}")
    limit = backend_class(backend).max_world_size or chosen.max_processes  # the backend's, else the launcher's
    if limit is not None and num_processes > limit:
        raise UsageError(f"backend {backend!r} runs one process; use -n 1 or a distributed backend")
    program = ["-m", "harness", subcommand, "--backend", backend, *train_args]  # subcommand: train or evaluate
    return chosen.command(num_processes, program, port)


def run_launch(
    num_processes: int,
    backend: str,
    train_args: Sequence[str],
    launcher: Optional[str] = None,
    dry_run: bool = False,
    timeout: Optional[float] = None,
) -> int:
    """Run (or with dry_run print) the launch command; return its exit status."""
    command = launch_command(num_processes, backend, train_args, launcher)
    if dry_run:
        print(shlex.join(command))
        return 0
    completed = subprocess.run(command, env=launch_environment(), timeout=timeout)
    return completed.returncode


def launched_record(ranks: int, backend: str, train_args: Sequence[str], timeout: float = 900.0) -> dict:
    """Run `harness train TRAIN_ARGS` on `ranks` local ranks under the backend's own launcher and
    return its record (what benchmarks time); raises CalledProcessError if the run fails."""
    with tempfile.TemporaryDirectory() as tmp:
        results = os.path.join(tmp, "r.jsonl")
        command = launch_command(ranks, backend, [*train_args, "--results", results])
        subprocess.run(command, check=True, capture_output=True, env=launch_environment(), timeout=timeout)
        with open(results) as handle:
            return json.loads(handle.readline())
