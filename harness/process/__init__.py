"""Process layer: where ranks come from and how processes start, are placed and stop.

- `discovery`: rank, sizes, node and rendezvous address from whichever launcher started this
  process (torchrun, deepspeed, horovodrun, OpenMPI, MPICH/PALS, Slurm), as one frozen `ClusterEnv`;
  CPU threads and the device a rank uses.
- `launchers`: the table of launchers and the command that starts N local processes under each.
- `allocator`: how a CPU process keeps freed memory for the next step.
- `preemption`: SIGTERM/SIGUSR1 turned into a checkpoint that every rank agrees on, and a dead peer
  turned into a clear error.

Nothing here knows a training framework: the layers above ask this one.
"""

from ..lazy import lazy_exports

__getattr__, __dir__ = lazy_exports(__name__, {
    "ClusterEnv": "discovery", "detect_cluster": "discovery", "select_device": "discovery",
    "default_threads": "discovery", "cpu_cores": "discovery",
    "LAUNCHERS": "launchers", "launcher_command": "launchers", "launch_environment": "launchers",
    "free_port": "launchers",
})
__all__ = __dir__()
