"""Scheduler reads that survive: qstat and scontrol retried with backoff (scontrol's JSON only where
the failure may pass), invalid JSON read again from plain `qstat -f` (folded lines joined again) or
`scontrol show job -o`, reads under a signal bounded to fit a grace time, a job that goes on without
its record where the scheduler cannot be read, and a workshop's reservation or reservation queue
kept when the study continues in a new job."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess

import pytest

from harness.errors import EXIT_PREEMPTED, UsageError
from harness.study.jobs import continuation, scheduler
from harness.study.jobs.job import read_own_record, warning_delay
from harness.study.jobs.scheduler import (
    JobRecord,
    ReadBound,
    parse_qstat_full,
    parse_qstat_json,
    parse_scontrol_json,
    parse_scontrol_oneliner,
    read_pbs_job,
    read_slurm_job,
)
from harness.study.jobs.submit import qsub_resubmission, sbatch_resubmission
from harness.study.sites import load_site
from tests.conftest import REPO
from tests.helpers.study_helpers import make_job

pytestmark = pytest.mark.timeout(60)

DATA = os.path.join(REPO, "tests", "data")
JOB = "3214567.polaris-pbs-01.hsn.cm.polaris.alcf.anl.gov"


def data(name: str) -> str:
    with open(os.path.join(DATA, name)) as handle:
        return handle.read()


class FakeQstat:
    """Answers in turn, as subprocess.run would (qstat's or scontrol's); records the commands it was
    given and the timeouts they were given."""

    def __init__(self, *answers: tuple[int, str]) -> None:
        self.answers = list(answers)
        self.commands: list[list[str]] = []
        self.timeouts: list[float] = []

    def __call__(self, command, **kwargs):
        self.commands.append(command)
        self.timeouts.append(kwargs["timeout"])
        status, text = self.answers.pop(0)
        return subprocess.CompletedProcess(command, status, text if status == 0 else "", "" if status == 0 else text)


@pytest.fixture
def no_pause(monkeypatch):
    pauses: list[float] = []
    monkeypatch.setattr(scheduler.time, "sleep", pauses.append)
    return pauses


def test_a_transient_qstat_failure_is_retried_with_a_doubling_pause(monkeypatch, no_pause):
    fake = FakeQstat(
        (1, "cannot connect to server"), (1, "cannot connect to server"), (0, data("qstat_polaris_prod.json"))
    )
    monkeypatch.setattr(scheduler.subprocess, "run", fake)
    record = read_pbs_job(JOB, {})
    assert record.walltime_s == 3 * 3600 and len(fake.commands) == 3
    assert no_pause == [scheduler.QUERY_PAUSE_S, 2 * scheduler.QUERY_PAUSE_S]


def test_a_qstat_that_keeps_failing_is_one_line_after_a_bounded_number_of_tries(monkeypatch, no_pause):
    fake = FakeQstat(*[(1, "cannot connect to server")] * scheduler.QUERY_ATTEMPTS)
    monkeypatch.setattr(scheduler.subprocess, "run", fake)
    with pytest.raises(UsageError, match="qstat -fF json .* failed: cannot connect to server"):
        read_pbs_job(JOB, {})
    assert len(fake.commands) == scheduler.QUERY_ATTEMPTS


def test_invalid_qstat_json_falls_back_to_qstat_f_with_a_warning(monkeypatch, no_pause, capsys):
    broken = data("qstat_polaris_prod.json").replace('"Variable_List":{', '"Variable_List":{"PBS_O_X":"a "b" c",', 1)
    broken = broken.replace('"Variable_List": {', '"Variable_List": {"PBS_O_X": "a "b" c",', 1)
    fake = FakeQstat((0, broken), (0, data("qstat_polaris_prod_f.txt")))
    monkeypatch.setattr(scheduler.subprocess, "run", fake)
    record = read_pbs_job(JOB, {})
    assert [command[:2] for command in fake.commands] == [["qstat", "-fF"], ["qstat", "-f"]]
    assert dataclasses.asdict(record) == dataclasses.asdict(parse_qstat_json(data("qstat_polaris_prod.json"), JOB, {}))
    [warning] = capsys.readouterr().err.strip().splitlines()
    assert "invalid JSON" in warning and "openpbs #2541" in warning


def test_qstat_f_joins_folded_values_and_splits_variables_at_unescaped_commas():
    text = "Job Id: 7.server\n    Variable_List = PBS_O_QUEUE=R123456,BACKENDS=ddp\\,fsdp,JOB_\n\tDIR=/lus/x\n"
    record = parse_qstat_full(text, "7.server", {})
    assert record.variables == {"PBS_O_QUEUE": "R123456", "BACKENDS": "ddp,fsdp", "JOB_DIR": "/lus/x"}
    assert record.submit_queue == "R123456"


def test_a_pbs_continuation_stays_in_its_reservation_queue():
    record = parse_qstat_json(data("qstat_polaris_prod.json"), JOB, {"PBS_O_QUEUE": "R123456"})
    command = qsub_resubmission(record, record.submit_queue, "/lus/job", "/kit/submissions/polaris.sc", {})
    assert command[command.index("-q") + 1] == "R123456" and command.count("-q") == 1


def test_a_slurm_continuation_keeps_the_reservation():
    text = data("scontrol_oneliner_2205.txt").replace("Reservation=(null)", "Reservation=atpesc_day2")
    if "Reservation=" not in text:
        text = text.strip() + " Reservation=atpesc_day2\n"
    record = parse_scontrol_oneliner(text, "qos")
    command = sbatch_resubmission(record, "qos", "/scratch/job", "/kit/job.sbatch", requeue=False)
    assert command[command.index("--reservation") + 1] == "atpesc_day2"
    plain = sbatch_resubmission(
        parse_scontrol_oneliner(data("scontrol_oneliner_2205.txt"), "qos"), "qos", "/s", "/j", False
    )
    assert "--reservation" not in plain


def test_the_json_record_keeps_the_reservation_too():
    import json

    document = json.loads(data("scontrol_perlmutter_regular.json"))
    document["jobs"][0]["resv_name"] = "atpesc_day2"
    record = scheduler.parse_scontrol_json(json.dumps(document), "qos")
    assert record.options["reservation"] == "atpesc_day2"


# -- Slurm ------------------------------------------------------------------------------------------

SLURM_JOB = "1234567"
SOCKET_TIMEOUT = "slurm_load_jobs error: Socket timed out on send/recv operation"


def options(command: list[str]) -> str:
    """`--json` or `-o`: which form of `scontrol show job` a command asked for."""
    return command[3]


def test_a_transient_scontrol_json_failure_is_retried_with_a_doubling_pause(monkeypatch, no_pause):
    fake = FakeQstat(
        (1, SOCKET_TIMEOUT),
        (1, "scontrol: error: Unable to contact slurm controller (connect failure)"),
        (0, data("scontrol_perlmutter_regular.json")),
    )
    monkeypatch.setattr(scheduler.subprocess, "run", fake)
    record = read_slurm_job(SLURM_JOB, "qos")
    assert [options(command) for command in fake.commands] == ["--json"] * 3
    assert no_pause == [scheduler.QUERY_PAUSE_S, 2 * scheduler.QUERY_PAUSE_S]
    assert dataclasses.asdict(record) == dataclasses.asdict(
        parse_scontrol_json(data("scontrol_perlmutter_regular.json"), "qos")
    )


def test_an_scontrol_that_keeps_failing_is_one_line_after_a_bounded_number_of_tries(monkeypatch, no_pause):
    # -o is not tried: it would ask the same controller.
    fake = FakeQstat(*[(1, SOCKET_TIMEOUT + "\nmore detail")] * scheduler.QUERY_ATTEMPTS)
    monkeypatch.setattr(scheduler.subprocess, "run", fake)
    with pytest.raises(UsageError, match="scontrol show job --json 1234567 failed: .*Socket timed out") as caught:
        read_slurm_job(SLURM_JOB, "qos")
    assert "\n" not in str(caught.value)
    assert [options(command) for command in fake.commands] == ["--json"] * scheduler.QUERY_ATTEMPTS


@pytest.mark.parametrize(
    "said",
    [
        "scontrol: unrecognized option '--json'",  # Slurm before 21.08
        "scontrol: error: Unable to load serializer plugin for application/json",  # no JSON plugins built
        "scontrol: invalid option -- 'json'",
    ],
)
def test_a_slurm_without_json_reads_o_at_once(monkeypatch, no_pause, capsys, said):
    fake = FakeQstat((1, said), (0, data("scontrol_oneliner_2205.txt")))
    monkeypatch.setattr(scheduler.subprocess, "run", fake)
    record = read_slurm_job(SLURM_JOB, "qos")
    assert [options(command) for command in fake.commands] == ["--json", "-o"] and no_pause == []
    assert record.job_id == SLURM_JOB and record.queue == "regular"
    assert capsys.readouterr().err == ""  # expected where Slurm has no JSON: nothing to warn of


@pytest.mark.parametrize(
    "printed", ['{"jobs": [{"job_id": 1234567, "name": "a "b""}]}', '{"jobs": []}', '{"errors": [], "meta": {}}']
)
def test_invalid_scontrol_json_falls_back_to_o_with_a_warning(monkeypatch, no_pause, capsys, printed):
    fake = FakeQstat((0, printed), (0, data("scontrol_oneliner_2205.txt")))
    monkeypatch.setattr(scheduler.subprocess, "run", fake)
    record = read_slurm_job(SLURM_JOB, "qos")
    assert [options(command) for command in fake.commands] == ["--json", "-o"]
    assert record.job_id == SLURM_JOB and record.options["account"] == "m4321"
    [warning] = capsys.readouterr().err.strip().splitlines()
    assert "gave no job" in warning and "scontrol show job -o 1234567" in warning


def test_a_failing_o_fallback_is_retried_then_one_line(monkeypatch, no_pause):
    fake = FakeQstat((1, "scontrol: unrecognized option '--json'"), *[(1, SOCKET_TIMEOUT)] * scheduler.QUERY_ATTEMPTS)
    monkeypatch.setattr(scheduler.subprocess, "run", fake)
    with pytest.raises(UsageError, match="scontrol show job -o 1234567 failed: .*Socket timed out"):
        read_slurm_job(SLURM_JOB, "qos")
    assert [options(command) for command in fake.commands] == ["--json"] + ["-o"] * scheduler.QUERY_ATTEMPTS


# -- reads under a signal ---------------------------------------------------------------------------


def test_the_read_under_sigterm_is_bounded_to_fit_a_grace_time(tmp_path, monkeypatch):
    bounds = []

    def read(*args, bound=scheduler.FULL_READ):
        bounds.append(bound)
        return parse_scontrol_json(data("scontrol_perlmutter_preempted.json"), "qos")

    monkeypatch.setattr(continuation, "read_job", read)
    job = make_job("perlmutter", str(tmp_path / "job"), record=JobRecord("1"), gpus=4)
    assert continuation._cause(job) == "preempted"
    assert bounds == [continuation.SIGNAL_READ]
    bound = continuation.SIGNAL_READ
    worst = bound.attempts * bound.timeout_s + scheduler.QUERY_PAUSE_S * (2 ** (bound.attempts - 1) - 1)
    assert bound.attempts == 2 and bound.timeout_s == 10 and worst <= 30  # a query within a 30 s grace time


def test_a_bounded_read_passes_its_bound_to_every_try(monkeypatch, no_pause):
    fake = FakeQstat(*[(1, SOCKET_TIMEOUT)] * 2)
    monkeypatch.setattr(scheduler.subprocess, "run", fake)
    with pytest.raises(UsageError, match="Socket timed out"):
        scheduler.read_job("slurm", SLURM_JOB, "qos", {}, bound=ReadBound(attempts=2, timeout_s=10))
    assert fake.timeouts == [10, 10] and no_pause == [scheduler.QUERY_PAUSE_S]


# -- a job that cannot read itself ------------------------------------------------------------------


def test_a_job_goes_on_without_its_record_and_says_what_is_unknown(monkeypatch, no_pause, capsys):
    fake = FakeQstat(*[(1, "cannot connect to server")] * scheduler.QUERY_ATTEMPTS)
    monkeypatch.setattr(scheduler.subprocess, "run", fake)
    record = read_own_record(load_site("polaris"), JOB, {})
    assert record == JobRecord(JOB, known=False)
    [warning] = capsys.readouterr().err.strip().splitlines()
    assert f"cannot read job {JOB} from the scheduler (qstat -fF json" in warning
    assert (
        "going on without its account, queue, QOS, walltime" in warning and "no timer before the walltime" in warning
    )


def test_a_job_without_its_record_runs_unwarned_and_does_not_resubmit(tmp_path, monkeypatch, capsys):
    # Informative fields missing: no timer, the study runs. Needed ones missing: no resubmission,
    # one line that says how to continue.
    monkeypatch.setattr(continuation, "_cause", lambda job: "preempted")
    monkeypatch.setattr(continuation, "resubmit", lambda job, queue: pytest.fail("resubmitted without a record"))
    job = make_job(
        "polaris", str(tmp_path / "job"), {"STOP_BEFORE_WALLTIME": "300"}, record=JobRecord(JOB, known=False), gpus=4
    )
    job.script = "/kit/submissions/polaris.sc"
    assert warning_delay(job) is None
    assert continuation.continue_study(job, signal.SIGUSR1) == EXIT_PREEMPTED
    [line] = capsys.readouterr().out.strip().splitlines()
    assert "not resubmitting (the scheduler could not be read at this job's start" in line
    assert f"submit /kit/submissions/polaris.sc again with JOB_DIR={job.settings.job_dir} to continue" in line
