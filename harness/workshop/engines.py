"""ipyparallel MPI engines: N real ranks that a notebook drives, started with settings that work and
stopped for certain.

`start_engines()` runs `mpiexec -n N <args> python -m ipyparallel.engine --mpi` through
ipyparallel (`ipp.Cluster(engines="mpi", n=N)`), so MPI is initialised in every engine before any
cell runs and engine i is MPI rank i. `harness.train` called on the engines
(`engines.run(harness.train, config)`) finds its rank in OpenMPI's variables, as under mpirun.

What it takes care of, each a way engines failed to start, to run or to stop:
- OpenMPI refuses to start as root without OMPI_ALLOW_RUN_AS_ROOT(_CONFIRM); the engines get them
  (and the shared-memory setting containers need) in their environment, not the notebook's.
- mpiexec binds each engine to one core unless told otherwise (ipyparallel #906), and refuses more
  ranks than cores: `--bind-to none --oversubscribe` (each MPI's own spelling, `mpi_arguments`).
- Each engine set gets a MASTER_PORT nobody listens on, so two notebooks on one node (a login node
  shared by a workshop) do not meet in each other's process groups.
- ipyparallel waits 60 s for engines by default; a cold start (torch imports on a busy node) takes
  longer, so `timeout` (ENGINE_TIMEOUT_S) bounds it instead, and `run` bounds every call.
- Progress widgets are off (IPP_NONINTERACTIVE=1): they show as noise in a stored notebook.
- A notebook runner (nbval) kills the kernel without running `atexit`, so the cluster does not stop
  itself: call `engines.stop()` in the last cell. It stops controller and engines, then kills
  whatever process of this cluster is still alive (found by the IPP_CLUSTER_ID that ipyparallel
  puts in their environment, harness.process.processes), so a failed notebook leaves nothing
  behind; tests call `kill_processes_with_environment` with a marker of their own as a second net.

Placement: on a node with several GPUs one engine per GPU (NCCL); with one GPU two engines share
it (`procs_per_gpu` = 2, gloo, since NCCL refuses two ranks on one GPU); without a GPU two CPU
engines (gloo). `Engines.train_options` holds the TrainConfig fields that placement needs.

On a cluster, engines can run on compute nodes while the notebook runs on a login node:
`start_engines(launcher="slurm" | "pbs", directives=[...])` submits them as one MPI batch job
(BATCH_TEMPLATES) and makes the controller listen on all interfaces.
"""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import socket
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from ..errors import UsageError, require, unknown_choice
from ..process.launchers import OPENMPI_ENV, free_port, site_launcher
from ..process.processes import kill_processes_with_environment

ENGINE_TIMEOUT_S = 180  # engines registering, cold imports on a busy node included
ENGINE_RENDEZVOUS_PORTS = 128  # the groups the engines may make, a port each (compat.rendezvous_port)
RUN_TIMEOUT_S = 900  # one call on the engines (a training run); harness collectives time out sooner
CLUSTER_VARIABLE = "IPP_CLUSTER_ID"  # ipyparallel sets it in the environment of every process it starts
# How the engines start: ipyparallel's engine-set launcher names, not the process launchers of
# harness.process.launchers. "mpi" runs mpiexec on this node; "slurm" and "pbs" submit a batch job
# whose script starts them with that batch system's site launcher (BATCH_TEMPLATES).
ENGINE_STARTERS = ("mpi", "slurm", "pbs")
# What each MPI's mpiexec needs so that N engines share the node's cores: no binding of a rank to
# one core (its torch threads would all run there), and more ranks than cores allowed. Keyed by the
# MPI families of harness.process.launchers.MPI_FAMILIES (what mpi_flavour tells), and "unknown".
MPI_ARGUMENTS: dict[str, list[str]] = {
    "openmpi": ["--bind-to", "none", "--oversubscribe"],
    "mpich": ["-bind-to", "none"],
    "pals": ["--cpu-bind", "none"],
    "unknown": [],
}
# Batch scripts that start the engines as one MPI job on compute nodes, through the batch system's
# site launcher. {n}, {cluster_id} and {program_and_args} are ipyparallel's; {directives} and
# {launch} are filled in by batch_script.
BATCH_TEMPLATES: dict[str, str] = {
    "slurm": "#!/bin/sh\n#SBATCH --job-name=ipengine-{cluster_id}\n#SBATCH --ntasks={n}\n#SBATCH --export=ALL\n"
    "{directives}\n" + f"{site_launcher('slurm').executable} {{launch}} {{program_and_args}} --mpi\n",
    "pbs": '#!/bin/sh\n#PBS -N ipengine\n#PBS -V\n{directives}\ncd "$PBS_O_WORKDIR"\n'
    + f"{site_launcher('pbs').executable} -n {{n}} {{launch}} {{program_and_args}} --mpi\n",
}
BATCH_PREFIX = {"slurm": "#SBATCH", "pbs": "#PBS"}
log = logging.getLogger("harness")


class EnginesError(RuntimeError):
    """The engines did not start, or did not answer in time; the message says what to do."""


def mpi_flavour(mpiexec: str) -> str:
    """Which MPI `mpiexec` belongs to: openmpi, mpich (Hydra), pals (Cray) or unknown."""
    try:
        text = subprocess.run([mpiexec, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    if "Open MPI" in text or "OpenRTE" in text:
        return "openmpi"
    if "HYDRA" in text or "MPICH" in text:
        return "mpich"
    if "PALS" in text or "Cray" in text:
        return "pals"
    return "unknown"


def default_placement(gpus: int, engines: Optional[int] = None) -> tuple[int, int]:
    """(engines, ranks per GPU) for a node with `gpus` GPUs: one engine per GPU when there are
    several, two sharing the one GPU, two on the CPU without one. `engines` overrides the count;
    the ranks per GPU then follow from it."""
    count = engines if engines is not None else (gpus if gpus >= 2 else 2)
    if count < 1:
        raise UsageError(f"start_engines needs at least one engine, got n={count}")
    return count, (-(-count // gpus) if gpus else 1)


def engine_environment(master_port: int) -> dict[str, str]:
    """What the engines get in their environment besides the notebook's."""
    return {**OPENMPI_ENV, "MASTER_PORT": str(master_port), "PYTHONUNBUFFERED": "1"}


def batch_script(launcher: str, directives: Sequence[str] = (), launch_args: Sequence[str] = ()) -> str:
    """The batch template that starts the engines under `launcher` ("slurm" or "pbs").

    Each of `directives` becomes one line after the scheduler's prefix: ["--account=proj",
    "--time=00:30:00", "--gpus-per-node=4"] under Slurm, ["-A proj", "-q debug", "-l
    select=2:system=polaris", "-l walltime=0:30:00", "-l filesystems=home:eagle"] under PBS.
    `launch_args` go to srun / mpiexec (e.g. ["--ppn", "4"] on Polaris). ipyparallel fills in
    {n}, {cluster_id} and {program_and_args} when it submits the script."""
    if launcher not in BATCH_TEMPLATES:
        raise unknown_choice("batch launcher", launcher, BATCH_TEMPLATES)
    lines = "\n".join(f"{BATCH_PREFIX[launcher]} {directive}" for directive in directives)
    return BATCH_TEMPLATES[launcher].replace("{directives}", lines).replace("{launch}", shlex.join(launch_args))


@dataclass
class Engines:
    """A running set of engines: its cluster, a client, a blocking view on every engine, and where
    the ranks run. Use `run` to call a function on every rank, `stop` when done."""

    cluster: Any  # ipyparallel.Cluster
    client: Any  # ipyparallel.Client
    view: Any  # DirectView on all engines, blocking; also behind the %px magics
    ranks: int
    procs_per_gpu: int
    device: str  # "cuda" or "cpu"
    master_port: int
    command: list[str]  # what started the engines
    _stopped: bool = field(default=False, repr=False)

    @property
    def train_options(self) -> dict[str, Any]:
        """TrainConfig fields this placement needs (ranks sharing a GPU say so)."""
        return {"procs_per_gpu": self.procs_per_gpu} if self.procs_per_gpu > 1 else {}

    def describe(self) -> str:
        """One line: how many ranks, where, started by which command."""
        where = (
            f"{self.procs_per_gpu} per GPU"
            if self.device == "cuda" and self.procs_per_gpu > 1
            else "one per GPU"
            if self.device == "cuda"
            else "on the CPU"
        )
        return f"{self.ranks} MPI engines ({where}), MASTER_PORT {self.master_port}: {shlex.join(self.command)}"

    def run(
        self, function: Callable[..., Any], *args: Any, timeout: float = RUN_TIMEOUT_S, **kwargs: Any
    ) -> list[Any]:
        """`function(*args, **kwargs)` on every engine at once; the results in rank order.

        Waits at most `timeout` seconds: an engine that hangs (a collective waiting for a dead peer)
        raises EnginesError instead of blocking the notebook. An exception on any engine is raised
        here (ipyparallel's CompositeError names the engine)."""
        result = self.view.apply_async(function, *args, **kwargs)
        try:
            return result.get(timeout=timeout)
        except TimeoutError:
            raise EnginesError(
                f"the engines did not finish {getattr(function, '__name__', function)} within "
                f"{timeout:.0f} s; one of them hangs: call engines.stop() and start new "
                "engines"
            ) from None

    def stop(self) -> list[int]:
        """Stop controller and engines, then kill what is left of this cluster; the pids killed.

        Safe to call twice, and after a failure."""
        if self._stopped:
            return []
        self._stopped = True
        try:
            self.client.close()
        finally:
            try:
                self.cluster.stop_cluster_sync()
            except Exception as exc:  # a cluster already half gone: the kill below finishes the job
                log.warning("stopping the ipyparallel cluster: %s", exc)
            finally:
                killed = kill_processes_with_environment(CLUSTER_VARIABLE, self.cluster.cluster_id)
        return killed

    def __enter__(self) -> Engines:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def _gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def start_engines(
    n: Optional[int] = None,
    launcher: str = "mpi",
    timeout: float = ENGINE_TIMEOUT_S,
    mpiexec: Optional[str] = None,
    directives: Sequence[str] = (),
    launch_args: Sequence[str] = (),
    activate: bool = True,
) -> Engines:
    """Start `n` MPI engines (default: see default_placement) and connect to them.

    launcher "mpi" runs mpiexec on this node; "slurm" and "pbs" submit the engines as a batch job
    (batch_script(launcher, directives, launch_args)) and let the controller listen on all
    interfaces so that compute nodes reach it. `activate` registers the %px magics in IPython.
    Raises EnginesError, after stopping whatever started, when the engines do not register within
    `timeout` seconds.
    """
    if launcher not in ENGINE_STARTERS:
        raise unknown_choice("engine launcher", launcher, ENGINE_STARTERS)
    # Read once, when ipyparallel is first imported: set it before, and for good (not patched).
    os.environ.setdefault("IPP_NONINTERACTIVE", "1")
    ipp = require("ipyparallel", "MPI engines", "pip install ipyparallel (make setup installs it)")
    from traitlets.config import Config

    gpus = _gpu_count()
    count, procs_per_gpu = default_placement(gpus, n)
    port = free_port(span=ENGINE_RENDEZVOUS_PORTS)
    config = Config()
    config.Cluster.engine_timeout = int(timeout)
    _configure_launcher(config, launcher, port, mpiexec, directives, launch_args)
    cluster = ipp.Cluster(engines=launcher, n=count, config=config, log_level=logging.ERROR)
    try:
        client = cluster.start_and_connect_sync(n=count)
    except BaseException as exc:
        output = _engine_output(cluster)
        _stop_quietly(cluster)
        raise EnginesError(
            f"{count} engines did not start within {timeout:.0f} s ({type(exc).__name__}: {exc}); "
            f"the engines' output ends with:\n{output}"
        ) from exc
    view = client[:]
    view.block = True
    # What a cell defines travels by value: a task whose model class and data are defined in the
    # notebook, and a function using names the cell imported (ipyparallel's own pickling sends a
    # function without the globals it reads, and a class defined in a cell by reference to a
    # notebook the engines do not have).
    view.use_cloudpickle()
    if activate:
        _activate_magics(view)
    engine_set = cluster.engine_set
    command = list(getattr(engine_set, "args", []) or [])
    return Engines(cluster, client, view, count, procs_per_gpu, "cuda" if gpus else "cpu", port, command)


def _configure_launcher(
    config: Any,
    launcher: str,
    port: int,
    mpiexec: Optional[str],
    directives: Sequence[str],
    launch_args: Sequence[str],
) -> None:
    """How the engines start: mpiexec on this node, or a Slurm/PBS batch job whose engines reach a
    controller listening on every interface of this host."""
    if launcher == "mpi":
        mpiexec = mpiexec or shutil.which("mpiexec") or shutil.which("mpirun")
        if mpiexec is None:
            raise UsageError(
                "mpiexec is not installed; install OpenMPI or MPICH (`make setup` does) or load your site's MPI module"
            )
        config.MPILauncher.mpi_cmd = [mpiexec]
        config.MPILauncher.mpi_args = MPI_ARGUMENTS[mpi_flavour(mpiexec)]
        config.MPILauncher.environment = engine_environment(port)
        return
    name = "SlurmEngineSetLauncher" if launcher == "slurm" else "PBSEngineSetLauncher"
    config[name].batch_template = batch_script(launcher, directives, launch_args)
    config[name].environment = engine_environment(port)
    config.Cluster.controller_ip = "*"
    config.Cluster.controller_location = socket.gethostname()


def _activate_magics(view: Any) -> None:
    """Register %px / %%px for `view` in IPython (as view.activate() does), without progress bars:
    they fill a stored notebook with noise, and a cell's output still shows when it ends."""
    try:
        from IPython import get_ipython
    except ImportError:
        return
    shell = get_ipython()
    if shell is None:
        return
    from ipyparallel.client.magics import ParallelMagics

    magics = ParallelMagics(shell, view, "")
    magics.progress_after_seconds = -1
    shell.magics_manager.register(magics)


def _engine_output(cluster: Any, lines: int = 20) -> str:
    engine_set = cluster.engine_set
    if engine_set is None:
        return "(no engine output)"
    try:
        text = engine_set.get_output()
    except Exception:  # noqa: BLE001  (a failed start may leave no output file)
        return "(no engine output)"
    return "\n".join(text.splitlines()[-lines:]) or "(no engine output)"


def _stop_quietly(cluster: Any) -> None:
    try:
        cluster.stop_cluster_sync()
    except Exception as exc:  # noqa: BLE001  (stopping after a failed start: the kill below is the net)
        log.warning("stopping the ipyparallel cluster: %s", exc)
    kill_processes_with_environment(CLUSTER_VARIABLE, cluster.cluster_id)
