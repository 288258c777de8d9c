"""A real one-node Slurm cluster for the job-template tests: munged, slurmctld and slurmd from Debian's
packages, started on this machine with a private configuration in a temporary directory.

`SlurmCluster(directory).start()` writes a fresh munge key and a slurm.conf (this host as the only
node, every core, one partition, free ports), starts the three daemons and waits until the node is
idle; `environ()` is the environment for `sbatch`/`squeue`/`scancel` (SLURM_CONF set); `stop()` ends
each daemon by the pid in its pid file and waits for it, so nothing keeps running after a test,
failed or not. Needs root (slurmd starts jobs as any user) and the packages `make setup` installs.

A test process killed before `stop()` (CI's time limit, a ^C) would leave the daemons and their jobs
running, outside its process tree. So `start()` first records the cluster (owner_records, under
RECORDS_DIR) and ends every process of each recorded cluster whose owner is gone: the daemons, the
job steps and the jobs' tasks all carry the cluster's SLURM_CONF in their environment.

`SlurmCluster(directory, nodes=2)` stands several nodes on this host, one slurmd each (`slurmd -N`,
a port, spool, pid and log file of its own; Debian's Slurm allows it): the first node is named after
this host, the others `<host>-2`, ... with this host's address, so a job's first node, where rank 0
meets the others, resolves. Every node has every core; they share them.

`SlurmCluster(directory, mpi="cray_shasta")` runs every srun task under an MPI plugin by default
(MpiDefault), as a site does: `cray_shasta` is Slurm's own plugin for HPE Cray systems (Frontier,
Perlmutter), which Debian ships, so its PALS_RANKID, PALS_NODEID, PALS_APID, PALS_APINFO and
PALS_SPOOL_DIR are the real ones. What it cannot have here is Cray PMI (libpmi of Cray MPICH), which
puts PMI_RANK and PMI_SIZE beside them on a Cray: a TaskProlog emulates that part and nothing else
(`CRAY_PMI_TASK_PROLOG`). `mpi="pmi2"` is Slurm's PMI-2 plugin, which sets PMI_RANK, PMI_SIZE and
PMI_FD itself; `mpi="pmix"` its PMIx plugin (PMIX_RANK).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Sequence
from typing import Optional, Protocol

from harness.process.launchers import free_port
from harness.process.processes import end_processes, processes_with_environment, running
from tests.helpers.owner_records import stale_records, write_record

DAEMONS = ("munged", "slurmctld", "slurmd")
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
# Beside the namespace clusters' records (tests/multinode/netns_cluster.py), on the same tmpfs.
RECORDS_DIR = "/run/dp-harness-slurm"


# What every test Slurm sets alike, one node or several: no accounting, no cgroups, quick timeouts
# (MpiDefault, the plugin srun tasks run under, is the cluster's `mpi`).
COMMON_SETTINGS = [
    "ProctrackType=proctrack/pgid",
    "TaskPlugin=task/none",
    "SelectType=select/cons_tres",
    "SelectTypeParameters=CR_CPU",
    "ReturnToService=2",
    "SchedulerType=sched/backfill",
    "JobAcctGatherType=jobacct_gather/none",
    "AccountingStorageType=accounting_storage/none",
    "SlurmctldTimeout=30",
    "SlurmdTimeout=30",
    "InactiveLimit=0",
    "MinJobAge=600",
    "KillWait=10",
]


# The MPI plugins a test Slurm may run its tasks under (srun --mpi=list names Debian's).
MPI_PLUGINS = ("none", "pmi2", "pmix", "cray_shasta")
# Cray PMI's part of a Cray's srun task environment, which no Debian package provides: on top of the
# real cray_shasta plugin's PALS_* variables, PMI_RANK and PMI_SIZE as Cray PMI exposes them (the
# task's global rank and the step's task count). A TaskProlog's `export NAME=VALUE` lines reach the
# task's environment (slurm.conf(5), TaskProlog).
CRAY_PMI_TASK_PROLOG = """#!/bin/sh
echo "export PMI_RANK=$SLURM_PROCID"
echo "export PMI_SIZE=$SLURM_STEP_NUM_TASKS"
"""


def write_conf_and_key(conf: str, munge_directory: str, lines: list[str]) -> None:
    """slurm.conf from `lines`, and a fresh munge key only root may read, as munged requires."""
    with open(conf, "w") as handle:
        handle.write("\n".join(lines) + "\n")
    key = os.path.join(munge_directory, "munge.key")
    with open(key, "wb") as handle:
        handle.write(os.urandom(1024))
    os.chmod(key, 0o400)


class SlurmUnavailable(RuntimeError):
    """Slurm or munge is not installed here, or cannot run as this user."""


def check_installed() -> None:
    """Raise SlurmUnavailable (one line naming `make setup`) unless Slurm's daemons and clients are here."""
    missing = [tool for tool in (*DAEMONS, "sbatch", "squeue", "scancel", "sinfo") if not shutil.which(tool)]
    if missing:
        raise SlurmUnavailable(
            f"{', '.join(missing)} not installed; run `make setup` as root (it installs slurmctld, "
            "slurmd, slurm-client and munge) for the job-template tests"
        )
    if os.geteuid() != 0:
        raise SlurmUnavailable("the job-template tests start slurmd, which must run as root; run them as root")


class SlurmClient(Protocol):
    """What the job-template helpers need of a Slurm: this one, or one across namespace nodes
    (tests/multinode/slurm_nodes.py), whose clients must run where they reach its slurmctld."""

    def environ(self, extra: Optional[dict[str, str]] = None) -> dict[str, str]: ...

    def run(
        self, argv: Sequence[str], timeout: float = 60, env: Optional[dict[str, str]] = None, cwd: Optional[str] = None
    ) -> subprocess.CompletedProcess: ...


class SlurmCluster:
    """munged + slurmctld + slurmd with every file under `directory`."""

    def __init__(self, directory: str, nodes: int = 1, mpi: str = "none") -> None:
        if mpi not in MPI_PLUGINS:
            raise ValueError(f"mpi={mpi!r}: the test Slurm runs one of {', '.join(MPI_PLUGINS)}")
        self.mpi = mpi
        self.directory = os.path.abspath(directory)
        self.host = socket.gethostname()
        self.conf = os.path.join(self.directory, "slurm.conf")
        self.record_path = os.path.join(RECORDS_DIR, f"{uuid.uuid4().hex[:8]}.json")
        self.munge_socket = os.path.join(self.directory, "munge", "munge.socket")
        # The node names: this host, then <host>-2, ... (nodes > 1), each with a slurmd of its own.
        self.nodes = [self.host, *(f"{self.host}-{index}" for index in range(2, nodes + 1))]
        self._pid_files = {name: os.path.join(self.directory, f"{name}.pid") for name in DAEMONS}
        if nodes > 1:  # SlurmdPidFile's %n: the node's name
            del self._pid_files["slurmd"]
            self._pid_files.update(
                {f"slurmd.{node}": os.path.join(self.directory, f"slurmd.{node}.pid") for node in self.nodes}
            )

    def environ(self, extra: Optional[dict[str, str]] = None) -> dict[str, str]:
        """This process's environment with SLURM_CONF pointing at the private cluster (plus `extra`)."""
        env = dict(os.environ)
        env["SLURM_CONF"] = self.conf
        env.update(extra or {})
        return env

    def run(
        self, argv: Sequence[str], timeout: float = 60, env: Optional[dict[str, str]] = None, cwd: Optional[str] = None
    ) -> subprocess.CompletedProcess:
        """Run a client command (sbatch, scontrol, scancel, ...) against this cluster, capturing text."""
        return subprocess.run(
            list(argv), env=self.environ(env), cwd=cwd, capture_output=True, text=True, timeout=timeout
        )

    def _write_conf(self) -> None:
        several = len(self.nodes) > 1
        spools = [os.path.join("spool", node) for node in self.nodes] if several else ["spool"]
        tmps = [os.path.join("tmp", node) for node in self.nodes] if several else []
        for sub in ("munge", "state", "log", *spools, *tmps):
            os.makedirs(os.path.join(self.directory, sub), exist_ok=True)
        ports: list[int] = []
        while len(ports) < 1 + len(self.nodes):
            port = free_port()
            if port not in ports:
                ports.append(port)
        ctld_port, slurmd_port = ports[0], ports[1]
        path = self.directory
        # One node: its slurmd at SlurmdPort. Several on this host: each at a port of its own, and
        # its spool, pid and log file by its name (%n), and a /tmp of its own, as on a cluster: mpi/pmix
        # makes its step directories there by job and step, so in one shared /tmp the nodes' collide.
        per_node = "/%n" if several else ""
        suffix = ".%n" if several else ""
        node_lines = [
            f"NodeName={node}{f' NodeHostname={self.host} Port={port}' if several else ''} "
            f"CPUs={os.cpu_count() or 1} Features=gpu State=UNKNOWN"  # perlmutter.sbatch asks -C gpu
            for node, port in zip(self.nodes, ports[1:])
        ]
        lines = [
            f"ClusterName=harness{ctld_port}",
            f"SlurmctldHost={self.host}",
            "AuthType=auth/munge",
            f"AuthInfo=socket={self.munge_socket}",
            "CredType=cred/munge",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"SlurmctldPort={ctld_port}",
            f"SlurmdPort={slurmd_port}",
            f"StateSaveLocation={path}/state",
            f"SlurmdSpoolDir={path}/spool{per_node}",
            f"SlurmctldPidFile={self._pid_files['slurmctld']}",
            f"SlurmdPidFile={path}/slurmd{suffix}.pid",
            f"SlurmctldLogFile={path}/log/slurmctld.log",
            f"SlurmdLogFile={path}/log/slurmd{suffix}.log",
            *([f"TmpFS={path}/tmp/%n"] if several else []),
            *COMMON_SETTINGS,
            *self._mpi_settings(),
            *node_lines,
            f"PartitionName=debug Nodes={','.join(self.nodes)} Default=YES MaxTime=INFINITE State=UP "
            "OverSubscribe=FORCE:4",
        ]
        write_conf_and_key(self.conf, os.path.join(self.directory, "munge"), lines)

    def _mpi_settings(self) -> list[str]:
        """MpiDefault, and under cray_shasta the TaskProlog that adds Cray PMI's variables."""
        if self.mpi != "cray_shasta":
            return [f"MpiDefault={self.mpi}"]
        prolog = os.path.join(self.directory, "cray_pmi_task_prolog.sh")
        with open(prolog, "w") as handle:
            handle.write(CRAY_PMI_TASK_PROLOG)
        os.chmod(prolog, 0o755)
        return ["MpiDefault=cray_shasta", f"TaskProlog={prolog}"]

    def _daemon_commands(self) -> dict[str, list[str]]:
        munge = os.path.join(self.directory, "munge")
        return {
            "munged": [
                "munged",
                "--force",
                f"--key-file={munge}/munge.key",
                f"--socket={self.munge_socket}",
                f"--pid-file={self._pid_files['munged']}",
                f"--log-file={munge}/munged.log",
                f"--seed-file={munge}/munged.seed",
            ],
            "slurmctld": ["slurmctld", "-f", self.conf],
            **(
                {"slurmd": ["slurmd", "-f", self.conf]}
                if len(self.nodes) == 1
                else {f"slurmd.{node}": ["slurmd", "-f", self.conf, "-N", node] for node in self.nodes}
            ),
        }

    def start(self) -> SlurmCluster:
        """Start the daemons and wait until the node takes jobs; on any failure stop what started."""
        check_installed()
        remove_stale_clusters()
        self._write_conf()
        write_record(self.record_path, {"conf": self.conf})
        try:
            for name, command in self._daemon_commands().items():
                result = subprocess.run(command, capture_output=True, text=True, timeout=30, env=self.environ())
                if result.returncode != 0:
                    raise RuntimeError(
                        f"{name} did not start (exit {result.returncode}): "
                        f"{(result.stderr or result.stdout).strip()[-2000:]}"
                    )
                self._wait_for_pid_file(name)
            self._wait_until_idle()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_for_pid_file(self, name: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while self._pid(name) is None:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name} wrote no pid file within {START_TIMEOUT_S:.0f} s; see {self.log_tail()}")
            time.sleep(0.1)

    def _wait_until_idle(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        state = ""
        while time.monotonic() < deadline:
            result = subprocess.run(
                ["sinfo", "-h", "-N", "-o", "%T"], capture_output=True, text=True, timeout=20, env=self.environ()
            )
            state = result.stdout.strip()
            # One line per partition the node is in.
            if result.returncode == 0 and state and set(state.split()) <= {"idle", "mixed", "allocated"}:
                return
            time.sleep(0.5)
        raise RuntimeError(
            f"the Slurm node is not idle after {START_TIMEOUT_S:.0f} s (state {state!r}); {self.log_tail()}"
        )

    def log_tail(self, lines: int = 30) -> str:
        """The end of slurmctld's and slurmd's logs, for failure messages."""
        tails = []
        for name in ("slurmctld", *(name for name in self._pid_files if name.startswith("slurmd"))):
            path = os.path.join(self.directory, "log", f"{name}.log")
            if os.path.exists(path):
                with open(path, errors="replace") as handle:
                    tails.append(f"--- {path}\n" + "".join(handle.readlines()[-lines:]))
        return "\n".join(tails)

    def _pid(self, name: str) -> Optional[int]:
        try:
            with open(self._pid_files[name]) as handle:
                text = handle.read().strip()
        except OSError:
            return None
        return int(text) if text.isdigit() else None

    def cancel_all_jobs(self) -> None:
        """Cancel every job of this cluster and wait (bounded) until Slurm has ended their processes."""
        if self._pid("slurmctld") is None:
            return
        env = self.environ()
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                listed = subprocess.run(
                    ["squeue", "-h", "-o", "%i"], capture_output=True, text=True, timeout=20, env=env
                )
            except subprocess.TimeoutExpired:
                return
            jobs = listed.stdout.split()
            if listed.returncode != 0 or not jobs:
                return
            subprocess.run(["scancel", "--full", *jobs], capture_output=True, timeout=20, env=env)
            time.sleep(0.5)

    def stop(self) -> None:
        """Cancel the jobs, then end every daemon this cluster started (the slurmds first, munged last)
        and wait until each is gone."""
        self.cancel_all_jobs()
        for name in reversed(list(self._pid_files)):  # munged, slurmctld, then the slurmd(s)
            end_daemon(self._pid(name))
        if os.path.exists(self.record_path):
            os.unlink(self.record_path)


def cluster_processes(conf: str) -> list[int]:
    """Every process whose environment names `conf` as its SLURM_CONF: a cluster's daemons, job steps
    and tasks (each inherits it: the daemons from `start()`, the jobs from the `sbatch` that submitted them)."""
    return processes_with_environment("SLURM_CONF", conf)


def remove_stale_clusters() -> list[str]:
    """End every process of each recorded cluster whose owner is gone; return their slurm.conf paths."""
    removed = []
    for path, record in stale_records(RECORDS_DIR):
        end_processes(lambda conf=record["conf"]: cluster_processes(conf), grace=0, timeout=STOP_TIMEOUT_S)
        os.unlink(path)
        removed.append(record["conf"])
    return removed


def end_daemon(pid: Optional[int]) -> None:
    """SIGTERM the daemon `pid`, SIGKILL if it has not stopped within STOP_TIMEOUT_S; until it is gone."""
    if pid is not None:
        end_processes(lambda: [pid] if running(pid) else [], grace=STOP_TIMEOUT_S)
