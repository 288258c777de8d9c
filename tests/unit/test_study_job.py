"""A job's own decisions, without a scheduler: the warning it gives itself before the walltime, and
what it does after a checkpoint (continue in a new job, leave it to Slurm's requeue, or stop)."""

from __future__ import annotations

import os
import signal
import time

import pytest

from harness.errors import EXIT_PREEMPTED, UsageError
from harness.study.jobs import continuation
from harness.study.jobs.job import arm_warning, json_objects, warning_delay
from harness.study.jobs.scheduler import JobRecord, parse_scontrol_json
from tests.helpers.study_helpers import make_job

from .test_study_scheduler import data


@pytest.fixture
def usr1():
    """The times SIGUSR1 arrived while the test ran."""
    arrivals = []
    previous = signal.signal(signal.SIGUSR1, lambda signum, frame: arrivals.append(time.monotonic()))
    yield arrivals
    signal.signal(signal.SIGUSR1, previous)


def wait_until(condition, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)


def test_pbs_jobs_warn_themselves_before_the_walltime(tmp_path, usr1):
    # qstat says 3 s of walltime, started now; STOP_BEFORE_WALLTIME=1: SIGUSR1 after 2 s.
    record = JobRecord("123.server", walltime_s=3, start_time=time.time())
    job = make_job("polaris", str(tmp_path / "job"), {"STOP_BEFORE_WALLTIME": "1"}, record=record, gpus=4)
    started = time.monotonic()
    timer = arm_warning(job)
    wait_until(lambda: usr1, 10)
    assert usr1 and 1.5 <= usr1[0] - started <= 3.5
    timer.cancel()


def test_a_disarmed_timer_stays_quiet(tmp_path, usr1):
    record = JobRecord("123.server", walltime_s=2, start_time=time.time())
    job = make_job("polaris", str(tmp_path / "job"), {"STOP_BEFORE_WALLTIME": "1"}, record=record, gpus=4)
    arm_warning(job).cancel()
    time.sleep(1.5)
    assert usr1 == []


def test_slurm_warns_the_job_itself_and_a_walltime_too_short_is_refused(tmp_path):
    slurm = make_job("perlmutter", str(tmp_path / "slurm"), record=JobRecord("1", walltime_s=60), gpus=4)
    assert warning_delay(slurm) is None  # #SBATCH --signal=B:USR1@300 does it
    gone = JobRecord("1", walltime_s=600, start_time=time.time() - 400)
    short = make_job("polaris", str(tmp_path / "pbs"), record=gone, gpus=4)
    with pytest.raises(UsageError, match="leaves no time before STOP_BEFORE_WALLTIME=300"):
        warning_delay(short)


class Resubmissions:
    """Stands in for the scheduler: why SIGTERM came, and the jobs submitted."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, cause: str) -> None:
        self.jobs = []
        monkeypatch.setattr(continuation, "_cause", lambda job: cause)
        monkeypatch.setattr(continuation, "resubmit", lambda job, queue: self.jobs.append(queue) or "77")


def perlmutter_job(tmp_path, fixture: str, **values: str):
    record = parse_scontrol_json(data(fixture), "qos")
    return make_job("perlmutter", str(tmp_path / "job"), values, record=record, gpus=4, script="/kit/job.sbatch")


def test_the_warning_before_the_limit_continues_in_a_new_job(tmp_path, monkeypatch, capsys):
    scheduler = Resubmissions(monkeypatch, cause="cancelled")  # not asked: USR1 is the warning
    job = perlmutter_job(tmp_path, "scontrol_perlmutter_regular.json")
    assert continuation.continue_study(job, signal.SIGUSR1) == 0
    assert [queue.name for queue in scheduler.jobs] == ["regular"]
    assert job.events() == ["resubmitted as 77"]
    assert "warned after a checkpoint; continues as job 77" in capsys.readouterr().out


def test_a_cancelled_job_stops_after_its_checkpoint(tmp_path, monkeypatch, capsys):
    scheduler = Resubmissions(monkeypatch, cause="cancelled")
    job = perlmutter_job(tmp_path, "scontrol_perlmutter_regular.json")
    assert continuation.continue_study(job, signal.SIGTERM) == EXIT_PREEMPTED
    assert scheduler.jobs == [] and "not resubmitting" in capsys.readouterr().out


def test_a_preempted_step_continues_the_study_even_if_the_batch_shell_saw_no_signal(tmp_path, monkeypatch):
    # Slurm signals a preempted job's steps at the start of its grace time; the sweep sees its run
    # stop with status 3 and no signal of its own. The record says why: preempted.
    scheduler = Resubmissions(monkeypatch, cause="preempted")
    job = perlmutter_job(tmp_path, "scontrol_perlmutter_regular.json")
    assert continuation.continue_study(job, None) == 0 and len(scheduler.jobs) == 1


def test_slurm_requeues_a_preempted_job_itself_where_the_queue_does(tmp_path, monkeypatch):
    scheduler = Resubmissions(monkeypatch, cause="preempted")
    job = perlmutter_job(tmp_path, "scontrol_perlmutter_preempted.json")  # QOS preempt, --requeue
    assert continuation.continue_study(job, signal.SIGTERM) == 0
    assert scheduler.jobs == [] and job.events() == ["preempted: requeued by the scheduler"]


@pytest.mark.parametrize(
    "fixture, values, reason",
    [
        ("scontrol_perlmutter_debug.json", {}, "queue debug allows no job chaining"),
        ("scontrol_perlmutter_regular.json", {"RESUBMIT": "0"}, "RESUBMIT=0"),
        (
            "scontrol_perlmutter_regular.json",
            {"MAX_RESUBMISSIONS": "0"},
            "0 resubmissions already (MAX_RESUBMISSIONS=0)",
        ),
    ],
)
def test_no_continuation_where_it_is_not_allowed(tmp_path, monkeypatch, capsys, fixture, values, reason):
    scheduler = Resubmissions(monkeypatch, cause="preempted")
    job = perlmutter_job(tmp_path, fixture, **values)
    assert continuation.continue_study(job, signal.SIGUSR1) == EXIT_PREEMPTED and scheduler.jobs == []
    assert f"not resubmitting ({reason}" in capsys.readouterr().out


def frontier_job(tmp_path, qos: str, **values: str):
    """A Frontier job submitted with -p batch -q QOS, as its scontrol record shows it."""
    record = JobRecord(
        "9",
        name="harness-scaling",
        account="csc123",
        queue="batch",
        submit_queue="batch",
        options={"partition": "batch", "qos": qos, "nodes": "2", "account": "csc123", "time": "60"},
    )
    return make_job(
        "frontier", str(tmp_path / "job"), values, record=record, nodes=2, gpus=8, script="/kit/job.sbatch"
    )


def test_frontiers_debug_qos_never_chains(tmp_path, monkeypatch, capsys):
    scheduler = Resubmissions(monkeypatch, cause="preempted")
    job = frontier_job(tmp_path, "debug")  # the partition, batch-bin5, would allow it
    assert continuation.continue_study(job, signal.SIGUSR1) == EXIT_PREEMPTED and scheduler.jobs == []
    assert "not resubmitting (QOS debug allows no job chaining (OLCF prohibits" in capsys.readouterr().out


def test_a_frontier_continuation_keeps_its_partition_and_its_qos(tmp_path, monkeypatch):
    script = tmp_path / "job.sbatch"
    script.write_text("#!/bin/bash\n")
    job = frontier_job(tmp_path, "normal")
    job.script = str(script)
    command, _, _ = continuation._submission(job, job.profile.execution_queue("batch", 2))
    flags = dict(zip(command[2:-1:2], command[3:-1:2]))  # sbatch --parsable, then --name value pairs
    assert (flags["--partition"], flags["--qos"], flags["--nodes"], flags["--time"]) == ("batch", "normal", "2", "60")


def test_a_slurm_resubmission_leaves_this_jobs_variables_behind(tmp_path, monkeypatch):
    script = tmp_path / "job.sbatch"
    script.write_text("#!/bin/bash\n")
    job = perlmutter_job(tmp_path, "scontrol_perlmutter_regular.json")
    job.script = str(script)
    for name, value in (("SLURM_JOB_ID", "31415926"), ("SLURM_NTASKS", "8"), ("SLURM_CONF", "/etc/slurm.conf")):
        monkeypatch.setenv(name, value)
    command, environ, directory = continuation._submission(job, job.profile.queue("regular"))
    assert command[0] == "sbatch" and command[-1] == str(script)
    assert (
        "SLURM_JOB_ID" not in environ and "SLURM_NTASKS" not in environ and environ["SLURM_CONF"] == "/etc/slurm.conf"
    )
    assert environ["JOB_DIR"] == job.settings.job_dir and directory == "/global/homes/j/jdoe/dp-harness"
    assert os.path.isabs(environ["KIT_DIR"])


def test_discovery_reads_ranks_that_printed_onto_one_line():
    # Ten ranks printing at once under mpirun put two objects on one line, between launcher noise.
    text = 'warning: x\n{"rank": 1, "world_size": 2}{"rank": 0, "world_size": 2}\n{"broken": \n'
    assert json_objects(text) == [{"rank": 1, "world_size": 2}, {"rank": 0, "world_size": 2}]
