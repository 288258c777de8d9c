"""The scheduler's view of a job, from recorded output (tests/data): walltimes in every format, PBS's
routing queues, wrapped `qstat -f` never parsed, mpiprocs-repeated node files, Slurm's JSON in its
two shapes and its one-line fallback, and the resubmission commands built from them."""

from __future__ import annotations

import os

import pytest

from harness.errors import UsageError
from harness.study.jobs.scheduler import (
    JobRecord,
    parse_qstat_json,
    parse_scontrol_json,
    parse_scontrol_oneliner,
    pbs_allocation,
    split_submit_arguments,
    termination_cause,
)
from harness.study.jobs.submit import qsub_resubmission, sbatch_resubmission
from harness.study.sites import load_site
from harness.study.sites.walltime import format_walltime, parse_walltime
from tests.conftest import REPO

DATA = os.path.join(REPO, "tests", "data")
POLARIS_JOB = "3214567.polaris-pbs-01.hsn.cm.polaris.alcf.anl.gov"


def data(name: str) -> str:
    with open(os.path.join(DATA, name)) as handle:
        return handle.read()


@pytest.mark.parametrize(
    "text, seconds",
    [
        ("1-00:00:00", 86400),  # a day, not "1" minute (the old template cut at the dash)
        ("2-12", 2 * 86400 + 12 * 3600),
        ("1-02:30", 86400 + 2 * 3600 + 30 * 60),
        ("2:00:00", 7200),
        ("30:00", 1800),
        ("30", 1800),
        ("45:30", 45 * 60 + 30),
        ("UNLIMITED", None),
        ("infinite", None),
    ],
)
def test_slurm_walltimes_in_every_format(text, seconds):
    assert parse_walltime(text, "slurm") == seconds


@pytest.mark.parametrize("text, seconds", [("01:00:00", 3600), ("168:00:00", 168 * 3600), ("30:00", 1800), ("30", 30)])
def test_pbs_walltimes(text, seconds):
    assert parse_walltime(text, "pbs") == seconds


@pytest.mark.parametrize(
    "text, style", [("1-", "slurm"), ("1:2:3:4", "slurm"), ("1-00:00:00", "pbs"), ("an hour", "pbs")]
)
def test_a_malformed_walltime_names_the_format(text, style):
    with pytest.raises(UsageError, match="HH:MM:SS"):
        parse_walltime(text, style)


def test_format_walltime_round_trips():
    assert format_walltime(86400) == "24:00:00" and parse_walltime(format_walltime(5025), "pbs") == 5025
    assert format_walltime(None) == "UNLIMITED"


def test_qstat_json_keeps_the_routing_queue_the_job_was_submitted_to():
    # The job landed in `small`; resubmitting there is refused (an execution queue takes no
    # submissions). PBS_O_QUEUE (here from Variable_List) says where it went in: prod.
    record = parse_qstat_json(data("qstat_polaris_prod.json"), POLARIS_JOB, environ={})
    assert (record.queue, record.submit_queue) == ("small", "prod")
    assert (record.nodes, record.walltime_s, record.filesystems, record.account) == (
        12,
        3 * 3600,
        "home:eagle",
        "DLscaling",
    )
    assert record.outputs == [
        "/home/jdoe/dp-harness/harness-scaling.o3214567",
        "/home/jdoe/dp-harness/harness-scaling.e3214567",
    ]
    assert record.script == "submissions/polaris.sc" and record.workdir == "/home/jdoe/dp-harness"
    command = qsub_resubmission(
        record,
        record.submit_queue,
        "/eagle/DLscaling/study",
        "/home/jdoe/dp-harness/submissions/polaris.sc",
        {"JOB_DIR": "/eagle/DLscaling/study"},
    )
    assert command[command.index("-q") + 1] == "prod" and command.count("-q") == 1
    # The same resources as submitted, the user's -v values whole (from Variable_List), after this job.
    assert command[:9] == [
        "qsub",
        "-A",
        "DLscaling",
        "-l",
        "select=12:system=polaris",
        "-l",
        "walltime=3:00:00",
        "-q",
        "prod",
    ]
    assert command[command.index("-W") + 1] == f"depend=afterany:{POLARIS_JOB}"
    assert command[command.index("-v") + 1] == (
        "BACKENDS=ddp deepspeed,SCALING=strong,STEPS=500,JOB_DIR=/eagle/DLscaling/study"
    )


def test_the_jobs_own_environment_names_the_submit_queue_first():
    record = parse_qstat_json(data("qstat_polaris_prod.json"), POLARIS_JOB, environ={"PBS_O_QUEUE": "capacity"})
    assert record.submit_queue == "capacity"
    assert load_site("polaris").submit_queue("small") == "prod"  # the profile's mapping, the last resort


def test_submit_arguments_keep_unquoted_values_whole():
    options, script = split_submit_arguments(
        "-A p -v TRAIN_ARGS=--eval-every 0 --seed 3,STEPS=9 -lwalltime=1:00:00 -V -q debug job.sc"
    )
    assert script == "job.sc"
    assert options == [
        ("-A", "p"),
        ("-v", "TRAIN_ARGS=--eval-every 0 --seed 3,STEPS=9"),
        ("-l", "walltime=1:00:00"),
        ("-V", None),
        ("-q", "debug"),
    ]


def test_a_nodefile_with_mpiprocs_counts_each_host_once(tmp_path):
    nodefile = tmp_path / "nodes"
    nodefile.write_text("".join(f"{host}\n" for host in ["x3005c0s7b0n0"] * 4 + ["x3005c0s7b1n0"] * 4))
    allocation = pbs_allocation({"PBS_NODEFILE": str(nodefile)})
    assert (allocation.nodes, allocation.tasks_per_node) == (2, 4)
    assert allocation.hosts == ("x3005c0s7b0n0", "x3005c0s7b1n0")


def test_no_nodefile_says_to_run_in_the_job():
    with pytest.raises(UsageError, match="PBS_NODEFILE"):
        pbs_allocation({})


@pytest.mark.parametrize("fixture", ["scontrol_perlmutter_regular.json", "scontrol_2302_regular.json"])
def test_scontrol_json_in_both_shapes_gives_every_resource_back_to_sbatch(fixture):
    record = parse_scontrol_json(data(fixture), "qos")
    assert (record.job_id, record.name, record.queue, record.nodes, record.walltime_s) == (
        "31415926",
        "harness-scaling",
        "regular",
        2,
        86400,
    )
    assert record.script == "/global/homes/j/jdoe/dp-harness/submissions/perlmutter.sbatch"
    command = sbatch_resubmission(record, "qos", "/pscratch/sd/j/jdoe/study", record.script, requeue=False)
    flags = _options(command)
    # -C, --gpus-per-node and --ntasks-per-node were dropped before; a day stayed a day, not a minute.
    assert flags == {
        "--dependency": "afterany:31415926",
        "--job-name": "harness-scaling",
        "--output": "/pscratch/sd/j/jdoe/study/%x-%j.out",
        "--nodes": "2",
        "--ntasks-per-node": "4",
        "--cpus-per-task": "32",
        "--gpus-per-node": "4",
        "--constraint": "gpu",
        "--account": "m4321",
        "--time": "1440",
        "--qos": "regular",
    }
    assert "--partition" not in command  # at NERSC -C and -q choose it
    assert command[-1] == record.script and "--requeue" not in command


def _options(command):
    """sbatch's --name value pairs (and flags) of a command, the script left out."""
    found, words = {}, list(command[1:-1])
    while words:
        word = words.pop(0)
        if word == "--parsable" or word == "--requeue":
            found[word] = ""
        else:
            found[word] = words.pop(0)
    found.pop("--parsable", None)
    return found


def test_the_one_line_fallback_reads_the_same_job():
    record = parse_scontrol_oneliner(data("scontrol_oneliner_2205.txt"), "qos")
    assert (record.walltime_s, record.queue, record.nodes, record.account) == (86400, "regular", 2, "m4321")
    assert record.options["time"] == "1440" and record.options["gpus-per-node"] == "4"
    assert record.options["ntasks-per-node"] == "4" and record.options["constraint"] == "gpu"
    assert record.script.endswith("perlmutter.sbatch") and not record.preempted and not record.requeue


def test_a_partition_site_resubmits_to_its_partition_and_asks_for_requeue_where_allowed():
    record = parse_scontrol_oneliner(data("scontrol_oneliner_2205.txt"), "partition")
    command = sbatch_resubmission(record, "partition", "/scratch/study", "/kit/job.sbatch", requeue=True)
    assert _options(command)["--partition"] == "gpu_ss11" and "--qos" not in command and "--requeue" in command


def test_a_partition_site_that_lists_qoses_resubmits_to_both():
    # Frontier: -p batch -q <qos>; the continuation must keep both, or it lands in the default QOS.
    record = parse_scontrol_oneliner(data("scontrol_oneliner_2205.txt"), "partition")
    command = sbatch_resubmission(
        record, "partition", "/scratch/study", "/kit/job.sbatch", requeue=False, with_qos=True
    )
    flags = _options(command)
    assert (flags["--partition"], flags["--qos"]) == ("gpu_ss11", "regular") and command.count("--qos") == 1
    assert sbatch_resubmission(record, "qos", "/s", "/kit/job.sbatch", False, with_qos=True).count("--qos") == 1


def test_termination_causes():
    assert termination_cause(parse_scontrol_json(data("scontrol_perlmutter_preempted.json"), "qos")) == "preempted"
    assert termination_cause(parse_scontrol_json(data("scontrol_perlmutter_regular.json"), "qos")) == "cancelled"
    timed_out = data("scontrol_oneliner_2205.txt").replace("JobState=RUNNING", "JobState=TIMEOUT")
    assert termination_cause(parse_scontrol_oneliner(timed_out, "qos")) == "timeout"
    preempting = data("scontrol_oneliner_2205.txt").replace("PreemptTime=None", "PreemptTime=2026-11-04T10:00:00")
    assert termination_cause(parse_scontrol_oneliner(preempting, "qos")) == "preempted"
    assert termination_cause(JobRecord("7", states=("COMPLETING",))) == "cancelled"
