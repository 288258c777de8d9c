"""Where rank, local rank, world size and the rendezvous address come from.

Every launcher exports the same four quantities under its own names: one table (`FAMILIES`) lists,
per launcher family, the variables of each quantity in order; the first one set wins, and all four
come from the one family whose rank variable is set (the approach of accelerate and Lightning's
cluster environments). The families cover torchrun and the deepspeed launcher, horovodrun (gloo
mode), OpenMPI's mpirun, MPICH Hydra, Cray PALS mpiexec (Polaris; Aurora with PMIx) and Slurm's srun.

Inside a Slurm step (SLURM_STEP_ID, SLURM_STEP_NUM_TASKS: srun sets them for its tasks alone) the
step's tasks are the ranks: rank, sizes and rank 0's host (the step's first node) come from Slurm,
whatever PMI_*, PMIX_* or PALS_* say. Slurm's MPI plugins set those in every task: `cray_shasta`
(Frontier, Perlmutter) PALS_RANKID and PALS_NODEID, with Cray PMI's PMI_RANK and PMI_SIZE beside
them; `pmi2` PMI_RANK and PMI_SIZE; `pmix` PMIX_RANK. Two kinds of process do not follow Slurm
there: the ranks of torchrun or horovodrun started by an srun task (their own variables win), and
the ranks of an MPI launcher that used the step only to start its daemons (OpenMPI's mpirun and
MPICH's Hydra under Slurm start one daemon task per node with srun): their MPI world is not the
step's, told by a world size other than SLURM_STEP_NUM_TASKS.

Where only MPI can tell rank 0's host (an MPI family across nodes without MASTER_ADDR), mpi4py's
MPI is imported before torch (`import_mpi_first`, run by `python -m harness` before anything
imports torch): Cray MPICH aborts a rank that initialises MPI after torch is loaded (ALCF's Polaris
Python page; OLCF's PyTorch on Frontier guide, "MPICH mpi4py Errors").
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Callable, Optional

from ..errors import UsageError, require
from .launchers import MPI_FAMILIES


@dataclass(frozen=True)
class LauncherVariables:
    """One launcher family's names for the four quantities, each in priority order."""

    family: str  # as ClusterEnv.launcher reports it; harness.process.launchers says who sets it
    rank: tuple[str, ...]
    world_size: tuple[str, ...]
    local_rank: tuple[str, ...]
    local_world_size: tuple[str, ...]


SLURM = LauncherVariables(
    "slurm",
    ("SLURM_PROCID",),
    ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"),
    ("SLURM_LOCALID",),
    # per-node task counts ("4(x2),3"): this node's entry is read (SLURM_NODEID)
    ("SLURM_STEP_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE"),
)
# In priority order: a launcher started inside another's process (torchrun in an srun task) sets
# its own variables over the outer one's, which its ranks inherit.
FAMILIES: tuple[LauncherVariables, ...] = (
    LauncherVariables("torchrun", ("RANK",), ("WORLD_SIZE",), ("LOCAL_RANK",), ("LOCAL_WORLD_SIZE", "LOCAL_SIZE")),
    LauncherVariables(
        "horovodrun", ("HOROVOD_RANK",), ("HOROVOD_SIZE",), ("HOROVOD_LOCAL_RANK",), ("HOROVOD_LOCAL_SIZE",)
    ),
    LauncherVariables(
        "openmpi",
        ("OMPI_COMM_WORLD_RANK",),
        ("OMPI_COMM_WORLD_SIZE",),
        ("OMPI_COMM_WORLD_LOCAL_RANK",),
        ("OMPI_COMM_WORLD_LOCAL_SIZE",),
    ),
    # MPICH's PMI (Hydra; Cray PALS mpiexec with PMI, Polaris: PMI_LOCAL_* and PALS_LOCAL_* beside)
    LauncherVariables(
        "mpich",
        ("PMI_RANK",),
        ("PMI_SIZE",),
        ("PMI_LOCAL_RANK", "MPI_LOCALRANKID", "PALS_LOCAL_RANKID"),
        ("PMI_LOCAL_SIZE", "MPI_LOCALNRANKS", "PALS_LOCAL_SIZE"),
    ),
    # Cray PALS mpiexec without PMI's variables: with PMIx (Aurora, where ALCF's scripts read
    # PMIX_RANK and PALS_LOCAL_RANKID: docs/aurora/running-jobs-aurora.md, debugging/gdb-oneapi.md)
    LauncherVariables(
        "pals",
        ("PALS_RANKID", "PMIX_RANK"),
        ("PMI_SIZE", "PMIX_SIZE"),
        ("PALS_LOCAL_RANKID", "PMIX_LOCAL_RANK", "PMI_LOCAL_RANK"),
        ("PALS_LOCAL_SIZE", "PMIX_LOCAL_SIZE", "PMI_LOCAL_SIZE"),
    ),
    SLURM,
)
# (variable, family) for every rank variable, in priority order
RANK_VARIABLES: tuple[tuple[str, str], ...] = tuple((name, f.family) for f in FAMILIES for name in f.rank)
# Every launcher's local rank and local size variables (the workshop's checker rewrites them)
LOCAL_RANK_VARIABLES: tuple[str, ...] = tuple(dict.fromkeys(name for f in FAMILIES for name in f.local_rank))
LOCAL_WORLD_SIZE_VARIABLES: tuple[str, ...] = tuple(
    dict.fromkeys(name for f in FAMILIES for name in f.local_world_size)
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


def _mpi() -> object:
    """mpi4py's MPI module (importing it initialises MPI), or UsageError naming the fix."""
    return require(
        "mpi4py.MPI",
        "finding rank 0's host without MASTER_ADDR",
        "export MASTER_ADDR=<rank 0 hostname> or pip install mpi4py",
    )


def _mpi_rank0_hostname() -> str:
    """Rank 0's hostname, broadcast over MPI (a collective: every rank must call it)."""
    return _mpi().COMM_WORLD.bcast(socket.gethostname(), root=0)  # type: ignore[attr-defined]


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


def _launcher_family(environ: Mapping[str, str]) -> Optional[LauncherVariables]:
    """The family whose variables describe this process's rank; None for a plain process."""
    found = next((family for family in FAMILIES[:-1] if _first(environ, family.rank)), None)
    if not _is_slurm_step_task(environ):
        return found  # a batch shell's SLURM_PROCID=0 is no rank
    if found is None or found.family not in MPI_FAMILIES:
        # torchrun or horovodrun ranks started by an srun task follow their own launcher
        return found or (SLURM if _first(environ, SLURM.rank) else None)
    # An MPI family's variables in a Slurm step: set by Slurm's MPI plugin for the step's tasks, so
    # the step's tasks are the ranks, unless that MPI launcher started a world of another size
    # through the step (mpirun's or Hydra's daemons, one srun task per node).
    mpi_size = _first(environ, found.world_size)
    step_size = _first(environ, SLURM.world_size)
    if mpi_size is None or step_size is None or _as_int(*mpi_size) == _as_int(*step_size):
        return SLURM
    return found


def _needs_mpi_for_rendezvous(environ: Mapping[str, str]) -> bool:
    """Whether discovery will ask MPI for rank 0's host: an MPI family's rank across nodes, without
    MASTER_ADDR. Malformed variables answer False: detect_cluster says what is wrong with them."""
    try:
        family = _launcher_family(environ)
        if family is None or family.family not in MPI_FAMILIES or environ.get("MASTER_ADDR"):
            return False
        size, local_size = _first(environ, family.world_size), _first(environ, family.local_world_size)
        return size is not None and (local_size is None or _as_int(*local_size) < _as_int(*size))
    except UsageError:
        return False


def import_mpi_first(environ: Optional[Mapping[str, str]] = None) -> bool:
    """Import mpi4py's MPI now, before anything imports torch, where discovery will need it to find
    rank 0's host (Cray MPICH aborts an MPI initialised after torch is loaded: "GTL library is not
    linked" on Polaris, "Unable to use a NIC_POLICY of 'NUMA'" on Frontier). Whether it did; raises
    UsageError (discovery's own line) where it is needed and not installed."""
    if "mpi4py.MPI" in sys.modules or not _needs_mpi_for_rendezvous(os.environ if environ is None else environ):
        return False
    _mpi()
    return True


def _local_world_size(
    environ: Mapping[str, str], family: LauncherVariables, world_size: int, local_rank_set: bool
) -> int:
    """Ranks on this node: the family's count (Slurm's per-node list read at this node's entry);
    without one, 1 where no local rank is set either, else every rank (one node)."""
    found = _first(environ, family.local_world_size)
    if found is None:
        return 1 if not local_rank_set else world_size
    if family is SLURM:
        node = _as_int("SLURM_NODEID", environ["SLURM_NODEID"]) if environ.get("SLURM_NODEID") else 0
        return _slurm_tasks_on_node(*found, node)
    return _as_int(*found)


def detect_cluster(
    environ: Optional[Mapping[str, str]] = None, mpi_hostname: Callable[[], str] = _mpi_rank0_hostname
) -> ClusterEnv:
    """Read rank, sizes and rendezvous address from whichever launcher started this process.

    A process started without a launcher is rank 0 of 1. Inconsistent values (a rank outside the
    world) raise UsageError naming the variables involved.
    """
    environ = os.environ if environ is None else environ
    family = _launcher_family(environ)
    if family is None:
        return ClusterEnv(0, 1, 0, 1, environ.get("MASTER_ADDR") or "127.0.0.1", _master_port(environ), "none")
    rank_name, rank_text = _first(environ, family.rank) or ("", "")
    rank = _as_int(rank_name, rank_text)
    size_var = _first(environ, family.world_size)
    if size_var is None:
        raise UsageError(
            f"{rank_name} is set but no world size variable is ({', '.join(family.world_size)}); "
            "start the job with torchrun, mpirun, srun, horovodrun or deepspeed"
        )
    world_size = _as_int(*size_var)
    local_var = _first(environ, family.local_rank)
    local_rank = _as_int(*local_var) if local_var else (rank if world_size == 1 else 0)
    local_world_size = _local_world_size(environ, family, world_size, local_var is not None)
    if not 0 <= rank < world_size:
        raise UsageError(
            f"{rank_name}={rank} is outside the world of size {world_size} ({size_var[0]}); "
            "check the launcher's variables"
        )
    if not (0 <= local_rank < local_world_size <= world_size):
        local_size_var = _first(environ, family.local_world_size)
        raise UsageError(
            f"local rank {local_rank} of {local_world_size} per node does not fit a world of "
            f"{world_size} (from {local_var and local_var[0]}, {local_size_var and local_size_var[0]}); "
            "check the launcher's variables"
        )
    launcher = family.family
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
    gives all its runs one --threads (harness.study.scaling.sweep.threads_per_rank)."""
    return max(1, cpu_cores() // max(1, cluster.local_world_size))
