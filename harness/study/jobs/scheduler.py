"""What the batch system says about a running job, read from its machine-readable output.

PBS: `qstat -fF json JOBID`, whose values come whole (plain `qstat -f` wraps them at 78 columns,
and a wrapped `Submit_arguments` or `select` read line by line loses its tail). PBS prints invalid
JSON for some exported values (openpbs #2541, #1255): then `qstat -f JOBID` is read instead, its
folded values joined again (a continuation line starts with a tab), with a warning. Slurm:
`scontrol show job --json JOBID`, and where that is not built in (Slurm < 23, or without the JSON
plugins) `scontrol show job -o JOBID`, one line of NAME=VALUE fields; where it prints invalid JSON,
or JSON without the job, `-o` too, with a warning. Both become a `JobRecord`.

Every query is retried (QUERY_ATTEMPTS, with a doubling pause) before it counts as failed: qstat
and scontrol fail now and then while the server is busy (seen on Aurora). A read made while the
job's grace time runs passes a tighter `ReadBound` (harness.study.jobs.continuation).

The allocation itself comes from the job's environment: PBS_NODEFILE lists a host once per MPI
process it may run (`mpiprocs`), so nodes are its distinct hosts; Slurm counts them in
SLURM_JOB_NUM_NODES.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

from ...errors import UsageError, first_line
from ..sites.walltime import parse_walltime

QUERY_TIMEOUT_S = 60
QUERY_ATTEMPTS = 4  # a query that fails is tried again, QUERY_PAUSE_S, then twice that, ... later
QUERY_PAUSE_S = 2.0
# scontrol's words where this Slurm cannot print JSON at all (no --json before 21.08, JSON plugins not
# built): trying again cannot help, so `-o` is read at once. Any other failure ("Socket timed out",
# "Unable to contact slurm controller") may pass, and is retried as every query is. Its stderr only:
# the JSON scontrol prints on stdout names its own "plugin".
_NO_SLURM_JSON = re.compile(r"json|plugin|serializ|(invalid|unrecognized|unknown) option", re.IGNORECASE)
# qsub options that take a value (the rest of PBS Pro's, -h -I -V -X -z, take none).
QSUB_VALUE_OPTIONS = frozenset("AacCeJjklMmNoPpqrRSuvW")
_SLURM_FIELD = re.compile(r"^[A-Za-z][A-Za-z0-9_/:]*=")
_GPUS = re.compile(r"gpu(?::[A-Za-z0-9_-]+)?:(\d+)")


@dataclass
class JobRecord:
    """One job as its batch system describes it; what a check, a timer and a resubmission need."""

    job_id: str
    name: str = ""
    account: Optional[str] = None
    queue: Optional[str] = None  # where it runs: a PBS execution queue; a Slurm QOS or partition
    submit_queue: Optional[str] = None  # where it was submitted: what a resubmission must name
    nodes: Optional[int] = None
    walltime_s: Optional[int] = None  # None: unlimited or unknown
    start_time: Optional[float] = None  # epoch seconds
    script: Optional[str] = None  # the job script as submitted
    workdir: Optional[str] = None  # where it was submitted from
    outputs: list[str] = field(default_factory=list)  # the scheduler's output and error files
    states: tuple[str, ...] = ()
    requeue: bool = False  # Slurm: the scheduler may requeue it (same id)
    preempted: bool = False  # the scheduler has started preempting it
    filesystems: Optional[str] = None  # PBS -l filesystems
    submit_options: list[tuple[str, Optional[str]]] = field(default_factory=list)  # PBS: qsub's, as submitted
    variables: dict[str, str] = field(default_factory=dict)  # PBS: Variable_List (PBS_O_*, -v), values whole
    options: dict[str, str] = field(default_factory=dict)  # Slurm: sbatch option -> value, as requested
    known: bool = True  # False: the scheduler could not be read; only job_id is known (harness.study.jobs.job)


@dataclass(frozen=True)
class Allocation:
    """The nodes and tasks a job was given (or, before it is queued, asks for)."""

    nodes: int
    tasks_per_node: Optional[int] = None
    cpus_per_task: Optional[int] = None
    hosts: tuple[str, ...] = ()


@dataclass(frozen=True)
class ReadBound:
    """How long one scheduler query may take: its tries, and seconds for each (plus the pauses)."""

    attempts: int = QUERY_ATTEMPTS
    timeout_s: float = QUERY_TIMEOUT_S


FULL_READ = ReadBound()


def _run(
    command: Sequence[str],
    bound: ReadBound = FULL_READ,
    final: Optional[Callable[[subprocess.CompletedProcess], bool]] = None,
) -> subprocess.CompletedProcess:
    """`command`'s result, tried up to `bound.attempts` times while it fails or times out, with a
    doubling pause between tries; the last result when every try failed, or at once a failure that
    `final` says trying again cannot mend."""
    attempts = bound.attempts
    for attempt in range(attempts):
        if attempt:
            time.sleep(QUERY_PAUSE_S * 2 ** (attempt - 1))
        try:
            result = subprocess.run(list(command), capture_output=True, text=True, timeout=bound.timeout_s)
        except FileNotFoundError as exc:
            raise UsageError(f"`{shlex.join(command)}` failed ({first_line(exc)}); is {command[0]} on PATH?") from exc
        except (OSError, subprocess.TimeoutExpired) as exc:
            if attempt + 1 == attempts:
                raise UsageError(f"`{shlex.join(command)}` failed {attempts} times ({first_line(exc)})") from exc
            continue
        if result.returncode == 0 or attempt + 1 == attempts or (final is not None and final(result)):
            return result
    raise AssertionError("unreachable: the last attempt returns or raises")


def _said(result: subprocess.CompletedProcess) -> str:
    """What a failed command said, on one line."""
    return " ".join((result.stderr or result.stdout).split())[:300]


def _warn(message: str) -> None:
    print(f"harness study: warning: {message}", file=sys.stderr, flush=True)


# -- PBS --------------------------------------------------------------------------------------------


def pbs_nodefile(nodefile: str) -> list[str]:
    """The lines of a PBS_NODEFILE: one per MPI process a host may run (`mpiprocs` repeats a host)."""
    try:
        with open(nodefile) as handle:
            return [line.strip() for line in handle if line.strip()]
    except OSError as exc:
        raise UsageError(f"cannot read PBS_NODEFILE={nodefile!r} ({exc}); run inside the PBS job") from exc


def pbs_allocation(environ: Mapping[str, str]) -> Allocation:
    """The PBS job's nodes (distinct hosts, in order) and MPI processes per node (a host's repeats);
    counting lines would count a 2-node job with mpiprocs=4 as 8 nodes."""
    lines = pbs_nodefile(environ.get("PBS_NODEFILE", ""))
    hosts = tuple(dict.fromkeys(lines))
    return Allocation(nodes=len(hosts), tasks_per_node=lines.count(hosts[0]) if hosts else None, hosts=hosts)


def qsub_words(words: Sequence[str]) -> tuple[list[tuple[str, Optional[str]]], list[str]]:
    """qsub's command line split into (option, value) pairs and the words after them (the script)."""
    options: list[tuple[str, Optional[str]]] = []
    index = 0
    while index < len(words) and words[index].startswith("-") and words[index] != "--":
        word = words[index]
        if len(word) > 2 and word[1] in QSUB_VALUE_OPTIONS:
            options.append((word[:2], word[2:]))
        elif word[1:2] in QSUB_VALUE_OPTIONS and len(word) == 2:
            if index + 1 >= len(words):
                raise UsageError(f"qsub option {word} needs a value")
            index += 1
            options.append((word, words[index]))
        else:
            options.append((word, None))
        index += 1
    return options, list(words[index:])


def split_submit_arguments(text: str) -> tuple[list[tuple[str, Optional[str]]], Optional[str]]:
    """qsub's words as qstat shows them (`Submit_arguments`, joined by spaces, values unquoted):
    (option, value) pairs and the script, the last word. An option's value runs up to the next
    qsub option, so `-v BACKENDS=ddp deepspeed,STEPS=10` keeps its space."""
    try:
        words = shlex.split(text)
    except ValueError:  # an apostrophe inside an unquoted value
        words = text.split()
    script = words.pop() if words and not words[-1].startswith("-") else None
    options: list[tuple[str, Optional[str]]] = []
    for word in words:
        is_option = len(word) >= 2 and word[0] == "-" and word[1].isalpha()
        if is_option and word[1] in QSUB_VALUE_OPTIONS:
            options.append((word[:2], word[2:] or None))
        elif is_option:
            options.append((word, None))
        elif options and options[-1][0][1] in QSUB_VALUE_OPTIONS:
            option, value = options[-1]
            options[-1] = (option, word if value is None else f"{value} {word}")
    return options, script


class InvalidQstatJson(UsageError):
    """`qstat -fF json` printed something that is not JSON (openpbs #2541, #1255)."""


def parse_qstat_json(text: str, job_id: str, environ: Mapping[str, str]) -> JobRecord:
    """A JobRecord from `qstat -fF json JOBID`; the submit queue from PBS_O_QUEUE (the queue the job
    was submitted to, a routing queue such as Polaris' prod), never the execution queue it landed in.
    Raises InvalidQstatJson where the text is not JSON."""
    try:
        document = json.loads(text)
    except ValueError as exc:
        raise InvalidQstatJson(f"qstat -fF json printed invalid JSON ({first_line(exc)})") from exc
    try:
        jobs = document["Jobs"]
    except (KeyError, TypeError) as exc:
        raise UsageError(f"qstat -fF json gave no job list ({first_line(exc)}); is this PBS Pro 19 or later?") from exc
    number = job_id.split(".")[0]
    entry = jobs.get(job_id) or next((v for k, v in jobs.items() if k.split(".")[0] == number), None)
    if entry is None:
        raise UsageError(f"qstat -fF json does not list job {job_id}; is PBS_JOBID right?")
    return _pbs_record(entry, job_id, environ)


def parse_qstat_full(text: str, job_id: str, environ: Mapping[str, str]) -> JobRecord:
    """A JobRecord from plain `qstat -f JOBID`: `NAME = VALUE` lines whose values PBS folds at 78
    columns onto continuation lines that start with a tab (joined again here, nothing added);
    Resource_List.NAME become one table, as in the JSON, and Variable_List is split at its unescaped
    commas."""
    entry: dict[str, Any] = {}
    name = None
    for line in text.splitlines():
        if line.startswith("\t") and name is not None:
            entry[name] += line[1:]
        elif " = " in line and line.startswith("    "):
            name, _, value = line.strip().partition(" = ")
            entry[name] = value
    if not entry:
        raise UsageError(f"qstat -f {job_id} listed no attributes; is PBS_JOBID right?")
    resources = {key.split(".", 1)[1]: entry.pop(key) for key in list(entry) if key.startswith("Resource_List.")}
    entry["Resource_List"] = resources
    if "Variable_List" in entry:
        items = re.split(r"(?<!\\),", entry["Variable_List"])
        entry["Variable_List"] = dict(item.replace("\\,", ",").split("=", 1) for item in items if "=" in item)
    return _pbs_record(entry, job_id, environ)


def _pbs_record(entry: dict[str, Any], job_id: str, environ: Mapping[str, str]) -> JobRecord:
    """A JobRecord from one job's attributes, as qstat's JSON holds them."""
    resources = entry.get("Resource_List", {})
    variables = _pbs_variables(entry.get("Variable_List", {}))
    options, script = split_submit_arguments(entry.get("Submit_arguments", ""))
    return JobRecord(
        job_id=job_id,
        name=entry.get("Job_Name", ""),
        account=entry.get("Account_Name") or entry.get("project"),
        queue=entry.get("queue"),
        submit_queue=(
            environ.get("PBS_O_QUEUE")
            or variables.get("PBS_O_QUEUE")
            or next((value for option, value in options if option == "-q"), None)
        ),
        nodes=_int(resources.get("nodect")),
        walltime_s=parse_walltime(resources["walltime"], "pbs") if resources.get("walltime") else None,
        start_time=_ctime(entry.get("stime")),
        script=script,
        workdir=environ.get("PBS_O_WORKDIR") or variables.get("PBS_O_WORKDIR"),
        outputs=[_strip_host(entry[k]) for k in ("Output_Path", "Error_Path") if entry.get(k)],
        states=(str(entry.get("job_state", "")),),
        filesystems=resources.get("filesystems"),
        submit_options=options,
        variables=variables,
    )


def _pbs_variables(value: Any) -> dict[str, str]:
    if isinstance(value, dict):
        return {str(k): str(v) for k, v in value.items()}
    return dict(item.split("=", 1) for item in str(value).split(",") if "=" in item)


def _strip_host(path: str) -> str:
    """PBS writes output paths as host:path."""
    return path.split(":", 1)[1] if ":" in path and not path.startswith("/") else path


def _ctime(text: Optional[str]) -> Optional[float]:
    if not text:
        return None
    try:
        return time.mktime(time.strptime(" ".join(str(text).split()), "%a %b %d %H:%M:%S %Y"))
    except ValueError:
        return None


def read_pbs_job(job_id: str, environ: Mapping[str, str], bound: ReadBound = FULL_READ) -> JobRecord:
    """`qstat -fF json JOBID`, parsed; where PBS printed invalid JSON, `qstat -f JOBID` (with a
    warning on stderr)."""
    result = _run(["qstat", "-fF", "json", job_id], bound)
    if result.returncode != 0:
        raise UsageError(f"qstat -fF json {job_id} failed: {_said(result)}")
    try:
        return parse_qstat_json(result.stdout, job_id, environ)
    except InvalidQstatJson as exc:
        _warn(f"{exc} (a known PBS defect, openpbs #2541); reading `qstat -f {job_id}` instead")
    result = _run(["qstat", "-f", job_id], bound)
    if result.returncode != 0:
        raise UsageError(f"qstat -f {job_id} failed: {_said(result)}")
    return parse_qstat_full(result.stdout, job_id, environ)


# -- Slurm ------------------------------------------------------------------------------------------


def slurm_allocation(environ: Mapping[str, str]) -> Allocation:
    """The Slurm job's nodes, tasks per node ("4(x2)" -> 4) and CPUs per task."""
    nodes = environ.get("SLURM_JOB_NUM_NODES") or environ.get("SLURM_NNODES")
    if not nodes:
        raise UsageError("SLURM_JOB_NUM_NODES is not set; run inside the Slurm job")
    tasks = environ.get("SLURM_NTASKS_PER_NODE") or environ.get("SLURM_TASKS_PER_NODE") or ""
    match = re.match(r"^(\d+)", tasks)
    return Allocation(
        nodes=int(nodes),
        tasks_per_node=int(match[1]) if match else None,
        cpus_per_task=_int(environ.get("SLURM_CPUS_PER_TASK")),
    )


def _number(value: Any) -> Optional[int]:
    """A Slurm JSON number: plain (<= 23.02) or {"set": ..., "infinite": ..., "number": ...}."""
    if isinstance(value, dict):
        if value.get("infinite") or not value.get("set", True):
            return None
        value = value.get("number")
    return _int(value)


def _int(value: Any) -> Optional[int]:
    match = re.match(r"^\s*(\d+)", str(value)) if value is not None else None
    return int(match[1]) if match else None


class InvalidScontrolJson(UsageError):
    """`scontrol show job --json` printed something that is not JSON, or JSON without the job."""


def parse_scontrol_json(text: str, profile_queue_field: str) -> JobRecord:
    """A JobRecord from `scontrol show job --json JOBID` (Slurm 21.08 to 25.x field shapes).
    Raises InvalidScontrolJson where the text is not JSON or lists no job."""
    try:
        job = json.loads(text)["jobs"][0]
        if not isinstance(job, dict):
            raise TypeError(f"a job is {type(job).__name__}, not an object")
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise InvalidScontrolJson(f"scontrol show job --json gave no job ({first_line(exc)})") from exc
    states = job.get("job_state", [])
    states = tuple(states if isinstance(states, list) else [states])
    limit = _number(job.get("time_limit"))
    gpus = _GPUS.search(str(job.get("tres_per_node") or ""))
    fields = {
        "nodes": _number(job.get("node_count")),
        "ntasks-per-node": _number(job.get("tasks_per_node", job.get("ntasks_per_node"))),
        "cpus-per-task": _number(job.get("cpus_per_task")),
        "gpus-per-node": gpus[1] if gpus else None,
        "constraint": job.get("features") or None,
        "qos": job.get("qos") or None,
        "partition": job.get("partition") or None,
        "account": job.get("account") or None,
        "reservation": job.get("resv_name") or None,
        "time": None if limit is None else limit * 60,
    }
    return _slurm_record(
        str(job.get("job_id")),
        fields,
        profile_queue_field,
        name=job.get("name", ""),
        states=states,
        requeue=bool(job.get("requeue")),
        preempted="PREEMPTED" in states or bool(_number(job.get("preempt_time"))),
        start_time=_number(job.get("start_time")),
        script=job.get("command"),
        workdir=job.get("current_working_directory"),
        outputs=[job[k] for k in ("standard_output", "standard_error") if job.get(k)],
    )


def parse_scontrol_oneliner(text: str, profile_queue_field: str) -> JobRecord:
    """A JobRecord from `scontrol show job -o JOBID`: NAME=VALUE fields, split where the next field
    begins (a value may hold spaces)."""
    values: dict[str, str] = {}
    last = None
    for word in text.strip().split(" "):
        if _SLURM_FIELD.match(word):
            last, value = word.split("=", 1)
            values[last] = value
        elif last is not None:
            values[last] += " " + word
    if "JobId" not in values:
        raise UsageError(f"scontrol show job -o gave no JobId: {text.strip()[:200]!r}")

    def value(name: str) -> Optional[str]:
        found = values.get(name)
        return None if found in (None, "", "(null)", "None", "Unknown", "N/A") else found

    limit = value("TimeLimit")
    gpus = _GPUS.search(value("TresPerNode") or "")
    fields = {
        "nodes": _int(value("NumNodes")),
        "ntasks-per-node": _int((value("NtasksPerN:B:S:C") or "").split(":")[0]),
        "cpus-per-task": _int(value("CPUs/Task")),
        "gpus-per-node": gpus[1] if gpus else None,
        "constraint": value("Features"),
        "qos": value("QOS"),
        "partition": value("Partition"),
        "account": value("Account"),
        "reservation": value("Reservation"),
        "time": None if limit is None else parse_walltime(limit, "slurm"),
    }
    state = value("JobState") or ""
    start = value("StartTime")
    return _slurm_record(
        values["JobId"],
        fields,
        profile_queue_field,
        name=value("JobName") or "",
        states=(state,),
        requeue=value("Requeue") == "1",
        preempted=state == "PREEMPTED" or value("PreemptTime") is not None,
        start_time=time.mktime(time.strptime(start, "%Y-%m-%dT%H:%M:%S")) if start else None,
        script=value("Command"),
        workdir=value("WorkDir"),
        outputs=[v for v in (value("StdOut"), value("StdErr")) if v],
    )


def _slurm_record(job_id: str, fields: dict[str, Any], queue_field: str, **known: Any) -> JobRecord:
    queue = fields.get(queue_field) if queue_field in ("qos", "partition") else None
    # A zero count is Slurm's "not asked for" (a request of 0 GPUs per node is kept: it was asked for).
    options = {
        name: str(value)
        for name, value in fields.items()
        if value is not None and name != "time" and (str(value) != "0" or name == "gpus-per-node")
    }
    if fields["time"] is not None:
        options["time"] = str(-(-fields["time"] // 60))  # whole minutes, as sbatch --time=M reads them
    return JobRecord(
        job_id=job_id,
        account=fields["account"],
        queue=queue,
        submit_queue=queue,
        nodes=fields["nodes"],
        walltime_s=fields["time"],
        options=options,
        **known,
    )


def _no_slurm_json(result: subprocess.CompletedProcess) -> bool:
    """scontrol failed because this Slurm cannot print JSON (see _NO_SLURM_JSON)."""
    return result.returncode != 0 and bool(_NO_SLURM_JSON.search(result.stderr or ""))


def read_slurm_job(job_id: str, queue_field: str, bound: ReadBound = FULL_READ) -> JobRecord:
    """`scontrol show job --json JOBID`, or `-o` where this Slurm has no JSON output (at once) or
    printed invalid JSON (with a warning on stderr). A failure of another kind is retried, and
    after the last try is an error: `-o` would ask the same controller."""
    result = _run(["scontrol", "show", "job", "--json", job_id], bound, final=_no_slurm_json)
    if result.returncode == 0:
        try:
            return parse_scontrol_json(result.stdout, queue_field)
        except InvalidScontrolJson as exc:
            _warn(f"{exc}; reading `scontrol show job -o {job_id}` instead")
    elif not _no_slurm_json(result):
        raise UsageError(f"scontrol show job --json {job_id} failed: {_said(result)}")
    result = _run(["scontrol", "show", "job", "-o", job_id], bound)
    if result.returncode != 0:
        raise UsageError(f"scontrol show job -o {job_id} failed: {_said(result)}")
    return parse_scontrol_oneliner(result.stdout, queue_field)


def read_job(
    scheduler: str, job_id: str, queue_field: str, environ: Mapping[str, str], bound: ReadBound = FULL_READ
) -> JobRecord:
    """The job's record from its batch system ("pbs" or "slurm"), each query within `bound`."""
    if scheduler == "pbs":
        return read_pbs_job(job_id, environ, bound)
    return read_slurm_job(job_id, queue_field, bound)


def termination_cause(record: JobRecord) -> str:
    """Why a job got SIGTERM, as its record tells: "preempted" (the scheduler is preempting it, with
    a grace time), "timeout" (its time limit), else "cancelled" (scancel, qdel, an administrator)."""
    if record.preempted:
        return "preempted"
    if "TIMEOUT" in record.states:
        return "timeout"
    return "cancelled"
