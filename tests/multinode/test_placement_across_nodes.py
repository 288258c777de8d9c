"""A study that would run on a layout other than its plan stops before the sweep, naming the hosts:
on the real Slurm of slurm_nodes.py across two namespace nodes, a site profile whose launcher puts
every rank on the first node (`srun --nodes 1`) against a plan of 2 nodes x 1 rank. The job ends
with status 1 after discovery, its one line names the host that got both ranks, and nothing ran."""

from __future__ import annotations

import json
import os

import pytest

from harness.study.sites import SITES_DIR
from tests.conftest import REPO

from .conftest import NODES

pytestmark = pytest.mark.timeout(600)
JOB_WAIT_S = 300


def wrong_site(directory: str) -> str:
    """generic-slurm, but its launcher starts every step on one node: a deliberately wrong placement."""
    with open(os.path.join(SITES_DIR, "generic-slurm.json")) as handle:
        profile = json.load(handle)
    profile.update(name="one-node-launcher", launch="srun --nodes 1 --ntasks {ranks} --cpus-per-task 1 {mpi_flags}")
    path = os.path.join(directory, "one-node-launcher.json")
    with open(path, "w") as handle:
        json.dump(profile, handle)
    return path


# Alone: a two-node srun job here hung in two of two `make test` runs beside the other lane (still
# waiting after 300 s) and passes alone; the cause is not found.
@pytest.mark.alone
@pytest.mark.slow
def test_a_launcher_that_puts_every_rank_on_one_node_stops_the_study_naming_the_host(cluster, slurm, tmp_path):
    site = wrong_site(str(tmp_path))
    script = tmp_path / "wrong-placement.sbatch"
    script.write_text(
        "#!/bin/bash\nset -euo pipefail\n"
        f'source "{REPO}/.venv/bin/activate"\nexport PYTHONPATH="{REPO}"\n'
        f'exec python -m harness study --site "{site}" --script "$0"\n'
    )
    job_dir = str(tmp_path / "study")
    output = str(tmp_path / "job.out")
    settings = {
        "KIT_DIR": REPO,
        "JOB_DIR": job_dir,
        "BACKENDS": "ddp",
        "RANKS_PER_NODE": "1",
        "RANKS": str(NODES),
        "STEPS": "5",
        "THREADS": "1",
        "SRUN_MPI": "pmix",
    }
    submitted = slurm.run(
        ["sbatch", "--parsable", "--wait", f"--nodes={NODES}", "--ntasks-per-node=2", "--output", output, str(script)],
        env=settings,
        cwd=str(tmp_path),
        timeout=JOB_WAIT_S,
    )
    moved = os.path.join(job_dir, "job.out")  # the job moves its output into JOB_DIR
    text = "".join(open(path).read() for path in (output, moved) if os.path.exists(path))
    assert submitted.returncode == 1, (submitted.returncode, submitted.stderr, text)
    lines = [line for line in text.splitlines() if "harness study: error: discovery: the ranks landed" in line]
    assert len(lines) == 1, text
    first = cluster.hostnames[0]
    assert f"{first} (node 0): 2 rank(s) per host, not the plan's {NODES} node(s) x 1" in lines[0], lines[0]
    assert not os.path.exists(os.path.join(job_dir, "results.jsonl"))  # the sweep never started
    discovery = [
        json.loads(line)
        for name in os.listdir(job_dir)
        if name.startswith("discovery-")
        for line in open(os.path.join(job_dir, name))
    ]
    assert {entry["hostname"] for entry in discovery} == {first} and len(discovery) == NODES
