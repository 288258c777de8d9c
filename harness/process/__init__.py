"""Process layer: where ranks come from and how processes start, are placed and stop.

- `discovery`: rank, sizes, node and rendezvous address from whichever launcher started this
  process (torchrun, deepspeed, horovodrun, OpenMPI, MPICH/PALS, Slurm), as one frozen `ClusterEnv`;
  CPU threads.
- `accelerator`: the node's accelerator (cuda, rocm, xpu or cpu) through torch.accelerator: how many
  devices, the device and communicator of a rank, the variable that hides devices from a process.
- `launchers`: the one table of launchers (python, torchrun, mpirun, horovodrun, deepspeed here;
  mpiexec and srun across an allocation): the command each starts ranks with, which are MPI, and
  which discovery family their ranks report.
- `memory_cap`: a rank's --memory-cap, set in its own process (the kernel's data-segment limit on the
  CPU, the allocator's on a GPU), checked against the prediction before the run, put back after it.
- `state`: what a run sets in its process (CPU threads, memory reuse) and how the process gets
  everything back afterwards.
- `allocator`: how a CPU process keeps freed memory for the next step.
- `imports`: the modules a site needs imported before torch (HARNESS_IMPORT_FIRST: mpi4py on
  Polaris, for Cray MPICH's GTL), imported first by `python -m harness`.
- `preemption`: SIGTERM/SIGUSR1 turned into a checkpoint that every rank agrees on, and a dead peer
  turned into a clear error.
- `processes`: other processes of the machine found (by environment, command line, session), read
  (parent, name, start time, whether they run) and ended: the one way, psutil underneath.

Nothing here knows a training framework: the layers above ask this one.
"""

from ..lazy import lazy_exports

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "ClusterEnv": "discovery",
        "detect_cluster": "discovery",
        "select_device": "accelerator",
        "Accelerator": "accelerator",
        "detect_accelerator": "accelerator",
        "default_threads": "discovery",
        "cpu_cores": "discovery",
        "Launcher": "launchers",
        "LAUNCHERS": "launchers",
        "LOCAL_LAUNCHERS": "launchers",
        "MPI_FAMILIES": "launchers",
        "launcher_command": "launchers",
        "launch_environment": "launchers",
        "free_port": "launchers",
        "preserved_process_state": "state",
        "data_segment_bytes": "memory_cap",
    },
)
__all__ = __dir__()
