"""Scheduler reads that survive: qstat and scontrol retried with backoff, PBS's invalid JSON read
from plain `qstat -f` (folded lines joined again), and a workshop's reservation or reservation
queue kept when the study continues in a new job."""

from __future__ import annotations

import dataclasses
import os
import subprocess

import pytest

from harness.errors import UsageError
from harness.study import scheduler
from harness.study.scheduler import parse_qstat_full, parse_qstat_json, parse_scontrol_oneliner, read_pbs_job
from harness.study.submit import qsub_resubmission, sbatch_resubmission
from tests.conftest import REPO

pytestmark = pytest.mark.timeout(60)

DATA = os.path.join(REPO, "tests", "data")
JOB = "3214567.polaris-pbs-01.hsn.cm.polaris.alcf.anl.gov"


def data(name: str) -> str:
    with open(os.path.join(DATA, name)) as handle:
        return handle.read()


class FakeQstat:
    """Answers in turn, as subprocess.run would; records the commands it was given."""

    def __init__(self, *answers: tuple[int, str]) -> None:
        self.answers = list(answers)
        self.commands: list[list[str]] = []

    def __call__(self, command, **kwargs):
        self.commands.append(command)
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
