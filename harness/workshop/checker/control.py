"""Controlling the ranks of a check: what they run, where they write, the timeout, and stack dumps.

The checker starts the script's real launcher on `ranks` local ranks, each running
`python -m harness.workshop.checker` (RANK_MODULE) with the check's fixed flags, in a temporary
run directory (RunDirectory says its layout). Every rank writes its pid and, on SIGUSR1, its
Python stack (faulthandler) into its own observations directory. At the check's timeout every rank
is asked for its stack, then the launcher's session and every rank are killed: a hung script ends
with where it hung. A rank that fails because a peer did asks the others for their stacks itself.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import re
import shlex
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Callable, Optional

from ...process.launchers import launch_environment, launcher_command
from ...process.processes import command_line
from ...study.scaling.equivalence import EQUIVALENCE_STEPS

RANK_MODULE = "harness.workshop.checker"  # what each rank runs: python -m RANK_MODULE (see its cli)
CHECK_BATCH = 16  # per rank
CHECK_EPOCHS = 2
STEPS_PER_EPOCH = EQUIVALENCE_STEPS // CHECK_EPOCHS
LEFTOVER_SAMPLES = 10  # after the last full global batch of an epoch: the drop-last tail
GLOBAL_LR = 0.05  # the LR of the global batch (harness.study.scaling.equivalence measured its bound at this LR)
# A step's own flags (todos.step_options), as the check gives them: 2 micro-batches of 8 (the split
# harness.study.scaling.equivalence measured its bound with), and bf16, which CPUs and recent GPUs run.
STEP_FLAGS = {"accumulation": ("--micro-batches", "2"), "precision": ("--precision", "bf16")}
STACK_DUMP_WAIT_S = 2.0
# A launcher's variables from around `harness check`: the launched ranks must get their own.
LAUNCHER_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
log = logging.getLogger("harness")


class RunDirectory:
    """A check's temporary directory: `output.log` (all the launcher and its ranks printed),
    `observations/rank-N/` (rank N's pid, stack.txt, and its record: observation.json, weights.pt)
    and `files/rank-N/` (rank N's working directory, where the script writes its files)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.output_log = path / "output.log"

    def observations(self, rank: int) -> Path:
        return self.path / "observations" / f"rank-{rank}"

    def files(self, rank: int) -> Path:
        return self.path / "files" / f"rank-{rank}"

    def rank_pids(self) -> list[int]:
        """The pids of the ranks still running (a pid whose process is gone, or now runs something
        else, is left out)."""
        pids = []
        for path in self.path.glob("observations/rank-*/pid"):
            try:
                pid = int(path.read_text())
                if RANK_MODULE in (command_line(pid) or ""):
                    pids.append(pid)
            except (OSError, ValueError):
                continue  # already gone
        return pids

    def signal_ranks(self, signal_number: int, but: Optional[int] = None) -> None:
        """Send `signal_number` to every rank still running, except the process `but`."""
        for pid in self.rank_pids():
            if pid != but:
                _signal(pid, signal_number)

    def stuck_at(self, rank: int, script: str) -> str:
        """Where a rank's stack dump says it was in the script, most recent frame first."""
        try:
            dump = (self.observations(rank) / "stack.txt").read_text()
        except OSError:
            return "an unknown place (it left no stack dump)"
        for match in re.finditer(r'File "(?P<file>[^"]+)", line (?P<line>\d+)', dump):
            if os.path.abspath(match["file"]) == os.path.abspath(script):
                number = int(match["line"])
                lines = Path(script).read_text().splitlines()
                return f"line {number} ({lines[number - 1].strip()})" if number <= len(lines) else f"line {number}"
        return "a place outside the script" if dump.strip() else "an unknown place (it left no stack dump)"


def collective_timeout(timeout: float) -> float:
    """How long a rank's collective waits for a peer: well before the check's `timeout`, so that a
    rank whose peer died fails with its framework's error instead of being killed."""
    return min(120.0, max(20.0, timeout / 4))


def script_flags(ranks: int) -> list[str]:
    """The flags every checked script runs with: seed 0, dropout off, CHECK_EPOCHS epochs of
    STEPS_PER_EPOCH global batches plus a drop-last tail, and the LR that trains the global batch
    at GLOBAL_LR."""
    samples = STEPS_PER_EPOCH * CHECK_BATCH * ranks + LEFTOVER_SAMPLES
    return [
        "--epochs",
        str(CHECK_EPOCHS),
        "--batch-size",
        str(CHECK_BATCH),
        "--lr",
        repr(GLOBAL_LR / ranks),
        "--seed",
        "0",
        "--dropout",
        "0",
        "--train-samples",
        str(samples),
        "--save",
        "model.pt",
    ]


def step_flags(options: frozenset[str]) -> list[str]:
    """The flags of a step's own that the check gives a script taking `options` (todos.step_options)."""
    return [flag for option in sorted(options) for flag in STEP_FLAGS.get(option, ())]


def rank_program(
    run: RunDirectory,
    timeout: float,
    backend: str,
    script: Path,
    ranks: int,
    nodes: int = 1,
    extra_flags: Sequence[str] = (),
    memory_budget_mib: Optional[float] = None,
) -> list[str]:
    """The Python arguments of every rank (for launcher_command): the rank entry, then the script
    and its flags (the check's, then `extra_flags`). `backend` is the registry name of the script's
    framework; with `nodes` > 1 each rank takes the place it would have with the ranks dealt out to
    that many nodes; with `memory_budget_mib`, the script may hold that much beyond the rank's own."""
    budget = [] if memory_budget_mib is None else ["--memory-budget-mib", repr(memory_budget_mib)]
    return [
        "-m",
        RANK_MODULE,
        "--simulate-nodes",
        str(nodes),
        *budget,
        str(run.path),
        repr(collective_timeout(timeout)),
        backend,
        str(script),
        *script_flags(ranks),
        *extra_flags,
    ]


def run_launcher(command: Sequence[str], run: RunDirectory, timeout: float) -> tuple[Optional[int], bool]:
    """Run the launcher; (exit status, timed out). At the timeout every rank dumps its stack, then
    the launcher's session and every rank are killed."""
    environment = launch_environment()
    for name in LAUNCHER_VARIABLES:
        environment.pop(name, None)
    with open(run.output_log, "w") as output:
        process = subprocess.Popen(
            list(command),
            cwd=run.path,
            env=environment,
            stdout=output,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            return process.wait(timeout=timeout), False
        except subprocess.TimeoutExpired:
            run.signal_ranks(signal.SIGUSR1)
            time.sleep(STACK_DUMP_WAIT_S)
            return None, True
        finally:
            if process.poll() is None:
                try:
                    os.killpg(process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                process.wait()
            run.signal_ranks(signal.SIGKILL)  # ranks a launcher started in sessions of their own


# How a check's ranks start: (launcher, ranks, the Python program each runs, the run directory,
# timeout) -> (exit status, timed out). `launch_locally` by default; a test's cluster may start
# them across its nodes.
Launch = Callable[[str, int, list[str], RunDirectory, float], tuple[Optional[int], bool]]


def launch_locally(
    launcher: str, ranks: int, program: list[str], run: RunDirectory, timeout: float
) -> tuple[Optional[int], bool]:
    """The ranks on this machine, under `launcher`'s local command (run_launcher)."""
    command = launcher_command(launcher, ranks, program)
    log.info("harness check: %d ranks under %s: %s", ranks, launcher, shlex.join(command))
    return run_launcher(command, run, timeout)


def enable_stack_dumps(observations: Path) -> None:
    """In a rank: write its pid beside its record and dump its Python stack there on SIGUSR1."""
    (observations / "pid").write_text(str(os.getpid()))
    # faulthandler holds the file (open) for as long as the handler stays registered: the rank's life.
    faulthandler.register(signal.SIGUSR1, file=open(observations / "stack.txt", "w"), all_threads=False)


def ask_peers_for_stacks(run: RunDirectory) -> None:
    """In a rank whose peer failed: have the other ranks dump their stacks before the launcher ends them."""
    run.signal_ranks(signal.SIGUSR1, but=os.getpid())
    time.sleep(STACK_DUMP_WAIT_S / 4)


def _signal(pid: int, signal_number: int) -> None:
    try:
        os.kill(pid, signal_number)
    except ProcessLookupError:
        pass
