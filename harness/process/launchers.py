"""The launchers: one table of the programs that start a job's ranks, and the environment they get.

Each row (`Launcher`) is what the harness knows of one launcher: the program it runs; for a local
launcher, the command that starts N processes of a Python program on this machine (`harness
launch`, the sweep, `harness check` and the tests build theirs with `launcher_command`); for a site
launcher, its words for a run across an allocation of its batch system (the sweep's templates, the
engines' batch scripts); whether its ranks are MPI processes; and the families of variables its
ranks find themselves in (`ClusterEnv.launcher`, as harness.process.discovery names them).
What runs in the processes is the caller's business (harness.training.launch starts `harness
train` ranks through these).
"""

from __future__ import annotations

import os
import random
import shutil
import socket
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Callable, Optional

from ..errors import UsageError, unknown_choice

# (the launcher's program, N processes, the Python program and its arguments, rendezvous port) -> command
LocalCommand = Callable[[str, int, Sequence[str], int], list[str]]


@dataclass(frozen=True)
class Launcher:
    """One launcher: what it runs, how it starts ranks here or across an allocation, what they see."""

    name: str  # as --launcher and the job scripts name it
    executable: Optional[str]  # its program, beside this Python or on PATH (None: this Python itself)
    families: tuple[str, ...]  # the ClusterEnv.launcher values of the ranks it starts
    mpi: bool = False  # its ranks are MPI processes, so MPI itself can tell them rank 0's host
    local: Optional[LocalCommand] = None  # the command for N processes on this machine (local launchers)
    max_processes: Optional[int] = None  # the most processes it starts (None: any number)
    scheduler: Optional[str] = None  # the batch system in whose allocations it starts the ranks (site launchers)
    site: Optional[str] = None  # its words for one run across the allocation: {ranks} total, {ppn} per node, {nodes}

    def command(self, num_processes: int, program: Sequence[str], port: Optional[int] = None) -> list[str]:
        """This launcher starting `num_processes` copies of `python PROGRAM` (a script and its
        arguments, or -m MODULE ...) on this machine, with rendezvous `port` where it takes one."""
        if self.local is None:
            raise UsageError(
                f"{self.name} starts ranks across a {self.scheduler} allocation only; "
                f"on one machine use one of {', '.join(LOCAL_LAUNCHERS)}"
            )
        executable = sys.executable if self.executable is None else _tool(self.executable)
        return self.local(executable, num_processes, program, port or free_port())


def _python(python: str, num_processes: int, program: Sequence[str], port: int) -> list[str]:
    return [python, *program]


def _torchrun(python: str, num_processes: int, program: Sequence[str], port: int) -> list[str]:
    return [
        python,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "1",
        "--nproc-per-node",
        str(num_processes),
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(port),
        *program,
    ]


def _mpirun(mpirun: str, num_processes: int, program: Sequence[str], port: int) -> list[str]:
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    return [
        mpirun,
        *root,
        "-np",
        str(num_processes),
        "--oversubscribe",
        "--bind-to",
        "none",
        "-x",
        f"MASTER_PORT={port}",
        sys.executable,
        *program,
    ]


def _horovodrun(horovodrun: str, num_processes: int, program: Sequence[str], port: int) -> list[str]:
    return [
        horovodrun,
        "--gloo",
        "-np",
        str(num_processes),
        "-H",
        f"localhost:{num_processes}",
        "--gloo-timeout-seconds",
        "120",
        sys.executable,
        *program,
    ]


def _deepspeed(deepspeed: str, num_processes: int, program: Sequence[str], port: int) -> list[str]:
    # Rank comes from the environment like every launcher; no --local_rank argument.
    module = ["--module", *program[1:]] if program[0] == "-m" else list(program)
    return [deepspeed, "--num_gpus", str(num_processes), "--master_port", str(port), "--no_local_rank", *module]


LAUNCHERS: dict[str, Launcher] = {
    launcher.name: launcher
    for launcher in (
        Launcher("python", None, ("none",), local=_python, max_processes=1),
        Launcher("torchrun", None, ("torchrun",), local=_torchrun),
        # The local command passes OpenMPI's flags (-x, --oversubscribe): make setup installs OpenMPI.
        Launcher("mpirun", "mpirun", ("openmpi",), mpi=True, local=_mpirun),
        Launcher("horovodrun", "horovodrun", ("horovodrun",), local=_horovodrun),  # in gloo mode: its own variables
        Launcher("deepspeed", "deepspeed", ("torchrun",), local=_deepspeed),  # it exports torchrun's variables
        # Under PBS, mpiexec is whichever MPI the site has: Cray PALS (Polaris: PMI_*; Aurora, with
        # PMIx: PALS_* and PMIX_*, the "pals" family), MPICH's Hydra, OpenMPI.
        Launcher(
            "mpiexec",
            "mpiexec",
            ("openmpi", "mpich", "pals"),
            mpi=True,
            scheduler="pbs",
            site="mpiexec -n {ranks} --ppn {ppn}",
        ),
        # srun's tasks are "slurm" ranks whatever its MPI plugin adds (cray_shasta: PALS_* with Cray
        # PMI's PMI_*; pmi2: PMI_*; pmix: PMIX_RANK): harness.process.discovery reads Slurm's first.
        Launcher(
            "srun",
            "srun",
            ("slurm",),
            scheduler="slurm",
            site="srun --nodes {nodes} --ntasks {ranks} --ntasks-per-node {ppn}",
        ),
    )
}
LOCAL_LAUNCHERS: tuple[str, ...] = tuple(name for name, launcher in LAUNCHERS.items() if launcher.local)
# Discovery families whose ranks are MPI processes (MPI_Init works, mpi4py reaches every rank).
MPI_FAMILIES: frozenset[str] = frozenset(
    family for launcher in LAUNCHERS.values() if launcher.mpi for family in launcher.families
)

# OpenMPI refuses to start as root without these; containers often lack shared-memory single copy.
OPENMPI_ENV = {
    "OMPI_ALLOW_RUN_AS_ROOT": "1",
    "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    "OMPI_MCA_btl_vader_single_copy_mechanism": "none",
}


def families(*names: str) -> frozenset[str]:
    """The discovery families of the ranks that the launchers `names` start."""
    return frozenset(family for name in names for family in LAUNCHERS[name].families)


def site_launcher(scheduler: str) -> Launcher:
    """The launcher that starts ranks across an allocation of `scheduler` ("pbs" or "slurm")."""
    for launcher in LAUNCHERS.values():
        if launcher.scheduler == scheduler:
            return launcher
    raise unknown_choice(
        "batch system", scheduler, [launcher.scheduler for launcher in LAUNCHERS.values() if launcher.scheduler]
    )


def local_launcher(name: str) -> Launcher:
    """The launcher `name` if it starts processes on this machine; UsageError naming those that do."""
    launcher = LAUNCHERS.get(name)
    if launcher is None or launcher.local is None:
        raise unknown_choice("launcher", name, LOCAL_LAUNCHERS)
    return launcher


# Rendezvous ports come from below the kernel's ephemeral range (as torchrun's 29500 does): a port in
# that range can be taken at any moment as the local end of an outgoing connection (gloo's, the
# engines' ZeroMQ sockets), and a process that makes several groups meets on the ports above its
# first (harness.backends.compat.rendezvous_port), which nothing reserves.
RENDEZVOUS_PORTS_FROM = 20000
_EPHEMERAL_RANGE = "/proc/sys/net/ipv4/ip_local_port_range"
_DEFAULT_EPHEMERAL_START = 32768  # Linux's default, where the range cannot be read
# The system's randomness: jobs started side by side from processes seeded alike pick apart, and no
# run's random state is touched.
_PORT_PICKER = random.SystemRandom()


def free_port(span: int = 1) -> int:
    """A TCP port nobody listens on right now, with the `span - 1` ports above it free as well, for
    one job's rendezvous (span: the process groups the job's processes may make, one port each).
    Picked at random below the ephemeral range; the kernel's choice where nothing there is free."""
    try:
        with open(_EPHEMERAL_RANGE) as handle:
            ephemeral_start = int(handle.read().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral_start = _DEFAULT_EPHEMERAL_START
    candidates = range(RENDEZVOUS_PORTS_FROM, ephemeral_start - span)
    for _ in range(50 if candidates else 0):
        first = _PORT_PICKER.choice(candidates)
        if all(_bindable(port) for port in range(first, first + span)):
            return first
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("0.0.0.0", port))  # where a TCP store listens
        except OSError:
            return False
        return True


def _tool(name: str) -> str:
    # Prefer the tool installed beside this interpreter (the project's venv), then PATH.
    beside = os.path.join(os.path.dirname(sys.executable), name)
    found = beside if os.access(beside, os.X_OK) else shutil.which(name)
    if not found:
        raise UsageError(f"launcher {name!r} is not installed; run `make setup` or choose another with --launcher")
    return found


def launcher_command(
    launcher: str, num_processes: int, program: Sequence[str], port: Optional[int] = None
) -> list[str]:
    """`launcher` starting `num_processes` copies of `python PROGRAM` (a script and its arguments, or
    -m MODULE ...) on this machine; rank and size reach them through the launcher's variables."""
    return local_launcher(launcher).command(num_processes, program, port)


def launch_environment(extra: Optional[dict[str, str]] = None) -> dict[str, str]:
    """The environment launched ranks get: OpenMPI's root switches plus unbuffered output."""
    env = dict(os.environ)
    for key, value in OPENMPI_ENV.items():
        env.setdefault(key, value)
    env.setdefault("PYTHONUNBUFFERED", "1")
    # harness.training.placement sets each rank's threads itself (cores / local ranks); this only
    # keeps torchrun from printing its OMP_NUM_THREADS banner.
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(extra or {})
    return env
