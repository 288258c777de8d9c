"""Before the queue, on a login node: `harness study --check`, `--submit` and `--smoke`.

Run through the job template (`bash submissions/polaris.sc --check -- -A <project> ...`), the check
sees the job's own software environment (the template's module and venv lines ran first), reads the
request the way the scheduler will (the template's directives, the command line over them), and
judges it with harness.study.jobs.check, and refuses the submission options the site says break its
jobs (the profile's `refused_options`: `qsub -V` on Aurora) and a qsub/sbatch from outside the kit
that does not name it (the job would find no kit and exit 2). `--submit` queues it, from the kit,
only when the check passed. `--smoke` checks and queues the template's smoke job, then waits for
its result (harness.study.jobs.smoke).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Optional

from ...errors import EXIT_USAGE, UsageError
from ..sites import load_site
from ..sites.walltime import format_walltime
from .check import CheckResult, StudyRequest, run_checks
from .scheduler import Allocation
from .settings import default_job_dir, kit_directory, resolve_settings, sweep_settings
from .submit import Submission, parse_submission, submit_command

SUBMIT_TIMEOUT_S = 120


def check_study(
    site: str,
    script: str,
    scheduler_args: Sequence[str] = (),
    environ: Optional[Mapping[str, str]] = None,
    kit_dir: Optional[str] = None,
    submit_dir: Optional[str] = None,
) -> tuple[CheckResult, Submission]:
    """Judge `qsub/sbatch SCHEDULER_ARGS SCRIPT` for site `site` before it is queued, issued from
    `submit_dir` (None: from the kit, as `--submit` does).

    Returns the problems and warnings (one line each, naming the fix) and the parsed submission;
    bad input that stops the check itself (an unreadable script, a malformed -l) raises UsageError."""
    profile = load_site(site)
    environ = dict(os.environ if environ is None else environ)
    kit = kit_dir or kit_directory(environ)
    script = os.path.abspath(script)  # qsub/sbatch run from the kit, and the job resubmits this path
    submission = parse_submission(profile.scheduler, script, scheduler_args, environ, profile.queue_field)
    allocation = Allocation(
        nodes=submission.nodes, tasks_per_node=submission.tasks_per_node, cpus_per_task=submission.cpus_per_task
    )
    stem = os.path.splitext(os.path.basename(script))[0]
    try:  # the job's nodes have the site's GPUs, whatever this login node has
        settings = resolve_settings(
            profile,
            submission.variables,
            allocation,
            profile.gpus_per_node,
            default_job_dir(profile, kit, stem, "<job id>", submission.account, environ),
            kit,
        )
    except UsageError as exc:
        return CheckResult(problems=[str(exc)]), submission
    request = StudyRequest(
        nodes=submission.nodes,
        account=submission.account,
        queue=submission.queue,
        qos=submission.qos,
        walltime_s=submission.walltime_s,
        filesystems=submission.filesystems,
    )
    storage = submission.variables.get("JOB_DIR") or os.path.dirname(settings.job_dir)
    result = run_checks(profile, settings, request, sweep_settings(profile, settings, kit), environ, storage)
    result.problems += [
        f"{option}: {why}" for option, why in profile.refused_options.items() if option in submission.options
    ]
    outside = _kit_out_of_reach(profile.scheduler, submission, kit, submit_dir)
    if outside:
        result.problems.append(outside)
    stop = settings.stop_before_walltime
    if profile.warning == "timer" and stop and submission.walltime_s is not None and submission.walltime_s <= stop:
        result.problems.append(
            f"walltime {format_walltime(submission.walltime_s)} leaves no time before "
            f"STOP_BEFORE_WALLTIME={stop}; ask for more walltime or pass a smaller one"
        )
    return result, submission


def _kit_out_of_reach(scheduler: str, submission: Submission, kit: str, submit_dir: Optional[str]) -> Optional[str]:
    """Why the job, submitted from `submit_dir`, would not find the kit: the templates look for it in
    KIT_DIR, else where the job was submitted from (PBS_O_WORKDIR, SLURM_SUBMIT_DIR), and a job that
    finds no kit there exits 2 at its start."""
    if submit_dir is None or os.path.realpath(submit_dir) == os.path.realpath(kit):
        return None
    if "KIT_DIR" in submission.variables:  # -v KIT_DIR=... (PBS), the environment sbatch passes (Slurm)
        return None
    program, option = (
        ("qsub", f"-v KIT_DIR={kit}") if scheduler == "pbs" else ("sbatch", f"--export=ALL,KIT_DIR={kit}")
    )
    return (
        f"{program} from {submit_dir} starts the job there, not in the kit, and the job would exit 2; "
        f"cd {kit} before {program}, or pass {option}"
    )


def _print(result: CheckResult) -> None:
    for line in result.warnings:
        print(f"harness study: warning: {line}", file=sys.stderr, flush=True)
    for line in result.problems:
        print(f"harness study: error: {line}", file=sys.stderr, flush=True)


def study_command(
    site: str,
    script: Optional[str],
    mode: str,
    scheduler_args: Sequence[str],
    kit_dir: Optional[str] = None,
) -> int:
    """`harness study`: on a login node `mode` "check", "submit" or "smoke" (harness.study.jobs.smoke);
    "run": this job's part of the study."""
    if mode == "run":
        from .job import run_study

        if scheduler_args:
            raise UsageError(f"scheduler options ({shlex.join(scheduler_args)}) go with --check, --submit or --smoke")
        return run_study(site, kit_dir=kit_dir, script=script)
    if not script:
        raise UsageError(f"--{mode} judges a job script: name it with --script (the templates pass themselves)")
    kit = kit_dir or kit_directory(os.environ)
    environ = dict(os.environ)
    if mode == "smoke":
        scheduler_args, environ = smoke_arguments(site, script, scheduler_args, environ, kit)
    # --check judges the qsub/sbatch it prints, which the user runs from here; the others run it from the kit
    submit_dir = os.getcwd() if mode == "check" else None
    result, submission = check_study(site, script, scheduler_args, environ, kit_dir, submit_dir)
    _print(result)
    if not result.ok:
        return EXIT_USAGE
    command = submit_command(submission)
    if mode == "check":
        print(
            f"check passed ({submission.nodes} node(s), queue {submission.queue or 'default'}, walltime "
            f"{format_walltime(submission.walltime_s)}); submit with: {shlex.join(command)}",
            flush=True,
        )
        return 0
    # From the kit, so that the job finds it where it was submitted (PBS_O_WORKDIR, SLURM_SUBMIT_DIR).
    queued = subprocess.run(command, cwd=kit, env=environ, capture_output=True, text=True, timeout=SUBMIT_TIMEOUT_S)
    if queued.returncode != 0:
        raise UsageError(f"{command[0]} refused the job: {(queued.stderr or queued.stdout).strip()[:300]}")
    job_id = queued.stdout.strip().split(";")[0]
    print(job_id, flush=True)
    if mode == "smoke":
        from .smoke import wait_for_smoke

        return wait_for_smoke(load_site(site), job_id, submission.variables["JOB_DIR"], environ)
    return 0


def smoke_arguments(
    site: str, script: str, scheduler_args: Sequence[str], environ: dict[str, str], kit: str
) -> tuple[list[str], dict[str, str]]:
    """The smoke job's qsub/sbatch options and environment (harness.study.jobs.smoke), its JOB_DIR the
    request's own, else smoke-<time> where the study's jobs would go."""
    from .smoke import smoke_request

    profile = load_site(site)
    submission = parse_submission(
        profile.scheduler, os.path.abspath(script), scheduler_args, environ, profile.queue_field
    )
    stamp = time.strftime("%Y%m%d-%H%M%S")
    job_dir = submission.variables.get("JOB_DIR") or default_job_dir(
        profile, kit, "smoke", stamp, submission.account, environ
    )
    return smoke_request(profile, scheduler_args, environ, submission.nodes, os.path.realpath(job_dir))
