"""What a run sets in its process, and how the process gets it back.

A process may run many trainings (a notebook's engines do), so whatever one run changes here must
not become the next run's starting point: `preserved_process_state` puts it back. Within a run,
`use_cpu` gives a CPU rank its share of the node's cores and its memory reuse.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from .allocator import reuse_freed_memory
from .environment import patched_environ


def use_cpu(device: torch.device, threads: int, cpu_malloc: str) -> str:
    """On the CPU, run this rank's ops on `threads` threads and apply `--cpu-malloc`; the CPU
    memory mode in effect (harness.process.allocator). A GPU run leaves both as they are."""
    if device.type != "cpu":
        return "not applied (GPU run)"
    torch.set_num_threads(threads)
    return reuse_freed_memory(cpu_malloc)


@contextlib.contextmanager
def preserved_process_state() -> Iterator[None]:
    """Put back the environment, the thread count, the random generators and the current GPU after
    a run.

    Backends put back the variables and library defaults they set, in shutdown; the environment is
    also restored here as a whole because libraries imported during a run set their own at import
    time (KMP_DUPLICATE_LIB_OK, KMP_INIT_AT_FORK, TORCHINDUCTOR_CACHE_DIR seen after a first ddp run).
    """
    threads = torch.get_num_threads()
    cuda_device = torch.cuda.current_device() if torch.cuda.is_available() else None
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    try:
        with patched_environ(everything=True), torch.random.fork_rng(devices=devices):
            yield
    finally:
        torch.set_num_threads(threads)
        if cuda_device is not None:
            torch.cuda.set_device(cuda_device)
