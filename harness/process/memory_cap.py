"""A rank's memory cap (`--memory-cap GIB`): set by the kit inside each rank's own process before the
run, so that a rank that needs more fails with one line naming it, and nothing else on the machine
feels it. No privileges are needed; it is a limit of the process, not of a cgroup.

How the cap is set:
- on the CPU, the kernel's data-segment limit RLIMIT_DATA (setrlimit(2)), which since Linux 4.7
  covers every private writable mapping: malloc's heap, the mappings torch's CPU allocator takes
  tensors from, thread stacks. An allocation past the cap fails with ENOMEM, so torch raises
  "DefaultCPUAllocator: can't allocate memory" (Python, MemoryError) in the rank that asked, and the
  kernel's OOM killer, which could pick any process of the machine, never runs. It counts memory
  allocated, not only memory touched (a torch.empty counts whole, as a GPU allocator counts it), and
  the process's own: Python, torch's libraries and its threads, about 0.75 GiB. That footprint is
  measured (VmData) when the cap is set, and a cap at or below it is refused. A capped CPU run
  hands freed blocks back to the kernel (--cpu-malloc release, harness.process.allocator): kept
  for reuse, they would count against the cap.
- on a CUDA (or ROCm) device, the caching allocator's own limit,
  torch.cuda.set_per_process_memory_fraction(cap / the device's memory): an allocation past it
  raises torch.OutOfMemoryError. The CUDA context lies outside the allocator, so the footprint the
  cap must cover there is zero.

Before the run, `check` holds the run's memory prediction (harness.backends.memory, made from the
task's own probe at the run's start) plus the footprint against the cap, and refuses a rank that
would need more with one line, before any process group starts. The prediction leaves some parts
out (the gradients of activations during backward, fragmentation), so a rank may still pass its cap
while training: `over_budget` turns that failure into one line naming the rank, and its peers, which
lose it, name the rank that stopped (harness.process.heartbeat).

`capped` puts the process's limit back when the run ends: a notebook's engines run many.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Optional

import torch

from ..errors import OverBudget, UsageError

GIB = 2**30
STATUS = "/proc/self/status"
# The backend whose rank holds least of the model: FSDP2 with every weight, gradient and optimizer
# state sharded (ZeRO-3 holds as little of the state and adds its buckets).
FULLY_SHARDED: tuple[str, dict[str, object]] = ("fsdp", {})
# The sharded backends a capped run is pointed to, most sharded first, by their labels' start
# (harness.backends.memory.backend_label): a run is pointed only to those that hold less than it.
SHARDED = (("fsdp", "--backend fsdp"), ("deepspeed zero_stage=3", "--backend deepspeed --zero-stage 3"))
SUB_GROUP_HINT_MB = 16  # --zero-sub-group-mb named to a capped ZeRO-3 run: its step's copies 48 MiB, not 3 slices
GATHERED_HINT_MB = 4  # --zero-gathered-mb named to it: besides the module at work, 4 MiB of weights gathered
# What torch and Python say when an allocation fails (the CPU allocator's ENOMEM, CUDA's own).
OUT_OF_MEMORY = re.compile(r"can't allocate memory|out of memory|Cannot allocate memory", re.IGNORECASE)


@dataclass(frozen=True)
class MemoryCap:
    """The cap a rank runs under: `cap_bytes` in all, of which `footprint_bytes` the runtime held
    when it was set; `how` says by what means (for the record and the messages)."""

    cap_bytes: int
    footprint_bytes: int
    how: str

    def check(self, predicted_bytes: float, backend: str, rank: int, sharded_bytes: Optional[float] = None) -> None:
        """UsageError, before the run, where the footprint and `predicted_bytes` (what the run is
        predicted to hold under `backend`) pass the cap; the fix it names depends on whether the
        run fully sharded (`sharded_bytes`, FULLY_SHARDED's prediction) would fit."""
        needed = self.footprint_bytes + predicted_bytes
        if needed <= self.cap_bytes:
            return
        hint = shard_hint(backend)
        if sharded_bytes is not None and self.footprint_bytes + sharded_bytes > self.cap_bytes:
            hint = (
                f"even fully sharded ({FULLY_SHARDED[0]}) a rank needs "
                f"{(self.footprint_bytes + sharded_bytes) / GIB:.2f} GiB: add ranks, lower --batch-size, "
                "use a smaller model, or raise --memory-cap"
            )
        raise UsageError(
            f"needs {needed / GIB:.2f} GiB a rank under {backend}; the cap is {self.cap_bytes / GIB:.2f} GiB "
            f"(rank {rank}: {self.footprint_bytes / GIB:.2f} GiB runtime + {predicted_bytes / GIB:.2f} GiB "
            f"predicted for training); {hint}"
        )

    def over_budget(self, error: BaseException, backend: str, rank: int) -> Optional[OverBudget]:
        """The one-line OverBudget for `error` where it is an allocation that the cap refused, else None."""
        if not (isinstance(error, MemoryError) or OUT_OF_MEMORY.search(str(error))):
            return None
        return OverBudget(
            f"rank {rank} ran out of its memory cap under {backend}: it needs more than "
            f"{self.cap_bytes / GIB:.2f} GiB a rank (the cap, set by {self.how}); {shard_hint(backend)}"
        )

    def as_dict(self) -> dict[str, object]:
        """The record's memory.cap."""
        return {"cap_bytes": self.cap_bytes, "footprint_bytes": self.footprint_bytes, "how": self.how}


def shard_hint(backend: str) -> str:
    """The fix named to a run of `backend` (its label) that needs more than its cap: the sharded
    backends that hold less than it, more ranks, or a higher cap."""
    for position, (label, _) in enumerate(SHARDED):
        if backend.startswith(label):
            fewer = SHARDED[:position]
            break
    else:
        fewer = SHARDED
    fixes = [f"shard the model ({', or '.join(flags for _, flags in fewer)})"] if fewer else []
    if backend.startswith("deepspeed zero_stage=3"):
        # By default ZeRO-3 keeps every weight it gathers from forward to backward (1e9 elements), and
        # steps the whole slice at once, making three copies of it (harness.backends.memory).
        if "zero_gathered_mb" not in backend:
            fixes.insert(0, f"keep fewer weights gathered (--zero-gathered-mb {GATHERED_HINT_MB})")
        if "zero_sub_group_mb" not in backend:
            fixes.insert(0, f"step the optimizer in smaller sub-groups (--zero-sub-group-mb {SUB_GROUP_HINT_MB})")
    return ", ".join([*fixes, "add ranks, or raise --memory-cap"])


def data_segment_bytes() -> int:
    """This process's data segment (VmData: its private writable mappings) in bytes."""
    with open(STATUS) as handle:
        found = re.search(r"^VmData:\s+(\d+) kB", handle.read(), re.MULTILINE)
    if found is None:
        raise UsageError("--memory-cap needs Linux's /proc/self/status (VmData); leave it out on this system")
    return int(found.group(1)) * 1024


@contextlib.contextmanager
def capped(cap_gib: Optional[float], device: torch.device) -> Iterator[Optional[MemoryCap]]:
    """Run the block under a cap of `cap_gib` GiB on `device` (None: no cap), put back afterwards.
    UsageError where the device cannot be capped, or the runtime already holds the cap."""
    if cap_gib is None:
        yield None
        return
    cap_bytes = int(cap_gib * GIB)
    if device.type == "cpu":
        with _data_limit(cap_bytes) as cap:
            yield cap
    elif device.type == "cuda":
        with _allocator_fraction(cap_bytes, device) as cap:
            yield cap
    else:
        raise UsageError(f"--memory-cap caps CPU and CUDA ranks; this rank's device is {device.type}: leave it out")


@contextlib.contextmanager
def _data_limit(cap_bytes: int) -> Iterator[MemoryCap]:
    import resource

    footprint = data_segment_bytes()
    if footprint >= cap_bytes:
        raise UsageError(
            f"--memory-cap {cap_bytes / GIB:g} GiB is below this rank's runtime footprint of "
            f"{footprint / GIB:.2f} GiB (Python, torch and its threads, before any training state); "
            f"give --memory-cap above {footprint / GIB:.2f} plus what the run needs (harness predict)"
        )
    before = resource.getrlimit(resource.RLIMIT_DATA)
    hard = before[1]
    if hard != resource.RLIM_INFINITY and hard < cap_bytes:
        raise UsageError(
            f"--memory-cap {cap_bytes / GIB:g} GiB is above this process's hard data limit of "
            f"{hard / GIB:.2f} GiB (ulimit -d); give a cap below it"
        )
    resource.setrlimit(resource.RLIMIT_DATA, (cap_bytes, hard))
    try:
        yield MemoryCap(cap_bytes, footprint, "RLIMIT_DATA, the kernel's data-segment limit")
    finally:
        resource.setrlimit(resource.RLIMIT_DATA, before)


@contextlib.contextmanager
def _allocator_fraction(cap_bytes: int, device: torch.device) -> Iterator[MemoryCap]:
    total = torch.cuda.get_device_properties(device).total_memory
    if cap_bytes > total:
        raise UsageError(
            f"--memory-cap {cap_bytes / GIB:g} GiB is above the device's {total / GIB:.2f} GiB; give a cap below it"
        )
    torch.cuda.set_per_process_memory_fraction(cap_bytes / total, device)
    try:
        yield MemoryCap(cap_bytes, 0, "torch.cuda.set_per_process_memory_fraction, the caching allocator's limit")
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, device)
