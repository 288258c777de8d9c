"""The batch systems' launchers across two namespace nodes: a real Slurm (slurmctld on node 1, a slurmd
on each node; slurm_nodes.py) runs an srun step over both nodes, and the emulated PBS's Cray-PALS
`mpiexec` (tests/pbs_emulation) places its ranks on the nodes of a PBS_NODEFILE, through
OpenMPI's site configuration (a default hostfile and the cluster's ssh). Every rank must discover
its rank, node and sizes, with node 1 as the rendezvous, and the step exit 0. Seconds each.
"""

from __future__ import annotations

import os
import sys

from harness.process.launchers import launch_environment
from tests.conftest import REPO

from .jobs import RANKS_PER_NODE, discovered, openmpi_site_settings
from .netns_cluster import NetnsCluster
from .test_across_nodes import RANKS

MPIEXEC = os.path.join(REPO, "tests", "pbs_emulation", "bin", "mpiexec")
STEP_LIMIT_S = 120


def _check_discovery(cluster: NetnsCluster, found: dict[int, dict], launcher: str, output: str) -> None:
    assert sorted(found) == list(range(RANKS)), output
    for rank, row in found.items():
        where = f"rank {rank}: {row}"
        assert row["launcher"] == launcher, where
        assert row["hostname"] == cluster.hostnames[rank // RANKS_PER_NODE], where
        assert (row["local_rank"], row["local_world_size"], row["world_size"]) == (
            rank % RANKS_PER_NODE,
            RANKS_PER_NODE,
            RANKS,
        ), where
        assert cluster.address(row["master_addr"]) == cluster.addresses[0], where


def test_an_srun_step_spans_both_slurm_nodes(cluster, slurm):
    result = slurm.run(
        [
            "srun",
            "-N",
            str(len(cluster.hostnames)),
            "--ntasks-per-node",
            str(RANKS_PER_NODE),
            "--kill-on-bad-exit=1",
            sys.executable,
            "-m",
            "harness",
            "env",
        ],
        timeout=STEP_LIMIT_S,
        env=launch_environment(),
        cwd=REPO,
    )
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}\n{slurm.log_tail()}"
    _check_discovery(cluster, discovered(result.stdout), "slurm", result.stdout + result.stderr)


def test_the_emulated_pbs_mpiexec_places_ranks_on_the_nodes_of_its_nodefile(cluster, tmp_path):
    nodefile = tmp_path / "PBS_NODEFILE"
    nodefile.write_text("".join(f"{host}\n" for host in cluster.hostnames))
    site = openmpi_site_settings(cluster, str(tmp_path / "openmpi-hosts"))
    result = cluster.run(
        1,
        [
            MPIEXEC,
            "-n",
            str(RANKS),
            "--ppn",
            str(RANKS_PER_NODE),
            "--depth",
            "1",
            sys.executable,
            "-m",
            "harness",
            "env",
        ],
        timeout=STEP_LIMIT_S,
        env=launch_environment({"PBS_NODEFILE": str(nodefile), "PBS_JOBID": "1.pbs", **site}),
        cwd=REPO,
    )
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    # PALS sets MPICH's PMI_RANK too, which discovery reads first: the family is reported as mpich.
    _check_discovery(cluster, discovered(result.stdout), "mpich", result.stdout + result.stderr)
