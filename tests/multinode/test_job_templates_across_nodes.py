"""The job templates across two namespace nodes, each in one study that is signalled mid-run and
continues: `sbatch --nodes=2 submissions/slurm-cpu.sbatch` on the real Slurm of slurm_nodes.py, and
`qsub -l select=2 submissions/polaris.sc` on the emulated PBS, whose PBS_NODEFILE then lists both
nodes. Each study runs one rank per node: 1 rank (one node), then 2 (both nodes). During the 2-rank
run the job is signalled (Slurm: `scancel --full --signal=USR1`, the batch shell and every task on
both nodes; PBS: `qsig -s USR1` to the batch shell, which passes it on through mpiexec to the ranks
on both nodes): it checkpoints, resubmits itself, and the next job ends the study with the weights
of an uninterrupted run, its report and figures in the one job directory (one-node versions of
these: test_job_templates*.py). The study trains a task of one's own (TASK, TASK_ARGS: the regression
task of tests/helpers/tasks.py, paced). About 1.5 minutes each on 2 shared cores.
"""

from __future__ import annotations

import glob
import json
import os
import time
from collections.abc import Iterator

import pytest

from harness.study.sites import load_site
from tests.conftest import REPO
from tests.multinode.conftest import NODES
from tests.scheduler.test_job_templates import (
    JOB_TIMEOUT_S,
    POLARIS,
    POLARIS_STUDY,
    QUICK_TRAIN_ARGS,
    SLURM_CPU,
    STUDY,
    assert_job_directory,
    difference_from_uninterrupted,
    has_checkpoint,
    job_events,
    job_outputs,
    read_text,
    sbatch,
    slurm_job_field,
    wait_for,
)
from tests.scheduler.test_job_templates_pbs import EmulatedPbs, qsub_variables

from .jobs import openmpi_site_settings
from .netns_cluster import NetnsCluster

# One rank per node: two ranks' gradients sum alike in any order, so the resumed run's weights must
# equal the uninterrupted run's exactly (with more ranks, bucket order changes the float sums).
RANKS_PER_NODE = 1
SPANNING = RANKS_PER_NODE * NODES  # the run across both nodes; the other, RANKS_PER_NODE, fits on one
SPANNING_RUN = f"ddp-{SPANNING}r-rep0"
# 20 steps, a checkpoint every 5: the signal lands mid-run (test_job_templates.py's one-node
# preemption also crosses an epoch).
STEPS = 20
CHECKPOINT_WAIT_S = 300
POLARIS_NETWORK = load_site("polaris").rendezvous_domain


@pytest.fixture
def cluster(tmp_path) -> Iterator[NetnsCluster]:
    """The two nodes, also known on Polaris' high-speed network, where polaris.sc's ranks meet."""
    with NetnsCluster(NODES, str(tmp_path / "cluster"), domains=[POLARIS_NETWORK]) as started:
        yield started


@pytest.fixture(scope="module")
def references(tmp_path_factory) -> str:
    """Where the uninterrupted reference runs go: both tests run the same, so it runs once."""
    return str(tmp_path_factory.mktemp("uninterrupted"))


@pytest.fixture
def pbs(cluster, tmp_path) -> Iterator[EmulatedPbs]:
    """The emulated PBS server with the cluster's nodes; every job process ends with the test."""
    emulation = EmulatedPbs(str(tmp_path / "pbs-spool"))
    os.makedirs(emulation.spool)
    with open(os.path.join(emulation.spool, "nodes"), "w") as handle:
        handle.writelines(f"{host}\n" for host in cluster.hostnames)
    try:
        yield emulation
    finally:
        emulation.stop()


# A task of the researcher's own, named relative to the kit as a study reads it: every rank on both
# nodes, under srun and under the emulated PBS's mpiexec, loads it from its path. Its batches come
# 0.1 s apart, so that the signal lands mid-run.
TASK = "tests/helpers/paced_tasks.py:paced_regression"
TASK_ARGS = {"width": 16, "delay": 0.1}


def study_settings(job_dir: str) -> dict[str, str]:
    """The tiny study both templates run: ddp on one node, then on both, saving the last run's model."""
    model = os.path.join(job_dir, "model.pt")
    images_task = ("MODEL", "DATASET")  # the images task's settings: refused beside another TASK
    return dict(
        {name: value for name, value in STUDY.items() if name not in images_task},
        TASK=TASK,
        TASK_ARGS=" ".join(f"{name}={value}" for name, value in TASK_ARGS.items()),
        BACKENDS="ddp",
        RANKS=f"{RANKS_PER_NODE} {SPANNING}",
        STEPS=str(STEPS),
        CHECKPOINT_EVERY="5",
        JOB_DIR=job_dir,
        TRAIN_ARGS=f"{QUICK_TRAIN_ARGS} --save-model {model}",
    )


def discovery_by_job(job_dir: str) -> dict[str, list[dict]]:
    """Every job's `harness env` lines, by job number."""
    found = {}
    for path in glob.glob(os.path.join(job_dir, "discovery-*.jsonl")):
        number = os.path.basename(path)[len("discovery-") : -len(".jsonl")]
        found[number] = [json.loads(line) for line in read_text(path).splitlines()]
    return found


def assert_spans_both_nodes(cluster: NetnsCluster, job_dir: str, launcher: str, master: str) -> list[dict]:
    """The study's records and every job's discovery: ranks fill node 1, then node 2, meeting at
    `master`; the one-node run on one node, the other across both; returns the records."""
    records = assert_job_directory(
        job_dir,
        ["ddp"],
        [RANKS_PER_NODE, SPANNING],
        launcher=launcher,
        launch_word="srun" if launcher == "slurm" else "mpiexec",
    )
    discoveries = discovery_by_job(job_dir)
    assert len(discoveries) == 2, sorted(discoveries)  # the first job, and the one that continued it
    for rows in discoveries.values():
        assert sorted((row["rank"], row["hostname"], row["local_rank"], row["master_addr"]) for row in rows) == [
            (rank, cluster.hostnames[rank // RANKS_PER_NODE], rank % RANKS_PER_NODE, master)
            for rank in range(SPANNING)
        ]
    # A record names rank 0's host; local_world_size < world_size: its ranks were on several nodes.
    assert sorted((r["world_size"], r["local_world_size"], r["host"]["hostname"]) for r in records) == [
        (RANKS_PER_NODE, RANKS_PER_NODE, cluster.hostnames[0]),
        (SPANNING, RANKS_PER_NODE, cluster.hostnames[0]),
    ]
    assert all(r["steps"] == STEPS for r in records)
    assert all((r["task"]["spec"], r["task"]["args"]) == (f"{REPO}/{TASK}", TASK_ARGS) for r in records)
    return records


def assert_resumed_with_uninterrupted_weights(records: list[dict], job_dir: str, references: str) -> float:
    """The spanning run was stopped after a checkpoint and resumed once; its final weights are an
    uninterrupted run's. Returns the step it resumed from."""
    spanning = next(r for r in records if r["world_size"] == SPANNING)
    assert spanning["segments"] == 2 and 5 <= spanning["resumed_from_step"] < STEPS, spanning["segments"]
    (log,) = glob.glob(os.path.join(job_dir, "logs", f"*-{SPANNING_RUN}.log"))
    assert "stopped by SIGUSR1 after step" in read_text(log)
    model = os.path.join(job_dir, "model.pt")
    assert difference_from_uninterrupted(job_dir, SPANNING_RUN, SPANNING, model, references) <= 1e-6
    return spanning["resumed_from_step"]


def wait_for_study(job_dir: str, scratch: str) -> None:
    wait_for(
        lambda: any(event[2] == "study complete" for event in job_events(job_dir)),
        JOB_TIMEOUT_S,
        "the continuation finishing the study",
        lambda: job_outputs(scratch) + read_text(os.path.join(job_dir, "jobs.txt")),
    )


def wait_for_spanning_checkpoint(job_dir: str, scratch: str) -> None:
    """Until the 2-node run has checkpointed; fails at once if the job ended first."""

    def checkpointed() -> bool:
        return has_checkpoint(os.path.join(job_dir, "checkpoints", SPANNING_RUN))

    wait_for(
        lambda: checkpointed() or any(event[2].startswith("end: ") for event in job_events(job_dir)),
        CHECKPOINT_WAIT_S,
        "the 2-node run's first checkpoint",
        lambda: job_outputs(scratch),
    )
    assert checkpointed(), job_outputs(scratch)


# Alone: a two-node srun job here hung in two of two `make test` runs beside the other lane (still
# waiting after 300 s) and passes alone; the cause is not found.
@pytest.mark.alone
@pytest.mark.slow
def test_slurm_cpu_template_on_two_nodes_signalled_everywhere_continues_to_the_end(
    cluster, slurm, references, tmp_path
):
    job_dir, scratch = str(tmp_path / "study"), str(tmp_path)
    started = time.monotonic()
    submitted = sbatch(
        slurm,
        [
            "--parsable",
            f"--nodes={NODES}",
            f"--ntasks-per-node={RANKS_PER_NODE}",
            "--output",
            str(tmp_path / "%j.out"),
            SLURM_CPU,
        ],
        study_settings(job_dir),
        scratch,
    )
    assert submitted.returncode == 0, submitted.stderr
    first_job = submitted.stdout.strip().split(";")[0]
    wait_for_spanning_checkpoint(job_dir, scratch)
    # Every process of the job on both nodes: the batch shell (the study) and every task of its step.
    signalled = slurm.run(["scancel", "--full", "--signal=USR1", first_job], timeout=30)
    assert signalled.returncode == 0, signalled.stderr
    wait_for_study(job_dir, scratch)
    elapsed = time.monotonic() - started

    records = assert_spans_both_nodes(cluster, job_dir, "slurm", cluster.hostnames[0])
    events = job_events(job_dir)
    (second_job,) = [event[2].split()[-1] for event in events if event[2].startswith("resubmitted as ")]
    assert [e[2] for e in events if e[1] == first_job][-3:] == [
        "signal USR1",
        "end: sweep status 3",
        f"resubmitted as {second_job}",
    ]
    assert slurm_job_field(slurm, second_job, "NumNodes") == str(NODES)  # the continuation asked for both
    resumed = assert_resumed_with_uninterrupted_weights(records, job_dir, references)
    print(
        f"\nsbatch --nodes={NODES} slurm-cpu.sbatch: signalled at step {resumed} of {STEPS}, continued as job "
        f"{second_job}, study complete in {elapsed:.0f} s"
    )


@pytest.mark.slow
def test_polaris_template_on_two_pbs_nodes_warned_mid_run_continues_to_the_end(cluster, pbs, references, tmp_path):
    job_dir, scratch = str(tmp_path / "study"), str(tmp_path)
    # The rank counts are the template's own: its node counts (1, 2) x RANKS_PER_NODE. What a site's
    # openmpi-mca-params.conf says reaches the job's mpirun as -v variables; NETNS_CLUSTER_DIR, the
    # cluster's ssh.
    settings = {name: value for name, value in study_settings(job_dir).items() if name != "RANKS"}
    settings.update(
        PYTHON_ENV="venv",
        VENV=POLARIS_STUDY["VENV"],
        RANKS_PER_NODE=str(RANKS_PER_NODE),
        KIT_DIR=REPO,
        NETNS_CLUSTER_DIR=cluster.directory,
        **openmpi_site_settings(cluster, str(tmp_path / "openmpi-hosts"), slots=RANKS_PER_NODE),
    )
    started = time.monotonic()
    # qsub on node 1: the job runs there (PBS's mother superior), its PBS_NODEFILE lists both nodes.
    submitted = cluster.run(
        1,
        [
            "qsub",
            "-A",
            "harness-test",
            "-q",
            "debug",
            "-l",
            f"select={NODES}:system=polaris",
            "-v",
            qsub_variables(settings),
            POLARIS,
        ],
        env=pbs.environ(),
        cwd=scratch,
        timeout=60,
    )
    assert submitted.returncode == 0, submitted.stderr
    first_job = submitted.stdout.strip()
    number = int(first_job.split(".")[0])
    assert read_text(os.path.join(pbs.spool, f"{number}.nodes")).split() == cluster.hostnames
    wait_for_spanning_checkpoint(job_dir, scratch)
    # PBS has no --signal: the job's own timer sends the batch shell SIGUSR1; qsig sends it mid-run.
    signalled = pbs.run(["qsig", "-s", "USR1", first_job], cwd=scratch)
    assert signalled.returncode == 0, signalled.stderr
    wait_for(
        lambda: pbs.state(number + 1) == "F",
        JOB_TIMEOUT_S,
        "the continuation finishing",
        lambda: job_outputs(scratch) + read_text(os.path.join(job_dir, "jobs.txt")),
    )
    elapsed = time.monotonic() - started

    # PALS sets MPICH's PMI_RANK, which discovery reads first: the family is reported as mpich.
    records = assert_spans_both_nodes(cluster, job_dir, "mpich", f"{cluster.hostnames[0]}.{POLARIS_NETWORK}")
    assert [e[2] for e in job_events(job_dir) if e[1] == first_job][-3:] == [
        "signal USR1",
        "end: sweep status 3",
        f"resubmitted as {number + 1}.polaris-pbs-emulated",
    ]
    assert read_text(os.path.join(pbs.spool, f"{number + 1}.nodes")).split() == cluster.hostnames
    resumed = assert_resumed_with_uninterrupted_weights(records, job_dir, references)
    print(
        f"\nqsub -l select={NODES} polaris.sc (emulated PBS): warned at step {resumed} of {STEPS}, continued as job "
        f"{number + 1}, study complete in {elapsed:.0f} s"
    )
