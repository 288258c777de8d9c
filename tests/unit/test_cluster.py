"""Rank, local rank, world size and rendezvous address from every launcher's variables."""

from __future__ import annotations

import pytest

from harness.errors import UsageError
from harness.process.discovery import ClusterEnv, detect_cluster

LAUNCHER_TABLE = [
    # (launcher, environment as that launcher sets it for rank 3 of 8, 4 per node)
    (
        "torchrun",
        {
            "RANK": "3",
            "WORLD_SIZE": "8",
            "LOCAL_RANK": "3",
            "LOCAL_WORLD_SIZE": "4",
            "MASTER_ADDR": "node0",
            "MASTER_PORT": "29400",
        },
    ),
    (
        "torchrun",
        {
            "RANK": "3",
            "WORLD_SIZE": "8",
            "LOCAL_RANK": "3",
            "LOCAL_SIZE": "4",  # deepspeed launcher
            "MASTER_ADDR": "node0",
            "MASTER_PORT": "29400",
            "CROSS_RANK": "0",
        },
    ),
    (
        "horovodrun",
        {
            "HOROVOD_RANK": "3",
            "HOROVOD_SIZE": "8",
            "HOROVOD_LOCAL_RANK": "3",
            "HOROVOD_LOCAL_SIZE": "4",
            "MASTER_ADDR": "node0",
            "MASTER_PORT": "29400",
        },
    ),
    (
        "openmpi",
        {
            "OMPI_COMM_WORLD_RANK": "3",
            "OMPI_COMM_WORLD_SIZE": "8",
            "OMPI_COMM_WORLD_LOCAL_RANK": "3",
            "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
            "MASTER_ADDR": "node0",
            "MASTER_PORT": "29400",
        },
    ),
    (
        "mpich",
        {
            "PMI_RANK": "3",
            "PMI_SIZE": "8",
            "MPI_LOCALRANKID": "3",
            "MPI_LOCALNRANKS": "4",
            "MASTER_ADDR": "node0",
            "MASTER_PORT": "29400",
        },
    ),
    (
        "mpich",
        {
            "PMI_RANK": "3",
            "PMI_SIZE": "8",
            "PMI_LOCAL_RANK": "3",
            "PMI_LOCAL_SIZE": "4",  # Cray PALS
            "PALS_RANKID": "3",
            "PALS_LOCAL_RANKID": "3",
            "MASTER_ADDR": "node0",
            "MASTER_PORT": "29400",
        },
    ),
    (
        "pals",
        {
            "PALS_RANKID": "3",
            "PMI_SIZE": "8",
            "PALS_LOCAL_RANKID": "3",
            "PALS_LOCAL_SIZE": "4",
            "MASTER_ADDR": "node0",
            "MASTER_PORT": "29400",
        },
    ),
    (
        "slurm",
        {
            "SLURM_PROCID": "3",
            "SLURM_NTASKS": "8",
            "SLURM_LOCALID": "3",
            "SLURM_NTASKS_PER_NODE": "4",
            "SLURM_STEP_ID": "0",
            "SLURM_STEP_NUM_TASKS": "8",
            "MASTER_ADDR": "node0",
            "MASTER_PORT": "29400",
        },
    ),
    (
        "slurm",
        {
            "SLURM_PROCID": "3",
            "SLURM_NTASKS": "8",
            "SLURM_LOCALID": "3",
            "SLURM_STEP_TASKS_PER_NODE": "4(x2)",
            "SLURM_STEP_ID": "2",
            "SLURM_STEP_NUM_TASKS": "8",
            "SLURM_NODEID": "0",
            "MASTER_ADDR": "node0",
            "MASTER_PORT": "29400",
        },
    ),
]

# Inside allocations: processes that are not ranks of a step, and steps smaller than the job. The
# Slurm variables are those `env` printed under Debian's Slurm 22.05 (tests/scheduler/test_job_templates.py runs
# the real scheduler): a batch shell has SLURM_PROCID=0 and the job's SLURM_NTASKS but no
# SLURM_STEP_*; srun sets those for its tasks alone.
SLURM_JOB = {
    "SLURM_JOB_ID": "41",
    "SLURM_JOBID": "41",
    "SLURM_JOB_NODELIST": "nid[001-002]",
    "SLURM_NNODES": "2",
    "SLURM_NTASKS": "8",
    "SLURM_NPROCS": "8",
    "SLURM_TASKS_PER_NODE": "4(x2)",
    "SLURM_PROCID": "0",
    "SLURM_LOCALID": "0",
    "SLURM_NODEID": "0",
    "SLURM_GTIDS": "0",
    "SLURM_CPUS_ON_NODE": "64",
}
ALLOCATION_TABLE = [
    # (what, environment, (rank, world size, local rank, local world size, launcher))
    ("slurm batch shell", SLURM_JOB, (0, 1, 0, 1, "none")),
    ("jupyter kernel started by the batch shell", {**SLURM_JOB, "JPY_PARENT_PID": "77"}, (0, 1, 0, 1, "none")),
    (
        "srun step of 3 tasks in an 8-task job, rank 2 on the second node",
        {
            **SLURM_JOB,
            "SLURM_STEP_ID": "4",
            "SLURM_STEPID": "4",
            "SLURM_STEP_NUM_TASKS": "3",
            "SLURM_NTASKS": "3",
            "SLURM_STEP_TASKS_PER_NODE": "2,1",
            "SLURM_TASKS_PER_NODE": "2,1",
            "SLURM_PROCID": "2",
            "SLURM_LOCALID": "0",
            "SLURM_NODEID": "1",
            "SLURM_STEP_NODELIST": "nid[001-002]",
            "MASTER_ADDR": "nid001",
        },
        (2, 3, 0, 1, "slurm"),
    ),
    (
        "srun step of 1 task (a kernel started with srun)",
        {
            **SLURM_JOB,
            "SLURM_STEP_ID": "0",
            "SLURM_STEP_NUM_TASKS": "1",
            "SLURM_NTASKS": "1",
            "SLURM_STEP_TASKS_PER_NODE": "1",
        },
        (0, 1, 0, 1, "slurm"),
    ),
    (
        "PBS mother-superior shell",
        {
            "PBS_JOBID": "123.polaris-pbs-01",
            "PBS_NODEFILE": "/var/spool/pbs/aux/123",
            "PBS_O_WORKDIR": "/home/u",
            "PBS_ENVIRONMENT": "PBS_BATCH",
            "NCPUS": "64",
            "PBS_TASKNUM": "1",
            "PBS_NODENUM": "0",
        },
        (0, 1, 0, 1, "none"),
    ),
    (
        "PALS rank 5 of 8, 4 per node, under that PBS job",
        {
            "PBS_JOBID": "123.polaris-pbs-01",
            "PBS_NODEFILE": "/var/spool/pbs/aux/123",
            "PMI_RANK": "5",
            "PMI_SIZE": "8",
            "PMI_LOCAL_RANK": "1",
            "PMI_LOCAL_SIZE": "4",
            "PALS_RANKID": "5",
            "PALS_LOCAL_RANKID": "1",
            "MASTER_ADDR": "x3001c0s1b0n0",
        },
        (5, 8, 1, 4, "mpich"),
    ),
]


@pytest.mark.parametrize("what, environ, expected", ALLOCATION_TABLE, ids=[row[0] for row in ALLOCATION_TABLE])
def test_discovery_tells_a_job_shell_from_the_ranks_of_a_step(what, environ, expected):
    cluster = detect_cluster(environ, mpi_hostname=lambda: pytest.fail("no MPI lookup needed"))
    assert (
        cluster.rank,
        cluster.world_size,
        cluster.local_rank,
        cluster.local_world_size,
        cluster.launcher,
    ) == expected


def test_slurm_per_node_task_counts_are_read_for_this_node():
    step = {
        "SLURM_PROCID": "4",
        "SLURM_STEP_ID": "0",
        "SLURM_STEP_NUM_TASKS": "7",
        "SLURM_LOCALID": "0",
        "SLURM_STEP_TASKS_PER_NODE": "3(x2),1",
        "MASTER_ADDR": "n0",
    }
    assert [
        detect_cluster({**step, "SLURM_NODEID": node, "SLURM_PROCID": rank}).local_world_size
        for node, rank in (("0", "0"), ("1", "4"), ("2", "6"))
    ] == [3, 3, 1]
    with pytest.raises(UsageError, match="is not a Slurm task count"):
        detect_cluster({**step, "SLURM_STEP_TASKS_PER_NODE": "three"})


@pytest.mark.parametrize(
    "launcher, environ", LAUNCHER_TABLE, ids=[f"{row[0]}-{i}" for i, row in enumerate(LAUNCHER_TABLE)]
)
def test_every_launcher_gives_rank_sizes_and_address(launcher, environ):
    assert detect_cluster(environ) == ClusterEnv(
        rank=3,
        world_size=8,
        local_rank=3,
        local_world_size=4,
        master_addr="node0",
        master_port=29400,
        launcher=launcher,
    )


def test_plain_process_is_rank_zero_of_one():
    assert detect_cluster({}) == ClusterEnv(0, 1, 0, 1, "127.0.0.1", 29500, "none")


def test_single_node_jobs_rendezvous_on_loopback_without_mpi():
    env = {
        "OMPI_COMM_WORLD_RANK": "1",
        "OMPI_COMM_WORLD_SIZE": "2",
        "OMPI_COMM_WORLD_LOCAL_RANK": "1",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
    }
    assert (
        detect_cluster(env, mpi_hostname=lambda: pytest.fail("no MPI needed on one node")).master_addr == "127.0.0.1"
    )


def test_multi_node_mpi_job_broadcasts_rank0_hostname():
    env = {"PMI_RANK": "5", "PMI_SIZE": "8", "PMI_LOCAL_RANK": "1", "PMI_LOCAL_SIZE": "4"}
    assert detect_cluster(env, mpi_hostname=lambda: "x3004c0s7b0n0").master_addr == "x3004c0s7b0n0"


def test_pbs_master_is_first_line_of_the_nodefile(tmp_path):
    nodefile = tmp_path / "nodes"
    nodefile.write_text("x3001c0s1b0n0.hsn\nx3001c0s2b0n0.hsn\n")
    env = {
        "PMI_RANK": "0",
        "PMI_SIZE": "8",
        "PMI_LOCAL_RANK": "0",
        "PMI_LOCAL_SIZE": "4",
        "PBS_NODEFILE": str(nodefile),
        "PBS_JOBID": "42.polaris",
    }
    assert detect_cluster(env, mpi_hostname=lambda: "x3001c0s1b0n0.hsn").master_addr == "x3001c0s1b0n0.hsn"
    # two jobs on one node get different default ports
    other = {**env, "PBS_JOBID": "43.polaris"}
    assert detect_cluster(env, lambda: "h").master_port != detect_cluster(other, lambda: "h").master_port


@pytest.mark.parametrize(
    "environ, fragment",
    [
        ({"RANK": "0"}, "no world size variable"),
        ({"RANK": "4", "WORLD_SIZE": "4"}, "outside the world"),
        ({"RANK": "x", "WORLD_SIZE": "4"}, "not an integer"),
        ({"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "5", "LOCAL_WORLD_SIZE": "2"}, "does not fit"),
    ],
)
def test_inconsistent_variables_are_refused_clearly(environ, fragment):
    with pytest.raises(UsageError, match=fragment):
        detect_cluster(environ)
