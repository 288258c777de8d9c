"""A workshop's study in a Slurm reservation, on the real test Slurm (tests/helpers/slurm_cluster.py)
with 2 nodes on this machine, one slurmd each: `scontrol create reservation` puts both nodes in
`workshop` for this user, as a site does for a workshop's day.

- `--check` through submissions/slurm-cpu.sbatch, as an instructor runs it on the login node, accepts
  `--reservation workshop` on 2 nodes without a warning (generic-slurm lists no queues, so it has no
  limits to be unsure of) and names the sbatch command that keeps it;
- `--submit` queues the 2-node study (one rank per node) there; warned mid-run as `#SBATCH
  --signal=B:USR1@120` warns it (`scancel --signal=USR1 --batch`), the job checkpoints and continues
  in a new job, which its own `sbatch --reservation workshop` puts in the same reservation, on both
  nodes, and which ends the study.

The emulated PBS equivalent (reservation queues): test_workshop_queues_pbs.py; the reservation read
from recorded `scontrol` text: tests/unit/test_scheduler_reads.py.
"""

from __future__ import annotations

import os
import pwd
import shlex
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from harness.training.record import read_records
from tests.conftest import REPO
from tests.helpers.slurm_cluster import SlurmCluster, SlurmUnavailable, check_installed
from tests.scheduler.test_job_templates import (
    JOB_TIMEOUT_S,
    SLURM_CPU,
    STUDY,
    has_checkpoint,
    job_events,
    job_outputs,
    read_text,
    slurm_job_field,
    wait_for,
    wait_for_slurm_state,
)

pytestmark = pytest.mark.timeout(900)
RESERVATION = "workshop"
NODES = 2
# One rank per node; 100 steps (about 10 s here), a checkpoint every 5: the warning surely lands mid-run.
STEPS = 100
RUN = f"ddp-{NODES}r-rep0"
# What the instructor passes to sbatch: the reservation, both nodes, one rank on each.
WORKSHOP_ARGS = ["--reservation", RESERVATION, f"--nodes={NODES}", "--ntasks-per-node=1"]


@pytest.fixture(scope="module")
def workshop(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """The 2-node test Slurm with both nodes in the reservation `workshop` for this user, for an
    hour; stopped after the module, failed or not."""
    try:
        check_installed()
    except SlurmUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)
    cluster = SlurmCluster(str(tmp_path_factory.mktemp("slurm")), nodes=NODES).start()
    try:
        user = pwd.getpwuid(os.getuid()).pw_name
        created = cluster.run(
            [
                "scontrol",
                "create",
                "reservation",
                f"ReservationName={RESERVATION}",
                f"Users={user}",
                "StartTime=now",
                "Duration=60",
                "Nodes=ALL",
            ],
            timeout=30,
        )
        assert created.returncode == 0, created.stderr + cluster.log_tail()
        shown = cluster.run(["scontrol", "show", "reservation", "-o", RESERVATION], timeout=30).stdout
        assert "State=ACTIVE" in shown and f"NodeCnt={NODES}" in shown, shown
        yield cluster
    finally:
        cluster.stop()


def template(
    cluster: SlurmCluster, mode: str, sbatch_args: Sequence[str], settings: dict[str, str], cwd: str
) -> subprocess.CompletedProcess:
    """`bash submissions/slurm-cpu.sbatch MODE -- SBATCH_ARGS` on the login node, settings in the environment."""
    return cluster.run(
        ["bash", SLURM_CPU, mode, "--", *sbatch_args],
        env={"KIT_DIR": REPO, **settings},
        cwd=cwd,
        timeout=300,
    )


def warnings_and_errors(stderr: str) -> list[str]:
    """`harness study`'s warning and error lines."""
    return [
        line for line in stderr.splitlines() if line.startswith(("harness study: warning", "harness study: error"))
    ]


def test_check_accepts_the_reservation_on_both_nodes(workshop: SlurmCluster, tmp_path: Path) -> None:
    checked = template(workshop, "--check", WORKSHOP_ARGS, dict(STUDY, BACKENDS="ddp", RANKS="2"), str(tmp_path))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert warnings_and_errors(checked.stderr) == []
    (passed,) = [line for line in checked.stdout.splitlines() if line.startswith("check passed")]
    assert passed.startswith(f"check passed ({NODES} node(s), queue default")
    command = shlex.split(passed.split("submit with: ", 1)[1])
    assert command[:2] == ["sbatch", "--parsable"] and command[-1] == SLURM_CPU
    assert command[2:-1] == WORKSHOP_ARGS


def submit_study(cluster: SlurmCluster, job_dir: str, scratch: str) -> str:
    """The 2-node study submitted to the reservation through the template's --submit; its job id."""
    settings = dict(STUDY, BACKENDS="ddp", RANKS=str(NODES), STEPS=str(STEPS), CHECKPOINT_EVERY="5", JOB_DIR=job_dir)
    submitted = template(cluster, "--submit", [*WORKSHOP_ARGS, "--output", f"{scratch}/%j.out"], settings, scratch)
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    assert warnings_and_errors(submitted.stderr) == []
    return submitted.stdout.strip().splitlines()[-1]


def resubmission_command(job_dir: str) -> list[str]:
    """The sbatch command the first job continued the study with (logs/commands.txt)."""
    lines = read_text(os.path.join(job_dir, "logs", "commands.txt")).splitlines()
    (index,) = [i for i, line in enumerate(lines) if line.startswith("# ") and line.endswith(" resubmission")]
    return shlex.split(lines[index + 1])


def warn_after_the_first_checkpoint(cluster: SlurmCluster, job: str, job_dir: str, scratch: str) -> None:
    """Once the 2-node run has checkpointed, what `#SBATCH --signal=B:USR1@120` does before the time
    limit: SIGUSR1 to the batch shell only."""
    wait_for(
        lambda: (
            has_checkpoint(os.path.join(job_dir, "checkpoints", RUN))
            or any(event[2].startswith("end: ") for event in job_events(job_dir))
        ),
        300,
        "the 2-node run's first checkpoint",
        lambda: job_outputs(scratch) + cluster.log_tail(),
    )
    assert has_checkpoint(os.path.join(job_dir, "checkpoints", RUN)), job_outputs(scratch)
    signalled = cluster.run(["scancel", "--signal=USR1", "--batch", job], timeout=30)
    assert signalled.returncode == 0, signalled.stderr


def continuation_in_the_reservation(cluster: SlurmCluster, job_dir: str, scratch: str) -> str:
    """The job that continues the study, as soon as it is queued; fails at once unless Slurm holds
    it in the reservation for both nodes (outside it, it would wait for nodes the reservation holds)."""
    wait_for(
        lambda: any(event[2].startswith("resubmitted as ") for event in job_events(job_dir)),
        120,
        "the warned job's resubmission",
        lambda: job_outputs(scratch) + read_text(os.path.join(job_dir, "jobs.txt")),
    )
    (job,) = [event[2].split()[-1] for event in job_events(job_dir) if event[2].startswith("resubmitted as ")]
    command = resubmission_command(job_dir)
    options = dict(zip(command, command[1:]))  # each option and the word after it
    assert (options.get("--reservation"), options.get("--nodes")) == (RESERVATION, str(NODES)), command
    queued = cluster.run(["squeue", "-h", "-t", "all", "-j", job, "-o", "%v %D"], timeout=30).stdout
    assert queued.split() == [RESERVATION, str(NODES)], queued
    return job


@pytest.mark.slow
def test_a_warned_study_continues_in_its_reservation_on_both_nodes(workshop: SlurmCluster, tmp_path: Path) -> None:
    job_dir, scratch = str(tmp_path / "study"), str(tmp_path)
    started = time.monotonic()
    first_job = submit_study(workshop, job_dir, scratch)
    assert slurm_job_field(workshop, first_job, "Reservation") == RESERVATION
    warn_after_the_first_checkpoint(workshop, first_job, job_dir, scratch)
    second_job = continuation_in_the_reservation(workshop, job_dir, scratch)
    wait_for(
        lambda: any(event[2] == "study complete" for event in job_events(job_dir)),
        JOB_TIMEOUT_S,
        "the continuation finishing the study",
        lambda: job_outputs(scratch) + read_text(os.path.join(job_dir, "jobs.txt")) + workshop.log_tail(),
    )
    elapsed = time.monotonic() - started

    events = [(event[1], event[2]) for event in job_events(job_dir)]
    assert [e for job, e in events if job == first_job][-3:] == [
        "signal USR1",
        "end: sweep status 3",
        f"resubmitted as {second_job}",
    ]
    assert [e for job, e in events if job == second_job][-2:] == ["end: sweep status 0", "study complete"]
    # Slurm ran the continuation in the reservation, on the same 2 nodes.
    assert slurm_job_field(workshop, second_job, "Reservation") == RESERVATION
    assert slurm_job_field(workshop, second_job, "NodeList") == slurm_job_field(workshop, first_job, "NodeList")
    for job in (first_job, second_job):
        wait_for_slurm_state(workshop, job, "COMPLETED")
        assert slurm_job_field(workshop, job, "ExitCode") == "0:0"
    (record,) = read_records([os.path.join(job_dir, "results.jsonl")])
    assert (record["world_size"], record["local_world_size"]) == (NODES, 1)
    assert (record["segments"], record["steps"]) == (2, STEPS)
    assert "stopped by SIGUSR1 after step" in read_text(os.path.join(job_dir, "logs", f"001-{RUN}.log"))
    print(
        f"\nsbatch --reservation {RESERVATION} --nodes={NODES} slurm-cpu.sbatch: warned at step "
        f"{record['resumed_from_step']} of {STEPS}, continued as job {second_job} in {RESERVATION}, "
        f"study complete in {elapsed:.0f} s"
    )


def test_the_smoke_run_of_the_template_reports_the_profiles_verified_on(
    workshop: SlurmCluster, tmp_path: Path
) -> None:
    # The study's own settings (two backends, 1 and 2 ranks, 12 steps) give way to the smoke run's:
    # DDP, 20 steps, once, on every node of the request; the command waits for it and prints its result.
    scratch, job_dir = str(tmp_path), str(tmp_path / "smoke")
    settings = dict(STUDY, BACKENDS="ddp horovod", JOB_DIR=job_dir)
    smoked = template(workshop, "--smoke", [*WORKSHOP_ARGS, "--output", f"{scratch}/%j.out"], settings, scratch)
    assert smoked.returncode == 0, smoked.stdout + smoked.stderr + job_outputs(scratch)
    assert warnings_and_errors(smoked.stderr) == []
    lines = smoked.stdout.strip().splitlines()
    job = lines[-4]
    assert lines[-3].startswith(f"smoke job {job} queued; waiting for its result in {job_dir}/verified_on.json")
    passed = lines[-2].removeprefix("smoke job passed: ")
    assert passed.startswith(time.strftime("%Y-%m-%d") + f": job {job}, {NODES} node(s) x 1 ranks, ddp 20 steps at ")
    assert "; " in passed and " torch " in passed.split("; ")[1], passed
    assert lines[-1] == f'for harness/study/sites/generic-slurm.json: "verified_on": "{passed}"'
    assert slurm_job_field(workshop, job, "TimeLimit") == "00:10:00"
    assert slurm_job_field(workshop, job, "JobName") == "harness-smoke"
    (run,) = read_records([os.path.join(job_dir, "results.jsonl")])
    assert (run["backend"], run["world_size"], run["steps"]) == ("ddp", NODES, 20)
