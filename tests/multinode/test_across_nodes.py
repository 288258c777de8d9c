"""The harness across two nodes for real: 2 nodes x 2 ranks, each node a network namespace of its own
with its own hostname and address (netns_cluster.py), under every multi-node launcher (jobs.py).

- discovery: every rank finds its rank, local rank, node, sizes and node 1 as the rendezvous address;
- training: every distributed backend ends with the weights of one process on the global batch,
  and the job exits 0 (every launcher's finished run: mpirun's once exited 1, see harness.cli);
- a preempted run exits with 3 through mpirun;
- a lost node (its link pulled mid-run, so nothing tells the survivors) ends the job with a non-zero
  status within --timeout + 30 s, under every backend and every multi-node launcher, and nothing is
  left running on node 1.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator

import pytest
import torch

from harness.backends import BACKENDS
from harness.errors import EXIT_PREEMPTED
from harness.study.scaling.equivalence import UPDATE_BOUND, update_differences, worst
from tests.conftest import REPO, launch
from tests.helpers.weights import CNN, initial_weights, load_weights
from tests.integration.test_equivalence import COMMON, SGD
from tests.multinode.conftest import NODES

from .jobs import MULTINODE_LAUNCHERS, RANKS_PER_NODE, ClusterJob, discovered, multinode_commands, run_job
from .netns_cluster import NetnsCluster

RANKS = NODES * RANKS_PER_NODE
LOCAL_BATCH = 8  # 4 ranks x 8: the global batch of 32 the single-process reference takes
# The digits CNN without dropout, as initial_weights() makes it (dropout's masks depend on the rank).
TRAIN = [*COMMON, *CNN, *SGD]
DISCOVERY_LIMIT_S = 120
TRAIN_LIMIT_S = 300
DISTRIBUTED = [name for name, cls in BACKENDS.items() if cls.max_world_size is None]


def _training_runs() -> list[tuple[str, str]]:
    """Every distributed backend once, under its own launcher where no other backend took it yet,
    else under another it runs under; then any launcher left under a backend it can start, so that
    every multi-node launcher runs a training."""
    runs: list[tuple[str, str]] = []
    unused = list(MULTINODE_LAUNCHERS)
    for name in DISTRIBUTED:
        cls = BACKENDS[name]
        launcher = (
            cls.local_launcher
            if cls.local_launcher in unused
            else next((choice for choice in unused if choice in cls.local_launchers), cls.local_launcher)
        )
        runs.append((name, launcher))
        unused = [choice for choice in unused if choice != launcher]
    runs += [
        (next(name for name in DISTRIBUTED if launcher in BACKENDS[name].local_launchers), launcher)
        for launcher in unused
    ]
    return runs


TRAINING = _training_runs()
TIMEOUT_S = 10  # as the stuck-rank tests: the survivors give up, and name node 2, within it
SLACK_S = 30
# A harmless signal as a progress marker: rank 0 prints this line when it sends itself SIGCONT after step 3.
TRAINING_MARKER = "sending SIGCONT to itself after step 3"
LOST = "lost contact with a peer"


def test_the_training_runs_cover_every_distributed_backend_and_multinode_launcher():
    assert {backend for backend, _ in TRAINING} == set(DISTRIBUTED)
    assert {launcher for _, launcher in TRAINING} == set(MULTINODE_LAUNCHERS)


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["mpirun", "torchrun", "horovodrun"])
def test_every_rank_discovers_its_node_and_node1_as_the_rendezvous(cluster, launcher):
    statuses, job = run_job(cluster, launcher, ["env"], DISCOVERY_LIMIT_S, cwd=REPO)
    assert statuses is not None, f"{launcher}: `harness env` did not end within {DISCOVERY_LIMIT_S} s\n{job.tail()}"
    assert set(statuses) == {0}, f"{launcher}: exit {statuses}\n{job.tail()}"
    found = discovered(job.output)
    assert sorted(found) == list(range(RANKS)), job.tail()
    for rank, row in found.items():
        node = rank // RANKS_PER_NODE  # launchers fill node 1's slots first
        where = f"{launcher}, rank {rank}: {row}"
        assert row["hostname"] == cluster.hostnames[node], where
        assert (row["local_rank"], row["local_world_size"], row["world_size"]) == (
            rank % RANKS_PER_NODE,
            RANKS_PER_NODE,
            RANKS,
        ), where
        assert cluster.address(row["master_addr"]) == cluster.addresses[0], where


@pytest.fixture(scope="module")
def single_process(tmp_path_factory) -> dict[str, torch.Tensor]:
    """The `none` baseline's weights with the 4-rank global batch (run on this machine, no namespace)."""
    path = tmp_path_factory.mktemp("reference") / "model.pt"
    launch(1, "none", [*TRAIN, "--batch-size", str(RANKS * LOCAL_BATCH), "--save-model", str(path)])
    return load_weights(path)


@pytest.mark.slow
@pytest.mark.parametrize("backend, launcher", TRAINING, ids=[f"{b}-{l}" for b, l in TRAINING])
def test_backend_trains_across_nodes_like_one_process(cluster, single_process, tmp_path, backend, launcher):
    model, results = tmp_path / "model.pt", tmp_path / "results.jsonl"
    started = time.monotonic()
    statuses, job = run_job(
        cluster,
        launcher,
        [
            "train",
            "--backend",
            backend,
            *TRAIN,
            "--batch-size",
            str(LOCAL_BATCH),
            "--save-model",
            str(model),
            "--results",
            str(results),
        ],
        TRAIN_LIMIT_S,
        cwd=REPO,
    )
    assert statuses is not None, f"{backend} via {launcher}: still running after {TRAIN_LIMIT_S} s\n{job.tail()}"
    assert set(statuses) == {0}, f"{backend} via {launcher}: a finished run exited {statuses}\n{job.tail()}"
    print(f"\n{backend} via {launcher} on {NODES} nodes x {RANKS_PER_NODE}: {time.monotonic() - started:.0f} s")
    with open(results) as handle:
        record = json.loads(handle.read().splitlines()[-1])
    assert (record["world_size"], record["local_world_size"], record["host"]["hostname"]) == (
        RANKS,
        RANKS_PER_NODE,
        cluster.hostnames[0],
    )
    name, value = worst(update_differences(load_weights(model), single_process, initial_weights()))
    assert value <= UPDATE_BOUND, f"{backend} via {launcher}: {name} differs by {value:.3g} of its update"


@pytest.mark.slow
def test_a_preempted_run_across_nodes_exits_3_through_mpirun(cluster):
    """The failed run's status across nodes, through the launcher whose exit path the CLI finalises
    MPI for: every rank stops at the same step after rank 0's SIGTERM and exits with 3, which mpirun
    passes on (finished runs exit 0 under every launcher above; tests/integration/test_exit_status.py has every
    pair on one node)."""
    args = [
        "train",
        "--backend",
        "horovod",
        *TRAIN,
        "--batch-size",
        str(LOCAL_BATCH),
        "--max-steps",
        "200",
        "--timeout",
        str(TIMEOUT_S),
    ]
    job = ClusterJob(
        cluster, multinode_commands("mpirun", cluster, args), env={"HARNESS_TEST_SIGNAL": "TERM@2:0"}, cwd=REPO
    )
    assert job.wait(TRAIN_LIMIT_S) is not None, f"still running after {TRAIN_LIMIT_S} s\n{job.tail()}"
    assert "stopped by SIGTERM after step" in job.output, job.tail()
    assert job.statuses == [EXIT_PREEMPTED], job.tail()


def _cut_node_off_mid_run(cluster: NetnsCluster, backend: str, launcher: str, node: int) -> ClusterJob:
    """Start a long run, wait until it trains, then pull `node`'s link; return the job, still running.

    The node's processes keep running, cut off: nothing tells anyone, no FIN, no RST, no exit, as
    when a node's network or power fails. (Killing them instead would also kill the cluster's ssh
    session to the node, a local process here, and its exit would tell mpirun at once, which a real
    ssh over a dead network does not.)"""
    args = [
        "train",
        "--backend",
        backend,
        *TRAIN,
        "--batch-size",
        str(LOCAL_BATCH),
        "--max-steps",
        "100000",
        "--epochs",
        "1000",
        "--timeout",
        str(TIMEOUT_S),
    ]
    job = ClusterJob(
        cluster,
        multinode_commands(launcher, cluster, args),
        env={"HARNESS_TEST_SIGNAL": "CONT@3:0"},
        markers=[TRAINING_MARKER, LOST],
        cwd=REPO,
    )
    if not job.wait_for(TRAINING_MARKER, TRAIN_LIMIT_S):
        job.kill()
        pytest.fail(f"{backend} via {launcher}: never reached step 3\n{job.tail()}")
    job.mark("node lost")
    cluster.set_link(node, up=False)
    return job


def _left_running(cluster: NetnsCluster, node: int, grace_s: float = 2.0) -> list[int]:
    """The processes still on `node` once `grace_s` has passed (exiting ones get that long)."""
    deadline = time.monotonic() + grace_s
    while (pids := cluster.pids(node)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return pids


@pytest.fixture(scope="module")
def lost_node_jobs(tmp_path_factory) -> Iterator[dict[tuple[str, str], tuple[ClusterJob, list[int]]]]:
    """Each run of TRAINING (every distributed backend, every multi-node launcher) on a cluster of
    its own, node 2's link pulled once it trains; then (job, what is left on node 1) per run, once
    node 1's launcher ended (or, killed, overstayed). After its link is pulled a job only waits (for
    --timeout, or mpirun's keepalive), so the next run starts meanwhile; started all at once
    instead, the jobs that train already take the cores from those still starting (measured on 2
    cores: 172 s for the four at once, 111 s one after another, 58 s so)."""
    with contextlib.ExitStack() as clusters:
        waiting = {}
        for backend, launcher in TRAINING:
            directory = tmp_path_factory.mktemp(f"lost-{backend}-{launcher}")
            cluster = clusters.enter_context(NetnsCluster(NODES, str(directory / "cluster")))
            job = _cut_node_off_mid_run(cluster, backend, launcher, node=2)
            watcher = threading.Thread(target=job.wait, args=(TIMEOUT_S + SLACK_S + 60,), kwargs={"nodes": [1]})
            watcher.start()
            waiting[backend, launcher] = cluster, job, watcher
        ended = {}
        for key, (cluster, job, watcher) in waiting.items():
            watcher.join()
            ended[key] = job, _left_running(cluster, 1)
        yield ended


@pytest.mark.slow
@pytest.mark.parametrize("backend, launcher", TRAINING, ids=[f"{b}-{l}" for b, l in TRAINING])
def test_a_lost_node_ends_the_job_within_the_timeout(lost_node_jobs, backend, launcher):
    """Every distributed backend, and every multi-node launcher (the pairs of TRAINING). mpirun ends
    the job when its daemon on the lost node stops answering (tests/multinode/jobs.py:
    OPENMPI_KEEPALIVE; with OpenMPI's defaults, 300 s idle + 9 probes x 20 s, it still waited after
    3 minutes, for ddp too, whose survivors had exited with 4 after --timeout); under the other
    launchers the survivors' collectives give up after --timeout, they say so and exit."""
    job, left_on_node_1 = lost_node_jobs[backend, launcher]
    tail = job.tail()
    assert job.statuses is not None, f"{backend} via {launcher}: the job hung after node 2 was lost\n{tail}"
    took = job.seconds_since("node lost")
    print(
        f"\n{backend} via {launcher}: node 1's launcher exited {took:.1f} s after node 2 was lost "
        f"(status {job.statuses})"
    )
    assert all(status != 0 for status in job.statuses), tail
    assert took <= TIMEOUT_S + SLACK_S, tail
    if launcher != "mpirun":  # mpirun ends the ranks itself, often before --timeout is up
        assert LOST in job.output, tail
        # The survivors on node 1 name node 2's ranks from their heartbeats (harness.process.heartbeat).
        for rank in range(RANKS_PER_NODE, RANKS):
            assert f"rank {rank} (host node2, step " in job.output, tail
    assert left_on_node_1 == [], f"{backend} via {launcher}: processes left running on node 1\n{tail}"
