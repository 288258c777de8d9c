"""The node's accelerator as the harness sees it: its kind, devices, communicator and visibility variable.

One place asks torch (`torch.accelerator`, torch >= 2.6), so placement, the process group and the
job studies never ask a vendor's library or tool (nvidia-smi) themselves. Kinds:

- cuda: NVIDIA GPUs; communicator NCCL; CUDA_VISIBLE_DEVICES.
- rocm: AMD GPUs. A ROCm build of torch presents them as torch's "cuda" device (torch.version.hip is
  set) and RCCL as the "nccl" process group; ROCR_VISIBLE_DEVICES (HIP_VISIBLE_DEVICES, one level
  up in the stack, narrows further).
- xpu: Intel GPUs; communicator "xccl" where torch is built with it (torch >= 2.8), else the "ccl"
  of Intel's oneccl_bindings_for_pytorch (which must be imported before the group starts:
  harness.backends.torch_distributed does so); ZE_AFFINITY_MASK.
- cpu: no accelerator (or one the harness does not drive, such as Apple's mps); gloo.

Only cuda and cpu are verified on hardware; rocm and xpu follow the vendors' documentation.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from ..errors import UsageError

if TYPE_CHECKING:
    import torch

    from .discovery import ClusterEnv

KINDS = ("cuda", "rocm", "xpu", "cpu")
DEVICE_TYPES: dict[str, str] = {"cuda": "cuda", "rocm": "cuda", "xpu": "xpu", "cpu": "cpu"}
VISIBILITY_VARIABLES: dict[str, Optional[str]] = {
    "cuda": "CUDA_VISIBLE_DEVICES",
    "rocm": "ROCR_VISIBLE_DEVICES",
    "xpu": "ZE_AFFINITY_MASK",
    "cpu": None,
}
ONECCL_MODULE = "oneccl_bindings_for_pytorch"  # registers the "ccl" process group when imported


@dataclass(frozen=True)
class Accelerator:
    """The accelerator this process sees: its kind (one of KINDS) and how many devices (0 on CPU)."""

    kind: str
    count: int

    @property
    def device_type(self) -> str:
        """torch's name for the devices: "cuda" for NVIDIA and AMD GPUs, "xpu", "cpu"."""
        return DEVICE_TYPES[self.kind]

    @property
    def visibility_variable(self) -> Optional[str]:
        """The variable that limits the devices a process sees (a per-rank binding sets it); None on CPU."""
        return VISIBILITY_VARIABLES[self.kind]

    @property
    def communicator(self) -> str:
        """The torch.distributed backend for one rank per device."""
        return communicator(self.device_type)

    def device(self, local_rank: int, procs_per_device: int = 1) -> torch.device:
        """Device `local_rank // procs_per_device`, modulo the devices this process sees, so that a
        per-rank visibility variable (one device each, index 0) works too."""
        import torch

        if self.kind == "cpu":
            return torch.device("cpu")
        return torch.device(self.device_type, (local_rank // procs_per_device) % self.count)


def detect_accelerator() -> Accelerator:
    """The accelerator torch was built for, if this process sees one of its devices; else the CPU."""
    import torch

    if not torch.accelerator.is_available():
        return Accelerator("cpu", 0)
    kind = kind_of(torch.accelerator.current_accelerator())
    if kind not in KINDS:  # mps, hpu, mtia...: no communicator among those the harness knows
        return Accelerator("cpu", 0)
    return Accelerator(kind, torch.accelerator.device_count())


def communicator(device_type: str) -> str:
    """The torch.distributed backend for ranks on devices of this torch type, one rank per device."""
    if device_type == "cpu":
        return "gloo"
    if device_type == "cuda":
        return "nccl"  # RCCL on ROCm registers under this name
    import torch.distributed as dist

    if getattr(dist, "is_xccl_available", lambda: False)():  # absent from torch builds older than XCCL
        return "xccl"
    if importlib.util.find_spec(ONECCL_MODULE) is not None:
        return "ccl"
    raise UsageError(
        f"ranks on {device_type} devices need a torch built with XCCL (torch >= 2.8 XPU wheels) or "
        f"{ONECCL_MODULE}; install one, or use --device cpu"
    )


def kind_of(device: torch.device) -> str:
    """The accelerator kind of a device the harness placed (rocm for a "cuda" device of a ROCm torch)."""
    import torch

    return "rocm" if device.type == "cuda" and torch.version.hip else device.type


def select_device(requested: str, cluster: ClusterEnv, procs_per_gpu: int = 1) -> torch.device:
    """This rank's device for --device `requested` (auto, cpu, cuda or xpu): device `local_rank //
    procs_per_gpu` of the node's accelerator (Accelerator.device) when there is one or it was asked
    for, else the CPU; made the process's current device."""
    import torch

    accelerator = detect_accelerator()
    if requested == "cpu" or (requested == "auto" and accelerator.kind == "cpu"):
        if procs_per_gpu > 1:
            raise UsageError(
                f"--procs-per-gpu {procs_per_gpu} places ranks on GPUs, but this run is on the CPU; "
                "on CPUs start more ranks with fewer --threads each (ranks x threads = cores)"
            )
        return torch.device("cpu")
    if requested not in ("auto", accelerator.device_type):
        found = f"this node has {accelerator.kind}" if accelerator.count else "no accelerator is available"
        raise UsageError(f"--device {requested} was asked for but {found} here; use --device cpu or auto")
    gpus = accelerator.count
    if gpus > 1 and cluster.local_world_size > gpus * procs_per_gpu:
        needed = -(-cluster.local_world_size // procs_per_gpu)
        raise UsageError(
            f"{cluster.local_world_size} ranks on this node need {needed} GPUs at --procs-per-gpu "
            f"{procs_per_gpu}, but {gpus} are visible; launch fewer ranks per node or raise "
            "--procs-per-gpu"
        )
    device = accelerator.device(cluster.local_rank, procs_per_gpu)
    torch.accelerator.set_device_index(device)
    return device
