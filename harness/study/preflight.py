"""Before the queue, on a login node: `harness study --check` and `--submit`.

Run through the job template (`bash submissions/polaris.sc --check -- -A <project> ...`), the check
sees the job's own software environment (the template's module and venv lines ran first), reads the
request the way the scheduler will (the template's directives, the command line over them), and
judges it with harness.study.check, and refuses the submission options the site says break its
jobs (the profile's `refused_options`: `qsub -V` on Aurora) and a qsub/sbatch from outside the kit
that does not name it (the job would find no kit and exit 2). `--submit` queues it, from the kit,
only when the check passed.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import Optional

from ..errors import EXIT_USAGE, UsageError
from .check import CheckResult, StudyRequest, run_checks
from .scheduler import Allocation
from .settings import default_job_dir, kit_directory, resolve_settings, sweep_settings
from .sites import load_site
from .submit import Submission, parse_submission, submit_command
from .walltime import format_walltime

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
    check: bool,
    submit: bool,
    scheduler_args: Sequence[str],
    kit_dir: Optional[str] = None,
) -> int:
    """`harness study`: --check or --submit on a login node; otherwise this job's part of the study."""
    if not (check or submit):
        from .job import run_study

        if scheduler_args:
            raise UsageError(f"scheduler options ({shlex.join(scheduler_args)}) go with --check or --submit")
        return run_study(site, kit_dir=kit_dir, script=script)
    if not script:
        raise UsageError(
            "--check and --submit judge a job script: name it with --script (the templates pass themselves)"
        )
    # --check judges the qsub/sbatch it prints, which the user runs from here; --submit runs it from the kit
    submit_dir = os.getcwd() if check else None
    result, submission = check_study(site, script, scheduler_args, kit_dir=kit_dir, submit_dir=submit_dir)
    _print(result)
    if not result.ok:
        return EXIT_USAGE
    command = submit_command(submission)
    if check:
        print(
            f"check passed ({submission.nodes} node(s), queue {submission.queue or 'default'}, walltime "
            f"{format_walltime(submission.walltime_s)}); submit with: {shlex.join(command)}",
            flush=True,
        )
        return 0
    kit = kit_dir or kit_directory(os.environ)
    # From the kit, so that the job finds it where it was submitted (PBS_O_WORKDIR, SLURM_SUBMIT_DIR).
    queued = subprocess.run(command, cwd=kit, capture_output=True, text=True, timeout=SUBMIT_TIMEOUT_S)
    if queued.returncode != 0:
        raise UsageError(f"{command[0]} refused the job: {(queued.stderr or queued.stdout).strip()[:300]}")
    print(queued.stdout.strip().split(";")[0], flush=True)
    return 0
