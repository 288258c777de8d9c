"""What a job does when its study was cut short after a checkpoint (the sweep's status 3).

    SIGUSR1, the warning before the time limit (Slurm's --signal, the PBS job's own timer)
        -> continue in a new job
    SIGTERM, and the scheduler is preempting the job (Slurm: PREEMPTED, or a preempt time set while
        its grace time runs)
        -> continue: Slurm requeues the job itself where the queue requeues preempted jobs and the
           job may be requeued (same job id, same JOB_DIR); otherwise a new job
    SIGTERM otherwise (scancel, qdel, an administrator)
        -> stop: a cancelled study must not come back

A new job is the same submission, after this one ends (harness.study.jobs.submit): PBS to the queue the
job was submitted to (a routing queue stays a routing queue), Slurm with every resource it asked
for (at Frontier its partition and its QOS) and --requeue where the queue allows it. The queue or
QOS a job record names is the profile's by name or by alias (Perlmutter's records name gpu_debug,
gpu_regular, gpu_preempt for -q debug, regular, preempt): its rules apply, and the continuation
asks for it by its own name. RESUBMIT=0 never does it; neither does a job the scheduler could not
describe at its start (what it asked for is unknown); a queue or QOS that forbids job chaining
(NERSC's and OLCF's debug QOS) never gets it; and MAX_RESUBMISSIONS bounds the chain.
"""

from __future__ import annotations

import os
import signal
import subprocess
from typing import Optional

from ...errors import EXIT_PREEMPTED, UsageError
from ..sites import Queue
from .jobdir import StudyJob, say
from .scheduler import ReadBound, read_job, termination_cause
from .submit import qsub_resubmission, sbatch_resubmission

SUBMIT_TIMEOUT_S = 120
# The read that tells why SIGTERM came runs in the grace time before SIGKILL (Slurm's GraceTime, PBS's
# kill_delay: often 30 to 120 s), which must also hold the decision and a resubmission: 2 tries of
# 10 s with one 2 s pause, ~22 s a query at most (a fallback's second query follows a first that
# answered), not the job start's 4 tries of 60 s (~4 min).
SIGNAL_READ = ReadBound(attempts=2, timeout_s=10.0)
RESUBMITTED = "resubmitted as "


def _queue(job: StudyJob) -> Optional[Queue]:
    """The queue the job runs in, as the site profile knows it (for a routing queue, the execution
    queue it routes this job to); None where the profile does not know it."""
    name = job.record.submit_queue or job.record.queue
    try:
        return job.profile.execution_queue(name, job.allocation.nodes) if name else None
    except UsageError:
        return None


def _qos(job: StudyJob) -> Optional[Queue]:
    """The job's QOS where the profile lists QOSes beside its partitions (Frontier); None elsewhere,
    and for a QOS it does not list (the default one, which limits nothing the profile knows of)."""
    try:
        return job.profile.qos_limits(job.record.options.get("qos"))
    except UsageError:
        return None


def _cause(job: StudyJob) -> str:
    """Why SIGTERM came, from the job's record read now (the grace time is running)."""
    try:
        record = read_job(job.profile.scheduler, job.job_id, job.profile.queue_field, os.environ, bound=SIGNAL_READ)
    except UsageError as exc:
        say(f"cannot tell why SIGTERM came ({exc}); taking it as a cancellation")
        return "cancelled"
    return termination_cause(record)


def _submission(job: StudyJob, queue: Optional[Queue]) -> tuple[list[str], dict[str, str], str]:
    """The continuation's submission: command, environment, directory to submit from."""
    if not job.script or not os.path.isfile(job.script):
        raise UsageError(f"the job script as submitted ({job.script}) is not there to submit again")
    job_dir = job.settings.job_dir
    variables = {"JOB_DIR": job_dir, "KIT_DIR": job.kit_dir}
    if job.profile.scheduler == "pbs":
        target = job.record.submit_queue or job.profile.submit_queue(job.record.queue or "")
        command = qsub_resubmission(job.record, target, job_dir, job.script, variables)
        environ = dict(os.environ)
    else:
        requeue = queue is not None and queue.preempt == "requeue"
        command = sbatch_resubmission(
            job.record,
            job.profile.queue_field,
            job_dir,
            job.script,
            requeue,
            with_qos=bool(job.profile.qos),
            submit_name=job.profile.submit_name,
        )
        # sbatch passes its environment to the new job: not this job's own SLURM_* variables, which
        # would leak into the new job's steps.
        environ = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_") or k == "SLURM_CONF"}
        environ.update(variables)
    return command, environ, job.record.workdir or job.kit_dir


def resubmit(job: StudyJob, queue: Optional[Queue]) -> str:
    """Submit the study's next job; its id."""
    command, environ, directory = _submission(job, queue)
    job.log_command("resubmission", command)
    result = subprocess.run(
        command, env=environ, cwd=directory, capture_output=True, text=True, timeout=SUBMIT_TIMEOUT_S
    )
    if result.returncode != 0 or not result.stdout.strip():
        raise UsageError(f"`{command[0]}` refused the resubmission: {(result.stderr or result.stdout).strip()[:300]}")
    return result.stdout.strip().split(";")[0]


def _blocked(job: StudyJob, queue: Optional[Queue]) -> Optional[str]:
    """Why this job may not queue its continuation, if it may not."""
    if job.settings.resubmit == "0":
        return "RESUBMIT=0"
    if not job.record.known:  # a resubmission repeats what this job asked for, which is not known
        return "the scheduler could not be read at this job's start, so what it asked for is unknown"
    for what, limits in (("queue", queue), ("QOS", _qos(job))):
        if limits is not None and not limits.chaining:
            return f"{what} {limits.name} allows no job chaining" + (f" ({limits.note})" if limits.note else "")
    done = sum(event.startswith(RESUBMITTED) for event in job.events())
    if done >= job.settings.max_resubmissions:
        return f"{done} resubmissions already (MAX_RESUBMISSIONS={job.settings.max_resubmissions})"
    return None


def continue_study(job: StudyJob, signum: Optional[int]) -> int:
    """After a checkpoint: continue the study elsewhere, or say how to; the job's exit status."""
    again = f"submit {job.script} again with JOB_DIR={job.settings.job_dir} to continue"
    cause = "warned" if signum == signal.SIGUSR1 else _cause(job)
    if cause == "cancelled":
        say(f"stopped by SIGTERM (scancel/qdel) after a checkpoint; not resubmitting; {again}")
        return EXIT_PREEMPTED
    queue = _queue(job)
    if cause == "preempted" and queue is not None and queue.preempt == "requeue" and job.record.requeue:
        job.note("preempted: requeued by the scheduler")
        say("preempted after a checkpoint; the scheduler requeues this job (same id and JOB_DIR), which continues")
        return 0
    blocked = _blocked(job, queue)
    if blocked:
        say(f"{cause} after a checkpoint, not resubmitting ({blocked}); {again}")
        return EXIT_PREEMPTED
    try:
        new_job = resubmit(job, queue)
    except (UsageError, OSError, subprocess.SubprocessError) as exc:
        say(f"{cause} after a checkpoint, but resubmitting failed ({exc}); {again}")
        return EXIT_PREEMPTED
    job.note(f"{RESUBMITTED}{new_job}")
    say(f"{cause} after a checkpoint; continues as job {new_job} (same JOB_DIR)")
    return 0
