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
    chaining     RESUBMIT=1 in a queue that forbids job chaining (NERSC's debug QOS)
    data         DATASET's files are in DATA_DIR
    storage      JOB_DIR and DATA_DIR lie on file systems the job asked for (PBS `-l filesystems`)
                 and meant for job data (at NERSC not $HOME, 40 GB)
    the sweep    every run's `harness train` flags are accepted (batch splits, backend options)
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import List, Mapping, Optional, Sequence

from ..backends import get_backend
from ..data.disk import DISK_DATASETS
from ..errors import UsageError
from .settings import StudySettings
from .sites import SiteProfile
from .sweep import SweepSettings, plan_sweep
from .walltime import format_walltime


@dataclass(frozen=True)
class StudyRequest:
    """What the scheduler is asked for (login node) or gave (in the job)."""

    nodes: int
    account: Optional[str] = None
    queue: Optional[str] = None
    walltime_s: Optional[int] = None
    filesystems: Optional[str] = None  # PBS -l filesystems, e.g. home:eagle
    queued: bool = False  # the scheduler has already accepted it (the checks in the job)


@dataclass
class CheckResult:
    """The problems (each stops the study; exit status 2) and warnings, one line each."""

    problems: List[str] = field(default_factory=list)
    warnings: List[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def check_backends(profile: SiteProfile, backends: Sequence[str], gpus: int) -> List[str]:
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
        missing = [what for what, wanted in profile.backend_requirements.get(name, {}).items()
                   if bool(built.get(what)) != wanted]
        if missing:
            shown = " ".join(f"{k}={v}" for k, v in built.items())
            problems.append(f"backend {name} is built without {', '.join(missing)} ({shown}), which {profile.name} "
                            f"needs; {note or 'rebuild it: HOROVOD_GPU_OPERATIONS=NCCL bash tools/build_horovod.sh'}")
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
    if not request.queue:
        (result.warnings if request.queued else result.problems).append(
            f"no queue named: choose one of {', '.join(q for q, v in profile.queues.items() if not v.execution_only)}"
            f" ({'-q' if profile.scheduler == 'pbs' else '-q <qos>'})")
        return
    try:
        named = profile.queue(request.queue)
        queue = profile.execution_queue(request.queue, request.nodes)
    except UsageError as exc:
        (result.warnings if request.queued else result.problems).append(str(exc))
        return
    if named is not None and named.execution_only and not request.queued:
        result.problems.append(f"queue {named.name} takes no submissions; submit to {profile.submit_queue(named.name)}, "
                               f"which routes jobs there")
    if queue is None:
        return
    if not queue.accepts(request.nodes):
        result.problems.append(f"queue {queue.name} takes {queue.node_range()}, not {request.nodes}; "
                               "ask for a node count it takes or choose another queue")
    limit = queue.max_walltime_s
    if limit is not None and (request.walltime_s is None or request.walltime_s > limit):
        result.problems.append(f"walltime {format_walltime(request.walltime_s)} exceeds queue {queue.name}'s "
                               f"{format_walltime(limit)}; ask for at most {format_walltime(limit)}")


def check_chaining(profile: SiteProfile, queue_name: Optional[str], nodes: int, resubmit: str,
                   result: CheckResult) -> None:
    """RESUBMIT=1 where the queue forbids job chaining is refused; RESUBMIT=auto there only warns."""
    try:
        queue = profile.execution_queue(queue_name, nodes) if queue_name else None
    except UsageError:
        return  # check_queue has said it
    if queue is None or queue.chaining or resubmit == "0":
        return
    why = f" ({queue.note})" if queue.note else ""
    if resubmit == "1":
        result.problems.append(f"RESUBMIT=1, but queue {queue_name} allows no job chaining{why}; submit with "
                               "RESUBMIT=0 (or auto), or to another queue")
    else:
        result.warnings.append(f"queue {queue_name} allows no job chaining{why}: a study cut short there stops "
                               "after its checkpoint; submit it again with the same JOB_DIR to continue")


def check_data(settings: StudySettings) -> List[str]:
    """DATASET's files are where the runs will look for them."""
    if settings.dataset not in DISK_DATASETS:
        return []
    if not settings.data_dir:
        return [f"DATASET={settings.dataset} is read from files: pass DATA_DIR=<directory> (fetch it on a login "
                f"node with `harness data download {settings.dataset} --data-dir DIR`)"]
    if not os.path.isdir(settings.data_dir) or not os.listdir(settings.data_dir):
        return [f"DATA_DIR={settings.data_dir} holds no {settings.dataset}: `harness data download "
                f"{settings.dataset} --data-dir {settings.data_dir}` on a login node, or fix DATA_DIR"]
    return []


def check_storage(profile: SiteProfile, paths: Mapping[str, str], filesystems: Optional[str],
                  environ: Mapping[str, str], result: CheckResult) -> None:
    """Each path (JOB_DIR, DATA_DIR) on a file system the job asked for and meant for job data."""
    for name, path in paths.items():
        entry = profile.storage_for(path, environ) if path else None
        if entry is None:
            continue
        if entry.warn:
            result.warnings.append(f"{name}={path}: {entry.warn}")
        if entry.filesystem and filesystems is not None and entry.filesystem not in filesystems.split(":"):
            result.problems.append(f"{name}={path} is on {entry.filesystem}, which -l filesystems={filesystems} does not "
                                   f"name; pass -l filesystems={filesystems}:{entry.filesystem}")


def check_sweep(sweep: SweepSettings) -> List[str]:
    """Every run's flags are accepted: the plan is made (and thrown away) here."""
    try:
        plan_sweep(sweep, environ={})
    except UsageError as exc:
        return [f"the runs' settings: {exc}"]
    return []


def run_checks(profile: SiteProfile, settings: StudySettings, request: StudyRequest, sweep: SweepSettings,
               environ: Mapping[str, str], storage_path: str) -> CheckResult:
    """Every check above; `storage_path` is JOB_DIR, or where it will be made."""
    result = CheckResult()
    result.problems += check_backends(profile, settings.backends, settings.gpus_per_node)
    check_queue(profile, request, result)
    check_chaining(profile, request.queue, request.nodes, settings.resubmit, result)
    result.problems += check_data(settings)
    check_storage(profile, {"JOB_DIR": storage_path, "DATA_DIR": settings.data_dir}, request.filesystems, environ,
                  result)
    if result.ok:  # the runs' flags repeat what is wrong above (an unknown backend): judged once that is right
        result.problems += check_sweep(sweep)
    return result

