"""`check_script`: one attendee's script in, a verdict out.

It recognises the script's framework and the step flags it takes (todos), launches the script on
its ranks with the check's flags and collects their records (control, observe), judges them (judge)
and writes each failed property as one line naming the TODO that governs it (todos.TodoIndex). A
script that takes the resume flags runs twice more, stopped after an epoch and resumed (resume); one
that takes the model's size once more, on a large model within a memory budget a rank (memory);
each run with the check's timeout.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import torch

from ...errors import EXIT_OK, UsageError, require
from .. import exercise
from .control import GLOBAL_LR, Launch, RunDirectory, launch_locally, rank_program, step_flags
from .judge import judge, pass_line, run_failure
from .memory import MEMORY_BUDGET_MIB, MEMORY_FLAGS, MEMORY_RANKS, memory_failure, memory_line
from .observe import EXIT_FAILED, Observation
from .resume import check_resume, resume_flags, resumed_line
from .todos import Failure, Framework, TodoIndex, framework_of, step_options


@dataclass
class CheckResult:
    """What `check_script` found. `status` is the exit status (0 passed, 1 failed); `lines` what
    `harness check` prints; `weights` rank 0's final weights (None if the run did not finish)."""

    status: int
    lines: list[str]
    failures: list[Failure] = field(default_factory=list)
    weights: Optional[dict[str, torch.Tensor]] = None

    @property
    def passed(self) -> bool:
        return self.status == EXIT_OK


def _warm_up() -> None:
    """Load the digits (cached for the process) and what torch.optim imports on first use."""
    exercise.digits("test")
    torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=GLOBAL_LR)


def _script_to_run(path: Path, run: RunDirectory) -> Path:
    if path.suffix == ".py":
        return path
    jupytext = require("jupytext", "checking a notebook", "pip install jupytext (make setup installs it)")
    script = run.path / f"{path.stem}.py"
    script.write_text(jupytext.writes(jupytext.read(path), fmt="py:percent"))
    return script


def _check_input(path: str, ranks: int, timeout: float, simulate_nodes: int) -> Path:
    source_path = Path(path)
    if not source_path.is_file():
        raise UsageError(f"{path} does not exist; give the path of your script, e.g. exercises/02_ddp.py")
    if source_path.suffix not in (".py", ".ipynb"):
        raise UsageError(f"{path} is neither a Python script (.py) nor a notebook (.ipynb)")
    if ranks < 2:
        raise UsageError(f"--ranks must be at least 2 to check data parallelism, got {ranks}")
    if not timeout > 0:
        raise UsageError(f"--timeout must be positive, got {timeout}")
    if simulate_nodes < 1 or ranks % simulate_nodes:
        raise UsageError(f"--simulate-nodes must be at least 1 and divide --ranks {ranks}, got {simulate_nodes}")
    return source_path


@dataclass(frozen=True)
class _Runs:
    """How each run of one check starts: the script, its framework, and the check's settings."""

    script: Path
    framework: Framework
    ranks: int
    timeout: float
    simulate_nodes: int
    launch: Launch
    flags: tuple[str, ...]  # the step's own (control.step_flags)

    def run(
        self, run: RunDirectory, extra_flags: tuple[str, ...] = (), memory_budget_mib: Optional[float] = None
    ) -> tuple[list[Observation], Optional[Failure]]:
        """Launch the ranks in `run`: every rank's record, or the line of a run that did not finish."""
        run.path.mkdir(parents=True, exist_ok=True)
        flags = [*self.flags, *extra_flags]
        backend, script = self.framework.backend, self.script
        program = rank_program(
            run, self.timeout, backend, script, self.ranks, self.simulate_nodes, flags, memory_budget_mib
        )
        status, timed_out = self.launch(self.framework.launcher, self.ranks, program, run, self.timeout)
        observations = {rank: Observation.read(run.observations(rank)) for rank in range(self.ranks)}
        stopped = run_failure(
            observations, self.ranks, status, timed_out, self.timeout, run, str(script), self.framework
        )
        if stopped is not None:
            return [], stopped
        return [observation for observation in observations.values() if observation is not None], None


def _check_resume(runs: _Runs, run: RunDirectory, straight: list[Observation]) -> tuple[list[Failure], str]:
    """Property 12: the script stopped after an epoch, then resumed, against the run `straight`.
    The failures, or what the PASS line adds."""
    stop, resume = resume_flags(run.path / "checkpoint.pt")
    records = []
    for name, flags in (("stopped", stop), ("resumed", resume)):
        observations, stopped = runs.run(RunDirectory(run.path / name), tuple(flags))
        if stopped is not None:
            observed = f"the run with {' '.join(flags[2:])} did not finish: {stopped.observed}"
            return [Failure("resume", observed, stopped.keys)], ""
        records.append(observations)
    failures = check_resume(straight, *records)
    return failures, "" if failures else resumed_line(*records)


def _check_memory(runs: _Runs, run: RunDirectory, _: list[Observation]) -> tuple[list[Failure], str]:
    """Property 13: the script on a large model within the memory budget. The failures, or what the
    PASS line adds."""
    memory_runs = dataclasses.replace(runs, ranks=MEMORY_RANKS, simulate_nodes=1)
    _, stopped = memory_runs.run(RunDirectory(run.path / "memory"), MEMORY_FLAGS, MEMORY_BUDGET_MIB)
    if stopped is not None:
        return [memory_failure(stopped)], ""
    return [], memory_line()


def _line(failure: Failure, index: TodoIndex) -> str:
    """`harness check`'s line for a failed property: what was seen, and the TODO behind it."""
    return f"FAIL {failure.name}: {failure.observed}" + (f" -> {index.describe(failure.keys)}" if failure.keys else "")


def check_script(
    path: str, ranks: int = 2, timeout: float = 300.0, simulate_nodes: int = 1, launch: Launch = launch_locally
) -> CheckResult:
    """Run the script (or notebook) at `path` on `ranks` local ranks under its framework's real
    launcher and judge it (harness.workshop.checker's docstring says how); with `simulate_nodes` > 1
    each rank takes the place it would have on one of that many nodes (checker.devices); `launch`
    starts the ranks (control.Launch: here, or across a cluster's nodes). Returns a CheckResult;
    raises UsageError for bad input (a missing file, no distributed framework imported, ranks < 2,
    nodes that do not divide the ranks)."""
    source_path = _check_input(path, ranks, timeout, simulate_nodes)
    run = RunDirectory(Path(tempfile.mkdtemp(prefix="harness-check-")))
    keep_run_dir = False
    try:
        script = _script_to_run(source_path.resolve(), run)
        framework = framework_of(script.read_text(), path)
        options = step_options(script.read_text())
        runs = _Runs(script, framework, ranks, timeout, simulate_nodes, launch, tuple(step_flags(options)))
        # While the ranks run, this process loads what judging needs (seconds of its own otherwise).
        warm_up = threading.Thread(target=_warm_up, daemon=True)
        warm_up.start()
        finished, stopped = runs.run(run)
        warm_up.join()
        index = TodoIndex(source_path.with_suffix(".py").name, framework)
        if stopped is not None:
            keep_run_dir = str(run.path) in stopped.observed
            return CheckResult(EXIT_FAILED, [_line(stopped, index)], [stopped])
        failures = judge(finished, framework, ranks, run)
        passed = pass_line(finished, ranks, framework)
        for option, extra_check in (("resume", _check_resume), ("memory", _check_memory)):
            if option in options:
                found, added = extra_check(runs, run, finished)
                keep_run_dir = keep_run_dir or any(str(run.path) in failure.observed for failure in found)
                failures, passed = failures + found, passed + added
        weights = finished[0].final
        if failures:
            return CheckResult(EXIT_FAILED, [_line(failure, index) for failure in failures], failures, weights)
        return CheckResult(EXIT_OK, [passed], [], weights)
    finally:
        if not keep_run_dir:
            shutil.rmtree(run.path, ignore_errors=True)
