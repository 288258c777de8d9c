"""Site helpers run for real: the affinity scripts of submissions/, Slurm's scontrol, and discovery
under each site's launcher (the real test Slurm with the cray_shasta and pmi2 plugins; the emulated
PALS mpiexec with Aurora's PMIx variables)."""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import sys

import pytest

from harness.errors import UsageError
from harness.process.discovery import detect_cluster
from harness.study.jobs.settings import site_launch
from harness.study.sites import load_site
from harness.training.record import read_records
from tests.conftest import REPO
from tests.helpers.slurm_cluster import SlurmCluster, SlurmUnavailable, check_installed
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


# -- Discovery under the launchers of Frontier/Perlmutter (Slurm's cray_shasta) and Aurora (PALS, PMIx) --

STEP_PROGRAM = (
    'env > "$OUT/env.$SLURM_PROCID" && '
    'exec "$PYTHON" -v -m harness env 2> "$OUT/imports.$SLURM_PROCID" > "$OUT/place.$SLURM_PROCID"'
)


def _read_step(out: str, tasks: int) -> list[tuple[dict[str, str], dict[str, object], str]]:
    """Each task's environment, `harness env` report and `python -v` log, by rank."""
    found = []
    for rank in range(tasks):
        with open(os.path.join(out, f"env.{rank}")) as handle:
            environ = dict(line.rstrip("\n").split("=", 1) for line in handle if "=" in line)
        with open(os.path.join(out, f"place.{rank}")) as handle:
            place = json.loads(handle.read())
        with open(os.path.join(out, f"imports.{rank}")) as handle:
            found.append((environ, place, handle.read()))
    return found


def _imports(log: str) -> list[str]:
    """The modules `python -v` logged importing, in order."""
    return [line.split("'")[1] for line in log.splitlines() if line.startswith("import '")]


@pytest.mark.slow
def test_a_cray_shasta_step_is_read_from_slurm_whatever_pmi_says(tmp_path):
    """Frontier's srun environment on 2 nodes x 2 tasks: the real cray_shasta plugin's PALS_* and Cray
    PMI's PMI_RANK/PMI_SIZE (emulated, tests/helpers/slurm_cluster.py) in every task. Discovery takes
    rank, sizes and rank 0's host from Slurm, imports no mpi4py, and ranks across both nodes meet;
    Slurm's own pmi2 plugin (PMI_RANK, PMI_SIZE, PMI_FD) is read alike."""
    try:
        check_installed()
    except SlurmUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)
    cluster = SlurmCluster(str(tmp_path / "slurm"), nodes=2, mpi="cray_shasta").start()
    try:
        for plugin in ("cray_shasta", "pmi2"):  # cray_shasta: the cluster's MpiDefault
            out = tmp_path / plugin
            out.mkdir()
            step = cluster.run(
                ["srun", f"--mpi={plugin}", "-N2", "-n4", "--ntasks-per-node=2", "sh", "-c", STEP_PROGRAM],
                env={"OUT": str(out), "PYTHON": sys.executable},
                cwd=REPO,
                timeout=240,
            )
            assert step.returncode == 0, step.stderr + cluster.log_tail()
            tasks = _read_step(str(out), 4)
            for rank, (environ, place, imports) in enumerate(tasks):
                assert (environ["PMI_RANK"], environ["PMI_SIZE"]) == (str(rank), "4")
                assert ("PALS_RANKID" in environ) == (plugin == "cray_shasta")
                assert (place["rank"], place["world_size"], place["local_rank"], place["local_world_size"]) == (
                    rank,
                    4,
                    rank % 2,
                    2,
                )
                assert (place["launcher"], place["master_addr"]) == ("slurm", cluster.nodes[0])
                assert "mpi4py.MPI" not in _imports(imports), f"rank {rank} imported mpi4py under srun"
        results = tmp_path / "train.jsonl"
        train = cluster.run(
            [
                "srun",
                "-N2",
                "--ntasks-per-node=1",
                sys.executable,
                "-m",
                "harness",
                "train",
                "--backend",
                "ddp",
                "--max-steps",
                "3",
                "--batch-size",
                "16",
                "--eval-every",
                "0",
                "--threads",
                "1",
                "--calibration-steps",
                "1",
                "--timing-warmup-steps",
                "1",
                "--results",
                str(results),
            ],
            cwd=REPO,
            timeout=300,
        )
        assert train.returncode == 0, train.stderr[-3000:]
        (record,) = read_records([str(results)])
        assert (record["world_size"], record["launcher"]) == (2, "slurm")
    finally:
        cluster.stop()


@pytest.mark.slow
def test_aurora_ranks_with_pmix_variables_only_find_their_world_and_import_mpi_before_torch(tmp_path):
    """Aurora's mpiexec (Cray PALS with PMIx): PALS_RANKID, PALS_LOCAL_RANKID, PMIX_RANK and
    PMIX_SIZE, no PMI_*. The emulated PALS mpiexec (tests/pbs_emulation) places 4 ranks on 2 nodes
    of a host file; each rank keeps only PALS's and PMIx's variables. Discovery finds the world of 4,
    2 per node, and rank 0's host over MPI, with mpi4py imported by `python -m harness` before the
    command runs."""
    hostfile = tmp_path / "nodes"
    hostfile.write_text(f"localhost\n{socket.gethostname()}\n")
    keep_pmix = (
        "unset PMI_RANK PMI_SIZE PMI_LOCAL_RANK PMI_LOCAL_SIZE; "
        'export PMIX_SIZE="$PALS_SIZE"; '
        'exec "$PYTHON" -v -m harness env 2> "$OUT/imports.$PALS_RANKID" > "$OUT/place.$PALS_RANKID"'
    )
    program = f'env > "$OUT/env.$PALS_RANKID"; PALS_SIZE="$PMI_SIZE" sh -c {shlex.quote(keep_pmix)}'
    environ = dict(
        os.environ,
        PATH=f"{os.path.join(REPO, 'tests', 'pbs_emulation', 'bin')}:{os.environ['PATH']}",
        OUT=str(tmp_path),
        PYTHON=sys.executable,
    )
    ran = subprocess.run(
        ["mpiexec", "-n", "4", "--ppn", "2", "--hostfile", str(hostfile), "sh", "-c", program],
        env=environ,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    hosts = set()
    for rank in range(4):
        with open(tmp_path / f"place.{rank}") as handle:
            place = json.loads(handle.read())
        imports = (tmp_path / f"imports.{rank}").read_text()
        assert (place["rank"], place["world_size"], place["local_rank"], place["local_world_size"]) == (
            rank,
            4,
            rank % 2,
            2,
        )
        order = _imports(imports)
        assert place["launcher"] == "pals" and order.index("mpi4py.MPI") < order.index("torch")
        hosts.add(place["master_addr"])
    assert hosts == {socket.gethostname()}  # every rank got rank 0's host from MPI
