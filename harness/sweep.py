"""`harness sweep`: one scaling study, every backend x rank count x repeat, into one JSONL file.

Weak scaling keeps the batch per worker fixed (--batch-size); strong scaling keeps the global
batch fixed (--global-batch, default --batch-size) and splits it over the workers. Every run is a
plain `harness train`, so every backend is measured by the same loop, window and formula; the
sweep adds the tags `scaling`, `repeat` and `sweep_id` to each record. Repeats are interleaved
(all configurations once, then all again) so slow drifts of a shared machine spread evenly.

Where runs start:
- locally, through `harness.launch.launch_command`: each backend's real launcher (torchrun,
  horovodrun, deepspeed, or --launcher for all);
- inside a PBS or Slurm allocation (PBS_NODEFILE or SLURM_JOB_ID set), or whenever
  --launch-template is given, through the site launcher, from a template whose placeholders are
      {ranks}    total ranks of the run
      {ppn}      ranks per node: min(ranks, --ppn)
      {nodes}    nodes the run spans: ceil(ranks / ppn)
      {python}   this Python interpreter
      {backend}  the run's backend
      {args}     the run's `harness train` flags, shell-quoted (they include --backend)
  e.g. PBS_TEMPLATE and SLURM_TEMPLATE below, the defaults in those allocations.
"""

from __future__ import annotations

import math
import os
import shlex
import string
import subprocess
import sys
import uuid
from dataclasses import dataclass, field
from typing import List, Mapping, Optional, Sequence, Tuple

from .backends import BACKENDS, get_backend
from .errors import UsageError
from .launch import launch_command, launch_environment
from .results import read_records

SCALING_MODES = ("weak", "strong")
PBS_TEMPLATE = "mpiexec -n {ranks} --ppn {ppn} {python} -m harness train {args}"
SLURM_TEMPLATE = "srun --nodes {nodes} --ntasks {ranks} --ntasks-per-node {ppn} {python} -m harness train {args}"
TEMPLATE_FIELDS = ("ranks", "ppn", "nodes", "python", "backend", "args")
SINGLE_PROCESS_BACKEND = "none"


@dataclass
class SweepSettings:
    """What `harness sweep` was asked to run."""

    backends: List[str]
    ranks: List[int]
    scaling: str
    results: str
    train_args: List[str] = field(default_factory=list)  # `harness train` flags shared by every run
    repeats: int = 1
    launch_template: Optional[str] = None
    launcher: Optional[str] = None  # local runs: override each backend's own launcher
    ppn: Optional[int] = None  # ranks per node inside an allocation (default: GPUs per node, or 1)
    sweep_id: Optional[str] = None
    run_timeout: float = 3600.0
    dry_run: bool = False


@dataclass(frozen=True)
class SweepRun:
    """One `harness train` run of the sweep and the exact command that starts it."""

    backend: str
    ranks: int
    repeat: int
    command: Tuple[str, ...]


def parse_list(text: str, what: str) -> List[str]:
    """Comma-separated values, without blanks or duplicates (order kept)."""
    values = [part.strip() for part in text.split(",") if part.strip()]
    if not values:
        example = "1,2,4" if what == "ranks" else "ddp,horovod"
        raise UsageError(f"--{what} needs at least one value, e.g. --{what} {example}")
    return list(dict.fromkeys(values))


def parse_ranks(text: str) -> List[int]:
    """Rank counts such as '1,2,4', each a positive integer."""
    ranks = []
    for part in parse_list(text, "ranks"):
        if not part.isdigit() or int(part) < 1:
            raise UsageError(f"--ranks takes positive integers separated by commas, got {part!r}")
        ranks.append(int(part))
    return sorted(set(ranks))


def allocation_template(environ: Mapping[str, str]) -> Optional[str]:
    """The default launch template when this process runs inside a PBS or Slurm allocation."""
    if environ.get("PBS_NODEFILE"):
        return PBS_TEMPLATE
    if environ.get("SLURM_JOB_ID"):
        return SLURM_TEMPLATE
    return None


def check_template(template: str) -> None:
    """Raise UsageError for a template with unknown or malformed placeholders."""
    try:
        names = {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}
    except ValueError as exc:
        raise UsageError(f"--launch-template {template!r} is malformed ({exc}); "
                         "write placeholders as {ranks}") from exc
    unknown = sorted(names - set(TEMPLATE_FIELDS))
    if unknown:
        raise UsageError(f"--launch-template uses unknown placeholders {unknown}; "
                         f"known: {', '.join('{' + name + '}' for name in TEMPLATE_FIELDS)}")
    if "args" not in names:
        raise UsageError("--launch-template must contain {args}, where the `harness train` flags go")


def template_command(template: str, ranks: int, ppn: int, backend: str, train_args: Sequence[str]) -> List[str]:
    """The site-launcher command for one run, from a checked template."""
    ppn = min(ranks, ppn)
    text = template.format(ranks=ranks, ppn=ppn, nodes=math.ceil(ranks / ppn), python=shlex.quote(sys.executable),
                           backend=backend, args=shlex.join(train_args))
    return shlex.split(text)


def _gpus_per_node() -> int:
    import torch

    return torch.cuda.device_count() or 1


def _study_flags(settings: SweepSettings) -> List[str]:
    """Batch flags that make the runs one weak or one strong scaling study; checks every rank count."""
    from .cli import OneLineParser, add_train_flags, config_from_args

    if "--backend" in settings.train_args or any(a.startswith("--backend=") for a in settings.train_args):
        raise UsageError("a sweep runs every backend of --backends; drop --backend")
    parser = OneLineParser(prog="harness sweep", allow_abbrev=False)
    add_train_flags(parser)
    config = config_from_args(parser.parse_args(settings.train_args))
    config.validate()
    extra: List[str] = []
    if settings.scaling == "weak":
        if config.global_batch is not None:
            raise UsageError("--scaling weak keeps --batch-size per worker fixed; drop --global-batch "
                             "or use --scaling strong")
    else:
        if config.global_batch is None:
            config.global_batch = config.batch_size
            extra = ["--global-batch", str(config.global_batch)]
        bad = [n for n in settings.ranks if config.global_batch % n]
        if bad:
            raise UsageError(f"--scaling strong splits the global batch {config.global_batch} over every rank count, "
                             f"but it does not divide by {bad}; choose a --global-batch that all of "
                             f"{settings.ranks} divide")
    return extra


def plan_sweep(settings: SweepSettings, environ: Optional[Mapping[str, str]] = None) -> List[SweepRun]:
    """Every run of the sweep, in execution order, with its command; bad input raises UsageError."""
    environ = os.environ if environ is None else environ
    if settings.scaling not in SCALING_MODES:
        raise UsageError(f"--scaling must be weak or strong, got {settings.scaling!r}")
    unknown = [b for b in settings.backends if b not in BACKENDS]
    if unknown:
        raise UsageError(f"unknown backends {unknown} in --backends; choose from {', '.join(BACKENDS)}")
    if settings.repeats < 1:
        raise UsageError(f"--repeats must be a positive integer, got {settings.repeats}")
    if os.path.isdir(settings.results):
        raise UsageError(f"--results {settings.results} is a directory; name a JSONL file")
    template = settings.launch_template or allocation_template(environ)
    if template:
        check_template(template)
    if settings.ppn is not None and settings.ppn < 1:
        raise UsageError(f"--ppn must be a positive integer, got {settings.ppn}")
    ppn = settings.ppn or (_gpus_per_node() if template else 1)
    sweep_id = settings.sweep_id or uuid.uuid4().hex[:8]
    shared = [*settings.train_args, *_study_flags(settings), "--results", settings.results,
              "--tag", f"scaling={settings.scaling}", "--tag", f"sweep_id={sweep_id}"]
    runs = []
    for repeat in range(settings.repeats):
        for ranks in settings.ranks:
            for backend in settings.backends:
                if backend == SINGLE_PROCESS_BACKEND and ranks != 1:
                    continue  # the single-process baseline exists at one rank only
                args = [*shared, "--tag", f"repeat={repeat}"]
                if template:
                    command = template_command(template, ranks, ppn, backend, ["--backend", backend, *args])
                else:
                    command = launch_command(ranks, backend, args, settings.launcher)
                runs.append(SweepRun(backend, ranks, repeat, tuple(command)))
    if not runs:
        raise UsageError(f"nothing to run: backend {SINGLE_PROCESS_BACKEND!r} runs one process only; "
                         "add 1 to --ranks or a distributed backend to --backends")
    return runs


def run_sweep(settings: SweepSettings) -> int:
    """Run (or with dry_run print) every run; print the study's report; non-zero if any run failed."""
    from .report import scaling_report

    settings.sweep_id = settings.sweep_id or uuid.uuid4().hex[:8]
    runs = plan_sweep(settings)
    if settings.dry_run:
        for run in runs:
            print(shlex.join(run.command))
        return 0
    for backend in settings.backends:  # fail before the first run, not in the middle of the sweep
        get_backend(backend).check_available()
    failed: List[str] = []
    for number, run in enumerate(runs, 1):
        label = f"{run.backend} x {run.ranks} rank(s), repeat {run.repeat + 1}/{settings.repeats}"
        print(f"== [{number}/{len(runs)}] {label}: {shlex.join(run.command[:4])} ...", flush=True)
        try:
            status = subprocess.run(run.command, env=launch_environment(), timeout=settings.run_timeout).returncode
        except subprocess.TimeoutExpired:
            status = None
        if status != 0:
            failed.append(f"{label} ({'timed out' if status is None else f'exit {status}'})")
    records = [r for r in (read_records([settings.results]) if os.path.exists(settings.results) else [])
               if r.get("tags", {}).get("sweep_id") == settings.sweep_id]
    print(f"\nsweep {settings.sweep_id}: {len(records)} record(s) in {settings.results}\n")
    print(scaling_report(records), flush=True)
    if failed:
        print(f"\nfailed runs: {'; '.join(failed)}", flush=True)
    return 1 if failed else 0
