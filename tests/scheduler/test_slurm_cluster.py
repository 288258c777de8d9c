"""The test Slurm itself (tests/helpers/slurm_cluster.py): a test process killed mid-test (CI's time
limit, a ^C) leaves its daemons and its jobs running outside pytest's process tree; the next test Slurm
to start ends them all."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from harness.process.processes import name
from tests.conftest import REPO
from tests.helpers.slurm_cluster import (
    SlurmCluster,
    SlurmUnavailable,
    check_installed,
    cluster_processes,
    remove_stale_clusters,
)

# Starts a test Slurm, runs a job on it and dies without a word, as a killed pytest would.
OWNER = textwrap.dedent("""
    import os, signal, subprocess, sys, time
    sys.path.insert(0, sys.argv[2])
    from harness.process.processes import name
    from tests.helpers.slurm_cluster import SlurmCluster, cluster_processes
    cluster = SlurmCluster(sys.argv[1]).start()
    cluster.run(["sbatch", "--wrap", "sleep 600"], cwd=sys.argv[1])
    deadline = time.monotonic() + 60
    while "sleep" not in {name(pid) for pid in cluster_processes(cluster.conf)}:  # the job's task itself, not only its state in squeue
        assert time.monotonic() < deadline, "the job did not start"
        time.sleep(0.2)
    print(cluster.record_path, cluster.conf, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)  # no finalizer, no atexit
""")


def test_a_slurm_whose_owner_was_killed_is_ended_with_its_jobs_by_the_next_start(tmp_path):
    try:
        check_installed()
    except SlurmUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)
    (tmp_path / "stale").mkdir()
    owner = subprocess.run(
        [sys.executable, "-c", OWNER, str(tmp_path / "stale"), REPO], capture_output=True, text=True, timeout=120
    )
    assert owner.returncode == -signal.SIGKILL, owner.stderr
    record, conf = owner.stdout.split()
    left_behind = {name(pid) for pid in cluster_processes(conf)}
    assert {"munged", "slurmctld", "slurmd", "slurmstepd", "sleep"} <= left_behind, left_behind
    fresh = SlurmCluster(str(tmp_path / "fresh")).start()
    try:
        assert not os.path.exists(record)
        assert cluster_processes(conf) == []  # the killed daemons, steps and tasks are reaped, not zombies
    finally:
        fresh.stop()
    assert not os.path.exists(fresh.record_path)
    assert remove_stale_clusters() == []
