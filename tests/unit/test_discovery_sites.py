"""Discovery under each site's launcher, from the environments the sites' srun and mpiexec give.

- Frontier and Perlmutter: srun under Slurm's `cray_shasta` MPI plugin sets PALS_RANKID, PALS_NODEID
  (and the apinfo and spool variables) in every task, and Cray PMI puts PMI_RANK and PMI_SIZE beside
  them. Inside a Slurm step the step's tasks are the ranks: rank, sizes and rank 0's host come from
  Slurm, with no MPI lookup (Frontier's recipe once had no mpi4py, and every rank exited 2).
- Slurm's own pmi2 (PMI_RANK, PMI_SIZE, PMI_FD) and pmix (PMIX_RANK) plugins alike.
- OpenMPI's mpirun and MPICH's Hydra in a Slurm job start one daemon task per node through srun:
  their ranks inherit that step's SLURM_* variables, and their own world (a size other than the
  step's) is the one that counts.
- Aurora: Cray PALS mpiexec with PMIx: PALS_RANKID, PALS_LOCAL_RANKID, PMIX_RANK and PMIX_SIZE.

The real launchers run in tests/scheduler/test_study_sites.py (the test Slurm with cray_shasta and
pmi2, the emulated PALS mpiexec with PMIx variables).
"""

from __future__ import annotations

import sys

import pytest

from harness.errors import UsageError
from harness.process import discovery
from harness.process.discovery import detect_cluster, import_mpi_first

# Task 5 of a 2-node x 4-task step on Frontier, as srun with cray_shasta and Cray PMI set it (the
# variables Slurm's mpi_cray_shasta plugin sets, as Debian's Slurm 22.05 shows them in the test Slurm).
FRONTIER_TASK = {
    "SLURM_JOB_ID": "2853270",
    "SLURM_JOB_NODELIST": "frontier[05084-05087]",
    "SLURM_STEP_ID": "0",
    "SLURM_STEP_NUM_TASKS": "8",
    "SLURM_STEP_NUM_NODES": "2",
    "SLURM_STEP_NODELIST": "frontier[05086-05087]",
    "SLURM_STEP_TASKS_PER_NODE": "4(x2)",
    "SLURM_PROCID": "5",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "1",
    "PALS_APID": "2853270.0",
    "PALS_RANKID": "5",
    "PALS_NODEID": "1",
    "PALS_SPOOL_DIR": "/var/spool/slurmd/mpi_cray_shasta/2853270.0",
    "PALS_APINFO": "/var/spool/slurmd/mpi_cray_shasta/2853270.0/apinfo",
    "PMI_CONTROL_PORT": "11999",
    "PMI_RANK": "5",
    "PMI_SIZE": "8",
}


def _no_mpi() -> str:
    raise AssertionError("discovery asked MPI for rank 0's host")


def _place(environ: dict[str, str]) -> tuple[int, int, int, int, str, str]:
    cluster = detect_cluster(environ, mpi_hostname=_no_mpi)
    return (
        cluster.rank,
        cluster.world_size,
        cluster.local_rank,
        cluster.local_world_size,
        cluster.launcher,
        cluster.master_addr,
    )


@pytest.mark.parametrize(
    "what, extra",
    [
        ("cray_shasta with Cray PMI", {}),
        ("cray_shasta alone", {"PMI_RANK": "", "PMI_SIZE": ""}),
        ("a PMI_RANK that disagrees with Slurm's", {"PMI_RANK": "0"}),
        ("Slurm's pmi2 plugin", {"PALS_RANKID": "", "PMI_FD": "13", "PMI_JOBID": "2853270.0"}),
        ("Slurm's pmix plugin", {"PALS_RANKID": "", "PMI_RANK": "", "PMI_SIZE": "", "PMIX_RANK": "5"}),
    ],
)
def test_a_slurm_step_is_read_from_slurm_whatever_pmi_says(what, extra, monkeypatch):
    monkeypatch.setattr(
        discovery, "_slurm_first_host", lambda nodelist: {"frontier[05086-05087]": "frontier05086"}[nodelist]
    )
    environ = {**FRONTIER_TASK, **extra}
    assert _place(environ) == (5, 8, 1, 4, "slurm", "frontier05086"), what
    assert import_mpi_first(environ) is False  # nothing for MPI to tell


def test_mpi_launchers_that_start_their_daemons_through_srun_keep_their_own_world():
    # OpenMPI's mpirun in an 8-rank Slurm job: its orted daemons are the tasks of a 2-task step.
    orted_step = {
        "SLURM_STEP_ID": "1",
        "SLURM_STEP_NUM_TASKS": "2",
        "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
        "SLURM_PROCID": "1",
        "SLURM_LOCALID": "0",
        "SLURM_NODEID": "1",
        "MASTER_ADDR": "nid001",
    }
    openmpi = {
        **orted_step,
        "OMPI_COMM_WORLD_RANK": "6",
        "OMPI_COMM_WORLD_SIZE": "8",
        "OMPI_COMM_WORLD_LOCAL_RANK": "2",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
    }
    assert _place(openmpi) == (6, 8, 2, 4, "openmpi", "nid001")
    hydra = {**orted_step, "PMI_RANK": "6", "PMI_SIZE": "8", "MPI_LOCALRANKID": "2", "MPI_LOCALNRANKS": "4"}
    assert _place(hydra) == (6, 8, 2, 4, "mpich", "nid001")
    # torchrun's workers, started by an srun task (one agent per node), are torchrun's ranks.
    torchrun = {**FRONTIER_TASK, "RANK": "13", "WORLD_SIZE": "16", "LOCAL_RANK": "5", "LOCAL_WORLD_SIZE": "8"}
    assert _place({**torchrun, "MASTER_ADDR": "frontier05086"})[:5] == (13, 16, 5, 8, "torchrun")


def test_aurora_ranks_read_pals_and_pmix_without_pmi_variables():
    # Rank 13 of 2 nodes x 12 under Aurora's mpiexec (PALS with PMIx): ALCF's scripts read PMIX_RANK
    # and PALS_LOCAL_RANKID (docs/aurora/running-jobs-aurora.md, docs/aurora/debugging/gdb-oneapi.md).
    aurora = {
        "PBS_JOBID": "8123.aurora-pbs-0001",
        "PALS_RANKID": "13",
        "PALS_LOCAL_RANKID": "1",
        "PALS_NODEID": "1",
        "PALS_LOCAL_SIZE": "12",
        "PMIX_RANK": "13",
        "PMIX_SIZE": "24",
    }
    seen = detect_cluster(aurora, mpi_hostname=lambda: "x4407c6s2b0n0")
    assert (seen.rank, seen.world_size, seen.local_rank, seen.local_world_size, seen.launcher) == (
        13,
        24,
        1,
        12,
        "pals",
    )
    assert seen.master_addr == "x4407c6s2b0n0"
    pmix_only = {name: value for name, value in aurora.items() if not name.startswith("PALS_RANKID")}
    assert detect_cluster(pmix_only, mpi_hostname=lambda: "h").rank == 13
    with pytest.raises(UsageError, match=r"PALS_RANKID is set but no world size variable is \(PMI_SIZE, PMIX_SIZE\)"):
        detect_cluster({name: value for name, value in aurora.items() if name != "PMIX_SIZE"})


def test_mpi_is_imported_first_only_where_discovery_needs_it(monkeypatch):
    across_nodes = {"PALS_RANKID": "13", "PMIX_SIZE": "24", "PALS_LOCAL_RANKID": "1", "PALS_LOCAL_SIZE": "12"}
    imported = []
    monkeypatch.setattr(discovery, "_mpi", lambda: imported.append("mpi4py.MPI"))
    monkeypatch.delitem(sys.modules, "mpi4py.MPI", raising=False)
    assert import_mpi_first(across_nodes) is True and imported == ["mpi4py.MPI"]
    for needs_nothing in (
        {**across_nodes, "MASTER_ADDR": "x4407c6s2b0n0"},  # the address is given
        {**across_nodes, "PALS_LOCAL_SIZE": "24"},  # one node: loopback
        {"RANK": "13", "WORLD_SIZE": "24", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "12"},  # torchrun
        {**across_nodes, "PMIX_SIZE": "many"},  # discovery itself names the bad variable
        {},
    ):
        assert import_mpi_first(needs_nothing) is False
    assert imported == ["mpi4py.MPI"]


def test_mpi_needed_but_missing_is_discoverys_own_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "mpi4py", None)  # not installed
    monkeypatch.delitem(sys.modules, "mpi4py.MPI", raising=False)
    with pytest.raises(
        UsageError, match=r"finding rank 0's host without MASTER_ADDR needs mpi4py.*export MASTER_ADDR"
    ):
        import_mpi_first({"PMI_RANK": "5", "PMI_SIZE": "8", "PMI_LOCAL_RANK": "1", "PMI_LOCAL_SIZE": "4"})
