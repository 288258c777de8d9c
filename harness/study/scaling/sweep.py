"""`harness sweep`: one scaling study, every backend x rank count x repeat, into one JSONL file.

Weak scaling keeps the batch per worker fixed (--batch-size); strong scaling keeps the global
batch fixed (--global-batch, default --batch-size) and splits it over the workers. Every run is a
plain `harness train` of the same task (--task, or `run_sweep(settings, task=...)`; loaded once
here before any run, so that a task that cannot load fails with one line, not in every run), so
every backend is measured by the same loop, window and formula; the sweep adds the tags
`scaling`, `repeat`, `sweep_id`, `order_seed` and `order` to each record.
Repeats are interleaved in rounds (every configuration once, then all again) so slow drifts of a
shared machine spread evenly, and within each round the runs go in a random order drawn from
--order-seed and the round's number, so that no configuration always runs first (after a cold
start) or right after the same neighbour; `order` is the run's place in its round ("2/7"), so the
records say the whole order. The default of 3 repeats is the fewest that give a 95% interval
(harness.study.scaling.intervals: Student's t on log ratios paired by round), which is what tells a difference between
backends from the noise of a shared machine.

Same work per rank at every rank count: every run of a study gets the same threads per rank
(`--threads`, default: the node's cores // the most ranks any run puts on a node), so the
fewest-worker baseline does what each rank of the larger runs does. One rank with all the cores
is another configuration: `all_cores_baseline` adds it, tagged `baseline=all-cores`, and reports
never take it as a scaling baseline.

Where runs start:
- locally, through `harness.training.launch.launch_command`: each backend's real launcher (torchrun,
  horovodrun, deepspeed, or --launcher for all);
- inside a PBS or Slurm allocation (PBS_NODEFILE or SLURM_JOB_ID set), or whenever
  --launch-template is given, through the site launcher (the batch system's own, from
  harness.process.launchers: mpiexec under PBS, srun under Slurm), from a template whose placeholders are
      {ranks}    total ranks of the run
      {ppn}      ranks per node: min(ranks, --ppn)
      {nodes}    nodes the run spans: ceil(ranks / ppn)
      {python}   this Python interpreter
      {backend}  the run's backend
      {args}     the run's `harness train` flags, shell-quoted (they include --backend)
  e.g. PBS_TEMPLATE and SLURM_TEMPLATE below, the defaults in those allocations.

For batch jobs: `log_dir` gives every run a log file and records the exact commands; with
`checkpoint_root` every run checkpoints into its own directory and resumes from it. On SIGTERM or
SIGUSR1 the sweep passes the signal to the run in progress, which checkpoints and exits with
status 3; the sweep then stops with status 3 and starts nothing more. Run again with the same
--sweep-id (a resubmitted job), it skips the runs already recorded in --results and resumes the
interrupted one from its checkpoint.
"""

from __future__ import annotations

import dataclasses
import math
import os
import random
import shlex
import signal
import string
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

from ...backends import BACKENDS, backend_class, get_backend
from ...config import TrainConfig
from ...errors import EXIT_PEER_FAILURE, EXIT_PREEMPTED, UsageError, unknown_choice
from ...process.accelerator import detect_accelerator
from ...process.discovery import cpu_cores
from ...process.launchers import launch_environment, site_launcher
from ...process.signals import SignalCatcher
from ...training.flags import parse_train_flags
from ...training.launch import launch_command
from ...training.record import read_records
from .task_spec import absolute_task_flags, load_sweep_task, with_task

SCALING_MODES = ("weak", "strong")
RUN_TEMPLATE = "{python} -m harness train {args}"  # what each rank runs, after the site launcher's words
PBS_TEMPLATE = f"{site_launcher('pbs').site} {RUN_TEMPLATE}"
SLURM_TEMPLATE = f"{site_launcher('slurm').site} {RUN_TEMPLATE}"
TEMPLATE_FIELDS = ("ranks", "ppn", "nodes", "python", "backend", "args")
COMMANDS_FILE = "commands.txt"
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
DEFAULT_REPEATS = 3  # the fewest runs that give a 95% interval
ALL_CORES = "all-cores"  # the `baseline` tag of the one-rank-with-every-core runs


@dataclass
class SweepSettings:
    """What a sweep runs: `harness sweep`'s flags, or the Python API's arguments."""

    backends: list[str]
    ranks: list[int]
    scaling: str
    results: str
    train_args: list[str] = field(default_factory=list)  # `harness train` flags shared by every run
    repeats: int = DEFAULT_REPEATS
    order_seed: int = 0  # each round's run order is random.Random(f"{order_seed}-{round}")'s shuffle
    threads: Optional[int] = None  # threads per rank in every run (or --threads in train_args); set by plan_sweep
    all_cores_baseline: bool = False  # also run 1 rank x all the node's cores per backend (tag baseline=all-cores)
    launch_template: Optional[str] = None
    launcher: Optional[str] = None  # local runs: override each backend's own launcher
    ppn: Optional[int] = None  # ranks per node inside an allocation (default: GPUs per node, or 1)
    sweep_id: Optional[str] = None
    run_timeout: float = 3600.0
    dry_run: bool = False
    log_dir: Optional[str] = None  # one log file per run, and the commands that ran
    checkpoint_root: Optional[str] = None  # each run checkpoints into (and resumes from) its own directory


@dataclass(frozen=True)
class SweepRun:
    """One `harness train` run of the sweep and the exact command that starts it."""

    backend: str
    ranks: int
    repeat: int
    command: tuple[str, ...]
    baseline: str = ""  # ALL_CORES for the separate one-rank-with-every-core configuration

    @property
    def key(self) -> str:
        """A name for the run, unique within its sweep: e.g. 'ddp-4r-rep1', 'ddp-1r-all-cores-rep0'."""
        return f"{self.backend}-{self.ranks}r{'-' + self.baseline if self.baseline else ''}-rep{self.repeat}"

    def label(self, repeats: int) -> str:
        what = f"{self.backend} x {self.ranks} rank(s)" + (" with all cores" if self.baseline else "")
        return f"{what}, repeat {self.repeat + 1}/{repeats}"


@dataclass
class SweepResult:
    """What a sweep did: this sweep's records, the runs that failed, and the exit status."""

    sweep_id: str
    records: list[dict[str, Any]]
    failed: list[str]  # labels of failed runs, with their exit status
    preempted: bool  # a run stopped on a preemption signal: run the sweep again to finish it
    status: int  # 0 all done, 3 preempted, 4 a run lost a rank, 1 another failure
    signal: Optional[int] = None  # the preemption signal (SIGTERM or SIGUSR1) that stopped it, if one did


def parse_list(text: str, what: str) -> list[str]:
    """Comma-separated values, without blanks or duplicates (order kept)."""
    values = [part.strip() for part in text.split(",") if part.strip()]
    if not values:
        example = "1,2,4" if what == "ranks" else "ddp,horovod"
        raise UsageError(f"--{what} needs at least one value, e.g. --{what} {example}")
    return list(dict.fromkeys(values))


def parse_ranks(text: str) -> list[int]:
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
        raise UsageError(
            f"--launch-template {template!r} is malformed ({exc}); write placeholders as {{ranks}}"
        ) from exc
    unknown = sorted(names - set(TEMPLATE_FIELDS))
    if unknown:
        raise UsageError(
            f"--launch-template uses unknown placeholders {unknown}; "
            f"known: {', '.join('{' + name + '}' for name in TEMPLATE_FIELDS)}"
        )
    if "args" not in names:
        raise UsageError("--launch-template must contain {args}, where the `harness train` flags go")


def template_command(template: str, ranks: int, ppn: int, backend: str, train_args: Sequence[str]) -> list[str]:
    """The site-launcher command for one run, from a checked template."""
    ppn = min(ranks, ppn)
    text = template.format(
        ranks=ranks,
        ppn=ppn,
        nodes=math.ceil(ranks / ppn),
        python=shlex.quote(sys.executable),
        backend=backend,
        args=shlex.join(train_args),
    )
    return shlex.split(text)


def _gpus_per_node() -> int:
    return detect_accelerator().count or 1


def _study_config(settings: SweepSettings) -> TrainConfig:
    """The runs' shared config, checked as every run will see it, under each backend (one backend's
    option flag is refused under the others)."""
    from ...training.placement import check_config

    if "--backend" in settings.train_args or any(a.startswith("--backend=") for a in settings.train_args):
        raise UsageError("a sweep runs every backend of --backends; drop --backend")
    if not settings.backends:
        raise UsageError("a sweep needs at least one backend; give --backends, e.g. --backends ddp,horovod")
    # With --checkpoint-root each run gets a checkpoint directory (so --checkpoint-every is valid)
    # and resumes from it.
    run_checkpoint_flags = (
        ["--checkpoint-dir", settings.checkpoint_root, "--resume", "auto"] if settings.checkpoint_root else []
    )
    for backend in settings.backends:
        config = parse_train_flags(["--backend", backend, *settings.train_args, *run_checkpoint_flags])
        check_config(config)
    return config


def _batch_flags(settings: SweepSettings, config: TrainConfig) -> list[str]:
    """Batch flags that make the runs one weak or one strong scaling study; checks every rank count."""
    if settings.scaling == "weak":
        if config.global_batch is not None:
            raise UsageError(
                "--scaling weak keeps --batch-size per worker fixed; drop --global-batch or use --scaling strong"
            )
        return []
    global_batch = config.global_batch or config.batch_size
    bad = [n for n in settings.ranks if global_batch % (n * config.grad_accum)]
    if bad:
        raise UsageError(
            f"--scaling strong splits the global batch {global_batch} over every rank count "
            f"(x {config.grad_accum} micro-batches), but it does not divide by {bad}; choose a "
            f"--global-batch that all of {settings.ranks} divide"
        )
    return [] if config.global_batch else ["--global-batch", str(global_batch)]


def threads_per_rank(settings: SweepSettings, config: TrainConfig, ppn: Optional[int], cores: int) -> int:
    """The threads every rank of the study gets: --threads (in the settings or the train flags), else
    the node's cores shared by the most ranks any run puts on one node (ppn: ranks per node under a
    site launcher, None locally), at least 1."""
    given = {value for value in (settings.threads, config.threads) if value is not None}
    if len(given) > 1:
        raise UsageError(f"threads per rank given twice ({sorted(given)}); give --threads once")
    if given:
        value = given.pop()
        if value < 1:
            raise UsageError(f"--threads must be a positive integer, got {value}")
        return value
    most_on_a_node = max(min(ranks, ppn) if ppn else ranks for ranks in settings.ranks)
    return max(1, cores // most_on_a_node)


def _check_settings(settings: SweepSettings) -> None:
    if settings.scaling not in SCALING_MODES:
        raise unknown_choice("scaling mode", settings.scaling, SCALING_MODES)
    unknown = [b for b in settings.backends if b not in BACKENDS]
    if unknown:
        raise unknown_choice("backend", unknown[0], BACKENDS)
    if settings.repeats < 1:
        raise UsageError(f"--repeats must be a positive integer, got {settings.repeats}")
    if os.path.isdir(settings.results):
        raise UsageError(f"--results {settings.results} is a directory; name a JSONL file")
    if settings.checkpoint_root and any(a.startswith(("--checkpoint-dir", "--resume")) for a in settings.train_args):
        raise UsageError(
            "--checkpoint-root gives every run its own --checkpoint-dir and --resume auto; "
            "drop --checkpoint-dir and --resume"
        )
    if settings.ppn is not None and settings.ppn < 1:
        raise UsageError(f"--ppn must be a positive integer, got {settings.ppn}")


def plan_sweep(
    settings: SweepSettings, environ: Optional[Mapping[str, str]] = None, cores: Optional[int] = None
) -> list[SweepRun]:
    """Every run of the sweep, in execution order, with its command; bad input raises UsageError.

    Sets `settings.threads` to the threads per rank every run gets (`cores`: the node's, default
    this machine's)."""
    environ = os.environ if environ is None else environ
    _check_settings(settings)
    template = settings.launch_template or allocation_template(environ)
    if template:
        check_template(template)
    ppn = settings.ppn or (_gpus_per_node() if template else 1)
    config = _study_config(settings)
    cores = cores or cpu_cores()
    settings.threads = threads_per_rank(settings, config, ppn if template else None, cores)
    sweep_id = settings.sweep_id or uuid.uuid4().hex[:8]
    own_threads = [] if config.threads else ["--threads", str(settings.threads)]
    shared = [
        *settings.train_args,
        *_batch_flags(settings, config),
        "--results",
        settings.results,
        "--tag",
        f"scaling={settings.scaling}",
        "--tag",
        f"sweep_id={sweep_id}",
    ]
    shared += ["--tag", f"order_seed={settings.order_seed}"]
    runs = []
    for repeat in range(settings.repeats):
        round_runs = []
        for ranks in settings.ranks:
            for backend in settings.backends:
                limit = backend_class(backend).max_world_size
                if limit is not None and ranks > limit:
                    continue  # the single-process baseline exists at one rank only
                round_runs.append((SweepRun(backend, ranks, repeat, ()), [*shared, *own_threads]))
        if settings.all_cores_baseline:
            for backend in settings.backends:
                round_runs.append(
                    (
                        SweepRun(backend, 1, repeat, (), ALL_CORES),
                        [*shared, "--threads", str(cores), "--tag", f"baseline={ALL_CORES}"],
                    )
                )
        random.Random(f"{settings.order_seed}-{repeat}").shuffle(round_runs)
        for place, (run, flags) in enumerate(round_runs):
            runs.append(_run(settings, template, ppn, run, [*flags, "--tag", f"order={place + 1}/{len(round_runs)}"]))
    if not runs:
        raise UsageError(
            "nothing to run: the single-process backend runs one process only; add 1 to --ranks or a "
            "distributed backend to --backends"
        )
    return runs


def _run(settings: SweepSettings, template: Optional[str], ppn: int, run: SweepRun, flags: list[str]) -> SweepRun:
    """`run` with its command: the shared flags, its repeat tag and its own checkpoint directory."""
    args = [*flags, "--tag", f"repeat={run.repeat}"]
    if settings.checkpoint_root:
        args += ["--checkpoint-dir", os.path.join(settings.checkpoint_root, run.key), "--resume", "auto"]
    if template:
        command = template_command(template, run.ranks, ppn, run.backend, ["--backend", run.backend, *args])
    else:
        command = launch_command(run.ranks, run.backend, args, settings.launcher)
    return dataclasses.replace(run, command=tuple(command))


def _recorded(results: str, sweep_id: str) -> list[dict[str, Any]]:
    records = read_records([results]) if os.path.exists(results) else []
    return [record for record in records if record.get("tags", {}).get("sweep_id") == sweep_id]


def _is_done(run: SweepRun, records: Sequence[dict[str, Any]]) -> bool:
    return any(
        (r.get("backend"), r.get("world_size"), r.get("tags", {}).get("repeat"), r.get("tags", {}).get("baseline", ""))
        == (run.backend, run.ranks, str(run.repeat), run.baseline)
        for r in records
    )


class _SignalForwarder(SignalCatcher):
    """While installed: a preemption signal to the sweep is passed on to the run in progress."""

    def __init__(self) -> None:
        super().__init__(FORWARDED_SIGNALS, on_signal=self._forward)
        self.child: Optional[subprocess.Popen] = None

    @property
    def received(self) -> Optional[int]:
        """The latest preemption signal the sweep received, or None."""
        return self.last

    def _forward(self, signum: int) -> None:
        if self.child is not None and self.child.poll() is None:
            self.child.send_signal(signum)


def _run_one(
    run: SweepRun, settings: SweepSettings, number: int, total: int, forwarder: _SignalForwarder
) -> Optional[int]:
    """Start one run and wait for it; its exit status (None: killed at --run-timeout)."""
    label = run.label(settings.repeats)
    log_path = None
    if settings.log_dir:
        log_path = os.path.join(settings.log_dir, f"{number:03d}-{run.key}.log")
        with open(os.path.join(settings.log_dir, COMMANDS_FILE), "a") as commands:
            commands.write(
                f"# {time.strftime('%Y-%m-%d %H:%M:%S')} [{number}/{total}] {label} -> {log_path}\n"
                f"{shlex.join(run.command)}\n"
            )
    print(
        f"== [{number}/{total}] {label}: {shlex.join(run.command[:4])} ..."
        + (f" (log: {log_path})" if log_path else ""),
        flush=True,
    )
    output = open(log_path, "a") if log_path else None
    try:
        forwarder.child = subprocess.Popen(
            run.command, env=launch_environment(), stdout=output, stderr=subprocess.STDOUT if output else None
        )
        try:
            return forwarder.child.wait(timeout=settings.run_timeout)
        except subprocess.TimeoutExpired:
            forwarder.child.kill()
            forwarder.child.wait()
            return None
    finally:
        forwarder.child = None
        if output is not None:
            output.close()


def run_sweep(settings: SweepSettings, task: Any = None) -> SweepResult:
    """Run (or with dry_run print) every run of the sweep; return its records and failures.

    `task` (a spec, or a function returning a harness.Task defined in a file: see
    harness.study.scaling.task_spec.sweep_spec) becomes every run's --task; a task file's relative path is
    made absolute. The task is loaded here once before any run. Prints one line per run as it
    starts. Raises UsageError for bad input before any run starts.
    """
    if task is not None:
        settings.train_args = with_task(settings.train_args, task)
    settings.train_args = absolute_task_flags(settings.train_args, os.getcwd())
    settings.sweep_id = settings.sweep_id or uuid.uuid4().hex[:8]
    runs = plan_sweep(settings)
    load_sweep_task(settings.backends[0], settings.train_args)  # a task that cannot load fails here, once
    if settings.dry_run:
        for run in runs:
            print(shlex.join(run.command))
        return SweepResult(settings.sweep_id, [], [], False, 0)
    for backend in settings.backends:  # fail before the first run, not in the middle of the sweep
        get_backend(backend).check_available()
    print(
        f"== sweep {settings.sweep_id}: {len(runs)} runs, {settings.repeats} repeat(s) interleaved, "
        f"{settings.threads} thread(s) per rank at every rank count",
        flush=True,
    )
    if settings.log_dir:
        os.makedirs(settings.log_dir, exist_ok=True)
    done = _recorded(settings.results, settings.sweep_id)
    failed: list[str] = []
    statuses: list[Optional[int]] = []
    with _SignalForwarder() as forwarder:
        for number, run in enumerate(runs, 1):
            if _is_done(run, done):
                print(
                    f"== [{number}/{len(runs)}] {run.label(settings.repeats)}: already recorded, skipped", flush=True
                )
                continue
            if forwarder.received is not None:
                break  # preempted between runs: start nothing more
            status = _run_one(run, settings, number, len(runs), forwarder)
            statuses.append(status)
            if status == EXIT_PREEMPTED or forwarder.received is not None:
                break
            if status != 0:
                failed.append(f"{run.label(settings.repeats)} ({'timed out' if status is None else f'exit {status}'})")
    preempted = EXIT_PREEMPTED in statuses or forwarder.received is not None
    status = (
        EXIT_PREEMPTED if preempted else EXIT_PEER_FAILURE if EXIT_PEER_FAILURE in statuses else 1 if failed else 0
    )
    return SweepResult(
        settings.sweep_id,
        _recorded(settings.results, settings.sweep_id),
        failed,
        preempted,
        status,
        forwarder.received,
    )
