"""A workshop's study under the emulated PBS (tests/pbs_emulation): polaris.sc submitted to a
reservation queue on 2 nodes, while qstat first fails (a busy server) and then prints invalid JSON
(openpbs #2541); the job reads itself anyway, is warned mid-run, and continues in the same
reservation queue. `--check` accepts the queue with one warning; the reservation's node count is
the emulated server's to enforce."""

from __future__ import annotations

import os
import time

import pytest

from tests.conftest import REPO
from tests.scheduler.test_job_templates import (
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
