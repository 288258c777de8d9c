"""polaris.sc under the emulated PBS (tests/pbs_emulation: there is no PBS package for Debian), the
template itself unchanged: Polaris' admission rules, a study warned mid-run that resubmits itself,
and a job in the routing queue prod that continues in prod (see test_job_templates.py)."""

from __future__ import annotations

import glob
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from typing import Optional

import pytest

from harness.process.processes import processes_in_sessions
from tests.conftest import REPO

from .test_job_templates import (
    EMULATION,
    JOB_TIMEOUT_S,
    POLARIS,
    POLARIS_STUDY,
    assert_job_directory,
    has_checkpoint,
    job_events,
    job_outputs,
    read_text,
    wait_for,
)

# -- PBS (Polaris): emulated qsub, qstat, qsig and PALS mpiexec; polaris.sc itself unchanged -------


class EmulatedPbs:
    """The emulated PBS server of one test module: its spool, and its clients on PATH."""

    def __init__(self, spool: str) -> None:
        self.spool = spool

    def environ(self, extra: Optional[dict[str, str]] = None) -> dict[str, str]:
        env = dict(os.environ, PBS_EMULATION_SPOOL=self.spool, PATH=f"{EMULATION}/bin:{os.environ['PATH']}")
        env.update(extra or {})
        return env

    def run(self, command: Sequence[str], cwd: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(
            list(command), env=self.environ(), cwd=cwd, capture_output=True, text=True, timeout=timeout
        )

    def state(self, number: int) -> str:
        return read_text(os.path.join(self.spool, f"{number}.state")).strip()

    def stop(self) -> None:
        """End every process of every job (on a failed test): each job runs in a session of its own,
        its runner's, and OpenMPI gives each rank a process group of its own within it."""
        sessions = {read_text(path).strip() for path in glob.glob(os.path.join(self.spool, "*.runner_pid"))}
        for pid in processes_in_sessions(int(session) for session in sessions if session.isdigit()):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                continue  # gone meanwhile


@pytest.fixture(scope="module")
def pbs(tmp_path_factory):
    emulation = EmulatedPbs(str(tmp_path_factory.mktemp("pbs-spool")))
    try:
        yield emulation
    finally:
        emulation.stop()


def pbs_job_json(pbs: EmulatedPbs, job: str, cwd: str) -> dict:
    """The job as `qstat -fF json` shows it."""
    shown = pbs.run(["qstat", "-fF", "json", job], cwd=cwd)
    assert shown.returncode == 0, shown.stderr
    return next(iter(json.loads(shown.stdout)["Jobs"].values()))


def qsub_variables(settings: dict[str, str]) -> str:
    """qsub -v's list: NAME=VALUE,... (the values hold no commas)."""
    assert not any("," in value for value in settings.values())
    return ",".join(f"{name}={value}" for name, value in settings.items())


@pytest.mark.parametrize(
    "directive, message",
    [
        ("#PBS -A", "qsub: Polaris requires a project: pass -A <project> or add '#PBS -A <project>' to"),
        ("#PBS -l walltime", "qsub: Polaris requires a walltime: pass -l walltime=HH:MM:SS"),
        (
            "#PBS -l filesystems",
            "qsub: Polaris requires the file systems the job uses: pass -l filesystems=home:eagle",
        ),
        ("#PBS -l select", "qsub: Polaris requires the nodes: pass -l select=<nodes>:system=polaris"),
    ],
)
def test_emulated_qsub_refuses_what_polaris_refuses(pbs, tmp_path, directive, message):
    script = tmp_path / "polaris.sc"
    script.write_text(
        "".join(line for line in read_text(POLARIS).splitlines(keepends=True) if not line.startswith(directive))
    )
    jobs_before = glob.glob(os.path.join(pbs.spool, "*.state"))
    account = [] if directive == "#PBS -A" else ["-A", "harness-test"]  # the template names none: --check asks
    result = pbs.run(["qsub", *account, str(script)], cwd=str(tmp_path))
    assert result.returncode == 2 and result.stdout == ""
    assert len(result.stderr.splitlines()) == 1 and result.stderr.startswith(message), result.stderr
    assert glob.glob(os.path.join(pbs.spool, "*.state")) == jobs_before


@pytest.mark.slow
def test_polaris_template_under_emulated_pbs_runs_preempts_and_resubmits_itself(pbs, tmp_path):
    job_dir = str(tmp_path / "study")
    # The rank counts are the template's own: its node counts (the 1 selected node) x RANKS_PER_NODE.
    settings = {name: value for name, value in POLARIS_STUDY.items() if name != "RANKS"}
    settings.update(
        BACKENDS="ddp deepspeed", RANKS_PER_NODE="2", STEPS="30", CHECKPOINT_EVERY="5", JOB_DIR=job_dir, KIT_DIR=REPO
    )
    started = time.monotonic()
    # The script's own #PBS lines, with the project and the queue given on the command line (they win).
    submitted = pbs.run(
        [
            "qsub",
            "-A",
            "harness-test",
            "-q",
            "debug",
            "-l",
            "select=1:system=polaris",
            "-v",
            qsub_variables(settings),
            POLARIS,
        ],
        cwd=str(tmp_path),
    )
    assert submitted.returncode == 0, submitted.stderr
    first_job = submitted.stdout.strip()
    number = int(first_job.split(".")[0])
    # PBS has no --signal: SIGUSR1 to the batch shell is what the job's own timer sends before the
    # walltime (test_pbs_jobs_warn_themselves_before_the_walltime); qsig delivers it mid-run here.
    run_dir = os.path.join(job_dir, "checkpoints", "ddp-2r-rep0")
    wait_for(
        lambda: has_checkpoint(run_dir), 300, "the first run's first checkpoint", lambda: job_outputs(str(tmp_path))
    )
    signalled = pbs.run(["qsig", "-s", "USR1", first_job], cwd=str(tmp_path))
    assert signalled.returncode == 0, signalled.stderr
    wait_for(
        lambda: pbs.state(number + 1) == "F",
        JOB_TIMEOUT_S,
        "the resubmitted job finishing",
        lambda: job_outputs(str(tmp_path)) + read_text(os.path.join(job_dir, "jobs.txt")),
    )
    elapsed = time.monotonic() - started

    records = assert_job_directory(job_dir, ["ddp", "deepspeed"], [2], launcher="mpich", launch_word="mpiexec")
    preempted = next(record for record in records if record["backend"] == "ddp")
    assert preempted["segments"] == 2 and 5 <= preempted["resumed_from_step"] < 30 and preempted["steps"] == 30
    events = job_events(job_dir)
    second_job = f"{number + 1}.polaris-pbs-emulated"
    assert [e[2] for e in events if e[1] == first_job][1:] == [
        "signal USR1",
        "end: sweep status 3",
        f"resubmitted as {second_job}",
    ]
    assert "continues as job" in read_text(os.path.join(job_dir, f"harness-scaling.o{number}"))  # moved here
    assert not glob.glob(str(tmp_path / "harness-scaling.*"))
    assert "study complete" in read_text(os.path.join(job_dir, f"harness-scaling.o{number + 1}"))
    assert sorted(os.path.basename(p) for p in glob.glob(os.path.join(job_dir, "discovery-*.jsonl"))) == [
        f"discovery-{number}.jsonl",
        f"discovery-{number + 1}.jsonl",
    ]
    first, second = (pbs.run(["qstat", "-f", job], cwd=str(tmp_path)).stdout for job in (first_job, second_job))
    for attribute in (
        "Account_Name = harness-test",
        "queue = debug",
        "Resource_List.select = 1:system=polaris",
        "Resource_List.place = scatter",
        "Resource_List.walltime = 01:00:00",
        "Resource_List.filesystems = home:eagle",
        "Exit_status = 0",
    ):
        assert attribute in first and attribute in second, (attribute, first, second)
    # The continuation replays the job's own submission: its queue, its -v settings, after it.
    resubmitted = pbs_job_json(pbs, second_job, str(tmp_path))
    assert resubmitted["Submit_arguments"].startswith(
        f"-A harness-test -l select=1:system=polaris -q debug -W depend=afterany:{first_job} -o {job_dir} -v "
    )
    assert resubmitted["Variable_List"]["BACKENDS"] == "ddp deepspeed"
    assert resubmitted["Variable_List"]["JOB_DIR"] == job_dir
    runs = [
        line
        for line in read_text(os.path.join(job_dir, "logs", "commands.txt")).splitlines()
        if " -m harness train " in line
    ]
    # This node has no GPU: no GPU binding (test_study_sites checks it on Polaris' four GPUs).
    assert runs and all(
        " --depth 16 --cpu-bind depth --env OMP_NUM_THREADS=1 " in line and "set_affinity_gpu_polaris.sh" not in line
        for line in runs
    )
    print(
        f"\nqsub polaris.sc (emulated PBS): preempted at step {preempted['resumed_from_step']}, resubmitted as "
        f"{second_job}, study complete in {elapsed:.0f} s"
    )


@pytest.mark.slow
def test_polaris_continues_in_the_routing_queue_it_was_submitted_to(pbs, tmp_path):
    # prod routes a 10-node job to its execution queue `small`, which takes no submissions: the
    # continuation must name prod again (PBS_O_QUEUE), with the same request.
    job_dir = str(tmp_path / "routed")
    settings = dict(POLARIS_STUDY, BACKENDS="ddp", RANKS="1", RANKS_PER_NODE="1", JOB_DIR=job_dir, KIT_DIR=REPO)
    submitted = pbs.run(
        [
            "qsub",
            "-A",
            "harness-test",
            "-q",
            "prod",
            "-l",
            "select=10:system=polaris",
            "-v",
            qsub_variables(settings),
            POLARIS,
        ],
        cwd=str(tmp_path),
    )
    assert submitted.returncode == 0, submitted.stderr
    first_job = submitted.stdout.strip()
    number = int(first_job.split(".")[0])
    first = pbs_job_json(pbs, first_job, str(tmp_path))
    assert (first["queue"], first["Variable_List"]["PBS_O_QUEUE"]) == ("small", "prod")
    # The warning before the walltime, early: once `harness study` has started, it is kept.
    wait_for(lambda: job_events(job_dir), 300, "the job's start", lambda: job_outputs(str(tmp_path)))
    assert pbs.run(["qsig", "-s", "USR1", first_job], cwd=str(tmp_path)).returncode == 0
    wait_for(
        lambda: pbs.state(number + 1) == "F",
        JOB_TIMEOUT_S,
        "the continuation finishing",
        lambda: job_outputs(str(tmp_path)) + read_text(os.path.join(job_dir, "jobs.txt")),
    )
    second = pbs_job_json(pbs, f"{number + 1}", str(tmp_path))
    assert (
        " -q prod -W depend=afterany:" in second["Submit_arguments"]
        and "-l select=10:system=polaris" in second["Submit_arguments"]
    )
    assert (second["queue"], second["Variable_List"]["PBS_O_QUEUE"], second["Exit_status"]) == ("small", "prod", 0)
    assert job_events(job_dir)[-1][2] == "study complete"
    discovery = [
        json.loads(line) for line in read_text(os.path.join(job_dir, f"discovery-{number + 1}.jsonl")).splitlines()
    ]
    assert {d["master_addr"] for d in discovery} == {f"{socket.gethostname()}.hsn.cm.polaris.alcf.anl.gov"}
    assert sorted(d["rank"] for d in discovery) == list(range(10)) and {d["world_size"] for d in discovery} == {10}
