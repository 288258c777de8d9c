"""Site helpers run for real: the affinity scripts of submissions/ and Slurm's scontrol."""

from __future__ import annotations

import os
import subprocess

import pytest

from harness.errors import UsageError
from harness.process.discovery import detect_cluster
from harness.study.settings import site_launch
from harness.study.sites import load_site
from tests.conftest import REPO
from tests.helpers.study_helpers import make_job


def test_polaris_affinity_helper_follows_the_profiles_gpu_order():
    order = load_site("polaris").gpu_order_list(4)
    seen = []
    for local_rank in range(4):
        env = dict(os.environ, GPUS_PER_NODE="4", PROCS_PER_GPU="1", PMI_LOCAL_RANK=str(local_rank))
        result = subprocess.run(
            [
                os.path.join(REPO, "submissions", "set_affinity_gpu_polaris.sh"),
                "sh",
                "-c",
                'echo "$CUDA_VISIBLE_DEVICES"',
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
        )
        seen.append(int(result.stdout))
    assert seen == order == [3, 2, 1, 0]


def test_rank_zero_is_the_first_host_of_the_steps_node_list():
    # A 2-node run inside a 4-node job: its step runs on nid[003-004], so rank 0 is on nid003.
    step = {
        "SLURM_PROCID": "0",
        "SLURM_STEP_ID": "3",
        "SLURM_STEP_NUM_TASKS": "8",
        "SLURM_LOCALID": "0",
        "SLURM_STEP_TASKS_PER_NODE": "4(x2)",
        "SLURM_NODEID": "0",
        "SLURM_JOB_NODELIST": "nid[001-004]",
        "SLURM_STEP_NODELIST": "nid[003-004]",
    }
    assert detect_cluster(step).master_addr == "nid003"


def test_aurora_binds_six_ranks_to_each_socket_and_one_tile_to_each_rank(tmp_path):
    # ALCF Aurora user guide: 12 ranks per node, 8 cores each, cores 0 and 52 reserved; with
    # frameworks' flat hierarchy each tile is a device, so each rank's ZE_AFFINITY_MASK is one index.
    job = make_job("aurora", str(tmp_path / "job"), gpus=12)
    assert site_launch(job.profile, job.settings, "/kit") == (
        "mpiexec -n {ranks} --ppn {ppn} --cpu-bind list:1-8:9-16:17-24:25-32:33-40:41-48:53-60:61-68:69-76:77-84:"
        "85-92:93-100 --env OMP_NUM_THREADS=8 /kit/submissions/set_affinity_gpu_aurora.sh"
    )
    assert job.profile.cpu_bind_list(4, 25) == "1-25:26-50:53-77:78-102"
    with pytest.raises(UsageError, match="pass RANKS_PER_NODE of at most 102"):
        job.profile.cpu_bind_list(104, 1)
    seen = []
    for local_rank in range(14):
        env = dict(os.environ, GPUS_PER_NODE="12", PROCS_PER_GPU="1", PALS_LOCAL_RANKID=str(local_rank))
        result = subprocess.run(
            [os.path.join(REPO, "submissions", "set_affinity_gpu_aurora.sh"), "sh", "-c", 'echo "$ZE_AFFINITY_MASK"'],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
        )
        seen.append(int(result.stdout))
    assert seen == [*job.profile.gpu_order_list(12), 0, 1]
