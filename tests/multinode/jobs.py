"""Jobs across the nodes of a namespace cluster: each launcher's multi-node command, and a runner
that starts them, watches their output and ends everything on the nodes when a job overstays.

How each launcher spans nodes, as on a real cluster:
- mpirun (OpenMPI): one mpirun on node 1, `-H node1:2,node2:2`; it starts its daemon on node 2
  through the cluster's ssh (`--mca plm_rsh_agent rsh_agent.sh`);
- horovodrun: one horovodrun on node 1, `-H node1:2,node2:2`, reaching node 2 through `ssh`
  (the cluster's, first on PATH);
- torchrun: one per node, `--nnodes 2 --node-rank k`, meeting at node 1's address;
- deepspeed: one launcher per node without ssh (`--no_ssh --node_rank k`), meeting at node 1's address.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import Optional

from harness.process.launchers import launch_environment

from .netns_cluster import RSH_AGENT, NetnsCluster

MULTINODE_LAUNCHERS = ("mpirun", "torchrun", "horovodrun", "deepspeed")
RANKS_PER_NODE = 2
RENDEZVOUS_PORT = 29600  # on node 1's own network namespace, which nothing else uses

# mpirun notices a silent node (crashed, or cut off) only when the TCP keepalive of its connection
# to that node's daemon fails: by default after 300 s idle + 9 probes x 20 s = 8 min, all the while
# waiting for the daemon to confirm the job's end. Sites set these in openmpi-mca-params.conf.
OPENMPI_KEEPALIVE = {"oob_tcp_keepalive_time": "5", "oob_tcp_keepalive_intvl": "2", "oob_tcp_keepalive_probes": "3"}
NodeCommand = tuple[int, list[str]]  # (node, argv)
_ENV_LINE = re.compile(r'\{"default_threads"[^{}]*\}')  # one rank's line; ranks' lines may interleave


def discovered(output: str) -> dict[int, dict]:
    """`harness env`'s JSON line of every rank, by rank (launchers may prefix lines with a rank tag)."""
    rows = [json.loads(match) for match in _ENV_LINE.findall(output)]
    return {row["rank"]: row for row in rows}


def _tool(name: str) -> str:
    beside = os.path.join(os.path.dirname(sys.executable), name)
    return beside if os.access(beside, os.X_OK) else name


def _mca(parameters: dict[str, str]) -> list[str]:
    return [word for name, value in parameters.items() for word in ("--mca", name, value)]


def _hosts(cluster: NetnsCluster) -> str:
    return ",".join(f"{host}:{RANKS_PER_NODE}" for host in cluster.hostnames)


def openmpi_site_settings(cluster: NetnsCluster, hostfile: str, slots: int = RANKS_PER_NODE) -> dict[str, str]:
    """What a site's openmpi-mca-params.conf would say, as OMPI_MCA_* variables (which mpirun reads,
    however deep under a batch system's mpiexec): every node with `slots` in a default hostfile
    (written to `hostfile`; mpirun fills a node's slots before the next), the cluster's ssh, and
    the keepalive that notices a lost node."""
    with open(hostfile, "w") as handle:
        handle.writelines(f"{host} slots={slots}\n" for host in cluster.hostnames)
    return {
        "OMPI_MCA_orte_default_hostfile": hostfile,
        "OMPI_MCA_plm_rsh_agent": RSH_AGENT,
        **{f"OMPI_MCA_{name}": value for name, value in OPENMPI_KEEPALIVE.items()},
    }


def multinode_commands(launcher: str, cluster: NetnsCluster, harness_args: Sequence[str]) -> list[NodeCommand]:
    """The commands that run `python -m harness HARNESS_ARGS` as RANKS_PER_NODE ranks on every node."""
    program = ["-m", "harness", *harness_args]
    nodes, ranks = len(cluster.hostnames), RANKS_PER_NODE * len(cluster.hostnames)
    master = cluster.hostnames[0]
    if launcher == "mpirun":
        root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
        # Ranks on node 2 get mpirun's environment only through -x (as on a real cluster).
        return [
            (
                1,
                [
                    "mpirun",
                    *root,
                    "--mca",
                    "plm_rsh_agent",
                    RSH_AGENT,
                    *_mca(OPENMPI_KEEPALIVE),
                    "-H",
                    _hosts(cluster),
                    "-np",
                    str(ranks),
                    # The simulated nodes share this machine's cores: ranks waiting in MPI must yield them.
                    "--bind-to",
                    "none",
                    "--mca",
                    "mpi_yield_when_idle",
                    "1",
                    "-x",
                    "PYTHONUNBUFFERED=1",
                    "-x",
                    "OMP_NUM_THREADS=1",
                    sys.executable,
                    *program,
                ],
            )
        ]
    if launcher == "horovodrun":
        return [
            (
                1,
                [
                    _tool("horovodrun"),
                    "--gloo",
                    "-np",
                    str(ranks),
                    "-H",
                    _hosts(cluster),
                    "--gloo-timeout-seconds",
                    "60",
                    sys.executable,
                    *program,
                ],
            )
        ]
    if launcher == "torchrun":
        return [
            (
                node,
                [
                    sys.executable,
                    "-m",
                    "torch.distributed.run",
                    "--nnodes",
                    str(nodes),
                    "--node-rank",
                    str(node - 1),
                    "--nproc-per-node",
                    str(RANKS_PER_NODE),
                    "--master-addr",
                    master,
                    "--master-port",
                    str(RENDEZVOUS_PORT),
                    *program,
                ],
            )
            for node in range(1, nodes + 1)
        ]
    if launcher == "deepspeed":
        hostfile = os.path.join(cluster.directory, "hostfile")
        with open(hostfile, "w") as handle:
            handle.writelines(f"{host} slots={RANKS_PER_NODE}\n" for host in cluster.hostnames)
        return [
            (
                node,
                [
                    _tool("deepspeed"),
                    "--hostfile",
                    hostfile,
                    "--no_ssh",
                    "--node_rank",
                    str(node - 1),
                    "--master_addr",
                    master,
                    "--master_port",
                    str(RENDEZVOUS_PORT),
                    "--no_local_rank",
                    "--module",
                    *program[1:],
                ],
            )
            for node in range(1, nodes + 1)
        ]
    raise ValueError(f"no multi-node command for launcher {launcher!r}; choose one of {MULTINODE_LAUNCHERS}")


class ClusterJob:
    """Launcher processes started on nodes; their output is read (and marker lines timed) as it comes."""

    def __init__(
        self,
        cluster: NetnsCluster,
        commands: list[NodeCommand],
        env: Optional[dict[str, str]] = None,
        markers: Sequence[str] = (),
        cwd: Optional[str] = None,
    ) -> None:
        self.cluster = cluster
        self.commands = commands
        self.markers = list(markers)
        self.started = time.monotonic()
        self.seen: dict[str, float] = {}  # marker -> seconds from the start to its first line
        self.lines: list[str] = []
        self.ended: Optional[float] = None
        self.statuses: Optional[list[int]] = None  # the watched launchers' exit statuses, once ended
        self._lock = threading.Lock()
        self.processes = [
            cluster.popen(
                node,
                argv,
                env=launch_environment(env),
                cwd=cwd,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                errors="replace",
            )
            for node, argv in commands
        ]
        self._readers = [
            threading.Thread(target=self._read, args=(node, process), daemon=True)
            for (node, _), process in zip(commands, self.processes)
        ]
        for reader in self._readers:
            reader.start()

    def _read(self, node: int, process: subprocess.Popen) -> None:
        for line in process.stdout:
            with self._lock:
                self.lines.append(f"[node{node}] {line}")
                for marker in self.markers:
                    if marker in line and marker not in self.seen:
                        self.seen[marker] = time.monotonic() - self.started

    def wait_for(self, marker: str, limit: float) -> bool:
        """Until a line containing `marker` came (True), every process ended or `limit` s passed (False)."""
        deadline = time.monotonic() + limit
        while marker not in self.seen:
            if time.monotonic() > deadline or all(process.poll() is not None for process in self.processes):
                return marker in self.seen
            time.sleep(0.1)
        return True

    def wait(self, limit: float, nodes: Optional[Sequence[int]] = None) -> Optional[list[int]]:
        """Exit statuses of the launchers (on `nodes`, default all) once they ended; None if one was
        still running `limit` s from now: then every process on every node is killed."""
        deadline = time.monotonic() + limit
        watched = [
            process for (node, _), process in zip(self.commands, self.processes) if nodes is None or node in nodes
        ]
        for process in watched:
            try:
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.kill()
                return None
        self.ended = time.monotonic() - self.started
        for reader, process in zip(self._readers, self.processes):
            if process in watched:
                reader.join(timeout=10)
        self.statuses = [process.returncode for process in watched]
        return self.statuses

    def mark(self, event: str) -> None:
        """Note the time of something the test did (e.g. "node lost"), as if a line said `event`."""
        with self._lock:
            self.seen.setdefault(event, time.monotonic() - self.started)

    def kill(self) -> None:
        """End every process on every node of the cluster, and the launchers."""
        for node in range(1, len(self.cluster.hostnames) + 1):
            self.cluster.kill_node(node)
        for process in self.processes:
            if process.poll() is None:
                process.kill()
            process.wait()

    def seconds_since(self, marker: str) -> Optional[float]:
        """Seconds from the first line with `marker` to the exit of the watched launchers."""
        return None if marker not in self.seen or self.ended is None else self.ended - self.seen[marker]

    @property
    def output(self) -> str:
        with self._lock:
            return "".join(self.lines)

    def tail(self, characters: int = 6000) -> str:
        """The end of the output, for failure messages."""
        return self.output[-characters:]


def run_job(
    cluster: NetnsCluster,
    launcher: str,
    harness_args: Sequence[str],
    limit: float,
    env: Optional[dict[str, str]] = None,
    cwd: Optional[str] = None,
) -> tuple[Optional[list[int]], ClusterJob]:
    """Run `harness HARNESS_ARGS` across the cluster under `launcher` to its end (or kill it at `limit`)."""
    job = ClusterJob(cluster, multinode_commands(launcher, cluster, harness_args), env=env, cwd=cwd)
    return job.wait(limit), job
