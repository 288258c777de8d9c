"""Discovery with Slurm's own scontrol expanding a node list."""

from __future__ import annotations

from harness.process.discovery import detect_cluster


def test_slurm_master_is_first_host_of_the_nodelist():
    env = {
        "SLURM_PROCID": "0",
        "SLURM_NTASKS": "8",
        "SLURM_LOCALID": "0",
        "SLURM_NTASKS_PER_NODE": "4",
        "SLURM_STEP_ID": "0",
        "SLURM_STEP_NUM_TASKS": "8",
        "SLURM_JOB_NODELIST": "nid[001004-001005,002000]",
        "SLURM_JOB_ID": "123",
    }
    cluster = detect_cluster(env)
    assert cluster.master_addr == "nid001004"
    assert 29500 <= cluster.master_port < 31500 and cluster.master_port == detect_cluster(env).master_port
