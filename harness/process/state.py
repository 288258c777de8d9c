"""What a run sets in its process, and how the process gets it back.

A process may run many trainings (a notebook's engines do), so whatever one run changes here must
not become the next run's starting point: `preserved_process_state` puts it back. Within a run,
`use_cpu` gives a CPU rank its share of the node's cores and its memory reuse, and
`pin_to_cores` (--pin-cores) cores of its own.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Optional

import torch

from ..errors import UsageError
from .allocator import reuse_freed_memory
from .environment import patched_environ

TASKS_DIR = "/proc/self/task"


def use_cpu(device: torch.device, threads: int, cpu_malloc: str) -> str:
    """On the CPU, run this rank's ops on `threads` threads and apply `--cpu-malloc`; the CPU
    memory mode in effect (harness.process.allocator). A GPU run leaves both as they are."""
    if device.type != "cpu":
        return "not applied (GPU run)"
    torch.set_num_threads(threads)
    return reuse_freed_memory(cpu_malloc)


def pin_to_cores(local_rank: int, threads: int) -> list[int]:
    """Pin this process (every thread it has, and those it starts later) to `threads` cores of its
    own: local rank r takes the r-th block of `threads` of the cores it may use now (its affinity,
    which the launcher gave it). Returns those cores.

    Raises UsageError where the system cannot pin (not Linux), or when the blocks of the local
    ranks outrun those cores (ranks x threads > cores)."""
    usable = _affinity()
    if usable is None:
        raise UsageError("--pin-cores needs Linux (sched_setaffinity); leave it out on this system")
    first = local_rank * threads
    if first + threads > len(usable):
        raise UsageError(
            f"--pin-cores: local rank {local_rank} with {threads} thread(s) needs cores {first + 1}..{first + threads} "
            f"of the {len(usable)} this process may use; run fewer ranks per node or fewer --threads"
        )
    mine = usable[first : first + threads]
    _set_affinity(mine)
    return mine


def _affinity() -> Optional[list[int]]:
    """The cores this process may run on; None where the system does not say (not Linux)."""
    if not hasattr(os, "sched_getaffinity"):
        return None
    return sorted(os.sched_getaffinity(0))


def _set_affinity(cores: list[int]) -> None:
    """Let every thread of this process, and every thread it starts later, run on `cores` only.
    Threads started before now (torch's thread pools) keep their own affinity, so each one is set."""
    for task in os.listdir(TASKS_DIR):
        with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
            os.sched_setaffinity(int(task), cores)


@contextlib.contextmanager
def preserved_process_state() -> Iterator[None]:
    """Put back the environment, the thread count, the cores the process may use (--pin-cores), the
    random generators and the current GPU after a run.

    Backends put back the variables and library defaults they set, in shutdown; the environment is
    also restored here as a whole because libraries imported during a run set their own at import
    time (KMP_DUPLICATE_LIB_OK, KMP_INIT_AT_FORK, TORCHINDUCTOR_CACHE_DIR seen after a first ddp run).
    """
    threads = torch.get_num_threads()
    cores = _affinity()
    cuda_device = torch.cuda.current_device() if torch.cuda.is_available() else None
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    try:
        with patched_environ(everything=True), torch.random.fork_rng(devices=devices):
            yield
    finally:
        torch.set_num_threads(threads)
        if cores is not None and cores != _affinity():
            _set_affinity(cores)
        if cuda_device is not None:
            torch.cuda.set_device(cuda_device)
