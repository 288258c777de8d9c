"""Submitting a study: what a qsub/sbatch command line asks for, and the job's own resubmission.

Before anything is queued, `parse_submission` reads what the scheduler will see, the script's
`#PBS`/`#SBATCH` lines first and the command line over them (as qsub and sbatch do), so that
`harness study --check` judges the real request: account, queue, nodes, walltime, file systems,
and the settings the job will get (PBS passes a job only its -v variables; sbatch passes the
environment, or what --export names).

A job continues itself with the same request: PBS replays the job's own `Submit_arguments` to the
queue it was submitted to (PBS_O_QUEUE: the routing queue, not the execution queue it landed in);
Slurm asks again for every resource the job record shows (nodes, tasks and GPUs per node,
constraint, QOS or partition, account, reservation, time limit; both partition and QOS where the site names its
queues by partition and lists QOSes, Frontier), so nothing given on sbatch's command line is dropped;
a QOS the record names by a site's alias is asked for by its own name (Perlmutter: gpu_regular is -q
regular).
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Callable, Optional

from ...errors import UsageError
from ..sites.walltime import parse_walltime
from .scheduler import JobRecord, qsub_words

DIRECTIVE = {"pbs": "#PBS", "slurm": "#SBATCH"}
SBATCH_SHORT = {
    "-A": "account",
    "-q": "qos",
    "-p": "partition",
    "-N": "nodes",
    "-t": "time",
    "-C": "constraint",
    "-c": "cpus-per-task",
    "-J": "job-name",
    "-n": "ntasks",
    "-o": "output",
    "-e": "error",
    "-d": "dependency",
    "-G": "gpus",
    "-w": "nodelist",
    "-x": "exclude",
    "-D": "chdir",
}
SBATCH_FLAGS = frozenset(
    {
        "requeue",
        "no-requeue",
        "exclusive",
        "parsable",
        "hold",
        "test-only",
        "wait",
        "quiet",
        "verbose",
        "overcommit",
        "contiguous",
        "ignore-pbs",
        "use-min-nodes",
        "spread-job",
    }
)
SBATCH_SHORT_FLAGS = frozenset({"-H", "-O", "-Q", "-v", "-W", "-h", "-s"})
# a reservation (a workshop's nodes) is kept too: the continuation runs where the study began
RESUBMITTED_RESOURCES = (
    "nodes",
    "ntasks-per-node",
    "cpus-per-task",
    "gpus-per-node",
    "constraint",
    "account",
    "reservation",
    "time",
)


@dataclass
class Submission:
    """What one qsub/sbatch of a job script asks for."""

    scheduler: str
    script: str
    args: list[str]  # the command line's options, before the script
    account: Optional[str] = None
    queue: Optional[str] = None
    qos: Optional[str] = None  # Slurm -q (at a partition site the queue is the partition, this beside it)
    nodes: int = 1
    walltime_s: Optional[int] = None
    filesystems: Optional[str] = None
    tasks_per_node: Optional[int] = None
    cpus_per_task: Optional[int] = None
    variables: dict[str, str] = field(default_factory=dict)  # what the job's environment will hold
    options: list[str] = field(default_factory=list)  # every option given, directives included (-V, --export)


def directives(script: str, scheduler: str) -> list[str]:
    """The words of a script's #PBS/#SBATCH lines, up to its first command (where both stop reading)."""
    prefix = DIRECTIVE[scheduler]
    words: list[str] = []
    try:
        with open(script) as handle:
            lines = handle.read().splitlines()
    except OSError as exc:
        raise UsageError(f"cannot read the job script {script} ({exc}); name it with --script") from exc
    for line in lines[1:] if lines and lines[0].startswith("#!") else lines:
        if line.startswith(prefix):
            words += shlex.split(line[len(prefix) :], comments=True)
        elif line.strip() and not line.lstrip().startswith("#"):
            break
    return words


def parse_pbs_variables(text: str, environ: Mapping[str, str]) -> dict[str, str]:
    """qsub -v's list: NAME=VALUE,NAME,... (a bare NAME takes qsub's value); quotes may hold commas."""
    items, item, quote = [], "", ""
    for char in text:
        if quote:
            quote, item = ("", item) if char == quote else (quote, item + char)
        elif char in "'\"":
            quote = char
        elif char == ",":
            items.append(item)
            item = ""
        else:
            item += char
    items.append(item)
    found = {}
    for entry in filter(None, (i.strip() for i in items)):
        name, _, value = entry.partition("=")
        found[name] = value if "=" in entry else environ.get(name, "")
    return found


def format_pbs_variables(variables: Mapping[str, str]) -> str:
    """A qsub -v list; values holding commas are quoted."""
    return ",".join(f"{k}='{v}'" if "," in v else f"{k}={v}" for k, v in variables.items())


def _pbs_submission(script: str, words: Sequence[str], environ: Mapping[str, str]) -> Submission:
    options, rest = qsub_words(words)
    if rest:
        raise UsageError(f"give qsub's options only; the script is {script} (found {rest[0]!r} after them)")
    submission = Submission("pbs", script, list(words))
    export_all = False
    variables: dict[str, str] = {}
    given = [*qsub_words(directives(script, "pbs"))[0], *options]
    submission.options = [option for option, _ in given]
    for option, value in given:
        if option == "-A":
            submission.account = value
        elif option == "-q":
            submission.queue = value
        elif option == "-v" and value is not None:
            variables.update(parse_pbs_variables(value, environ))
        elif option == "-V":
            export_all = True
        elif option == "-l" and value is not None:
            _pbs_resources(submission, value)
    submission.variables = {**(dict(environ) if export_all else {}), **variables}
    return submission


def _pbs_resources(submission: Submission, text: str) -> None:
    for item in text.split(","):
        name, _, value = item.partition("=")
        if name == "walltime":
            submission.walltime_s = parse_walltime(value, "pbs")
        elif name == "filesystems":
            submission.filesystems = value
        elif name == "select":
            chunks = [chunk.split(":") for chunk in value.split("+")]
            if not all(chunk[0].isdigit() for chunk in chunks):
                raise UsageError(
                    f"-l select={value}: start each chunk with its node count, e.g. select=2:system=polaris"
                )
            submission.nodes = sum(int(chunk[0]) for chunk in chunks)
            procs = [part.split("=", 1)[1] for part in chunks[0][1:] if part.startswith("mpiprocs=")]
            submission.tasks_per_node = int(procs[0]) if procs else submission.tasks_per_node


def sbatch_options(words: Sequence[str]) -> tuple[dict[str, str], list[str]]:
    """sbatch's options as {long name: value} (flags map to ""), and the words after them."""
    found: dict[str, str] = {}
    index = 0
    while index < len(words) and words[index].startswith("-"):
        word = words[index]
        if word.startswith("--"):
            name, has_value, value = word[2:].partition("=")
            if not has_value and name not in SBATCH_FLAGS:
                index += 1
                value = words[index] if index < len(words) else ""
        elif word[:2] in SBATCH_SHORT_FLAGS:
            name, value = word[:2], ""
        else:
            name = SBATCH_SHORT.get(word[:2], word[:2])
            value = word[2:]
            if not value:
                index += 1
                value = words[index] if index < len(words) else ""
        found[name] = value
        index += 1
    return found, list(words[index:])


def _slurm_submission(script: str, words: Sequence[str], environ: Mapping[str, str], queue_field: str) -> Submission:
    options, rest = sbatch_options(words)
    if rest:
        raise UsageError(f"give sbatch's options only; the script is {script} (found {rest[0]!r} after them)")
    merged = {**sbatch_options(directives(script, "slurm"))[0], **options}
    export = merged.get("export", "ALL").split(",")
    variables = dict(environ) if export[0] == "ALL" else {}
    variables.update(item.split("=", 1) for item in export if "=" in item)
    nodes = merged.get("nodes", "1").split("-")[0]
    if not nodes.isdigit():
        raise UsageError(f"--nodes={merged['nodes']}: give a node count, e.g. -N 2")
    return Submission(
        "slurm",
        script,
        list(words),
        account=merged.get("account") or environ.get("SBATCH_ACCOUNT"),
        queue=merged.get(queue_field) or environ.get(f"SBATCH_{queue_field.upper()}"),
        qos=merged.get("qos") or environ.get("SBATCH_QOS"),
        nodes=int(nodes),
        walltime_s=parse_walltime(merged["time"], "slurm") if merged.get("time") else None,
        tasks_per_node=int(merged["ntasks-per-node"]) if merged.get("ntasks-per-node", "").isdigit() else None,
        cpus_per_task=int(merged["cpus-per-task"]) if merged.get("cpus-per-task", "").isdigit() else None,
        variables=variables,
        options=[name if name.startswith("-") else f"--{name}" for name in merged],
    )


def parse_submission(
    scheduler: str, script: str, words: Sequence[str], environ: Mapping[str, str], queue_field: str = "qos"
) -> Submission:
    """What `qsub WORDS SCRIPT` or `sbatch WORDS SCRIPT` would ask for, directives included; a Slurm
    site names its queues by `queue_field`, qos or partition."""
    if scheduler == "pbs":
        return _pbs_submission(script, words, environ)
    return _slurm_submission(script, words, environ, queue_field)


def submit_command(submission: Submission) -> list[str]:
    """The qsub/sbatch command that queues the checked submission."""
    program = "qsub" if submission.scheduler == "pbs" else "sbatch"
    return [program, *(["--parsable"] if program == "sbatch" else []), *submission.args, submission.script]


def qsub_resubmission(
    record: JobRecord, queue: str, job_dir: str, script: str, variables: Mapping[str, str]
) -> list[str]:
    """qsub for this job's continuation: its own submit arguments, to `queue` (where it was submitted),
    after it ends, output into `job_dir`, with `variables` added to its -v list."""
    kept: list[str] = []
    passed: dict[str, str] = {}
    for option, value in record.submit_options:
        if option == "-v" and value is not None:
            # Variable_List holds the values whole (Submit_arguments shows them unquoted).
            passed.update(
                {name: record.variables.get(name, text) for name, text in parse_pbs_variables(value, {}).items()}
            )
        elif option == "-W" and value is not None and value.startswith("depend="):
            continue  # this job's own dependency; the new one depends on this job
        elif option not in ("-q", "-o", "-e"):
            kept += [option] if value is None else [option, value]
    if "-A" not in kept and record.account:
        kept += ["-A", record.account]
    passed.update(variables)
    return [
        "qsub",
        *kept,
        "-q",
        queue,
        "-W",
        f"depend=afterany:{record.job_id}",
        "-o",
        job_dir,
        "-v",
        format_pbs_variables(passed),
        script,
    ]


def sbatch_resubmission(
    record: JobRecord,
    queue_field: str,
    job_dir: str,
    script: str,
    requeue: bool,
    with_qos: bool = False,
    submit_name: Callable[[str], str] = str,
) -> list[str]:
    """sbatch for this job's continuation: every resource the job asked for, after it ends, output
    into `job_dir`; --requeue where the queue lets Slurm requeue a preempted job. `with_qos` asks for
    the job's QOS too where its queue is a partition (a site whose profile lists QOSes: Frontier).
    `submit_name` turns the QOS or partition the record shows into the one to ask for (the site's
    alias: a Perlmutter GPU job's record shows QOS gpu_regular for -q regular)."""
    words = [
        "sbatch",
        "--parsable",
        "--dependency",
        f"afterany:{record.job_id}",
        "--job-name",
        record.name,
        "--output",
        os.path.join(job_dir, "%x-%j.out"),
    ]
    # The site's queue field, and the QOS beside a partition where the site lists QOSes; not the
    # partition at a QOS site: at NERSC -C and -q choose it, and naming the one the job landed in
    # could refuse the continuation.
    fields = [queue_field, *(["qos"] if with_qos and queue_field == "partition" else [])]
    names = [*RESUBMITTED_RESOURCES, *(name for name in fields if name in ("qos", "partition"))]
    for name in names:
        if name in record.options:
            value = record.options[name]
            words += [f"--{name}", submit_name(value) if name in ("qos", "partition") else value]
    if requeue:
        words.append("--requeue")
    return [*words, script]
