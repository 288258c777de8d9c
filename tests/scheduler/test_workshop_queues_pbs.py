"""A workshop's study under the emulated PBS (tests/pbs_emulation): polaris.sc submitted to a
reservation queue on 2 nodes, while qstat first fails (a busy server) and then prints invalid JSON
(openpbs #2541); the job reads itself anyway, is warned mid-run, and continues in the same
reservation queue. `--check` accepts the queue with one warning; the reservation's node count is
the emulated server's to enforce."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from tests.conftest import REPO
from tests.scheduler.test_job_templates import (
    EMULATION,
    JOB_TIMEOUT_S,
    POLARIS,
    POLARIS_STUDY,
    job_events,
    job_outputs,
    read_text,
    wait_for,
)
from tests.scheduler.test_job_templates_pbs import EmulatedPbs, pbs_job_json, qsub_variables

pytestmark = pytest.mark.timeout(900)
RESERVATION = "R123456"


@pytest.fixture
def pbs(tmp_path):
    emulation = EmulatedPbs(str(tmp_path / "pbs-spool"))
    os.makedirs(emulation.spool)
    with open(os.path.join(emulation.spool, "queues"), "w") as handle:
        handle.write(f"{RESERVATION} 2\n")  # as pbs_rsub makes it: a queue of the 2 reserved nodes
    try:
        yield emulation
    finally:
        emulation.stop()


def qsub(pbs: EmulatedPbs, cwd: str, nodes: int, settings: dict[str, str]):
    return pbs.run(
        [
            "qsub",
            "-A",
            "harness-test",
            "-q",
            RESERVATION,
            "-l",
            f"select={nodes}:system=polaris",
            "-v",
            qsub_variables(settings),
            POLARIS,
        ],
        cwd=cwd,
    )


def test_check_accepts_a_reservation_queue_with_one_warning(tmp_path):
    from harness.study.jobs.preflight import check_study

    plugins = {"LD_LIBRARY_PATH": os.path.join(REPO, "tests", "data", "site_plugins")}
    result, _ = check_study("polaris", POLARIS, ["-A", "p", "-q", RESERVATION, "-v", "BACKENDS=ddp"], environ=plugins)
    assert result.ok and len(result.warnings) == 1 and "reservation queue" in result.warnings[0]


@pytest.mark.slow
def test_a_reservation_study_survives_qstat_faults_and_continues_in_its_reservation(pbs, tmp_path):
    scratch = str(tmp_path)
    refused = qsub(pbs, scratch, 3, {"BACKENDS": "ddp"})
    assert refused.returncode == 2 and "takes 1-2 nodes, not 3" in refused.stderr
    with open(os.path.join(pbs.spool, "qstat_faults"), "w") as handle:
        handle.write("fail badjson\n")  # the job's first qstat fails, its retry prints invalid JSON
    job_dir = str(tmp_path / "study")
    # Both emulated nodes stand on this machine, whose name has no alias on Polaris' high-speed network.
    settings = dict(
        POLARIS_STUDY,
        BACKENDS="ddp",
        RANKS="2",
        RANKS_PER_NODE="1",
        RENDEZVOUS_DOMAIN="",
        JOB_DIR=job_dir,
        KIT_DIR=REPO,
    )
    started = time.monotonic()
    submitted = qsub(pbs, scratch, 2, settings)
    assert submitted.returncode == 0, submitted.stderr
    first_job = submitted.stdout.strip()
    number = int(first_job.split(".")[0])
    wait_for(lambda: job_events(job_dir), 300, "the job's start", lambda: job_outputs(scratch))
    assert pbs.run(["qsig", "-s", "USR1", first_job], cwd=scratch).returncode == 0
    wait_for(
        lambda: pbs.state(number + 1) == "F",
        JOB_TIMEOUT_S,
        "the continuation finishing",
        lambda: job_outputs(scratch) + read_text(os.path.join(job_dir, "jobs.txt")),
    )
    first_output = read_text(os.path.join(job_dir, f"harness-scaling.o{number}"))
    assert "qstat -fF json printed invalid JSON" in first_output and "reading `qstat -f" in first_output
    second = pbs_job_json(pbs, f"{number + 1}", scratch)
    assert f" -q {RESERVATION} -W depend=afterany:{first_job}" in second["Submit_arguments"]
    assert (second["queue"], second["Exit_status"]) == (RESERVATION, 0)
    assert job_events(job_dir)[-1][2] == "study complete"
    print(
        f"\nqsub -q {RESERVATION} polaris.sc: continued in {RESERVATION}, done in {time.monotonic() - started:.0f} s"
    )


@pytest.mark.slow
def test_the_smoke_run_of_polaris_sc_under_pbs_reports_the_profiles_verified_on(pbs, tmp_path):
    """`bash submissions/polaris.sc --smoke -- QSUB_ARGS` the night before: the template itself as a
    10-minute debug-queue job (DDP, 20 steps, every node of the request, not resubmitted), waited for
    through qstat, its result printed as the profile's verified_on."""
    scratch, job_dir = str(tmp_path), str(tmp_path / "smoke")
    settings = dict(
        POLARIS_STUDY, BACKENDS="ddp horovod", RANKS_PER_NODE="1", RENDEZVOUS_DOMAIN="", JOB_DIR=job_dir, KIT_DIR=REPO
    )
    login = {  # the emulated login node: its profile's `module` and `conda`, the kit's venv, the network plugin
        "BASH_ENV": os.path.join(EMULATION, "lib", "login_profile.sh"),
        "PYTHON_ENV": "venv",
        "VENV": settings["VENV"],
        "LD_LIBRARY_PATH": os.path.join(REPO, "tests", "data", "site_plugins"),
    }
    qsub_args = ["-A", "harness-test", "-l", "select=2:system=polaris", "-v", qsub_variables(settings)]
    smoked = subprocess.run(
        ["bash", POLARIS, "--smoke", "--", *qsub_args],
        env=pbs.environ(login),
        cwd=scratch,
        capture_output=True,
        text=True,
        timeout=JOB_TIMEOUT_S,
    )
    assert smoked.returncode == 0, smoked.stdout + smoked.stderr + job_outputs(scratch)
    lines = smoked.stdout.strip().splitlines()
    job = lines[-4]
    assert lines[-3].startswith(f"smoke job {job} queued; waiting for its result in {job_dir}/verified_on.json")
    passed = lines[-2].removeprefix("smoke job passed: ")
    assert passed.startswith(time.strftime("%Y-%m-%d") + f": job {job}, 2 node(s) x 1 ranks, ddp 20 steps at ")
    assert lines[-1] == f'for harness/study/sites/polaris.json: "verified_on": "{passed}"'
    submitted = pbs_job_json(pbs, job.split(".")[0], scratch)
    assert (submitted["queue"], submitted["Job_Name"]) == ("debug", "harness-smoke")
    assert submitted["Resource_List"]["walltime"] == "00:10:00"
