"""`harness study` inside a batch job: one scaling study of the allocation, all of it in JOB_DIR.

    study.json              the resolved settings; a resubmitted or requeued job runs them again
    jobs.txt                the job chain: starts, signals, ends, resubmissions (time, job id, event)
    discovery-<job>.jsonl   `harness env` of every rank of the allocation under the site launcher
    results.jsonl, logs/, checkpoints/   the sweep's (harness.study.scaling.sweep)
    figures/scaling-*.{png,svg,json}, report.md   what the records show, after every job
    <name>-<job>.out, <name>.o<job>   the jobs' own output, moved here from the submission directory

A job: reads itself from the scheduler (harness.study.jobs.scheduler), resolves its settings, applies the
site's environment (network variables, TMPDIR, rendezvous domain), runs the same checks as
`--check` (harness.study.jobs.check), checks where every rank landed against the plan (hosts, local
ranks, one rendezvous; harness.study.jobs.placement), warns itself before the walltime where the
scheduler will not (PBS), runs the sweep (which passes SIGTERM/SIGUSR1 to the run in progress; it
checkpoints), and writes figures and report. A study cut short continues: warned before
its time limit, or preempted, the job resubmits itself (or leaves it to Slurm where a preempted job
is requeued); cancelled (scancel, qdel) it stops after its checkpoint.

Exit statuses: 0 complete, or continued in another job; 1 discovery or a run failed; 2 bad settings
(nothing ran); 3 stopped after a checkpoint and not continued; 4 a rank died (see its log).
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any, Optional

from ...errors import EXIT_PEER_FAILURE, EXIT_PREEMPTED, EXIT_USAGE, UsageError, first_line
from ...process.accelerator import detect_accelerator
from ...process.discovery import RENDEZVOUS_DOMAIN_VARIABLE
from ...process.imports import IMPORT_FIRST_VARIABLE
from ...process.launchers import launch_environment
from ...process.signals import SignalCatcher
from ..scaling.sweep import SweepSettings, run_sweep, template_command
from ..sites import SiteProfile, load_site
from .check import CheckResult, StudyRequest, check_task_loads, run_checks
from .continuation import continue_study
from .jobdir import StudyJob, say
from .network import apply_network_plugin
from .placement import placement_problem
from .scheduler import JobRecord, pbs_allocation, read_job, slurm_allocation
from .settings import default_job_dir, kit_directory, load_settings, resolve_settings, site_launch, sweep_settings

DISCOVERY_TIMEOUT_S = 600
MPS_TIMEOUT_S = 120
# MPS makes AF_UNIX sockets in its pipe directory, and a socket path holds at most 107 bytes; under
# mpiexec a job's long TMPDIR (/local/scratch/pbs.<job id>...) leaves too little for their names.
MPS_PIPE_LIMIT = 80
# What the job's start reads from the scheduler, judged field by field: why a read that failed every
# try does not end the job. Informative: the account, queue, QOS, walltime and file systems (checks
# of what the scheduler has already accepted), the name and output files (moved into JOB_DIR), the
# script's path (names the default JOB_DIR; the template's own stands in), and at PBS the walltime
# and start time (the timer that warns the job before its walltime: without it PBS's SIGTERM at the
# walltime still has the run checkpoint, and the study stops there rather than continuing). Needed
# for correctness: the submit options and the queue submitted to, without which a continuation would
# ask for other resources; the job goes on but does not resubmit itself (continuation._blocked).
UNKNOWN_WITHOUT_RECORD = "account, queue, QOS, walltime, start time, file systems, output files and submit options"


def gpus_on_this_node() -> int:
    """The accelerator devices (NVIDIA, AMD or Intel GPUs) this job sees on its node, as the process
    layer counts them; 0 on a CPU node."""
    return detect_accelerator().count


def open_job(profile: SiteProfile, environ: dict[str, str], kit_dir: str, script: Optional[str]) -> StudyJob:
    """This job as the scheduler sees it, and its study's settings (saved ones when it continues one)."""
    variable = "PBS_JOBID" if profile.scheduler == "pbs" else "SLURM_JOB_ID"
    job_id = environ.get(variable)
    if not job_id:
        raise UsageError(
            f"{variable} is not set: `harness study` runs a study inside a {profile.scheduler} job; "
            "on a login node use --check or --submit"
        )
    allocation = pbs_allocation(environ) if profile.scheduler == "pbs" else slurm_allocation(environ)
    record = read_own_record(profile, job_id, environ)
    submitted = record.script or script
    if submitted and record.workdir and not os.path.isabs(submitted):
        submitted = os.path.join(record.workdir, submitted)
    stem = os.path.splitext(os.path.basename(submitted or "study"))[0]
    job_dir = os.path.realpath(
        environ.get("JOB_DIR")
        or default_job_dir(profile, kit_dir, stem, job_id.split(".")[0], record.account, environ)
    )
    saved = load_settings(job_dir)
    settings = saved or resolve_settings(
        profile, {**environ, "JOB_DIR": job_dir}, allocation, gpus_on_this_node(), job_dir, kit_dir
    )
    return StudyJob(profile, job_id, record, allocation, settings, kit_dir, submitted, saved is not None)


def read_own_record(profile: SiteProfile, job_id: str, environ: dict[str, str]) -> JobRecord:
    """This job's record from the scheduler; where every try failed, one that knows only the job id
    (`known` False), with a warning naming what is unknown (see UNKNOWN_WITHOUT_RECORD for why)."""
    try:
        return read_job(profile.scheduler, job_id, profile.queue_field, environ)
    except UsageError as exc:
        timer = "no timer before the walltime, " if profile.warning == "timer" else ""
        print(
            f"harness study: warning: cannot read job {job_id} from the scheduler ({first_line(exc)}); going on "
            f"without its {UNKNOWN_WITHOUT_RECORD}: {timer}no resubmission",
            file=sys.stderr,
            flush=True,
        )
        return JobRecord(job_id, known=False)


def mps_directories(environ: dict[str, str], number: str) -> dict[str, str]:
    """NVIDIA MPS's pipe and log directories: per job, on the node's own disk (TMPDIR)."""
    base = os.path.join(environ.get("TMPDIR") or "/tmp", f"mps-{number}")
    return {"CUDA_MPS_PIPE_DIRECTORY": os.path.join(base, "pipe"), "CUDA_MPS_LOG_DIRECTORY": os.path.join(base, "log")}


def apply_site_environment(job: StudyJob, environ: dict[str, str]) -> None:
    """What every rank must inherit: the site's network variables (its required ones over the job's),
    the rendezvous domain, and what the per-rank GPU and MPS helpers read."""
    environ.update(job.profile.environment)
    for name, value in job.profile.environment_defaults.items():
        environ.setdefault(name, value)
    apply_network_plugin(job.profile, job.settings.network_plugin, environ)
    if job.profile.import_first:  # read by `python -m harness` in every rank, before torch
        environ[IMPORT_FIRST_VARIABLE] = job.profile.import_first["module"]
    if job.settings.rendezvous_domain:
        environ[RENDEZVOUS_DOMAIN_VARIABLE] = job.settings.rendezvous_domain
    environ.update(GPUS_PER_NODE=str(job.settings.gpus_per_node), PROCS_PER_GPU=str(job.settings.procs_per_gpu))
    environ.update(mps_directories(environ, job.number))


def in_job_checks(job: StudyJob, sweep: SweepSettings, environ: dict[str, str]) -> CheckResult:
    """`--check`'s checks against what the scheduler gave, plus what only the job can see."""
    record = job.record
    request = StudyRequest(
        nodes=job.allocation.nodes,
        account=record.account,
        queue=record.submit_queue or record.queue,
        qos=record.options.get("qos"),
        walltime_s=record.walltime_s,
        filesystems=record.filesystems,
        queued=True,
    )
    result = run_checks(job.profile, job.settings, request, sweep, environ, job.settings.job_dir)
    if result.ok:  # on the job's node the task is loaded, as every run will load it
        result.problems += check_task_loads(sweep)
    pipe = environ["CUDA_MPS_PIPE_DIRECTORY"]
    if job.settings.procs_per_gpu > 1 and len(pipe) > MPS_PIPE_LIMIT:
        result.problems.append(
            f"the MPS pipe directory {pipe} is {len(pipe)} characters long, too long for the "
            f"AF_UNIX sockets MPS makes there (at most {MPS_PIPE_LIMIT}); set TMPDIR=/tmp"
        )
    try:
        warning_delay(job)
    except UsageError as exc:
        result.problems.append(str(exc))
    return result


def warning_delay(job: StudyJob) -> Optional[float]:
    """Seconds from now until the job must warn itself (SIGUSR1) before its walltime, where the
    scheduler will not (PBS has no --signal); None where no timer is needed."""
    settings, record = job.settings, job.record
    if job.profile.warning != "timer" or not settings.stop_before_walltime or record.walltime_s is None:
        return None
    elapsed = time.time() - record.start_time if record.start_time else 0.0
    delay = record.walltime_s - settings.stop_before_walltime - elapsed
    if delay <= 0:
        raise UsageError(
            f"the walltime ({record.walltime_s} s, {elapsed:.0f} s gone) leaves no time before "
            f"STOP_BEFORE_WALLTIME={settings.stop_before_walltime}; ask for more walltime or lower it"
        )
    return delay


def discover(job: StudyJob, launch: str) -> None:
    """`harness env` on every rank of the whole allocation under the site launcher: a rank layout other
    than nodes x ranks per node (by host, with local ranks and sizes), or ranks that disagree on the
    rendezvous, stops the job here (status 1), naming the hosts, before hours are spent."""
    per_node, nodes = job.settings.ranks_per_node, job.allocation.nodes
    total = per_node * nodes
    command = template_command(f"{launch} {{python}} -m harness env {{args}}", total, per_node, "", [])
    job.log_command("discovery", command)
    say(f"discovery: {shlex.join(command)}")
    ran = subprocess.run(
        command, stdout=subprocess.PIPE, text=True, env=launch_environment(), timeout=DISCOVERY_TIMEOUT_S
    )
    print(ran.stdout, end="", flush=True)
    seen, status = json_objects(ran.stdout), ran.returncode
    path = job.path(f"discovery-{job.number}.jsonl")
    with open(path, "w") as output:  # one rank a line, whatever the launcher interleaved
        output.writelines(json.dumps(entry, sort_keys=True) + "\n" for entry in seen)
    ranks = {
        entry.get("rank") for entry in seen if entry.get("world_size") == total and entry.get("launcher") != "none"
    }
    if status != 0 or ranks != set(range(total)) or len(seen) != total:
        raise StudyFailed(
            f"discovery saw {len(ranks)} of {total} ranks ({len(seen)} line(s), exit status "
            f"{status}; see {path}); check the launcher's flags and RANKS_PER_NODE"
        )
    problem = placement_problem(seen, nodes, per_node)
    if problem:
        raise StudyFailed(f"discovery: {problem} (see {path})")
    hosts = {f"{entry.get('master_addr')}:{entry.get('master_port')}" for entry in seen}
    say(f"discovery: {total} ranks on {nodes} node(s), {per_node} per node, rendezvous at {', '.join(sorted(hosts))}")


def json_objects(text: str) -> list[dict[str, Any]]:
    """Every JSON object in `text`: ranks printing at once may share a line, and launchers add noise."""
    decoder, found, index = json.JSONDecoder(), [], text.find("{")
    while index >= 0:
        try:
            value, end = decoder.raw_decode(text, index)
        except ValueError:
            end = index + 1
        else:
            if isinstance(value, dict):
                found.append(value)
        index = text.find("{", end)
    return found


class StudyFailed(Exception):
    """The study cannot start: the ranks did not see the layout it plans for, or MPS did not start."""


def _mps(job: StudyJob, which: str) -> Optional[str]:
    """Start or stop NVIDIA MPS once per node, where the site does it per job (Polaris); what went
    wrong, if something did."""
    command = job.profile.mps_command(which, {"nodes": job.allocation.nodes, "kit": job.kit_dir})
    if command is None or job.settings.procs_per_gpu < 2:
        return None
    job.log_command(f"MPS {which}", command)
    status = subprocess.run(command, env=launch_environment(), timeout=MPS_TIMEOUT_S).returncode
    return f"MPS {which} (`{shlex.join(command)}`) failed with status {status}" if status else None


def predicted_beside_measured(directory: str, records: list[dict[str, Any]]) -> str:
    """The report's section of the study's prediction against its runs ('' where none was written)."""
    from ..prediction.foresight import prediction_markdown, prediction_rows

    rows = prediction_rows(directory, records)
    if not rows:
        return ""
    return "\n## Predicted before the runs, and measured\n\n" + prediction_markdown(rows) + "\n"


def summarize(job: StudyJob) -> None:
    """Figures and report from whatever records the study has so far."""
    from ...training.record import read_records
    from ..scaling.html_report import write_html_report
    from ..scaling.plot import write_figures
    from ..scaling.report import scaling_report

    results = job.path("results.jsonl")
    if not os.path.exists(results) or not os.path.getsize(results):
        say("no records yet: no figures or report")
        return
    try:
        records = read_records([results])
        os.makedirs(job.path("figures"), exist_ok=True)
        write_figures(records, job.path("figures", "scaling"))
        with open(job.path("report.md"), "w") as handle:
            handle.write(scaling_report(records) + "\n" + predicted_beside_measured(job.settings.job_dir, records))
        write_html_report(records, job.path("report.html"), job.settings.job_dir)
    except Exception as exc:  # whatever it is: a figure that fails must not cost the study its continuation
        say(f"figures or report failed ({type(exc).__name__}: {exc}); the records are in {results}")
        return
    say(f"figures in {job.path('figures')}, report in {job.path('report.md')} and {job.path('report.html')}")


def predict_first(job: StudyJob, sweep: SweepSettings) -> None:
    """The study's prediction for its planned backends and node counts, in JOB_DIR before the
    first run (harness.study.prediction.foresight); a prediction that fails costs the study nothing."""
    from ..prediction.foresight import PREDICTION_FILE, write_prediction

    if os.path.exists(job.path(PREDICTION_FILE)):  # a continued study keeps the first job's prediction
        return
    ppn = max(sweep.ppn or job.settings.ranks_per_node or 1, 1)
    nodes = [max(1, -(-ranks // ppn)) for ranks in sweep.ranks]
    try:
        say(
            f"prediction in {write_prediction(job.settings.job_dir, job.profile.name, sweep.backends, nodes, sweep.train_args)}"
        )
    except Exception as exc:  # the model is no reason to lose the allocation
        say(f"no prediction ({type(exc).__name__}: {exc})")


def move_outputs(job: StudyJob) -> None:
    """The scheduler opened this job's output where it was submitted; renamed into JOB_DIR (same file
    system) it keeps receiving the output, so everything the job writes lives in JOB_DIR."""
    for path in dict.fromkeys(job.record.outputs):
        path = path.replace("%j", job.number).replace("%x", job.record.name)
        target = job.path(os.path.basename(path))
        if not os.path.isfile(path) or os.path.dirname(os.path.realpath(path)) == job.settings.job_dir:
            continue
        if not os.path.exists(target) and os.stat(path).st_dev == os.stat(job.settings.job_dir).st_dev:
            os.rename(path, target)
            say(f"this job's output continues in {target}")


def arm_warning(job: StudyJob) -> Optional[threading.Timer]:
    """A timer that sends this process SIGUSR1 STOP_BEFORE_WALLTIME seconds before the walltime,
    where the scheduler will not warn the job itself (PBS); cancel it when the study ends."""
    delay = warning_delay(job)
    if delay is None:
        return None
    timer = threading.Timer(delay, os.kill, (os.getpid(), signal.SIGUSR1))
    timer.daemon = True
    timer.start()
    at = time.strftime("%H:%M:%S", time.localtime(time.time() + delay))
    say(f"will checkpoint and continue at {at}, {job.settings.stop_before_walltime} s before the walltime")
    return timer


def _run(job: StudyJob, sweep: SweepSettings, launch: str, recorder: SignalCatcher) -> tuple[int, Optional[int]]:
    """Discovery, the walltime timer, MPS and the sweep: the sweep's status, and the preemption
    signal this process received (None when none came: a preempted step's ranks may get it alone)."""
    discover(job, launch)
    predict_first(job, sweep)
    timer = arm_warning(job)
    try:
        failed = _mps(job, "start")
        if failed:
            raise StudyFailed(failed)
        if recorder.last is not None:  # warned before the sweep began: nothing to checkpoint
            say(f"got {signal.Signals(recorder.last).name} before the sweep began: no run to checkpoint")
            return EXIT_PREEMPTED, recorder.last
        say(
            f"sweep {sweep.sweep_id}: backends {' '.join(sweep.backends)}, ranks {sweep.ranks}, "
            f"{sweep.scaling} scaling, in {job.settings.job_dir}"
        )
        result = run_sweep(sweep)
        return result.status, result.signal or recorder.last
    finally:
        if timer is not None:
            timer.cancel()
        failed = _mps(job, "stop")
        if failed:
            say(f"{failed}; the node's daemon ends with the job")


def _report_problems(result: CheckResult) -> bool:
    """Print the check's lines; whether it passed."""
    for line in result.warnings:
        print(f"harness study: warning: {line}", file=sys.stderr, flush=True)
    for line in result.problems:
        print(f"harness study: error: {line}", file=sys.stderr, flush=True)
    return result.ok


def _prepare(job: StudyJob) -> None:
    os.makedirs(job.path("logs"), exist_ok=True)
    move_outputs(job)
    if not job.resumed:
        job.settings.save()
    job.note(f"start on {socket.gethostname()}: {job.allocation.nodes} node(s) x {job.settings.ranks_per_node} ranks")


def _verify(job: StudyJob, status: int) -> None:
    """A smoke job's result, for `harness study --smoke` to print (harness.study.jobs.smoke)."""
    from ...training.record import read_records
    from .smoke import write_verification

    results = job.path("results.jsonl")
    records = read_records([results]) if os.path.exists(results) and os.path.getsize(results) else []
    say(f"smoke result in {write_verification(job, status, records)}")


def run_study(site: str, kit_dir: Optional[str] = None, script: Optional[str] = None) -> int:
    """Run this job's part of the study (see the module docstring); returns the exit status.

    Reads the job from the scheduler and the settings from this process's environment; bad
    settings print one line each and return 2 before anything is written. SIGTERM and SIGUSR1 are
    caught from the first line on: a warning that comes early is kept, not fatal."""
    # Recorded only, outside the sweep (the sweep forwards them to its runs itself).
    with SignalCatcher((signal.SIGTERM, signal.SIGUSR1)) as recorder:
        return _study(site, kit_dir, script, recorder)


def _study(site: str, kit_dir: Optional[str], script: Optional[str], recorder: SignalCatcher) -> int:
    # The job process's own environment, changed for good (apply_site_environment): a launcher's
    # change for its children, which every rank the sweep starts must inherit; nothing to restore.
    environ = os.environ
    profile = load_site(site)
    kit = kit_dir or kit_directory(environ)
    job = open_job(profile, dict(environ), kit, script)
    apply_site_environment(job, environ)
    sweep = sweep_settings(profile, job.settings, kit)
    if not _report_problems(in_job_checks(job, sweep, dict(environ))):
        return EXIT_USAGE
    _prepare(job)
    try:
        status, signum = _run(job, sweep, site_launch(profile, job.settings, kit), recorder)
    except StudyFailed as exc:
        job.note(f"end: {exc}")
        print(f"harness study: error: {exc}", file=sys.stderr, flush=True)
        return 1
    if signum is not None:
        job.note(f"signal {signal.Signals(signum).name[3:]}")
    job.note(f"end: sweep status {status}")
    if job.settings.smoke:
        _verify(job, status)
    if status == 0:
        summarize(job)
        job.note("study complete")
        say(f"study complete: {job.settings.job_dir}")
        return 0
    # A preempted job decides first, while its grace time runs; the figures can wait.
    outcome = continue_study(job, signum) if status == EXIT_PREEMPTED else status
    summarize(job)
    if status == EXIT_PEER_FAILURE:
        say(
            f"a rank died during a run (status 4): the study stops here; see the run's log in {job.path('logs')}, "
            f"then submit again with JOB_DIR={job.settings.job_dir} to finish it"
        )
    elif status != EXIT_PREEMPTED:
        say(f"the sweep failed (status {status}); see {job.path('logs')}")
    return outcome
