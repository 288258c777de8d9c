"""A real Slurm across the nodes of a namespace cluster: munged and slurmctld on node 1, one slurmd
per node inside that node's namespaces (its NodeName is its hostname, its NodeAddr its address).

Each daemon runs in a node's namespaces, so the cluster's teardown, which kills every process in
its namespaces, ends them even after a killed test; `stop()` first ends them by their pid files.
munged's socket is a path, reachable from every node (one filesystem, as with a shared one).
Clients (sbatch, srun, sinfo) run on node 1 (`run`), where they reach slurmctld.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Sequence
from typing import Optional

from tests.helpers.slurm_cluster import (
    COMMON_SETTINGS,
    START_TIMEOUT_S,
    check_installed,
    end_daemon,
    write_conf_and_key,
)

from .netns_cluster import NetnsCluster

CTLD_PORT = 6817  # node 1's own network namespace: nothing else listens there
SLURMD_PORT = 6818  # the same on every node: each has an address of its own


class NamespaceSlurm:
    """Slurm with every file under `directory` and every daemon on `cluster`'s nodes."""

    def __init__(self, cluster: NetnsCluster, directory: str) -> None:
        self.cluster = cluster
        self.directory = os.path.abspath(directory)
        self.conf = os.path.join(self.directory, "slurm.conf")
        self.munge_socket = os.path.join(self.directory, "munge", "munge.socket")

    def _pid_file(self, daemon: str, node: Optional[str] = None) -> str:
        return os.path.join(self.directory, f"{daemon}{'.' + node if node else ''}.pid")

    def _write_conf(self) -> None:
        per_node = [os.path.join(top, host) for top in ("spool", "tmp") for host in self.cluster.hostnames]
        for sub in ("munge", "state", "log", *per_node):
            os.makedirs(os.path.join(self.directory, sub), exist_ok=True)
        path, hosts = self.directory, self.cluster.hostnames
        nodes = [
            f"NodeName={host} NodeAddr={address} CPUs={os.cpu_count() or 1} State=UNKNOWN"
            for host, address in zip(hosts, self.cluster.addresses)
        ]
        lines = [
            "ClusterName=harnessnetns",
            f"SlurmctldHost={hosts[0]}({self.cluster.addresses[0]})",
            "AuthType=auth/munge",
            f"AuthInfo=socket={self.munge_socket}",
            "CredType=cred/munge",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"SlurmctldPort={CTLD_PORT}",
            f"SlurmdPort={SLURMD_PORT}",
            f"StateSaveLocation={path}/state",
            # %n: the node's name, so the slurmds, sharing one filesystem, keep their files apart
            f"SlurmdSpoolDir={path}/spool/%n",
            f"SlurmdPidFile={path}/slurmd.%n.pid",
            f"SlurmdLogFile={path}/log/slurmd.%n.log",
            # Each node's own /tmp, as on a cluster: mpi/pmix makes its step directories there, by job
            # and step, so in one shared /tmp the nodes' steps would collide.
            f"TmpFS={path}/tmp/%n",
            f"SlurmctldPidFile={self._pid_file('slurmctld')}",
            f"SlurmctldLogFile={path}/log/slurmctld.log",
            *COMMON_SETTINGS,
            *nodes,
            f"PartitionName=debug Nodes={','.join(hosts)} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4",
        ]
        write_conf_and_key(self.conf, os.path.join(self.directory, "munge"), lines)

    def environ(self, extra: Optional[dict[str, str]] = None) -> dict[str, str]:
        """The environment for Slurm's clients and daemons: SLURM_CONF set (plus `extra`)."""
        return {**os.environ, "SLURM_CONF": self.conf, **(extra or {})}

    def run(
        self, argv: Sequence[str], timeout: float = 60, env: Optional[dict[str, str]] = None, cwd: Optional[str] = None
    ) -> subprocess.CompletedProcess:
        """Run a client command (srun, sbatch, sinfo, ...) on node 1."""
        return self.cluster.run(1, argv, timeout=timeout, env=self.environ(env), cwd=cwd)

    def _start_daemon(self, node: int, argv: list[str], pid_file: str) -> None:
        result = self.cluster.run(node, argv, timeout=30, env=self.environ())
        if result.returncode != 0:
            raise RuntimeError(
                f"{argv[0]} on {self.cluster.hostnames[node - 1]} did not start "
                f"(exit {result.returncode}): {(result.stderr or result.stdout).strip()[-2000:]}"
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while _pid(pid_file) is None:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{argv[0]} wrote no pid file within {START_TIMEOUT_S:.0f} s\n{self.log_tail()}")
            time.sleep(0.1)

    def start(self) -> NamespaceSlurm:
        """Start munged, slurmctld and the slurmds; wait until every node takes jobs; undo on failure."""
        check_installed()
        self._write_conf()
        munge = os.path.join(self.directory, "munge")
        try:
            self._start_daemon(
                1,
                [
                    "munged",
                    "--force",
                    f"--key-file={munge}/munge.key",
                    f"--socket={self.munge_socket}",
                    f"--pid-file={self._pid_file('munged')}",
                    f"--log-file={munge}/munged.log",
                    f"--seed-file={munge}/munged.seed",
                ],
                self._pid_file("munged"),
            )
            self._start_daemon(1, ["slurmctld", "-f", self.conf], self._pid_file("slurmctld"))
            for node, host in enumerate(self.cluster.hostnames, start=1):
                self._start_daemon(node, ["slurmd", "-f", self.conf], self._pid_file("slurmd", host))
            self._wait_until_idle()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_until_idle(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        states: list[str] = []
        while time.monotonic() < deadline:
            result = self.run(["sinfo", "-h", "-N", "-o", "%N %T"], timeout=20)
            states = result.stdout.split("\n")
            idle = {line.split()[0] for line in states if line.strip().endswith(("idle", "mixed", "allocated"))}
            if result.returncode == 0 and idle == set(self.cluster.hostnames):
                return
            time.sleep(0.5)
        raise RuntimeError(f"the Slurm nodes are not idle after {START_TIMEOUT_S:.0f} s ({states}); {self.log_tail()}")

    def log_tail(self, lines: int = 20) -> str:
        """The end of every daemon's log, for failure messages."""
        tails = []
        for name in sorted(os.listdir(os.path.join(self.directory, "log"))):
            with open(os.path.join(self.directory, "log", name), errors="replace") as handle:
                tails.append(f"--- {name}\n" + "".join(handle.readlines()[-lines:]))
        return "\n".join(tails)

    def stop(self) -> None:
        """End the daemons by their pid files (slurmds, slurmctld, munged), each waited for; what is
        left in the nodes' namespaces the cluster's teardown kills."""
        pid_files = [self._pid_file("slurmd", host) for host in self.cluster.hostnames]
        for pid_file in [*pid_files, self._pid_file("slurmctld"), self._pid_file("munged")]:
            end_daemon(_pid(pid_file))


def _pid(pid_file: str) -> Optional[int]:
    try:
        with open(pid_file) as handle:
            text = handle.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None
