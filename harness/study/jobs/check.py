"""`harness study --check`: everything that would make a study fail in the queue, found before it.

On a login node (run through the job template, so that the check sees the job's software
environment) it judges the qsub/sbatch request; in the job, the templates run the same checks first.
Each problem is one line that names its fix; any problem means exit status 2 and nothing queued or
run. Warnings (job data in a small home directory, a queue where the job cannot resubmit itself)
are printed and do not stop it.

    backends     each one imports here, and where the site needs it, was built for it (Horovod's
                 controllers and GPU operations, from its build info); the site's note says how to
                 get a missing one (Polaris' conda has no Horovod since 2025-10); one the site cannot
                 run at all (Horovod on Aurora's XPUs) is refused, with the site's note on what to use
    queue        the queue exists and accepts this many nodes for this long (a routing queue: one
                 of its execution queues does); the account is set where the site requires one
    QOS          where the site's queues are partitions and its profile lists QOSes (Frontier), the
                 QOS named with -q exists and accepts this many nodes for this long, too
    chaining     RESUBMIT=1 in a queue or QOS that forbids job chaining (NERSC's and OLCF's debug QOS)
    task         TASK is a spec the runs can resolve and the file it names exists; in the job, the
                 task loads (its module imports, its function returns a Task) before anything runs
    data         the images task's DATASET's files are in DATA_DIR
    storage      JOB_DIR and DATA_DIR lie on file systems the job asked for (PBS `-l filesystems`)
                 and meant for job data (at NERSC not $HOME, 40 GB)
    network      the site's libfabric plugin for NCCL/RCCL is where the runs will load it
                 (unless NCCL_NET_PLUGIN=off; harness.study.jobs.network)
    the sweep    every run's `harness train` flags are accepted (batch splits, backend options)

A queue the profile cannot list (a reservation queue R123456, a training queue such as ATPESC,
Polaris' preemptable, Perlmutter's shared QOS: the profile's `unlisted_queues`) is accepted with a
warning that its limits are unknown; a queue the profile lists is checked against its limits.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Optional

from ...backends import get_backend
from ...config import DEFAULT_TASK
from ...data.disk import DISK_DATASETS
from ...errors import UsageError
from ...tasks.loading import check_spec
from ..scaling.sweep import SweepSettings, plan_sweep
from ..scaling.task_spec import load_sweep_task, names_a_file
from ..sites import Queue, SiteProfile
from ..sites.walltime import format_walltime
from .network import apply_network_plugin, check_network_plugin
from .settings import StudySettings, home_warning


@dataclass(frozen=True)
class StudyRequest:
    """What the scheduler is asked for (login node) or gave (in the job)."""

    nodes: int
    account: Optional[str] = None
    queue: Optional[str] = None
    qos: Optional[str] = None  # Slurm -q at a site whose queues are partitions (Frontier's debug)
    walltime_s: Optional[int] = None
    filesystems: Optional[str] = None  # PBS -l filesystems, e.g. home:eagle
    queued: bool = False  # the scheduler has already accepted it (the checks in the job)


@dataclass
class CheckResult:
    """The problems (each stops the study; exit status 2) and warnings, one line each."""

    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def check_backends(profile: SiteProfile, backends: Sequence[str], gpus: int) -> list[str]:
    """A line for each backend that cannot run in this Python, or lacks what the site needs of it."""
    problems = []
    for name in backends:
        note = profile.backend_notes.get(name)
        if name in profile.unsupported_backends:  # whatever this Python has: the site's nodes cannot run it
            problems.append(f"backend {name} is not supported on {profile.name}" + (f": {note}" if note else ""))
            continue
        try:
            backend = get_backend(name)
            backend.check_available()
            built = backend.build_info()
        except UsageError as exc:
            problems.append(f"backend {name}: {exc}" + (f"; on {profile.name}: {note}" if note else ""))
            continue
        if not gpus:
            continue  # the site's requirements are those of its GPU runs (NCCL, MPI across nodes)
        missing = [
            what
            for what, wanted in profile.backend_requirements.get(name, {}).items()
            if bool(built.get(what)) != wanted
        ]
        if missing:
            shown = " ".join(f"{k}={v}" for k, v in built.items())
            problems.append(
                f"backend {name} is built without {', '.join(missing)} ({shown}), which {profile.name} "
                f"needs; {note or 'rebuild it: HOROVOD_GPU_OPERATIONS=NCCL bash tools/build_horovod.sh'}"
            )
    return problems


def check_queue(profile: SiteProfile, request: StudyRequest, result: CheckResult) -> None:
    """The queue takes this many nodes for this long; the account is there where required."""
    if profile.account_required and not request.account and not request.queued:
        option = "-A <project>" if profile.scheduler == "pbs" else "-A <account> (or SBATCH_ACCOUNT)"
        result.problems.append(f"no account: {profile.name} charges every job to one; pass {option}")
    if profile.scheduler == "pbs" and request.walltime_s is None and not request.queued:
        result.problems.append("no walltime: pass -l walltime=HH:MM:SS (e.g. -l walltime=01:00:00)")
    if not profile.queues:
        return
    unlisted = profile.unlisted_queue(request.queue)
    if unlisted is not None:
        result.warnings.append(
            f"queue {request.queue} is a {unlisted.kind}, which {profile.name}'s profile cannot list: its "
            "node and walltime limits are unknown here and not checked"
        )
        return
    if not request.queue:
        option = {"queue": "-q", "qos": "-q <qos>", "partition": "-p <partition>"}.get(profile.queue_field, "-q")
        (result.warnings if request.queued else result.problems).append(
            f"no queue named: choose one of {', '.join(q for q, v in profile.queues.items() if not v.execution_only)}"
            f" ({option})"
        )
        return
    try:
        named = profile.queue(request.queue)
        queue = profile.execution_queue(request.queue, request.nodes)
    except UsageError as exc:
        (result.warnings if request.queued else result.problems).append(str(exc))
        return
    if named is not None and named.execution_only and not request.queued:
        result.problems.append(
            f"queue {named.name} takes no submissions; submit to {profile.submit_queue(named.name)}, "
            f"which routes jobs there"
        )
    if queue is not None:
        _check_limits(f"queue {queue.name}", queue, request, result)


def _check_limits(
    what: str, limits: Queue, request: StudyRequest, result: CheckResult, instead: Optional[str] = None
) -> None:
    """`limits` (a queue or QOS, called `what`) takes this many nodes for this long; `instead` is the
    way out other than asking for less (a QOS: submitting without it)."""
    if not limits.accepts(request.nodes):
        result.problems.append(
            f"{what} takes {limits.node_range()}, not {request.nodes}; "
            f"ask for a node count it takes or {instead or 'choose another queue'}"
        )
    limit = limits.max_walltime_s
    if limit is not None and (request.walltime_s is None or request.walltime_s > limit):
        result.problems.append(
            f"walltime {format_walltime(request.walltime_s)} exceeds {what}'s "
            f"{format_walltime(limit)}; ask for at most {format_walltime(limit)}"
            + (f", or {instead}" if instead else "")
        )


def check_qos(profile: SiteProfile, request: StudyRequest, result: CheckResult) -> None:
    """The QOS named beside the partition (Frontier's -q debug) takes this many nodes for this long."""
    try:
        qos = profile.qos_limits(request.qos)
    except UsageError as exc:
        # A queued job's QOS is one the scheduler took: its default QOS, which the profile need not list.
        if not request.queued:
            result.problems.append(f"{exc}, or leave -q out for the default QOS")
        return
    if qos is None:
        return
    _check_limits(f"QOS {qos.name}", qos, request, result, instead=f"submit without -q {qos.name}")
    if qos.max_running_jobs and not request.queued:
        jobs = f"{qos.max_running_jobs} job{'s' if qos.max_running_jobs > 1 else ''}"
        result.warnings.append(
            f"QOS {qos.name} runs at most {jobs} of yours at a time: this one waits while another of yours runs there"
        )


def _no_chaining(profile: SiteProfile, request: StudyRequest) -> list[tuple[str, str, Queue]]:
    """The queue and QOS this request runs in that forbid job chaining: (what, the other way, limits)."""
    found = []
    try:
        queue = profile.execution_queue(request.queue, request.nodes) if request.queue else None
    except UsageError:
        queue = None  # check_queue has said it
    if queue is not None and not queue.chaining:
        found.append((f"queue {request.queue}", "to another queue", queue))
    try:
        qos = profile.qos_limits(request.qos)
    except UsageError:
        qos = None  # check_qos has said it
    if qos is not None and not qos.chaining:
        found.append((f"QOS {qos.name}", f"without -q {qos.name}", qos))
    return found


def check_chaining(profile: SiteProfile, request: StudyRequest, resubmit: str, result: CheckResult) -> None:
    """RESUBMIT=1 where the queue or QOS forbids job chaining is refused; RESUBMIT=auto there only warns."""
    if resubmit == "0":
        return
    for what, instead, limits in _no_chaining(profile, request):
        why = f" ({limits.note})" if limits.note else ""
        if resubmit == "1":
            result.problems.append(
                f"RESUBMIT=1, but {what} allows no job chaining{why}; submit with RESUBMIT=0 (or auto), or {instead}"
            )
        else:
            result.warnings.append(
                f"{what} allows no job chaining{why}: a study cut short there stops "
                "after its checkpoint; submit it again with the same JOB_DIR to continue"
            )


def check_task(settings: StudySettings) -> list[str]:
    """TASK is a spec the runs can resolve (its form; a built-in task's arguments), and the file it
    names exists. Its module is not imported here: that happens on the job's node (check_task_loads)."""
    try:
        check_spec(settings.task, settings.task_args)
    except UsageError as exc:
        return [f"TASK: {exc}"]
    target = settings.task.rpartition(":")[0]
    if names_a_file(target) and not os.path.isfile(target):
        return [
            f"TASK={settings.task}: no file {target}; give the task file's path (a relative one is read from the kit)"
        ]
    return []


def check_task_loads(sweep: SweepSettings) -> list[str]:
    """The runs' task loads (in the job, where the runs will load it): its module imports, its
    function returns a Task."""
    try:
        load_sweep_task(sweep.backends[0], sweep.train_args)
    except UsageError as exc:
        return [str(exc)]
    return []


def check_data(settings: StudySettings) -> list[str]:
    """DATASET's files are where the runs will look for them (the images task's)."""
    if settings.task != DEFAULT_TASK or settings.dataset not in DISK_DATASETS:
        return []
    if not settings.data_dir:
        return [
            f"DATASET={settings.dataset} is read from files: pass DATA_DIR=<directory> (fetch it on a login "
            f"node with `harness data download {settings.dataset} --data-dir DIR`)"
        ]
    if not os.path.isdir(settings.data_dir) or not os.listdir(settings.data_dir):
        return [
            f"DATA_DIR={settings.data_dir} holds no {settings.dataset}: `harness data download "
            f"{settings.dataset} --data-dir {settings.data_dir}` on a login node, or fix DATA_DIR"
        ]
    return []


def check_storage(
    profile: SiteProfile,
    paths: Mapping[str, str],
    filesystems: Optional[str],
    environ: Mapping[str, str],
    result: CheckResult,
) -> None:
    """Each path (JOB_DIR, DATA_DIR) on a file system the job asked for and meant for job data."""
    for name, path in paths.items():
        entry = profile.storage_for(path, environ) if path else None
        home = home_warning(name, path, profile, environ)
        if home and not (entry and entry.warn):  # the profile's own warning names the site's fix
            result.warnings.append(home)
        if entry is None:
            continue
        if entry.warn:
            result.warnings.append(f"{name}={path}: {entry.warn}")
        if entry.filesystem and filesystems is not None and entry.filesystem not in filesystems.split(":"):
            result.problems.append(
                f"{name}={path} is on {entry.filesystem}, which -l filesystems={filesystems} does not "
                f"name; pass -l filesystems={filesystems}:{entry.filesystem}"
            )


def check_sweep(sweep: SweepSettings) -> list[str]:
    """Every run's flags are accepted: the plan is made (and thrown away) here."""
    try:
        plan_sweep(sweep, environ={})
    except UsageError as exc:
        return [f"the runs' settings: {exc}"]
    return []


def run_checks(
    profile: SiteProfile,
    settings: StudySettings,
    request: StudyRequest,
    sweep: SweepSettings,
    environ: Mapping[str, str],
    storage_path: str,
) -> CheckResult:
    """Every check above; `storage_path` is JOB_DIR, or where it will be made."""
    result = CheckResult()
    result.problems += check_backends(profile, settings.backends, settings.gpus_per_node)
    check_queue(profile, request, result)
    check_qos(profile, request, result)
    check_chaining(profile, request, settings.resubmit, result)
    result.problems += check_task(settings) + check_data(settings)
    environ = dict(environ)
    apply_network_plugin(profile, settings.network_plugin, environ)  # what the runs will search
    result.problems += check_network_plugin(profile, settings.network_plugin, settings.gpus_per_node, environ)
    check_storage(
        profile, {"JOB_DIR": storage_path, "DATA_DIR": settings.data_dir}, request.filesystems, environ, result
    )
    if result.ok:  # the runs' flags repeat what is wrong above (an unknown backend): judged once that is right
        result.problems += check_sweep(sweep)
    return result
