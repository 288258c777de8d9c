"""Where rank, local rank, world size and the rendezvous address come from.

Every launcher exports the same four quantities under different names. Each quantity has one
ordered list of variables; the first one set wins (the approach of accelerate and Lightning's
cluster environments). The lists cover torchrun and the deepspeed launcher, horovodrun (gloo
mode), OpenMPI's mpirun, MPICH Hydra and Cray PALS mpiexec (Polaris, Aurora) and Slurm's srun.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import time
import urllib.request
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Callable, Optional

from ..errors import UsageError, require
from .launchers import MPI_FAMILIES

# (variable, launcher that sets it), in priority order per quantity. The launcher named here is the
# family a rank reports as ClusterEnv.launcher; harness.process.launchers says which launcher
# programs start ranks of each family.
RANK_VARIABLES: tuple[tuple[str, str], ...] = (
    ("RANK", "torchrun"),
    ("HOROVOD_RANK", "horovodrun"),
    ("OMPI_COMM_WORLD_RANK", "openmpi"),
    ("PMI_RANK", "mpich"),
    ("PALS_RANKID", "pals"),
    ("SLURM_PROCID", "slurm"),
)
WORLD_SIZE_VARIABLES: tuple[str, ...] = (
    "WORLD_SIZE",
    "HOROVOD_SIZE",
    "OMPI_COMM_WORLD_SIZE",
    "PMI_SIZE",
    "SLURM_STEP_NUM_TASKS",
    "SLURM_NTASKS",
)
LOCAL_RANK_VARIABLES: tuple[str, ...] = (
    "LOCAL_RANK",
    "HOROVOD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "PMI_LOCAL_RANK",
    "PALS_LOCAL_RANKID",
    "MPI_LOCALRANKID",
    "SLURM_LOCALID",
)
LOCAL_WORLD_SIZE_VARIABLES: tuple[str, ...] = (
    "LOCAL_WORLD_SIZE",
    "LOCAL_SIZE",
    "HOROVOD_LOCAL_SIZE",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "PMI_LOCAL_SIZE",
    "PALS_LOCAL_SIZE",
    "MPI_LOCALNRANKS",
    "SLURM_STEP_TASKS_PER_NODE",
    "SLURM_NTASKS_PER_NODE",
    "SLURM_TASKS_PER_NODE",
)
# Slurm's SLURM_* task variables are also set in a job's batch shell (SLURM_PROCID=0, SLURM_NTASKS=N)
# and inherited by whatever it starts without srun (a Jupyter kernel on a compute node, a sweep's
# driver). Only a task of an srun step is one of N ranks; srun sets these for its tasks alone.
SLURM_STEP_VARIABLES: tuple[str, ...] = ("SLURM_STEP_ID", "SLURM_STEP_NUM_TASKS")
# Per-node task counts, as Slurm writes them: "4(x2),3" is 4 on each of two nodes, then 3 on one.
_SLURM_TASK_GROUP = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")
DEFAULT_MASTER_PORT = 29500
# The DNS domain of the network ranks should meet on, appended to rank 0's short hostname (set by
# `harness study` from the site profile; unset: hostnames as they are).
RENDEZVOUS_DOMAIN_VARIABLE = "HARNESS_RENDEZVOUS_DOMAIN"
# horovodrun's rendezvous store: the scope the harness keeps its own keys in, and how long ranks wait
# there for rank 0 (which may start later on a busy node).
HOROVODRUN_SCOPE = "harness"
HOROVODRUN_REQUEST_TIMEOUT_S = 10.0
HOROVODRUN_EXCHANGE_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class ClusterEnv:
    """The process's place in the job, as its launcher described it."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str
    master_port: int
    launcher: str  # which launcher's variables were found ("none" for a plain process)

    @property
    def is_main(self) -> bool:
        """True on global rank 0, the rank that prints, writes results and saves models."""
        return self.rank == 0


def _first(environ: Mapping[str, str], names: Sequence[str]) -> Optional[tuple[str, str]]:
    for name in names:
        value = environ.get(name)
        if value not in (None, ""):
            return name, value
    return None


def _as_int(name: str, value: str) -> int:
    match = re.match(r"^\s*(-?\d+)\s*$", value)
    if not match:
        raise UsageError(f"environment variable {name}={value!r} is not an integer; unset it or fix the launcher")
    return int(match.group(1))


def _slurm_tasks_on_node(name: str, value: str, node_id: int) -> int:
    """This node's entry of a Slurm per-node task count such as '4(x2),3' (node ids count from 0)."""
    counts: list[int] = []
    for group in value.split(","):
        match = _SLURM_TASK_GROUP.match(group.strip())
        if not match:
            raise UsageError(
                f"environment variable {name}={value!r} is not a Slurm task count such as '4(x2),3'; "
                "unset it or fix the launcher"
            )
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts[min(node_id, len(counts) - 1)]


def _is_slurm_step_task(environ: Mapping[str, str]) -> bool:
    return all(environ.get(name) not in (None, "") for name in SLURM_STEP_VARIABLES)


def _slurm_first_host(nodelist: str) -> str:
    """First hostname of a Slurm node list such as 'nid[001-004,010],login1'."""
    try:
        out = subprocess.run(
            ["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, timeout=20, check=True
        ).stdout.split()
        if out:
            return out[0]
    except (OSError, subprocess.SubprocessError):
        pass
    match = re.match(r"^([^,\[]+)(?:\[([^\]]+)\])?", nodelist)
    if not match:
        return nodelist
    prefix, ranges = match.group(1), match.group(2)
    return prefix + ranges.split(",")[0].split("-")[0] if ranges else prefix


def _mpi_rank0_hostname() -> str:
    """Rank 0's hostname, broadcast over MPI (a collective: every rank must call it)."""
    MPI = require(
        "mpi4py.MPI",
        "finding rank 0's host without MASTER_ADDR",
        "export MASTER_ADDR=<rank 0 hostname> or pip install mpi4py",
    )
    return MPI.COMM_WORLD.bcast(socket.gethostname(), root=0)


def _horovodrun_rank0_hostname(environ: Mapping[str, str], rank: int) -> str:
    """Rank 0's hostname through horovodrun's rendezvous server, an HTTP key-value store that every
    rank of a horovodrun job reaches (HOROVOD_GLOO_RENDEZVOUS_ADDR/PORT): rank 0 puts it, the others
    wait for it. horovodrun exports no variable naming rank 0's host (its driver may run elsewhere)."""
    url = (
        f"http://{environ['HOROVOD_GLOO_RENDEZVOUS_ADDR']}:{environ.get('HOROVOD_GLOO_RENDEZVOUS_PORT', '')}"
        f"/{HOROVODRUN_SCOPE}/rank0_hostname"
    )
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # the job's own network: no proxy
    if rank == 0:
        hostname = socket.gethostname()
        request = urllib.request.Request(url, data=hostname.encode(), method="PUT")
        try:
            opener.open(request, timeout=HOROVODRUN_REQUEST_TIMEOUT_S).close()
        except OSError as exc:
            raise UsageError(
                f"cannot reach horovodrun's rendezvous server at {url} ({exc}); export MASTER_ADDR=<rank 0 hostname>"
            ) from None
        return hostname
    deadline = time.monotonic() + HOROVODRUN_EXCHANGE_TIMEOUT_S
    while True:
        try:
            with opener.open(url, timeout=HOROVODRUN_REQUEST_TIMEOUT_S) as response:
                return response.read().decode()
        except OSError as exc:  # 404 until rank 0 has put it; HTTPError and URLError are OSErrors
            if time.monotonic() > deadline:
                raise UsageError(
                    f"rank 0 did not publish its hostname at {url} within "
                    f"{HOROVODRUN_EXCHANGE_TIMEOUT_S:.0f} s ({exc}); "
                    "export MASTER_ADDR=<rank 0 hostname>"
                ) from None
            time.sleep(0.2)


def _on_rendezvous_network(host: str, environ: Mapping[str, str]) -> str:
    """`host` on the network named by RENDEZVOUS_DOMAIN_VARIABLE (Polaris: hsn.cm.polaris.alcf.anl.gov,
    the Slingshot name of a node), else as it is: a bare hostname may resolve to a slower network."""
    domain = environ.get(RENDEZVOUS_DOMAIN_VARIABLE, "").strip(".")
    return f"{host.split('.')[0]}.{domain}" if domain else host


def _master_addr(
    environ: Mapping[str, str],
    launcher: str,
    world_size: int,
    local_world_size: int,
    mpi_hostname: Callable[[], str],
    rank: int = 0,
) -> str:
    if environ.get("MASTER_ADDR"):
        return environ["MASTER_ADDR"]
    if world_size == local_world_size:  # every rank is on this node
        return "127.0.0.1"
    if launcher in MPI_FAMILIES:
        return _on_rendezvous_network(mpi_hostname(), environ)
    if launcher == "horovodrun" and environ.get("HOROVOD_GLOO_RENDEZVOUS_ADDR"):
        return _horovodrun_rank0_hostname(environ, rank)
    # The step's nodes, not the job's: a run on 2 of the job's 4 nodes has rank 0 on its step's first.
    nodelist = environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_JOB_NODELIST")
    if nodelist:
        return _on_rendezvous_network(_slurm_first_host(nodelist), environ)
    if environ.get("PBS_NODEFILE") and os.path.exists(environ["PBS_NODEFILE"]):
        with open(environ["PBS_NODEFILE"]) as handle:
            return _on_rendezvous_network(handle.readline().strip(), environ)
    raise UsageError("cannot tell rank 0's host for a multi-node job; export MASTER_ADDR=<rank 0 hostname>")


def _master_port(environ: Mapping[str, str]) -> int:
    if environ.get("MASTER_PORT"):
        return _as_int("MASTER_PORT", environ["MASTER_PORT"])
    job_id = environ.get("SLURM_JOB_ID") or environ.get("PBS_JOBID")
    if job_id:  # two jobs sharing a node must not collide on one port
        return DEFAULT_MASTER_PORT + zlib.crc32(job_id.encode()) % 2000
    return DEFAULT_MASTER_PORT


def detect_cluster(
    environ: Optional[Mapping[str, str]] = None, mpi_hostname: Callable[[], str] = _mpi_rank0_hostname
) -> ClusterEnv:
    """Read rank, sizes and rendezvous address from whichever launcher started this process.

    A process started without a launcher is rank 0 of 1. Inconsistent values (a rank outside the
    world) raise UsageError naming the variables involved.
    """
    environ = os.environ if environ is None else environ
    found_rank = None
    for name, launcher in RANK_VARIABLES:
        if launcher == "slurm" and not _is_slurm_step_task(environ):
            continue  # a batch shell or a process it started without srun: not a rank
        if environ.get(name) not in (None, ""):
            found_rank = (name, launcher)
            break
    if found_rank is None:
        return ClusterEnv(0, 1, 0, 1, environ.get("MASTER_ADDR") or "127.0.0.1", _master_port(environ), "none")
    rank_name, launcher = found_rank
    rank = _as_int(rank_name, environ[rank_name])
    size_var = _first(environ, WORLD_SIZE_VARIABLES)
    if size_var is None:
        raise UsageError(
            f"{rank_name} is set but no world size variable is ({', '.join(WORLD_SIZE_VARIABLES)}); "
            "start the job with torchrun, mpirun, srun, horovodrun or deepspeed"
        )
    world_size = _as_int(*size_var)
    local_var = _first(environ, LOCAL_RANK_VARIABLES)
    local_rank = _as_int(*local_var) if local_var else (rank if world_size == 1 else 0)
    local_size_var = _first(environ, LOCAL_WORLD_SIZE_VARIABLES)
    if local_size_var is None:
        local_world_size = 1 if local_var is None else world_size
    elif local_size_var[0].startswith("SLURM_"):
        node_id = _as_int("SLURM_NODEID", environ["SLURM_NODEID"]) if environ.get("SLURM_NODEID") else 0
        local_world_size = _slurm_tasks_on_node(*local_size_var, node_id)
    else:
        local_world_size = _as_int(*local_size_var)
    if not 0 <= rank < world_size:
        raise UsageError(
            f"{rank_name}={rank} is outside the world of size {world_size} ({size_var[0]}); "
            "check the launcher's variables"
        )
    if not (0 <= local_rank < local_world_size <= world_size):
        raise UsageError(
            f"local rank {local_rank} of {local_world_size} per node does not fit a world of "
            f"{world_size} (from {local_var and local_var[0]}, {local_size_var and local_size_var[0]}); "
            "check the launcher's variables"
        )
    master_addr = _master_addr(environ, launcher, world_size, local_world_size, mpi_hostname, rank)
    return ClusterEnv(rank, world_size, local_rank, local_world_size, master_addr, _master_port(environ), launcher)


# The launcher's index of the node a rank runs on, where it gives one: which node a rank is on even
# where several stand on one machine (an emulated cluster) and their hostnames agree.
NODE_ID_VARIABLES = ("PALS_NODEID", "SLURM_NODEID")


def node_id(environ: Optional[Mapping[str, str]] = None) -> Optional[int]:
    """The launcher's index of this rank's node (Cray PALS, Slurm); None where it gives none."""
    found = _first(os.environ if environ is None else environ, NODE_ID_VARIABLES)
    return _as_int(*found) if found else None


def cpu_cores() -> int:
    """Cores this process may run on (respects cgroup/affinity limits, unlike os.cpu_count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def default_threads(cluster: ClusterEnv) -> int:
    """Threads per rank on CPU: the node's cores shared evenly among its local ranks.

    Right for one run, wrong for comparing runs: one rank would get every core and two ranks one
    each, so a scaling study's baseline would do other work per rank. `harness sweep` therefore
    gives all its runs one --threads (harness.study.sweep.threads_per_rank)."""
    return max(1, cpu_cores() // max(1, cluster.local_world_size))
